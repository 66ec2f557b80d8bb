/*
 * train_cli — the `shardlm train` command (train_cli.c).
 */
#ifndef SHARDLM_TRAIN_CLI_H
#define SHARDLM_TRAIN_CLI_H

int cmd_train(int argc, char **argv);

#endif
