/*
 * train — the training loop: set-up from the config, the optimizer steps with
 * gradient accumulation across micro-batches and ranks, logging (per-step
 * line, JSONL metrics with traffic), validation, and a sample at the end.
 *
 * Owns the trainer's state (model description, plan, arenas, engine,
 * activations, data sets, metrics file) for the duration of one run.
 */
#ifndef SHARDLM_TRAIN_H
#define SHARDLM_TRAIN_H

#include "comm/comm.h"
#include "config/config.h"

struct train_options {
    const char *dump_path;       /* the first step: weights, logits, loss, gradients (tests) */
    const char *dump_final_path; /* after the last step: the parameters (tests) */
    int quiet;                   /* no per-step lines */
    int print_config;            /* log the resolved configuration at start (job logs) */
    const char *resume;          /* "auto", a checkpoint file or a directory; NULL: fresh start */
    int overwrite;               /* a fresh start may save over the checkpoints checkpoint.dir holds */
    const char *config_path;     /* the CONFIG file and --deepspeed file (NULL: none): inputs that */
    const char *deepspeed_path;  /* no output may overwrite */
};

/* Catches SIGUSR1, SIGTERM and SIGINT from here on: the run then stops at the
 * end of its step, saves and exits EXIT_PREEMPTED (README "Signals"). Call
 * first, before MPI and the config, so that no early signal kills the job. */
void train_install_stop_handlers(void);

/* A point where SHARDLM_INJECT_SIGNAL (tests) may raise a stop signal. */
void train_fault_point(const char *phase);

/* Runs the whole training; returns the process exit status. */
int train_run(struct config *cfg, struct comm *comm, const struct train_options *opt);

#endif
