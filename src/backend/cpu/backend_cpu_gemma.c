/*
 * backend_cpu_gemma — the CPU kernels Gemma brings (backend.h): GeGLU with
 * the tanh GELU, the scaling of activations, and the final logits'
 * soft-capping with its cross-entropy backward. fp32 kernels, each run on
 * half-precision activations through backend_cpu_act's wrappers.
 */
#include "backend/backend.h"

#include <math.h>
#include <string.h>

#include "core/devemu.h"
#include "core/fastmath.h"

#include "backend_cpu_act.h"

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi), transformers' gelu_pytorch_tanh */
#define GELU_CUBE 0.044715f

static inline float gelu_tanh(float x, float *grad)
{
    const float th = fast_tanhf(GELU_SCALE * (x + GELU_CUBE * x * x * x));
    *grad = 0.5f * (1.0f + th) + x * 0.5f * (1.0f - th * th) * GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
    return 0.5f * x * (1.0f + th);
}

static void f32_geglu_forward(float *out, const float *gu, int N, int F)
{
    DEVEMU_VIEW(out);
    DEVEMU_VIEW(gu);
#pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float *g = gu + (size_t)i * 2 * F, *u = g + F;
        float *y = out + (size_t)i * F;
        for (int j = 0; j < F; j++) {
            float unused;
            y[j] = gelu_tanh(g[j], &unused) * u[j];
        }
    }
}

static void f32_geglu_backward(float *dgu, const float *dout, const float *gu, int N, int F)
{
    DEVEMU_VIEW(dgu);
    DEVEMU_VIEW(dout);
    DEVEMU_VIEW(gu);
#pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float *g = gu + (size_t)i * 2 * F, *u = g + F, *dy = dout + (size_t)i * F;
        float *dg = dgu + (size_t)i * 2 * F, *du = dg + F;
        for (int j = 0; j < F; j++) {
            float grad, gelu = gelu_tanh(g[j], &grad);
            du[j] = dy[j] * gelu;
            dg[j] = dy[j] * u[j] * grad;
        }
    }
}

void backend_geglu_forward(float *out, const float *gu, int N, int F)
{
    ACT_DISPATCH(act_swiglu_forward(f32_geglu_forward, out, gu, N, F));
    f32_geglu_forward(out, gu, N, F);
}

void backend_geglu_backward(float *dgu, const float *dout, const float *gu, int N, int F)
{
    ACT_DISPATCH(act_swiglu_backward(f32_geglu_backward, dgu, dout, gu, N, F));
    f32_geglu_backward(dgu, dout, gu, N, F);
}

struct scale_args {
    float s;
    size_t n;
};

static void f32_scale(float *x, const void *args)
{
    const struct scale_args *a = args;
    DEVEMU_VIEW(x);
#pragma omp parallel for simd
    for (size_t i = 0; i < a->n; i++)
        x[i] *= a->s;
}

void backend_scale_act(float *x, float s, size_t n)
{
    const struct scale_args a = {s, n};
    ACT_DISPATCH(act_in_place(f32_scale, x, n, &a));
    f32_scale(x, &a);
}

struct softcap_args {
    float *lse;
    const int32_t *targets;
    float cap, dloss;
    const float *dloss_rows;
    int N, V, Vp;
};

/* tanh from libm, not fast_tanhf: its absolute error of 3e-7 would be a large relative one on small logits */
static void f32_softcap_forward(float *logits, const void *args)
{
    const struct softcap_args *a = args;
    DEVEMU_VIEW(logits);
    float *lse = a->lse;
    DEVEMU_VIEW(lse);
#pragma omp parallel for
    for (int i = 0; i < a->N; i++) {
        float *row = logits + (size_t)i * a->Vp, mx = -INFINITY;
        for (int j = 0; j < a->V; j++) {
            row[j] = a->cap * tanhf(row[j] / a->cap);
            mx = row[j] > mx ? row[j] : mx;
        }
        float sum = 0.0f;
        for (int j = 0; j < a->V; j++)
            sum += expf(row[j] - mx);
        if (lse)
            lse[i] = mx + logf(sum);
    }
}

void backend_logit_softcap_forward(float *logits, float *lse, float cap, int N, int V, int Vp)
{
    const struct softcap_args a = {lse, NULL, cap, 0.0f, NULL, N, V, Vp};
    ACT_DISPATCH(act_in_place(f32_softcap_forward, logits, (size_t)N * Vp, &a));
    f32_softcap_forward(logits, &a);
}

static void f32_softcap_backward(float *probs, const void *args)
{
    const struct softcap_args *a = args;
    const int32_t *targets = a->targets;
    const float *rows = a->dloss_rows, *lse = a->lse;
    DEVEMU_VIEW(probs);
    DEVEMU_VIEW(targets);
    DEVEMU_VIEW(rows);
    DEVEMU_VIEW(lse);
#pragma omp parallel for
    for (int i = 0; i < a->N; i++) {
        float *row = probs + (size_t)i * a->Vp;
        if (targets[i] < 0) {
            memset(row, 0, (size_t)a->Vp * sizeof *row);
            continue;
        }
        const float d = rows ? rows[i] : a->dloss;
        for (int j = 0; j < a->V; j++) {
            const float p = row[j];
            /* a probability that underflowed has no gradient left to scale: its y is taken at the cap */
            const float t = p > 0.0f ? (logf(p) + lse[i]) / a->cap : 1.0f;
            row[j] = (p - (j == targets[i] ? 1.0f : 0.0f)) * d * (1.0f - t * t);
        }
        for (int j = a->V; j < a->Vp; j++)
            row[j] = 0.0f;
    }
}

void backend_crossentropy_softcap_backward(float *probs, const int32_t *targets, float dloss, const float *dloss_rows,
                                           const float *lse, float cap, int N, int V, int Vp)
{
    const struct softcap_args a = {(float *)lse, targets, cap, dloss, dloss_rows, N, V, Vp};
    ACT_DISPATCH(act_in_place(f32_softcap_backward, probs, (size_t)N * Vp, &a));
    f32_softcap_backward(probs, &a);
}
