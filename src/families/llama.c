/*
 * llama — the Llama family (family.h), Hugging Face LlamaForCausalLM:
 * RMSNorm, rotary positions (rotate-half, rope_theta, optional Llama 3.1
 * scaling), grouped-query attention, SwiGLU MLP, no biases, nn.Linear
 * weights (out, in) used as they are stored (y = x W^T), the LM head untied
 * (lm_head in the head unit) or tied to the token embedding.
 *
 * A block unit stores q_proj, k_proj, v_proj one after the other and so
 * gate_proj and up_proj (model.c packs them without alignment gaps), so
 * each group is one (out, in) matrix and one matmul: q|k|v (Q + 2 KV, C) and
 * gate|up (2F, C), with Q = NH hs and KV = NKV hs (hs: head_dim, which
 * Qwen3 sets apart from C / NH).
 *
 * The Llama-like families differ here only by tensors a block may have, read
 * from the model at set-up (struct llama_extras) and not by family name:
 * q|k|v biases (Qwen2), added after the matmul, and an RMSNorm over each
 * head of q and of k before the rotary (Qwen3's q_norm and k_norm), run as
 * the model's RMSNorm on the heads copied to contiguous rows.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "family.h"
#include "llama.h"
#include "core/util.h"

struct llama_dims llama_dims_of(const struct model *m, int B, int T)
{
    const struct model_config *c = &m->cfg;
    struct llama_dims d = {B * T, c->n_embd, c->n_head, c->n_kv_head, c->head_dim, 0, 0, c->ffn_dim};
    d.Q = d.NH * d.hs;
    d.QKV = d.Q + 2 * d.NKV * d.hs;
    return d;
}

struct llama_extras llama_extras_of(const struct model *m)
{
    const struct model_config *c = &m->cfg;
    const int after = LT_DOWN + 1 + (c->post_norms ? 2 : 0); /* the extras follow down_proj (and Gemma's norms) */
    struct llama_extras x = {c->qkv_bias ? after : -1, -1, -1};
    if (c->qk_norm) {
        x.q_norm = after + (c->qkv_bias ? 3 : 0);
        x.k_norm = x.q_norm + 1;
    }
    return x;
}

size_t llama_rope_floats(const struct model *m, int T) { return (size_t)T * (size_t)(m->cfg.rotary_dim / 2); }

size_t llama_rope_bytes(const struct model *m, int max_pos)
{
    const size_t tables = model_rope_switch(&m->cfg, max_pos) ? 2 : 1;
    return 2 * family_f32_bytes(tables * llama_rope_floats(m, max_pos));
}

void llama_plan(const struct model *m, const struct exec_target *t, int B, int T, int max_pos, int n_sets,
                       size_t bytes[BUF_COUNT])
{
    const struct llama_dims d = llama_dims_of(m, B, T);
    const size_t N = (size_t)d.N, C = (size_t)d.C, F = (size_t)d.F, QKV = (size_t)d.QKV;
    const size_t Q = (size_t)d.Q;
    size_t set = 3 * target_act_bytes(t, N * C) + target_act_bytes(t, N * Q) + 2 * family_f32_bytes(N) +
                 target_act_bytes(t, N * QKV) + arena_round(target_attention_saved(t, B, T, d.NH)) +
                 target_act_bytes(t, N * 2 * F) + target_act_bytes(t, N * F);
    if (m->cfg.qk_norm) {
        set += target_act_bytes(t, N * Q) + target_act_bytes(t, N * d.NKV * d.hs) + family_f32_bytes(N * d.NH) +
               family_f32_bytes(N * d.NKV);
        bytes[BUF_WORKSPACE] += 2 * target_act_bytes(t, N * Q);
    }
    if (d.Q > d.C)
        bytes[BUF_WORKSPACE] += target_act_bytes(t, N * Q);
    bytes[BUF_ACTIVATIONS] += (size_t)n_sets * set;
    bytes[BUF_LOGITS] += family_f32_bytes(N);
    bytes[BUF_WORKSPACE] += target_act_bytes(t, N * QKV) + target_act_bytes(t, N * 2 * F) + target_act_bytes(t, N * F) +
                            family_f32_bytes(family_scratch_floats(m, t, T)) + llama_rope_bytes(m, max_pos);
    if (model_rope_switch(&m->cfg, max_pos)) /* the rotary's positions */
        bytes[BUF_WORKSPACE] += arena_round(N * sizeof(int32_t));
}

/* The rotary frequency of pair i (Hugging Face's inv_freq, in fp32 as it
 * computes it) for base theta, with Llama 3.1's scaling of the long
 * wavelengths when rope_scaling is "llama3" (scaled false: none, Gemma 3's
 * local layers). */
static float rope_inv_freq(const struct model_config *c, double theta, bool scaled, bool long_factors, int i, int hs)
{
    float inv = (float)(1.0 / pow(theta, (double)(2 * i) / (double)hs));
    if (!scaled)
        return inv;
    if (c->rope_scaling.type == ROPE_SCALING_LINEAR)
        return inv / (float)c->rope_scaling.factor; /* transformers: inv_freq /= factor, in fp32 */
    if (c->rope_scaling.type == ROPE_SCALING_LONGROPE) { /* 1 / (factor[i] base^(2i / hs)), factors in fp32 */
        const double f = (float)(long_factors ? c->rope_scaling.long_factor[i] : c->rope_scaling.short_factor[i]);
        return (float)(1.0 / (f * pow(theta, (double)(2 * i) / hs)));
    }
    if (c->rope_scaling.type != ROPE_SCALING_LLAMA3)
        return inv;
    const double pi = 3.14159265358979323846;
    const double old_ctx = c->rope_scaling.original_max_positions, factor = c->rope_scaling.factor;
    const double low = c->rope_scaling.low_freq_factor, high = c->rope_scaling.high_freq_factor;
    const double wavelen = 2.0 * pi / inv, low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
    if (wavelen < high_wavelen)
        return inv;
    if (wavelen > low_wavelen)
        return (float)(inv / factor);
    double smooth = (old_ctx / wavelen - low) / (high - low);
    return (float)((1.0 - smooth) * inv / factor + smooth * inv);
}

void llama_rope_tables(const struct model_config *c, double theta, bool scaled, bool long_factors, int T,
                       float *cos_out, float *sin_out)
{
    const int hs = c->rotary_dim, half = hs / 2; /* transformers: frequencies over the rotated channels */
    /* longrope scales cos and sin (transformers' attention_scaling, in fp32) */
    const float scale =
        scaled && c->rope_scaling.type == ROPE_SCALING_LONGROPE ? (float)c->rope_scaling.attention_factor : 1.0f;
    for (int i = 0; i < half; i++) {
        float inv = rope_inv_freq(c, theta, scaled, long_factors, i, hs);
        for (int t = 0; t < T; t++) {
            float angle = (float)t * inv; /* fp32, as Hugging Face's outer product */
            cos_out[(size_t)t * half + i] = (float)cos((double)angle) * scale;
            sin_out[(size_t)t * half + i] = (float)sin((double)angle) * scale;
        }
    }
}

void llama_init(struct family_acts *fa, const struct exec_target *t, struct arena *dev, struct mem_tracker *mem)
{
    const struct model *m = fa->m;
    const struct llama_dims d = llama_dims_of(m, fa->max_B, fa->max_T);
    const size_t N = (size_t)d.N, C = (size_t)d.C, F = (size_t)d.F, QKV = (size_t)d.QKV;
    const size_t ae = (size_t)dtype_size(t->act);
    struct llama_acts *a = fa->priv ? fa->priv : xcalloc(1, sizeof *a); /* a family on the block brings its own */
    fa->priv = a;
    a->x = llama_extras_of(m);
    a->gate_forward = m->cfg.mlp == MLP_GEGLU ? backend_geglu_forward : backend_swiglu_forward;
    a->gate_backward = m->cfg.mlp == MLP_GEGLU ? backend_geglu_backward : backend_swiglu_backward;
    const size_t Q = (size_t)d.Q, KVW = (size_t)d.NKV * (size_t)d.hs;
#define ALLOC(cls, n) arena_alloc(dev, mem, cls, (n) * sizeof(float), 1)
#define ALLOC_ACT(cls, n) arena_alloc(dev, mem, cls, (n) * ae, 1)
    a->sets = xcalloc((size_t)fa->n_sets, sizeof *a->sets);
    for (int i = 0; i < fa->n_sets; i++) {
        struct llama_block_acts *ba = &a->sets[i];
        ba->ln1 = ALLOC_ACT(BUF_ACTIVATIONS, N * C);
        ba->rstd1 = ALLOC(BUF_ACTIVATIONS, N);
        ba->qkv = ALLOC_ACT(BUF_ACTIVATIONS, N * QKV);
        ba->att = arena_alloc(dev, mem, BUF_ACTIVATIONS, target_attention_saved(t, fa->max_B, fa->max_T, d.NH), 1);
        ba->atty = ALLOC_ACT(BUF_ACTIVATIONS, N * Q);
        if (m->cfg.qk_norm) {
            ba->q_pre = ALLOC_ACT(BUF_ACTIVATIONS, N * Q);
            ba->k_pre = ALLOC_ACT(BUF_ACTIVATIONS, N * KVW);
            ba->q_rstd = ALLOC(BUF_ACTIVATIONS, N * (size_t)d.NH);
            ba->k_rstd = ALLOC(BUF_ACTIVATIONS, N * (size_t)d.NKV);
        }
        ba->res2 = ALLOC_ACT(BUF_ACTIVATIONS, N * C);
        ba->ln2 = ALLOC_ACT(BUF_ACTIVATIONS, N * C);
        ba->rstd2 = ALLOC(BUF_ACTIVATIONS, N);
        ba->gu = ALLOC_ACT(BUF_ACTIVATIONS, N * 2 * F);
        ba->h = ALLOC_ACT(BUF_ACTIVATIONS, N * F);
    }
    a->rstd_final = ALLOC(BUF_LOGITS, N);
    a->dqkv = ALLOC_ACT(BUF_WORKSPACE, N * QKV);
    a->dgu = ALLOC_ACT(BUF_WORKSPACE, N * 2 * F);
    a->dh = ALLOC_ACT(BUF_WORKSPACE, N * F);
    a->scratch = ALLOC(BUF_WORKSPACE, family_scratch_floats(m, t, fa->max_T));
    if (d.Q > d.C)
        a->datty = ALLOC_ACT(BUF_WORKSPACE, N * Q);
    if (m->cfg.qk_norm) {
        a->head_a = ALLOC_ACT(BUF_WORKSPACE, N * Q);
        a->head_b = ALLOC_ACT(BUF_WORKSPACE, N * Q);
    }
    llama_rope_upload(&m->cfg, m->cfg.rope_theta, true, fa->max_pos, dev, mem, &a->rope_cos, &a->rope_sin);
    if (model_rope_switch(&m->cfg, fa->max_pos)) {
        a->rope_pos = arena_alloc(dev, mem, BUF_WORKSPACE, N * sizeof(int32_t), 1);
        a->rope_pos_host = t->device ? xcalloc(N, sizeof *a->rope_pos_host) : a->rope_pos;
    }
#undef ALLOC
#undef ALLOC_ACT
}

void llama_rope_upload(const struct model_config *c, double theta, bool scaled, int max_pos, struct arena *dev,
                       struct mem_tracker *mem, float **cos_out, float **sin_out)
{
    const size_t nr = (size_t)max_pos * (size_t)(c->rotary_dim / 2), tables = model_rope_switch(c, max_pos) ? 2 : 1;
    float *cs = xcalloc(2 * tables * nr + 1, sizeof *cs), *sn = cs + tables * nr;
    for (size_t k = 0; k < tables; k++)
        llama_rope_tables(c, theta, scaled, k == 1, max_pos, cs + k * nr, sn + k * nr);
    *cos_out = arena_alloc(dev, mem, BUF_WORKSPACE, tables * nr * sizeof(float), 1);
    *sin_out = arena_alloc(dev, mem, BUF_WORKSPACE, tables * nr * sizeof(float), 1);
    backend_copy(*cos_out, cs, tables * nr * sizeof *cs);
    backend_copy(*sin_out, sn, tables * nr * sizeof *sn);
    free(cs);
}

/* Row b takes the long factors when its largest position + 1 exceeds original_max_position_embeddings: over every
 * position of the row (padding too, as transformers' forward of the padded rows), with a cache over its real
 * tokens (up to kv->last[b], so a prompt's tokens do not depend on the batch's padding). */
void llama_prepare(struct family_acts *fa)
{
    struct llama_acts *a = fa->priv;
    if (!a->rope_pos)
        return;
    const int original = model_rope_switch(&fa->m->cfg, fa->max_pos), B = fa->B, T = fa->T;
    const int32_t *pos = fa->positions;
    for (int b = 0; b < B; b++) {
        const int32_t *row = pos ? pos + (size_t)b * T : NULL;
        int top = T - 1;
        if (row && fa->kv)
            top = row[fa->kv->last[b] > 0 ? fa->kv->last[b] : 0];
        else if (row)
            for (int t = 0; t < T; t++)
                top = t == 0 || row[t] > top ? row[t] : top;
        const int32_t shift = top + 1 > original ? fa->max_pos : 0;
        for (int t = 0; t < T; t++)
            a->rope_pos_host[(size_t)b * T + t] = (row ? row[t] : t) + shift;
    }
    if (a->rope_pos_host != a->rope_pos)
        backend_copy(a->rope_pos, a->rope_pos_host, (size_t)B * T * sizeof(int32_t));
}

/* The positions the rotary reads: llama_prepare's (longrope's two tables), else the micro-batch's. */
static const int32_t *rope_positions(const struct family_acts *fa)
{
    const struct llama_acts *a = fa->priv;
    return a->rope_pos ? a->rope_pos : fa->dev_positions;
}

void llama_free(struct family_acts *fa)
{
    struct llama_acts *a = fa->priv;
    if (a && a->rope_pos_host != a->rope_pos)
        free(a->rope_pos_host);
    if (a)
        free(a->sets);
    free(a);
    fa->priv = NULL;
}

void llama_embed_forward(struct family_acts *fa, const float *unit, float *out)
{
    backend_embedding_forward(out, fa->dev_inputs, family_param(fa, unit, 0, 0), NULL, fa->dev_positions, fa->B, fa->T,
                              fa->m->cfg.n_embd);
}

void llama_embed_backward(struct family_acts *fa, float *grad, const float *dout)
{
    backend_embedding_backward(family_grad(fa, grad, 0, 0), NULL, dout, fa->dev_inputs, fa->dev_positions, fa->B, fa->T,
                               fa->m->cfg.n_embd);
}

void llama_project_add(float *y, const float *x, const float *inp, const float *w, int N, int C_in, int C)
{
    backend_matmul_forward_transposed(y, inp, w, N, C_in, C);
    backend_add_act(y, y, x, (size_t)N * C);
}

void llama_head_norm_forward(const struct llama_dims *d, float *qkv, int col, int heads, const float *weight,
                             float offset, float eps, float *pre, float *rstd, float *work)
{
    const int width = heads * d->hs;
    backend_copy_cols(pre, width, 0, qkv, d->QKV, col, d->N, width);
    backend_rmsnorm_offset_forward(work, rstd, pre, weight, offset, eps, d->N * heads, d->hs);
    backend_copy_cols(qkv, d->QKV, col, work, width, 0, d->N, width);
}

void llama_head_norm_backward(const struct llama_dims *d, float *dqkv, int col, int heads, const float *weight,
                              float offset, float *dweight, const float *pre, const float *rstd, float *dy, float *dx,
                              float *scratch)
{
    const int width = heads * d->hs;
    const size_t n = (size_t)d->N * (size_t)width;
    backend_copy_cols(dy, width, 0, dqkv, d->QKV, col, d->N, width);
    backend_zero(dx, n * (size_t)dtype_size(backend_act_dtype()) / sizeof(float)); /* the backward adds into dx */
    backend_rmsnorm_offset_backward(dx, dweight, dy, pre, weight, offset, rstd, scratch, d->N * heads, d->hs);
    backend_copy_cols(dqkv, d->QKV, col, dx, width, 0, d->N, width);
}


void llama_attention_forward(struct family_acts *fa, int l, const float *unit, const float *ad, const float *x,
                             const struct llama_layer_attn *la)
{
    const struct model *m = fa->m;
    struct llama_acts *a = fa->priv;
    struct llama_block_acts *ba = &a->sets[l % fa->n_sets];
    const struct llama_dims d = llama_dims_of(m, fa->B, fa->T);
    const int u = model_block_unit(l);
    const float eps = m->cfg.norm_eps, off = m->cfg.norm_offset;
#define P(t) family_param(fa, unit, u, t)
    backend_rmsnorm_offset_forward(ba->ln1, ba->rstd1, x, P(LT_IN_NORM), off, eps, d.N, d.C);
    backend_matmul_forward_transposed_bias(ba->qkv, ba->ln1, P(LT_Q), a->x.qkv_bias >= 0 ? P(a->x.qkv_bias) : NULL,
                                           d.N, d.C, d.QKV);
    family_lora_forward(fa, l, ad, LG_QKV, ba->ln1, ba->qkv, d.QKV);
    if (a->x.q_norm >= 0) {
        llama_head_norm_forward(&d, ba->qkv, 0, d.NH, P(a->x.q_norm), off, eps, ba->q_pre, ba->q_rstd, a->head_a);
        llama_head_norm_forward(&d, ba->qkv, d.Q, d.NKV, P(a->x.k_norm), off, eps, ba->k_pre, ba->k_rstd, a->head_a);
    }
    backend_rope_forward(ba->qkv, la->rope_cos, la->rope_sin, rope_positions(fa), fa->B, fa->T, d.NH, d.NKV, d.hs,
                         m->cfg.rotary_dim);
    if (!family_attention_kv(fa, l, ba->atty, ba->qkv, d.NH, d.NKV, d.hs))
        backend_attention_gqa_forward(ba->atty, ba->att, ba->qkv, a->scratch, fa->dev_positions, fa->B, fa->T, d.NH,
                                      d.NKV, d.hs, &fa->attn[l]);
#undef P
}

static void llama_block_forward(struct family_acts *fa, int l, const float *unit, const float *ad, const float *x,
                                float *y)
{
    const struct model *m = fa->m;
    struct llama_acts *a = fa->priv;
    struct llama_block_acts *ba = &a->sets[l % fa->n_sets];
    const struct llama_dims d = llama_dims_of(m, fa->B, fa->T);
    const int u = model_block_unit(l);
#define P(t) family_param(fa, unit, u, t)
    const struct llama_layer_attn la = {a->rope_cos, a->rope_sin};
    llama_attention_forward(fa, l, unit, ad, x, &la);
    llama_project_add(ba->res2, x, ba->atty, P(LT_O), d.N, d.Q, d.C);
    family_lora_forward(fa, l, ad, LG_O, ba->atty, ba->res2, d.C);
    backend_rmsnorm_forward(ba->ln2, ba->rstd2, ba->res2, P(LT_POST_NORM), m->cfg.norm_eps, d.N, d.C);
    backend_matmul_forward_transposed(ba->gu, ba->ln2, P(LT_GATE), d.N, d.C, 2 * d.F);
    family_lora_forward(fa, l, ad, LG_GATE_UP, ba->ln2, ba->gu, 2 * d.F);
    a->gate_forward(ba->h, ba->gu, d.N, d.F);
    llama_project_add(y, ba->res2, ba->h, P(LT_DOWN), d.N, d.F, d.C);
    family_lora_forward(fa, l, ad, LG_DOWN, ba->h, y, d.C);
#undef P
}

void llama_attention_backward(struct family_acts *fa, int l, const float *unit, float *grad, const float *ad,
                              float *ag, const float *x, const float *datty, const float *dres2,
                              const struct llama_layer_attn *la)
{
    const struct model *m = fa->m;
    struct llama_acts *a = fa->priv;
    const struct llama_block_acts *ba = &a->sets[l % fa->n_sets];
    const struct llama_dims d = llama_dims_of(m, fa->B, fa->T);
    const int u = model_block_unit(l);
    const float off = m->cfg.norm_offset;
    float *dc = fa->dwork_c;
#define P(t) family_param(fa, unit, u, t)
#define G(t) family_grad(fa, grad, u, t)
    backend_attention_gqa_backward(a->dqkv, datty, ba->qkv, ba->att, ba->atty, a->scratch, fa->dev_positions, fa->B, fa->T,
                                   d.NH, d.NKV, d.hs, &fa->attn[l]);
    backend_rope_backward(a->dqkv, la->rope_cos, la->rope_sin, rope_positions(fa), fa->B, fa->T, d.NH, d.NKV, d.hs,
                          m->cfg.rotary_dim);
    if (a->x.q_norm >= 0) {
        llama_head_norm_backward(&d, a->dqkv, 0, d.NH, P(a->x.q_norm), off, G(a->x.q_norm), ba->q_pre, ba->q_rstd,
                                 a->head_a, a->head_b, a->scratch);
        llama_head_norm_backward(&d, a->dqkv, d.Q, d.NKV, P(a->x.k_norm), off, G(a->x.k_norm), ba->k_pre,
                                 ba->k_rstd, a->head_a, a->head_b, a->scratch);
    }
    if (a->x.qkv_bias >= 0) {
        const int b0 = a->x.qkv_bias;
        backend_bias_backward(family_group_grad(fa, grad, u, b0, b0 + 2), a->dqkv, d.N, d.QKV);
        family_group_grad_done(fa, grad, u, b0, b0 + 2);
    }
    backend_matmul_backward_transposed(dc, family_group_grad(fa, grad, u, LT_Q, LT_V), a->dqkv, ba->ln1, P(LT_Q), d.N,
                                       d.C, d.QKV);
    family_group_grad_done(fa, grad, u, LT_Q, LT_V);
    family_lora_backward(fa, l, ad, ag, LG_QKV, ba->ln1, a->dqkv, d.QKV, dc);
    family_copy_act(fa->dresid_a, dres2, (size_t)d.N * d.C);
    backend_rmsnorm_offset_backward(fa->dresid_a, G(LT_IN_NORM), dc, x, P(LT_IN_NORM), off, ba->rstd1, a->scratch, d.N,
                                    d.C);
#undef P
#undef G
}

void llama_mlp_backward(struct family_acts *fa, int l, const float *unit, float *grad, const float *ad, float *ag,
                        const float *dout)
{
    struct llama_acts *a = fa->priv;
    const struct llama_block_acts *ba = &a->sets[l % fa->n_sets];
    const struct llama_dims d = llama_dims_of(fa->m, fa->B, fa->T);
    const int u = model_block_unit(l);
#define P(t) family_param(fa, unit, u, t)
    backend_matmul_backward_transposed(a->dh, family_grad(fa, grad, u, LT_DOWN), dout, ba->h, P(LT_DOWN), d.N, d.F,
                                       d.C);
    family_lora_backward(fa, l, ad, ag, LG_DOWN, ba->h, dout, d.C, a->dh);
    a->gate_backward(a->dgu, a->dh, ba->gu, d.N, d.F);
    backend_matmul_backward_transposed(fa->dwork_c, family_group_grad(fa, grad, u, LT_GATE, LT_UP), a->dgu, ba->ln2,
                                       P(LT_GATE), d.N, d.C, 2 * d.F);
    family_group_grad_done(fa, grad, u, LT_GATE, LT_UP);
    family_lora_backward(fa, l, ad, ag, LG_GATE_UP, ba->ln2, a->dgu, 2 * d.F, fa->dwork_c);
#undef P
}

static void llama_block_backward(struct family_acts *fa, int l, const float *unit, float *grad, const float *ad,
                                 float *ag, const float *x)
{
    const struct model *m = fa->m;
    struct llama_acts *a = fa->priv;
    const struct llama_block_acts *ba = &a->sets[l % fa->n_sets];
    const struct llama_dims d = llama_dims_of(m, fa->B, fa->T);
    const int u = model_block_unit(l);
    float *dy = fa->dresid_a, *dres2 = fa->dresid_b, *dc = fa->dwork_c;
    const size_t NC = (size_t)d.N * d.C;
#define P(t) family_param(fa, unit, u, t)
#define G(t) family_grad(fa, grad, u, t)
    llama_mlp_backward(fa, l, unit, grad, ad, ag, dy);
    family_copy_act(dres2, dy, NC);
    backend_rmsnorm_backward(dres2, G(LT_POST_NORM), dc, ba->res2, P(LT_POST_NORM), ba->rstd2, a->scratch, d.N, d.C);
    /* attention */
    float *datty = d.Q > d.C ? a->datty : dc; /* (B, T, Q): dc holds C channels */
    backend_matmul_backward_transposed(datty, G(LT_O), dres2, ba->atty, P(LT_O), d.N, d.Q, d.C);
    family_lora_backward(fa, l, ad, ag, LG_O, ba->atty, dres2, d.C, datty);
    const struct llama_layer_attn la = {a->rope_cos, a->rope_sin};
    llama_attention_backward(fa, l, unit, grad, ad, ag, x, datty, dres2, &la);
#undef P
#undef G
}

void llama_norm_forward(struct family_acts *fa, const float *head)
{
    struct llama_acts *a = fa->priv;
    const struct model_config *c = &fa->m->cfg;
    backend_rmsnorm_offset_forward(fa->norm_out, a->rstd_final, fa->final, family_param(fa, head, model_head_unit(fa->m), 0),
                                   c->norm_offset, (float)c->norm_eps, fa->B * fa->T, c->n_embd);
}

void llama_norm_backward(struct family_acts *fa, const float *head, float *grad)
{
    struct llama_acts *a = fa->priv;
    const struct model_config *c = &fa->m->cfg;
    const int hu = model_head_unit(fa->m);
    backend_rmsnorm_offset_backward(fa->dresid_a, family_grad(fa, grad, hu, 0), fa->dwork_c, fa->final,
                                    family_param(fa, head, hu, 0), c->norm_offset, a->rstd_final, a->scratch,
                                    fa->B * fa->T, c->n_embd);
}

const struct family family_llama = {
    .arch = ARCH_LLAMA,
    .plan = llama_plan,
    .init = llama_init,
    .free = llama_free,
    .prepare = llama_prepare,
    .embed_forward = llama_embed_forward,
    .embed_backward = llama_embed_backward,
    .block_forward = llama_block_forward,
    .block_backward = llama_block_backward,
    .norm_forward = llama_norm_forward,
    .norm_backward = llama_norm_backward,
};
