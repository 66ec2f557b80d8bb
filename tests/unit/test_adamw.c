/*
 * test_adamw — the fused AdamW pass against PyTorch's formula in double
 * precision (several steps; AdamW and L2 modes; weight decay on and off;
 * grad_scale), against the straightforward fp32 formula (within fp32
 * rounding), SIMD levels and store kinds against the scalar code bit for bit,
 * and param_out against dtype_convert of the new master weights.
 */
#include "core/adamw.h"
#include "check.h"
#include "core/dtype.h"
#include "core/util.h"

#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Per-step error bound, in units of FLT_EPSILON times the magnitudes that
 * meet in the last addition: about six fp32 roundings feed the update term
 * (grad_scale, lr/bc1, 1/sqrt(bc2), sqrt, the division, the fma), each at
 * most FLT_EPSILON/2 relative, plus the hyper-parameters' own rounding to
 * fp32. Twice that leaves room without hiding a wrong formula, which is off
 * by orders of magnitude more (checked by the eps- and decay-sensitive data). */
#define STEP_TOL_EPS 8.0
/* The fused pass (fma, multiply by 1/sqrt(bc2)) may round differently from
 * PyTorch's fp32 sequence, but not be less accurate than it by more than this. */
#define FUSED_MARGIN_EPS 0.5
/* Fused against straightforward fp32, same scales: both sit within about
 * 2.5 eps of the exact result (measured), so they can be at most ~5 apart;
 * measured up to 2.9. */
#define APART_TOL_EPS 4.0
/* Drift after 6 steps: the per-step errors add up, m's and v's carry over. */
#define DRIFT_TOL_EPS 16.0

struct state {
    float *p, *m, *v, *g;
    size_t n;
};

static struct state state_new(size_t n)
{
    struct state s = {xmalloc(n * 4), xmalloc(n * 4), xmalloc(n * 4), xmalloc(n * 4), n};
    return s;
}

static void state_free(struct state *s)
{
    free(s->p);
    free(s->m);
    free(s->v);
    free(s->g);
}

static void state_copy(struct state *dst, const struct state *src)
{
    memcpy(dst->p, src->p, src->n * 4);
    memcpy(dst->m, src->m, src->n * 4);
    memcpy(dst->v, src->v, src->n * 4);
    memcpy(dst->g, src->g, src->n * 4);
}

/* Gradients over 11 decades (so that eps matters for the small ones), some zero. */
static void fill_grads(float *g, size_t n, uint64_t *rng)
{
    for (size_t i = 0; i < n; i++) {
        const double decade = -10.0 + 11.0 * rng_uniform(rng);
        g[i] = i % 97 == 0 ? 0.0f : (float)(rng_normal(rng) * pow(10.0, decade));
    }
}

static void fill_state(struct state *s, uint64_t seed)
{
    uint64_t rng = seed;
    for (size_t i = 0; i < s->n; i++) {
        s->p[i] = rng_normal(&rng) * (i % 5 == 0 ? 2.0f : 0.02f);
        s->m[i] = rng_normal(&rng) * 1e-3f;
        s->v[i] = rng_uniform(&rng) * 1e-6f;
    }
    fill_grads(s->g, s->n, &rng);
}

/* The hyper-parameters at step t, bias corrections as zero.c computes them. */
static struct adamw_hparams hparams_at(int t, bool adam_w_mode, float wd, float grad_scale)
{
    const float beta1 = 0.9f, beta2 = 0.95f;
    struct adamw_hparams hp = {
        .lr = 3e-3f,
        .beta1 = beta1,
        .beta2 = beta2,
        .eps = 1e-8f,
        .weight_decay = wd,
        .adam_w_mode = adam_w_mode,
        .bias_correction1 = (float)(1.0 - pow(beta1, t)),
        .bias_correction2 = (float)(1.0 - pow(beta2, t)),
        .grad_scale = grad_scale,
    };
    return hp;
}

/* PyTorch's AdamW / Adam step in double, on one element; bias corrections
 * exact (Python computes them in double). Also returns the magnitudes that
 * the error bounds scale with. */
struct ref_result {
    double p, m, v;
    double update;                    /* lr / bc1 * m / denom */
    double p_scale, m_scale, v_scale; /* sums of |terms|, through to p */
};

static struct ref_result reference_element(double p, double m, double v, float grad, const struct adamw_hparams *hp,
                                           int t)
{
    const double b1 = hp->beta1, b2 = hp->beta2, lr = hp->lr, wd = hp->weight_decay;
    double g = (double)grad * hp->grad_scale;
    double g_scale = fabs(g); /* |terms| of g: in L2 mode g may be a difference */
    if (hp->adam_w_mode) {
        p *= 1.0 - lr * wd; /* param.mul_(1 - lr * weight_decay) */
    } else {
        g += wd * p;        /* grad = grad.add(param, alpha=weight_decay) */
        g_scale += fabs(wd * p);
    }
    struct ref_result r;
    r.m_scale = fabs(b1 * m) + (1 - b1) * g_scale;
    r.v_scale = fabs(b2 * v) + 2 * (1 - b2) * g_scale * fabs(g); /* g^2's error is twice g's, relative */
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
    const double denom = sqrt(v) / sqrt(bc2) + hp->eps;
    r.update = lr / bc1 * m / denom;
    /* m may be a difference of larger terms: its rounding error scales with
     * m_scale, and so does the update's */
    r.p_scale = fabs(p) + lr / bc1 * r.m_scale / denom;
    r.p = p - r.update;
    r.m = m;
    r.v = v;
    return r;
}

/* PyTorch's sequence of fp32 operations (torch.optim.AdamW, foreach=False),
 * without fused multiply-adds: what "straightforward" means below. */
#ifdef __clang__
#define NO_FP_CONTRACT
#else
#define NO_FP_CONTRACT __attribute__((optimize("fp-contract=off")))
#endif
NO_FP_CONTRACT static void straightforward_step(struct state *s, const struct adamw_hparams *hp)
{
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif
    const float step_size = hp->lr / hp->bias_correction1, bc2_sqrt = sqrtf(hp->bias_correction2);
    for (size_t i = 0; i < s->n; i++) {
        float g = s->g[i] * hp->grad_scale;
        float p = s->p[i];
        if (hp->adam_w_mode)
            p = p * (1.0f - hp->lr * hp->weight_decay);
        else
            g = g + hp->weight_decay * p;
        s->m[i] = s->m[i] * hp->beta1 + g * (1.0f - hp->beta1);
        s->v[i] = s->v[i] * hp->beta2 + g * g * (1.0f - hp->beta2);
        const float denom = sqrtf(s->v[i]) / bc2_sqrt + hp->eps;
        s->p[i] = p + -step_size * (s->m[i] / denom);
    }
}

/* Worst error of the stepped state against the reference, in units of
 * FLT_EPSILON times each element's scale (NaN counts as infinite). */
static double worst_error(const struct state *s, const struct ref_result *ref)
{
    double worst = 0;
    for (size_t i = 0; i < s->n; i++) {
        const double e[3] = {
            fabs(s->p[i] - ref[i].p) / (FLT_EPSILON * ref[i].p_scale + DBL_MIN),
            fabs(s->m[i] - ref[i].m) / (FLT_EPSILON * ref[i].m_scale + DBL_MIN),
            fabs(s->v[i] - ref[i].v) / (FLT_EPSILON * ref[i].v_scale + DBL_MIN),
        };
        for (int k = 0; k < 3; k++)
            worst = e[k] > worst || isnan(e[k]) ? (isnan(e[k]) ? INFINITY : e[k]) : worst;
    }
    return worst;
}

static void test_against_reference(void)
{
    const size_t n = 50021;
    const int steps = 6;
    struct {
        const char *name;
        bool adam_w_mode;
        float wd, grad_scale;
    } modes[] = {
        {"AdamW wd 0.1", true, 0.1f, 1.0f},
        {"AdamW wd 0 (no-decay tensor)", true, 0.0f, 1.0f},
        {"AdamW wd 0.1, grad_scale 0.37/65536 (unscale + clip)", true, 0.1f, 0.37f / 65536.0f},
        {"L2 (adam_w_mode false) wd 0.01", false, 0.01f, 1.0f},
        {"L2 wd 0.01, grad_scale 2^-10", false, 0.01f, 1.0f / 1024.0f},
    };
    char label[220];
    for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++) {
        struct state s = state_new(n), plain = state_new(n);
        fill_state(&s, 100 + k);
        memset(s.m, 0, n * 4); /* a run starts with zero moments */
        memset(s.v, 0, n * 4);
        uint64_t rng = 200 + k;
        /* an independent double-precision run over all steps, from the same start */
        double *dp = xmalloc(n * sizeof *dp), *dm = xmalloc(n * sizeof *dm), *dv = xmalloc(n * sizeof *dv);
        double *moved = xcalloc(n, sizeof *moved); /* sum of |update| over the steps */
        for (size_t i = 0; i < n; i++) {
            dp[i] = s.p[i];
            dm[i] = s.m[i];
            dv[i] = s.v[i];
        }
        struct ref_result *ref = xmalloc(n * sizeof *ref);
        double worst_fused = 0, worst_plain = 0, worst_apart = 0;
        for (int t = 1; t <= steps; t++) {
            if (modes[k].grad_scale != 1.0f) /* gradients as they arrive before unscaling */
                for (size_t i = 0; i < n; i++)
                    s.g[i] /= modes[k].grad_scale;
            const struct adamw_hparams hp = hparams_at(t, modes[k].adam_w_mode, modes[k].wd, modes[k].grad_scale);
            for (size_t i = 0; i < n; i++) {
                const struct ref_result r = reference_element(dp[i], dm[i], dv[i], s.g[i], &hp, t);
                dp[i] = r.p;
                dm[i] = r.m;
                dv[i] = r.v;
                moved[i] += fabs(r.update);
                ref[i] = reference_element(s.p[i], s.m[i], s.v[i], s.g[i], &hp, t); /* from the fp32 state */
            }
            state_copy(&plain, &s);
            straightforward_step(&plain, &hp);
            adamw_update(s.p, s.m, s.v, s.g, n, &hp, NULL, DTYPE_F32);
            worst_fused = fmax(worst_fused, worst_error(&s, ref));
            worst_plain = fmax(worst_plain, worst_error(&plain, ref));
            for (size_t i = 0; i < n; i++) { /* the straightforward result as the reference, same scales */
                ref[i].p = plain.p[i];
                ref[i].m = plain.m[i];
                ref[i].v = plain.v[i];
            }
            worst_apart = fmax(worst_apart, worst_error(&s, ref));
            fill_grads(s.g, n, &rng);
        }
        printf("# %s: worst error per step, in FLT_EPSILON x scale: fused %.3g, straightforward fp32 %.3g;"
               " fused vs straightforward %.3g\n",
               modes[k].name, worst_fused, worst_plain, worst_apart);
        snprintf(label, sizeof label, "%s: each of %d steps within %.0f eps of PyTorch's formula in double",
                 modes[k].name, steps, STEP_TOL_EPS);
        CHECK(label, worst_fused <= STEP_TOL_EPS, "worst %.3g eps", worst_fused);
        snprintf(label, sizeof label, "%s: fused error <= straightforward fp32 error + %.1f eps", modes[k].name,
                 FUSED_MARGIN_EPS);
        CHECK(label, worst_fused <= worst_plain + FUSED_MARGIN_EPS, "fused %.3g, straightforward %.3g", worst_fused,
              worst_plain);
        snprintf(label, sizeof label, "%s: fused within %.0f eps of the straightforward fp32 result", modes[k].name,
                 APART_TOL_EPS);
        CHECK(label, worst_apart <= APART_TOL_EPS, "worst %.3g eps", worst_apart);
        /* after all steps the fp32 run stays within fp32 resolution of the
         * all-double run, relative to how far the parameters moved */
        double worst_drift = 0;
        for (size_t i = 0; i < n; i++) {
            const double rel = fabs(s.p[i] - dp[i]) / (FLT_EPSILON * (fabs(dp[i]) + moved[i]));
            worst_drift = rel > worst_drift || isnan(rel) ? rel : worst_drift;
        }
        snprintf(label, sizeof label, "%s: after %d steps p within %.0f eps x (|p| + sum |update|) of an all-double run",
                 modes[k].name, steps, DRIFT_TOL_EPS);
        CHECK(label, worst_drift <= DRIFT_TOL_EPS, "worst %.3g eps", worst_drift);
        free(ref);
        free(dp);
        free(dm);
        free(dv);
        free(moved);
        state_free(&s);
        state_free(&plain);
    }
}

/* Whether two byte ranges differ (bitwise: NaN payloads and -0 included). */
static int differ(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) != 0; }

/* Every level and store kind, at several sizes and misalignments, with every
 * param_out dtype, equals the scalar code bit for bit; param_out equals
 * dtype_convert of the new master; nothing is written past the range. */
static void test_levels_and_out(void)
{
    const size_t sizes[] = {1, 15, 16, 17, 1000, 40009, 100003};
    const size_t pad = 64; /* elements of canary around every array */
    const uint16_t canary = 0x7da5; /* a signalling NaN in fp16, huge in bf16: no result here */
    char label[220];
    size_t failures[4] = {0, 0, 0, 0}, runs = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const size_t n = sizes[si];
        const size_t total = n + 2 * pad;
        struct state base = state_new(total), want = state_new(total), got = state_new(total);
        fill_state(&base, 31 + si);
        /* special values: a NaN gradient, an infinite one, parameters past fp16's range */
        if (n > 40) {
            base.g[pad + 3] = NAN;
            base.g[pad + 7] = INFINITY;
            base.p[pad + 11] = 70000.0f;
            base.p[pad + 12] = -65519.0f;
            base.p[pad + 13] = 1e-7f;
        }
        uint16_t *out_want = xmalloc(total * 4), *out_got = xmalloc(total * 4), *converted = xmalloc(total * 4);
        uint16_t *canaries = xmalloc(total * 4); /* the pattern every out buffer starts from */
        for (size_t i = 0; i < total * 2; i++)
            canaries[i] = canary;
        for (int out_dt = -1; out_dt <= DTYPE_BF16; out_dt++) { /* -1: no param_out */
            for (int mode = 0; mode < 2; mode++) {
                const struct adamw_hparams hp = hparams_at(2 + mode, mode == 0, 0.1f, 0.75f);
                /* offsets: aligned; p misaligned by 3; m and v misaligned differently from p */
                for (int shift = 0; shift < 3; shift++) {
                    const size_t off_p = pad - (shift == 1 ? 3 : 0), off_mv = pad - (shift == 2 ? 5 : 0);
                    const size_t out_off = pad - (shift == 2 ? 1 : 0);
                    const enum dtype odt = out_dt < 0 ? DTYPE_F32 : (enum dtype)out_dt;
                    const size_t osz = (size_t)dtype_size(odt);
                    state_copy(&want, &base);
                    memcpy(out_want, canaries, total * 4);
                    void *ow = out_dt < 0 ? NULL : (char *)out_want + out_off * osz;
                    adamw_update_with(want.p + off_p, want.m + off_mv, want.v + off_mv, want.g + off_p, n, &hp, ow,
                                      odt, DTYPE_SIMD_SCALAR, ADAMW_STORES_CACHED);
                    /* the scalar level was the reference just above (it ignores the store kind) */
                    for (int level = DTYPE_SIMD_AVX2; level <= DTYPE_SIMD_AVX512; level++) {
                        if (!dtype_simd_available((enum dtype_simd)level))
                            continue;
                        /* AUTO is CACHED below ADAMW_STREAM_MIN; 3 threads only where the range is split */
                        for (int stores = ADAMW_STORES_CACHED; stores <= ADAMW_STORES_STREAMING; stores++) {
                            for (int threads = 1; threads <= (n >= 32768 ? 3 : 1); threads += 2) {
                                omp_set_num_threads(threads);
                                state_copy(&got, &base);
                                memcpy(out_got, canaries, total * 4);
                                void *og = out_dt < 0 ? NULL : (char *)out_got + out_off * osz;
                                adamw_update_with(got.p + off_p, got.m + off_mv, got.v + off_mv, got.g + off_p, n, &hp,
                                                  og, odt, (enum dtype_simd)level, (enum adamw_stores)stores);
                                runs++;
                                /* the whole arrays, canaries included */
                                failures[0] += differ(got.p, want.p, total * 4);
                                failures[1] += differ(got.m, want.m, total * 4) || differ(got.v, want.v, total * 4);
                                failures[2] += differ(out_got, out_want, total * 4);
                            }
                        }
                    }
                    omp_set_num_threads(1);
                    if (out_dt >= 0) {
                        /* the cast in the pass equals dtype_convert of the new master, and stays in range */
                        memcpy(converted, canaries, total * 4);
                        dtype_convert((char *)converted + out_off * osz, odt, want.p + off_p, DTYPE_F32, n);
                        failures[3] += differ(converted, out_want, total * 4);
                    }
                }
            }
        }
        free(out_want);
        free(out_got);
        free(converted);
        free(canaries);
        state_free(&base);
        state_free(&want);
        state_free(&got);
    }
    snprintf(label, sizeof label, "every level x store kind x threads (%zu runs): p == scalar bitwise, canaries intact",
             runs);
    CHECK(label, failures[0] == 0, "%zu runs differ", failures[0]);
    CHECK("every level x store kind x threads: m, v == scalar bitwise", failures[1] == 0, "%zu runs differ",
          failures[1]);
    CHECK("every level x store kind x threads: param_out == scalar bitwise, nothing written outside", failures[2] == 0,
          "%zu runs differ", failures[2]);
    CHECK("param_out (fp32, fp16, bf16) == dtype_convert of the new master, bitwise", failures[3] == 0,
          "%zu cases differ", failures[3]);
}

/* Overflow to inf in the fp16 cast and NaN propagation, spelled out. */
static void test_out_specials(void)
{
    float p[4] = {70000.0f, 1.0f, 65504.0f, 1.0f}, m[4] = {0}, v[4] = {0};
    const float g[4] = {0.0f, NAN, 0.0f, 0.0f};
    uint16_t out[4];
    const struct adamw_hparams hp = hparams_at(1, true, 0.0f, 1.0f);
    adamw_update(p, m, v, g, 4, &hp, out, DTYPE_F16);
    CHECK("fp16 param_out: 70000 -> inf", out[0] == 0x7c00, "got 0x%04x", out[0]);
    CHECK("NaN gradient: p, m, v and param_out are NaN", isnan(p[1]) && isnan(m[1]) && isnan(v[1]) &&
                                                             (out[1] & 0x7c00) == 0x7c00 && (out[1] & 0x3ff),
          "p %g out 0x%04x", p[1], out[1]);
    CHECK("zero gradient, zero state: p unchanged (65504 stays fp16 max)", p[2] == 65504.0f && out[2] == 0x7bff,
          "p %g out 0x%04x", p[2], out[2]);
}

int main(void)
{
    omp_set_num_threads(1);
    printf("# SIMD level: %s\n", dtype_simd_name(dtype_simd_best()));
    test_against_reference();
    test_levels_and_out();
    test_out_specials();
    return check_status();
}
