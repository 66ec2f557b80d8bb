/*
 * cli_args — parsing helpers the commands share (see cli_args.h).
 */
#include "cli_args.h"

#include <getopt.h>
#include <math.h>
#include <stdlib.h>

#include "core/util.h"

float cli_parse_float(const char *s, const char *opt)
{
    char *end;
    float v = strtof(s, &end);
    if (end == s || *end || !isfinite(v))
        fail_input("%s '%s' is not a number", opt, s);
    return v;
}

/* The options generate and eval share ('B' --base, 'z' --tokenizer, 's' --set): whether c was one. */
bool cli_model_option(int c, struct infer_options *o, const char **sets, int *n_sets)
{
    switch (c) {
    case 'B': o->base = optarg; return true;
    case 'z': o->tokenizer = optarg; return true;
    case 's':
        if (*n_sets == CLI_MAX_SETS)
            fail_input("too many --set options (at most %d)", CLI_MAX_SETS);
        sets[(*n_sets)++] = optarg;
        return true;
    default: return false;
    }
}

long cli_parse_int(const char *s, const char *opt, long lo, long hi)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > hi)
        fail_input("%s '%s' is not an integer in [%ld, %ld]", opt, s, lo, hi);
    return v;
}
