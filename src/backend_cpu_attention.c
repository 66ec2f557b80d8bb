/*
 * CPU backend, causal self-attention (backend.h): the multi-head and
 * grouped-query kernels over packed rows, and attention through a key/value
 * cache for generation. OpenBLAS sgemm for the products, OpenMP over heads;
 * sgemm calls inside our parallel regions run single-threaded.
 */
#include "backend.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cpu_act.h"
#include "devemu.h"
#include "fastmath.h"
#include "util.h"

#define ATTN_ROW_BLOCK 64        /* rows per causal block: skips most of the masked half */

/* The probabilities (B, NH, T, T) [A]. */
size_t backend_attention_saved(int B, int T, int NH)
{
#ifdef BACKEND_CPU_NO_ACT
    const size_t es = sizeof(float);
#else
    const size_t es = (size_t)dtype_size(backend_act_dtype());
#endif
    return (size_t)B * (size_t)NH * (size_t)T * (size_t)T * es;
}

size_t backend_attention_scratch(int T, int NH)
{
    (void)NH; /* one (T, T) matrix per thread */
    return (size_t)omp_get_max_threads() * (size_t)T * (size_t)T;
}

/* Packed rows (backend.h): the first key query i of a row may see, i - pos[i]
 * (0 without positions); pos_row is the row's positions or NULL. */
static inline int attention_first_key(const int32_t *pos_row, int i) { return pos_row ? i - pos_row[i] : 0; }

/* One past the last query that sees key j: the next sample's first token (T without positions). */
static inline int attention_query_end(const int32_t *pos_row, int j, int T)
{
    if (!pos_row)
        return T;
    int i = j + 1;
    while (i < T && pos_row[i] != 0)
        i++;
    return i;
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

void backend_attention_gqa_forward(float *out, float *att, const float *qkv, float *scratch, const int32_t *pos,
                                   int B, int T, int NH, int NKV, int hs)
{
    ACT_DISPATCH(act_attention_forward(out, att, qkv, scratch, pos, B, T, NH, NKV, hs));
    (void)scratch; /* the CPU computes the scores in att itself */
    DEVEMU_VIEW(out);
    DEVEMU_VIEW(att);
    DEVEMU_VIEW(qkv);
    DEVEMU_VIEW(pos);
    if (pos)
        attention_check_positions(pos, B, T);
    const int C = NH * hs, row = (NH + 2 * NKV) * hs, group = NH / NKV;
    const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const int32_t *pos_row = pos ? pos + (size_t)b * T : NULL;
            const float *q = qkv + (size_t)b * T * row + (size_t)h * hs;
            const float *k = qkv + (size_t)b * T * row + (size_t)(NH + h / group) * hs;
            const float *v = k + (size_t)NKV * hs;
            float *p = att + ((size_t)b * NH + h) * T * T;
            float *y = out + (size_t)b * T * C + (size_t)h * hs;
            /* Scores of rows [i0, i1) against the keys they may see, [k0, i1): k0 the first row's first key. */
            for (int i0 = 0; i0 < T; i0 += ATTN_ROW_BLOCK) {
                int i1 = i0 + ATTN_ROW_BLOCK < T ? i0 + ATTN_ROW_BLOCK : T, k0 = attention_first_key(pos_row, i0);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i1 - i0, i1 - k0, hs, scale,
                            q + (size_t)i0 * row, row, k + (size_t)k0 * row, row, 0.0f, p + (size_t)i0 * T + k0, T);
            }
            for (int i = 0; i < T; i++) {
                float *prow = p + (size_t)i * T;
                const int j0 = attention_first_key(pos_row, i);
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
                for (int j = 0; j < j0; j++)
                    prow[j] = 0.0f;
                for (int j = i + 1; j < T; j++)
                    prow[j] = 0.0f;
            }
            for (int i0 = 0; i0 < T; i0 += ATTN_ROW_BLOCK) {
                int i1 = i0 + ATTN_ROW_BLOCK < T ? i0 + ATTN_ROW_BLOCK : T, k0 = attention_first_key(pos_row, i0);
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
static void attention_head_backward(float *dqkv, const float *dout, const float *qkv, const float *att, float *ds,
                                    const int32_t *pos, int b, int h, int T, int NH, int NKV, int hs)
{
    const int C = NH * hs, row = (NH + 2 * NKV) * hs, group = NH / NKV;
    const float scale = 1.0f / sqrtf((float)hs);
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
        int i1 = i0 + ATTN_ROW_BLOCK < T ? i0 + ATTN_ROW_BLOCK : T, k0 = attention_first_key(pos_row, i0);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i1 - i0, i1 - k0, hs, 1.0f,
                    dy + (size_t)i0 * C, C, v + (size_t)k0 * row, row, 0.0f, ds + (size_t)i0 * T + k0, T);
    }
    /* Rows [j0, j1) of dV need only rows j0 <= i < the end of key j1 - 1's sample of P and dY. */
    for (int j0 = 0; j0 < T; j0 += ATTN_ROW_BLOCK) {
        int j1 = j0 + ATTN_ROW_BLOCK < T ? j0 + ATTN_ROW_BLOCK : T, i1 = attention_query_end(pos_row, j1 - 1, T);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, j1 - j0, hs, i1 - j0, 1.0f,
                    p + (size_t)j0 * T + j0, T, dy + (size_t)j0 * C, C, beta, dv + (size_t)j0 * row, row);
    }
    /* Softmax backward in place, with the 1/sqrt(hs) of the scores folded in. */
    for (int i = 0; i < T; i++) {
        const float *prow = p + (size_t)i * T;
        float *drow = ds + (size_t)i * T;
        const int j0 = attention_first_key(pos_row, i);
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int j = j0; j <= i; j++)
            dot += prow[j] * drow[j];
        for (int j = j0; j <= i; j++)
            drow[j] = prow[j] * (drow[j] - dot) * scale;
        for (int j = 0; j < j0; j++)
            drow[j] = 0.0f;
        for (int j = i + 1; j < T; j++)
            drow[j] = 0.0f;
    }
    /* dQ = dS K and dK = dS^T Q, over the same blocks of the block-diagonal lower-triangular dS. */
    for (int i0 = 0; i0 < T; i0 += ATTN_ROW_BLOCK) {
        int i1 = i0 + ATTN_ROW_BLOCK < T ? i0 + ATTN_ROW_BLOCK : T, k0 = attention_first_key(pos_row, i0);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i1 - i0, hs, i1 - k0, 1.0f,
                    ds + (size_t)i0 * T + k0, T, k + (size_t)k0 * row, row, 0.0f, dq + (size_t)i0 * row, row);
    }
    for (int j0 = 0; j0 < T; j0 += ATTN_ROW_BLOCK) {
        int j1 = j0 + ATTN_ROW_BLOCK < T ? j0 + ATTN_ROW_BLOCK : T, i1 = attention_query_end(pos_row, j1 - 1, T);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, j1 - j0, hs, i1 - j0, 1.0f,
                    ds + (size_t)j0 * T + j0, T, q + (size_t)j0 * row, row, beta, dk + (size_t)j0 * row, row);
    }
}

void backend_attention_gqa_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                                    const float *out, float *scratch, const int32_t *pos, int B, int T, int NH,
                                    int NKV, int hs)
{
    (void)out; /* the probabilities are kept: the forward's output is not needed */
    ACT_DISPATCH(act_attention_backward(dqkv, dout, qkv, att, scratch, pos, B, T, NH, NKV, hs));
    DEVEMU_VIEW(dqkv);
    DEVEMU_VIEW(dout);
    DEVEMU_VIEW(qkv);
    DEVEMU_VIEW(att);
    DEVEMU_VIEW(scratch);
    DEVEMU_VIEW(pos);
    if (pos)
        attention_check_positions(pos, B, T);
    /* One task per key/value head: its query heads in order, so the shared
     * dk and dv add up in a fixed order and never race. */
    const int group = NH / NKV;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int g = 0; g < NKV; g++) {
            float *ds = scratch + (size_t)omp_get_thread_num() * T * T;
            for (int h = g * group; h < (g + 1) * group; h++)
                attention_head_backward(dqkv, dout, qkv, att, ds, pos, b, h, T, NH, NKV, hs);
        }
}

void backend_attention_forward(float *out, float *att, const float *qkv, float *scratch, const int32_t *pos, int B,
                               int T, int C, int NH)
{
    backend_attention_gqa_forward(out, att, qkv, scratch, pos, B, T, NH, NH, C / NH);
}

void backend_attention_kv_forward(float *out, const float *qkv, float *kc, float *vc, const int32_t *past, int B, int T,
                                  int NH, int NKV, int hs, int Tmax)
{
    ACT_DISPATCH(act_attention_kv_forward(out, qkv, kc, vc, past, B, T, NH, NKV, hs, Tmax));
    DEVEMU_VIEW(out);
    DEVEMU_VIEW(qkv);
    DEVEMU_VIEW(kc);
    DEVEMU_VIEW(vc);
    DEVEMU_VIEW(past);
    const size_t row = (size_t)(NH + 2 * NKV) * hs, kvw = (size_t)NKV * hs, C = (size_t)NH * hs;
    const int group = NH / NKV;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        if (past[b] < 0 || past[b] + T > Tmax)
            fail_internal("attention with a cache: row %d's tokens at %d .. %d, the cache holds %d positions", b,
                          past[b], past[b] + T - 1, Tmax);
        for (int t = 0; t < T; t++) {
            const float *src = qkv + ((size_t)b * T + t) * row + C;
            const size_t at = ((size_t)b * Tmax + (size_t)(past[b] + t)) * kvw;
            memcpy(kc + at, src, kvw * sizeof *kc);
            memcpy(vc + at, src + kvw, kvw * sizeof *vc);
        }
    }
#pragma omp parallel
    {
        float *p = xcalloc((size_t)Tmax, sizeof *p);
#pragma omp for collapse(3) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++)
                for (int t = 0; t < T; t++) {
                    const float *q = qkv + ((size_t)b * T + t) * row + (size_t)h * hs;
                    const float *k = kc + (size_t)b * Tmax * kvw + (size_t)(h / group) * hs;
                    const float *v = vc + (size_t)b * Tmax * kvw + (size_t)(h / group) * hs;
                    const int n = past[b] + t + 1;
                    float mx = -INFINITY;
                    for (int j = 0; j < n; j++) {
                        const float *kj = k + (size_t)j * kvw;
                        float s = 0.0f;
#pragma omp simd reduction(+ : s)
                        for (int i = 0; i < hs; i++)
                            s += q[i] * kj[i];
                        p[j] = s * scale;
                        mx = p[j] > mx ? p[j] : mx;
                    }
                    float sum = 0.0f;
                    for (int j = 0; j < n; j++)
                        sum += p[j] = expf(p[j] - mx);
                    float *y = out + ((size_t)b * T + t) * C + (size_t)h * hs;
                    memset(y, 0, (size_t)hs * sizeof *y);
                    const float inv = 1.0f / sum;
                    for (int j = 0; j < n; j++) {
                        const float *vj = v + (size_t)j * kvw, w = p[j] * inv;
#pragma omp simd
                        for (int i = 0; i < hs; i++)
                            y[i] += w * vj[i];
                    }
                }
        free(p);
    }
}

void backend_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att, const float *out,
                                float *scratch, const int32_t *pos, int B, int T, int C, int NH)
{
    backend_attention_gqa_backward(dqkv, dout, qkv, att, out, scratch, pos, B, T, NH, NH, C / NH);
}
