/*
 * zero — the ZeRO engine: where every unit's parameters, gradients and
 * optimizer state live on this rank, and the collectives that move them
 * (DESIGN §3-4).
 *
 * The model code asks for a unit's full parameters just before it computes
 * with them (zero_params) and says when it is done (zero_release); in backward
 * it asks for a full-unit gradient buffer (zero_grads) and hands it back once
 * the unit's backward is complete (zero_grads_done), which reduces it into this
 * rank's gradient shard. Which of these are copies, collectives or plain
 * pointers depends on the stage; the model code is the same for all.
 *
 * At the accumulation boundary the trainer calls zero_grad_norm and
 * zero_optimizer_step, which runs AdamW on this rank's shard.
 *
 * Owns: the parameter, gradient, master and Adam buffers of every unit (carved
 * from the arenas), the traffic counters. Does not own activations or data.
 */
#ifndef SHARDLM_ZERO_H
#define SHARDLM_ZERO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "adamw.h"
#include "arena.h"
#include "config.h"
#include "model.h"

struct zero_unit {
    size_t numel;     /* elements of the unit (model.c, with alignment gaps) */
    size_t padded;    /* numel rounded up to a multiple of world * MODEL_TENSOR_ALIGN */
    size_t shard;     /* padded / world: elements this rank owns */
    size_t shard_begin; /* first element of this rank's slice */
    float *params;    /* full parameters (stages 0-2 and this build) */
    float *grads;     /* full gradients, accumulated over micro-batches */
    float *adam_m;    /* this rank's shard */
    float *adam_v;
};

struct zero {
    const struct model *model;
    int stage, rank, world;
    struct zero_unit *units;
    struct mem_tracker *mem;
    long adam_steps;  /* optimizer steps taken (for bias correction) */
};

/* Carves every buffer out of the arenas and initialises the parameters. */
void zero_init(struct zero *z, const struct model *m, const struct config *cfg, int rank, int world,
               struct arena arenas[SPACE_COUNT], struct mem_tracker *mem);

const float *zero_params(struct zero *z, int unit);
void zero_release(struct zero *z, int unit);
float *zero_grads(struct zero *z, int unit);
void zero_grads_done(struct zero *z, int unit);

/* Clears the gradients at the start of an optimizer step. */
void zero_zero_grads(struct zero *z);
/* Global L2 norm of the gradients (all ranks). */
double zero_grad_norm(struct zero *z);
/* AdamW on this rank's shard; grad_scale multiplies every gradient first (unscale and clip). */
void zero_optimizer_step(struct zero *z, const struct optimizer_config *oc, float lr, float grad_scale);

/* Bytes of each buffer class this engine needs on this rank (used by plan.c). */
void zero_plan(const struct model *m, const struct config *cfg, int world, size_t bytes[BUF_COUNT]);

#endif
