/*
 * Causal attention on tensor cores: FlashAttention-2 (Dao 2023) with its matrix products as warp matrix operations
 * (nvcuda::wmma, 16 x 16 x 16 tiles of fp16 or bf16 operands, fp32 accumulation), for fp16/bf16 activations and
 * head sizes that are multiples of 16 up to 128. It computes what backend_cuda.cu's FP32 kernel does, with the same
 * semantics (backend.h): query head h reads key/value head h / (NH / NKV) (grouped-query attention), a row of
 * packed samples (pos) lets each query see the keys from its sample's first token to itself (or the last W of them,
 * a sliding window; scores soft-capped and scaled as backend.h's struct attn_opts says), and the forward keeps
 * the output [A] and each row's log-sum-exp (B, NH, T) fp32, so that either backward can follow either forward.
 * Everything but the products is fp32 (scores, the online softmax's running maximum and sum, the output's
 * accumulator); the probabilities are rounded to the activation dtype as the second product's operand, as in
 * FlashAttention-2.
 *
 * Forward: a block is TC_WARPS warps, 16 query rows each, of one head of one sequence. The block stages its
 * queries in shared memory, each warp loads its 16 rows as hs / 16 A fragments, then the block walks the tiles of
 * BK keys and values from its first row's first key to its last row (staged in shared memory, rows past the
 * tile's end zero). A warp skips a tile none of its rows sees. For a tile, each warp: S = Q K^T into fp32
 * fragments, stored to its shared scores; two lanes a row mask (diagonal, sample boundary), scale, update the
 * running maximum and sum and write the probabilities [A]; O = O corr + P V with O in fp32 accumulator fragments.
 * CUDA leaves the place of a fragment's elements unspecified, so each thread learns the row of each of its
 * accumulator elements once, by loading a tile that holds its row numbers, and scales them by the row's factor.
 * The order of every sum is fixed (no atomics): results do not depend on scheduling.
 *
 * SHARDLM_ATTN_TC=0 turns it off (backend_cuda.cu's FP32 kernels then run).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <mma.h>
#include <stdlib.h>
#include <string.h>

#include "attention_tc.h"
#include "cuda_check.h"

extern "C" {
#include "backend/backend.h"
}

using namespace nvcuda;

#define TC_WARPS 4
#define TC_THREADS (TC_WARPS * 32)
#define TC_ROWS (TC_WARPS * 16) /* query rows of a forward block */
#define TC_MAX_HS 128
/* Row strides of the warps' shared tiles of n columns: fp32 scores and dP (TC_LDF), and the probabilities and dS
 * as [A] operands (TC_LDA); wmma needs multiples of 4 floats and 8 halves. The padding puts the rows of a tile in
 * different banks: with a tile's row at a multiple of 32 words, the 16 rows' lanes of the softmax all hit one bank
 * (a 16- to 32-way conflict on every score read and probability write); padded, two lanes at most share one.
 * The 16-column [A] tiles of the dk/dv kernel stay unpadded (a 4-way conflict): padded, that kernel at head size
 * 128 needs more than the 48 KiB of static shared memory. */
#define TC_LDF(n) ((n) + 4)
#define TC_LDA(n) ((n) + ((n) > 16 ? 8 : 0))

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> tc_acc;

struct tc_shape {
    int B, T, NH, NKV, hs;
    int group; /* query heads per key/value head */
    float scale;
    const int32_t *pos; /* (B, T) or NULL */
    int window;         /* keys a query sees at most, itself included (0: no limit; backend.h struct attn_opts) */
    float softcap;      /* scores c tanh(s / c) (0: none) */
};

/* 16 bytes, the unit of the staging copies (hs is a multiple of 16 elements: 32 bytes). */
struct __align__(16) tc_vec {
    unsigned int w[4];
};

__device__ __forceinline__ float tc_wide(__half x) { return __half2float(x); }
__device__ __forceinline__ float tc_wide(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void tc_round(__half *p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void tc_round(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

__device__ static int tc_min(int x, int y) { return x < y ? x : y; }

/* Token t of sequence b: the first key it sees, its sample's first token (t - pos), or with a window W the key
 * W - 1 before it when that is later (nondecreasing in t). */
__device__ static int tc_first_key(const struct tc_shape &s, int b, int t)
{
    const int first = s.pos ? t - s.pos[(size_t)b * s.T + t] : 0;
    return s.window > 0 && t - s.window + 1 > first ? t - s.window + 1 : first;
}

/* A scaled score x soft-capped, c tanh(x / c) (x itself without a cap); *slope: d(capped) / dx, 1 - tanh^2. */
__device__ static float tc_cap(const struct tc_shape &s, float x, float *slope)
{
    if (s.softcap <= 0.0f) {
        *slope = 1.0f;
        return x;
    }
    const float th = tanhf(x / s.softcap);
    *slope = 1.0f - th * th;
    return s.softcap * th;
}

/* Where part (0 query, 1 key, 2 value) head h of token t of sequence b starts in qkv (B, T, (NH + 2 NKV) hs). */
__device__ static size_t tc_qkv_at(const struct tc_shape &s, int b, int t, int h, int part)
{
    const int head = part == 0 ? h : part == 1 ? s.NH + h : s.NH + s.NKV + h;
    return ((size_t)b * s.T + t) * (size_t)(s.NH + 2 * s.NKV) * s.hs + (size_t)head * s.hs;
}

/* n rows of hs elements, stride apart from first, into rows (>= n) rows of xs (hs apart), the rows past n zero;
 * by the whole block, 16 bytes at a time. */
template <typename A>
__device__ static void tc_stage(A *xs, const A *first, size_t stride, int n, int rows, int hs)
{
    const int per_row = hs * (int)sizeof(A) / 16;
    for (int e = (int)threadIdx.x; e < rows * per_row; e += TC_THREADS) {
        const int r = e / per_row, c = e % per_row;
        tc_vec v = {{0u, 0u, 0u, 0u}};
        if (r < n)
            v = ((const tc_vec *)(first + (size_t)r * stride))[c];
        ((tc_vec *)(xs + (size_t)r * hs))[c] = v;
    }
}

/* The row (0..15) of each element of this thread's accumulator fragments, learnt through the warp's scratch
 * (256 floats of shared memory, 32-byte aligned). */
__device__ static void tc_rows_of(int *row_of, float *scratch)
{
    const int lane = (int)threadIdx.x % 32;
    for (int e = lane; e < 256; e += 32)
        scratch[e] = (float)(e / 16);
    __syncwarp();
    tc_acc f;
    wmma::load_matrix_sync(f, scratch, 16, wmma::mem_row_major);
#pragma unroll
    for (int i = 0; i < tc_acc::num_elements; i++)
        row_of[i] = (int)f.x[i];
    __syncwarp();
}

/* A warp's 16 rows of a staged tile (hs apart) as hs / 16 A fragments. */
template <typename A, int ND>
__device__ static void tc_load_rows(wmma::fragment<wmma::matrix_a, 16, 16, 16, A, wmma::row_major> *x, const A *rows,
                                    int hs)
{
#pragma unroll
    for (int k = 0; k < ND; k++)
        if (k < hs / 16)
            wmma::load_matrix_sync(x[k], rows + k * 16, hs);
}

/* The block's TC_ROWS rows (n of them real, stride apart from first) as each warp's 16 rows of A fragments x,
 * staged through xs; the block meets before (xs is free) and after (xs may be overwritten). */
template <typename A, int ND>
__device__ static void tc_block_rows(wmma::fragment<wmma::matrix_a, 16, 16, 16, A, wmma::row_major> *x, A *xs,
                                     const A *first, size_t stride, int n, int hs)
{
    __syncthreads();
    tc_stage(xs, first, stride, n, TC_ROWS, hs);
    __syncthreads();
    tc_load_rows<A, ND>(x, xs + (size_t)((int)threadIdx.x / 32) * 16 * hs, hs);
    __syncthreads();
}

template <int ND> __device__ static void tc_zero(tc_acc *x)
{
#pragma unroll
    for (int f = 0; f < ND; f++)
        wmma::fill_fragment(x[f], 0.0f);
}

/* A warp's 16 rows held in nd accumulator fragments, each row times factor[row] (factor NULL: 1), rounded into
 * dst (row r at dst + r stride) [A], the rows from `rows` on skipped (past T); through scratch (the warp's, 256
 * floats), a fragment at a time. */
template <typename A, int ND>
__device__ static void tc_store_rows(A *dst, size_t stride, int rows, tc_acc *x, int nd, const float *factor,
                                     const int *row_of, float *scratch)
{
    const int lane = (int)threadIdx.x % 32;
#pragma unroll
    for (int f = 0; f < ND; f++)
        if (f < nd) {
            if (factor)
#pragma unroll
                for (int e = 0; e < tc_acc::num_elements; e++)
                    x[f].x[e] *= factor[row_of[e]];
            wmma::store_matrix_sync(scratch, x[f], 16, wmma::mem_row_major);
            __syncwarp();
            for (int e = lane; e < 256; e += 32)
                if (e / 16 < rows)
                    tc_round(&dst[(size_t)(e / 16) * stride + f * 16 + e % 16], scratch[e]);
            __syncwarp();
        }
}

/* A warp's 16 x N product of its 16 rows (fragment k of them: xk(k), hs / 16 of them) with the transposes of a
 * staged tile's rows y (N rows, hs apart: y^T column-major), into out (fp32, N apart). */
template <typename A, int ND, int N, typename XK>
__device__ static void tc_times_tile(float *out, XK xk, const A *y, int hs)
{
#pragma unroll
    for (int c = 0; c < N / 16; c++) {
        tc_acc acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int k = 0; k < ND; k++)
            if (k < hs / 16) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, A, wmma::col_major> yf;
                wmma::load_matrix_sync(yf, y + (size_t)c * 16 * hs + k * 16, hs);
                wmma::mma_sync(acc, xk(k), yf, acc);
            }
        wmma::store_matrix_sync(out + c * 16, acc, TC_LDF(N), wmma::mem_row_major);
    }
    __syncwarp();
}

/* tc_times_tile of rows held as A fragments x. */
template <typename A, int ND, int N>
__device__ static void tc_rows_times_tile(float *out,
                                          const wmma::fragment<wmma::matrix_a, 16, 16, 16, A, wmma::row_major> *x,
                                          const A *y, int hs)
{
    tc_times_tile<A, ND, N>(out, [&](int k) { return x[k]; }, y, hs);
}

/* tc_times_tile of rows staged in shared memory (16 rows, hs apart), loaded a fragment at a time. */
template <typename A, int ND, int N>
__device__ static void tc_staged_times_tile(float *out, const A *x, const A *y, int hs)
{
    tc_times_tile<A, ND, N>(
        out,
        [&](int k) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, A, wmma::row_major> xf;
            wmma::load_matrix_sync(xf, x + k * 16, hs);
            return xf;
        },
        y, hs);
}

/* acc[f] += w y: w a warp's 16 x N [A] (N apart), y a staged tile's N rows (hs apart). */
template <typename A, int ND, int N>
__device__ static void tc_weights_times_tile(tc_acc *acc, const A *w, const A *y, int hs)
{
#pragma unroll
    for (int kk = 0; kk < N / 16; kk++) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, A, wmma::row_major> wf;
        wmma::load_matrix_sync(wf, w + kk * 16, TC_LDA(N));
#pragma unroll
        for (int f = 0; f < ND; f++)
            if (f < hs / 16) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, A, wmma::row_major> yf;
                wmma::load_matrix_sync(yf, y + (size_t)kk * 16 * hs + f * 16, hs);
                wmma::mma_sync(acc[f], wf, yf, acc[f]);
            }
    }
}

/* ND: hs / 16 at most (fragments per row of the head); BK: keys a tile. */
template <typename A, int ND, int BK>
__global__ static void __launch_bounds__(TC_THREADS) attention_tc_forward_kernel(A *out, float *lse, const A *qkv,
                                                                                  struct tc_shape s)
{
    /* the block's queries (staged once), then each tile's keys and values */
    __shared__ __align__(32) A kv[2 * BK * ND * 16];
    __shared__ __align__(32) float scores[TC_WARPS][16 * TC_LDF(BK)];
    __shared__ __align__(32) A probs[TC_WARPS][16 * TC_LDA(BK)];
    __shared__ float factor[TC_WARPS][16];
    static_assert(2 * BK * ND * 16 >= TC_ROWS * ND * 16, "the queries fit where the keys and values go");
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32, hs = s.hs, nd = hs / 16;
    const int b = (int)blockIdx.x / s.NH, h = (int)blockIdx.x % s.NH, kvh = h / s.group;
    const int r0 = (int)blockIdx.y * TC_ROWS, last = tc_min(r0 + TC_ROWS, s.T) - 1;
    const int w0 = r0 + warp * 16, wlast = tc_min(w0 + 15, s.T - 1); /* the warp's rows (none if w0 >= T) */
    const size_t stride = (size_t)(s.NH + 2 * s.NKV) * hs;
    float *sc = scores[warp];
    A *pr = probs[warp];

    wmma::fragment<wmma::matrix_a, 16, 16, 16, A, wmma::row_major> q[ND];
    tc_block_rows<A, ND>(q, kv, qkv + tc_qkv_at(s, b, r0, h, 0), stride, tc_min(TC_ROWS, s.T - r0), hs);
    int row_of[tc_acc::num_elements];
    tc_rows_of(row_of, sc);
    tc_acc o[ND];
    tc_zero<ND>(o);

    /* two lanes a row: row r, the even (half 0) or odd (half 1) columns of a tile */
    const int r = lane / 2, half = lane % 2, i = w0 + r;
    const int first = i < s.T ? tc_first_key(s, b, i) : 0;
    const int wfirst = w0 < s.T ? tc_first_key(s, b, w0) : 0;
    float m = -INFINITY, l = 0.0f;
    for (int j0 = tc_first_key(s, b, r0); j0 <= last; j0 += BK) {
        const int n = tc_min(BK, last + 1 - j0);
        tc_stage(kv, qkv + tc_qkv_at(s, b, j0, kvh, 1), stride, n, BK, hs);
        tc_stage(kv + BK * hs, qkv + tc_qkv_at(s, b, j0, kvh, 2), stride, n, BK, hs);
        __syncthreads();
        if (w0 < s.T && j0 <= wlast && j0 + n > wfirst) { /* the warp sees some of these keys */
            tc_rows_times_tile<A, ND, BK>(sc, q, kv, hs); /* S = Q K^T */
            float x[BK / 2], mx = -INFINITY;
#pragma unroll
            for (int c2 = 0; c2 < BK / 2; c2++) {
                const int c = 2 * c2 + half, j = j0 + c;
                float slope;
                x[c2] = c < n && i < s.T && j >= first && j <= i ? tc_cap(s, sc[r * TC_LDF(BK) + c] * s.scale, &slope)
                                                                  : -INFINITY;
                mx = fmaxf(mx, x[c2]);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            const float mnew = fmaxf(m, mx);
            float corr = 1.0f, sum = 0.0f;
            if (mnew > -INFINITY) {
                corr = expf(m - mnew); /* 0 while m is -inf: o and l are still 0 */
#pragma unroll
                for (int c2 = 0; c2 < BK / 2; c2++) {
                    x[c2] = expf(x[c2] - mnew);
                    sum += x[c2];
                }
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            l = l * corr + sum;
            m = mnew;
#pragma unroll
            for (int c2 = 0; c2 < BK / 2; c2++)
                tc_round(&pr[r * TC_LDA(BK) + 2 * c2 + half], mnew > -INFINITY ? x[c2] : 0.0f);
            if (half == 0)
                factor[warp][r] = corr;
            __syncwarp();
            /* O = O corr + P V */
#pragma unroll
            for (int f = 0; f < ND; f++)
#pragma unroll
                for (int e = 0; e < tc_acc::num_elements; e++)
                    o[f].x[e] *= factor[warp][row_of[e]];
            tc_weights_times_tile<A, ND, BK>(o, pr, kv + (size_t)BK * hs, hs);
        }
        __syncthreads(); /* before the next tile overwrites the keys and values */
    }

    /* out = O / l; lse = m + log l */
    if (half == 0)
        factor[warp][r] = l > 0.0f ? 1.0f / l : 0.0f;
    __syncwarp();
    tc_store_rows<A, ND>(out + ((size_t)b * s.T + w0) * s.NH * hs + (size_t)h * hs, (size_t)s.NH * hs, s.T - w0, o,
                         nd, factor[warp], row_of, sc);
    if (half == 0 && i < s.T)
        lse[((size_t)b * s.NH + h) * s.T + i] = m + logf(l);
}


/* ---- backward ----------------------------------------------------------------------------------------------------
 * As the FP32 kernel's, without atomics: dq by blocks of queries over the key tiles the forward visited, dk and dv
 * by blocks of keys over the group's query heads in order and, for each, the tiles of queries from the block's
 * first key to the end of its last key's sample. P = exp(scale S - lse) is recomputed from the forward's lse,
 * D_i = dout_i . out_i (fp32) and dS = scale P (dP - D), dP = dout V^T. The products on tensor cores: S and dP
 * (fp32 accumulators, through shared memory to two lanes a row), then dQ += dS K, or dV += P^T dout and
 * dK += dS^T Q, with P and dS rounded to the activation dtype as their operand. The dk/dv kernel holds its keys
 * as fragments and its values staged in shared memory (fragments of both, beside dk and dv, made head size 128
 * spill on sm_90), and takes a query tile 16 queries at a time. */
#define TC_BWD_TILE 32 /* keys (dq) or queries (dk, dv) of a staged tile */

/* Two lanes a row of a warp's 16 x NC scores sc and dP dp (fp32), row r's element c seen when see(r, c):
 * P and dS of the row into p and ds [A] (p NULL: not kept), 0 where not seen. lse(r, c) and dterm(r, c): the
 * lse and D of the query of element (r, c). */
template <typename A, int NC, typename See, typename Lse, typename Dterm>
__device__ static void tc_softmax_backward(A *p, A *ds, const float *sc, const float *dp, const struct tc_shape &s,
                                           See see, Lse lse, Dterm dterm)
{
    const int lane = (int)threadIdx.x % 32, r = lane / 2;
#pragma unroll 4
    for (int c = lane % 2; c < NC; c += 2) { /* the even or odd columns: see TC_LDF */
        const int at = r * TC_LDF(NC) + c, ap = r * TC_LDA(NC) + c;
        float pv = 0.0f, dsv = 0.0f;
        if (see(r, c)) { /* with a soft-cap: P from the capped score, dS through d tanh */
            float slope;
            pv = expf(tc_cap(s, sc[at] * s.scale, &slope) - lse(r, c));
            dsv = pv * (dp[at] - dterm(r, c)) * slope * s.scale;
        }
        if (p)
            tc_round(&p[ap], pv);
        tc_round(&ds[ap], dsv);
    }
    __syncwarp();
}

/* dout_i . out_i of token t of query head h (fp32), by the `lanes` lanes (a power of two, neighbours) of a row,
 * lane `part` of them summing the 16-byte groups of channels part, part + lanes, ... */
template <typename A>
__device__ static float tc_row_term(const A *dout, const A *out, const struct tc_shape &s, int b, int t, int h,
                                    int part, int lanes)
{
    const size_t at = ((size_t)b * s.T + t) * s.NH * s.hs + (size_t)h * s.hs;
    /* 16 bytes at a time (a row starts 32-byte aligned: tc_applies), lane `part` taking every lanes-th: a few wide
     * loads in flight instead of hs / lanes dependent narrow ones */
    constexpr int per = 16 / (int)sizeof(A);
    const tc_vec *dv = (const tc_vec *)(dout + at), *ov = (const tc_vec *)(out + at);
    float d = 0.0f;
    for (int e = part; e < s.hs / per; e += lanes) {
        const tc_vec x = dv[e], y = ov[e];
        A xa[per], ya[per];
        memcpy(xa, &x, 16); /* not a cast: reading the words as A would break aliasing rules */
        memcpy(ya, &y, 16);
#pragma unroll
        for (int k = 0; k < per; k++)
            d += tc_wide(xa[k]) * tc_wide(ya[k]);
    }
    for (int o = 1; o < lanes; o *= 2)
        d += __shfl_xor_sync(0xffffffffu, d, o);
    return d;
}

template <typename A, int ND>
__global__ static void __launch_bounds__(TC_THREADS) attention_tc_backward_dq(A *dqkv, const A *dout, const A *out,
                                                                               const A *qkv, const float *lse,
                                                                               struct tc_shape s)
{
    __shared__ __align__(32) A kv[2 * TC_BWD_TILE * ND * 16]; /* first the queries, then dout, then keys, values */
    __shared__ __align__(32) float scores[TC_WARPS][16 * TC_LDF(TC_BWD_TILE)], dps[TC_WARPS][16 * TC_LDF(TC_BWD_TILE)];
    __shared__ __align__(32) A dss[TC_WARPS][16 * TC_LDA(TC_BWD_TILE)];
    __shared__ float Ls[TC_WARPS][16], Ds[TC_WARPS][16];
    __shared__ int firsts[TC_WARPS][16];
    static_assert(2 * TC_BWD_TILE >= TC_ROWS, "a block's rows fit where the keys and values go");
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32, hs = s.hs, nd = hs / 16;
    const int b = (int)blockIdx.x / s.NH, h = (int)blockIdx.x % s.NH, kvh = h / s.group;
    const int r0 = (int)blockIdx.y * TC_ROWS, last = tc_min(r0 + TC_ROWS, s.T) - 1;
    const int w0 = r0 + warp * 16, wlast = tc_min(w0 + 15, s.T - 1);
    const size_t stride = (size_t)(s.NH + 2 * s.NKV) * hs;
    float *sc = scores[warp], *dp = dps[warp];
    A *ds = dss[warp];
    const int rows = tc_min(TC_ROWS, s.T - r0);

    wmma::fragment<wmma::matrix_a, 16, 16, 16, A, wmma::row_major> q[ND], dy[ND];
    tc_block_rows<A, ND>(q, kv, qkv + tc_qkv_at(s, b, r0, h, 0), stride, rows, hs);
    tc_block_rows<A, ND>(dy, kv, dout + ((size_t)b * s.T + r0) * s.NH * hs + (size_t)h * hs, (size_t)s.NH * hs, rows,
                         hs);
    int row_of[tc_acc::num_elements];
    tc_rows_of(row_of, sc);
    tc_acc dq[ND];
    tc_zero<ND>(dq);
    { /* the warp's rows' lse, D and first key, two lanes a row */
        const int r = lane / 2, t = tc_min(w0 + r, s.T - 1);
        const float d = tc_row_term(dout, out, s, b, t, h, lane % 2, 2);
        if (lane % 2 == 0) {
            Ls[warp][r] = lse[((size_t)b * s.NH + h) * s.T + t];
            Ds[warp][r] = d;
            firsts[warp][r] = w0 + r < s.T ? tc_first_key(s, b, t) : s.T; /* rows past T see nothing */
        }
    }
    __syncthreads(); /* every warp has its rows: the keys may overwrite them */

    const int wfirst = w0 < s.T ? tc_first_key(s, b, w0) : 0;
    for (int j0 = tc_first_key(s, b, r0); j0 <= last; j0 += TC_BWD_TILE) {
        const int n = tc_min(TC_BWD_TILE, last + 1 - j0);
        const A *ks = kv, *vs = kv + TC_BWD_TILE * hs;
        tc_stage(kv, qkv + tc_qkv_at(s, b, j0, kvh, 1), stride, n, TC_BWD_TILE, hs);
        tc_stage(kv + TC_BWD_TILE * hs, qkv + tc_qkv_at(s, b, j0, kvh, 2), stride, n, TC_BWD_TILE, hs);
        __syncthreads();
        if (w0 < s.T && j0 <= wlast && j0 + n > wfirst) {
            tc_rows_times_tile<A, ND, TC_BWD_TILE>(sc, q, ks, hs);
            tc_rows_times_tile<A, ND, TC_BWD_TILE>(dp, dy, vs, hs);
            const float *L = Ls[warp], *D = Ds[warp];
            const int *fk = firsts[warp];
            tc_softmax_backward<A, TC_BWD_TILE>(
                (A *)NULL, ds, sc, dp, s,
                [&](int r, int c) { return c < n && j0 + c >= fk[r] && j0 + c <= w0 + r; },
                [&](int r, int c) { return L[r]; }, [&](int r, int c) { return D[r]; });
            tc_weights_times_tile<A, ND, TC_BWD_TILE>(dq, ds, ks, hs);
        }
        __syncthreads();
    }
    tc_store_rows<A, ND>(dqkv + tc_qkv_at(s, b, tc_min(w0, s.T - 1), h, 0), stride, s.T - w0, dq, nd, NULL, row_of,
                         sc);
}

template <typename A, int ND>
__global__ static void __launch_bounds__(TC_THREADS) attention_tc_backward_dkdv(A *dqkv, const A *dout, const A *out,
                                                                                 const A *qkv, const float *lse,
                                                                                 struct tc_shape s)
{
    __shared__ __align__(32) A qd[2 * TC_BWD_TILE * ND * 16]; /* first the keys; then each tile's queries, dout */
    __shared__ __align__(32) A vals[TC_ROWS * ND * 16];
    __shared__ __align__(32) float scores[TC_WARPS][16 * TC_LDF(16)], dps[TC_WARPS][16 * TC_LDF(16)];
    __shared__ __align__(32) A pts[TC_WARPS][16 * TC_LDA(16)], dss[TC_WARPS][16 * TC_LDA(16)];
    __shared__ float Ls[TC_BWD_TILE], Ds[TC_BWD_TILE];
    __shared__ int firsts[TC_BWD_TILE];
    const int warp = (int)threadIdx.x / 32, hs = s.hs, nd = hs / 16;
    const int b = (int)blockIdx.x / s.NKV, g = (int)blockIdx.x % s.NKV;
    const int r0 = (int)blockIdx.y * TC_ROWS, last = tc_min(r0 + TC_ROWS, s.T) - 1;
    const int w0 = r0 + warp * 16, wlast = tc_min(w0 + 15, s.T - 1); /* the warp's keys */
    const size_t stride = (size_t)(s.NH + 2 * s.NKV) * hs, out_stride = (size_t)s.NH * hs;
    float *sc = scores[warp], *dp = dps[warp];
    A *pt = pts[warp], *ds = dss[warp];
    const int rows = tc_min(TC_ROWS, s.T - r0);
    /* one past the last query that sees the block's last key: the next sample's first token (T without pos), or
     * with a window the query W after it when that is sooner */
    int end = s.pos ? last + 1 : s.T;
    while (end < s.T && s.pos[(size_t)b * s.T + end] != 0)
        end++;
    if (s.window > 0 && last + s.window < end)
        end = last + s.window;

    wmma::fragment<wmma::matrix_a, 16, 16, 16, A, wmma::row_major> k[ND];
    tc_block_rows<A, ND>(k, qd, qkv + tc_qkv_at(s, b, r0, g, 1), stride, rows, hs);
    tc_stage(vals, qkv + tc_qkv_at(s, b, r0, g, 2), stride, rows, TC_ROWS, hs); /* read after the loop's barrier */
    const A *v = vals + (size_t)warp * 16 * hs;                                 /* the warp's keys' values */
    int row_of[tc_acc::num_elements];
    tc_rows_of(row_of, sc);
    tc_acc dk[ND], dv[ND];
    tc_zero<ND>(dk);
    tc_zero<ND>(dv);

    for (int h = g * s.group; h < (g + 1) * s.group; h++)
        for (int i0 = r0; i0 < end; i0 += TC_BWD_TILE) {
            const int n = tc_min(TC_BWD_TILE, end - i0);
            const A *qs = qd, *dys = qd + TC_BWD_TILE * hs;
            tc_stage(qd, qkv + tc_qkv_at(s, b, i0, h, 0), stride, n, TC_BWD_TILE, hs);
            tc_stage(qd + TC_BWD_TILE * hs, dout + ((size_t)b * s.T + i0) * out_stride + (size_t)h * hs, out_stride,
                     n, TC_BWD_TILE, hs);
            { /* the tile's queries' lse, D and first key, four lanes a query */
                const int c = (int)threadIdx.x / 4, t = i0 + tc_min(c, n - 1);
                const float d = tc_row_term(dout, out, s, b, t, h, (int)threadIdx.x % 4, 4);
                if (threadIdx.x % 4 == 0) {
                    Ls[c] = lse[((size_t)b * s.NH + h) * s.T + t];
                    Ds[c] = d;
                    firsts[c] = c < n ? tc_first_key(s, b, t) : s.T; /* past the tile: sees nothing */
                }
            }
            __syncthreads();
            if (w0 < s.T && i0 + n > w0 && tc_first_key(s, b, i0) <= wlast) { /* some of these queries see the keys */
                /* 16 queries at a time: each accumulator takes the same products in the same order as with the
                 * whole tile at once, in half the shared memory */
                for (int q0 = 0; q0 < TC_BWD_TILE; q0 += 16) {
                    const A *qq = qs + (size_t)q0 * hs, *dyq = dys + (size_t)q0 * hs;
                    tc_rows_times_tile<A, ND, 16>(sc, k, qq, hs);   /* S^T = K Q^T */
                    tc_staged_times_tile<A, ND, 16>(dp, v, dyq, hs); /* dP^T = V dout^T */
                    tc_softmax_backward<A, 16>(
                        pt, ds, sc, dp, s,
                        [&](int r, int c) {
                            return w0 + r <= wlast && w0 + r <= i0 + q0 + c && firsts[q0 + c] <= w0 + r;
                        },
                        [&](int r, int c) { return Ls[q0 + c]; }, [&](int r, int c) { return Ds[q0 + c]; });
                    tc_weights_times_tile<A, ND, 16>(dv, pt, dyq, hs); /* dV += P^T dout */
                    tc_weights_times_tile<A, ND, 16>(dk, ds, qq, hs);  /* dK += dS^T Q */
                    __syncwarp(); /* the next 16 overwrite sc, dp, pt and ds */
                }
            }
            __syncthreads();
        }
    const int t0 = tc_min(w0, s.T - 1);
    tc_store_rows<A, ND>(dqkv + tc_qkv_at(s, b, t0, g, 1), stride, s.T - w0, dk, nd, NULL, row_of, sc);
    tc_store_rows<A, ND>(dqkv + tc_qkv_at(s, b, t0, g, 2), stride, s.T - w0, dv, nd, NULL, row_of, sc);
}

/* ---- host side ---------------------------------------------------------------------------------------------- */

static long g_tc_calls;

extern "C" long backend_cuda_attention_tc_calls(void) { return g_tc_calls; }

/* Whether the tensor-core kernels take this call: fp16/bf16, hs a multiple of 16 up to TC_MAX_HS, the tensors
 * 16-byte aligned (the staging copies), and SHARDLM_ATTN_TC not 0. */
static int tc_applies(enum dtype act, int hs, const void *a, const void *b)
{
    const char *env = getenv("SHARDLM_ATTN_TC");
    if (env && *env && strcmp(env, "1") != 0) {
        if (strcmp(env, "0") == 0)
            return 0;
        fail_input("SHARDLM_ATTN_TC='%s': set it to 1 (attention on tensor cores where it applies, the default) or "
                   "0 (the FP32 kernel always)",
                   env);
    }
    return act != DTYPE_F32 && hs % 16 == 0 && hs <= TC_MAX_HS && (uintptr_t)a % 16 == 0 && (uintptr_t)b % 16 == 0;
}

static struct tc_shape tc_shape_of(const int32_t *pos, int B, int T, int NH, int NKV, int hs,
                                   const struct attn_opts *opt)
{
    const float scale = opt && opt->scale > 0.0f ? opt->scale : 1.0f / sqrtf((float)hs);
    struct tc_shape s = {B, T, NH, NKV, hs, NH / NKV, scale, pos, opt ? opt->window : 0, opt ? opt->softcap : 0.0f};
    return s;
}

template <typename A>
static void tc_forward(A *out, float *lse, const A *qkv, struct tc_shape s, cudaStream_t stream)
{
    const dim3 grid((unsigned)(s.B * s.NH), (unsigned)((s.T + TC_ROWS - 1) / TC_ROWS));
    if (s.hs <= 64)
        attention_tc_forward_kernel<A, 4, 64><<<grid, TC_THREADS, 0, stream>>>(out, lse, qkv, s);
    else
        attention_tc_forward_kernel<A, 8, 32><<<grid, TC_THREADS, 0, stream>>>(out, lse, qkv, s);
    cudaCheck(cudaGetLastError());
}

extern "C" int attention_tc_forward(void *out, float *lse, const void *qkv, const int32_t *pos, int B, int T, int NH,
                                    int NKV, int hs, const struct attn_opts *opt, enum dtype act, cudaStream_t stream)
{
    if (!tc_applies(act, hs, out, qkv))
        return 0;
    const struct tc_shape s = tc_shape_of(pos, B, T, NH, NKV, hs, opt);
    if (act == DTYPE_BF16)
        tc_forward((__nv_bfloat16 *)out, lse, (const __nv_bfloat16 *)qkv, s, stream);
    else
        tc_forward((__half *)out, lse, (const __half *)qkv, s, stream);
    g_tc_calls++;
    return 1;
}

template <typename A>
static void tc_backward(A *dqkv, const A *dout, const A *out, const A *qkv, const float *lse, struct tc_shape s,
                        cudaStream_t stream)
{
    const unsigned blocks = (unsigned)((s.T + TC_ROWS - 1) / TC_ROWS);
    const dim3 q_grid((unsigned)(s.B * s.NH), blocks), kv_grid((unsigned)(s.B * s.NKV), blocks);
    if (s.hs <= 64) {
        attention_tc_backward_dq<A, 4><<<q_grid, TC_THREADS, 0, stream>>>(dqkv, dout, out, qkv, lse, s);
        attention_tc_backward_dkdv<A, 4><<<kv_grid, TC_THREADS, 0, stream>>>(dqkv, dout, out, qkv, lse, s);
    } else {
        attention_tc_backward_dq<A, 8><<<q_grid, TC_THREADS, 0, stream>>>(dqkv, dout, out, qkv, lse, s);
        attention_tc_backward_dkdv<A, 8><<<kv_grid, TC_THREADS, 0, stream>>>(dqkv, dout, out, qkv, lse, s);
    }
    cudaCheck(cudaGetLastError());
}

extern "C" int attention_tc_backward(void *dqkv, const void *dout, const void *out, const void *qkv, const float *lse,
                                     const int32_t *pos, int B, int T, int NH, int NKV, int hs,
                                     const struct attn_opts *opt, enum dtype act, cudaStream_t stream)
{
    if (!tc_applies(act, hs, dqkv, qkv) || !tc_applies(act, hs, dout, out))
        return 0;
    const struct tc_shape s = tc_shape_of(pos, B, T, NH, NKV, hs, opt);
    if (act == DTYPE_BF16)
        tc_backward((__nv_bfloat16 *)dqkv, (const __nv_bfloat16 *)dout, (const __nv_bfloat16 *)out,
                    (const __nv_bfloat16 *)qkv, lse, s, stream);
    else
        tc_backward((__half *)dqkv, (const __half *)dout, (const __half *)out, (const __half *)qkv, lse, s, stream);
    g_tc_calls++;
    return 1;
}
