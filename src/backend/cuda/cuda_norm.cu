/*
 * CUDA backend, normalisations: layernorm (GPT-2) and RMSNorm (Llama), one warp per row, the
 * weight and bias gradients in two fixed-order stages (cuda_matmul.cu's column_sums_finish).
 */
#include "cuda_internal.h"

#define LAYERNORM_EPS 1e-5f /* GPT-2's layer_norm_epsilon */

/* ---- layernorm and RMSNorm -------------------------------------------------------------- */

__device__ static float warp_sum(float v)
{
    for (int o = WARP / 2; o > 0; o /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The two normalisations share their kernels: mean non-NULL is layernorm (centred, bias), mean NULL is RMSNorm
 * (norm = x rstd, no bias). */

/* One warp per row; statistics in fp32 (layernorm: two passes over the row, mean then variance; RMSNorm: the mean
 * square). inp, out [A]. */
template <typename A>
__global__ static void norm_forward_kernel(A *out, float *mean, float *rstd, const A *inp, const A *weight,
                                           const A *bias, float offset, float eps, int N, int C)
{
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= N)
        return;
    const A *x = inp + (size_t)row * C;
    float m = 0.0f;
    if (mean) {
        float s = 0.0f;
        for (int c = lane; c < C; c += WARP)
            s += ld(x, c);
        m = warp_sum(s) / C;
    }
    float v = 0.0f;
    for (int c = lane; c < C; c += WARP)
        v += (ld(x, c) - m) * (ld(x, c) - m);
    float r = rsqrtf(warp_sum(v) / C + eps);
    for (int c = lane; c < C; c += WARP) {
        const float y = (ld(x, c) - m) * r * (offset + ld(weight, c)); /* Gemma: (1 + w) in fp32 */
        st(out, (size_t)row * C + c, bias ? y + ld(bias, c) : y);
    }
    if (lane == 0) {
        if (mean)
            mean[row] = m;
        rstd[row] = r;
    }
}

static void norm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                         const float *bias, float offset, float eps, int N, int C)
{
    int rows_per_block = BLOCK / WARP;
    WITH_ACT(norm_forward_kernel<A><<<(N + rows_per_block - 1) / rows_per_block, BLOCK, 0, g_stream>>>(
        (A *)out, mean, rstd, (const A *)inp, (const A *)weight, (const A *)bias, offset, eps, N, C));
}

extern "C" void backend_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                          const float *weight, const float *bias, int N, int C)
{
    norm_forward(out, mean, rstd, inp, weight, bias, 0.0f, LAYERNORM_EPS, N, C);
}

extern "C" void backend_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, float eps,
                                        int N, int C)
{
    norm_forward(out, NULL, rstd, inp, weight, NULL, 0.0f, eps, N, C);
}

extern "C" void backend_rmsnorm_offset_forward(float *out, float *rstd, const float *inp, const float *weight,
                                               float offset, float eps, int N, int C)
{
    norm_forward(out, NULL, rstd, inp, weight, NULL, offset, eps, N, C);
}

/* dinp += (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd, dnorm = dout * weight; one warp per row.
 * RMSNorm (mean NULL): without the mean(dnorm) term, which the centring brings. */
template <typename A>
__global__ static void norm_backward_input(A *dinp, const A *dout, const A *inp, const A *weight, float offset,
                                           const float *mean, const float *rstd, int N, int C)
{
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= N)
        return;
    const size_t at = (size_t)row * C;
    const A *x = inp + at;
    float m = mean ? mean[row] : 0.0f, r = rstd[row], a = 0.0f, b = 0.0f;
    for (int c = lane; c < C; c += WARP) {
        float dnorm = ld(dout, at + c) * (offset + ld(weight, c));
        a += dnorm;
        b += dnorm * (ld(x, c) - m) * r;
    }
    a = mean ? warp_sum(a) / C : 0.0f;
    b = warp_sum(b) / C;
    for (int c = lane; c < C; c += WARP) {
        float norm = (ld(x, c) - m) * r;
        st(dinp, at + c, ld(dinp, at + c) + (ld(dout, at + c) * (offset + ld(weight, c)) - a - norm * b) * r);
    }
}

/* Stage 1 of dweight[c] += sum_rows dout * norm and (layernorm) dbias[c] += sum_rows dout:
 * per row chunk, in row order, into partial[chunk][c] and partial[chunks + chunk][c]. */
template <typename A>
__global__ static void norm_backward_params(float *partial, const A *dout, const A *inp, const float *mean,
                                            const float *rstd, int N, int C, int chunks)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (c >= C)
        return;
    int r0 = (int)((long)N * chunk / chunks), r1 = (int)((long)N * (chunk + 1) / chunks);
    float dw = 0.0f, db = 0.0f;
    for (int i = r0; i < r1; i++) {
        float dy = ld(dout, (size_t)i * C + c);
        dw += dy * (ld(inp, (size_t)i * C + c) - (mean ? mean[i] : 0.0f)) * rstd[i];
        db += dy;
    }
    partial[(size_t)chunk * C + c] = dw;
    if (mean)
        partial[(size_t)(chunks + chunk) * C + c] = db;
}

/* dinp [A] +=, dweight [G] +=, dbias [G] += (layernorm: mean and dbias non-NULL; RMSNorm: both NULL);
 * dweight NULL (frozen weights): the input gradient only. */
static void norm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                          const float *weight, float offset, const float *mean, const float *rstd, int N, int C)
{
    int rows_per_block = BLOCK / WARP;
    WITH_ACT({
        norm_backward_input<A><<<(N + rows_per_block - 1) / rows_per_block, BLOCK, 0, g_stream>>>(
            (A *)dinp, (const A *)dout, (const A *)inp, (const A *)weight, offset, mean, rstd, N, C);
    });
    if (!dweight)
        return;
    int chunks = colsum_chunks(N, C, dbias ? 2 : 1);
    dim3 grid((C + BLOCK - 1) / BLOCK, chunks);
    WITH_ACT(norm_backward_params<A><<<grid, BLOCK, 0, g_stream>>>(g_colsum, (const A *)dout, (const A *)inp, mean,
                                                                    rstd, N, C, chunks));
    column_sums_finish<<<(C + BLOCK - 1) / BLOCK, BLOCK, 0, g_stream>>>(dweight, g_grad, g_colsum, C, chunks);
    if (dbias)
        column_sums_finish<<<(C + BLOCK - 1) / BLOCK, BLOCK, 0, g_stream>>>(dbias, g_grad,
                                                                             g_colsum + (size_t)chunks * C, C, chunks);
}

extern "C" void backend_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                           const float *inp, const float *weight, const float *mean,
                                           const float *rstd, float *scratch, int N, int C)
{
    (void)scratch;
    norm_backward(dinp, dweight, dbias, dout, inp, weight, 0.0f, mean, rstd, N, C);
}

extern "C" void backend_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                         const float *weight, const float *rstd, float *scratch, int N, int C)
{
    (void)scratch;
    norm_backward(dinp, dweight, NULL, dout, inp, weight, 0.0f, NULL, rstd, N, C);
}

/* dweight's sums are the same with the offset: d(offset + w) / dw = 1 */
extern "C" void backend_rmsnorm_offset_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                                const float *weight, float offset, const float *rstd, float *scratch,
                                                int N, int C)
{
    (void)scratch;
    norm_backward(dinp, dweight, NULL, dout, inp, weight, offset, NULL, rstd, N, C);
}

extern "C" size_t backend_layernorm_scratch(int C)
{
    (void)C;
    return 0;
}

