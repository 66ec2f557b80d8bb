/*
 * train — the training loop: set-up from the config, the optimizer steps with
 * gradient accumulation, logging, validation and the sample at the end.
 *
 * Owns the trainer's state (model description, plan, arenas, engine,
 * activations, data sets, metrics file) for the duration of one run.
 */
#ifndef SHARDLM_TRAIN_H
#define SHARDLM_TRAIN_H

#include "config.h"

struct train_options {
    const char *dump_path;       /* after the first micro-batch's backward: weights, logits, grads */
    const char *dump_final_path; /* after the last step: the parameters */
    int quiet;                   /* no per-step lines (tests) */
};

/* Runs the whole training; returns the process exit status. */
int train_run(struct config *cfg, const struct train_options *opt);

#endif
