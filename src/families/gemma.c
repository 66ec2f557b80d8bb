/*
 * gemma — Gemma 2 and Gemma 3 text (family.h), Hugging Face
 * Gemma2ForCausalLM and Gemma3ForCausalLM (the language model of
 * Gemma3ForConditionalGeneration too): the Llama block's attention
 * (llama.h: q|k|v, Gemma 3's q_norm and k_norm, rotary, grouped-query
 * attention) with Gemma's differences, decided once at set-up as data:
 *  - every RMSNorm scales by (1 + w), in fp32 (Gemma2RMSNorm); its weights
 *    are stored as w (model_config.norm_offset 1, model.c's zero init);
 *  - four norms per block: input_layernorm before the attention,
 *    post_attention_layernorm on its output before the residual add,
 *    pre_feedforward_layernorm and post_feedforward_layernorm around the MLP;
 *  - GeGLU with the tanh GELU (hidden_activation gelu_pytorch_tanh);
 *  - the token embedding times sqrt(n_embd), that factor rounded to the
 *    activation dtype (transformers casts its normalizer to the hidden
 *    states' dtype); the LM head tied to the unscaled embedding;
 *  - local (sliding-window) and global layers (model_config.window_pattern):
 *    a local layer of Gemma 3 takes the rotary tables of rope_local_theta
 *    without rope_scaling, a global one rope_theta with it;
 *  - final_logit_softcapping, applied by the driver's LM head (family.c).
 * Each layer's rotary tables are chosen here (struct llama_layer_attn); its
 * attention options (the window of the local layers, attn_logit_softcapping,
 * query_pre_attn_scalar^-1/2) are fa->attn[l], from the model config
 * (model.sliding_window and sliding_layers, model.c's set_arch).
 *
 * The activations are Llama's (struct llama_acts, allocated by llama_init
 * inside struct gemma_acts) plus the outputs of o_proj and down_proj and
 * the statistics of the two norms that follow them.
 */
#include <math.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/util.h"
#include "family.h"
#include "llama.h"

struct gemma_block_acts {
    float *ao, *rstd_pa; /* (B, T, C) [A] o_proj's output, (B, T) post_attention_layernorm's statistics */
    float *mo, *rstd_pf; /* (B, T, C) [A] down_proj's output, (B, T) post_feedforward_layernorm's */
};

struct gemma_acts {
    struct llama_acts base;           /* first: llama.c's functions read fa->priv as theirs */
    struct gemma_block_acts *sets;    /* [n_sets] */
    float *dmid;                      /* (B, T, C) [A] the gradient of o_proj's or down_proj's output */
    float *rope_cos_local, *rope_sin_local; /* (max_pos, hs / 2) fp32: the local layers' (the global ones' when the
                                             * bases are the same) */
    struct llama_layer_attn *layers;  /* [n_layer] each layer's rotary tables */
    float embed_scale;                /* sqrt(n_embd) in the activation dtype */
};

/* Whether layer l is local (sliding_window): transformers' layer_types, "sliding_attention" unless (l + 1) is a
 * multiple of the pattern. */
static bool layer_local(const struct model_config *c, int l)
{
    return c->window_pattern > 0 && (l + 1) % c->window_pattern != 0;
}

/* The local layers' rotary base differs from the global ones' (Gemma 3), or the global ones are scaled. */
static bool own_local_tables(const struct model_config *c)
{
    return c->rope_local_theta > 0 &&
           (c->rope_local_theta != c->rope_theta || c->rope_scaling.type != ROPE_SCALING_NONE);
}

static void gemma_plan(const struct model *m, const struct exec_target *t, int B, int T, int max_pos, int n_sets,
                       size_t bytes[BUF_COUNT])
{
    llama_plan(m, t, B, T, max_pos, n_sets, bytes);
    const size_t N = (size_t)B * (size_t)T, NC = N * (size_t)m->cfg.n_embd;
    bytes[BUF_ACTIVATIONS] += (size_t)n_sets * (2 * target_act_bytes(t, NC) + 2 * family_f32_bytes(N));
    bytes[BUF_WORKSPACE] += target_act_bytes(t, NC);
    if (own_local_tables(&m->cfg))
        bytes[BUF_WORKSPACE] += llama_rope_bytes(m, max_pos);
}

static void gemma_init(struct family_acts *fa, const struct exec_target *t, struct arena *dev, struct mem_tracker *mem)
{
    const struct model *m = fa->m;
    const struct model_config *c = &m->cfg;
    struct gemma_acts *g = xcalloc(1, sizeof *g);
    fa->priv = g;
    llama_init(fa, t, dev, mem);
    const size_t N = (size_t)fa->max_B * (size_t)fa->max_T, NC = N * (size_t)c->n_embd;
    const size_t ae = (size_t)dtype_size(t->act);
    g->sets = xcalloc((size_t)fa->n_sets, sizeof *g->sets);
    for (int i = 0; i < fa->n_sets; i++) {
        g->sets[i].ao = arena_alloc(dev, mem, BUF_ACTIVATIONS, NC * ae, 1);
        g->sets[i].rstd_pa = arena_alloc(dev, mem, BUF_ACTIVATIONS, N * sizeof(float), 1);
        g->sets[i].mo = arena_alloc(dev, mem, BUF_ACTIVATIONS, NC * ae, 1);
        g->sets[i].rstd_pf = arena_alloc(dev, mem, BUF_ACTIVATIONS, N * sizeof(float), 1);
    }
    g->dmid = arena_alloc(dev, mem, BUF_WORKSPACE, NC * ae, 1);
    g->rope_cos_local = g->base.rope_cos;
    g->rope_sin_local = g->base.rope_sin;
    if (own_local_tables(c)) /* (two alike where the global ones are longrope's short and long) */
        llama_rope_upload(c, c->rope_local_theta, false, fa->max_pos, dev, mem, &g->rope_cos_local,
                          &g->rope_sin_local);
    g->layers = xcalloc((size_t)c->n_layer, sizeof *g->layers);
    for (int l = 0; l < c->n_layer; l++) {
        const bool local = layer_local(c, l);
        g->layers[l] = (struct llama_layer_attn){local ? g->rope_cos_local : g->base.rope_cos,
                                                 local ? g->rope_sin_local : g->base.rope_sin};
    }
    const float root = (float)sqrt((double)c->n_embd);
    g->embed_scale = t->act == DTYPE_BF16 ? bf16_to_f32(f32_to_bf16(root))
                     : t->act == DTYPE_F16 ? f16_to_f32(f32_to_f16(root))
                                           : root;
}

static void gemma_free(struct family_acts *fa)
{
    struct gemma_acts *g = fa->priv;
    if (g) {
        free(g->sets);
        free(g->layers);
    }
    llama_free(fa);
}

static void gemma_embed_forward(struct family_acts *fa, const float *unit, float *out)
{
    const struct gemma_acts *g = fa->priv;
    llama_embed_forward(fa, unit, out);
    backend_scale_act(out, g->embed_scale, (size_t)fa->B * fa->T * fa->m->cfg.n_embd);
}

/* dout is a->dresid_a, which nothing reads after: scaled in place */
static void gemma_embed_backward(struct family_acts *fa, float *grad, const float *dout)
{
    const struct gemma_acts *g = fa->priv;
    backend_scale_act(fa->dresid_a, g->embed_scale, (size_t)fa->B * fa->T * fa->m->cfg.n_embd);
    llama_embed_backward(fa, grad, dout);
}

static void zero_act(float *x, size_t n) { backend_zero(x, n * (size_t)dtype_size(backend_act_dtype()) / sizeof(float)); }

static void gemma_block_forward(struct family_acts *fa, int l, const float *unit, const float *ad, const float *x,
                                float *y)
{
    const struct model *m = fa->m;
    struct gemma_acts *g = fa->priv;
    struct llama_block_acts *ba = &g->base.sets[l % fa->n_sets];
    struct gemma_block_acts *gb = &g->sets[l % fa->n_sets];
    const struct llama_dims d = llama_dims_of(m, fa->B, fa->T);
    const int u = model_block_unit(l);
    const float eps = (float)m->cfg.norm_eps, off = m->cfg.norm_offset;
    const size_t NC = (size_t)d.N * d.C;
#define P(t) family_param(fa, unit, u, t)
    llama_attention_forward(fa, l, unit, ad, x, &g->layers[l]);
    backend_matmul_forward_transposed(gb->ao, ba->atty, P(LT_O), d.N, d.Q, d.C);
    family_lora_forward(fa, l, ad, LG_O, ba->atty, gb->ao, d.C);
    backend_rmsnorm_offset_forward(ba->res2, gb->rstd_pa, gb->ao, P(LT_POST_NORM), off, eps, d.N, d.C);
    backend_add_act(ba->res2, ba->res2, x, NC);
    /* MLP */
    backend_rmsnorm_offset_forward(ba->ln2, ba->rstd2, ba->res2, P(LT_PRE_FF_NORM), off, eps, d.N, d.C);
    backend_matmul_forward_transposed(ba->gu, ba->ln2, P(LT_GATE), d.N, d.C, 2 * d.F);
    family_lora_forward(fa, l, ad, LG_GATE_UP, ba->ln2, ba->gu, 2 * d.F);
    g->base.gate_forward(ba->h, ba->gu, d.N, d.F);
    backend_matmul_forward_transposed(gb->mo, ba->h, P(LT_DOWN), d.N, d.F, d.C);
    family_lora_forward(fa, l, ad, LG_DOWN, ba->h, gb->mo, d.C);
    backend_rmsnorm_offset_forward(y, gb->rstd_pf, gb->mo, P(LT_POST_FF_NORM), off, eps, d.N, d.C);
    backend_add_act(y, y, ba->res2, NC);
#undef P
}

static void gemma_block_backward(struct family_acts *fa, int l, const float *unit, float *grad, const float *ad,
                                 float *ag, const float *x)
{
    const struct model *m = fa->m;
    struct gemma_acts *g = fa->priv;
    struct llama_acts *a = &g->base;
    const struct llama_block_acts *ba = &a->sets[l % fa->n_sets];
    const struct gemma_block_acts *gb = &g->sets[l % fa->n_sets];
    const struct llama_dims d = llama_dims_of(m, fa->B, fa->T);
    const int u = model_block_unit(l);
    const float off = m->cfg.norm_offset;
    float *dy = fa->dresid_a, *dres2 = fa->dresid_b, *dc = fa->dwork_c, *dmid = g->dmid;
    const size_t NC = (size_t)d.N * d.C;
#define P(t) family_param(fa, unit, u, t)
#define G(t) family_grad(fa, grad, u, t)
    /* MLP: y = res2 + post_ff_norm(down(geglu(gate|up(pre_ff_norm(res2))))) */
    zero_act(dmid, NC); /* the norm's backward adds into its input gradient */
    backend_rmsnorm_offset_backward(dmid, G(LT_POST_FF_NORM), dy, gb->mo, P(LT_POST_FF_NORM), off, gb->rstd_pf,
                                    a->scratch, d.N, d.C);
    llama_mlp_backward(fa, l, unit, grad, ad, ag, dmid);
    family_copy_act(dres2, dy, NC);
    backend_rmsnorm_offset_backward(dres2, G(LT_PRE_FF_NORM), dc, ba->res2, P(LT_PRE_FF_NORM), off, ba->rstd2,
                                    a->scratch, d.N, d.C);
    /* attention: res2 = x + post_attention_norm(o(attention)) */
    zero_act(dmid, NC);
    backend_rmsnorm_offset_backward(dmid, G(LT_POST_NORM), dres2, gb->ao, P(LT_POST_NORM), off, gb->rstd_pa,
                                    a->scratch, d.N, d.C);
    float *datty = d.Q > d.C ? a->datty : dc; /* (B, T, Q): dc holds C channels */
    backend_matmul_backward_transposed(datty, G(LT_O), dmid, ba->atty, P(LT_O), d.N, d.Q, d.C);
    family_lora_backward(fa, l, ad, ag, LG_O, ba->atty, dmid, d.C, datty);
    llama_attention_backward(fa, l, unit, grad, ad, ag, x, datty, dres2, &g->layers[l]);
#undef P
#undef G
}

const struct family family_gemma = {
    .arch = ARCH_GEMMA,
    .plan = gemma_plan,
    .init = gemma_init,
    .free = gemma_free,
    .prepare = llama_prepare,
    .embed_forward = gemma_embed_forward,
    .embed_backward = gemma_embed_backward,
    .block_forward = gemma_block_forward,
    .block_backward = gemma_block_backward,
    .norm_forward = llama_norm_forward,
    .norm_backward = llama_norm_backward,
};
