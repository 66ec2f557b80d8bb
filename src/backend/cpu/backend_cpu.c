/*
 * CPU backend: OpenBLAS sgemm for every matmul, OpenMP for everything else.
 *
 * Debian's libopenblas-openmp runs its threads on the same OpenMP pool as our
 * parallel loops, so the two never fight over the cores (DESIGN §11); sgemm
 * calls made inside one of our parallel regions run single-threaded, which is
 * what the per-head attention loops want. Attention is backend_cpu_attention.c.
 *
 * A function of backend.h with [A] operands is a static fp32 kernel, f32_X, and its entry point backend_X
 * ("the entry points", at the end), which runs that kernel or, with half-precision activations, hands it to
 * its wrapper in backend_cpu_act.c; the wrappers only ever run the kernel they are given.
 */

#include "backend/backend.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/devemu.h"
#include "core/fastmath.h"
#include "core/util.h"

#include "backend_cpu_act.h"

#define LAYERNORM_EPS 1e-5f      /* GPT-2's layer_norm_epsilon */

void backend_init(int threads)
{
    if (threads > 0) {
        omp_set_num_threads(threads);
        openblas_set_num_threads(threads);
    }
}

void backend_check_performance(void)
{
    /* OpenBLAS releases that predate a CPU fall back to generic SSE3 kernels,
     * several times slower than the AVX2/AVX-512 ones the CPU can run. */
    const char *core = openblas_get_corename();
    if (core && (strcmp(core, "Prescott") == 0 || strcmp(core, "Core2") == 0 || strcmp(core, "Nehalem") == 0) &&
        __builtin_cpu_supports("avx2"))
        log_warn("OpenBLAS chose its generic '%s' kernels on a CPU with %s; set OPENBLAS_CORETYPE=%s for "
                 "several times faster matmuls",
                 core, __builtin_cpu_supports("avx512f") ? "AVX-512" : "AVX2",
                 __builtin_cpu_supports("avx512f") ? "SkylakeX" : "Haswell");
}

const char *backend_name(void) { return "cpu (OpenBLAS + OpenMP)"; }

/* Products of a handful of rows (generation's decoding: one token per row):
 * OpenBLAS's sgemm packs the whole weight before it multiplies, which for a
 * few rows costs several times the product; these read each weight element
 * once, from memory, for all the rows together. */
#define SMALL_ROWS 16
#define SMALL_COLS 256 /* columns of out per task of the (C, OC) product: the rows' slices stay in L1 */

/* Rows [n0, N) of out (N, OC) at column o = inp @ weight row o (w, C long): four rows at a time share each
 * load of the weight (four independent sums, so the FMAs do not wait on one another). */
static void small_rows_t_col(float *out, const float *inp, const float *w, int o, int n0, int N, int C, int OC)
{
    int n = n0;
    for (; n + 4 <= N; n += 4) {
        const float *x0 = inp + (size_t)n * C, *x1 = x0 + C, *x2 = x1 + C, *x3 = x2 + C;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
        for (int c = 0; c < C; c++) {
            const float wc = w[c];
            s0 += x0[c] * wc;
            s1 += x1[c] * wc;
            s2 += x2[c] * wc;
            s3 += x3[c] * wc;
        }
        out[(size_t)n * OC + o] = s0;
        out[(size_t)(n + 1) * OC + o] = s1;
        out[(size_t)(n + 2) * OC + o] = s2;
        out[(size_t)(n + 3) * OC + o] = s3;
    }
    for (; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int c = 0; c < C; c++)
            s += x[c] * w[c];
        out[(size_t)n * OC + o] = s;
    }
}

/* out (N, OC) = inp (N, C) @ weight^T, weight (OC, C), in blocks of four weight rows: the rows of inp four
 * at a time (small_rows_t_col), the last N % 4 one at a time against the four weight rows together. */
static void small_rows_t(float *out, const float *inp, const float *weight, int N, int C, int OC)
{
    const int N4 = N / 4 * 4;
#pragma omp parallel for schedule(static)
    for (int o0 = 0; o0 < OC; o0 += 4) {
        const int o1 = o0 + 4 < OC ? o0 + 4 : OC, tail = o1 - o0 == 4 ? N4 : N;
        for (int o = o0; o < o1; o++)
            small_rows_t_col(out, inp, weight + (size_t)o * C, o, 0, tail, C, OC);
        for (int n = tail; n < N; n++) {
            const float *x = inp + (size_t)n * C, *w0 = weight + (size_t)o0 * C, *w1 = w0 + C, *w2 = w1 + C,
                        *w3 = w2 + C;
            float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
            for (int c = 0; c < C; c++) {
                const float xc = x[c];
                s0 += xc * w0[c];
                s1 += xc * w1[c];
                s2 += xc * w2[c];
                s3 += xc * w3[c];
            }
            float *y = out + (size_t)n * OC + o0;
            y[0] = s0, y[1] = s1, y[2] = s2, y[3] = s3;
        }
    }
}

/* out (N, OC) = inp (N, C) @ weight (+ bias), weight (C, OC): each task a block of columns, row c of the
 * weight's block read once and added into every row's block. */
static void small_rows(float *out, const float *inp, const float *weight, const float *bias, int N, int C, int OC)
{
    const int blocks = (OC + SMALL_COLS - 1) / SMALL_COLS;
#pragma omp parallel for schedule(static)
    for (int k = 0; k < blocks; k++) {
        const int o0 = k * SMALL_COLS, w = OC - o0 < SMALL_COLS ? OC - o0 : SMALL_COLS;
        for (int n = 0; n < N; n++)
            for (int o = 0; o < w; o++)
                out[(size_t)n * OC + o0 + o] = bias ? bias[o0 + o] : 0.0f;
        for (int c = 0; c < C; c++) {
            const float *wr = weight + (size_t)c * OC + o0;
            for (int n = 0; n < N; n++) {
                const float x = inp[(size_t)n * C + c];
                float *y = out + (size_t)n * OC + o0;
#pragma omp simd
                for (int o = 0; o < w; o++)
                    y[o] += x * wr[o];
            }
        }
    }
}

static void f32_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int C,
                               int OC)
{
    DEVEMU_VIEW(out);
    DEVEMU_VIEW(inp);
    DEVEMU_VIEW(weight);
    DEVEMU_VIEW(bias);
    if (N <= SMALL_ROWS) {
        small_rows(out, inp, weight, bias, N, C, OC);
        return;
    }
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for
        for (int i = 0; i < N; i++)
            memcpy(out + (size_t)i * OC, bias, (size_t)OC * sizeof *out);
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, OC, C, 1.0f, inp, C, weight, OC, beta,
                out, OC);
}

static void f32_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                const float *weight, int N, int C, int OC)
{
    DEVEMU_VIEW(dinp);
    DEVEMU_VIEW(dweight);
    DEVEMU_VIEW(dbias);
    DEVEMU_VIEW(dout);
    DEVEMU_VIEW(inp);
    DEVEMU_VIEW(weight);
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, C, OC, 1.0f, dout, OC, weight, OC,
                    0.0f, dinp, C);
    if (!dweight) /* frozen: the input gradient only (backend.h) */
        return;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f,
                dweight, OC);
    if (dbias) {
        /* Column sums: each thread owns a block of columns and walks the rows,
         * so the inner loop runs along memory and vectorises. */
        const int block = 64;
#pragma omp parallel for
        for (int o0 = 0; o0 < OC; o0 += block) {
            int o1 = o0 + block < OC ? o0 + block : OC;
            float sum[64] = {0};
            for (int i = 0; i < N; i++) {
                const float *row = dout + (size_t)i * OC;
#pragma omp simd
                for (int o = o0; o < o1; o++)
                    sum[o - o0] += row[o];
            }
            for (int o = o0; o < o1; o++)
                dbias[o] += sum[o - o0];
        }
    }
}

static void f32_matmul_forward_transposed(float *out, const float *inp, const float *weight, int N, int C, int OC)
{
    DEVEMU_VIEW(out);
    DEVEMU_VIEW(inp);
    DEVEMU_VIEW(weight);
    if (N <= SMALL_ROWS) {
        small_rows_t(out, inp, weight, N, C, OC);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
}

static void f32_matmul_backward_transposed(float *dinp, float *dweight, const float *dout, const float *inp,
                                           const float *weight, int N, int C, int OC)
{
    DEVEMU_VIEW(dinp);
    DEVEMU_VIEW(dweight);
    DEVEMU_VIEW(dout);
    DEVEMU_VIEW(inp);
    DEVEMU_VIEW(weight);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
    if (dweight)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
}

static void f32_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                                  const float *bias, int N, int C)
{
    DEVEMU_VIEW(out);
    DEVEMU_VIEW(mean);
    DEVEMU_VIEW(rstd);
    DEVEMU_VIEW(inp);
    DEVEMU_VIEW(weight);
    DEVEMU_VIEW(bias);
#pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float *y = out + (size_t)i * C;
        float m = 0.0f;
#pragma omp simd reduction(+ : m)
        for (int c = 0; c < C; c++)
            m += x[c];
        m /= (float)C;
        float var = 0.0f;
#pragma omp simd reduction(+ : var)
        for (int c = 0; c < C; c++) {
            float d = x[c] - m;
            var += d * d;
        }
        var /= (float)C;
        float s = 1.0f / sqrtf(var + LAYERNORM_EPS);
        for (int c = 0; c < C; c++)
            y[c] = (x[c] - m) * s * weight[c] + bias[c];
        mean[i] = m;
        rstd[i] = s;
    }
}

static void f32_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                   const float *weight, const float *mean, const float *rstd, float *scratch, int N,
                                   int C)
{
    DEVEMU_VIEW(dinp);
    DEVEMU_VIEW(dweight);
    DEVEMU_VIEW(dbias);
    DEVEMU_VIEW(dout);
    DEVEMU_VIEW(inp);
    DEVEMU_VIEW(weight);
    DEVEMU_VIEW(mean);
    DEVEMU_VIEW(rstd);
    DEVEMU_VIEW(scratch);
    /* Input gradient row by row in parallel; the weight and bias gradients are
     * column sums, reduced per thread into private rows and then added up. */
    int nthreads = omp_get_max_threads();
    float *partial = scratch;
    memset(partial, 0, (size_t)nthreads * 2 * (size_t)C * sizeof *partial);
#pragma omp parallel
    {
        float *dw = partial + (size_t)omp_get_thread_num() * 2 * C;
        float *db = dw + C;
#pragma omp for
        for (int i = 0; i < N; i++) {
            const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
            float *dx = dinp + (size_t)i * C;
            float m = mean[i], s = rstd[i];
            float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
            for (int c = 0; c < C; c++) {
                float norm = (x[c] - m) * s;
                float dnorm = weight[c] * dy[c];
                dnorm_mean += dnorm;
                dnorm_norm_mean += dnorm * norm;
                db[c] += dy[c];
                dw[c] += norm * dy[c];
            }
            dnorm_mean /= (float)C;
            dnorm_norm_mean /= (float)C;
            for (int c = 0; c < C; c++) {
                float norm = (x[c] - m) * s;
                float dnorm = weight[c] * dy[c];
                dx[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
            }
        }
    }
    /* the column sums above cost little beside the input gradient; without
     * dweight (a frozen unit) they are dropped */
    for (int t = 0; dweight && t < nthreads; t++)
        for (int c = 0; c < C; c++) {
            dweight[c] += partial[(size_t)t * 2 * C + c];
            dbias[c] += partial[(size_t)t * 2 * C + C + c];
        }
}

size_t backend_layernorm_scratch(int C) { return (size_t)omp_get_max_threads() * 2 * (size_t)C; }

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */

static void f32_gelu_forward(float *out, const float *inp, size_t n)
{
    DEVEMU_VIEW(out);
    DEVEMU_VIEW(inp);
#pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float cube = 0.044715f * x * x * x;
        out[i] = 0.5f * x * (1.0f + fast_tanhf(GELU_SCALE * (x + cube)));
    }
}

static void f32_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    DEVEMU_VIEW(dinp);
    DEVEMU_VIEW(inp);
    DEVEMU_VIEW(dout);
#pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float cube = 0.044715f * x * x * x;
        float arg = GELU_SCALE * (x + cube);
        float th = fast_tanhf(arg);
        float sech2 = 1.0f - th * th;
        float local = 0.5f * (1.0f + th) + x * 0.5f * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = local * dout[i];
    }
}

/* offset: 0 (Llama), or 1 for Gemma's y = x s (1 + w), the sum in fp32 as transformers' Gemma RMSNorm. */
static void f32_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, float offset, float eps,
                                int N, int C)
{
    DEVEMU_VIEW(out);
    DEVEMU_VIEW(rstd);
    DEVEMU_VIEW(inp);
    DEVEMU_VIEW(weight);
#pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float *y = out + (size_t)i * C;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; c++)
            ss += x[c] * x[c];
        float s = 1.0f / sqrtf(ss / (float)C + eps);
        for (int c = 0; c < C; c++)
            y[c] = x[c] * s * (offset + weight[c]);
        rstd[i] = s;
    }
}

static void f32_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                                 float offset, const float *rstd, float *scratch, int N, int C)
{
    DEVEMU_VIEW(dinp);
    DEVEMU_VIEW(dweight);
    DEVEMU_VIEW(dout);
    DEVEMU_VIEW(inp);
    DEVEMU_VIEW(weight);
    DEVEMU_VIEW(rstd);
    DEVEMU_VIEW(scratch);
    /* y = x s w with s = (mean(x^2) + eps)^-1/2: dx = s (w dy - x s^2 mean(x w dy)),
     * dw = sum over rows of x s dy (per-thread rows, then added in thread order). */
    int nthreads = omp_get_max_threads();
    float *partial = scratch;
    memset(partial, 0, (size_t)nthreads * (size_t)C * sizeof *partial);
#pragma omp parallel
    {
        float *dw = partial + (size_t)omp_get_thread_num() * C;
#pragma omp for
        for (int i = 0; i < N; i++) {
            const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
            float *dx = dinp + (size_t)i * C;
            float s = rstd[i], dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int c = 0; c < C; c++) {
                dot += x[c] * (offset + weight[c]) * dy[c];
                dw[c] += x[c] * s * dy[c];
            }
            float k = s * s * dot / (float)C;
            for (int c = 0; c < C; c++)
                dx[c] += s * ((offset + weight[c]) * dy[c] - x[c] * k);
        }
    }
    for (int t = 0; dweight && t < nthreads; t++)
        for (int c = 0; c < C; c++)
            dweight[c] += partial[(size_t)t * C + c];
}

/* Rotates the first rot channels of the query and key heads of every row of x by +sin (forward) or -sin
 * (backward), token (b, t) by the tables' row pos[b, t] (t without positions). */
static void rope_rotate(float *x, const float *cos, const float *sin, const int32_t *pos, float sign, int B, int T,
                        int NH, int NKV, int hs, int rot)
{
    const int heads = NH + NKV, row = (NH + 2 * NKV) * hs, half = rot / 2;
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const size_t at = (size_t)(pos ? pos[(size_t)b * T + t] : t) * half;
            const float *ct = cos + at, *st = sin + at;
            for (int h = 0; h < heads; h++) {
                float *v = x + ((size_t)b * T + t) * row + (size_t)h * hs;
#pragma omp simd
                for (int i = 0; i < half; i++) {
                    float a = v[i], c = v[i + half], sn = sign * st[i];
                    v[i] = a * ct[i] - c * sn;
                    v[i + half] = c * ct[i] + a * sn;
                }
            }
        }
}

static void f32_rope_forward(float *qkv, const float *cos, const float *sin, const int32_t *pos, int B, int T, int NH,
                             int NKV, int hs, int rot)
{
    DEVEMU_VIEW(qkv);
    DEVEMU_VIEW(cos);
    DEVEMU_VIEW(sin);
    DEVEMU_VIEW(pos);
    rope_rotate(qkv, cos, sin, pos, 1.0f, B, T, NH, NKV, hs, rot);
}

static void f32_rope_backward(float *dqkv, const float *cos, const float *sin, const int32_t *pos, int B, int T, int NH,
                              int NKV, int hs, int rot)
{
    DEVEMU_VIEW(dqkv);
    DEVEMU_VIEW(cos);
    DEVEMU_VIEW(sin);
    DEVEMU_VIEW(pos);
    rope_rotate(dqkv, cos, sin, pos, -1.0f, B, T, NH, NKV, hs, rot);
}

static void f32_swiglu_forward(float *out, const float *gu, int N, int F)
{
    DEVEMU_VIEW(out);
    DEVEMU_VIEW(gu);
#pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float *g = gu + (size_t)i * 2 * F, *u = g + F;
        float *y = out + (size_t)i * F;
#pragma omp simd
        for (int j = 0; j < F; j++)
            y[j] = g[j] / (1.0f + fast_expf(-g[j])) * u[j];
    }
}

static void f32_swiglu_backward(float *dgu, const float *dout, const float *gu, int N, int F)
{
    DEVEMU_VIEW(dgu);
    DEVEMU_VIEW(dout);
    DEVEMU_VIEW(gu);
#pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float *g = gu + (size_t)i * 2 * F, *u = g + F, *dy = dout + (size_t)i * F;
        float *dg = dgu + (size_t)i * 2 * F, *du = dg + F;
#pragma omp simd
        for (int j = 0; j < F; j++) {
            float sig = 1.0f / (1.0f + fast_expf(-g[j]));
            float silu = g[j] * sig;
            du[j] = dy[j] * silu;
            dg[j] = dy[j] * u[j] * sig * (1.0f + g[j] * (1.0f - sig));
        }
    }
}

/* ---- LoRA ---------------------------------------------------------------------- */

static int lora_drops(const struct lora_dropout *d) { return d && d->p > 0.0f; }

/* out (N, C) = drop(x), or out += drop(x) when accumulating. */
static void lora_drop(float *out, const float *x, const struct lora_dropout *d, int N, int C, int accumulate)
{
    const float keep_scale = 1.0f / (1.0f - d->p);
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        const float *in = x + (size_t)n * C;
        for (int c = 0; c < C; c++) {
            float v = lora_dropout_keeps(d, (size_t)n, c) ? in[c] * keep_scale : 0.0f;
            o[c] = accumulate ? o[c] + v : v;
        }
    }
}

static void lora_check_group(const struct lora_dropout *d, int k)
{
    if (lora_drops(d) && k != 1)
        fail_internal("LoRA dropout with %d layers in one call: each layer has its own mask", k);
}

static void f32_lora_forward(float *t, float *scratch, const float *x, const float *A, const struct lora_out *out,
                             int k, int ld, float scale, const struct lora_dropout *d, int N, int C, int r)
{
    lora_check_group(d, k);
    DEVEMU_VIEW(t);
    DEVEMU_VIEW(scratch);
    DEVEMU_VIEW(x);
    DEVEMU_VIEW(A);
    if (lora_drops(d)) {
        lora_drop(scratch, x, d, N, C, 0);
        x = scratch;
    }
    const int kr = k * r;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, kr, C, 1.0f, x, C, A, C, 0.0f, t, kr);
    for (int j = 0; j < k; j++) {
        float *y = out[j].y;
        const float *B = out[j].B;
        DEVEMU_VIEW(y);
        DEVEMU_VIEW(B);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, out[j].OC, r, scale, t + (size_t)j * r, kr, B, r,
                    1.0f, y, ld);
    }
}

static void f32_lora_backward(float *dx, float *dA, float *dt, float *scratch, const float *x, const float *t,
                              const float *A, const struct lora_out *out, int k, int ld, float scale,
                              const struct lora_dropout *d, int N, int C, int r)
{
    lora_check_group(d, k);
    DEVEMU_VIEW(dx);
    DEVEMU_VIEW(dA);
    DEVEMU_VIEW(dt);
    DEVEMU_VIEW(scratch);
    DEVEMU_VIEW(x);
    DEVEMU_VIEW(t);
    DEVEMU_VIEW(A);
    const int kr = k * r;
    for (int j = 0; j < k; j++) {
        const float *dy = out[j].y, *B = out[j].B;
        float *dB = out[j].dB;
        DEVEMU_VIEW(dy);
        DEVEMU_VIEW(B);
        DEVEMU_VIEW(dB);
        const int OC = out[j].OC;
        if (dB)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, r, N, scale, dy, ld, t + (size_t)j * r, kr, 1.0f,
                        dB, r);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, r, OC, scale, dy, ld, B, r, 0.0f,
                    dt + (size_t)j * r, kr);
    }
    const int drops = lora_drops(d);
    if (dA) {
        if (drops)
            lora_drop(scratch, x, d, N, C, 0);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, kr, C, N, 1.0f, dt, kr, drops ? scratch : x, C, 1.0f, dA,
                    C);
    }
    if (!drops) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, kr, 1.0f, dt, kr, A, C, 1.0f, dx, C);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, kr, 1.0f, dt, kr, A, C, 0.0f, scratch, C);
    lora_drop(dx, scratch, d, N, C, 1);
}

void backend_add(float *out, const float *a, const float *b, size_t n)
{
    DEVEMU_VIEW(out);
    DEVEMU_VIEW(a);
    DEVEMU_VIEW(b);
#pragma omp parallel for simd
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

static void f32_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                                  const int32_t *pos, int B, int T, int C)
{
    DEVEMU_VIEW(out);
    DEVEMU_VIEW(tokens);
    DEVEMU_VIEW(wte);
    DEVEMU_VIEW(wpe);
    DEVEMU_VIEW(pos);
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            const float *we = wte + (size_t)tokens[(size_t)b * T + t] * C;
            if (!wpe) {
                memcpy(o, we, (size_t)C * sizeof *o);
                continue;
            }
            const float *pe = wpe + (size_t)(pos ? pos[(size_t)b * T + t] : t) * C;
            for (int c = 0; c < C; c++)
                o[c] = we[c] + pe[c];
        }
}

static void f32_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                                   const int32_t *pos, int B, int T, int C)
{
    DEVEMU_VIEW(dwte);
    DEVEMU_VIEW(dwpe);
    DEVEMU_VIEW(dout);
    DEVEMU_VIEW(tokens);
    DEVEMU_VIEW(pos);
    /* Threads own disjoint column ranges, so repeated tokens never race. */
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int c0 = (int)((long)C * id / nt), c1 = (int)((long)C * (id + 1) / nt);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                const float *d = dout + ((size_t)b * T + t) * C;
                float *we = dwte + (size_t)tokens[(size_t)b * T + t] * C;
                for (int c = c0; c < c1; c++)
                    we[c] += d[c];
                if (!dwpe)
                    continue;
                float *pe = dwpe + (size_t)(pos ? pos[(size_t)b * T + t] : t) * C;
                for (int c = c0; c < c1; c++)
                    pe[c] += d[c];
            }
    }
}

static void f32_crossentropy_forward(float *losses, float *logits, const int32_t *targets, int N, int V, int Vp)
{
    DEVEMU_VIEW(losses);
    DEVEMU_VIEW(logits);
    DEVEMU_VIEW(targets);
#pragma omp parallel for
    for (int i = 0; i < N; i++) {
        float *row = logits + (size_t)i * Vp;
        float target_logit = targets[i] >= 0 ? row[targets[i]] : 0.0f;
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int j = 0; j < V; j++)
            mx = row[j] > mx ? row[j] : mx;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < V; j++) {
            row[j] = fast_expf(row[j] - mx);
            sum += row[j];
        }
        float inv = 1.0f / sum;
        for (int j = 0; j < V; j++)
            row[j] *= inv;
        for (int j = V; j < Vp; j++)
            row[j] = 0.0f;
        /* log-sum-exp form: exact even when the target's probability underflows; 0 for an ignored target */
        losses[i] = targets[i] >= 0 ? logf(sum) + mx - target_logit : 0.0f;
    }
}

/* dlogits row i = (probs - onehot) * (row_dloss ? row_dloss[i] : dloss). */
static void ce_backward(float *probs, const int32_t *targets, float dloss, const float *row_dloss, int N, int V, int Vp)
{
    DEVEMU_VIEW(probs);
    DEVEMU_VIEW(targets);
    DEVEMU_VIEW(row_dloss);
#pragma omp parallel for
    for (int i = 0; i < N; i++) {
        float *row = probs + (size_t)i * Vp;
        if (targets[i] < 0) { /* not trained: no gradient */
            memset(row, 0, (size_t)Vp * sizeof *row);
            continue;
        }
        const float d = row_dloss ? row_dloss[i] : dloss;
        for (int j = 0; j < V; j++)
            row[j] *= d;
        row[targets[i]] -= d;
    }
}

static void f32_crossentropy_backward(float *probs, const int32_t *targets, float dloss, int N, int V, int Vp)
{
    ce_backward(probs, targets, dloss, NULL, N, V, Vp);
}

static void f32_crossentropy_backward_rows(float *probs, const int32_t *targets, const float *dloss, int N, int V,
                                           int Vp)
{
    ce_backward(probs, targets, 0.0f, dloss, N, V, Vp);
}

double backend_sum_squares(const float *x, size_t n)
{
    DEVEMU_VIEW(x);
    double sum = 0.0;
#pragma omp parallel for simd reduction(+ : sum)
    for (size_t i = 0; i < n; i++)
        sum += (double)x[i] * (double)x[i];
    return sum;
}

int backend_all_finite(const float *x, size_t n)
{
    DEVEMU_VIEW(x);
    int bad = 0;
#pragma omp parallel for reduction(| : bad)
    for (size_t i = 0; i < n; i++)
        bad |= !isfinite(x[i]);
    return !bad;
}

void backend_scale(float *x, float s, size_t n)
{
    DEVEMU_VIEW(x);
#pragma omp parallel for simd
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}

static void f32_scale_rows(float *x, const float *s, int N, int C)
{
    DEVEMU_VIEW(x);
    DEVEMU_VIEW(s);
#pragma omp parallel for
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++)
            x[(size_t)i * C + c] *= s[i];
}

void backend_scale_rows(float *x, const float *s, int N, int C)
{
    ACT_DISPATCH(act_scale_rows(f32_scale_rows, x, s, N, C));
    f32_scale_rows(x, s, N, C);
}

void backend_zero(float *x, size_t n)
{
    DEVEMU_VIEW(x);
    memset(x, 0, n * sizeof *x);
}

/* ---- the entry points ------------------------------------------------------------------------------------ *
 * backend.h's functions with [A] operands: the fp32 kernel above, or, when the activations are half precision
 * (an emulated device, backend_cpu_act.h), the wrapper that runs that same kernel on fp32 copies. */

void backend_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int C, int OC)
{
    ACT_DISPATCH(act_matmul_forward(f32_matmul_forward, out, inp, weight, bias, N, C, OC));
    f32_matmul_forward(out, inp, weight, bias, N, C, OC);
}

void backend_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                             const float *weight, int N, int C, int OC)
{
    ACT_DISPATCH(act_matmul_backward(f32_matmul_backward, dinp, dweight, dbias, dout, inp, weight, N, C, OC));
    f32_matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
}

void backend_matmul_forward_transposed(float *out, const float *inp, const float *weight, int N, int C, int OC)
{
    ACT_DISPATCH(act_matmul_forward_transposed(f32_matmul_forward_transposed, out, inp, weight, N, C, OC));
    f32_matmul_forward_transposed(out, inp, weight, N, C, OC);
}

void backend_matmul_backward_transposed(float *dinp, float *dweight, const float *dout, const float *inp,
                                        const float *weight, int N, int C, int OC)
{
    ACT_DISPATCH(act_matmul_backward_transposed(f32_matmul_backward_transposed, dinp, dweight, dout, inp, weight, N, C,
                                                OC));
    f32_matmul_backward_transposed(dinp, dweight, dout, inp, weight, N, C, OC);
}

void backend_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                               const float *bias, int N, int C)
{
    ACT_DISPATCH(act_layernorm_forward(f32_layernorm_forward, out, mean, rstd, inp, weight, bias, N, C));
    f32_layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
}

void backend_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                const float *weight, const float *mean, const float *rstd, float *scratch, int N, int C)
{
    ACT_DISPATCH(act_layernorm_backward(f32_layernorm_backward, dinp, dweight, dbias, dout, inp, weight, mean, rstd,
                                        scratch, N, C));
    f32_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, scratch, N, C);
}

void backend_gelu_forward(float *out, const float *inp, size_t n)
{
    ACT_DISPATCH(act_gelu_forward(f32_gelu_forward, out, inp, n));
    f32_gelu_forward(out, inp, n);
}

void backend_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    ACT_DISPATCH(act_gelu_backward(f32_gelu_backward, dinp, inp, dout, n));
    f32_gelu_backward(dinp, inp, dout, n);
}

void backend_rmsnorm_offset_forward(float *out, float *rstd, const float *inp, const float *weight, float offset,
                                    float eps, int N, int C)
{
    ACT_DISPATCH(act_rmsnorm_forward(f32_rmsnorm_forward, out, rstd, inp, weight, offset, eps, N, C));
    f32_rmsnorm_forward(out, rstd, inp, weight, offset, eps, N, C);
}

void backend_rmsnorm_offset_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                     const float *weight, float offset, const float *rstd, float *scratch, int N, int C)
{
    ACT_DISPATCH(act_rmsnorm_backward(f32_rmsnorm_backward, dinp, dweight, dout, inp, weight, offset, rstd, scratch, N,
                                      C));
    f32_rmsnorm_backward(dinp, dweight, dout, inp, weight, offset, rstd, scratch, N, C);
}

void backend_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, float eps, int N, int C)
{
    backend_rmsnorm_offset_forward(out, rstd, inp, weight, 0.0f, eps, N, C);
}

void backend_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                              const float *rstd, float *scratch, int N, int C)
{
    backend_rmsnorm_offset_backward(dinp, dweight, dout, inp, weight, 0.0f, rstd, scratch, N, C);
}

static void rope_check(int hs, int rot)
{
    if (rot < 2 || rot > hs || rot % 2)
        fail_internal("rotary embedding over %d of a head's %d channels: it takes an even number, 2 to the head size",
                      rot, hs);
}

void backend_rope_forward(float *qkv, const float *cos, const float *sin, const int32_t *pos, int B, int T, int NH,
                          int NKV, int hs, int rot)
{
    rope_check(hs, rot);
    ACT_DISPATCH(act_rope(f32_rope_forward, qkv, cos, sin, pos, B, T, NH, NKV, hs, rot));
    f32_rope_forward(qkv, cos, sin, pos, B, T, NH, NKV, hs, rot);
}

void backend_rope_backward(float *dqkv, const float *cos, const float *sin, const int32_t *pos, int B, int T, int NH,
                           int NKV, int hs, int rot)
{
    rope_check(hs, rot);
    ACT_DISPATCH(act_rope(f32_rope_backward, dqkv, cos, sin, pos, B, T, NH, NKV, hs, rot));
    f32_rope_backward(dqkv, cos, sin, pos, B, T, NH, NKV, hs, rot);
}

void backend_swiglu_forward(float *out, const float *gu, int N, int F)
{
    ACT_DISPATCH(act_swiglu_forward(f32_swiglu_forward, out, gu, N, F));
    f32_swiglu_forward(out, gu, N, F);
}

void backend_swiglu_backward(float *dgu, const float *dout, const float *gu, int N, int F)
{
    ACT_DISPATCH(act_swiglu_backward(f32_swiglu_backward, dgu, dout, gu, N, F));
    f32_swiglu_backward(dgu, dout, gu, N, F);
}

void backend_lora_forward(float *t, float *scratch, const float *x, const float *A, const struct lora_out *out, int k,
                          int ld, float scale, const struct lora_dropout *d, int N, int C, int r)
{
    ACT_DISPATCH(act_lora_forward(f32_lora_forward, t, x, A, out, k, ld, scale, d, N, C, r));
    f32_lora_forward(t, scratch, x, A, out, k, ld, scale, d, N, C, r);
}

void backend_lora_backward(float *dx, float *dA, float *dt, float *scratch, const float *x, const float *t,
                           const float *A, const struct lora_out *out, int k, int ld, float scale,
                           const struct lora_dropout *d, int N, int C, int r)
{
    ACT_DISPATCH(act_lora_backward(f32_lora_backward, dx, dA, x, t, A, out, k, ld, scale, d, N, C, r));
    f32_lora_backward(dx, dA, dt, scratch, x, t, A, out, k, ld, scale, d, N, C, r);
}

void backend_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                               const int32_t *pos, int B, int T, int C)
{
    ACT_DISPATCH(act_embedding_forward(out, tokens, wte, wpe, pos, B, T, C));
    f32_embedding_forward(out, tokens, wte, wpe, pos, B, T, C);
}

void backend_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, const int32_t *pos,
                                int B, int T, int C)
{
    ACT_DISPATCH(act_embedding_backward(f32_embedding_backward, dwte, dwpe, dout, tokens, pos, B, T, C));
    f32_embedding_backward(dwte, dwpe, dout, tokens, pos, B, T, C);
}

void backend_crossentropy_forward(float *losses, float *logits, const int32_t *targets, int N, int V, int Vp)
{
    ACT_DISPATCH(act_crossentropy_forward(f32_crossentropy_forward, losses, logits, targets, N, V, Vp));
    f32_crossentropy_forward(losses, logits, targets, N, V, Vp);
}

void backend_crossentropy_backward(float *probs, const int32_t *targets, float dloss, int N, int V, int Vp)
{
    ACT_DISPATCH(act_crossentropy_backward(f32_crossentropy_backward, probs, targets, dloss, N, V, Vp));
    f32_crossentropy_backward(probs, targets, dloss, N, V, Vp);
}

void backend_crossentropy_backward_rows(float *probs, const int32_t *targets, const float *dloss, int N, int V,
                                        int Vp)
{
    ACT_DISPATCH(act_crossentropy_backward_rows(f32_crossentropy_backward_rows, probs, targets, dloss, N, V, Vp));
    f32_crossentropy_backward_rows(probs, targets, dloss, N, V, Vp);
}

/* The fused MLP calls are the composition of the unfused ones (the same bits as calling them in turn). */
void backend_matmul_forward_gelu(float *pre, float *out, const float *inp, const float *weight, const float *bias,
                                 int N, int C, int OC)
{
    backend_matmul_forward(pre, inp, weight, bias, N, C, OC);
    backend_gelu_forward(out, pre, (size_t)N * OC);
}

void backend_matmul_backward_gelu(float *dpre, float *dweight, float *dbias, const float *dout, const float *inp,
                                  const float *weight, const float *pre, int N, int C, int OC)
{
    backend_matmul_backward(dpre, dweight, dbias, dout, inp, weight, N, C, OC);
    backend_gelu_backward(dpre, pre, dpre, (size_t)N * C);
}
