/*
 * eval_cli — the `shardlm eval` command (eval_cli.c).
 */
#ifndef SHARDLM_EVAL_CLI_H
#define SHARDLM_EVAL_CLI_H

int cmd_eval(int argc, char **argv);

#endif
