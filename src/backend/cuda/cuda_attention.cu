/*
 * CUDA backend, attention: causal attention in tiles (FlashAttention-2) forward and backward,
 * grouped-query (Llama) or not (GPT-2), and the attention of generation over a key/value cache.
 */
#include "attention_tc.h"
#include "cuda_internal.h"
#include "cudnn_attention.h"

extern "C" {
#include "backend/sdpa_layout.h"
}

/* ---- attention ----------------------------------------------------------------------------- */

/* Causal attention without the T x T matrices: FlashAttention-2 (Dao 2023)
 * in tiles staged in shared memory. The forward keeps the output [A] and,
 * per row, the log-sum-exp of its scores (fp32, att: B NH T floats); the
 * backward recomputes each probability from q, k and that statistic.
 *
 * A block is ATT_ROWS rows (queries in the forward and dq, keys in dk/dv) of
 * one head of one sequence, ATT_LANES threads a row, each lane holding the
 * channels lane, lane + ATT_LANES, ... of its row's vectors in registers (F
 * of them, a template argument: 16, 32 or 64 for head sizes up to 64, 128
 * or 256, so that the loops unroll; on sm_90 no spills up to 128); a score
 * is the lanes' partial dot products summed by two shuffles. The other
 * side (keys and values, or queries and output gradients) streams through
 * shared memory in tiles of att_tile_rows rows, converted to fp32 once
 * and read by every row of the block. The softmax is fp32 with a running
 * maximum (the online softmax) in the forward; no atomics, a fixed order:
 * dq by query blocks over key tiles, dk and dv by key blocks over the group's
 * query heads in order and their query tiles, so the results do not depend
 * on scheduling. Grouped-query attention (Llama): NH query heads share NKV
 * key/value heads, query head h reading kv head h / (NH / NKV); GPT-2 is NKV
 * = NH. Head size at most ATT_MAX_HS.
 *
 * Skipped, not computed and masked: key tiles after a query block's last row
 * (above the diagonal) and, in packed rows (pos, backend.h), before its first
 * row's sample; query tiles before a key block's first key and after its
 * last key's sample. Every tile visited holds at least one pair that is
 * computed; pairs of a visited tile across the diagonal or a sample boundary
 * are masked one by one. So a row of samples of lengths n_k costs about
 * sum n_k^2 / 2, not T^2. */
#define ATT_MAX_HS 256
#define ATT_ROWS 32                        /* rows of a block */
#define ATT_LANES 4                        /* threads per row */
#define ATT_THREADS (ATT_ROWS * ATT_LANES) /* per block */
#define ATT_TILE_FLOATS 4096               /* one staged tile (16 KiB); two per block */
#define ATT_MAX_TILE 64                    /* rows of a staged tile, at most */

struct att_shape {
    int B, T, NH, NKV, hs;
    int group; /* query heads per kv head, NH / NKV */
    float scale;
    const int32_t *pos; /* (B, T) each token's position in its sample, or NULL: one sample per row */
    int window;         /* keys a query sees at most, itself included (0: no limit; backend.h struct attn_opts) */
    float softcap;      /* scores c tanh(s / c) (0: none) */
};

__device__ static int att_min(int x, int y) { return x < y ? x : y; }

/* Rows of a staged tile of w floats a row (the head size padded to the lanes' fragments): as many as
 * ATT_TILE_FLOATS holds, at most ATT_MAX_TILE (64 at hs <= 64, 32 at 128, 16 at 256). */
__device__ static int att_tile_rows(int w)
{
    return ATT_TILE_FLOATS / w < ATT_MAX_TILE ? ATT_TILE_FLOATS / w : ATT_MAX_TILE;
}

/* The first key that query t of sequence b sees: its sample's first token (0 without positions), or with a
 * window W the key W - 1 before it when that is later (nondecreasing in t). */
__device__ static int att_first_key(const struct att_shape &s, int b, int t)
{
    const int first = s.pos ? t - s.pos[(size_t)b * s.T + t] : 0;
    return s.window > 0 && t - s.window + 1 > first ? t - s.window + 1 : first;
}

/* One past the last query that sees key j of sequence b: the next sample's first token (T without positions),
 * or with a window the query W after j when that is sooner. */
__device__ static int att_query_end(const struct att_shape &s, int b, int j)
{
    int i = j + 1;
    if (!s.pos) {
        i = s.T;
    } else {
        const int32_t *p = s.pos + (size_t)b * s.T;
        while (i < s.T && p[i] != 0)
            i++;
    }
    return s.window > 0 && j + s.window < i ? j + s.window : i;
}

/* A scaled score x soft-capped, c tanh(x / c) (x itself without a cap); *slope: d(capped) / dx, 1 - tanh^2. */
__device__ static float att_cap(const struct att_shape &s, float x, float *slope)
{
    if (s.softcap <= 0.0f) {
        *slope = 1.0f;
        return x;
    }
    const float th = tanhf(x / s.softcap);
    *slope = 1.0f - th * th;
    return s.softcap * th;
}

/* Row t of sequence b in the (B, T, (NH + 2 NKV) hs) qkv: query head h (part 0), key head h (part 1) or value
 * head h (part 2). */
template <typename P> __device__ static P *att_row(P *qkv, const struct att_shape &s, int b, int t, int h, int part)
{
    const int head = part == 0 ? h : part == 1 ? s.NH + h : s.NH + s.NKV + h;
    return qkv + ((size_t)b * s.T + t) * (size_t)(s.NH + 2 * s.NKV) * s.hs + (size_t)head * s.hs;
}

/* Row t of query head h of sequence b in a (B, T, NH hs) tensor (out, dout). */
template <typename A> __device__ static A *att_out_row(A *x, const struct att_shape &s, int b, int t, int h)
{
    return x + ((size_t)b * s.T + t) * (size_t)s.NH * s.hs + (size_t)h * s.hs;
}

/* Where the log-sum-exp of row i of query head h of sequence b is in lse (B, NH, T). */
__device__ static size_t att_lse_at(const struct att_shape &s, int b, int h, int i)
{
    return ((size_t)b * s.NH + h) * s.T + i;
}

/* This thread's place: its block's sequence and head (grid x: B heads, heads NH or NKV), its block's first row,
 * its own row clamped to the last one (rows past T compute on it, so that every lane takes part in the
 * shuffles and barriers, and store nothing), and its lane. */
struct att_thread {
    int b, h, r0, row, lane;
    bool valid; /* the thread's row is < T */
};

__device__ static struct att_thread att_thread_of(const struct att_shape &s, int heads)
{
    struct att_thread t;
    t.b = blockIdx.x / heads;
    t.h = blockIdx.x % heads;
    t.r0 = blockIdx.y * ATT_ROWS;
    const int row = t.r0 + (int)threadIdx.x / ATT_LANES;
    t.valid = row < s.T;
    t.row = t.valid ? row : s.T - 1;
    t.lane = (int)threadIdx.x % ATT_LANES;
    return t;
}

/* A lane's channels of a row, F of them at most (a compile-time bound, so that fragments live in registers):
 * f[k] = x[lane + k ATT_LANES] (fp32), scaled; 0 past hs. */
template <int F, typename A> __device__ static void att_frag_load(float *f, const A *x, int lane, int hs, float scale)
{
#pragma unroll
    for (int k = 0; k < F; k++) {
        const int c = lane + k * ATT_LANES;
        f[k] = c < hs ? ld(x, c) * scale : 0.0f;
    }
}

template <int F, typename A> __device__ static void att_frag_store(A *x, const float *f, int lane, int hs, float scale)
{
#pragma unroll
    for (int k = 0; k < F; k++) {
        const int c = lane + k * ATT_LANES;
        if (c < hs)
            st(x, c, f[k] * scale);
    }
}

template <int F> __device__ static void att_frag_zero(float *f)
{
#pragma unroll
    for (int k = 0; k < F; k++)
        f[k] = 0.0f;
}

/* The lanes' partial sums added over the ATT_LANES lanes of a row (neighbours in one warp) by shuffles; every
 * lane gets the sum. */
__device__ static float att_lanes_sum(float d)
{
#pragma unroll
    for (int o = 1; o < ATT_LANES; o *= 2)
        d += __shfl_xor_sync(0xffffffffu, d, o);
    return d;
}

/* The dot product of a row held in fragments by its lanes with a row x of shared memory (hs floats, a lane
 * reading only its channels; x is padded with zeros to ATT_LANES F channels by att_stage, so no bound check). */
template <int F> __device__ static float att_dot(const float *f, const float *x, int lane)
{
    float d = 0.0f;
#pragma unroll
    for (int k = 0; k < F; k++)
        d += f[k] * x[lane + k * ATT_LANES];
    return att_lanes_sum(d);
}

/* f += w x, over a lane's channels of a shared-memory row x (padded as above). */
template <int F> __device__ static void att_axpy(float *f, float w, const float *x, int lane)
{
#pragma unroll
    for (int k = 0; k < F; k++)
        f[k] += w * x[lane + k * ATT_LANES];
}

/* n rows of hs [A] elements, row j at first + j stride, into shared memory xs (n rows of w = ATT_LANES F
 * floats, the channels past hs zero), by the whole block. */
template <int F, typename A>
__device__ static void att_stage(float *xs, const A *first, size_t stride, int n, int hs)
{
    const int w = ATT_LANES * F;
    for (int e = (int)threadIdx.x; e < n * w; e += ATT_THREADS) {
        const int c = e % w;
        xs[e] = c < hs ? ld(first + (size_t)(e / w) * stride, c) : 0.0f;
    }
}

/* Queries of one block against the keys from its first row's first key to its last row, in staged tiles of
 * keys and values; each row's scores of a tile in shared memory (written by its first lane), its running
 * maximum m and sum l, its output in acc. */
template <typename A, int F>
__global__ static void __launch_bounds__(ATT_THREADS) attention_forward_kernel(A *out, float *lse, const A *qkv,
                                                                                struct att_shape s)
{
    __shared__ float ks[ATT_TILE_FLOATS], vs[ATT_TILE_FLOATS], scores[ATT_ROWS][ATT_MAX_TILE];
    const struct att_thread t = att_thread_of(s, s.NH);
    const int kvh = t.h / s.group, hs = s.hs, w = ATT_LANES * F, tile = att_tile_rows(w), r = t.row - t.r0;
    const int last = att_min(t.r0 + ATT_ROWS, s.T) - 1, first = att_first_key(s, t.b, t.row);
    const size_t stride = (size_t)(s.NH + 2 * s.NKV) * hs;
    float q[F], acc[F];
    att_frag_load<F>(q, att_row(qkv, s, t.b, t.row, t.h, 0), t.lane, hs, s.scale);
    att_frag_zero<F>(acc);
    float m = -INFINITY, l = 0.0f;
    for (int j0 = att_first_key(s, t.b, t.r0); j0 <= last; j0 += tile) {
        const int n = att_min(tile, last + 1 - j0);
        att_stage<F>(ks, att_row(qkv, s, t.b, j0, kvh, 1), stride, n, hs);
        att_stage<F>(vs, att_row(qkv, s, t.b, j0, kvh, 2), stride, n, hs);
        __syncthreads();
        float mx = m;
        for (int c = 0; c < n; c++) {
            const int j = j0 + c;
            const float dot = att_dot<F>(q, ks + (size_t)c * w, t.lane); /* every lane: a shuffle */
            float slope;
            const float x = j < first || j > t.row ? -INFINITY : att_cap(s, dot, &slope);
            if (t.lane == 0)
                scores[r][c] = x;
            mx = fmaxf(mx, x);
        }
        __syncwarp();
        if (mx > -INFINITY) { /* else no key of this tile is the row's: nothing changes */
            const float correction = expf(m - mx); /* 0 while m is -inf: acc and l are still 0 */
            l *= correction;
#pragma unroll
            for (int k = 0; k < F; k++)
                acc[k] *= correction;
            for (int c = 0; c < n; c++)
                if (scores[r][c] > -INFINITY) {
                    const float p = expf(scores[r][c] - mx);
                    l += p;
                    att_axpy<F>(acc, p, vs + (size_t)c * w, t.lane);
                }
            m = mx;
        }
        __syncthreads();
    }
    if (!t.valid)
        return;
    att_frag_store<F>(att_out_row(out, s, t.b, t.row, t.h), acc, t.lane, hs, 1.0f / l);
    if (t.lane == 0)
        lse[att_lse_at(s, t.b, t.h, t.row)] = m + logf(l);
}

/* D_i = dout_i . out_i, the softmax backward's row term (out = P v, so sum_j P_ij dP_ij), of the row whose
 * output gradient the lanes hold in dy. */
template <int F, typename A> __device__ static float att_row_term(const float *dy, const A *out_row, int lane, int hs)
{
    float y[F];
    att_frag_load<F>(y, out_row, lane, hs, 1.0f);
    float d = 0.0f;
#pragma unroll
    for (int k = 0; k < F; k++)
        d += dy[k] * y[k];
    return att_lanes_sum(d);
}

/* dq_i = scale sum_{first key <= j <= i} P_ij (dP_ij - D_i) k_j, dP_ij = dout_i . v_j: a block of queries over
 * the tiles of keys and values the forward visited. */
template <typename A, int F>
__global__ static void __launch_bounds__(ATT_THREADS) attention_backward_dq(A *dqkv, const A *dout, const A *out,
                                                                             const A *qkv, const float *lse,
                                                                             struct att_shape s)
{
    __shared__ float ks[ATT_TILE_FLOATS], vs[ATT_TILE_FLOATS];
    const struct att_thread t = att_thread_of(s, s.NH);
    const int kvh = t.h / s.group, hs = s.hs, w = ATT_LANES * F, tile = att_tile_rows(w);
    const int last = att_min(t.r0 + ATT_ROWS, s.T) - 1, first = att_first_key(s, t.b, t.row);
    const size_t stride = (size_t)(s.NH + 2 * s.NKV) * hs;
    float q[F], dy[F], acc[F];
    att_frag_load<F>(q, att_row(qkv, s, t.b, t.row, t.h, 0), t.lane, hs, 1.0f);
    att_frag_load<F>(dy, att_out_row(dout, s, t.b, t.row, t.h), t.lane, hs, 1.0f);
    att_frag_zero<F>(acc);
    const float L = lse[att_lse_at(s, t.b, t.h, t.row)];
    const float D = att_row_term<F>(dy, att_out_row(out, s, t.b, t.row, t.h), t.lane, hs);
    for (int j0 = att_first_key(s, t.b, t.r0); j0 <= last; j0 += tile) {
        const int n = att_min(tile, last + 1 - j0);
        att_stage<F>(ks, att_row(qkv, s, t.b, j0, kvh, 1), stride, n, hs);
        att_stage<F>(vs, att_row(qkv, s, t.b, j0, kvh, 2), stride, n, hs);
        __syncthreads();
        for (int c = 0; c < n; c++) {
            float slope;
            const float x = att_cap(s, att_dot<F>(q, ks + (size_t)c * w, t.lane) * s.scale, &slope);
            const float dp = att_dot<F>(dy, vs + (size_t)c * w, t.lane);
            const int j = j0 + c;
            if (j >= first && j <= t.row)
                att_axpy<F>(acc, expf(x - L) * (dp - D) * slope * s.scale, ks + (size_t)c * w, t.lane);
        }
        __syncthreads();
    }
    if (t.valid)
        att_frag_store<F>(att_row(dqkv, s, t.b, t.row, t.h, 0), acc, t.lane, hs, 1.0f);
}

/* For kv head g: dk_j = scale sum_{h in g's group} sum_{j <= i < query end} P^h_ij (dP^h_ij - D^h_i) q^h_i;
 * dv_j = sum_h sum_{j <= i < query end} P^h_ij dout^h_i. A block of keys over the group's query heads in order,
 * for each the tiles of queries (with their output gradients, log-sum-exp, row term and first key) from the
 * block's first key to the end of its last key's sample. */
template <typename A, int F>
__global__ static void __launch_bounds__(ATT_THREADS) attention_backward_dkdv(A *dqkv, const A *dout, const A *out,
                                                                               const A *qkv, const float *lse,
                                                                               struct att_shape s)
{
    __shared__ float qs[ATT_TILE_FLOATS], dys[ATT_TILE_FLOATS];
    __shared__ float Ls[ATT_MAX_TILE], Ds[ATT_MAX_TILE];
    __shared__ int firsts[ATT_MAX_TILE];
    const struct att_thread t = att_thread_of(s, s.NKV);
    const int g = t.h, j = t.row, hs = s.hs, w = ATT_LANES * F, tile = att_tile_rows(w);
    const int end = att_query_end(s, t.b, att_min(t.r0 + ATT_ROWS, s.T) - 1);
    const size_t stride = (size_t)(s.NH + 2 * s.NKV) * hs, out_stride = (size_t)s.NH * hs;
    float k[F], v[F], dk[F], dv[F];
    att_frag_load<F>(k, att_row(qkv, s, t.b, j, g, 1), t.lane, hs, 1.0f);
    att_frag_load<F>(v, att_row(qkv, s, t.b, j, g, 2), t.lane, hs, 1.0f);
    att_frag_zero<F>(dk);
    att_frag_zero<F>(dv);
    for (int h = g * s.group; h < (g + 1) * s.group; h++)
        for (int i0 = t.r0; i0 < end; i0 += tile) {
            const int n = att_min(tile, end - i0);
            att_stage<F>(qs, att_row(qkv, s, t.b, i0, h, 0), stride, n, hs);
            att_stage<F>(dys, att_out_row(dout, s, t.b, i0, h), out_stride, n, hs);
            __syncthreads();
            /* the tile's row terms, ATT_ROWS rows at a time, a row's lanes together as in the forward */
            for (int c0 = 0; c0 < n; c0 += ATT_ROWS) {
                const int c = att_min(c0 + (int)threadIdx.x / ATT_LANES, n - 1), i = i0 + c;
                const A *y = att_out_row(out, s, t.b, i, h);
                float d = 0.0f; /* dout_i (staged) . out_i */
                for (int ch = t.lane; ch < hs; ch += ATT_LANES)
                    d += dys[(size_t)c * w + ch] * ld(y, ch);
                d = att_lanes_sum(d);
                if (c0 + (int)threadIdx.x / ATT_LANES < n && t.lane == 0) {
                    Ds[c] = d;
                    Ls[c] = lse[att_lse_at(s, t.b, h, i)];
                    firsts[c] = att_first_key(s, t.b, i);
                }
            }
            __syncthreads();
            for (int c = 0; c < n; c++) {
                float slope;
                const float x = att_cap(s, att_dot<F>(k, qs + (size_t)c * w, t.lane) * s.scale, &slope);
                const float dp = att_dot<F>(v, dys + (size_t)c * w, t.lane);
                const int i = i0 + c;
                if (j <= i && firsts[c] <= j) {
                    const float p = expf(x - Ls[c]);
                    att_axpy<F>(dv, p, dys + (size_t)c * w, t.lane);
                    att_axpy<F>(dk, p * (dp - Ds[c]) * slope * s.scale, qs + (size_t)c * w, t.lane);
                }
            }
            __syncthreads();
        }
    if (!t.valid)
        return;
    att_frag_store<F>(att_row(dqkv, s, t.b, j, g, 1), dk, t.lane, hs, 1.0f);
    att_frag_store<F>(att_row(dqkv, s, t.b, j, g, 2), dv, t.lane, hs, 1.0f);
}

/* Runs `body` with F bound to the channels per lane the kernels are built for that hold head size hs. */
#define WITH_ATT_FRAG(hs, ...)                            \
    do {                                                  \
        if ((hs) <= 16 * ATT_LANES) {                     \
            constexpr int F = 16;                         \
            __VA_ARGS__;                                  \
        } else if ((hs) <= 32 * ATT_LANES) {              \
            constexpr int F = 32;                         \
            __VA_ARGS__;                                  \
        } else {                                          \
            constexpr int F = ATT_MAX_HS / ATT_LANES;     \
            __VA_ARGS__;                                  \
        }                                                 \
    } while (0)

static struct att_shape att_shape_of(const int32_t *pos, int B, int T, int NH, int NKV, int hs,
                                     const struct attn_opts *opt)
{
    if (NKV < 1 || NH % NKV != 0)
        fail_input("attention: %d key/value heads do not divide %d query heads (model.n_kv_head must divide "
                   "model.n_head)",
                   NKV, NH);
    if (hs > ATT_MAX_HS)
        fail_input("attention: head size %d is more than the %d this CUDA kernel supports (a smaller head size: "
                   "more heads for the same width)",
                   hs, ATT_MAX_HS);
    if (opt && (opt->window < 0 || opt->softcap < 0.0f || opt->scale < 0.0f))
        fail_internal("attention: window %d, soft-cap %g and scale %g must not be negative", opt->window,
                      (double)opt->softcap, (double)opt->scale);
    const float scale = opt && opt->scale > 0.0f ? opt->scale : 1.0f / sqrtf((float)hs);
    struct att_shape s = {B, T, NH, NKV, hs, NH / NKV, scale, pos, opt ? opt->window : 0, opt ? opt->softcap : 0.0f};
    return s;
}

/* lse (B, NH, T) <-> token-major (B T, NH), one thread an element (cudnn_attention.h). */
__global__ static void lse_transpose_kernel(float *dst, const float *src, int B, int T, int NH, int to_token_major)
{
    const size_t n = (size_t)B * T * NH;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t tok = i / NH, h = i % NH, b = tok / T, t = tok % T; /* i: token-major */
        const size_t head_major = (b * NH + h) * T + t;
        if (to_token_major)
            dst[i] = src[head_major];
        else
            dst[head_major] = src[i];
    }
}

extern "C" void attention_lse_transpose(float *dst, const float *src, int B, int T, int NH, int to_token_major,
                                        cudaStream_t stream)
{
    lse_transpose_kernel<<<blocks_for((size_t)B * T * NH, BLOCK), BLOCK, 0, stream>>>(dst, src, B, T, NH,
                                                                                      to_token_major);
}

/* ---- which kernel: cuDNN, tensor cores or FP32 (sdpa_layout.h) ------------------------------------------- */

/* SHARDLM_ATTENTION, read at every call (a getenv: tests/gpu/check_kernels.c switches it between cases). */
static enum attn_kernel attention_wanted(void)
{
    const char *env = getenv("SHARDLM_ATTENTION");
    enum attn_kernel k;
    if (attn_kernel_parse(env, &k) != 0)
        fail_input("SHARDLM_ATTENTION='%s' is not a CUDA attention kernel; set it to 'cudnn' (the default: cuDNN's "
                   "fused attention where it applies), 'tc' (the tensor-core kernel) or 'fp32'",
                   env);
    return k;
}

/* Says once, per distinct reason, why the attention runs another kernel than the one wanted: a run logs one
 * line when cuDNN is missing, not one per call; past NOTES reasons (shapes cuDNN refuses, each its own), one
 * line says the rest go unsaid. */
static void attention_note(const char *why)
{
    enum { NOTES = 8 };
    static char seen[NOTES][256]; /* each reason's first 255 characters */
    static int n;
    for (int i = 0; i < n && i < NOTES; i++)
        if (strncmp(seen[i], why, sizeof seen[i] - 1) == 0)
            return;
    if (n > NOTES)
        return;
    if (n == NOTES) {
        n++;
        log_info("attention: more than %d reasons to run another kernel than SHARDLM_ATTENTION's; the rest are not "
                 "logged",
                 NOTES);
        return;
    }
    const size_t len = strnlen(why, sizeof seen[0] - 1);
    memcpy(seen[n], why, len);
    seen[n++][len] = 0;
    log_info("%s", why);
}

/* The kernel for a call with these tensors: SHARDLM_ATTENTION's, or the next that applies (noted once). */
static enum attn_kernel attention_kernel(int hs, const void *a, const void *b)
{
    const enum attn_kernel want = attention_wanted();
    const char *tc = getenv("SHARDLM_ATTN_TC"), *missing = NULL;
    struct attn_call c = {g_act, hs, (uintptr_t)a % 16 == 0 && (uintptr_t)b % 16 == 0, !(tc && strcmp(tc, "0") == 0),
                          0, cudnn_attention_headers(), NULL};
    if (want == ATTN_KERNEL_CUDNN && g_act != DTYPE_F32) { /* loads the library at the first call */
        c.cudnn_version = cudnn_attention_library(&missing);
        c.cudnn_missing = missing;
    }
    char why[512] = "";
    const enum attn_kernel k = attn_kernel_choose(want, &c, why, sizeof why);
    if (why[0] && !(want == ATTN_KERNEL_CUDNN && g_act == DTYPE_F32)) /* fp32 training: nothing to say */
        attention_note(why);
    return k;
}

/* cuDNN refused or failed a call it was chosen for: the tensor-core kernel instead, said once per reason. */
static void attention_cudnn_refused(const char *why)
{
    char line[640];
    snprintf(line, sizeof line, "attention: cudnn wanted, but %s; the tc kernel runs", why);
    attention_note(line);
}

/* att: the rows' log-sum-exp (B NH T fp32), kept for the backward. */
extern "C" void backend_attention_gqa_forward(float *out, float *att, const float *qkv, float *scratch,
                                              const int32_t *pos, int B, int T, int NH, int NKV, int hs,
                                              const struct attn_opts *opt)
{
    (void)scratch;
    const struct att_shape s = att_shape_of(pos, B, T, NH, NKV, hs, opt);
    const enum attn_kernel k = attention_kernel(hs, out, qkv);
    if (k == ATTN_KERNEL_CUDNN) {
        char why[512];
        if (cudnn_attention_forward(out, att, qkv, pos, B, T, NH, NKV, hs, opt, g_act, g_stream, why, sizeof why))
            return;
        attention_cudnn_refused(why);
    }
    if (k != ATTN_KERNEL_FP32 &&
        attention_tc_forward(out, att, qkv, pos, B, T, NH, NKV, hs, opt, g_act, g_stream))
        return;
    const dim3 grid((unsigned)(B * NH), (unsigned)((T + ATT_ROWS - 1) / ATT_ROWS));
    WITH_ACT(WITH_ATT_FRAG(hs, attention_forward_kernel<A, F><<<grid, ATT_THREADS, 0, g_stream>>>((A *)out, att,
                                                                                                 (const A *)qkv, s)));
}

/* out: the forward's output (backend.h: the attention's output is kept). Any backward follows any forward:
 * all three keep the same log-sum-exp. */
extern "C" void backend_attention_gqa_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                                               const float *out, float *scratch, const int32_t *pos, int B, int T,
                                               int NH, int NKV, int hs, const struct attn_opts *opt)
{
    (void)scratch;
    const struct att_shape s = att_shape_of(pos, B, T, NH, NKV, hs, opt);
    const enum attn_kernel k = attention_kernel(hs, dqkv, dout);
    if (k == ATTN_KERNEL_CUDNN) {
        char why[512];
        if (cudnn_attention_backward(dqkv, dout, out, qkv, att, pos, B, T, NH, NKV, hs, opt, g_act, g_stream, why,
                                     sizeof why))
            return;
        attention_cudnn_refused(why);
    }
    if (k != ATTN_KERNEL_FP32 &&
        attention_tc_backward(dqkv, dout, out, qkv, att, pos, B, T, NH, NKV, hs, opt, g_act, g_stream))
        return;
    const unsigned row_blocks = (unsigned)((T + ATT_ROWS - 1) / ATT_ROWS);
    const dim3 q_grid((unsigned)(B * NH), row_blocks), kv_grid((unsigned)(B * NKV), row_blocks);
    WITH_ACT(WITH_ATT_FRAG(hs, {
        attention_backward_dq<A, F><<<q_grid, ATT_THREADS, 0, g_stream>>>((A *)dqkv, (const A *)dout, (const A *)out,
                                                                       (const A *)qkv, att, s);
        attention_backward_dkdv<A, F><<<kv_grid, ATT_THREADS, 0, g_stream>>>(
            (A *)dqkv, (const A *)dout, (const A *)out, (const A *)qkv, att, s);
    }));
}

/* GPT-2: NKV = NH heads of C / NH channels. */
extern "C" void backend_attention_forward(float *out, float *att, const float *qkv, float *scratch, const int32_t *pos,
                                          int B, int T, int C, int NH)
{
    backend_attention_gqa_forward(out, att, qkv, scratch, pos, B, T, NH, NH, C / NH, NULL);
}

extern "C" void backend_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                                           const float *out, float *scratch, const int32_t *pos, int B, int T, int C,
                                           int NH)
{
    backend_attention_gqa_backward(dqkv, dout, qkv, att, out, scratch, pos, B, T, NH, NH, C / NH, NULL);
}

extern "C" size_t backend_attention_saved(int B, int T, int NH) { return BACKEND_CUDA_ATTENTION_SAVED(B, T, NH); }

extern "C" size_t backend_attention_scratch(int T, int NH) { return BACKEND_CUDA_ATTENTION_SCRATCH(T, NH); }

/* ---- attention with a key/value cache (generation) ------------------------------------------------ */

/* The cache's slot of position p: a ring of the last Tc positions (p itself when Tc holds every position). */
__device__ static size_t kv_slot(int p, int Tc) { return (size_t)(p % Tc); }

/* The kept new tokens' keys and values into the cache at their rows' slots (backend.h): the first keep[b] of row
 * b's T, the last Tc of those (so that no two tokens of a call share a slot). After the attention, which reads
 * the slots these overwrite. */
template <typename A>
__global__ static void kv_store_kernel(A *kc, A *vc, const A *qkv, const int32_t *past, const int32_t *keep, int B,
                                       int T, int NH, int NKV, int hs, int Tc)
{
    const size_t kvw = (size_t)NKV * hs, row = (size_t)(NH + 2 * NKV) * hs, n = (size_t)B * T * kvw;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t tok = i / kvw, c = i % kvw;
        const int b = (int)(tok / T), t = (int)(tok % T), kept = keep ? keep[b] : T;
        if (t >= kept || t < kept - Tc)
            continue;
        const size_t at = ((size_t)b * Tc + kv_slot(past[b] + t, Tc)) * kvw + c;
        kc[at] = qkv[tok * row + (size_t)NH * hs + c];
        vc[at] = qkv[tok * row + (size_t)NH * hs + kvw + c];
    }
}

/* Head sizes the cached attention takes (Llama and GPT-2 models have 64 or 128). */
#define KV_MAX_HS 256

/* One block (BLOCK threads) per (token, query head): the keys of its row from max(0, p - W + 1) to its position
 * p in chunks of BLOCK, one score per thread, with the online softmax (running maximum and sum, the accumulated
 * values rescaled); the keys before past[b] from the cache's ring, the others from the call's own tokens.
 * Shared: q and the accumulator (hs each), the chunk's weights (BLOCK). */
template <typename A>
__global__ static void kv_attention_kernel(A *out, const A *qkv, const A *kc, const A *vc, const int32_t *past, int T,
                                           int NH, int NKV, int hs, int Tc, struct att_shape s)
{
    __shared__ float q[KV_MAX_HS], acc[KV_MAX_HS], w[BLOCK];
    const int tok = blockIdx.x / NH, h = blockIdx.x % NH, b = tok / T, t = tok % T;
    const size_t kvw = (size_t)NKV * hs, row = (size_t)(NH + 2 * NKV) * hs, kv_head = (size_t)(h / (NH / NKV)) * hs;
    for (int i = threadIdx.x; i < hs; i += blockDim.x) {
        q[i] = ld(qkv, (size_t)tok * row + (size_t)h * hs + i);
        acc[i] = 0.0f;
    }
    __syncthreads();
    const A *k = kc + (size_t)b * Tc * kvw + kv_head, *v = vc + (size_t)b * Tc * kvw + kv_head;
    const A *knew = qkv + (size_t)b * T * row + (size_t)NH * hs + kv_head, *vnew = knew + kvw;
    const int P = past[b], p = P + t, lo = s.window > 0 && p - s.window + 1 > 0 ? p - s.window + 1 : 0;
    const int n = p + 1 - lo;
    float m = -INFINITY, l = 0.0f;
    for (int j0 = 0; j0 < n; j0 += blockDim.x) {
        const int jj0 = j0 + threadIdx.x, cnt = n - j0 < (int)blockDim.x ? n - j0 : (int)blockDim.x;
        float x = -INFINITY;
        if (jj0 < n) {
            const int j = lo + jj0;
            const A *kj = j < P ? k + kv_slot(j, Tc) * kvw : knew + (size_t)(j - P) * row;
            float dot = 0.0f;
            for (int i = 0; i < hs; i++)
                dot += q[i] * ld(kj, i);
            float slope;
            x = att_cap(s, dot * s.scale, &slope);
        }
        const float m_new = fmaxf(m, block_reduce(x, true));
        const float e = jj0 < n ? expf(x - m_new) : 0.0f;
        w[threadIdx.x] = e;
        const float chunk = block_reduce(e, false), corr = expf(m - m_new);
        __syncthreads();
        for (int i = threadIdx.x; i < hs; i += blockDim.x) {
            float a = acc[i] * corr;
            for (int c = 0; c < cnt; c++) {
                const int j = lo + j0 + c;
                a += w[c] * ld(j < P ? v + kv_slot(j, Tc) * kvw : vnew + (size_t)(j - P) * row, i);
            }
            acc[i] = a;
        }
        l = l * corr + chunk;
        m = m_new;
        __syncthreads();
    }
    for (int i = threadIdx.x; i < hs; i += blockDim.x)
        st(out, (size_t)tok * NH * hs + (size_t)h * hs + i, acc[i] / l);
}

extern "C" void backend_attention_kv_forward(float *out, const float *qkv, float *kc, float *vc, const int32_t *past,
                                             const int32_t *keep, int B, int T, int NH, int NKV, int hs, int Tc,
                                             const struct attn_opts *opt)
{
    if (hs > KV_MAX_HS)
        fail_internal("attention with a cache: head size %d, above the %d the kernel holds", hs, KV_MAX_HS);
    const struct att_shape s = att_shape_of(NULL, B, T, NH, NKV, hs, opt);
    WITH_ACT({
        kv_attention_kernel<A><<<(unsigned)(B * T * NH), BLOCK, 0, g_stream>>>(
            (A *)out, (const A *)qkv, (const A *)kc, (const A *)vc, past, T, NH, NKV, hs, Tc, s);
        kv_store_kernel<A><<<blocks_for((size_t)B * T * NKV * hs, BLOCK), BLOCK, 0, g_stream>>>(
            (A *)kc, (A *)vc, (const A *)qkv, past, keep, B, T, NH, NKV, hs, Tc);
    });
}
