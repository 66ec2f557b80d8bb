#include "gpt2.h"

#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "plan.h"
#include "util.h"

static size_t f32(size_t n) { return arena_round(n * sizeof(float)); }

/* Bytes of n elements of the activation dtype (backend.h [A]). */
static size_t act(size_t n) { return arena_round(n * (size_t)dtype_size(plan_act_dtype())); }

static int act_is_half(void) { return plan_act_dtype() != DTYPE_F32; }

/* Bytes of one [A] element now (the running backend's). */
static size_t act_size_now(void) { return (size_t)dtype_size(backend_act_dtype()); }

static size_t scratch_floats(const struct model *m, int T)
{
    size_t att = plan_attention_scratch(T, m->cfg.n_head), ln = plan_layernorm_scratch(m->cfg.n_embd);
    return att > ln ? att : ln;
}

/* The math library's workspace (plan_library_workspace), 256-byte aligned
 * as cuBLAS requires inside the 64-byte-aligned arena. */
static size_t library_workspace_bytes(void) { return plan_library_arena_bytes(plan_library_workspace()); }

static int n_segments(int L, int interval) { return (L + interval - 1) / interval; }

/* Bytes of one set of block activations (struct block_acts). */
static size_t block_set_bytes(size_t BT, size_t C, size_t B, size_t NH, size_t T)
{
    return act(BT * C) + 2 * f32(BT) + act(BT * 3 * C) + arena_round(plan_attention_saved((int)B, (int)T, (int)NH)) +
           act(BT * C) + act(BT * C) +
           act(BT * C) + 2 * f32(BT) + 2 * act(BT * 4 * C);
}

void gpt2_plan(const struct model *m, int B, int T, int interval, size_t bytes[BUF_COUNT])
{
    const size_t L = (size_t)m->cfg.n_layer, C = (size_t)m->cfg.n_embd, NH = (size_t)m->cfg.n_head;
    const size_t BT = (size_t)B * (size_t)T, Vp = (size_t)m->cfg.padded_vocab;
    const size_t set = block_set_bytes(BT, C, (size_t)B, NH, (size_t)T);
    if (interval > 0) {
        bytes[BUF_ACT_CKPT] += (size_t)n_segments((int)L, interval) * act(BT * C);
        bytes[BUF_ACTIVATIONS] += (size_t)interval * set + ((size_t)interval + 1) * act(BT * C) + act(BT * C);
    } else {
        bytes[BUF_ACT_CKPT] += L * act(BT * C);
        bytes[BUF_ACTIVATIONS] += L * set + act(BT * C);
    }
    bytes[BUF_LOGITS] += act(BT * C) + 2 * f32(BT) + act(BT * Vp) + f32(BT);
    bytes[BUF_WORKSPACE] += 2 * act(BT * C) + act(BT * C) + act(BT * 3 * C) + act(BT * 4 * C) +
                            f32(scratch_floats(m, T)) + 2 * arena_round(BT * sizeof(int32_t)) +
                            library_workspace_bytes();
    if (plan_device())
        bytes[BUF_STAGING] += 2 * arena_round(BT * sizeof(int32_t)) + f32(BT);
}

void gpt2_acts_init(struct gpt2_acts *a, const struct model *m, int B, int T, int interval,
                    enum mem_space ckpt_space, struct arena arenas[SPACE_COUNT], struct mem_tracker *mem)
{
    const size_t L = (size_t)m->cfg.n_layer, C = (size_t)m->cfg.n_embd, NH = (size_t)m->cfg.n_head;
    const size_t BT = (size_t)B * (size_t)T, Vp = (size_t)m->cfg.padded_vocab;
    struct arena *dev = &arenas[SPACE_DEVICE];
    memset(a, 0, sizeof *a);
    a->B = B;
    a->T = T;
    a->interval = interval;
    a->n_sets = interval > 0 ? interval : (int)L;
    /* the same device facts as gpt2_plan, so the allocation is the plan */
    const size_t ae = (size_t)dtype_size(plan_act_dtype());
    a->half = act_is_half();
#define ALLOC(cls, n) arena_alloc(dev, mem, cls, (n) * sizeof(float), 1)
#define ALLOC_ACT(cls, n) arena_alloc(dev, mem, cls, (n) * ae, 1)
    /* Kept inputs first: without checkpointing they are every block's input. */
    if (interval > 0) {
        int segs = n_segments((int)L, interval);
        a->ckpt = xcalloc((size_t)segs, sizeof *a->ckpt);
        for (int s = 0; s < segs; s++)
            a->ckpt[s] = arena_alloc(&arenas[ckpt_space], mem, BUF_ACT_CKPT, BT * C * ae, 1);
        a->work = xcalloc((size_t)interval + 1, sizeof *a->work);
    } else {
        a->resid = xcalloc(L + 1, sizeof *a->resid);
        for (size_t l = 0; l < L; l++)
            a->resid[l] = ALLOC_ACT(BUF_ACT_CKPT, BT * C);
    }
    a->sets = xcalloc((size_t)a->n_sets, sizeof *a->sets);
    for (int i = 0; i < a->n_sets; i++) {
        struct block_acts *ba = &a->sets[i];
        ba->ln1 = ALLOC_ACT(BUF_ACTIVATIONS, BT * C);
        ba->ln1_mean = ALLOC(BUF_ACTIVATIONS, BT);
        ba->ln1_rstd = ALLOC(BUF_ACTIVATIONS, BT);
        ba->qkv = ALLOC_ACT(BUF_ACTIVATIONS, BT * 3 * C);
        ba->att = arena_alloc(dev, mem, BUF_ACTIVATIONS, plan_attention_saved(B, T, (int)NH), 1);
        ba->atty = ALLOC_ACT(BUF_ACTIVATIONS, BT * C);
        ba->res2 = ALLOC_ACT(BUF_ACTIVATIONS, BT * C);
        ba->ln2 = ALLOC_ACT(BUF_ACTIVATIONS, BT * C);
        ba->ln2_mean = ALLOC(BUF_ACTIVATIONS, BT);
        ba->ln2_rstd = ALLOC(BUF_ACTIVATIONS, BT);
        ba->fch = ALLOC_ACT(BUF_ACTIVATIONS, BT * 4 * C);
        ba->fch_gelu = ALLOC_ACT(BUF_ACTIVATIONS, BT * 4 * C);
    }
    for (int i = 0; interval > 0 && i <= interval; i++)
        a->work[i] = ALLOC_ACT(BUF_ACTIVATIONS, BT * C);
    a->final = ALLOC_ACT(BUF_ACTIVATIONS, BT * C);
    if (a->resid)
        a->resid[L] = a->final;
    a->seg_params = xcalloc((size_t)a->n_sets, sizeof *a->seg_params);
    a->lnf = ALLOC_ACT(BUF_LOGITS, BT * C);
    a->lnf_mean = ALLOC(BUF_LOGITS, BT);
    a->lnf_rstd = ALLOC(BUF_LOGITS, BT);
    a->logits = ALLOC_ACT(BUF_LOGITS, BT * Vp);
    a->losses = ALLOC(BUF_LOGITS, BT);
    a->dresid_a = ALLOC_ACT(BUF_WORKSPACE, BT * C);
    a->dresid_b = ALLOC_ACT(BUF_WORKSPACE, BT * C);
    a->dwork_c = ALLOC_ACT(BUF_WORKSPACE, BT * C);
    a->dwork_3c = ALLOC_ACT(BUF_WORKSPACE, BT * 3 * C);
    a->dwork_4c = ALLOC_ACT(BUF_WORKSPACE, BT * 4 * C);
    a->scratch = ALLOC(BUF_WORKSPACE, scratch_floats(m, T));
#undef ALLOC
#undef ALLOC_ACT
    a->dev_inputs = arena_alloc(dev, mem, BUF_WORKSPACE, BT * sizeof(int32_t), 1);
    a->dev_targets = arena_alloc(dev, mem, BUF_WORKSPACE, BT * sizeof(int32_t), 1);
    const size_t lib = plan_library_workspace();
    if (lib) {
        uintptr_t at = (uintptr_t)arena_alloc(dev, mem, BUF_WORKSPACE, library_workspace_bytes(), 1);
        backend_set_library_workspace((void *)((at + PLAN_LIBRARY_ALIGN - 1) / PLAN_LIBRARY_ALIGN * PLAN_LIBRARY_ALIGN),
                                      lib);
    }
    if (plan_device()) {
        struct arena *pinned = &arenas[SPACE_PINNED];
        a->inputs = arena_alloc(pinned, mem, BUF_STAGING, BT * sizeof(int32_t), 1);
        a->targets = arena_alloc(pinned, mem, BUF_STAGING, BT * sizeof(int32_t), 1);
        a->host_losses = arena_alloc(pinned, mem, BUF_STAGING, BT * sizeof(float), 1);
    } else {
        a->inputs = a->dev_inputs;
        a->targets = a->dev_targets;
        a->host_losses = a->losses;
    }
}

/* Element i of a tensor of elements of es bytes (an [A] tensor, or a unit's
 * gathered parameters, which are [A] too). */
static const float *elem_at(const float *p, size_t i, size_t es) { return (const float *)((const char *)p + i * es); }

static const float *act_at(const float *p, size_t i) { return elem_at(p, i, (size_t)dtype_size(backend_act_dtype())); }

/* Element i of a unit gradient buffer ([G] in backend.h: fp32, or the
 * parameter dtype in a device's half_grad_buffers). */
static float *grad_at(float *g, size_t i) { return (float *)((char *)g + i * (size_t)dtype_size(backend_grad_dtype())); }

/* Copies n [A] elements from the device into fp32 host memory. */
static void read_act(float *out, const float *p, size_t n)
{
    const enum dtype dt = backend_act_dtype();
    if (dt == DTYPE_F32) {
        backend_copy(out, p, n * sizeof *out);
        return;
    }
    void *tmp = xcalloc(n, (size_t)dtype_size(dt));
    backend_copy(tmp, p, n * (size_t)dtype_size(dt));
    dtype_convert(out, DTYPE_F32, tmp, dt, n);
    free(tmp);
}

void gpt2_read_logits(const struct gpt2_acts *a, const struct model *m, int row, float *out)
{
    const size_t Vp = (size_t)m->cfg.padded_vocab;
    read_act(out, act_at(a->logits, (size_t)row * Vp), Vp);
}

/* Moves the caller's token ids to the kernels' buffers (nothing to do on the CPU). */
static void upload_tokens(struct gpt2_acts *a, int N, int with_targets)
{
    if (a->dev_inputs == a->inputs)
        return;
    backend_copy(a->dev_inputs, a->inputs, (size_t)N * sizeof(int32_t));
    if (with_targets)
        backend_copy(a->dev_targets, a->targets, (size_t)N * sizeof(int32_t));
}

void gpt2_acts_free(struct gpt2_acts *a)
{
    free(a->sets);
    free(a->resid);
    free(a->ckpt);
    free(a->work);
    free(a->seg_params);
    memset(a, 0, sizeof *a);
}

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


static void block_forward(const struct model *m, const struct block_params *p, struct block_acts *ba,
                          struct gpt2_acts *a, const float *x, float *y, int B, int T)
{
    const int C = m->cfg.n_embd, NH = m->cfg.n_head, N = B * T;
    backend_layernorm_forward(ba->ln1, ba->ln1_mean, ba->ln1_rstd, x, p->ln1_w, p->ln1_b, N, C);
    backend_matmul_forward(ba->qkv, ba->ln1, p->qkv_w, p->qkv_b, N, C, 3 * C);
    backend_attention_forward(ba->atty, ba->att, ba->qkv, a->scratch, B, T, C, NH);
    project_add(ba->res2, x, ba->atty, p->attproj_w, p->attproj_b, N, C, C);
    backend_layernorm_forward(ba->ln2, ba->ln2_mean, ba->ln2_rstd, ba->res2, p->ln2_w, p->ln2_b, N, C);
    backend_matmul_forward_gelu(ba->fch, ba->fch_gelu, ba->ln2, p->fc_w, p->fc_b, N, C, 4 * C);
    project_add(y, ba->res2, ba->fch_gelu, p->fcproj_w, p->fcproj_b, N, 4 * C, C);
}

/* dresid holds dL/dy on entry and dL/dx on return. */
static void block_backward(const struct model *m, const struct block_params *p, struct block_grads *g,
                           const struct block_acts *ba, const float *x, struct gpt2_acts *a, int B, int T)
{
    const int C = m->cfg.n_embd, NH = m->cfg.n_head, N = B * T;
    const size_t NC = (size_t)N * C;
    float *dy = a->dresid_a, *dres2 = a->dresid_b;
    /* MLP */
    backend_matmul_backward_gelu(a->dwork_4c, g->fcproj_w, g->fcproj_b, dy, ba->fch_gelu, p->fcproj_w,
                                 ba->fch, N, 4 * C, C);
    backend_matmul_backward(a->dwork_c, g->fc_w, g->fc_b, a->dwork_4c, ba->ln2, p->fc_w, N, C, 4 * C);
    backend_copy(dres2, dy, NC * act_size_now());
    backend_layernorm_backward(dres2, g->ln2_w, g->ln2_b, a->dwork_c, ba->res2, p->ln2_w, ba->ln2_mean,
                               ba->ln2_rstd, a->scratch, N, C);
    /* attention */
    backend_matmul_backward(a->dwork_c, g->attproj_w, g->attproj_b, dres2, ba->atty, p->attproj_w, N,
                            C, C);
    backend_attention_backward(a->dwork_3c, a->dwork_c, ba->qkv, ba->att, ba->atty, a->scratch, B, T, C, NH);
    backend_matmul_backward(a->dwork_c, g->qkv_w, g->qkv_b, a->dwork_3c, ba->ln1, p->qkv_w, N, C, 3 * C);
    backend_copy(dy, dres2, NC * act_size_now());
    backend_layernorm_backward(dy, g->ln1_w, g->ln1_b, a->dwork_c, x, p->ln1_w, ba->ln1_mean, ba->ln1_rstd,
                               a->scratch, N, C);
}

/* Where block l reads its input and writes its output in the forward. */
static float *block_in(const struct gpt2_acts *a, int l)
{
    return a->interval ? a->work[l % a->interval] : a->resid[l];
}

static float *block_out(const struct gpt2_acts *a, const struct model *m, int l)
{
    if (l == m->cfg.n_layer - 1)
        return a->final;
    return a->interval ? a->work[l % a->interval + 1] : a->resid[l + 1];
}

static struct block_acts *block_set(struct gpt2_acts *a, int l) { return &a->sets[l % a->n_sets]; }

static void add_event(struct zero_pass *p, enum pass_event_kind kind, int unit)
{
    p->events[p->n_events].kind = kind;
    p->events[p->n_events].unit = unit;
    p->n_events++;
}

static void forward_events(const struct model *m, struct zero_pass *p)
{
    add_event(p, PASS_ACQUIRE, 0);
    add_event(p, PASS_RELEASE, 0);
    for (int l = 0; l < m->cfg.n_layer; l++) {
        add_event(p, PASS_ACQUIRE, model_block_unit(l));
        add_event(p, PASS_RELEASE, model_block_unit(l));
    }
    add_event(p, PASS_ACQUIRE, model_head_unit(m));
    add_event(p, PASS_RELEASE, model_head_unit(m));
    add_event(p, PASS_ACQUIRE, 0);
}

void gpt2_build_passes(const struct model *m, int interval, struct zero_pass *train, struct zero_pass *eval)
{
    const int L = m->cfg.n_layer, head = model_head_unit(m);
    int max_events = 8 * (L + 3);
    train->name = "train";
    eval->name = "eval";
    train->n_events = eval->n_events = 0;
    train->events = xcalloc((size_t)max_events, sizeof *train->events);
    eval->events = xcalloc((size_t)max_events, sizeof *eval->events);
    forward_events(m, eval);
    add_event(eval, PASS_RELEASE, 0);
    forward_events(m, train);
    add_event(train, PASS_GRAD_OPEN, 0);
    add_event(train, PASS_RELEASE, 0);
    add_event(train, PASS_ACQUIRE, head);
    add_event(train, PASS_GRAD_OPEN, head);
    add_event(train, PASS_GRAD_DONE, head);
    add_event(train, PASS_RELEASE, head);
    const int k = interval > 0 ? interval : 1;
    for (int s = n_segments(L, k) - 1; s >= 0; s--) {
        int l0 = s * k, l1 = l0 + k < L ? l0 + k : L;
        for (int l = l0; l < l1; l++)
            add_event(train, PASS_ACQUIRE, model_block_unit(l));
        for (int l = l1 - 1; l >= l0; l--) {
            add_event(train, PASS_GRAD_OPEN, model_block_unit(l));
            add_event(train, PASS_GRAD_DONE, model_block_unit(l));
            add_event(train, PASS_RELEASE, model_block_unit(l));
        }
    }
    add_event(train, PASS_GRAD_DONE, 0);
}

void gpt2_free_passes(struct zero_pass *train, struct zero_pass *eval)
{
    free(train->events);
    free(eval->events);
    train->events = eval->events = NULL;
}

float gpt2_forward(struct zero *z, struct gpt2_acts *a, int B, int T, int with_targets, enum gpt2_mode mode)
{
    const struct model *m = z->model;
    const int L = m->cfg.n_layer, C = m->cfg.n_embd, V = m->cfg.vocab_size, Vp = m->cfg.padded_vocab;
    const int N = B * T, head = model_head_unit(m);
    const size_t pe = (size_t)dtype_size(backend_act_dtype()); /* bytes per gathered parameter */
    if (B > a->B || T > a->T || B * T > a->B * a->T)
        fail_internal("micro-batch %dx%d exceeds the planned %dx%d", B, T, a->B, a->T);

    const struct unit_desc *eu = &m->units[0];
    const size_t NC = (size_t)N * C;
    upload_tokens(a, N, with_targets);
    const float *emb = zero_acquire(z, 0);
    backend_embedding_forward(block_in(a, 0), a->dev_inputs, elem_at(emb, eu->tensors[ET_WTE].offset, pe),
                              elem_at(emb, eu->tensors[ET_WPE].offset, pe), B, T, C);
    zero_release(z, 0);

    for (int l = 0; l < L; l++) {
        int u = model_block_unit(l);
        if (a->interval && l % a->interval == 0)
            backend_copy(a->ckpt[l / a->interval], block_in(a, l), NC * act_size_now());
        struct block_params p;
        const float *base = zero_acquire(z, u);
        BLOCK_VIEW(p, base, &m->units[u], pe);
        block_forward(m, &p, block_set(a, l), a, block_in(a, l), block_out(a, m, l), B, T);
        zero_release(z, u);
        /* a segment's output is the next segment's input, in work[0] */
        if (a->interval && (l + 1) % a->interval == 0 && l + 1 < L)
            backend_copy(a->work[0], block_out(a, m, l), NC * act_size_now());
    }

    const float *hp = zero_acquire(z, head);
    const struct unit_desc *hu = &m->units[head];
    backend_layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, a->final,
                              elem_at(hp, hu->tensors[HT_LNF_W].offset, pe), elem_at(hp, hu->tensors[HT_LNF_B].offset, pe), N, C);
    zero_release(z, head);
    emb = zero_acquire(z, 0);
    /* logits (N, Vp) = lnf (N, C) @ wte^T: the LM head tied to the token embedding */
    backend_matmul_forward_transposed(a->logits, a->lnf, elem_at(emb, eu->tensors[ET_WTE].offset, pe), N, C, Vp);
    if (mode == GPT2_TRAIN)
        a->head_wte = elem_at(emb, eu->tensors[ET_WTE].offset, pe);
    else
        zero_release(z, 0);
    if (a->debug_logits)
        read_act(a->debug_logits, a->logits, (size_t)N * Vp);
    if (!with_targets)
        return 0.0f;
    backend_crossentropy_forward(a->losses, a->logits, a->dev_targets, N, V, Vp);
    if (a->host_losses != a->losses)
        backend_copy(a->host_losses, a->losses, (size_t)N * sizeof(float));
    double sum = 0.0;
    for (int i = 0; i < N; i++)
        sum += a->host_losses[i];
    return (float)(sum / N);
}

void gpt2_backward(struct zero *z, struct gpt2_acts *a, int B, int T, float dloss_scale)
{
    const struct model *m = z->model;
    const int L = m->cfg.n_layer, C = m->cfg.n_embd, V = m->cfg.vocab_size, Vp = m->cfg.padded_vocab;
    const int N = B * T, head = model_head_unit(m);
    const struct unit_desc *eu = &m->units[0], *hu = &m->units[head];
    const size_t pe = (size_t)dtype_size(backend_act_dtype());

    backend_crossentropy_backward(a->logits, a->dev_targets, dloss_scale, N, V, Vp);
    float *emb_grad = zero_grad_open(z, 0);
    backend_matmul_backward_transposed(a->dwork_c, grad_at(emb_grad, eu->tensors[ET_WTE].offset), a->logits, a->lnf,
                                       a->head_wte, N, C, Vp);
    a->head_wte = NULL;
    zero_release(z, 0);

    const float *hp = zero_acquire(z, head);
    float *hg = zero_grad_open(z, head);
    /* whole floats: the arena rounds every buffer up to 64 bytes */
    backend_zero(a->dresid_a, ((size_t)N * C * act_size_now() + sizeof(float) - 1) / sizeof(float));
    backend_layernorm_backward(a->dresid_a, grad_at(hg, hu->tensors[HT_LNF_W].offset), grad_at(hg, hu->tensors[HT_LNF_B].offset),
                               a->dwork_c, a->final, elem_at(hp, hu->tensors[HT_LNF_W].offset, pe),
                               a->lnf_mean, a->lnf_rstd, a->scratch, N, C);
    zero_grad_done(z, head);
    zero_release(z, head);

    /* Segment by segment, last first: acquire the segment's blocks (recomputing
     * their forward from the kept input when checkpointing), then backward. */
    const int k = a->interval > 0 ? a->interval : 1;
    for (int s = n_segments(L, k) - 1; s >= 0; s--) {
        int l0 = s * k, l1 = l0 + k < L ? l0 + k : L;
        if (a->interval)
            backend_copy(a->work[0], a->ckpt[s], (size_t)N * C * act_size_now());
        for (int l = l0; l < l1; l++) {
            a->seg_params[l - l0] = zero_acquire(z, model_block_unit(l));
            if (a->interval) {
                struct block_params p;
                BLOCK_VIEW(p, a->seg_params[l - l0], &m->units[model_block_unit(l)], pe);
                float *out = l + 1 < l1 ? block_in(a, l + 1) : a->work[l - l0 + 1];
                block_forward(m, &p, block_set(a, l), a, block_in(a, l), out, B, T);
            }
        }
        for (int l = l1 - 1; l >= l0; l--) {
            int u = model_block_unit(l);
            struct block_params p;
            struct block_grads g;
            float *gbase = zero_grad_open(z, u);
            BLOCK_VIEW(p, a->seg_params[l - l0], &m->units[u], pe);
            BLOCK_VIEW(g, gbase, &m->units[u], (size_t)dtype_size(backend_grad_dtype()));
            block_backward(m, &p, &g, block_set(a, l), block_in(a, l), a, B, T);
            zero_grad_done(z, u);
            zero_release(z, u);
        }
    }

    backend_embedding_backward(grad_at(emb_grad, eu->tensors[ET_WTE].offset), grad_at(emb_grad, eu->tensors[ET_WPE].offset),
                               a->dresid_a, a->dev_inputs, B, T, C);
    zero_grad_done(z, 0);
}
