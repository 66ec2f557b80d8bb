/*
 * CUDA backend, normalisations: layernorm (GPT-2) and RMSNorm (Llama). The forward: one warp per row (16-byte
 * vectors where rows are aligned).
 * The backward: one fused pass where rows are 16-byte aligned and not too wide (norm_backward_fused), else one
 * warp per row for the input gradient and a column pass for the weight and bias gradients; either way the
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

/* 16 bytes of [A] elements, loaded and stored as one vector. */
template <typename A>
struct __align__(16) vec16 {
    A e[16 / sizeof(A)];
};

template <typename A>
__device__ __forceinline__ void ld_vec(float *out, const A *p, size_t i)
{
    const vec16<A> v = *(const vec16<A> *)(p + i);
    for (int k = 0; k < (int)(16 / sizeof(A)); k++)
        out[k] = ld(v.e, k);
}

template <typename A>
__device__ __forceinline__ void st_vec(A *p, size_t i, const float *x)
{
    vec16<A> v;
    for (int k = 0; k < (int)(16 / sizeof(A)); k++)
        st(v.e, k, x[k]);
    *(vec16<A> *)(p + i) = v;
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

/* The same with 16-byte vectors (C a multiple of V = 16 / sizeof(A), rows aligned): the statistics in another
 * order of the same fp32 sums. */
template <typename A>
__global__ static void norm_forward_vec(A *out, float *mean, float *rstd, const A *inp, const A *weight,
                                        const A *bias, float offset, float eps, int N, int C)
{
    constexpr int V = 16 / sizeof(A);
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= N)
        return;
    const size_t at = (size_t)row * C;
    float x[V], m = 0.0f, v = 0.0f;
    if (mean) {
        float s = 0.0f;
        for (int c = lane * V; c < C; c += WARP * V) {
            ld_vec(x, inp, at + c);
            for (int k = 0; k < V; k++)
                s += x[k];
        }
        m = warp_sum(s) / C;
    }
    for (int c = lane * V; c < C; c += WARP * V) {
        ld_vec(x, inp, at + c);
        for (int k = 0; k < V; k++)
            v += (x[k] - m) * (x[k] - m);
    }
    float r = rsqrtf(warp_sum(v) / C + eps);
    for (int c = lane * V; c < C; c += WARP * V) {
        float w[V], b[V], y[V];
        ld_vec(x, inp, at + c);
        ld_vec(w, weight, c);
        if (bias)
            ld_vec(b, bias, c);
        for (int k = 0; k < V; k++)
            y[k] = (x[k] - m) * r * (offset + w[k]) + (bias ? b[k] : 0.0f);
        st_vec(out, at + c, y);
    }
    if (lane == 0) {
        if (mean)
            mean[row] = m;
        rstd[row] = r;
    }
}

/* Whether the [A] rows of width C and these pointers take 16-byte vectors. */
static bool norm_vectors(int C, const void *a, const void *b, const void *c, const void *d)
{
    const int V = (int)(16 / dtype_size(g_act));
    return C % V == 0 && !(((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d) & 15);
}

static void norm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                         const float *bias, float offset, float eps, int N, int C)
{
    int rows_per_block = BLOCK / WARP;
    if (norm_vectors(C, out, inp, weight, bias)) {
        WITH_ACT(norm_forward_vec<A><<<(N + rows_per_block - 1) / rows_per_block, BLOCK, 0, g_stream>>>(
            (A *)out, mean, rstd, (const A *)inp, (const A *)weight, (const A *)bias, offset, eps, N, C));
        return;
    }
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

/* ---- the fused backward: one pass over the rows for the input gradient and the weight (and bias) gradients ----
 *
 * The two kernels above read x and dout three times between them (twice per row for dinp, once more per column
 * for dweight). This one reads each once: a block takes a contiguous range of rows (a chunk) and walks it in row
 * order, every thread owning the same columns on every row, 16-byte vectors of [A] (8 bf16/fp16 or 4 fp32
 * elements) at columns (g BLOCK + tid) V for g < G; the row's two sums are one block reduction; each thread keeps
 * its columns' weight (and bias) gradient sums in registers and writes them at the end as the chunk's partials,
 * which column_sums_finish adds in chunk order, as before. Fixed order everywhere: deterministic. Used when C is a
 * multiple of V, every row starts 16-byte aligned, and C <= NORM_FUSED_GROUPS BLOCK V; SHARDLM_NORM_UNFUSED=1 takes
 * the two kernels anyway (to time the two side by side). */
#define NORM_FUSED_GROUPS 8
#define NORM_FUSED_MAX_CHUNKS 256 /* blocks: enough to fill an H100/H200 (132 SMs) twice */

/* The block's sums of a and b (BLOCK threads), in a fixed order; every thread gets them. */
__device__ static inline void block_sum2(float *a, float *b)
{
    __shared__ float sa[BLOCK / WARP], sb[BLOCK / WARP];
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    float x = warp_sum(*a), y = warp_sum(*b);
    __syncthreads(); /* the previous row's readers are done with sa, sb */
    if (lane == 0)
        sa[warp] = x, sb[warp] = y;
    __syncthreads();
    x = y = 0.0f;
    for (int w = 0; w < BLOCK / WARP; w++)
        x += sa[w], y += sb[w];
    *a = x, *b = y;
}

/* partial NULL: the input gradient only. */
template <typename A, int G>
__global__ static void __launch_bounds__(BLOCK) norm_backward_fused(A *dinp, float *partial, const A *dout,
                                                                    const A *inp, const A *weight, float offset,
                                                                    const float *mean, const float *rstd, int N, int C,
                                                                    int chunks)
{
    constexpr int V = 16 / sizeof(A);
    const int chunk = blockIdx.x;
    const int r0 = (int)((long)N * chunk / chunks), r1 = (int)((long)N * (chunk + 1) / chunks);
    float w[G][V], dw[G][V], db[G][V];
    for (int g = 0; g < G; g++) {
        const int c = (g * BLOCK + threadIdx.x) * V;
        for (int k = 0; k < V; k++)
            w[g][k] = 0.0f, dw[g][k] = 0.0f, db[g][k] = 0.0f;
        if (c < C)
            ld_vec(w[g], weight, c);
        for (int k = 0; k < V; k++)
            w[g][k] += offset; /* Gemma's (1 + w); the weight gradient is the same */
    }
    for (int row = r0; row < r1; row++) {
        const size_t at = (size_t)row * C;
        const float m = mean ? mean[row] : 0.0f, r = rstd[row];
        float x[G][V], dy[G][V], a = 0.0f, b = 0.0f;
        for (int g = 0; g < G; g++) {
            const int c = (g * BLOCK + threadIdx.x) * V;
            for (int k = 0; k < V; k++)
                x[g][k] = 0.0f, dy[g][k] = 0.0f;
            if (c >= C)
                continue;
            ld_vec(x[g], inp, at + c);
            ld_vec(dy[g], dout, at + c);
            for (int k = 0; k < V; k++) {
                x[g][k] = (x[g][k] - m) * r; /* norm */
                const float dnorm = dy[g][k] * w[g][k];
                a += dnorm;
                b += dnorm * x[g][k];
            }
        }
        block_sum2(&a, &b);
        a = mean ? a / C : 0.0f;
        b /= C;
        for (int g = 0; g < G; g++) {
            const int c = (g * BLOCK + threadIdx.x) * V;
            if (c >= C)
                continue;
            float d[V];
            ld_vec(d, dinp, at + c);
            for (int k = 0; k < V; k++) {
                d[k] += (dy[g][k] * w[g][k] - a - x[g][k] * b) * r;
                dw[g][k] += dy[g][k] * x[g][k];
                db[g][k] += dy[g][k];
            }
            st_vec(dinp, at + c, d);
        }
    }
    if (!partial)
        return;
    for (int g = 0; g < G; g++) {
        const int c = (g * BLOCK + threadIdx.x) * V;
        if (c >= C)
            continue;
        for (int k = 0; k < V; k++) {
            partial[(size_t)chunk * C + c + k] = dw[g][k];
            if (mean)
                partial[(size_t)(chunks + chunk) * C + c + k] = db[g][k];
        }
    }
}

/* The fused backward's vector groups per thread for this row width and these pointers (0: not usable). */
static int norm_fused_groups(const void *dinp, const void *dout, const void *inp, const void *weight, int C)
{
    const int V = (int)(16 / dtype_size(g_act));
    if (getenv("SHARDLM_NORM_UNFUSED") || !norm_vectors(C, dinp, dout, inp, weight))
        return 0;
    const int need = (C / V + BLOCK - 1) / BLOCK;
    return need <= 1 ? 1 : need <= 2 ? 2 : need <= 4 ? 4 : need <= NORM_FUSED_GROUPS ? 8 : 0;
}

/* Rows per chunk of the fused backward: as many chunks as the column-sum buffer holds, up to NORM_FUSED_MAX_CHUNKS
 * (a function of N and C alone, so the sums' order is the same on every GPU). */
static int norm_fused_chunks(int N, int C, int sums)
{
    size_t fit = COLSUM_FLOATS / ((size_t)C * sums);
    int chunks = fit < NORM_FUSED_MAX_CHUNKS ? (int)fit : NORM_FUSED_MAX_CHUNKS;
    chunks = chunks < N ? chunks : N;
    return chunks > 0 ? chunks : 1;
}

#define NORM_FUSED_LAUNCH(G)                                                                                         \
    norm_backward_fused<A, G><<<chunks, BLOCK, 0, g_stream>>>((A *)dinp, partial, (const A *)dout, (const A *)inp, \
                                                              (const A *)weight, offset, mean, rstd, N, C, chunks)

/* dinp [A] +=, dweight [G] +=, dbias [G] += (layernorm: mean and dbias non-NULL; RMSNorm: both NULL);
 * dweight NULL (frozen weights): the input gradient only. */
static void norm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                          const float *weight, float offset, const float *mean, const float *rstd, int N, int C)
{
    const bool fits = N > 0 && (size_t)C * (dbias ? 2 : 1) <= COLSUM_FLOATS;
    const int groups = fits ? norm_fused_groups(dinp, dout, inp, weight, C) : 0;
    if (groups) {
        const int chunks = norm_fused_chunks(N, C, dbias ? 2 : 1);
        float *partial = dweight ? g_colsum : NULL;
        WITH_ACT({
            if (groups == 1)
                NORM_FUSED_LAUNCH(1);
            else if (groups == 2)
                NORM_FUSED_LAUNCH(2);
            else if (groups == 4)
                NORM_FUSED_LAUNCH(4);
            else
                NORM_FUSED_LAUNCH(8);
        });
        if (!dweight)
            return;
        column_sums_finish<<<(C + BLOCK - 1) / BLOCK, BLOCK, 0, g_stream>>>(dweight, g_grad, g_colsum, C, chunks);
        if (dbias)
            column_sums_finish<<<(C + BLOCK - 1) / BLOCK, BLOCK, 0, g_stream>>>(
                dbias, g_grad, g_colsum + (size_t)chunks * C, C, chunks);
        return;
    }
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

