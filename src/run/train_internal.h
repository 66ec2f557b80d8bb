/*
 * train_internal — the trainer's state, shared by the files of run/ that
 * make up a run: train.c (set-up, steps, evaluation, logging) and ckpt_run.c
 * (its checkpoints). Private to run/.
 */
#ifndef SHARDLM_TRAIN_INTERNAL_H
#define SHARDLM_TRAIN_INTERNAL_H

#include <stdint.h>
#include <stdio.h>

#include "core/options.h"
#include "data/loader.h"
#include "engine/loss_scaler.h"
#include "engine/session.h"
#include "io/ckpt.h"
#include "train.h"

struct trainer {
    struct config *cfg;
    const struct train_options *opt;
    struct session sess;    /* the engine: model, plan, arenas, ZeRO state, passes, activations */
    struct loader train_data, val_data;
    int have_val;
    int comm_only;          /* SHARDLM_BENCH=comm-only: passes walked without compute */
    FILE *metrics;
    long step;              /* optimizer steps done, skipped ones included */
    long skipped_steps;     /* steps skipped on fp16 overflow (the scheduler does not advance on them) */
    struct loss_scaler scaler;
    long inject_inf_step;   /* SHARDLM_INJECT_INF_STEP: make that step's gradients overflow (tests) */
    uint64_t samples_seen;  /* global units (windows, samples or packed rows) consumed: the data position */
    uint64_t real_tokens, trained_tokens, slots; /* the last step's: tokens of samples, trained targets, rows x length */
    /* LoRA: the frozen base's identity, which checkpoints record and resumes check */
    char base_source[CKPT_MAX_PATH + 64];
    char base_checksum[24];
};

#endif
