/*
 * CPU backend, activation dtype (backend.h "[A]"): fp32 for the CPU's own
 * training; fp16/bf16 only under SHARDLM_EMULATE_DEVICE, where the engine
 * takes the CUDA build's half-precision path. Then each kernel with [A]
 * operands runs here: its [A] inputs are widened into fp32 buffers, the fp32
 * kernel its entry point hands over (backend_cpu.c, backend_cpu_attention.c)
 * runs on them, and its [A] outputs are rounded back
 * (to nearest even), so the results are those of half-precision storage with
 * fp32 arithmetic, as on a GPU. Slow and allocating: a test path.
 */
#include "backend_cpu_act.h"

#include <stdlib.h>

#include "backend_cpu_attention.h"
#include "core/devemu.h"
#include "core/dtype.h"
#include "core/util.h"

static enum dtype g_act = DTYPE_F32, g_grad = DTYPE_F32;

/* Half precision ([A], [G]) is a device's: the CPU backend takes it only emulating one. */
static void set_dtype(enum dtype *slot, enum dtype dt, const char *what)
{
    if (dt != DTYPE_F32 && !devemu_enabled())
        fail_internal("the CPU backend's %s are fp32; half precision needs SHARDLM_EMULATE_DEVICE=1", what);
    *slot = dt;
}

void backend_set_grad_dtype(enum dtype dt) { set_dtype(&g_grad, dt, "weight gradients"); }

enum dtype backend_grad_dtype(void) { return g_grad; }

/* A [G] tensor of n elements as an fp32 buffer for an accumulating kernel:
 * the tensor itself when gradients are fp32, else a widened copy that
 * grad_done rounds back (once, after the kernel's +=) and frees. */
static float *grad_begin(float *p, size_t n)
{
    if (!p || g_grad == DTYPE_F32)
        return p;
    float *w = xcalloc(n ? n : 1, sizeof *w);
    dtype_convert(w, DTYPE_F32, devemu_host(p), g_grad, n);
    return w;
}

static void grad_done(float *p, float *w, size_t n)
{
    if (!p || w == p)
        return;
    dtype_convert(devemu_host(p), g_grad, w, DTYPE_F32, n);
    free(w);
}

void backend_set_act_dtype(enum dtype dt) { set_dtype(&g_act, dt, "activations"); }

enum dtype backend_act_dtype(void) { return g_act; }

int act_half(void) { return g_act != DTYPE_F32; }

/* n [A] elements widened into a new fp32 buffer (NULL stays NULL). */
static float *widen(const void *p, size_t n)
{
    if (!p)
        return NULL;
    float *w = xcalloc(n ? n : 1, sizeof *w);
    dtype_convert(w, DTYPE_F32, devemu_host(p), g_act, n);
    return w;
}

/* Rounds n fp32 values into the [A] tensor p and frees them. */
static void narrow(void *p, float *w, size_t n)
{
    if (p)
        dtype_convert(devemu_host(p), g_act, w, DTYPE_F32, n);
    free(w);
}

void act_matmul_forward(void (*f32)(float *out, const float *inp, const float *weight, const float *bias, int N, int C,
                                    int OC),
                        float *out, const float *inp, const float *weight, const float *bias, int N, int C, int OC)
{
    float *i = widen(inp, (size_t)N * C), *w = widen(weight, (size_t)C * OC), *b = widen(bias, (size_t)OC);
    float *o = xcalloc((size_t)N * OC, sizeof *o);
    f32(o, i, w, b, N, C, OC);
    narrow(out, o, (size_t)N * OC);
    free(i), free(w), free(b);
}

void act_matmul_backward(void (*f32)(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                     const float *weight, int N, int C, int OC),
                         float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                         const float *weight, int N, int C, int OC)
{
    float *d = widen(dout, (size_t)N * OC), *i = widen(inp, (size_t)N * C), *w = widen(weight, (size_t)C * OC);
    float *di = dinp ? xcalloc((size_t)N * C, sizeof *di) : NULL;
    float *dw = grad_begin(dweight, (size_t)C * OC), *db = grad_begin(dbias, (size_t)OC);
    f32(di, dw, db, d, i, w, N, C, OC);
    grad_done(dweight, dw, (size_t)C * OC);
    grad_done(dbias, db, (size_t)OC);
    if (dinp)
        narrow(dinp, di, (size_t)N * C);
    free(d), free(i), free(w);
}

void act_matmul_forward_transposed(void (*f32)(float *out, const float *inp, const float *weight, int N, int C, int OC),
                                   float *out, const float *inp, const float *weight, int N, int C, int OC)
{
    float *i = widen(inp, (size_t)N * C), *w = widen(weight, (size_t)OC * C);
    float *o = xcalloc((size_t)N * OC, sizeof *o);
    f32(o, i, w, N, C, OC);
    narrow(out, o, (size_t)N * OC);
    free(i), free(w);
}

void act_matmul_backward_transposed(void (*f32)(float *dinp, float *dweight, const float *dout, const float *inp,
                                                const float *weight, int N, int C, int OC),
                                    float *dinp, float *dweight, const float *dout, const float *inp,
                                    const float *weight, int N, int C, int OC)
{
    float *d = widen(dout, (size_t)N * OC), *i = widen(inp, (size_t)N * C), *w = widen(weight, (size_t)OC * C);
    float *di = xcalloc((size_t)N * C, sizeof *di), *dw = grad_begin(dweight, (size_t)OC * C);
    f32(di, dw, d, i, w, N, C, OC);
    grad_done(dweight, dw, (size_t)OC * C);
    narrow(dinp, di, (size_t)N * C);
    free(d), free(i), free(w);
}

void act_layernorm_forward(void (*f32)(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                                       const float *bias, int N, int C),
                           float *out, float *mean, float *rstd, const float *inp, const float *weight,
                           const float *bias, int N, int C)
{
    float *w = widen(weight, (size_t)C), *b = widen(bias, (size_t)C), *o = xcalloc((size_t)N * C, sizeof *o);
    float *x = widen(inp, (size_t)N * C);
    f32(o, mean, rstd, x, w, b, N, C);
    narrow(out, o, (size_t)N * C);
    free(w), free(b), free(x);
}

void act_layernorm_backward(void (*f32)(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                        const float *weight, const float *mean, const float *rstd, float *scratch,
                                        int N, int C),
                            float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, const float *mean, const float *rstd, float *scratch, int N, int C)
{
    float *d = widen(dout, (size_t)N * C), *w = widen(weight, (size_t)C), *x = widen(inp, (size_t)N * C);
    float *di = widen(dinp, (size_t)N * C); /* accumulated: round once, after the += */
    float *dw = grad_begin(dweight, (size_t)C), *db = grad_begin(dbias, (size_t)C);
    f32(di, dw, db, d, x, w, mean, rstd, scratch, N, C);
    grad_done(dweight, dw, (size_t)C);
    grad_done(dbias, db, (size_t)C);
    narrow(dinp, di, (size_t)N * C);
    free(d), free(w), free(x);
}

void act_gelu_forward(void (*f32)(float *out, const float *inp, size_t n), float *out, const float *inp, size_t n)
{
    float *i = widen(inp, n), *o = xcalloc(n, sizeof *o);
    f32(o, i, n);
    narrow(out, o, n);
    free(i);
}

void act_gelu_backward(void (*f32)(float *dinp, const float *inp, const float *dout, size_t n), float *dinp,
                       const float *inp, const float *dout, size_t n)
{
    float *i = widen(inp, n), *d = widen(dout, n), *o = xcalloc(n, sizeof *o);
    f32(o, i, d, n);
    narrow(dinp, o, n);
    free(i), free(d);
}

/* att: the tiled kernel's log-sum-exp is fp32 in every activation dtype (backend_cpu_attention.h), written and
 * read in place; the materialized kernel's probabilities are [A]. */
void act_attention_forward(void (*f32)(float *out, float *att, const float *qkv, float *scratch, const int32_t *pos,
                                       int B, int T, int NH, int NKV, int hs, const struct attn_opts *opt),
                           float *out, float *att, const float *qkv, float *scratch, const int32_t *pos, int B, int T,
                           int NH, int NKV, int hs, const struct attn_opts *opt)
{
    const size_t BT = (size_t)B * T, natt = (size_t)B * NH * T * T, C = (size_t)NH * hs;
    const size_t row = (size_t)(NH + 2 * NKV) * hs;
    const int tiled = backend_cpu_attention_kernel() == CPU_ATTENTION_TILED;
    float *q = widen(qkv, BT * row), *o = xcalloc(BT * C, sizeof *o), *p = tiled ? att : xcalloc(natt, sizeof *p);
    f32(o, p, q, scratch, pos, B, T, NH, NKV, hs, opt);
    narrow(out, o, BT * C);
    if (!tiled)
        narrow(att, p, natt);
    free(q);
}

void act_attention_backward(void (*f32)(float *dqkv, const float *dout, const float *qkv, const float *att,
                                        const float *out, float *scratch, const int32_t *pos, int B, int T, int NH,
                                        int NKV, int hs, const struct attn_opts *opt),
                            float *dqkv, const float *dout, const float *qkv, const float *att, const float *out,
                            float *scratch, const int32_t *pos, int B, int T, int NH, int NKV, int hs,
                            const struct attn_opts *opt)
{
    const size_t BT = (size_t)B * T, C = (size_t)NH * hs, row = (size_t)(NH + 2 * NKV) * hs;
    const int tiled = backend_cpu_attention_kernel() == CPU_ATTENTION_TILED;
    float *d = widen(dout, BT * C), *q = widen(qkv, BT * row), *dq = xcalloc(BT * row, sizeof *dq);
    float *p = tiled ? NULL : widen(att, (size_t)B * NH * T * T), *y = tiled ? widen(out, BT * C) : NULL;
    f32(dq, d, q, tiled ? att : p, y, scratch, pos, B, T, NH, NKV, hs, opt);
    narrow(dqkv, dq, BT * row);
    free(d), free(q), free(p), free(y);
}

void act_attention_kv_forward(void (*f32)(float *out, const float *qkv, float *kc, float *vc, const int32_t *past,
                                          const int32_t *keep, int B, int T, int NH, int NKV, int hs, int Tc,
                                          const struct attn_opts *opt),
                              float *out, const float *qkv, float *kc, float *vc, const int32_t *past,
                              const int32_t *keep, int B, int T, int NH, int NKV, int hs, int Tc,
                              const struct attn_opts *opt)
{
    const size_t BT = (size_t)B * T, C = (size_t)NH * hs, row = (size_t)(NH + 2 * NKV) * hs;
    const size_t ncache = (size_t)B * Tc * NKV * hs;
    float *q = widen(qkv, BT * row), *o = xcalloc(BT * C, sizeof *o), *k = widen(kc, ncache), *v = widen(vc, ncache);
    f32(o, q, k, v, past, keep, B, T, NH, NKV, hs, Tc, opt);
    narrow(out, o, BT * C);
    narrow(kc, k, ncache);
    narrow(vc, v, ncache);
    free(q);
}

void act_rmsnorm_forward(void (*f32)(float *out, float *rstd, const float *inp, const float *weight, float offset,
                                     float eps, int N, int C),
                         float *out, float *rstd, const float *inp, const float *weight, float offset, float eps, int N,
                         int C)
{
    float *w = widen(weight, (size_t)C), *x = widen(inp, (size_t)N * C), *o = xcalloc((size_t)N * C, sizeof *o);
    f32(o, rstd, x, w, offset, eps, N, C);
    narrow(out, o, (size_t)N * C);
    free(w), free(x);
}

void act_rmsnorm_backward(void (*f32)(float *dinp, float *dweight, const float *dout, const float *inp,
                                      const float *weight, float offset, const float *rstd, float *scratch, int N,
                                      int C),
                          float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                          float offset, const float *rstd, float *scratch, int N, int C)
{
    float *d = widen(dout, (size_t)N * C), *w = widen(weight, (size_t)C), *x = widen(inp, (size_t)N * C);
    float *di = widen(dinp, (size_t)N * C); /* accumulated: round once, after the += */
    float *dw = grad_begin(dweight, (size_t)C);
    f32(di, dw, d, x, w, offset, rstd, scratch, N, C);
    grad_done(dweight, dw, (size_t)C);
    narrow(dinp, di, (size_t)N * C);
    free(d), free(w), free(x);
}

void act_rope(void (*f32)(float *qkv, const float *cos, const float *sin, const int32_t *pos, int B, int T, int NH,
                          int NKV, int hs, int rot),
              float *x, const float *cos, const float *sin, const int32_t *pos, int B, int T, int NH, int NKV, int hs,
              int rot)
{
    const size_t n = (size_t)B * T * (size_t)(NH + 2 * NKV) * hs;
    float *w = widen(x, n);
    f32(w, cos, sin, pos, B, T, NH, NKV, hs, rot);
    narrow(x, w, n);
}

void act_swiglu_forward(void (*f32)(float *out, const float *gu, int N, int F), float *out, const float *gu, int N,
                        int F)
{
    float *g = widen(gu, (size_t)N * 2 * F), *o = xcalloc((size_t)N * F, sizeof *o);
    f32(o, g, N, F);
    narrow(out, o, (size_t)N * F);
    free(g);
}

void act_swiglu_backward(void (*f32)(float *dgu, const float *dout, const float *gu, int N, int F), float *dgu,
                         const float *dout, const float *gu, int N, int F)
{
    float *g = widen(gu, (size_t)N * 2 * F), *d = widen(dout, (size_t)N * F), *o = xcalloc((size_t)N * 2 * F, sizeof *o);
    f32(o, d, g, N, F);
    narrow(dgu, o, (size_t)N * 2 * F);
    free(g), free(d);
}

void act_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, const int32_t *pos,
                           int B, int T, int C)
{
    float *o = xcalloc((size_t)B * T * C, sizeof *o);
    const int32_t *tok = devemu_host(tokens), *position = devemu_host(pos);
    const char *we = devemu_host(wte), *pe = devemu_host(wpe);
    const size_t es = (size_t)dtype_size(g_act);
    float *row = xcalloc((size_t)2 * C, sizeof *row);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            dtype_convert(row, DTYPE_F32, we + (size_t)tok[(size_t)b * T + t] * C * es, g_act, (size_t)C);
            const size_t p = (size_t)(position ? position[(size_t)b * T + t] : t);
            if (pe) /* no position table: row + C stays zero */
                dtype_convert(row + C, DTYPE_F32, pe + p * C * es, g_act, (size_t)C);
            float *y = o + ((size_t)b * T + t) * C;
            for (int c = 0; c < C; c++)
                y[c] = row[c] + row[C + c];
        }
    free(row);
    narrow(out, o, (size_t)B * T * C);
}

/* Half-precision embedding backward: dout [A] widened; with half-precision
 * gradients ([G]) the rows of dwte up to the largest token are widened too
 * (rounding an untouched row back leaves it as it was), and the first T rows
 * of dwpe (a position is below T). */
void act_embedding_backward(void (*f32)(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                                        const int32_t *pos, int B, int T, int C),
                            float *dwte, float *dwpe, const float *dout, const int32_t *tokens, const int32_t *pos,
                            int B, int T, int C)
{
    float *d = widen(dout, (size_t)B * T * C);
    const int32_t *tok = devemu_host(tokens);
    size_t V = 0;
    for (size_t i = 0; i < (size_t)B * T; i++)
        V = (size_t)tok[i] + 1 > V ? (size_t)tok[i] + 1 : V;
    float *dw = grad_begin(dwte, V * C), *dp = grad_begin(dwpe, (size_t)T * C);
    f32(dw, dp, d, tokens, pos, B, T, C);
    grad_done(dwte, dw, V * C);
    grad_done(dwpe, dp, (size_t)T * C);
    free(d);
}

void act_crossentropy_forward(void (*f32)(float *losses, float *logits, const int32_t *targets, int N, int V, int Vp),
                              float *losses, float *logits, const int32_t *targets, int N, int V, int Vp)
{
    float *l = widen(logits, (size_t)N * Vp);
    f32(losses, l, targets, N, V, Vp);
    narrow(logits, l, (size_t)N * Vp);
}

void act_crossentropy_backward(void (*f32)(float *probs, const int32_t *targets, float dloss, int N, int V, int Vp),
                               float *probs, const int32_t *targets, float dloss, int N, int V, int Vp)
{
    float *p = widen(probs, (size_t)N * Vp);
    f32(p, targets, dloss, N, V, Vp);
    narrow(probs, p, (size_t)N * Vp);
}

void act_crossentropy_backward_rows(void (*f32)(float *probs, const int32_t *targets, const float *dloss, int N,
                                                int V, int Vp),
                                    float *probs, const int32_t *targets, const float *dloss, int N, int V, int Vp)
{
    float *p = widen(probs, (size_t)N * Vp);
    f32(p, targets, dloss, N, V, Vp);
    narrow(probs, p, (size_t)N * Vp);
}

void act_in_place(void (*f32)(float *x, const void *args), float *x, size_t n, const void *args)
{
    float *w = widen(x, n);
    f32(w, args);
    narrow(x, w, n);
}

void act_scale_rows(void (*f32)(float *x, const float *s, int N, int C), float *x, const float *s, int N, int C)
{
    float *w = widen(x, (size_t)N * C);
    f32(w, s, N, C);
    narrow(x, w, (size_t)N * C);
}

void act_bias_forward(void (*f32)(float *out, const float *bias, int N, int OC), float *out, const float *bias, int N,
                      int OC)
{
    float *o = widen(out, (size_t)N * OC), *b = widen(bias, (size_t)OC);
    f32(o, b, N, OC);
    narrow(out, o, (size_t)N * OC);
    free(b);
}

void act_bias_backward(void (*f32)(float *dbias, const float *dout, int N, int OC), float *dbias, const float *dout,
                       int N, int OC)
{
    float *d = widen(dout, (size_t)N * OC), *db = grad_begin(dbias, (size_t)OC);
    f32(db, d, N, OC);
    grad_done(dbias, db, (size_t)OC);
    free(d);
}

void backend_add_act(float *out, const float *a, const float *b, size_t n)
{
    if (g_act == DTYPE_F32) {
        backend_add(out, a, b, n);
        return;
    }
    float *wa = widen(a, n), *wb = widen(b, n), *o = xcalloc(n ? n : 1, sizeof *o);
    backend_add(o, wa, wb, n);
    narrow(out, o, n);
    free(wa), free(wb);
}

/* The elements a strided (N rows of ld, OC columns) [A] slice spans. */
static size_t slice_span(int N, int ld, int OC) { return N ? (size_t)(N - 1) * (size_t)ld + (size_t)OC : 0; }

/* The layers' [A] slices, parts of one fused output (rows of ld), widened
 * into one fp32 copy of the span they cover; *lo: its first element. */
struct lora_span {
    const char *lo;
    size_t n;
    float *wide;
};

static struct lora_out *lora_outs_begin(const struct lora_out *out, int k, int ld, int N, int r, int grads,
                                        struct lora_span *sp)
{
    const size_t es = (size_t)dtype_size(g_act);
    const char *lo = (const char *)out[0].y, *hi = lo;
    for (int j = 0; j < k; j++) {
        const char *a = (const char *)out[j].y, *b = a + slice_span(N, ld, out[j].OC) * es;
        lo = a < lo ? a : lo;
        hi = b > hi ? b : hi;
    }
    sp->lo = lo;
    sp->n = (size_t)(hi - lo) / es;
    sp->wide = widen(lo, sp->n);
    struct lora_out *w = xcalloc((size_t)k, sizeof *w);
    for (int j = 0; j < k; j++) {
        w[j].OC = out[j].OC;
        w[j].y = sp->wide + ((const char *)out[j].y - lo) / es;
        w[j].B = widen(out[j].B, (size_t)out[j].OC * r);
        w[j].dB = grads ? grad_begin(out[j].dB, (size_t)out[j].OC * r) : NULL;
    }
    return w;
}

/* Rounds the span back when the call wrote it (the columns of other layers widen and round back to
 * themselves) and the weight gradients. */
static void lora_outs_done(const struct lora_out *out, struct lora_out *w, int k, int r, struct lora_span *sp,
                           int wrote_y)
{
    if (wrote_y)
        narrow((void *)sp->lo, sp->wide, sp->n);
    else
        free(sp->wide);
    for (int j = 0; j < k; j++) {
        free((void *)w[j].B);
        grad_done(out[j].dB, w[j].dB, (size_t)out[j].OC * r);
    }
    free(w);
}

void act_lora_forward(void (*f32)(float *t, float *scratch, const float *x, const float *A, const struct lora_out *out,
                                  int k, int ld, float scale, const struct lora_dropout *d, int N, int C, int r),
                      float *t, const float *x, const float *A, const struct lora_out *out, int k, int ld, float scale,
                      const struct lora_dropout *d, int N, int C, int r)
{
    const size_t kr = (size_t)k * r;
    struct lora_span sp;
    struct lora_out *w = lora_outs_begin(out, k, ld, N, r, 0, &sp);
    float *xw = widen(x, (size_t)N * C), *a = widen(A, kr * C), *tw = xcalloc((size_t)N * kr + 1, sizeof *tw);
    float *scratch = d && d->p > 0.0f ? xcalloc((size_t)N * C + 1, sizeof *scratch) : NULL;
    f32(tw, scratch, xw, a, w, k, ld, scale, d, N, C, r);
    lora_outs_done(out, w, k, r, &sp, 1);
    narrow(t, tw, (size_t)N * kr);
    free(xw), free(a), free(scratch);
}

void act_lora_backward(void (*f32)(float *dx, float *dA, float *dt, float *scratch, const float *x, const float *t,
                                   const float *A, const struct lora_out *out, int k, int ld, float scale,
                                   const struct lora_dropout *d, int N, int C, int r),
                       float *dx, float *dA, const float *x, const float *t, const float *A, const struct lora_out *out,
                       int k, int ld, float scale, const struct lora_dropout *d, int N, int C, int r)
{
    const size_t kr = (size_t)k * r;
    struct lora_span sp;
    struct lora_out *w = lora_outs_begin(out, k, ld, N, r, 1, &sp);
    float *xw = widen(x, (size_t)N * C), *tw = widen(t, (size_t)N * kr), *a = widen(A, kr * C);
    float *dxw = widen(dx, (size_t)N * C), *da = grad_begin(dA, kr * C), *dt = xcalloc((size_t)N * kr + 1, sizeof *dt);
    float *scratch = d && d->p > 0.0f ? xcalloc((size_t)N * C + 1, sizeof *scratch) : NULL;
    f32(dxw, da, dt, scratch, xw, tw, a, w, k, ld, scale, d, N, C, r);
    lora_outs_done(out, w, k, r, &sp, 0);
    grad_done(dA, da, kr * C);
    narrow(dx, dxw, (size_t)N * C);
    free(xw), free(tw), free(a), free(dt), free(scratch);
}
