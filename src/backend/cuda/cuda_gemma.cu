/*
 * CUDA backend, the kernels Gemma brings (backend.h): GeGLU with the tanh
 * GELU, the scaling of activations, and the final logits' soft-capping with
 * its cross-entropy backward. The (1 + w) RMSNorm is cuda_norm.cu's with an
 * offset.
 */
#include "cuda_internal.h"

#define GEGLU_SCALE 0.7978845608028654f /* sqrt(2 / pi), gelu_pytorch_tanh */
#define GEGLU_CUBE 0.044715f

__device__ static float gelu_tanh(float x, float *grad)
{
    const float t = tanhf(GEGLU_SCALE * (x + GEGLU_CUBE * x * x * x));
    *grad = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GEGLU_SCALE * (1.0f + 3.0f * GEGLU_CUBE * x * x);
    return 0.5f * x * (1.0f + t);
}

/* out (N, F) = gelu(gate) * up, gu (N, 2F) = [gate | up]; one thread per (row, f). */
template <typename A> __global__ static void geglu_forward_kernel(A *out, const A *gu, int N, int F)
{
    const size_t n = (size_t)N * F;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t gate = i / F * 2 * F + i % F;
        float unused;
        st(out, i, gelu_tanh(ld(gu, gate), &unused) * ld(gu, gate + F));
    }
}

/* d gate = dout * up * gelu'(gate); d up = dout * gelu(gate). A thread reads both inputs before it writes. */
template <typename A> __global__ static void geglu_backward_kernel(A *dgu, const A *dout, const A *gu, int N, int F)
{
    const size_t n = (size_t)N * F;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t gate = i / F * 2 * F + i % F;
        float grad;
        const float u = ld(gu, gate + F), dy = ld(dout, i), gelu = gelu_tanh(ld(gu, gate), &grad);
        st(dgu, gate, dy * u * grad);
        st(dgu, gate + F, dy * gelu);
    }
}

extern "C" void backend_geglu_forward(float *out, const float *gu, int N, int F)
{
    WITH_ACT(geglu_forward_kernel<A><<<blocks_for((size_t)N * F, BLOCK), BLOCK, 0, g_stream>>>((A *)out,
                                                                                               (const A *)gu, N, F));
}

extern "C" void backend_geglu_backward(float *dgu, const float *dout, const float *gu, int N, int F)
{
    WITH_ACT(geglu_backward_kernel<A><<<blocks_for((size_t)N * F, BLOCK), BLOCK, 0, g_stream>>>(
        (A *)dgu, (const A *)dout, (const A *)gu, N, F));
}

template <typename A> __global__ static void scale_act_kernel(A *x, float s, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        st(x, i, ld(x, i) * s);
}

extern "C" void backend_scale_act(float *x, float s, size_t n)
{
    WITH_ACT(scale_act_kernel<A><<<blocks_for(n, BLOCK), BLOCK, 0, g_stream>>>((A *)x, s, n));
}

/* One block per row: y = cap tanh(z / cap) over the first V columns, in place, and the row's log-sum-exp of y
 * (lse NULL: none). */
template <typename A> __global__ static void softcap_forward_kernel(A *logits, float *lse, float cap, int V, int Vp)
{
    A *x = logits + (size_t)blockIdx.x * Vp;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        const float y = cap * tanhf(ld(x, j) / cap);
        st(x, j, y);
        m = fmaxf(m, ld(x, j)); /* the stored value: what the cross-entropy reads */
    }
    m = block_reduce(m, true);
    float s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        s += expf(ld(x, j) - m);
    s = block_reduce(s, false);
    if (lse && threadIdx.x == 0)
        lse[blockIdx.x] = m + logf(s);
}

extern "C" void backend_logit_softcap_forward(float *logits, float *lse, float cap, int N, int V, int Vp)
{
    WITH_ACT(softcap_forward_kernel<A><<<N, BLOCK, 0, g_stream>>>((A *)logits, lse, cap, V, Vp));
}

/* dz = (p - onehot) d (1 - (y / cap)^2), y = log p + lse; an underflowed p: y at the cap (no gradient left). */
template <typename A>
__global__ static void softcap_backward_kernel(A *probs, const int32_t *targets, float dloss, const float *row_dloss,
                                               const float *lse, float cap, int V, int Vp)
{
    A *p = probs + (size_t)blockIdx.x * Vp;
    const int target = targets[blockIdx.x];
    const float d = row_dloss ? row_dloss[blockIdx.x] : dloss, l = lse[blockIdx.x];
    for (int j = threadIdx.x; j < Vp; j += blockDim.x) {
        const float pj = ld(p, j), t = pj > 0.0f ? (logf(pj) + l) / cap : 1.0f;
        st(p, j, j < V && target >= 0 ? (pj - (j == target ? 1.0f : 0.0f)) * d * (1.0f - t * t) : 0.0f);
    }
}

extern "C" void backend_crossentropy_softcap_backward(float *probs, const int32_t *targets, float dloss,
                                                      const float *dloss_rows, const float *lse, float cap, int N,
                                                      int V, int Vp)
{
    WITH_ACT(softcap_backward_kernel<A><<<N, BLOCK, 0, g_stream>>>((A *)probs, targets, dloss, dloss_rows, lse, cap,
                                                                    V, Vp));
}
