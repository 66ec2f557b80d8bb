/*
 * CUDA backend, the ends of the model: token and position embeddings (forward, and the backward
 * in a fixed order, no atomics) and the cross-entropy loss over the logits.
 */
#include "cuda_internal.h"

/* ---- embedding ------------------------------------------------------------------------------- */

template <typename A>
__global__ static void embedding_forward_kernel(A *out, const int32_t *tokens, const A *wte, const A *wpe,
                                                const int32_t *pos, int B, int T, int C)
{
    size_t n = (size_t)B * T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C;
        int c = (int)(i % C), t = pos ? pos[bt] : (int)(bt % T);
        const float e = ld(wte, (size_t)tokens[bt] * C + c);
        st(out, i, wpe ? e + ld(wpe, (size_t)t * C + c) : e);
    }
}

/* dwpe[t][c] += sum over b of dout[b][t][c], b in order; one thread per (t, c). */
__global__ static void embedding_backward_wpe(void *dwpe, enum dtype dt, const void *dout, enum dtype act, int B,
                                              int T, int C)
{
    size_t n = (size_t)T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int b = 0; b < B; b++)
            s += load_as_f32(dout, act, (size_t)b * n + i);
        store_from_f32(dwpe, dt, i, load_as_f32(dwpe, dt, i) + s);
    }
}

/* dst[rows[bt]][c] += dout[bt][c0 + c] for c < width, bt in order: the token
 * embedding's gradient (rows = tokens, dst = dwte, the whole width) and the
 * sums of packed rows' positions (rows = pos, dst a (T, width) fp32 window).
 * dst has ld elements a row. Thread (c, part) owns the rows with row % parts
 * == part, so every row is added to by one thread, in token order: a fixed
 * order, no atomics, parts x width threads at work. */
#define WTE_PARTS 64
__global__ static void embedding_backward_rows(void *dst, enum dtype dt, int ld, const void *dout, enum dtype act,
                                               const int32_t *rows, int BT, int C, int c0, int width)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, part = blockIdx.y;
    if (c >= width)
        return;
    for (int bt = 0; bt < BT; bt++) {
        int r = rows[bt];
        if (r % WTE_PARTS == part) {
            size_t i = (size_t)r * ld + c;
            store_from_f32(dst, dt, i, load_as_f32(dst, dt, i) + load_as_f32(dout, act, (size_t)bt * C + c0 + c));
        }
    }
}

/* dwpe[p][c0 + c] += sums[p][c] for p < T, c < width: one rounding per element. */
__global__ static void embedding_backward_wpe_finish(void *dwpe, enum dtype dt, const float *sums, int T, int C,
                                                     int c0, int width)
{
    size_t n = (size_t)T * width;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t at = i / width * C + c0 + i % width;
        store_from_f32(dwpe, dt, at, load_as_f32(dwpe, dt, at) + sums[i]);
    }
}

/* dwpe[pos[bt]] += dout[bt] for packed rows: summed in fp32 in token order in
 * g_colsum, as many columns at a time as T rows of them fit, then added into
 * dwpe once, as the per-position sums of embedding_backward_wpe are. */
static void embedding_backward_wpe_packed(float *dwpe, const float *dout, const int32_t *pos, int B, int T, int C)
{
    if ((size_t)T > COLSUM_FLOATS)
        fail_internal("a sequence of %d tokens exceeds the %zu-float column-sum buffer", T, (size_t)COLSUM_FLOATS);
    const int window = (int)(COLSUM_FLOATS / (size_t)T) < C ? (int)(COLSUM_FLOATS / (size_t)T) : C;
    for (int c0 = 0; c0 < C; c0 += window) {
        const int width = C - c0 < window ? C - c0 : window;
        const size_t n = (size_t)T * width;
        zero_kernel<<<blocks_for(n, BLOCK), BLOCK, 0, g_stream>>>(g_colsum, n);
        dim3 grid((width + BLOCK - 1) / BLOCK, WTE_PARTS);
        embedding_backward_rows<<<grid, BLOCK, 0, g_stream>>>(g_colsum, DTYPE_F32, width, dout, g_act, pos, B * T, C,
                                                             c0, width);
        embedding_backward_wpe_finish<<<blocks_for(n, BLOCK), BLOCK, 0, g_stream>>>(dwpe, g_grad, g_colsum, T, C, c0,
                                                                                    width);
    }
}

extern "C" void backend_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                                          const int32_t *pos, int B, int T, int C)
{
    WITH_ACT(embedding_forward_kernel<A><<<blocks_for((size_t)B * T * C, BLOCK), BLOCK, 0, g_stream>>>(
        (A *)out, tokens, (const A *)wte, (const A *)wpe, pos, B, T, C));
}

extern "C" void backend_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                                           const int32_t *pos, int B, int T, int C)
{
    if (dwpe && pos)
        embedding_backward_wpe_packed(dwpe, dout, pos, B, T, C);
    else if (dwpe)
        embedding_backward_wpe<<<blocks_for((size_t)T * C, BLOCK), BLOCK, 0, g_stream>>>(dwpe, g_grad, dout, g_act, B,
                                                                                         T, C);
    dim3 grid((C + BLOCK - 1) / BLOCK, WTE_PARTS);
    embedding_backward_rows<<<grid, BLOCK, 0, g_stream>>>(dwte, g_grad, C, dout, g_act, tokens, B * T, C, 0, C);
}

/* ---- cross-entropy --------------------------------------------------------------------------- */

/* One block per row: softmax over the first V logits in fp32, padded columns 0. */
template <typename A>
__global__ static void crossentropy_forward_kernel(float *losses, A *logits, const int32_t *targets, int V, int Vp)
{
    A *x = logits + (size_t)blockIdx.x * Vp;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        m = fmaxf(m, ld(x, j));
    m = block_reduce(m, true);
    float s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        s += expf(ld(x, j) - m);
    s = block_reduce(s, false);
    const int target = targets[blockIdx.x];
    if (threadIdx.x == 0) /* -log p[target] = log sum exp - logit[target], before x is overwritten; 0 when ignored */
        losses[blockIdx.x] = target >= 0 ? logf(s) + m - ld(x, target) : 0.0f;
    __syncthreads();
    for (int j = threadIdx.x; j < Vp; j += blockDim.x)
        st(x, j, j < V ? expf(ld(x, j) - m) / s : 0.0f);
}

/* row_dloss: a scale per row (NULL: dloss for every row). */
template <typename A>
__global__ static void crossentropy_backward_kernel(A *probs, const int32_t *targets, float dloss,
                                                    const float *row_dloss, int V, int Vp)
{
    A *p = probs + (size_t)blockIdx.x * Vp;
    int target = targets[blockIdx.x];
    if (row_dloss)
        dloss = row_dloss[blockIdx.x];
    for (int j = threadIdx.x; j < Vp; j += blockDim.x) /* an ignored target (< 0): the whole row 0 */
        st(p, j, j < V && target >= 0 ? (ld(p, j) - (j == target ? 1.0f : 0.0f)) * dloss : 0.0f);
}

extern "C" void backend_crossentropy_forward(float *losses, float *logits, const int32_t *targets, int N, int V,
                                             int Vp)
{
    WITH_ACT(crossentropy_forward_kernel<A><<<N, BLOCK, 0, g_stream>>>(losses, (A *)logits, targets, V, Vp));
}

extern "C" void backend_crossentropy_backward(float *probs, const int32_t *targets, float dloss, int N, int V, int Vp)
{
    WITH_ACT(crossentropy_backward_kernel<A><<<N, BLOCK, 0, g_stream>>>((A *)probs, targets, dloss, (const float *)nullptr, V, Vp));
}

extern "C" void backend_crossentropy_backward_rows(float *probs, const int32_t *targets, const float *dloss, int N,
                                                   int V, int Vp)
{
    WITH_ACT(crossentropy_backward_kernel<A><<<N, BLOCK, 0, g_stream>>>((A *)probs, targets, 0.0f, dloss, V, Vp));
}

