/*
 * test_small_rows — the CPU backend's products of a handful of rows
 * (backend_cpu.c small_rows, small_rows_t: generation's decoding, N <= 16,
 * each weight element read once instead of OpenBLAS packing the weight):
 * backend_matmul_forward (weight (C, OC), with and without bias) and
 * backend_matmul_forward_transposed (weight (OC, C)) against the product in
 * double, for every N from 1 to 17 (17: sgemm again) at widths that are not
 * multiples of the kernels' blocks (OC % 4 != 0, OC past the 256-column
 * blocks, C odd), and the KV-cached attention against the causal attention
 * of the whole sequence it continues.
 */
#include "backend/backend.h"
#include "check.h"
#include "core/util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TOL 1e-5

static float *random_floats(size_t n, uint64_t *rng)
{
    float *x = xcalloc(n, sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = rng_uniform(rng) * 2.0f - 1.0f;
    return x;
}

/* max |got - want| / max |want| */
static double rel_err(const float *got, const double *want, size_t n)
{
    double err = 0.0, scale = 1e-30;
    for (size_t i = 0; i < n; i++) {
        err = fmax(err, fabs(got[i] - want[i]));
        scale = fmax(scale, fabs(want[i]));
    }
    return err / scale;
}

static void test_matmul(int N, int C, int OC, uint64_t *rng)
{
    float *x = random_floats((size_t)N * C, rng), *w = random_floats((size_t)C * OC, rng);
    float *bias = random_floats((size_t)OC, rng), *out = xcalloc((size_t)N * OC, sizeof *out);
    double *want = xcalloc((size_t)N * OC, sizeof *want);
    char name[96];
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) {
                double s = with_bias ? bias[o] : 0.0;
                for (int c = 0; c < C; c++)
                    s += (double)x[(size_t)n * C + c] * w[(size_t)c * OC + o];
                want[(size_t)n * OC + o] = s;
            }
        backend_matmul_forward(out, x, w, with_bias ? bias : NULL, N, C, OC);
        double e = rel_err(out, want, (size_t)N * OC);
        snprintf(name, sizeof name, "matmul_forward_N%d_C%d_OC%d%s", N, C, OC, with_bias ? "_bias" : "");
        CHECK(name, e <= TOL, "relative error %.3g", e);
    }
    /* weight (OC, C): the same numbers read as the transpose */
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = 0.0;
            for (int c = 0; c < C; c++)
                s += (double)x[(size_t)n * C + c] * w[(size_t)o * C + c];
            want[(size_t)n * OC + o] = s;
        }
    backend_matmul_forward_transposed(out, x, w, N, C, OC);
    double e = rel_err(out, want, (size_t)N * OC);
    snprintf(name, sizeof name, "matmul_forward_transposed_N%d_C%d_OC%d", N, C, OC);
    CHECK(name, e <= TOL, "relative error %.3g", e);
    free(x), free(w), free(bias), free(out), free(want);
}

/* A sequence of T tokens: the causal attention of the whole, against a prefill of its first tokens and then
 * one token per call through the cache. Row 1's prefill keeps fewer tokens than the call's P (the rest is
 * padding, never cached) and goes on from there. With a window the cache is a ring of W positions, shorter
 * than the prefill, so the prefill keeps only its last W and the decode wraps around it several times. */
static void test_attention_kv(int NH, int NKV, int hs, const struct attn_opts *opt, uint64_t *rng)
{
    enum { B = 2, T = 23, P = 9, TMAX = 30 };
    const int Tc = opt && opt->window ? opt->window : TMAX;
    const size_t row = (size_t)(NH + 2 * NKV) * hs, C = (size_t)NH * hs;
    float *qkv = random_floats((size_t)B * T * row, rng);
    float *full = xcalloc((size_t)B * T * C, sizeof *full), *att = xcalloc((size_t)B * NH * T * T, sizeof *att);
    float *scratch = xcalloc(backend_attention_scratch(T, NH) + 1, sizeof *scratch);
    backend_attention_gqa_forward(full, att, qkv, scratch, NULL, B, T, NH, NKV, hs, opt);
    float *kc = xcalloc((size_t)B * Tc * NKV * hs, sizeof *kc), *vc = xcalloc((size_t)B * Tc * NKV * hs, sizeof *vc);
    float *got = xcalloc((size_t)B * T * C, sizeof *got), *step = xcalloc((size_t)B * P * row, sizeof *step);
    float *out = xcalloc((size_t)B * P * C, sizeof *out);
    int32_t past[B] = {0, 0}, keep[B] = {P, P - 3};
    /* prefill: tokens 0 .. P-1 of each row, of which row b keeps keep[b] */
    for (int b = 0; b < B; b++)
        memcpy(step + (size_t)b * P * row, qkv + (size_t)b * T * row, (size_t)P * row * sizeof *step);
    backend_attention_kv_forward(out, step, kc, vc, past, keep, B, P, NH, NKV, hs, Tc, opt);
    for (int b = 0; b < B; b++)
        memcpy(got + (size_t)b * T * C, out + (size_t)b * P * C, (size_t)keep[b] * C * sizeof *got);
    int32_t one[B] = {1, 1};
    for (int t = keep[1]; t < T; t++) { /* then one token per call, row 0 from P on (before: its own again) */
        for (int b = 0; b < B; b++) {
            const int at = b == 0 && t < P ? P - 1 : t; /* row 0 rewrites its last prefilled token meanwhile */
            past[b] = at;
            memcpy(step + (size_t)b * row, qkv + ((size_t)b * T + at) * row, row * sizeof *step);
        }
        backend_attention_kv_forward(out, step, kc, vc, past, one, B, 1, NH, NKV, hs, Tc, opt);
        for (int b = 0; b < B; b++)
            memcpy(got + ((size_t)b * T + past[b]) * C, out + (size_t)b * C, C * sizeof *got);
    }
    double *want = xcalloc((size_t)B * T * C, sizeof *want);
    for (size_t i = 0; i < (size_t)B * T * C; i++)
        want[i] = full[i];
    double e = rel_err(got, want, (size_t)B * T * C);
    char name[128];
    snprintf(name, sizeof name, "attention_kv_equals_causal_nh%d_kv%d_hs%d_window%d_softcap%g_scale%g", NH, NKV, hs,
             opt ? opt->window : 0, opt ? (double)opt->softcap : 0.0, opt ? (double)opt->scale : 0.0);
    CHECK(name, e <= TOL, "relative error %.3g", e);
    free(qkv), free(full), free(att), free(scratch), free(kc), free(vc), free(got), free(step), free(out), free(want);
}

int main(void)
{
    backend_init(2);
    uint64_t rng = 0x5a11c0de12345ull;
    for (int N = 1; N <= 17; N++)
        test_matmul(N, 37, 301, &rng);
    test_matmul(3, 64, 8, &rng);
    test_matmul(8, 33, 5, &rng);
    test_attention_kv(4, 2, 8, NULL, &rng);
    test_attention_kv(3, 3, 5, NULL, &rng);
    test_attention_kv(4, 1, 6, NULL, &rng);
    /* windows shorter than the prefill (a ring of 5 under a prefill of 9), soft-cap and a scale of their own */
    const struct attn_opts window5 = {5, 0.0f, 0.0f}, capped = {4, 2.5f, 0.3f}, wide = {40, 1.5f, 0.0f};
    test_attention_kv(4, 2, 8, &window5, &rng);
    test_attention_kv(4, 1, 6, &capped, &rng);
    test_attention_kv(3, 3, 5, &wide, &rng);
    return check_status();
}
