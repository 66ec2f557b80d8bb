/*
 * llama.h — what the Llama-like block shares with the families built on it
 * (llama.c defines it; gemma.c calls it): the block's shapes, its tensor
 * numbers, the extras a model's block carries, the rotary tables and the
 * per-head RMSNorm. Private to families/.
 */
#ifndef SHARDLM_LLAMA_H
#define SHARDLM_LLAMA_H

#include <stdbool.h>
#include <stddef.h>

#include "backend/arena.h"
#include "backend/target.h"
#include "family.h"
#include "model/model.h"

/* Tensors of a Llama block unit, in model.c's order (Gemma's two feed-forward norms follow LT_DOWN). */
enum { LT_IN_NORM, LT_Q, LT_K, LT_V, LT_O, LT_POST_NORM, LT_GATE, LT_UP, LT_DOWN, LT_PRE_FF_NORM, LT_POST_FF_NORM };

/* LoRA's groups of linear layers (model_block_linears): q|k|v, o, gate|up, down. */
enum { LG_QKV, LG_O, LG_GATE_UP, LG_DOWN };

/* The block tensors beyond Llama's (model.c, build_llama): their numbers in
 * the unit, -1 where the model has none. */
struct llama_extras {
    int qkv_bias;       /* q_proj.bias, then k's and v's packed after it: one (Q + 2 KV) vector */
    int q_norm, k_norm; /* (hs) each */
};

/* A micro-batch's shapes: N = B T rows, Q = NH hs, QKV = Q + 2 NKV hs, F the MLP's width. */
struct llama_dims {
    int N, C, NH, NKV, hs, Q, QKV, F;
};

struct llama_dims llama_dims_of(const struct model *m, int B, int T);
struct llama_extras llama_extras_of(const struct model *m);

struct llama_block_acts {
    float *ln1, *rstd1; /* (B, T, C) [A], (B, T) */
    float *qkv;         /* (B, T, Q + 2 KV) after rotary */
    float *q_pre, *k_pre;   /* (B, T, NH hs), (B, T, NKV hs) [A]: q and k before q_norm / k_norm (Qwen3) */
    float *q_rstd, *k_rstd; /* (B T NH), (B T NKV) */
    float *att;         /* what attention keeps (backend_attention_saved) */
    float *atty;        /* (B, T, Q) attention output before o_proj */
    float *res2;        /* (B, T, C) residual after attention */
    float *ln2, *rstd2; /* (B, T, C), (B, T) */
    float *gu;          /* (B, T, 2F) gate | up */
    float *h;           /* (B, T, F) silu(gate) * up (Gemma: gelu(gate) * up) */
};

struct llama_acts {
    struct llama_extras x;
    struct llama_block_acts *sets;
    float *rstd_final;  /* (B, T) */
    float *dqkv;        /* (B, T, Q + 2 KV) */
    float *datty;       /* (B, T, Q) where Q > C (else the driver's dwork_c holds it) */
    float *head_a, *head_b; /* (B, T, NH hs) [A] each: the per-head norm's contiguous rows (qk_norm only) */
    float *dgu;         /* (B, T, 2F) */
    float *dh;          /* (B, T, F) */
    float *scratch;     /* attention and RMSNorm backward scratch */
    float *rope_cos, *rope_sin; /* (max_pos, hs / 2) fp32; two tables one after the other when rope_pos is set */
    /* longrope past original_max_position_embeddings (model_rope_switch): the positions the rotary reads, each row's
     * position plus max_pos where the row takes the long factors (llama_prepare), (B, T) on the kernels' side and
     * its host copy; NULL: the rotary reads the micro-batch's positions (one table) */
    int32_t *rope_pos, *rope_pos_host;
    /* the MLP's gate (model_config.mlp, chosen at set-up): SwiGLU, or Gemma's GeGLU */
    void (*gate_forward)(float *out, const float *gu, int N, int F);
    void (*gate_backward)(float *dgu, const float *dout, const float *gu, int N, int F);
};

/* The family's own buffers (family_acts.priv), a->sets[l % n_sets] block l's: llama_plan counts them and
 * llama_init carves them (a family built on the block allocates this struct first, so that fa->priv is one). */
void llama_plan(const struct model *m, const struct exec_target *t, int B, int T, int max_pos, int n_sets,
                size_t bytes[BUF_COUNT]);
void llama_init(struct family_acts *fa, const struct exec_target *t, struct arena *dev, struct mem_tracker *mem);
void llama_free(struct family_acts *fa);
void llama_embed_forward(struct family_acts *fa, const float *unit, float *out);
void llama_embed_backward(struct family_acts *fa, float *grad, const float *dout);

/* One layer's rotary tables (Gemma 3's local layers have their own base); the attention's own options (window,
 * soft-cap, scale) are fa->attn[l], from the model config. */
struct llama_layer_attn {
    const float *rope_cos, *rope_sin;
};

/* The attention half of block l up to its output before o_proj (sets' atty): the input norm (weight read as
 * norm_offset + w) of x, q|k|v (biases, LoRA), the per-head q/k norms, the rotary with these tables, attention
 * (fa->attn[l]'s window, soft-cap and scale; through the cache when generating). */
void llama_attention_forward(struct family_acts *fa, int l, const float *unit, const float *ad, const float *x,
                             const struct llama_layer_attn *la);
/* Its backward from datty (the gradient of atty, (B, T, Q)): fa->dresid_a = dres2 (the gradient of the residual
 * after the attention) + the input norm's input gradient; fa->dwork_c is used. */
void llama_attention_backward(struct family_acts *fa, int l, const float *unit, float *grad, const float *ad,
                              float *ag, const float *x, const float *datty, const float *dres2,
                              const struct llama_layer_attn *la);
/* The MLP's backward from dout (the gradient of down_proj's output, (B, T, C)) to fa->dwork_c (the gradient of
 * its input ln2): down_proj, the gate, gate|up, LoRA's too. */
void llama_mlp_backward(struct family_acts *fa, int l, const float *unit, float *grad, const float *ad, float *ag,
                        const float *dout);
/* The final norm (norm_offset + w): a->final -> a->norm_out; backward: a->dwork_c -> a->dresid_a (accumulated). */
void llama_norm_forward(struct family_acts *fa, const float *head);
void llama_norm_backward(struct family_acts *fa, const float *head, float *grad);

/* Floats of one rotary table (cos or sin) covering T positions. */
size_t llama_rope_floats(const struct model *m, int T);
/* Bytes of the pair llama_rope_upload allocates. */
size_t llama_rope_bytes(const struct model *m, int max_pos);
/* cos and sin of position t times each pair's frequency for base theta, (T, hs / 2) host fp32; scaled: with the
 * model's rope_scaling (false: plain, Gemma 3's local layers); long_factors: longrope's long_factor (else its
 * short_factor). */
void llama_rope_tables(const struct model_config *c, double theta, bool scaled, bool long_factors, int T,
                       float *cos_out, float *sin_out);
/* Allocates and fills a rotary pair of max_pos positions (twice that, short then long, when model_rope_switch). */
void llama_rope_upload(const struct model_config *c, double theta, bool scaled, int max_pos, struct arena *dev,
                       struct mem_tracker *mem, float **cos_out, float **sin_out);
/* Before each forward (family.prepare): which rows take the long factors (rope_pos), nothing with one table. */
void llama_prepare(struct family_acts *fa);

/* y [A] = x [A] + inp [A] @ w^T: a projection added into the residual stream, in place in y. */
void llama_project_add(float *y, const float *x, const float *inp, const float *w, int N, int C_in, int C);

/* An RMSNorm (weight read as offset + w) over each of the `heads` heads of hs channels that start at column col
 * of qkv's rows (Qwen3's and Gemma 3's q_norm, k_norm), in place: the heads are copied to contiguous rows (pre,
 * kept for the backward), normalised into work and copied back. */
void llama_head_norm_forward(const struct llama_dims *d, float *qkv, int col, int heads, const float *weight,
                             float offset, float eps, float *pre, float *rstd, float *work);
/* Its backward, in place on the gradient dqkv: dweight (NULL: frozen) += ...; dy, dx: (N, heads hs) work. */
void llama_head_norm_backward(const struct llama_dims *d, float *dqkv, int col, int heads, const float *weight,
                              float offset, float *dweight, const float *pre, const float *rstd, float *dy, float *dx,
                              float *scratch);

#endif
