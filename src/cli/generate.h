/*
 * generate — the `shardlm generate` and `shardlm eval` commands (generate.c).
 */
#ifndef SHARDLM_GENERATE_H
#define SHARDLM_GENERATE_H

int cmd_generate(int argc, char **argv);
int cmd_eval(int argc, char **argv);

#endif
