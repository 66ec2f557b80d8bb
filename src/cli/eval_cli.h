/*
 * eval_cli — the `shardlm eval` command (eval_cli.c), and its preference
 * pairs' part (eval_pref.c: DPO's reward accuracy and margins).
 */
#ifndef SHARDLM_EVAL_CLI_H
#define SHARDLM_EVAL_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "comm/comm.h"
#include "run/infer.h"

int cmd_eval(int argc, char **argv);

struct eval_pref_options {
    const char *model, *data;
    const char *ref_file;   /* --ref-log-probs FILE, or NULL */
    const char *ref_model;  /* --ref MODEL, or NULL */
    int batch;              /* --batch: rows a forward (pairs: half, at least one pair) */
    int64_t max_batches;    /* --max-batches: forwards (micro-batches of pairs) per rank at most; 0: all */
    bool json;
};

/* Refuses eval's length T (--seq-len, or the one chosen from the data) beyond the model's context, in one line
 * naming --seq-len and the longest length that works. */
void eval_check_length(const struct config *cfg, int T);

/* eval on a preference file (eval_pref.c); returns the exit status. Collective. */
int eval_preferences(struct comm *comm, struct infer_options *o, const struct eval_pref_options *e);

#endif
