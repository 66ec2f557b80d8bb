/*
 * gpt2 — the GPT-2 forward and backward pass over units (DESIGN §3-4).
 *
 * Owns the activation buffers of one micro-batch (B, T) on this rank, carved
 * out of the device arena at start-up. Gets every parameter and gradient
 * buffer from the ZeRO engine, one unit at a time, in this order:
 *   forward   embedding, block 0 .. L-1, head + embedding (tied LM head)
 *   backward  head + embedding, block L-1 .. 0, embedding
 * The embedding unit's gradient buffer stays open through the whole backward
 * (the tied LM head writes to it first, the token embedding last).
 *
 * Tensors that feed or leave matmuls are in the activation dtype ([A] in
 * backend.h: half precision on a GPU training in fp16/bf16), so are the
 * gathered parameters; the residual stream, its gradient and every weight
 * gradient are fp32.
 *
 * The loss is the mean over every target token of the global batch: each
 * micro-batch's dlogits carry 1 / (B T accumulation world), so gradients
 * summed over micro-batches and ranks are those of the global mean.
 */
#ifndef SHARDLM_GPT2_H
#define SHARDLM_GPT2_H

#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "model.h"
#include "zero.h"

struct block_acts {
    float *ln1;       /* (B, T, C) */
    float *ln1_mean;  /* (B, T) */
    float *ln1_rstd;  /* (B, T) */
    float *qkv;       /* (B, T, 3C) */
    float *att;       /* (B, NH, T, T) */
    float *atty;      /* (B, T, C) attention output before c_proj */
    float *res2;      /* (B, T, C) residual after attention */
    float *ln2;       /* (B, T, C) */
    float *ln2_mean;  /* (B, T) */
    float *ln2_rstd;  /* (B, T) */
    float *fch;       /* (B, T, 4C) before GELU */
    float *fch_gelu;  /* (B, T, 4C) */
};

struct gpt2_acts {
    int B, T;                 /* the largest micro-batch these buffers hold */
    int interval;             /* activation checkpointing: blocks per segment (0: off) */
    int n_sets;               /* sets of block activations: L, or the interval */
    struct block_acts *sets;  /* (n_sets) */
    float **resid;            /* off: (L + 1) block inputs, then the final output */
    float **ckpt;             /* on: (segments) the input of each segment's first block (device or pinned host) */
    float **work;             /* on: (interval + 1) the residual stream of the segment being computed */
    float *final;             /* (B, T, C) the last block's output */
    float *lnf;               /* (B, T, C) */
    float *lnf_mean, *lnf_rstd; /* (B, T) */
    float *logits;            /* (B, T, Vp): logits, then probabilities, then dlogits */
    float *losses;            /* (B, T) */
    /* backward work */
    float *dresid_a, *dresid_b; /* (B, T, C) gradient of the residual stream */
    float *dwork_c;           /* (B, T, C): dln, datty */
    float *dwork_3c;          /* (B, T, 3C): dqkv */
    float *dwork_4c;          /* (B, T, 4C): dfch */
    float *scratch;           /* attention and layernorm backward scratch */
    int half;                 /* activations ([A], backend.h) in half precision */
    int32_t *inputs, *targets; /* (B, T) host memory: the caller fills them before forward */
    int32_t *dev_inputs, *dev_targets; /* (B, T) the kernels' copies (the same buffers on the CPU) */
    float *host_losses;       /* (B, T) the losses read back (a->losses on the CPU) */
    float *debug_logits;      /* when set, forward copies the logits here (host memory; tests) */
    const float *head_wte;    /* the gathered embedding, from the forward to the backward */
    const float **seg_params; /* (interval) a segment's gathered blocks during recompute + backward */
};

enum gpt2_mode { GPT2_TRAIN, GPT2_EVAL };

/* The two passes of the engine: training (forward + backward) and evaluation.
 * With checkpointing every `interval` blocks, backward acquires a segment's
 * blocks for the recompute and keeps them through the segment's backward. */
void gpt2_build_passes(const struct model *m, int interval, struct zero_pass *train, struct zero_pass *eval);
void gpt2_free_passes(struct zero_pass *train, struct zero_pass *eval);

/* Bytes per buffer class for micro-batch B x T with activation checkpointing
 * every `interval` blocks (0: off) (plan.c adds them up). */
void gpt2_plan(const struct model *m, int B, int T, int interval, size_t bytes[BUF_COUNT]);
/* ckpt_space: where the kept segment inputs live (pinned host with cpu_checkpointing). */
/* Copies row `row` of the logits (Vp floats) into host memory. */
void gpt2_read_logits(const struct gpt2_acts *a, const struct model *m, int row, float *out);
void gpt2_acts_init(struct gpt2_acts *a, const struct model *m, int B, int T, int interval,
                    enum mem_space ckpt_space, struct arena arenas[SPACE_COUNT], struct mem_tracker *mem);
void gpt2_acts_free(struct gpt2_acts *a);

/* Forward over a->inputs (B x T). With targets (a->targets) it returns the
 * mean loss of this micro-batch; without, only the logits are computed.
 * GPT2_TRAIN leaves the embedding acquired for gpt2_backward, which must follow;
 * the caller brackets forward (+ backward) with zero_begin_pass/zero_end_pass. */
float gpt2_forward(struct zero *z, struct gpt2_acts *a, int B, int T, int with_targets, enum gpt2_mode mode);
/* Backward after a GPT2_TRAIN forward with targets; dloss_scale = 1 / (B T accum world). */
void gpt2_backward(struct zero *z, struct gpt2_acts *a, int B, int T, float dloss_scale);

#endif
