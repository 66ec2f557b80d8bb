/*
 * CUDA backend, element-wise kernels: GELU, the residual adds, scale and zero, and Llama's rotary
 * position embedding and SwiGLU.
 */
#include "cuda_internal.h"

/* ---- element-wise ---------------------------------------------------------------------- */

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */

template <typename A> __global__ static void gelu_forward_kernel(A *out, const A *inp, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = ld(inp, i);
        st(out, i, 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x))));
    }
}

template <typename A> __global__ static void gelu_backward_kernel(A *dinp, const A *inp, const A *dout, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = ld(inp, i), u = GELU_SCALE * (x + 0.044715f * x * x * x), t = tanhf(u);
        float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        st(dinp, i, (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du) * ld(dout, i));
    }
}

/* out = a + b, b in B (float for backend_add, [A] for backend_add_act). */
template <typename B> __global__ static void add_kernel(float *out, const float *a, const B *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + ld(b, i);
}

__global__ static void scale_kernel(float *x, float s, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

extern "C" void backend_gelu_forward(float *out, const float *inp, size_t n)
{
    WITH_ACT(gelu_forward_kernel<A><<<blocks_for(n, BLOCK), BLOCK, 0, g_stream>>>((A *)out, (const A *)inp, n));
}

extern "C" void backend_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    WITH_ACT(gelu_backward_kernel<A><<<blocks_for(n, BLOCK), BLOCK, 0, g_stream>>>((A *)dinp, (const A *)inp,
                                                                                  (const A *)dout, n));
}

extern "C" void backend_add(float *out, const float *a, const float *b, size_t n)
{
    order_host(out, n * sizeof *out), order_host(a, n * sizeof *a), order_host(b, n * sizeof *b);
    add_kernel<float><<<blocks_for(n, BLOCK), BLOCK, 0, g_stream>>>(out, a, b, n);
}

/* out [A] = a [A] + b [A], added in fp32, rounded once. */
template <typename A> __global__ static void add_act_kernel(A *out, const A *a, const A *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        st(out, i, ld(a, i) + ld(b, i));
}

extern "C" void backend_add_act(float *out, const float *a, const float *b, size_t n)
{
    WITH_ACT(add_act_kernel<A><<<blocks_for(n, BLOCK), BLOCK, 0, g_stream>>>((A *)out, (const A *)a, (const A *)b, n));
}

extern "C" void backend_scale(float *x, float s, size_t n)
{
    order_host(x, n * sizeof *x);
    scale_kernel<<<blocks_for(n, BLOCK), BLOCK, 0, g_stream>>>(x, s, n);
}

__global__ void zero_kernel(float *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = 0.0f;
}

/* A kernel rather than cudaMemsetAsync: x may be mapped pinned host memory. */
template <typename A> __global__ static void scale_rows_kernel(A *x, const float *s, int C, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        st(x, i, ld(x, i) * s[i / C]);
}

extern "C" void backend_scale_rows(float *x, const float *s, int N, int C)
{
    const size_t n = (size_t)N * C;
    WITH_ACT(scale_rows_kernel<A><<<blocks_for(n, BLOCK), BLOCK, 0, g_stream>>>((A *)x, s, C, n));
}

extern "C" void backend_zero(float *x, size_t n)
{
    order_host(x, n * sizeof *x);
    if (n)
        zero_kernel<<<blocks_for(n, BLOCK), BLOCK, 0, g_stream>>>(x, n);
}

/* ---- rotary position embedding and SwiGLU (Llama) ---------------------------------------------- */

/* Rotate-half rotary embedding in place on the first NH + NKV heads of each (NH + 2 NKV) hs row of x [A], over each
 * head's first rot channels (the others pass through): thread per (row, head, i < rot / 2) rotates the pair
 * (i, i + rot / 2) by the angle of (p, i), p = pos[row] (t without positions); sin_sign -1 rotates back (the
 * backward: the transpose of a rotation is its inverse). */
template <typename A>
__global__ static void rope_kernel(A *x, const float *cos, const float *sin, const int32_t *pos, float sin_sign,
                                   int BT, int T, int heads, int width, int hs, int rot)
{
    const int half = rot / 2;
    const size_t n = (size_t)BT * heads * half;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n; k += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(k % half), head = (int)(k / half % heads);
        const size_t bt = k / half / heads;
        const int t = pos ? pos[bt] : (int)(bt % T);
        const size_t at = bt * width + (size_t)head * hs + i;
        const float c = cos[(size_t)t * half + i], s = sin_sign * sin[(size_t)t * half + i];
        const float x0 = ld(x, at), x1 = ld(x, at + half);
        st(x, at, x0 * c - x1 * s);
        st(x, at + half, x1 * c + x0 * s);
    }
}

static void rope(float *x, const float *cos, const float *sin, const int32_t *pos, float sin_sign, int B, int T, int NH,
                 int NKV, int hs, int rot)
{
    if (rot < 2 || rot > hs || rot % 2)
        fail_input("rotary embedding over %d of a head's %d channels: it takes an even number, 2 to the head size",
                   rot, hs);
    const size_t n = (size_t)B * T * (NH + NKV) * (rot / 2);
    WITH_ACT(rope_kernel<A><<<blocks_for(n, BLOCK), BLOCK, 0, g_stream>>>((A *)x, cos, sin, pos, sin_sign, B * T, T,
                                                                          NH + NKV, (NH + 2 * NKV) * hs, hs, rot));
}

extern "C" void backend_rope_forward(float *qkv, const float *cos, const float *sin, const int32_t *pos, int B, int T,
                                     int NH, int NKV, int hs, int rot)
{
    rope(qkv, cos, sin, pos, 1.0f, B, T, NH, NKV, hs, rot);
}

extern "C" void backend_rope_backward(float *dqkv, const float *cos, const float *sin, const int32_t *pos, int B, int T,
                                      int NH, int NKV, int hs, int rot)
{
    rope(dqkv, cos, sin, pos, -1.0f, B, T, NH, NKV, hs, rot);
}

__device__ static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* out (N, F) = silu(gate) * up, gu (N, 2F) = [gate | up]; one thread per (row, f). */
template <typename A> __global__ static void swiglu_forward_kernel(A *out, const A *gu, int N, int F)
{
    const size_t n = (size_t)N * F;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t gate = i / F * 2 * F + i % F;
        const float g = ld(gu, gate);
        st(out, i, g / (1.0f + expf(-g)) * ld(gu, gate + F));
    }
}

/* d gate = dout * up * silu'(gate), silu'(x) = sigmoid(x) (1 + x (1 - sigmoid(x))); d up = dout * silu(gate). A
 * thread reads both of its inputs before it writes, so dgu may be gu. */
template <typename A> __global__ static void swiglu_backward_kernel(A *dgu, const A *dout, const A *gu, int N, int F)
{
    const size_t n = (size_t)N * F;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t gate = i / F * 2 * F + i % F;
        const float g = ld(gu, gate), u = ld(gu, gate + F), dy = ld(dout, i), sg = sigmoid(g);
        st(dgu, gate, dy * u * sg * (1.0f + g * (1.0f - sg)));
        st(dgu, gate + F, dy * g * sg);
    }
}

template <typename A>
__global__ static void copy_cols_kernel(A *dst, int dst_ld, int dst_col, const A *src, int src_ld, int src_col, int N,
                                        int width)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x, n = (size_t)N * width;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / (size_t)width, c = i % (size_t)width;
        dst[r * dst_ld + dst_col + c] = src[r * src_ld + src_col + c];
    }
}

extern "C" void backend_copy_cols(float *dst, int dst_ld, int dst_col, const float *src, int src_ld, int src_col,
                                  int N, int width)
{
    WITH_ACT(copy_cols_kernel<A><<<blocks_for((size_t)N * width, BLOCK), BLOCK, 0, g_stream>>>(
        (A *)dst, dst_ld, dst_col, (const A *)src, src_ld, src_col, N, width));
}

extern "C" void backend_swiglu_forward(float *out, const float *gu, int N, int F)
{
    WITH_ACT(swiglu_forward_kernel<A><<<blocks_for((size_t)N * F, BLOCK), BLOCK, 0, g_stream>>>((A *)out,
                                                                                                (const A *)gu, N, F));
}

extern "C" void backend_swiglu_backward(float *dgu, const float *dout, const float *gu, int N, int F)
{
    WITH_ACT(swiglu_backward_kernel<A><<<blocks_for((size_t)N * F, BLOCK), BLOCK, 0, g_stream>>>(
        (A *)dgu, (const A *)dout, (const A *)gu, N, F));
}

