#include "gpt2.h"

#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/util.h"

/* Bytes of one set of block activations (struct block_acts). */
static size_t block_set_bytes(const struct exec_target *t, size_t B, size_t T, size_t C, size_t NH)
{
    const size_t BT = B * T;
    return target_act_bytes(t, BT * C) + 2 * family_f32_bytes(BT) + target_act_bytes(t, BT * 3 * C) +
           arena_round(target_attention_saved(t, (int)B, (int)T, (int)NH)) + 3 * target_act_bytes(t, BT * C) +
           2 * family_f32_bytes(BT) + 2 * target_act_bytes(t, BT * 4 * C);
}

static void gpt2_plan(const struct model *m, const struct exec_target *t, int B, int T, int max_pos, int n_sets,
                      size_t bytes[BUF_COUNT])
{
    const size_t C = (size_t)m->cfg.n_embd, BT = (size_t)B * (size_t)T;
    bytes[BUF_ACTIVATIONS] += (size_t)n_sets * block_set_bytes(t, (size_t)B, (size_t)T, C, (size_t)m->cfg.n_head);
    bytes[BUF_LOGITS] += 2 * family_f32_bytes(BT);
    bytes[BUF_WORKSPACE] += target_act_bytes(t, BT * 3 * C) + target_act_bytes(t, BT * 4 * C) +
                            family_f32_bytes(family_scratch_floats(m, t, T));
}

static void gpt2_init(struct family_acts *fa, const struct exec_target *t, struct arena *dev, struct mem_tracker *mem)
{
    const struct model *m = fa->m;
    const size_t C = (size_t)m->cfg.n_embd, BT = (size_t)fa->max_B * (size_t)fa->max_T;
    const size_t ae = (size_t)dtype_size(t->act);
    struct gpt2_acts *a = xcalloc(1, sizeof *a);
    fa->priv = a;
#define ALLOC(cls, n) arena_alloc(dev, mem, cls, (n) * sizeof(float), 1)
#define ALLOC_ACT(cls, n) arena_alloc(dev, mem, cls, (n) * ae, 1)
    a->sets = xcalloc((size_t)fa->n_sets, sizeof *a->sets);
    for (int i = 0; i < fa->n_sets; i++) {
        struct block_acts *ba = &a->sets[i];
        ba->ln1 = ALLOC_ACT(BUF_ACTIVATIONS, BT * C);
        ba->ln1_mean = ALLOC(BUF_ACTIVATIONS, BT);
        ba->ln1_rstd = ALLOC(BUF_ACTIVATIONS, BT);
        ba->qkv = ALLOC_ACT(BUF_ACTIVATIONS, BT * 3 * C);
        ba->att = arena_alloc(dev, mem, BUF_ACTIVATIONS,
                              target_attention_saved(t, fa->max_B, fa->max_T, m->cfg.n_head), 1);
        ba->atty = ALLOC_ACT(BUF_ACTIVATIONS, BT * C);
        ba->res2 = ALLOC_ACT(BUF_ACTIVATIONS, BT * C);
        ba->ln2 = ALLOC_ACT(BUF_ACTIVATIONS, BT * C);
        ba->ln2_mean = ALLOC(BUF_ACTIVATIONS, BT);
        ba->ln2_rstd = ALLOC(BUF_ACTIVATIONS, BT);
        ba->fch = ALLOC_ACT(BUF_ACTIVATIONS, BT * 4 * C);
        ba->fch_gelu = ALLOC_ACT(BUF_ACTIVATIONS, BT * 4 * C);
    }
    a->lnf_mean = ALLOC(BUF_LOGITS, BT);
    a->lnf_rstd = ALLOC(BUF_LOGITS, BT);
    a->dwork_3c = ALLOC_ACT(BUF_WORKSPACE, BT * 3 * C);
    a->dwork_4c = ALLOC_ACT(BUF_WORKSPACE, BT * 4 * C);
    a->scratch = ALLOC(BUF_WORKSPACE, family_scratch_floats(m, t, fa->max_T));
#undef ALLOC
#undef ALLOC_ACT
}

static void gpt2_free(struct family_acts *fa)
{
    struct gpt2_acts *a = fa->priv;
    if (a)
        free(a->sets);
    free(a);
    fa->priv = NULL;
}

/* Element i of a tensor of elements of es bytes. */
static const float *elem_at(const float *p, size_t i, size_t es) { return (const float *)((const char *)p + i * es); }

/* Pointers to one block's tensors inside its flat unit buffer. */
struct block_params {
    const float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *attproj_w, *attproj_b;
    const float *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
};
struct block_grads {
    float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *attproj_w, *attproj_b;
    float *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
};

/* es: bytes per element of base (the parameters are [A], the gradients fp32). */
#define BLOCK_VIEW(out, base, ud, es)                                           \
    do {                                                                       \
        const struct tensor_desc *td_ = (ud)->tensors;                         \
        (out).ln1_w = (void *)elem_at((base), td_[BT_LN1_W].offset, (es));     \
        (out).ln1_b = (void *)elem_at((base), td_[BT_LN1_B].offset, (es));     \
        (out).qkv_w = (void *)elem_at((base), td_[BT_QKV_W].offset, (es));     \
        (out).qkv_b = (void *)elem_at((base), td_[BT_QKV_B].offset, (es));     \
        (out).attproj_w = (void *)elem_at((base), td_[BT_ATTPROJ_W].offset, (es)); \
        (out).attproj_b = (void *)elem_at((base), td_[BT_ATTPROJ_B].offset, (es)); \
        (out).ln2_w = (void *)elem_at((base), td_[BT_LN2_W].offset, (es));     \
        (out).ln2_b = (void *)elem_at((base), td_[BT_LN2_B].offset, (es));     \
        (out).fc_w = (void *)elem_at((base), td_[BT_FC_W].offset, (es));       \
        (out).fc_b = (void *)elem_at((base), td_[BT_FC_B].offset, (es));       \
        (out).fcproj_w = (void *)elem_at((base), td_[BT_FCPROJ_W].offset, (es)); \
        (out).fcproj_b = (void *)elem_at((base), td_[BT_FCPROJ_B].offset, (es)); \
    } while (0)

/* y [A] = x [A] + inp [A] @ w + b: a projection added into the residual
 * stream, in place in y (no buffer for the projection alone). */
static void project_add(float *y, const float *x, const float *inp, const float *w, const float *b, int N, int C_in,
                        int C)
{
    backend_matmul_forward(y, inp, w, b, N, C_in, C);
    backend_add_act(y, y, x, (size_t)N * C);
}

/* Linear layers of a block in model_block_linears' order (LoRA's k), each its own group. */
enum { GL_ATTN, GL_ATTN_PROJ, GL_FC, GL_FC_PROJ };

/* ad: the block's adapters (LoRA), or NULL. */
static void block_forward(struct family_acts *fa, int l, const struct block_params *p, const float *ad,
                          struct block_acts *ba, const float *x, float *y)
{
    const struct model *m = fa->m;
    struct gpt2_acts *a = fa->priv;
    const int C = m->cfg.n_embd, NH = m->cfg.n_head, B = fa->B, T = fa->T, N = B * T;
    backend_layernorm_forward(ba->ln1, ba->ln1_mean, ba->ln1_rstd, x, p->ln1_w, p->ln1_b, N, C);
    backend_matmul_forward(ba->qkv, ba->ln1, p->qkv_w, p->qkv_b, N, C, 3 * C);
    family_lora_forward(fa, l, ad, GL_ATTN, ba->ln1, ba->qkv, 3 * C);
    if (!family_attention_kv(fa, l, ba->atty, ba->qkv, NH, NH, C / NH))
        backend_attention_forward(ba->atty, ba->att, ba->qkv, a->scratch, fa->dev_positions, B, T, C, NH);
    project_add(ba->res2, x, ba->atty, p->attproj_w, p->attproj_b, N, C, C);
    family_lora_forward(fa, l, ad, GL_ATTN_PROJ, ba->atty, ba->res2, C);
    backend_layernorm_forward(ba->ln2, ba->ln2_mean, ba->ln2_rstd, ba->res2, p->ln2_w, p->ln2_b, N, C);
    if (family_lora_adapts(fa, l, GL_FC) && ad) { /* the adapter goes in before the GELU */
        backend_matmul_forward(ba->fch, ba->ln2, p->fc_w, p->fc_b, N, C, 4 * C);
        family_lora_forward(fa, l, ad, GL_FC, ba->ln2, ba->fch, 4 * C);
        backend_gelu_forward(ba->fch_gelu, ba->fch, (size_t)N * 4 * C);
    } else {
        backend_matmul_forward_gelu(ba->fch, ba->fch_gelu, ba->ln2, p->fc_w, p->fc_b, N, C, 4 * C);
    }
    project_add(y, ba->res2, ba->fch_gelu, p->fcproj_w, p->fcproj_b, N, 4 * C, C);
    family_lora_forward(fa, l, ad, GL_FC_PROJ, ba->fch_gelu, y, C);
}

/* dresid holds dL/dy on entry and dL/dx on return. */
static void block_backward(struct family_acts *fa, int l, const struct block_params *p, struct block_grads *g,
                           const float *ad, float *ag, const struct block_acts *ba, const float *x)
{
    const struct model *m = fa->m;
    const int C = m->cfg.n_embd, NH = m->cfg.n_head, B = fa->B, T = fa->T, N = B * T;
    const size_t NC = (size_t)N * C;
    struct gpt2_acts *a = fa->priv;
    float *dy = fa->dresid_a, *dres2 = fa->dresid_b, *dwork_c = fa->dwork_c;
    /* MLP */
    if (family_lora_adapts(fa, l, GL_FC_PROJ) && ad) { /* the adapter's input gradient goes in before the GELU's */
        backend_matmul_backward(a->dwork_4c, g->fcproj_w, g->fcproj_b, dy, ba->fch_gelu, p->fcproj_w, N, 4 * C, C);
        family_lora_backward(fa, l, ad, ag, GL_FC_PROJ, ba->fch_gelu, dy, C, a->dwork_4c);
        backend_gelu_backward(a->dwork_4c, ba->fch, a->dwork_4c, (size_t)N * 4 * C);
    } else {
        backend_matmul_backward_gelu(a->dwork_4c, g->fcproj_w, g->fcproj_b, dy, ba->fch_gelu, p->fcproj_w, ba->fch, N,
                                     4 * C, C);
    }
    backend_matmul_backward(dwork_c, g->fc_w, g->fc_b, a->dwork_4c, ba->ln2, p->fc_w, N, C, 4 * C);
    family_lora_backward(fa, l, ad, ag, GL_FC, ba->ln2, a->dwork_4c, 4 * C, dwork_c);
    family_copy_act(dres2, dy, NC);
    backend_layernorm_backward(dres2, g->ln2_w, g->ln2_b, dwork_c, ba->res2, p->ln2_w, ba->ln2_mean,
                               ba->ln2_rstd, a->scratch, N, C);
    /* attention */
    backend_matmul_backward(dwork_c, g->attproj_w, g->attproj_b, dres2, ba->atty, p->attproj_w, N,
                            C, C);
    family_lora_backward(fa, l, ad, ag, GL_ATTN_PROJ, ba->atty, dres2, C, dwork_c);
    backend_attention_backward(a->dwork_3c, dwork_c, ba->qkv, ba->att, ba->atty, a->scratch, fa->dev_positions, B, T,
                               C, NH);
    backend_matmul_backward(dwork_c, g->qkv_w, g->qkv_b, a->dwork_3c, ba->ln1, p->qkv_w, N, C, 3 * C);
    family_lora_backward(fa, l, ad, ag, GL_ATTN, ba->ln1, a->dwork_3c, 3 * C, dwork_c);
    family_copy_act(dy, dres2, NC);
    backend_layernorm_backward(dy, g->ln1_w, g->ln1_b, dwork_c, x, p->ln1_w, ba->ln1_mean, ba->ln1_rstd,
                               a->scratch, N, C);
}

static void gpt2_embed_forward(struct family_acts *fa, const float *unit, float *out)
{
    backend_embedding_forward(out, fa->dev_inputs, family_param(fa, unit, 0, ET_WTE), family_param(fa, unit, 0, ET_WPE),
                              fa->dev_positions, fa->B, fa->T, fa->m->cfg.n_embd);
}

static void gpt2_embed_backward(struct family_acts *fa, float *grad, const float *dout)
{
    backend_embedding_backward(family_grad(fa, grad, 0, ET_WTE), family_grad(fa, grad, 0, ET_WPE), dout,
                               fa->dev_inputs, fa->dev_positions, fa->B, fa->T, fa->m->cfg.n_embd);
}

static void gpt2_block_forward(struct family_acts *fa, int l, const float *unit, const float *ad, const float *x,
                               float *y)
{
    const struct model *m = fa->m;
    struct gpt2_acts *a = fa->priv;
    struct block_params p;
    BLOCK_VIEW(p, unit, &m->units[model_block_unit(l)], (size_t)dtype_size(backend_act_dtype()));
    block_forward(fa, l, &p, ad, &a->sets[l % fa->n_sets], x, y);
}

static void gpt2_block_backward(struct family_acts *fa, int l, const float *unit, float *grad, const float *ad,
                                float *ag, const float *x)
{
    const struct model *m = fa->m;
    struct gpt2_acts *a = fa->priv;
    const int u = model_block_unit(l);
    struct block_params p;
    BLOCK_VIEW(p, unit, &m->units[u], (size_t)dtype_size(backend_act_dtype()));
    /* NULL for a frozen unit or tensor: the kernels take NULL weight gradients as "input gradient only" */
    float *gv[BT_COUNT];
    for (int t = 0; t < BT_COUNT; t++)
        gv[t] = family_grad(fa, grad, u, t);
    struct block_grads g = {gv[BT_LN1_W], gv[BT_LN1_B], gv[BT_QKV_W],  gv[BT_QKV_B],  gv[BT_ATTPROJ_W], gv[BT_ATTPROJ_B],
                            gv[BT_LN2_W], gv[BT_LN2_B], gv[BT_FC_W], gv[BT_FC_B], gv[BT_FCPROJ_W], gv[BT_FCPROJ_B]};
    block_backward(fa, l, &p, &g, ad, ag, &a->sets[l % fa->n_sets], x);
}

static void gpt2_norm_forward(struct family_acts *fa, const float *head)
{
    struct gpt2_acts *a = fa->priv;
    const int hu = model_head_unit(fa->m);
    backend_layernorm_forward(fa->norm_out, a->lnf_mean, a->lnf_rstd, fa->final, family_param(fa, head, hu, HT_LNF_W),
                              family_param(fa, head, hu, HT_LNF_B), fa->B * fa->T, fa->m->cfg.n_embd);
}

static void gpt2_norm_backward(struct family_acts *fa, const float *head, float *grad)
{
    struct gpt2_acts *a = fa->priv;
    const int hu = model_head_unit(fa->m);
    backend_layernorm_backward(fa->dresid_a, family_grad(fa, grad, hu, HT_LNF_W), family_grad(fa, grad, hu, HT_LNF_B),
                               fa->dwork_c, fa->final, family_param(fa, head, hu, HT_LNF_W), a->lnf_mean,
                               a->lnf_rstd, a->scratch, fa->B * fa->T, fa->m->cfg.n_embd);
}

const struct family family_gpt2 = {
    .arch = ARCH_GPT2,
    .plan = gpt2_plan,
    .init = gpt2_init,
    .free = gpt2_free,
    .embed_forward = gpt2_embed_forward,
    .embed_backward = gpt2_embed_backward,
    .block_forward = gpt2_block_forward,
    .block_backward = gpt2_block_backward,
    .norm_forward = gpt2_norm_forward,
    .norm_backward = gpt2_norm_backward,
};
