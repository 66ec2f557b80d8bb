/*
 * family — a model family behind one interface (DESIGN §3-4): what the
 * trainer, the planner, sampling and checkpoints call, whatever the model.
 *
 * The driver here owns what every family shares: the order in which units
 * are gathered, released and have their gradients opened and finished (the
 * passes), activation checkpointing by segments, the residual stream between
 * blocks, the final norm's output, the LM head (tied to the token embedding
 * or its own tensor in the head unit), the logits and the cross-entropy, the
 * token buffers and the library workspace. A family (gpt2.c, llama.c) brings
 * the kernels of its embedding, blocks and final norm, the buffers they keep,
 * and their sizes. The pass order is written once, in family_forward and
 * family_backward: family_build_passes walks the same two functions dry,
 * recording the unit events instead of running kernels, and the engine then
 * checks every live walk against that record.
 *
 * Forward:  embedding, block 0 .. L-1, head (final norm), the LM head
 *           (the embedding again when tied) a chunk of rows at a time
 *           (family_logits_rows): logits, loss and, in training, at once
 *           their gradient into the LM head's weight gradient and the final
 *           norm's output gradient (no buffer of every row's logits exists),
 *           then the final norm's backward (the head unit again when tied);
 *           an evaluation with targets runs the rows with a trained target
 *           only (family.c lm_chunks_trained), the same losses to rounding
 *           (sgemm's sums depend on a row's place in the call).
 * Backward: the blocks in segments from the last (each segment's blocks
 *           gathered together, their forward recomputed from the kept input
 *           when checkpointing), embedding.
 * Frozen units (model.h) open no gradient buffer: the pass has no gradient
 * events for them and their kernels compute input gradients only. Below the
 * lowest trained unit the backward stops: those blocks are neither gathered
 * nor computed, and a frozen untied embedding is not gathered again.
 * A tied embedding's gradient buffer stays open from the LM head (which
 * writes it first) to the token embedding's backward (last); an untied model
 * gathers the embedding again at the end for its gradient. So the blocks and
 * the embedding are gathered twice per micro-batch as DESIGN §3 counts, and
 * the head unit once (twice when tied: for the final norm's forward and its
 * backward around the LM head).
 *
 * The loss is the mean over every trained target of the global batch: each
 * micro-batch's dlogits carry 1 / (the step's trained targets), which for
 * token windows is 1 / (B T accumulation world).
 */
#ifndef SHARDLM_FAMILY_H
#define SHARDLM_FAMILY_H

#include <stddef.h>
#include <stdint.h>

#include "backend/arena.h"
#include "model/arch.h"
#include "model/model.h"
#include "backend/target.h"
#include "zero/zero.h"

struct family;

/* Generation (family_kv_init): every block's keys and values of B rows of up
 * to Tmax positions, so that a forward computes only the new tokens. A
 * sliding block keeps only its window (a ring of its last W positions,
 * backend_attention_kv_forward), whatever Tmax. */
struct family_kv {
    int Tmax;
    int *Tc;                  /* [n_layer] positions block l's cache holds (model_attention_cache_len) */
    float **k, **v;           /* [n_layer] (B, Tc[l], n_kv_head hs) [A] */
    int32_t *past;            /* (2 max_B) host: positions of each row already in the cache (the caller advances
                               * it), then each row's tokens of this forward to keep (family_forward: last + 1) */
    int32_t *dev_past;        /* the kernels' copy (the same buffer on the CPU) */
    int32_t *last;            /* (B) host: each row's last real token among this forward's T (its logits row);
                               * -1: a silent row, which stores nothing in the cache (its logits meaningless) */
};

struct family_acts {
    const struct model *m;
    const struct family *f;
    int max_B, max_T;         /* the largest micro-batch these buffers hold */
    int max_pos;              /* positions the rotary tables cover (max_T, or the cache's Tmax) */
    int B, T;                 /* the micro-batch being computed */
    int interval;             /* activation checkpointing: blocks per segment (0: off) */
    int n_sets;               /* sets of block activations the family keeps: L, or the interval */
    float **resid;            /* off: (L + 1) block inputs, then the final output [A] */
    float **ckpt;             /* on: (segments) the input of each segment's first block (device or pinned host) */
    float **work;             /* on: (interval + 1) the residual stream of the segment being computed */
    float *final;             /* (B, T, C) the last block's output */
    float *norm_out;          /* (B, T, C) the final norm's output, the LM head's input */
    float *logits;            /* (logits_rows, Vp): a chunk's logits, then probabilities, then dlogits */
    int logits_rows;          /* rows of logits computed at a time (family_logits_rows) */
    float *logits_lse;        /* (logits_rows) fp32, final_softcap only: the capped logits' log-sum-exp per row */
    int logits_r0;            /* the first row of the chunk the buffer holds */
    float dloss_scale;        /* the training forward's: its dlogits scale (family_forward) */
    /* When set (DPO), a FAMILY_TRAIN forward computes every position's loss first (the LM head's forward over all
     * rows, no gradient), hands them (host, B T floats) to loss_weights, which returns each position's dloss
     * (d step loss / d that loss, the loss scale included; host, B T floats the caller owns), and only then runs
     * the LM head's backward with those per-position scales instead of dloss_scale: the logits of every chunk but
     * the last are computed again (one more LM-head matmul over those rows), except for a frozen LM head, whose
     * input gradient is scaled row by row after a first pass at scale 1. */
    const float *(*loss_weights)(void *ctx, const float *losses, int B, int T);
    void *loss_weights_ctx;
    bool adapters_off;        /* LoRA: the forward runs the base alone (DPO's reference; no gradient, FAMILY_EVAL) */
    float *losses;            /* (B, T) */
    float *dresid_a, *dresid_b; /* (B, T, C) gradient of the residual stream; dresid_a: dy in, dx out of a block */
    float *dwork_c;           /* (B, T, C) backward work: the final norm's output gradient, a block's */
    int32_t *inputs, *targets; /* (B, T) host memory: the caller fills them before forward */
    int32_t *dev_inputs, *dev_targets; /* (B, T) the kernels' copies (the same buffers on the CPU) */
    int32_t *positions, *dev_positions; /* (B, T) each token's position in its sample (host; the kernels' copy), NULL: row positions 0..T-1 */
    float *host_losses;       /* (B, T) the losses read back (losses on the CPU) */
    float *debug_logits;      /* when set, forward copies the logits here (host memory; tests) */
    float *tied_grad;         /* tied, training: the embedding's gradient buffer, open from the LM head (forward) to the
                               * embedding's backward */
    const float **seg_params; /* (interval or 1) a segment's gathered blocks during recompute + backward */
    const float **seg_adapters; /* (interval or 1) their adapter units (LoRA), NULL where none */
    /* LoRA (model.h struct model_lora): what the adapters keep and use */
    float **lora_t;           /* [set * MODEL_MAX_LINEAR + g] (B, T, w r) [A]: drop(x) A^T of group g's w layers, NULL: never adapted */
    float *lora_dt;           /* (B, T, w r) [A] backward work, w the widest group */
    float *lora_scratch;      /* (B, T, widest input) [A]: the dropped input (dropout > 0), else NULL */
    uint64_t lora_key;        /* this step's dropout seed (family_lora_step) */
    uint64_t lora_row0;       /* the global index of this micro-batch's first row (sample, packed row or window) */
    bool lora_dropout_on;     /* dropout in this pass: training, not evaluation */
    struct family_kv *kv;     /* generation's cache (family_kv_init), NULL: attention over the micro-batch itself */
    struct attn_opts *attn;   /* [n_layer] each block's attention variant (window, soft-cap, scale), from the
                               * model's config (struct attention_layers) at set-up; the kernels take it as data */
    void *priv;               /* the family's own buffers */
};

struct family {
    enum arch_id arch;        /* its entry in the architecture table (model/arch.h) */
    /* Bytes of the family's own buffers per class for micro-batch B x T and
     * n_sets sets of block activations. */
    void (*plan)(const struct model *m, const struct exec_target *t, int B, int T, int max_pos, int n_sets,
                 size_t bytes[BUF_COUNT]);
    /* Carves those buffers out of dev (a->max_B, max_T, max_pos, n_sets are set). */
    void (*init)(struct family_acts *a, const struct exec_target *t, struct arena *dev, struct mem_tracker *mem);
    void (*free)(struct family_acts *a);
    /* Optional: set-up of a forward's micro-batch before its first kernel (a->B, T, positions and the cache's
     * last are set); what it sets up serves the backward that follows too. */
    void (*prepare)(struct family_acts *a);
    /* Kernels; unit: the gathered unit (parameters [A]), grad: its gradient buffer ([G]). */
    void (*embed_forward)(struct family_acts *a, const float *unit, float *out);
    void (*embed_backward)(struct family_acts *a, float *grad, const float *dout);
    /* adapters: the block's gathered adapter unit (LoRA), NULL when it has none */
    void (*block_forward)(struct family_acts *a, int layer, const float *unit, const float *adapters, const float *x,
                          float *y);
    /* a->dresid_a holds dL/dy on entry and dL/dx on return; grad NULL: the unit is
     * frozen, only dL/dx is computed (every weight gradient pointer NULL);
     * adapter_grad: the adapter unit's gradient buffer. */
    void (*block_backward)(struct family_acts *a, int layer, const float *unit, float *grad, const float *adapters,
                           float *adapter_grad, const float *x);
    /* a->final -> a->norm_out; backward: a->dwork_c -> a->dresid_a (accumulated). */
    void (*norm_forward)(struct family_acts *a, const float *head);
    void (*norm_backward)(struct family_acts *a, const float *head, float *grad);
};

enum family_mode { FAMILY_TRAIN, FAMILY_EVAL };

/* The family of model.type. */
const struct family *family_of(const struct model *m);

/* The two passes of the engine (a dry walk of family_forward / family_backward). */
void family_build_passes(const struct model *m, int interval, struct zero_pass *train, struct zero_pass *eval);
void family_free_passes(struct zero_pass *train, struct zero_pass *eval);

/* Bytes per buffer class of the activations of micro-batch B x T with
 * checkpointing every `interval` blocks (0: off) on target t; positions:
 * with the packed rows' positions (a->positions, data.packing); max_pos: the
 * positions the rotary tables cover (T in training). */
void family_plan(const struct model *m, const struct exec_target *t, int B, int T, int max_pos, int interval,
                 bool positions, size_t bytes[BUF_COUNT]);
/* Carves them out of the arenas (ckpt_space: where the kept segment inputs live). */
void family_acts_init(struct family_acts *a, const struct model *m, const struct exec_target *t, int B, int T,
                      int max_pos, int interval, bool positions, enum mem_space ckpt_space,
                      struct arena arenas[SPACE_COUNT], struct mem_tracker *mem);
void family_acts_free(struct family_acts *a);

/* Generation's key/value cache for a->max_B rows of Tmax positions (a->max_pos
 * at most): its bytes per buffer class (the cache itself in activations, the
 * kernels' copy of past in the workspace), and carving it out of the device
 * arena. With a->kv set, family_forward (FAMILY_EVAL, no targets) takes row
 * b's T tokens at positions kv->past[b] + 0 .. T-1 (a->positions must say so),
 * stores their keys and values, attends over the cache, and computes the
 * logits of row b's token kv->last[b] only, into logits row b. */
void family_kv_plan(const struct model *m, const struct exec_target *t, int B, int Tmax, size_t bytes[BUF_COUNT]);
void family_kv_init(struct family_acts *a, struct family_kv *kv, const struct exec_target *t, int Tmax,
                    struct arena arenas[SPACE_COUNT], struct mem_tracker *mem);
void family_kv_free(struct family_acts *a);

/* Forward over a->inputs (B x T). With targets (a->targets; -1: not
 * trained) it returns the sum of the losses of this micro-batch's trained
 * positions; without, only the logits are computed. FAMILY_TRAIN (with
 * targets) also runs the head's backward: the LM head's and the final norm's
 * gradients and the gradient into the last block, dloss_scale = 1 / (the
 * step's trained positions over every micro-batch and rank) (ignored
 * otherwise); family_backward must follow. The caller brackets them with
 * zero_begin_pass / zero_end_pass. */
double family_forward(struct zero *z, struct family_acts *a, int B, int T, int with_targets, enum family_mode mode,
                      float dloss_scale);
/* The blocks' and the embedding's backward after a FAMILY_TRAIN forward. */
void family_backward(struct zero *z, struct family_acts *a, int B, int T);
/* Sets the dropout of the adapters for the next micro-batch: seed (train.seed),
 * the optimizer step and the global index of the micro-batch's first row, so
 * that a row's mask is the same at every world size and split. */
void family_lora_step(struct family_acts *a, uint64_t seed, long step, uint64_t row0);
/* Copies row `row` of the logits (Vp floats) into host memory: a row of the
 * last chunk the forward computed (the last rows; with a cache, rows 0 .. B-1). */
void family_read_logits(const struct family_acts *a, int row, float *out);
/* Rows of logits computed at a time for micro-batch B x T: as many as keep
 * the chunk no larger than the widest activation of a block (q|k|v or the
 * MLP's), at least LOGITS_MIN_ROWS (and B), at most B T; so the logits'
 * memory grows with T as the activations do, never as B T V. */
#define LOGITS_MIN_ROWS 256
/* Tests: this many rows instead (the plan follows). */
#define LOGITS_ROWS_ENV "SHARDLM_LOGITS_ROWS"
int family_logits_rows(const struct model *m, int B, int T);
/* Tests: "all": an evaluation forward with targets runs the LM head over every row, as before it skipped the
 * untrained ones; "log": it says on stderr how many rows it ran of how many. */
#define EVAL_ROWS_ENV "SHARDLM_EVAL_LM_ROWS"

/* ---- for the families ---- */

/* Tensor t of a gathered unit (parameters, [A]) or of a unit gradient buffer ([G]);
 * NULL for a frozen unit's (grad NULL), which the kernels take as "input gradient only". */
const float *family_param(const struct family_acts *a, const float *unit, int u, int t);
float *family_grad(const struct family_acts *a, float *grad, int u, int t);
/* Tensors t0..t1 of unit u, one matrix to the kernels (q|k|v, gate|up): the
 * group's gradient when any of them trains (NULL when none does), and, after
 * the kernel wrote it, zeros over the members that are frozen. */
float *family_group_grad(const struct family_acts *a, float *grad, int u, int t0, int t1);
void family_group_grad_done(const struct family_acts *a, float *grad, int u, int t0, int t1);
/* LoRA on group g (model_linear.group: q|k|v, o, gate|up, down; GPT-2's four
 * layers one each) of block l: x is the group's input, y [A], rows of ld
 * elements, the fused output its layers' columns are part of (the helper
 * adds each layer's column offset). The adapted layers of the group go to
 * the kernels as one call, x read once (with dropout, one call per layer:
 * each has its own mask). The backward adds the adapters' input gradient
 * into dx and their weight gradients into adapter_grad. Nothing when the
 * group has no adapter in this block. */
void family_lora_forward(struct family_acts *a, int l, const float *adapters, int g, const float *x, float *y, int ld);
void family_lora_backward(struct family_acts *a, int l, const float *adapters, float *adapter_grad, int g,
                          const float *x, const float *dy, int ld, float *dx);
/* Attention of block l through the key/value cache when generating (a->kv):
 * false, doing nothing, in training and evaluation. */
bool family_attention_kv(struct family_acts *a, int l, float *out, const float *qkv, int NH, int NKV, int hs);
/* Whether linear k of block l is adapted. */
bool family_lora_adapts(const struct family_acts *a, int l, int k);
/* Floats of the scratch the attention and norm backward kernels share on target t. */
size_t family_scratch_floats(const struct model *m, const struct exec_target *t, int T);
/* Bytes of n [A] elements of the target, and of n fp32, as the arena rounds them. */
size_t family_f32_bytes(size_t n);
/* Copies n [A] elements (the running backend's act dtype). */
void family_copy_act(float *dst, const float *src, size_t n);

extern const struct family family_gpt2, family_llama, family_gemma;

#endif
