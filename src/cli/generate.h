/*
 * generate — the `shardlm generate` command (generate.c).
 */
#ifndef SHARDLM_GENERATE_H
#define SHARDLM_GENERATE_H

int cmd_generate(int argc, char **argv);

#endif
