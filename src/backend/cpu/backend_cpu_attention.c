/*
 * CPU backend, causal self-attention (backend.h): the multi-head and
 * grouped-query kernels over packed rows, and attention through a key/value
 * cache for generation. OpenBLAS sgemm for the products, OpenMP over heads
 * and tiles; sgemm calls inside our parallel regions run single-threaded.
 *
 * Two kernels compute the same attention (backend_cpu_attention.h picks one):
 *
 * tiled (the default): FlashAttention-2 (Dao 2023). The forward walks tiles
 * of ATTN_TILE_Q queries x ATTN_TILE_K keys with an online softmax (a
 * running maximum and sum per row, fp32) and accumulates the output in place;
 * it keeps the output and each row's log-sum-exp (B, NH, T) fp32, exactly
 * what the CUDA backend keeps. The backward recomputes the probabilities of
 * each tile from q, k and that log-sum-exp, P = exp(S - lse), with
 * D_i = dout_i . out_i, dS = P (dP - D) and the products dV += P^T dout,
 * dK += dS^T Q, dQ += dS K. Memory: no T x T anywhere; the scratch is two
 * tiles and two row vectors per thread, whatever T.
 *
 * materialized (SHARDLM_ATTENTION=materialized): the forward keeps the
 * probabilities (B, NH, T, T) [A]; the backward uses them with a T x T
 * scratch per thread. Fewer FLOPs (no recomputation), O(T^2) memory.
 *
 * Both skip the keys a block of queries cannot see: tiles above the diagonal
 * and, in packed rows, before the block's first query's sample; rows then
 * mask only the keys of the tiles they share with other samples. Both are
 * deterministic: each output element is owned by one task and its sums run
 * in a fixed order, whatever the thread count.
 */
#include "backend/backend.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cpu_act.h"
#include "backend_cpu_attention.h"
#include "core/devemu.h"
#include "core/fastmath.h"
#include "core/util.h"

#define ATTN_ROW_BLOCK 64 /* materialized: rows per causal block, skips most of the masked half */
/* tiled: queries x keys per tile, and rows per block of a query tile's own keys (the causal triangle, which a
 * whole tile would compute twice over). The products are OpenBLAS calls on tiles, whose packing and call
 * overhead shrink as tiles grow, while a thread's two tiles (2 x 128 x 512 floats, 512 KiB) should stay in its
 * L2 cache. Measured on a 2-core AVX-512 Xeon (OpenBLAS SkylakeX; B 1, 12 heads over 4, hs 64, T 256 .. 4096;
 * tools/bench/attention.sh, best of many rounds on a shared machine): among 64..256 x 128..1024 tiles, 128 x
 * 512 was the fastest, or within the noise of it, at every length; triangles in blocks of 32 rows cut the
 * work at T = 256 by a quarter (the whole tile: 1.5 times the needed products; the materialized kernel's
 * 64-row blocks: 1.25) and cost nothing measurable at T >= 1024. */
#ifndef ATTN_TILE_Q /* the gradient check's f64 twin sets small tiles, so that a few tokens cross them */
#define ATTN_TILE_Q 128
#define ATTN_TILE_K 512
#define ATTN_TILE_DIAG 32
#endif

/* ---- which kernel ---------------------------------------------------------------------------------------- */

static int g_kernel = -1; /* enum cpu_attention, -1 until SHARDLM_ATTENTION is read */

enum cpu_attention backend_cpu_attention_kernel(void)
{
    if (g_kernel < 0) {
        const char *name = getenv("SHARDLM_ATTENTION");
        if (!name || !*name || strcmp(name, "tiled") == 0)
            g_kernel = CPU_ATTENTION_TILED;
        else if (strcmp(name, "materialized") == 0)
            g_kernel = CPU_ATTENTION_MATERIALIZED;
        else
            fail_input("SHARDLM_ATTENTION='%s' is not a CPU attention kernel; set it to 'tiled' (the default) or "
                       "'materialized'",
                       name);
    }
    return (enum cpu_attention)g_kernel;
}

void backend_cpu_attention_use(enum cpu_attention kernel) { g_kernel = (int)kernel; }

static int tiled(void) { return backend_cpu_attention_kernel() == CPU_ATTENTION_TILED; }

/* Queries and keys per tile of a T-token row, and one thread's workspace in
 * floats: the scores (then probabilities) tile, a second tile (the backward's
 * dP, then dS) and two row vectors (the forward's running maximum and sum). */
static int tile_rows(int T) { return T < ATTN_TILE_Q ? T : ATTN_TILE_Q; }
static int tile_keys(int T) { return T < ATTN_TILE_K ? T : ATTN_TILE_K; }
static size_t tiled_thread_floats(int T)
{
    return 2 * (size_t)tile_rows(T) * (size_t)tile_keys(T) + 2 * (size_t)tile_rows(T);
}

/* tiled: each row's log-sum-exp, fp32 (B, NH, T); materialized: the probabilities (B, NH, T, T) [A]. */
size_t backend_attention_saved(int B, int T, int NH)
{
    if (tiled())
        return (size_t)B * (size_t)NH * (size_t)T * sizeof(float);
#ifdef BACKEND_CPU_NO_ACT
    const size_t es = sizeof(float);
#else
    const size_t es = (size_t)dtype_size(backend_act_dtype());
#endif
    return (size_t)B * (size_t)NH * (size_t)T * (size_t)T * es;
}

/* Per thread: tiled, two tiles and two row vectors; materialized, one (T, T) matrix. */
size_t backend_attention_scratch(int T, int NH)
{
    (void)NH;
    return (size_t)omp_get_max_threads() * (tiled() ? tiled_thread_floats(T) : (size_t)T * (size_t)T);
}

/* The shape of one attention call, and its variant (backend.h struct attn_opts). */
struct attn_dims {
    int B, T, NH, NKV, hs;
    int row;       /* a token's width in qkv, (NH + 2 NKV) hs */
    int C;         /* a token's width in out and dout, NH hs */
    int group;     /* query heads per key/value head, NH / NKV */
    int window;    /* keys per query at most, itself included (0: no limit) */
    float softcap; /* c: scores c tanh(s / c) (0: none) */
    float scale;   /* of the scores: opt's, or 1 / sqrt(hs) */
};

/* The first key query i of a row may see: its sample's first token i - pos[i] (0 without positions), or with a
 * window W the key W - 1 before it when that is later. pos_row is the row's positions or NULL. Nondecreasing in
 * i, so a block of queries needs the keys from its first query's first key. */
static inline int attention_first_key(const struct attn_dims *d, const int32_t *pos_row, int i)
{
    const int first = pos_row ? i - pos_row[i] : 0;
    return d->window > 0 && i - d->window + 1 > first ? i - d->window + 1 : first;
}

/* One past the last query that sees key j: the next sample's first token (T without positions), or with a
 * window the query W after j when that is sooner. */
static inline int attention_query_end(const struct attn_dims *d, const int32_t *pos_row, int j)
{
    int i = j + 1;
    if (!pos_row)
        i = d->T;
    else
        while (i < d->T && pos_row[i] != 0)
            i++;
    return d->window > 0 && j + d->window < i ? j + d->window : i;
}

/* Scores s[lo, hi) soft-capped in place, c tanh(s / c), when the call caps them. */
static inline void attention_softcap(const struct attn_dims *d, float *s, int lo, int hi)
{
    if (d->softcap <= 0.0f)
        return;
    const float c = d->softcap, inv = 1.0f / d->softcap;
    for (int j = lo; j < hi; j++)
        s[j] = c * tanhf(s[j] * inv);
}

/* The attention's reading of pos (backend.h): every row samples laid end to end, so that a query's keys and a
 * key's queries are contiguous ranges. Anything else would index outside the row. */
static void attention_check_positions(const int32_t *pos, int B, int T)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const int32_t p = pos[(size_t)b * T + t], before = t ? pos[(size_t)b * T + t - 1] : -1;
            if (p != 0 && p != before + 1)
                fail_internal("attention: position %d of token %d in row %d follows %d; a row's positions must be "
                              "samples laid end to end (0, 1, 2, ... for each sample)",
                              p, t, b, before);
        }
}

/* x[0, lo) and x[hi, n) set to 0: a row's entries outside the keys it sees, [lo, hi). */
static void zero_outside(float *x, int n, int lo, int hi)
{
    memset(x, 0, (size_t)lo * sizeof *x);
    memset(x + hi, 0, (size_t)(n - hi) * sizeof *x);
}

/* The scale of the scores: opt's, or 1 / sqrt(hs). */
static float attention_scale(const struct attn_opts *opt, int hs)
{
    return opt && opt->scale > 0.0f ? (float)opt->scale : 1.0f / sqrtf((float)hs);
}

/* The shape and variant of a call whose positions pos (host view) are checked. */
static struct attn_dims attn_dims_of(const int32_t *pos, int B, int T, int NH, int NKV, int hs,
                                     const struct attn_opts *opt)
{
    if (pos)
        attention_check_positions(pos, B, T);
    if (opt && (opt->window < 0 || opt->softcap < 0.0f || opt->scale < 0.0f))
        fail_internal("attention: window %d, soft-cap %g and scale %g must not be negative", opt->window,
                      (double)opt->softcap, (double)opt->scale);
    return (struct attn_dims){B,       T,       NH,         NKV, hs, (NH + 2 * NKV) * hs, NH * hs, NH / NKV,
                              opt ? opt->window : 0, opt ? (float)opt->softcap : 0.0f, attention_scale(opt, hs)};
}

/* ---- materialized ---------------------------------------------------------------------------------------- */

static void materialized_forward(float *out, float *att, const float *qkv, const int32_t *pos,
                                 const struct attn_dims *d)
{
    const int T = d->T, NH = d->NH, NKV = d->NKV, hs = d->hs, C = d->C, row = d->row, group = d->group;
    const float scale = d->scale;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < d->B; b++)
        for (int h = 0; h < NH; h++) {
            const int32_t *pos_row = pos ? pos + (size_t)b * T : NULL;
            const float *q = qkv + (size_t)b * T * row + (size_t)h * hs;
            const float *k = qkv + (size_t)b * T * row + (size_t)(NH + h / group) * hs;
            const float *v = k + (size_t)NKV * hs;
            float *p = att + ((size_t)b * NH + h) * T * T;
            float *y = out + (size_t)b * T * C + (size_t)h * hs;
            /* Scores of rows [i0, i1) against the keys they may see, [k0, i1): k0 the first row's first key. */
            for (int i0 = 0; i0 < T; i0 += ATTN_ROW_BLOCK) {
                int i1 = i0 + ATTN_ROW_BLOCK < T ? i0 + ATTN_ROW_BLOCK : T, k0 = attention_first_key(d, pos_row, i0);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i1 - i0, i1 - k0, hs, scale,
                            q + (size_t)i0 * row, row, k + (size_t)k0 * row, row, 0.0f, p + (size_t)i0 * T + k0, T);
            }
            for (int i = 0; i < T; i++) {
                float *prow = p + (size_t)i * T;
                const int j0 = attention_first_key(d, pos_row, i);
                attention_softcap(d, prow, j0, i + 1);
                float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
                for (int j = j0; j <= i; j++)
                    mx = prow[j] > mx ? prow[j] : mx;
                float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                for (int j = j0; j <= i; j++) {
                    prow[j] = fast_expf(prow[j] - mx);
                    sum += prow[j];
                }
                float inv = 1.0f / sum;
                for (int j = j0; j <= i; j++)
                    prow[j] *= inv;
                zero_outside(prow, T, j0, i + 1);
            }
            for (int i0 = 0; i0 < T; i0 += ATTN_ROW_BLOCK) {
                int i1 = i0 + ATTN_ROW_BLOCK < T ? i0 + ATTN_ROW_BLOCK : T, k0 = attention_first_key(d, pos_row, i0);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i1 - i0, hs, i1 - k0, 1.0f,
                            p + (size_t)i0 * T + k0, T, v + (size_t)k0 * row, row, 0.0f, y + (size_t)i0 * C, C);
            }
        }
}

/* The backward of one query head h; dk and dv of its key/value head are
 * overwritten by the group's first head (beta 0) and accumulated by the others.
 * P and dS are zero outside each row's keys [first key, i]: rows [i0, i1)
 * need the keys from the first row's first key, and keys [j0, j1) the rows up
 * to the end of the sample of key j1 - 1. */
static void materialized_head_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                                       float *ds, const int32_t *pos, const struct attn_dims *d, int b, int h)
{
    const int T = d->T, NH = d->NH, NKV = d->NKV, hs = d->hs, C = d->C, row = d->row, group = d->group;
    const float scale = d->scale;
    const float beta = h % group == 0 ? 0.0f : 1.0f;
    const size_t kv_at = (size_t)(NH + h / group) * hs;
    const int32_t *pos_row = pos ? pos + (size_t)b * T : NULL;
    const float *q = qkv + (size_t)b * T * row + (size_t)h * hs;
    const float *k = qkv + (size_t)b * T * row + kv_at, *v = k + (size_t)NKV * hs;
    float *dq = dqkv + (size_t)b * T * row + (size_t)h * hs;
    float *dk = dqkv + (size_t)b * T * row + kv_at, *dv = dk + (size_t)NKV * hs;
    const float *p = att + ((size_t)b * NH + h) * T * T;
    const float *dy = dout + (size_t)b * T * C + (size_t)h * hs;
    /* dP = dY V^T over the rows' blocks of keys; dV = P^T dY. */
    for (int i0 = 0; i0 < T; i0 += ATTN_ROW_BLOCK) {
        int i1 = i0 + ATTN_ROW_BLOCK < T ? i0 + ATTN_ROW_BLOCK : T, k0 = attention_first_key(d, pos_row, i0);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i1 - i0, i1 - k0, hs, 1.0f,
                    dy + (size_t)i0 * C, C, v + (size_t)k0 * row, row, 0.0f, ds + (size_t)i0 * T + k0, T);
    }
    /* Rows [j0, j1) of dV need only rows j0 <= i < the end of key j1 - 1's sample of P and dY. */
    for (int j0 = 0; j0 < T; j0 += ATTN_ROW_BLOCK) {
        int j1 = j0 + ATTN_ROW_BLOCK < T ? j0 + ATTN_ROW_BLOCK : T, i1 = attention_query_end(d, pos_row, j1 - 1);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, j1 - j0, hs, i1 - j0, 1.0f,
                    p + (size_t)j0 * T + j0, T, dy + (size_t)j0 * C, C, beta, dv + (size_t)j0 * row, row);
    }
    /* Softmax backward in place, with the 1/sqrt(hs) of the scores folded in. */
    for (int i = 0; i < T; i++) {
        const float *prow = p + (size_t)i * T;
        float *drow = ds + (size_t)i * T;
        const int j0 = attention_first_key(d, pos_row, i);
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int j = j0; j <= i; j++)
            dot += prow[j] * drow[j];
        for (int j = j0; j <= i; j++)
            drow[j] = prow[j] * (drow[j] - dot) * scale;
        if (d->softcap > 0.0f) /* d(c tanh(s / c)) = 1 - tanh^2, from the score computed again */
            for (int j = j0; j <= i; j++) {
                const float *kj = k + (size_t)j * row, *qi = q + (size_t)i * row;
                float dotqk = 0.0f;
                for (int c = 0; c < hs; c++)
                    dotqk += qi[c] * kj[c];
                const float th = tanhf(dotqk * scale / d->softcap);
                drow[j] *= 1.0f - th * th;
            }
        zero_outside(drow, T, j0, i + 1);
    }
    /* dQ = dS K and dK = dS^T Q, over the same blocks of the block-diagonal lower-triangular dS. */
    for (int i0 = 0; i0 < T; i0 += ATTN_ROW_BLOCK) {
        int i1 = i0 + ATTN_ROW_BLOCK < T ? i0 + ATTN_ROW_BLOCK : T, k0 = attention_first_key(d, pos_row, i0);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i1 - i0, hs, i1 - k0, 1.0f,
                    ds + (size_t)i0 * T + k0, T, k + (size_t)k0 * row, row, 0.0f, dq + (size_t)i0 * row, row);
    }
    for (int j0 = 0; j0 < T; j0 += ATTN_ROW_BLOCK) {
        int j1 = j0 + ATTN_ROW_BLOCK < T ? j0 + ATTN_ROW_BLOCK : T, i1 = attention_query_end(d, pos_row, j1 - 1);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, j1 - j0, hs, i1 - j0, 1.0f,
                    ds + (size_t)j0 * T + j0, T, q + (size_t)j0 * row, row, beta, dk + (size_t)j0 * row, row);
    }
}

/* One task per key/value head: its query heads in order, so the shared dk and dv add up in a fixed order and
 * never race. */
static void materialized_backward(float *dqkv, const float *dout, const float *qkv, const float *att, float *scratch,
                                  const int32_t *pos, const struct attn_dims *d)
{
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < d->B; b++)
        for (int g = 0; g < d->NKV; g++) {
            float *ds = scratch + (size_t)omp_get_thread_num() * d->T * d->T;
            for (int h = g * d->group; h < (g + 1) * d->group; h++)
                materialized_head_backward(dqkv, dout, qkv, att, ds, pos, d, b, h);
        }
}

/* ---- tiled ----------------------------------------------------------------------------------------------- */

/* Row r of a forward tile: s[0, n) its scaled scores against keys [j0, j0 + n), of which it sees [lo, hi)
 * (maybe none). Overwrites s with exp(s - the new running maximum), 0 outside [lo, hi); updates the running
 * maximum m and sum l, and rescales y (hs), the row's output so far, to the new maximum. */
static void tiled_softmax_row(const struct attn_dims *d, float *s, int n, int lo, int hi, float *m, float *l, float *y,
                              int hs)
{
    if (lo >= hi) {
        memset(s, 0, (size_t)n * sizeof *s);
        return;
    }
    attention_softcap(d, s, lo, hi);
    float mx = *m;
#pragma omp simd reduction(max : mx)
    for (int j = lo; j < hi; j++)
        mx = s[j] > mx ? s[j] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = lo; j < hi; j++) {
        s[j] = fast_expf(s[j] - mx);
        sum += s[j];
    }
    zero_outside(s, n, lo, hi);
    /* no keys yet: y and l are 0 */
    const float correction = *m == -INFINITY ? 0.0f : fast_expf(*m - mx);
    *l = *l * correction + sum;
    *m = mx;
    if (correction != 1.0f)
        for (int c = 0; c < hs; c++)
            y[c] *= correction;
}

/* One forward task: queries [i0, i1) of one head of one sequence. */
struct forward_tile {
    const float *q;       /* row i0 of the query head */
    const float *k, *v;   /* row 0 of its key and value heads */
    float *y;             /* row i0 of the output head, accumulated in place */
    float *s, *m, *l;     /* workspace: the scores (ld a row), each row's running maximum and sum */
    const int32_t *pos_row;
    int i0, ld;
};

/* Rows [r0, r1) of the tile against keys [j0, j1): one step of the online softmax. */
static void tiled_forward_step(const struct forward_tile *t, const struct attn_dims *d, int r0, int r1, int j0,
                               int j1)
{
    const int n = j1 - j0, row = d->row, C = d->C;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, n, d->hs, d->scale, t->q + (size_t)(r0 - t->i0) * row,
                row, t->k + (size_t)j0 * row, row, 0.0f, t->s, t->ld);
    for (int i = r0; i < r1; i++) {
        const int first = attention_first_key(d, t->pos_row, i);
        const int hi = i + 1 < j1 ? i + 1 - j0 : n, r = i - t->i0;
        const int lo = first > j0 ? (first - j0 < hi ? first - j0 : hi) : 0; /* lo = hi: none of these keys */
        tiled_softmax_row(d, t->s + (size_t)(i - r0) * t->ld, n, lo, hi, &t->m[r], &t->l[r], t->y + (size_t)r * C,
                          d->hs);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, d->hs, n, 1.0f, t->s, t->ld,
                t->v + (size_t)j0 * row, row, 1.0f, t->y + (size_t)(r0 - t->i0) * C, C);
}

/* Queries [i0, i0 + ATTN_TILE_Q) of head h of sequence b: out and their log-sum-exp lse (B, NH, T). First the
 * keys before the tile, from its first query's first key, in tiles of ATTN_TILE_K with every row; then the
 * triangle of the tile's own keys, rows in blocks of ATTN_TILE_DIAG against the keys up to their last row
 * (a whole tile would compute its masked half). Each row masks the keys outside its own. */
static void tiled_forward_rows(float *out, float *lse, const float *qkv, const int32_t *pos_row, float *work,
                               const struct attn_dims *d, int b, int h, int i0)
{
    const int T = d->T, hs = d->hs, ld = tile_keys(T), i1 = i0 + ATTN_TILE_Q < T ? i0 + ATTN_TILE_Q : T;
    const float *k = qkv + (size_t)b * T * d->row + (size_t)(d->NH + h / d->group) * hs;
    const struct forward_tile t = {.q = qkv + ((size_t)b * T + i0) * d->row + (size_t)h * hs,
                                   .k = k,
                                   .v = k + (size_t)d->NKV * hs,
                                   .y = out + ((size_t)b * T + i0) * d->C + (size_t)h * hs,
                                   .s = work,
                                   .m = work + (size_t)tile_rows(T) * ld,
                                   .l = work + (size_t)tile_rows(T) * ld + tile_rows(T),
                                   .pos_row = pos_row,
                                   .i0 = i0,
                                   .ld = ld};
    for (int r = 0; r < i1 - i0; r++) {
        t.m[r] = -INFINITY;
        t.l[r] = 0.0f;
        memset(t.y + (size_t)r * d->C, 0, (size_t)hs * sizeof *t.y);
    }
    for (int j0 = attention_first_key(d, pos_row, i0); j0 < i0; j0 += ATTN_TILE_K)
        tiled_forward_step(&t, d, i0, i1, j0, j0 + ATTN_TILE_K < i0 ? j0 + ATTN_TILE_K : i0);
    for (int r0 = i0; r0 < i1; r0 += ATTN_TILE_DIAG) {
        const int r1 = r0 + ATTN_TILE_DIAG < i1 ? r0 + ATTN_TILE_DIAG : i1;
        tiled_forward_step(&t, d, r0, r1, i0, r1);
    }
    float *row_lse = lse + ((size_t)b * d->NH + h) * T + i0;
    for (int r = 0; r < i1 - i0; r++) {
        const float inv = 1.0f / t.l[r];
        for (int c = 0; c < hs; c++)
            t.y[(size_t)r * d->C + c] *= inv;
        row_lse[r] = t.m[r] + logf(t.l[r]);
    }
}

/* One task per (sequence, head, query tile), the last tiles (the most keys) first. */
static void tiled_forward(float *out, float *lse, const float *qkv, float *scratch, const int32_t *pos,
                          const struct attn_dims *d)
{
    const long long heads = (long long)d->B * d->NH, tiles = (d->T + ATTN_TILE_Q - 1) / ATTN_TILE_Q;
#pragma omp parallel for schedule(dynamic, 1)
    for (long long task = 0; task < heads * tiles; task++) {
        const int tile = (int)(tiles - 1 - task / heads), b = (int)(task % heads / d->NH), h = (int)(task % d->NH);
        float *work = scratch + (size_t)omp_get_thread_num() * tiled_thread_floats(d->T);
        tiled_forward_rows(out, lse, qkv, pos ? pos + (size_t)b * d->T : NULL, work, d, b, h, tile * ATTN_TILE_Q);
    }
}

/* The gradients of queries [i0, i1) of head h against keys [j0, j1) of its key/value head, sequence b: adds
 * into dq of those queries and dk, dv of those keys. Each row sees the keys of the tile in [its first key, itself]. */
static void tiled_backward_tile(float *dqkv, const float *dout, const float *qkv, const float *lse, const float *out,
                                const int32_t *pos_row, float *work, const struct attn_dims *d, int b, int h, int i0,
                                int i1, int j0, int j1)
{
    const int T = d->T, hs = d->hs, row = d->row, C = d->C, ld = tile_keys(T), rows = i1 - i0, n = j1 - j0;
    const size_t q_at = ((size_t)b * T + i0) * row + (size_t)h * hs;
    const size_t k_at = ((size_t)b * T + j0) * row + (size_t)(d->NH + h / d->group) * hs;
    const size_t v_at = k_at + (size_t)d->NKV * hs, y_at = ((size_t)b * T + i0) * C + (size_t)h * hs;
    const float *row_lse = lse + ((size_t)b * d->NH + h) * T + i0;
    float *p = work, *ds = work + (size_t)tile_rows(T) * ld;
    /* S = scale Q K^T (into p) and dP = dout V^T (into ds) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, n, hs, d->scale, qkv + q_at, row, qkv + k_at, row,
                0.0f, p, ld);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, n, hs, 1.0f, dout + y_at, C, qkv + v_at, row, 0.0f,
                ds, ld);
    for (int r = 0; r < rows; r++) {
        const int i = i0 + r, first = attention_first_key(d, pos_row, i), hi = i + 1 < j1 ? i + 1 - j0 : n;
        const int lo = first - j0 < 0 ? 0 : first - j0 < hi ? first - j0 : hi; /* lo = hi: none of these keys */
        const float *dy = dout + y_at + (size_t)r * C, *y = out + y_at + (size_t)r * C;
        float D = 0.0f; /* dout_i . out_i = sum_j P_ij dP_ij */
#pragma omp simd reduction(+ : D)
        for (int c = 0; c < hs; c++)
            D += dy[c] * y[c];
        float *pr = p + (size_t)r * ld, *dsr = ds + (size_t)r * ld;
        const float L = row_lse[r];
        if (d->softcap > 0.0f) {
            /* s' = c tanh(s / c): P from s', and dS = P (dP - D) (1 - tanh^2) scale */
            const float inv = 1.0f / d->softcap;
            for (int j = lo; j < hi; j++) {
                const float th = tanhf(pr[j] * inv);
                pr[j] = fast_expf(d->softcap * th - L);
                dsr[j] = pr[j] * (dsr[j] - D) * (1.0f - th * th) * d->scale;
            }
        } else {
#pragma omp simd
            for (int j = lo; j < hi; j++) {
                pr[j] = fast_expf(pr[j] - L);
                dsr[j] = pr[j] * (dsr[j] - D) * d->scale; /* the scale of the scores folded in */
            }
        }
        zero_outside(pr, n, lo, hi);
        zero_outside(dsr, n, lo, hi);
    }
    /* dV += P^T dout, dK += dS^T Q, dQ += dS K */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, rows, 1.0f, p, ld, dout + y_at, C, 1.0f, dqkv + v_at,
                row);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, rows, 1.0f, ds, ld, qkv + q_at, row, 1.0f,
                dqkv + k_at, row);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, n, 1.0f, ds, ld, qkv + k_at, row, 1.0f,
                dqkv + q_at, row);
}

/* Key/value head g of sequence b: dk and dv of its keys and dq of its query heads, which no other task writes.
 * Key tiles in order; for each, the group's query heads in order and their query tiles from the key tile's first
 * key to the end of its last key's sample; each tile pair clipped to the keys its rows may see. So every sum runs
 * in a fixed order. */
static void tiled_backward_kv_head(float *dqkv, const float *dout, const float *qkv, const float *lse,
                                   const float *out, const int32_t *pos_row, float *work, const struct attn_dims *d,
                                   int b, int g)
{
    const int T = d->T, hs = d->hs;
    for (int t = 0; t < T; t++) {
        float *x = dqkv + ((size_t)b * T + t) * d->row;
        memset(x + (size_t)g * d->group * hs, 0, (size_t)d->group * hs * sizeof *x);
        memset(x + (size_t)(d->NH + g) * hs, 0, (size_t)hs * sizeof *x);
        memset(x + (size_t)(d->NH + d->NKV + g) * hs, 0, (size_t)hs * sizeof *x);
    }
    for (int j0 = 0; j0 < T; j0 += ATTN_TILE_K) {
        const int j1 = j0 + ATTN_TILE_K < T ? j0 + ATTN_TILE_K : T, end = attention_query_end(d, pos_row, j1 - 1);
        for (int h = g * d->group; h < (g + 1) * d->group; h++)
            for (int i0 = j0; i0 < end; i0 += ATTN_TILE_Q) {
                const int i1 = i0 + ATTN_TILE_Q < end ? i0 + ATTN_TILE_Q : end;
                const int first = attention_first_key(d, pos_row, i0);
                const int k0 = first > j0 ? first : j0, k1 = i1 < j1 ? i1 : j1, before = k1 < i0 ? k1 : i0;
                /* the keys before the query tile with every row, then the triangle of the tile's own keys in
                 * blocks of rows, as the forward */
                if (k0 < before)
                    tiled_backward_tile(dqkv, dout, qkv, lse, out, pos_row, work, d, b, h, i0, i1, k0, before);
                for (int r0 = i0; r0 < i1 && i0 < k1; r0 += ATTN_TILE_DIAG) {
                    const int r1 = r0 + ATTN_TILE_DIAG < i1 ? r0 + ATTN_TILE_DIAG : i1;
                    tiled_backward_tile(dqkv, dout, qkv, lse, out, pos_row, work, d, b, h, r0, r1,
                                        k0 > i0 ? k0 : i0, r1 < k1 ? r1 : k1);
                }
            }
    }
}

static void tiled_backward(float *dqkv, const float *dout, const float *qkv, const float *lse, const float *out,
                           float *scratch, const int32_t *pos, const struct attn_dims *d)
{
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < d->B; b++)
        for (int g = 0; g < d->NKV; g++) {
            float *work = scratch + (size_t)omp_get_thread_num() * tiled_thread_floats(d->T);
            tiled_backward_kv_head(dqkv, dout, qkv, lse, out, pos ? pos + (size_t)b * d->T : NULL, work, d, b, g);
        }
}

/* ---- the fp32 kernels ------------------------------------------------------------------------------------ */

static void f32_attention_gqa_forward(float *out, float *att, const float *qkv, float *scratch, const int32_t *pos,
                                      int B, int T, int NH, int NKV, int hs, const struct attn_opts *opt)
{
    DEVEMU_VIEW(out);
    DEVEMU_VIEW(att);
    DEVEMU_VIEW(qkv);
    DEVEMU_VIEW(scratch);
    DEVEMU_VIEW(pos);
    const struct attn_dims d = attn_dims_of(pos, B, T, NH, NKV, hs, opt);
    if (!tiled()) {
        materialized_forward(out, att, qkv, pos, &d); /* the scores in att itself: no scratch */
        return;
    }
    if (!scratch)
        fail_internal("attention: the tiled kernel's forward needs its scratch (backend_attention_scratch)");
    tiled_forward(out, att, qkv, scratch, pos, &d);
}

/* out: the forward's output, which the tiled backward reads (D_i = dout_i . out_i) and the materialized one
 * does not need (it keeps the probabilities). */
static void f32_attention_gqa_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                                       const float *out, float *scratch, const int32_t *pos, int B, int T, int NH,
                                       int NKV, int hs, const struct attn_opts *opt)
{
    DEVEMU_VIEW(dqkv);
    DEVEMU_VIEW(dout);
    DEVEMU_VIEW(qkv);
    DEVEMU_VIEW(att);
    DEVEMU_VIEW(out);
    DEVEMU_VIEW(scratch);
    DEVEMU_VIEW(pos);
    const struct attn_dims d = attn_dims_of(pos, B, T, NH, NKV, hs, opt);
    if (tiled()) {
        if (!out)
            fail_internal("attention: the tiled kernel's backward needs the forward's output");
        tiled_backward(dqkv, dout, qkv, att, out, scratch, pos, &d);
    } else {
        materialized_backward(dqkv, dout, qkv, att, scratch, pos, &d);
    }
}

/* The cache's slot of position p: a ring of the last Tc positions (p itself when Tc holds every position). */
static inline size_t kv_slot(int p, int Tc) { return (size_t)(p % Tc); }

/* The attention of one new token, query q at position p of a row whose first new token is at past: keys
 * from lo = max(0, p - W + 1) to p, those before past from the cache's ring (kc, vc row), the others from the
 * new tokens' keys (knew, vnew, row stride `row`). p_buf: Tc + T floats. */
struct kv_row {
    const float *kc, *vc;     /* the row's cache (Tc, NKV hs), at the key/value head */
    const float *knew, *vnew; /* the row's first new token's key/value head in qkv */
    size_t kvw, row;          /* strides of the cache and of qkv */
    int past, Tc;
};

static void kv_attend(float *y, const float *q, const struct kv_row *r, int p, const struct attn_dims *d,
                      float *p_buf)
{
    const int lo = d->window > 0 && p - d->window + 1 > 0 ? p - d->window + 1 : 0, n = p + 1 - lo, hs = d->hs;
    float mx = -INFINITY;
    for (int j = lo; j <= p; j++) {
        const float *kj = j < r->past ? r->kc + kv_slot(j, r->Tc) * r->kvw : r->knew + (size_t)(j - r->past) * r->row;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int i = 0; i < hs; i++)
            s += q[i] * kj[i];
        p_buf[j - lo] = s * d->scale;
    }
    attention_softcap(d, p_buf, 0, n);
    for (int j = 0; j < n; j++)
        mx = p_buf[j] > mx ? p_buf[j] : mx;
    float sum = 0.0f;
    for (int j = 0; j < n; j++)
        sum += p_buf[j] = expf(p_buf[j] - mx);
    memset(y, 0, (size_t)hs * sizeof *y);
    const float inv = 1.0f / sum;
    for (int j = lo; j <= p; j++) {
        const float *vj = j < r->past ? r->vc + kv_slot(j, r->Tc) * r->kvw : r->vnew + (size_t)(j - r->past) * r->row;
        const float w = p_buf[j - lo] * inv;
#pragma omp simd
        for (int i = 0; i < hs; i++)
            y[i] += w * vj[i];
    }
}

static void f32_attention_kv_forward(float *out, const float *qkv, float *kc, float *vc, const int32_t *past,
                                     const int32_t *keep, int B, int T, int NH, int NKV, int hs, int Tc,
                                     const struct attn_opts *opt)
{
    DEVEMU_VIEW(out);
    DEVEMU_VIEW(qkv);
    DEVEMU_VIEW(kc);
    DEVEMU_VIEW(vc);
    DEVEMU_VIEW(past);
    DEVEMU_VIEW(keep);
    const struct attn_dims d = attn_dims_of(NULL, B, T, NH, NKV, hs, opt);
    const size_t row = (size_t)d.row, kvw = (size_t)NKV * hs, C = (size_t)NH * hs;
    const bool ring = d.window > 0 && Tc >= d.window; /* a sliding layer's ring: positions past Tc are fine */
    for (int b = 0; b < B; b++)
        if (past[b] < 0 || (!ring && past[b] + T > Tc) || (keep && (keep[b] < 0 || keep[b] > T)))
            fail_internal("attention with a cache: row %d's tokens at %d .. %d (%d kept), the cache holds %d "
                          "positions (window %d)",
                          b, past[b], past[b] + T - 1, keep ? keep[b] : T, Tc, d.window);
#pragma omp parallel
    {
        float *p_buf = xcalloc((size_t)Tc + (size_t)T, sizeof *p_buf);
#pragma omp for collapse(3) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++)
                for (int t = 0; t < T; t++) {
                    const size_t kv_head = (size_t)(h / d.group) * hs;
                    const float *knew = qkv + (size_t)b * T * row + C + kv_head;
                    const struct kv_row r = {kc + (size_t)b * Tc * kvw + kv_head, vc + (size_t)b * Tc * kvw + kv_head,
                                             knew, knew + kvw, kvw, row, past[b], Tc};
                    kv_attend(out + ((size_t)b * T + t) * C + (size_t)h * hs,
                              qkv + ((size_t)b * T + t) * row + (size_t)h * hs, &r, past[b] + t, &d, p_buf);
                }
        free(p_buf);
    }
    /* then the kept tokens into the ring, the last Tc of them (the earlier ones would be overwritten) */
    for (int b = 0; b < B; b++) {
        const int n = keep ? keep[b] : T;
        for (int t = n > Tc ? n - Tc : 0; t < n; t++) {
            const float *src = qkv + ((size_t)b * T + t) * row + C;
            const size_t at = ((size_t)b * Tc + kv_slot(past[b] + t, Tc)) * kvw;
            memcpy(kc + at, src, kvw * sizeof *kc);
            memcpy(vc + at, src + kvw, kvw * sizeof *vc);
        }
    }
}

/* ---- the entry points ------------------------------------------------------------------------------------ *
 * backend.h's functions with [A] operands: the fp32 kernel above, or, when the activations are half precision
 * (an emulated device, backend_cpu_act.h), the wrapper that runs that same kernel on fp32 copies. */

void backend_attention_gqa_forward(float *out, float *att, const float *qkv, float *scratch, const int32_t *pos, int B,
                                   int T, int NH, int NKV, int hs, const struct attn_opts *opt)
{
    ACT_DISPATCH(
        act_attention_forward(f32_attention_gqa_forward, out, att, qkv, scratch, pos, B, T, NH, NKV, hs, opt));
    f32_attention_gqa_forward(out, att, qkv, scratch, pos, B, T, NH, NKV, hs, opt);
}

void backend_attention_gqa_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                                    const float *out, float *scratch, const int32_t *pos, int B, int T, int NH, int NKV,
                                    int hs, const struct attn_opts *opt)
{
    ACT_DISPATCH(act_attention_backward(f32_attention_gqa_backward, dqkv, dout, qkv, att, out, scratch, pos, B, T, NH,
                                        NKV, hs, opt));
    f32_attention_gqa_backward(dqkv, dout, qkv, att, out, scratch, pos, B, T, NH, NKV, hs, opt);
}

void backend_attention_kv_forward(float *out, const float *qkv, float *kc, float *vc, const int32_t *past,
                                  const int32_t *keep, int B, int T, int NH, int NKV, int hs, int Tc,
                                  const struct attn_opts *opt)
{
    ACT_DISPATCH(act_attention_kv_forward(f32_attention_kv_forward, out, qkv, kc, vc, past, keep, B, T, NH, NKV, hs,
                                          Tc, opt));
    f32_attention_kv_forward(out, qkv, kc, vc, past, keep, B, T, NH, NKV, hs, Tc, opt);
}

void backend_attention_forward(float *out, float *att, const float *qkv, float *scratch, const int32_t *pos, int B,
                               int T, int C, int NH)
{
    backend_attention_gqa_forward(out, att, qkv, scratch, pos, B, T, NH, NH, C / NH, NULL);
}

void backend_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att, const float *out,
                                float *scratch, const int32_t *pos, int B, int T, int C, int NH)
{
    backend_attention_gqa_backward(dqkv, dout, qkv, att, out, scratch, pos, B, T, NH, NH, C / NH, NULL);
}
