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
#include "engine/dpo.h"
#include "data/loader.h"
#include "engine/loss_scaler.h"
#include "engine/session.h"
#include "io/ckpt.h"
#include "train.h"

/* DPO (issue 37, train_dpo.c): the loss's parameters, the reference and the step's figures. */
struct trainer_dpo {
    bool on;                /* the config has a dpo section: data.train is a preference file */
    bool in_step_ref;       /* LoRA without precompute_ref_log_probs: the base with the adapters off, each step */
    struct dpo_params p;
    struct dpo_ref *ref;    /* precompute_ref_log_probs: every pair's reference log-probs (file order) */
    char ref_path[CKPT_MAX_PATH];
    char ref_sha256[65];    /* of the reference file, which checkpoints record */
    char samples_sha256[65];
    char model[CKPT_MAX_PATH + 128]; /* the initial model: source and checksum */
    char saved_path[CKPT_MAX_PATH], saved_sha256[80]; /* a resumed checkpoint's record ("" none) */
    int cap;                /* samples a micro-batch can hold */
    double *pol, *refl;     /* (cap) the micro-batch's sequence log-probs, policy and reference */
    int64_t *pol_n, *ref_n, *pair_ids;
    float *weights;         /* (rows T) the policy forward's per-position dloss */
    double scale;           /* the step's: loss scale / pairs in the global step */
    struct dpo_metrics m;   /* the step's sums, reduced by dpo_step_end */
    double mean[DPO_N_METRICS];
};

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
    struct trainer_dpo dpo;
};

/* train_dpo.c. Set-up after the parameters and activations: checks, buffers. */
void dpo_setup(struct trainer *tr);
/* After a resume (or none): the precomputed reference (loaded, or computed with the initial weights and saved). */
void dpo_prepare(struct trainer *tr);
void dpo_teardown(struct trainer *tr);
/* A step: begin with the step's pairs (every rank's, every micro-batch's) and the loss scale; per micro-batch,
 * dpo_reference before the policy's pass and dpo_policy_forward inside it; dpo_step_end reduces the figures
 * (one allreduce) and returns the step's loss. */
void dpo_step_begin(struct trainer *tr, uint64_t pairs, double loss_scale);
void dpo_reference(struct trainer *tr, uint64_t first, int B, int T);
void dpo_policy_forward(struct trainer *tr, int rows, int T);
float dpo_step_end(struct trainer *tr);
/* The step line's and the metrics record's DPO figures ("" when not DPO). */
void dpo_step_notes(const struct trainer *tr, char *line, size_t line_cap, char *json, size_t json_cap);

#endif
