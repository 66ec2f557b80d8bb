/*
 * gpt2 — the GPT-2 family (family.h): learned position embeddings, LayerNorm
 * with biases, fused q|k|v projection (Hugging Face Conv1D weights, (in, out)),
 * GELU MLP, the LM head tied to the token embedding.
 *
 * The family keeps, per set of block activations (struct block_acts below),
 * what each block's backward reads; the driver (family.c) keeps the residual
 * stream, the logits and the pass order. Tensors that feed or leave matmuls
 * are in the activation dtype ([A] in backend.h); the norm statistics fp32.
 */
#ifndef SHARDLM_GPT2_H
#define SHARDLM_GPT2_H

#include "family.h"

struct block_acts {
    float *ln1;       /* (B, T, C) */
    float *ln1_mean;  /* (B, T) */
    float *ln1_rstd;  /* (B, T) */
    float *qkv;       /* (B, T, 3C) */
    float *att;       /* what attention keeps (backend_attention_saved) */
    float *atty;      /* (B, T, C) attention output before c_proj */
    float *res2;      /* (B, T, C) residual after attention */
    float *ln2;       /* (B, T, C) */
    float *ln2_mean;  /* (B, T) */
    float *ln2_rstd;  /* (B, T) */
    float *fch;       /* (B, T, 4C) before GELU */
    float *fch_gelu;  /* (B, T, 4C) */
};

struct gpt2_acts {
    struct block_acts *sets;  /* (n_sets) */
    float *lnf_mean, *lnf_rstd; /* (B, T) */
    float *dwork_3c;          /* (B, T, 3C): dqkv */
    float *dwork_4c;          /* (B, T, 4C): dfch */
    float *scratch;           /* attention and layernorm backward scratch */
};

#endif
