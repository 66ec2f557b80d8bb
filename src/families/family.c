#include "family.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/util.h"
#include "model/arch.h"

static const struct family *const families[] = {&family_gpt2, &family_llama, &family_gemma};

const struct family *family_of(const struct model *m)
{
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (arch_is(m->cfg.type, families[i]->arch))
            return families[i];
    return &family_gpt2;
}

/* ---- helpers ------------------------------------------------------------------ */

static const float *elem_at(const float *p, size_t i, size_t es) { return (const float *)((const char *)p + i * es); }

static size_t act_size_now(void) { return (size_t)dtype_size(backend_act_dtype()); }

const float *family_param(const struct family_acts *a, const float *unit, int u, int t)
{
    return elem_at(unit, a->m->units[u].tensors[t].offset, (size_t)dtype_size(backend_act_dtype()));
}

float *family_grad(const struct family_acts *a, float *grad, int u, int t)
{
    /* a frozen unit or tensor: no gradient, the kernels compute input gradients only */
    if (!grad || a->m->units[u].tensors[t].frozen)
        return NULL;
    return (float *)elem_at(grad, a->m->units[u].tensors[t].offset, (size_t)dtype_size(backend_grad_dtype()));
}

float *family_group_grad(const struct family_acts *a, float *grad, int u, int t0, int t1)
{
    for (int t = t0; grad && t <= t1; t++)
        if (!a->m->units[u].tensors[t].frozen)
            return (float *)elem_at(grad, a->m->units[u].tensors[t0].offset, (size_t)dtype_size(backend_grad_dtype()));
    return NULL;
}

void family_group_grad_done(const struct family_acts *a, float *grad, int u, int t0, int t1)
{
    if (!family_group_grad(a, grad, u, t0, t1))
        return;
    const size_t es = (size_t)dtype_size(backend_grad_dtype());
    for (int t = t0; t <= t1; t++) {
        const struct tensor_desc *td = &a->m->units[u].tensors[t];
        if (!td->frozen)
            continue;
        if (td->numel * es % sizeof(float))
            fail_internal("tensor '%s': %zu elements of %zu bytes are not whole floats", td->name, td->numel, es);
        backend_zero((float *)elem_at(grad, td->offset, es), td->numel * es / sizeof(float));
    }
}

/* ---- LoRA ------------------------------------------------------------------------- */

bool family_lora_adapts(const struct family_acts *a, int l, int k)
{
    const struct model_lora *lo = &a->m->lora;
    return lo->on && lo->unit[l] >= 0 && lo->a_tensor[l][k] >= 0;
}

/* The adapted layers of group g in block l, in order (their linear indices); returns how many. */
static int group_members(const struct model *m, int l, int g, int out[MODEL_MAX_LINEAR])
{
    int n = 0;
    for (int k = 0; m->lora.on && m->lora.unit[l] >= 0 && k < m->lora.n_linear; k++)
        if (m->lora.linear[k].group == g && m->lora.a_tensor[l][k] >= 0)
            out[n++] = k;
    return n;
}

/* The most layers of group g any block adapts (the width of its t buffers is that times r). */
static int group_width(const struct model *m, int g)
{
    int w = 0, members[MODEL_MAX_LINEAR];
    for (int l = 0; m->lora.on && l < m->cfg.n_layer; l++) {
        int n = group_members(m, l, g, members);
        w = n > w ? n : w;
    }
    return w;
}

static int lora_widest_input(const struct model *m)
{
    int w = 0;
    for (int k = 0; k < m->lora.n_linear; k++)
        if (group_width(m, m->lora.linear[k].group) && m->lora.linear[k].in > w)
            w = m->lora.linear[k].in;
    return w;
}

void family_lora_step(struct family_acts *a, uint64_t seed, long step, uint64_t row0)
{
    a->lora_key = lora_mix(seed * 0x9E3779B97F4A7C15ull ^ lora_mix((uint64_t)step));
    a->lora_row0 = row0;
}

static struct lora_dropout dropout_of(const struct family_acts *a, int l, int k)
{
    struct lora_dropout d = {0};
    if (a->lora_dropout_on && a->m->lora.dropout > 0.0f) {
        d.p = a->m->lora.dropout;
        d.key = lora_mix(a->lora_key ^ lora_mix(((uint64_t)l << 8) | (uint64_t)k));
        d.row0 = a->lora_row0;
        d.T = a->T;
    }
    return d;
}

static float *lora_t(const struct family_acts *a, int l, int g)
{
    return a->lora_t[(size_t)(l % a->n_sets) * MODEL_MAX_LINEAR + (size_t)g];
}

/* Group g's adapters in block l as the kernels take them. */
struct lora_group {
    int n;                              /* adapted layers (0: none) */
    int members[MODEL_MAX_LINEAR];      /* their linear indices */
    int in;                             /* their input's features */
    const float *A;                     /* the stacked lora_A (the first member's; the others follow it) */
    float *dA;                          /* its gradient, NULL: none */
    float *t;                           /* the group's saved drop(x) A^T */
    struct lora_out out[MODEL_MAX_LINEAR];
};

static void group_view(const struct family_acts *a, int l, const float *adapters, float *agrad, int g, float *y,
                       struct lora_group *grp)
{
    const struct model_lora *lo = &a->m->lora;
    grp->n = adapters ? group_members(a->m, l, g, grp->members) : 0;
    if (!grp->n)
        return;
    const int u = lo->unit[l], first = grp->members[0];
    for (int j = 0; j < grp->n; j++) {
        const int k = grp->members[j];
        grp->out[j] = (struct lora_out){(float *)elem_at(y, (size_t)lo->linear[k].col, act_size_now()),
                                        family_param(a, adapters, u, lo->b_tensor[l][k]),
                                        family_grad(a, agrad, u, lo->b_tensor[l][k]), lo->linear[k].out};
    }
    grp->in = lo->linear[first].in;
    grp->A = family_param(a, adapters, u, lo->a_tensor[l][first]);
    grp->dA = family_grad(a, agrad, u, lo->a_tensor[l][first]);
    grp->t = lora_t(a, l, g);
}

/* With dropout each layer has its own mask: one call per layer, layer j's t
 * at j N r of the group's buffer, its A (and dA) the j-th of the stacked
 * ones. The t layout thus depends on the dropout, which the forward and the
 * backward of a micro-batch share. */
void family_lora_forward(struct family_acts *a, int l, const float *adapters, int g, const float *x, float *y, int ld)
{
    struct lora_group grp;
    group_view(a, l, adapters, NULL, g, y, &grp);
    if (!grp.n)
        return;
    const struct model_lora *lo = &a->m->lora;
    const int N = a->B * a->T, r = lo->r;
    const size_t ae = act_size_now();
    if (dropout_of(a, l, grp.members[0]).p == 0.0f) {
        backend_lora_forward(grp.t, NULL, x, grp.A, grp.out, grp.n, ld, lo->scale, NULL, N, grp.in, r);
        return;
    }
    for (int j = 0; j < grp.n; j++) {
        const struct lora_dropout d = dropout_of(a, l, grp.members[j]);
        backend_lora_forward((float *)elem_at(grp.t, (size_t)j * (size_t)N * r, ae), a->lora_scratch, x,
                             elem_at(grp.A, (size_t)j * (size_t)r * grp.in, ae), &grp.out[j], 1, ld, lo->scale, &d, N,
                             grp.in, r);
    }
}

void family_lora_backward(struct family_acts *a, int l, const float *adapters, float *adapter_grad, int g,
                          const float *x, const float *dy, int ld, float *dx)
{
    struct lora_group grp;
    group_view(a, l, adapters, adapter_grad, g, (float *)dy, &grp);
    if (!grp.n)
        return;
    const struct model_lora *lo = &a->m->lora;
    const int N = a->B * a->T, r = lo->r;
    const size_t ae = act_size_now(), ge = (size_t)dtype_size(backend_grad_dtype());
    if (dropout_of(a, l, grp.members[0]).p == 0.0f) {
        backend_lora_backward(dx, grp.dA, a->lora_dt, NULL, x, grp.t, grp.A, grp.out, grp.n, ld, lo->scale, NULL, N,
                              grp.in, r);
        return;
    }
    for (int j = 0; j < grp.n; j++) {
        const struct lora_dropout d = dropout_of(a, l, grp.members[j]);
        float *dA = grp.dA ? (float *)elem_at(grp.dA, (size_t)j * (size_t)r * grp.in, ge) : NULL;
        backend_lora_backward(dx, dA, a->lora_dt, a->lora_scratch, x, elem_at(grp.t, (size_t)j * (size_t)N * r, ae),
                              elem_at(grp.A, (size_t)j * (size_t)r * grp.in, ae), &grp.out[j], 1, ld, lo->scale, &d, N,
                              grp.in, r);
    }
}

size_t family_scratch_floats(const struct model *m, const struct exec_target *t, int T)
{
    size_t att = target_attention_scratch(t, T, m->cfg.n_head), norm = target_norm_scratch(t, m->cfg.n_embd);
    return att > norm ? att : norm;
}

size_t family_f32_bytes(size_t n) { return arena_round(n * sizeof(float)); }

void family_copy_act(float *dst, const float *src, size_t n) { backend_copy(dst, src, n * act_size_now()); }

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

void family_read_logits(const struct family_acts *a, int row, float *out)
{
    const size_t Vp = (size_t)a->m->cfg.padded_vocab;
    if (row < a->logits_r0 || row >= a->logits_r0 + a->logits_rows)
        fail_internal("logits row %d is not in the last chunk computed (rows %d .. %d)", row, a->logits_r0,
                      a->logits_r0 + a->logits_rows - 1);
    read_act(out, elem_at(a->logits, (size_t)(row - a->logits_r0) * Vp, act_size_now()), Vp);
}

int family_logits_rows(const struct model *m, int B, int T)
{
    const struct model_config *c = &m->cfg;
    const long long N = (long long)B * T, hs = c->head_dim;
    const long long qkv = (c->n_head + 2LL * c->n_kv_head) * hs;
    const long long mlp = c->mlp == MLP_SWIGLU ? 2LL * c->ffn_dim : c->ffn_dim;
    long long widest = qkv > mlp ? qkv : mlp, rows = N * widest / c->padded_vocab;
    rows = rows < LOGITS_MIN_ROWS ? LOGITS_MIN_ROWS : rows;
    const char *force = getenv(LOGITS_ROWS_ENV);
    if (force && *force)
        rows = atoll(force) > 0 ? atoll(force) : 1;
    rows = rows < B ? B : rows;
    return (int)(rows < N ? rows : N);
}

static int n_segments(int L, int interval) { return (L + interval - 1) / interval; }

/* ---- the walk: live (the engine) or dry (recording the passes) ------------------ */

struct walk {
    struct zero *z;        /* live */
    struct zero_pass *rec; /* dry: where the events go */
    int cap;
};

static int live(const struct walk *w) { return w->rec == NULL; }

static void record(struct walk *w, enum pass_event_kind kind, int unit)
{
    struct zero_pass *p = w->rec;
    if (p->n_events == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 64;
        p->events = xrealloc(p->events, (size_t)w->cap * sizeof *p->events);
    }
    p->events[p->n_events].kind = kind;
    p->events[p->n_events].unit = unit;
    p->n_events++;
}

static const float *acquire(struct walk *w, int u)
{
    if (!live(w)) {
        record(w, PASS_ACQUIRE, u);
        return NULL;
    }
    return zero_acquire(w->z, u);
}

static void release(struct walk *w, int u)
{
    if (!live(w))
        record(w, PASS_RELEASE, u);
    else
        zero_release(w->z, u);
}

static float *grad_open(struct walk *w, int u)
{
    if (!live(w)) {
        record(w, PASS_GRAD_OPEN, u);
        return NULL;
    }
    return zero_grad_open(w->z, u);
}

static void grad_done(struct walk *w, int u)
{
    if (!live(w))
        record(w, PASS_GRAD_DONE, u);
    else
        zero_grad_done(w->z, u);
}

/* ---- the residual stream -------------------------------------------------------- */

/* Where block l reads its input and writes its output in the forward. */
static float *block_in(const struct family_acts *a, int l)
{
    return a->interval ? a->work[l % a->interval] : a->resid[l];
}

static float *block_out(const struct family_acts *a, int l)
{
    if (l == a->m->cfg.n_layer - 1)
        return a->final;
    return a->interval ? a->work[l % a->interval + 1] : a->resid[l + 1];
}

/* The LM head's weight inside the unit that holds it: the head unit's own
 * tensor, or the token embedding (tensor 0 of unit 0) when tied. */
/* Block l's adapter unit (LoRA), -1: none. */
static int adapter_unit(const struct model *m, int l) { return m->lora.on ? m->lora.unit[l] : -1; }

static int lm_unit(const struct model *m) { return m->cfg.tied_head ? 0 : model_head_unit(m); }

static int lm_tensor(const struct model *m) { return m->cfg.tied_head ? 0 : m->units[model_head_unit(m)].n_tensors - 1; }

/* ---- forward and backward: the one source of the pass order --------------------- */

/* Generation: row b's last real token's final-norm output moves to row b of
 * norm_out (rows only move down, so none is overwritten before it moves), the
 * LM head's input for the B logits rows. */
static int kv_last_rows(struct family_acts *a)
{
    const size_t C = (size_t)a->m->cfg.n_embd, esize = act_size_now();
    for (int b = 0; b < a->B; b++) {
        const int last = a->kv->last[b] < 0 ? 0 : a->kv->last[b]; /* -1: a silent row, its logits never read */
        const size_t from = (size_t)b * a->T + (size_t)last;
        if (a->kv->last[b] < -1 || last >= a->T)
            fail_internal("generation: row %d's last token %d is outside the forward's %d", b, a->kv->last[b], a->T);
        if (from != (size_t)b)
            backend_copy((float *)elem_at(a->norm_out, (size_t)b * C, esize), elem_at(a->norm_out, from * C, esize),
                         C * esize);
    }
    return a->B;
}

/* The LM head's chunk of n rows from r0: its logits (x: the final norm's output rows), and with targets its
 * losses (the logits turn into probabilities). */
static void lm_chunk_forward(struct family_acts *a, const float *lm, int r0, int n, int with_targets)
{
    const struct model *m = a->m;
    const int C = m->cfg.n_embd, V = m->cfg.vocab_size, Vp = m->cfg.padded_vocab;
    const float *x = elem_at(a->norm_out, (size_t)r0 * C, act_size_now());
    backend_matmul_forward_transposed(a->logits, x, lm, n, C, Vp);
    if (m->cfg.final_softcap > 0) /* Gemma 2: the logits (and what the loss sees) capped */
        backend_logit_softcap_forward(a->logits, a->logits_lse, (float)m->cfg.final_softcap, n, V, Vp);
    a->logits_r0 = r0;
    if (a->debug_logits)
        read_act(a->debug_logits + (size_t)r0 * Vp, a->logits, (size_t)n * Vp);
    if (with_targets)
        backend_crossentropy_forward(a->losses + r0, a->logits, a->dev_targets + r0, n, V, Vp);
}

/* The next run of rows with a trained target at or after row *at (host targets): its first row, its length
 * (0: none left); *at moves past it. */
static int trained_run(const int32_t *targets, int rows, int *at, int *len)
{
    int i = *at;
    while (i < rows && targets[i] < 0)
        i++;
    int j = i;
    while (j < rows && targets[j] >= 0)
        j++;
    *at = j;
    *len = j - i;
    return i;
}

/* An evaluation forward with targets: only the rows with a trained target need their logits (an untrained
 * row's loss is 0), so those rows of the final norm's output move down to the front (nothing reads it after
 * an evaluation forward; a run moves in pieces no longer than the distance, so no copy overlaps itself) and
 * the LM head runs over them alone, its chunks' cross-entropy run by run with each run's own targets and
 * losses; for DPO's reference and prompts that are not trained this saves their share of the LM head.
 * Each row's loss equals the pass over every row's to rounding, not bit for bit: the cross-entropy computes
 * each row on its own wherever it sits, but sgemm does not promise that a row's sums are the same at another
 * position or in a call of another length (OpenBLAS's Haswell/Zen kernel takes the rows 12 at a time, rounds
 * the two halves of each 12 differently and the last N mod 12 rows in other kernels; threads split the rows
 * by N), so a moved row's logits may differ in the last bit (tests/t_eval_rows.py: a row's loss within 1 ulp,
 * a log-prob held to 1e-6 per trained target, where one wrong row moves it by 1e-3 or more). The chunks keep the
 * pass's length, at least LOGITS_MIN_ROWS rows (not a tiny micro-batch, not SHARDLM_LOGITS_ROWS's short
 * chunks): a last chunk shorter than that is computed whole as before, and the last chunk of the trained rows
 * takes at least that many (rows past them, whose logits nothing reads), so the moved rows take the pass's
 * blocked sgemm, never the few-row kernels (small_rows_t, OpenBLAS's small-matrix paths).
 * Returns false, doing nothing, when it does not run. */
static bool lm_chunks_trained(struct family_acts *a, const float *lm)
{
    const struct model *m = a->m;
    const int rows = a->B * a->T, R = a->logits_rows, C = m->cfg.n_embd, V = m->cfg.vocab_size;
    const int Vp = m->cfg.padded_vocab, last = (rows - 1) / R * R;
    const char *hook = getenv(EVAL_ROWS_ENV);
    if (R < LOGITS_MIN_ROWS || (hook && strcmp(hook, "all") == 0))
        return false;
    const int end = rows - last < LOGITS_MIN_ROWS ? last : rows; /* the rows that may move */
    const size_t es = act_size_now(), row_bytes = (size_t)C * es;
    backend_zero(a->losses, (size_t)rows);
    int n = 0, len;
    for (int at = 0, i; (i = trained_run(a->targets, end, &at, &len), len > 0); n += len)
        for (int done = 0, step = i - n; done < len && step > 0; done += step) {
            const int k = len - done < step ? len - done : step;
            backend_copy((char *)a->norm_out + (size_t)(n + done) * row_bytes,
                         (const char *)a->norm_out + (size_t)(i + done) * row_bytes, (size_t)k * row_bytes);
        }
    /* the chunks of the n rows, and the runs (row i at compact row c) each chunk's rows come from */
    int at = 0, c = 0, i = trained_run(a->targets, end, &at, &len), ran = rows - end;
    for (int c0 = 0; c0 < n; c0 += R) {
        const int nc = n - c0 < R ? n - c0 : R, nm = nc < LOGITS_MIN_ROWS ? LOGITS_MIN_ROWS : nc; /* <= end - c0 */
        ran += nm;
        backend_matmul_forward_transposed(a->logits, elem_at(a->norm_out, (size_t)c0 * C, es), lm, nm, C, Vp);
        if (m->cfg.final_softcap > 0)
            backend_logit_softcap_forward(a->logits, NULL, (float)m->cfg.final_softcap, nm, V, Vp);
        for (const int stop = c0 + nc; c < stop;) {
            const int k = stop - c < len ? stop - c : len; /* the run's rows in this chunk */
            backend_crossentropy_forward(a->losses + i, (float *)elem_at(a->logits, (size_t)(c - c0) * Vp, es),
                                         a->dev_targets + i, k, V, Vp);
            i += k, len -= k, c += k;
            if (len == 0)
                i = trained_run(a->targets, end, &at, &len);
        }
    }
    if (end < rows)
        lm_chunk_forward(a, lm, end, rows - end, 1);
    if (hook && strcmp(hook, "log") == 0)
        fprintf(stderr, "eval LM head: %d of %d rows (%d trained moved, %d after them)\n", ran, rows, n, rows - end);
    /* compact rows are no row's own: family_read_logits (forwards without targets) refuses every row */
    a->logits_r0 = -(R + 1);
    return true;
}

/* The chunk's dlogits from its probabilities (scale: per row, or dloss_scale when NULL), folded into the LM
 * head's gradient dlm and the final norm's output gradient. */
static void lm_chunk_backward(struct family_acts *a, const float *lm, float *dlm, int r0, int n, const float *scale)
{
    const struct model *m = a->m;
    const int C = m->cfg.n_embd, V = m->cfg.vocab_size, Vp = m->cfg.padded_vocab;
    const size_t es = act_size_now();
    if (m->cfg.final_softcap > 0)
        backend_crossentropy_softcap_backward(a->logits, a->dev_targets + r0, a->dloss_scale, scale ? scale + r0 : NULL,
                                              a->logits_lse, (float)m->cfg.final_softcap, n, V, Vp);
    else if (scale)
        backend_crossentropy_backward_rows(a->logits, a->dev_targets + r0, scale + r0, n, V, Vp);
    else
        backend_crossentropy_backward(a->logits, a->dev_targets + r0, a->dloss_scale, n, V, Vp);
    backend_matmul_backward_transposed((float *)elem_at(a->dwork_c, (size_t)r0 * C, es), dlm, a->logits,
                                       elem_at(a->norm_out, (size_t)r0 * C, es), lm, n, C, Vp);
}

/* The losses read back into host memory. */
static void read_losses(struct family_acts *a, int rows)
{
    if (a->host_losses != a->losses)
        backend_copy(a->host_losses, a->losses, (size_t)rows * sizeof(float));
}

/* The LM head over the final norm's output, a->logits_rows rows at a time:
 * the chunk's logits, and with targets its losses; with backward, its
 * dlogits (scaled by a->dloss_scale) folded at once into the LM head's
 * gradient (lm_grad_unit's tensor, NULL: frozen) and the rows of a->dwork_c,
 * the final norm's output gradient. Returns the sum of the losses. The
 * buffer keeps the last chunk's logits (family_read_logits).
 * With a->loss_weights (DPO): every chunk's losses first, the per-position
 * scales from them, then the backward: the last chunk's probabilities are
 * still in the buffer, the others' logits are computed again; a frozen LM
 * head's backward (the final norm's output gradient alone, linear in each
 * row's scale) runs with scale 1 in the first pass and its rows are scaled
 * after. The scales live in a->dresid_a meanwhile, which the head's backward
 * zeroes after. */
static double lm_chunks(struct family_acts *a, const float *lm, float *lm_grad_unit, int with_targets, bool backward)
{
    const struct model *m = a->m;
    const int rows = a->kv ? kv_last_rows(a) : a->B * a->T, R = a->logits_rows;
    float *dlm = backward ? family_grad(a, lm_grad_unit, lm_unit(m), lm_tensor(m)) : NULL;
    const bool weighted = backward && with_targets && a->loss_weights;
    /* a frozen LM head (LoRA) has only the input gradient, each row's linear in its scale: scale 1 first,
     * the rows scaled after, nothing computed again */
    const bool rows_after = weighted && !dlm;
    if (rows_after)
        a->dloss_scale = 1.0f;
    if (!(with_targets && !backward && !a->kv && !a->debug_logits && lm_chunks_trained(a, lm)))
        for (int r0 = 0; r0 < rows; r0 += R) {
            const int n = rows - r0 < R ? rows - r0 : R;
            lm_chunk_forward(a, lm, r0, n, with_targets);
            if (with_targets && backward && (!weighted || rows_after))
                lm_chunk_backward(a, lm, dlm, r0, n, NULL);
        }
    if (!with_targets)
        return 0.0;
    read_losses(a, rows);
    double sum = 0.0;
    for (int i = 0; i < rows; i++)
        sum += a->host_losses[i];
    if (!weighted)
        return sum;
    float *scale = a->dresid_a; /* B T floats fit: it holds B T C act elements */
    backend_copy(scale, a->loss_weights(a->loss_weights_ctx, a->host_losses, a->B, a->T),
                 (size_t)rows * sizeof(float));
    if (rows_after) {
        backend_scale_rows(a->dwork_c, scale, rows, m->cfg.n_embd);
        return sum;
    }
    const int last = (rows - 1) / R * R;
    lm_chunk_backward(a, lm, dlm, last, rows - last, scale);
    for (int r0 = 0; r0 < last; r0 += R) {
        lm_chunk_forward(a, lm, r0, R, 1);
        lm_chunk_backward(a, lm, dlm, r0, R, scale);
    }
    return sum;
}

static bool trained(const struct model *m, int u) { return !m->units[u].frozen; }

static double walk_forward(struct walk *w, struct family_acts *a, int with_targets, enum family_mode mode)
{
    const struct model *m = a->m;
    const struct family *f = a->f;
    const int L = m->cfg.n_layer, head = model_head_unit(m), N = a->B * a->T;
    const size_t NC = (size_t)N * (size_t)m->cfg.n_embd;

    const float *emb = acquire(w, 0);
    if (live(w))
        f->embed_forward(a, emb, block_in(a, 0));
    release(w, 0);

    for (int l = 0; l < L; l++) {
        int u = model_block_unit(l);
        if (live(w) && a->interval && l % a->interval == 0)
            family_copy_act(a->ckpt[l / a->interval], block_in(a, l), NC);
        const float *p = acquire(w, u);
        const int au = adapter_unit(m, l);
        const float *ad = au >= 0 ? acquire(w, au) : NULL;
        if (live(w))
            f->block_forward(a, l, p, a->adapters_off ? NULL : ad, block_in(a, l), block_out(a, l));
        if (au >= 0)
            release(w, au);
        release(w, u);
        /* a segment's output is the next segment's input, in work[0] */
        if (live(w) && a->interval && (l + 1) % a->interval == 0 && l + 1 < L)
            family_copy_act(a->work[0], block_out(a, l), NC);
    }

    /* The head: the final norm, then the LM head chunk by chunk (lm_chunks). In
     * training the head's backward runs here too, each chunk's dlogits folded
     * into the LM head's gradient and the final norm's output gradient as soon
     * as it exists, then the final norm's backward: the backward starts at the
     * blocks, and no buffer of every row's logits exists. */
    const bool train = mode == FAMILY_TRAIN, tied = m->cfg.tied_head;
    const bool emb_trained = trained(m, 0), head_trained = trained(m, head);
    const float *hp = acquire(w, head);
    if (live(w))
        f->norm_forward(a, hp);
    const float *lm_base = hp;
    float *lm_grad = NULL, *hg = NULL;
    if (tied) {
        release(w, head);
        lm_base = acquire(w, 0);
        /* a tied head's gradient is the embedding's: open until the embedding's backward adds into it */
        if (train && emb_trained)
            a->tied_grad = lm_grad = grad_open(w, 0);
    } else if (train && head_trained) {
        lm_grad = hg = grad_open(w, head);
    }
    double sum = 0.0;
    if (live(w))
        sum = lm_chunks(a, family_param(a, lm_base, lm_unit(m), lm_tensor(m)), lm_grad, with_targets, train);
    if (tied || !train) /* the embedding, or the head unit when nothing follows */
        release(w, lm_unit(m));
    if (!train)
        return sum;
    if (tied) {
        hp = acquire(w, head);
        hg = head_trained ? grad_open(w, head) : NULL;
    }
    if (live(w)) {
        /* whole floats: the arena rounds every buffer up to 64 bytes */
        backend_zero(a->dresid_a, (NC * act_size_now() + sizeof(float) - 1) / sizeof(float));
        f->norm_backward(a, hp, hg);
    }
    if (head_trained)
        grad_done(w, head);
    release(w, head);
    return sum;
}

/* Whether layer l trains anything: its block or its adapters. */
static bool layer_trained(const struct model *m, int l)
{
    const int au = adapter_unit(m, l);
    return trained(m, model_block_unit(l)) || (au >= 0 && trained(m, au));
}

/* The lowest layer whose backward anything needs: 0 when the embedding
 * trains (its gradient takes every block's input gradient), else the lowest
 * trained block; n_layer when no block or embedding trains. Below it the
 * backward neither gathers nor computes. */
static int lowest_backward_layer(const struct model *m)
{
    if (trained(m, 0))
        return 0;
    for (int l = 0; l < m->cfg.n_layer; l++)
        if (layer_trained(m, l))
            return l;
    return m->cfg.n_layer;
}

static void walk_backward(struct walk *w, struct family_acts *a)
{
    const struct model *m = a->m;
    const struct family *f = a->f;
    const int L = m->cfg.n_layer, N = a->B * a->T;
    const size_t NC = (size_t)N * (size_t)m->cfg.n_embd;
    const bool tied = m->cfg.tied_head;
    /* a frozen unit (model.h) opens no gradient buffer: its kernels get NULL
     * and compute input gradients only */
    const bool emb_trained = trained(m, 0);

    /* the head's backward ran in the forward (walk_forward) */
    float *emb_grad = tied ? a->tied_grad : NULL;
    a->tied_grad = NULL;

    /* Segment by segment, last first: acquire the segment's blocks (recomputing
     * their forward from the kept input when checkpointing), then backward,
     * down to the lowest block anything below the head needs. */
    const int k = a->interval > 0 ? a->interval : 1, lowest = lowest_backward_layer(m);
    for (int s = n_segments(L, k) - 1; s >= 0; s--) {
        int l0 = s * k, l1 = l0 + k < L ? l0 + k : L;
        if (l1 <= lowest)
            break;
        if (live(w) && a->interval)
            family_copy_act(a->work[0], a->ckpt[s], NC);
        for (int l = l0; l < l1; l++) {
            const int au = adapter_unit(m, l);
            a->seg_params[l - l0] = acquire(w, model_block_unit(l));
            a->seg_adapters[l - l0] = au >= 0 ? acquire(w, au) : NULL;
            if (live(w) && a->interval) {
                float *out = l + 1 < l1 ? block_in(a, l + 1) : a->work[l - l0 + 1];
                f->block_forward(a, l, a->seg_params[l - l0], a->seg_adapters[l - l0], block_in(a, l), out);
            }
        }
        for (int l = l1 - 1; l >= l0; l--) {
            const int u = model_block_unit(l), au = adapter_unit(m, l);
            const bool needed = l >= lowest, block_trained = needed && trained(m, u);
            const bool adapters_trained = needed && au >= 0 && trained(m, au);
            float *g = block_trained ? grad_open(w, u) : NULL;
            float *ag = adapters_trained ? grad_open(w, au) : NULL;
            if (live(w) && needed)
                f->block_backward(a, l, a->seg_params[l - l0], g, a->seg_adapters[l - l0], ag, block_in(a, l));
            if (adapters_trained)
                grad_done(w, au);
            if (block_trained)
                grad_done(w, u);
            if (au >= 0)
                release(w, au);
            release(w, u);
        }
    }

    if (!emb_trained) /* frozen: no gradient to compute, an untied embedding is not even gathered */
        return;
    if (!tied) {
        acquire(w, 0);
        emb_grad = grad_open(w, 0);
    }
    if (live(w))
        f->embed_backward(a, emb_grad, a->dresid_a);
    grad_done(w, 0);
    if (!tied)
        release(w, 0);
}

/* Moves the caller's token ids to the kernels' buffers (nothing to do on the CPU). */
static void upload_tokens(struct family_acts *a, int N, int with_targets)
{
    if (a->dev_inputs == a->inputs)
        return;
    backend_copy(a->dev_inputs, a->inputs, (size_t)N * sizeof(int32_t));
    if (a->positions)
        backend_copy(a->dev_positions, a->positions, (size_t)N * sizeof(int32_t));
    if (with_targets)
        backend_copy(a->dev_targets, a->targets, (size_t)N * sizeof(int32_t));
}

static void set_batch(struct family_acts *a, int B, int T)
{
    if (B > a->max_B || T > a->max_T || B * T > a->max_B * a->max_T)
        fail_internal("micro-batch %dx%d exceeds the planned %dx%d", B, T, a->max_B, a->max_T);
    a->B = B;
    a->T = T;
}

double family_forward(struct zero *z, struct family_acts *a, int B, int T, int with_targets, enum family_mode mode,
                      float dloss_scale)
{
    set_batch(a, B, T);
    a->dloss_scale = dloss_scale;
    upload_tokens(a, B * T, with_targets);
    if (a->kv) {
        if (mode != FAMILY_EVAL || with_targets)
            fail_internal("generation's forward computes logits only");
        int32_t *keep = a->kv->past + a->max_B;
        for (int b = 0; b < B; b++)
            keep[b] = a->kv->last[b] + 1; /* the tokens after a row's last are padding, never cached (a silent
                                           * row's none) */
        if (a->kv->dev_past != a->kv->past)
            backend_copy(a->kv->dev_past, a->kv->past, 2 * (size_t)a->max_B * sizeof(int32_t));
    }
    if (a->f->prepare)
        a->f->prepare(a);
    a->lora_dropout_on = mode == FAMILY_TRAIN;
    struct walk w = {z, NULL, 0};
    return walk_forward(&w, a, with_targets, mode);
}

void family_backward(struct zero *z, struct family_acts *a, int B, int T)
{
    set_batch(a, B, T);
    struct walk w = {z, NULL, 0};
    walk_backward(&w, a);
}

void family_build_passes(const struct model *m, int interval, struct zero_pass *train, struct zero_pass *eval)
{
    struct family_acts dry = {.m = m, .f = family_of(m), .interval = interval};
    const int k = interval > 0 ? interval : 1;
    dry.seg_params = xcalloc((size_t)k, sizeof *dry.seg_params);
    dry.seg_adapters = xcalloc((size_t)k, sizeof *dry.seg_adapters);
    *train = (struct zero_pass){.name = "train"};
    *eval = (struct zero_pass){.name = "eval"};
    struct walk we = {NULL, eval, 0}, wt = {NULL, train, 0};
    walk_forward(&we, &dry, 0, FAMILY_EVAL);
    walk_forward(&wt, &dry, 1, FAMILY_TRAIN);
    walk_backward(&wt, &dry);
    free(dry.seg_params);
    free(dry.seg_adapters);
}

void family_free_passes(struct zero_pass *train, struct zero_pass *eval)
{
    free(train->events);
    free(eval->events);
    train->events = eval->events = NULL;
}

/* ---- memory ----------------------------------------------------------------------- */

static int sets_for(const struct model *m, int interval) { return interval > 0 ? interval : m->cfg.n_layer; }

void family_plan(const struct model *m, const struct exec_target *t, int B, int T, int max_pos, int interval,
                 bool positions, size_t bytes[BUF_COUNT])
{
    const size_t L = (size_t)m->cfg.n_layer, BT = (size_t)B * (size_t)T, C = (size_t)m->cfg.n_embd;
    const size_t resid = target_act_bytes(t, BT * C), tokens = arena_round(BT * sizeof(int32_t));
    if (interval > 0) {
        bytes[BUF_ACT_CKPT] += (size_t)n_segments((int)L, interval) * resid;
        bytes[BUF_ACTIVATIONS] += ((size_t)interval + 1) * resid + resid;
    } else {
        bytes[BUF_ACT_CKPT] += L * resid;
        bytes[BUF_ACTIVATIONS] += resid;
    }
    const size_t logits_rows = (size_t)family_logits_rows(m, B, T);
    bytes[BUF_LOGITS] += resid + target_act_bytes(t, logits_rows * (size_t)m->cfg.padded_vocab) + family_f32_bytes(BT);
    if (m->cfg.final_softcap > 0)
        bytes[BUF_LOGITS] += family_f32_bytes(logits_rows);
    const size_t token_arrays = positions ? 3 : 2; /* inputs, targets, packed rows' positions */
    bytes[BUF_WORKSPACE] += 3 * resid + token_arrays * tokens + target_library_arena_bytes(target_library_workspace(t));
    if (t->device)
        bytes[BUF_STAGING] += token_arrays * tokens + family_f32_bytes(BT);
    family_of(m)->plan(m, t, B, T, max_pos, sets_for(m, interval), bytes);
    if (!m->lora.on)
        return;
    /* LoRA: drop(x) A^T of every adapted linear in each set, and the backward's work */
    const size_t r = (size_t)m->lora.r;
    int widest = 0;
    for (int g = 0; g < m->lora.n_groups; g++) {
        const int w = group_width(m, g);
        widest = w > widest ? w : widest;
        if (w)
            bytes[BUF_ACTIVATIONS] += (size_t)sets_for(m, interval) * target_act_bytes(t, BT * r * (size_t)w);
    }
    bytes[BUF_WORKSPACE] += target_act_bytes(t, BT * r * (size_t)widest);
    if (m->lora.dropout > 0.0f)
        bytes[BUF_WORKSPACE] += target_act_bytes(t, BT * (size_t)lora_widest_input(m));
}

/* Each block's attention variant, from the model's config (struct attention_layers), decided here once. */
static struct attn_opts *attention_of(const struct model *m)
{
    const struct attention_layers *at = &m->cfg.attention;
    struct attn_opts *o = xcalloc((size_t)m->cfg.n_layer, sizeof *o);
    for (int l = 0; l < m->cfg.n_layer; l++)
        o[l] = (struct attn_opts){model_attention_sliding(at, l) ? at->window : 0, at->softcap, at->scale};
    return o;
}

void family_acts_init(struct family_acts *a, const struct model *m, const struct exec_target *t, int B, int T,
                      int max_pos, int interval, bool positions, enum mem_space ckpt_space,
                      struct arena arenas[SPACE_COUNT], struct mem_tracker *mem)
{
    const size_t L = (size_t)m->cfg.n_layer, C = (size_t)m->cfg.n_embd, BT = (size_t)B * (size_t)T;
    const size_t Vp = (size_t)m->cfg.padded_vocab, ae = (size_t)dtype_size(t->act);
    struct arena *dev = &arenas[SPACE_DEVICE];
    memset(a, 0, sizeof *a);
    a->m = m;
    a->f = family_of(m);
    a->max_B = a->B = B;
    a->max_T = a->T = T;
    a->max_pos = max_pos;
    a->interval = interval;
    a->n_sets = sets_for(m, interval);
    a->attn = attention_of(m);
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
    a->f->init(a, t, dev, mem);
    for (int i = 0; interval > 0 && i <= interval; i++)
        a->work[i] = ALLOC_ACT(BUF_ACTIVATIONS, BT * C);
    a->final = ALLOC_ACT(BUF_ACTIVATIONS, BT * C);
    if (a->resid)
        a->resid[L] = a->final;
    a->seg_params = xcalloc((size_t)(interval > 0 ? interval : 1), sizeof *a->seg_params);
    a->seg_adapters = xcalloc((size_t)(interval > 0 ? interval : 1), sizeof *a->seg_adapters);
    if (m->lora.on) {
        const size_t r = (size_t)m->lora.r;
        a->lora_t = xcalloc((size_t)a->n_sets * MODEL_MAX_LINEAR, sizeof *a->lora_t);
        int widest = 0;
        for (int g = 0; g < m->lora.n_groups; g++)
            widest = group_width(m, g) > widest ? group_width(m, g) : widest;
        for (int i = 0; i < a->n_sets; i++)
            for (int g = 0; g < m->lora.n_groups; g++)
                if (group_width(m, g))
                    a->lora_t[(size_t)i * MODEL_MAX_LINEAR + (size_t)g] =
                        arena_alloc(dev, mem, BUF_ACTIVATIONS, BT * r * (size_t)group_width(m, g) * ae, 1);
        a->lora_dt = arena_alloc(dev, mem, BUF_WORKSPACE, BT * r * (size_t)widest * ae, 1);
        if (m->lora.dropout > 0.0f)
            a->lora_scratch = arena_alloc(dev, mem, BUF_WORKSPACE, BT * (size_t)lora_widest_input(m) * ae, 1);
    }
    a->norm_out = ALLOC_ACT(BUF_LOGITS, BT * C);
    a->logits_rows = family_logits_rows(m, B, T);
    a->logits = ALLOC_ACT(BUF_LOGITS, (size_t)a->logits_rows * Vp);
    if (m->cfg.final_softcap > 0)
        a->logits_lse = ALLOC(BUF_LOGITS, (size_t)a->logits_rows);
    a->losses = ALLOC(BUF_LOGITS, BT);
    a->dresid_a = ALLOC_ACT(BUF_WORKSPACE, BT * C);
    a->dresid_b = ALLOC_ACT(BUF_WORKSPACE, BT * C);
    a->dwork_c = ALLOC_ACT(BUF_WORKSPACE, BT * C);
#undef ALLOC
#undef ALLOC_ACT
    a->dev_inputs = arena_alloc(dev, mem, BUF_WORKSPACE, BT * sizeof(int32_t), 1);
    a->dev_targets = arena_alloc(dev, mem, BUF_WORKSPACE, BT * sizeof(int32_t), 1);
    if (positions)
        a->dev_positions = arena_alloc(dev, mem, BUF_WORKSPACE, BT * sizeof(int32_t), 1);
    const size_t lib = target_library_workspace(t);
    if (lib) {
        uintptr_t at = (uintptr_t)arena_alloc(dev, mem, BUF_WORKSPACE, target_library_arena_bytes(lib), 1);
        backend_set_library_workspace(
            (void *)((at + TARGET_LIBRARY_ALIGN - 1) / TARGET_LIBRARY_ALIGN * TARGET_LIBRARY_ALIGN), lib);
    }
    if (t->device) {
        struct arena *pinned = &arenas[SPACE_PINNED];
        a->inputs = arena_alloc(pinned, mem, BUF_STAGING, BT * sizeof(int32_t), 1);
        a->targets = arena_alloc(pinned, mem, BUF_STAGING, BT * sizeof(int32_t), 1);
        if (positions)
            a->positions = arena_alloc(pinned, mem, BUF_STAGING, BT * sizeof(int32_t), 1);
        a->host_losses = arena_alloc(pinned, mem, BUF_STAGING, BT * sizeof(float), 1);
    } else {
        a->inputs = a->dev_inputs;
        a->targets = a->dev_targets;
        a->positions = a->dev_positions;
        a->host_losses = a->losses;
    }
}

void family_kv_plan(const struct model *m, const struct exec_target *t, int B, int Tmax, size_t bytes[BUF_COUNT])
{
    const size_t kvw = (size_t)m->cfg.n_kv_head * (size_t)m->cfg.head_dim;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const size_t Tc = (size_t)model_attention_cache_len(&m->cfg, l, Tmax);
        bytes[BUF_ACTIVATIONS] += 2 * target_act_bytes(t, (size_t)B * Tc * kvw);
    }
    if (t->device)
        bytes[BUF_WORKSPACE] += arena_round(2 * (size_t)B * sizeof(int32_t));
}

void family_kv_init(struct family_acts *a, struct family_kv *kv, const struct exec_target *t, int Tmax,
                    struct arena arenas[SPACE_COUNT], struct mem_tracker *mem)
{
    const struct model *m = a->m;
    const int L = m->cfg.n_layer, B = a->max_B;
    if (Tmax > a->max_pos)
        fail_internal("a cache of %d positions beyond the rotary tables' %d", Tmax, a->max_pos);
    const size_t kvw = (size_t)m->cfg.n_kv_head * (size_t)m->cfg.head_dim;
    memset(kv, 0, sizeof *kv);
    kv->Tmax = Tmax;
    kv->Tc = xcalloc((size_t)L, sizeof *kv->Tc);
    kv->k = xcalloc((size_t)L, sizeof *kv->k);
    kv->v = xcalloc((size_t)L, sizeof *kv->v);
    for (int l = 0; l < L; l++) {
        kv->Tc[l] = model_attention_cache_len(&m->cfg, l, Tmax);
        const size_t bytes = (size_t)B * (size_t)kv->Tc[l] * kvw * (size_t)dtype_size(t->act);
        kv->k[l] = arena_alloc(&arenas[SPACE_DEVICE], mem, BUF_ACTIVATIONS, bytes, 1);
        kv->v[l] = arena_alloc(&arenas[SPACE_DEVICE], mem, BUF_ACTIVATIONS, bytes, 1);
    }
    kv->past = xcalloc(2 * (size_t)B, sizeof *kv->past);
    kv->last = xcalloc((size_t)B, sizeof *kv->last);
    kv->dev_past = t->device ? arena_alloc(&arenas[SPACE_DEVICE], mem, BUF_WORKSPACE,
                                           2 * (size_t)B * sizeof(int32_t), 1)
                             : kv->past;
    a->kv = kv;
}

void family_kv_free(struct family_acts *a)
{
    struct family_kv *kv = a->kv;
    if (!kv)
        return;
    free(kv->Tc);
    free(kv->k);
    free(kv->v);
    free(kv->past);
    free(kv->last);
    memset(kv, 0, sizeof *kv);
    a->kv = NULL;
}

bool family_attention_kv(struct family_acts *a, int l, float *out, const float *qkv, int NH, int NKV, int hs)
{
    if (!a->kv)
        return false;
    const struct family_kv *kv = a->kv;
    backend_attention_kv_forward(out, qkv, kv->k[l], kv->v[l], kv->dev_past, kv->dev_past + a->max_B, a->B, a->T, NH,
                                 NKV, hs, kv->Tc[l], &a->attn[l]);
    return true;
}

void family_acts_free(struct family_acts *a)
{
    if (a->f)
        a->f->free(a);
    free(a->resid);
    free(a->ckpt);
    free(a->work);
    free(a->seg_params);
    free(a->seg_adapters);
    free(a->attn);
    free(a->lora_t);
    memset(a, 0, sizeof *a);
}
