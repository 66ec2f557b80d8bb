/*
 * cli_args — what the commands' option parsing shares: numbers checked
 * against their ranges, and the options generate and eval take to open a
 * model (--base, --tokenizer, --set). A bad value fails as bad input.
 */
#ifndef SHARDLM_CLI_ARGS_H
#define SHARDLM_CLI_ARGS_H

#include <stdbool.h>

#include "run/infer.h"

#define CLI_MAX_SETS 256

float cli_parse_float(const char *s, const char *opt);
/* The options generate and eval share ('B' --base, 'z' --tokenizer, 's' --set): whether c was one. */
bool cli_model_option(int c, struct infer_options *o, const char **sets, int *n_sets);
long cli_parse_int(const char *s, const char *opt, long lo, long hi);

#endif
