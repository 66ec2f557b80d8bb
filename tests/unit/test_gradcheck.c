/*
 * test_gradcheck — the backward pass of every CPU kernel against central finite
 * differences in double precision (src/backend/cpu/backend_cpu.c, src/backend/cpu/backend_cpu_attention.c).
 *
 * The same sources, src/backend/cpu/backend_cpu.c and src/backend/cpu/backend_cpu_attention.c, are
 * compiled a second time in this file with float replaced by double and sgemm
 * by dgemm; their functions are renamed f64_* so that they live beside the
 * real fp32 backend_* linked in from src/.
 * For each kernel, on a tiny random problem:
 *   - the objective is L = sum(w * forward(x)) with random weights w;
 *   - the analytic gradient is the f64 backward with dout = w;
 *   - the numeric gradient is (L(x + h) - L(x - h)) / 2h for every element of
 *     every differentiable input (activations, weights and biases);
 *   - buffers the backward must accumulate into start from random values and
 *     the increment is what is checked; buffers it must overwrite start from
 *     OVERWRITE_SENTINEL, so either convention broken fails the check;
 *   - the fp32 kernels are run on the same (fp32-exact) inputs and must agree
 *     with the f64 twin, forward and backward;
 *   - where a convention could be wrong in the forward and the backward alike,
 *     which the gradient cannot see (rotary's rotate-half pairs and sign,
 *     which key/value head a query head reads), the f64 forward is compared
 *     with the formula written out here.
 * Lines starting with '#' report the measured errors; they are not checks.
 */
#include "backend/backend.h"
#include "backend/cpu/backend_cpu_attention.h"
#include "check.h"
#include "core/util.h"
#include "core/fastmath.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- the double-precision twin of src/backend/cpu/backend_cpu.c and backend_cpu_attention.c
 * Every header they include is already included above, so their include guards
 * keep the macros below away from them (util.h's float helpers stay float), but
 * backend_cpu_act.h: read here under BACKEND_CPU_NO_ACT, its ACT_DISPATCH is off
 * (its act_ prototypes in double are never called). */
#define BACKEND_CPU_NO_ACT
#define float double
#define cblas_sgemm cblas_dgemm
#define sqrtf sqrt
#define expf exp
#define tanhf tanh
#define logf log
#define fast_expf exp
#define fast_tanhf tanh
#define backend_init f64_init
#define backend_name f64_name
#define backend_is_device f64_is_device
#define backend_check_performance f64_check_performance
#define backend_matmul_forward f64_matmul_forward
#define backend_matmul_backward f64_matmul_backward
#define backend_matmul_forward_transposed f64_matmul_forward_transposed
#define backend_matmul_backward_transposed f64_matmul_backward_transposed
#define backend_matmul_forward_gelu f64_matmul_forward_gelu
#define backend_matmul_backward_gelu f64_matmul_backward_gelu
#define backend_layernorm_forward f64_layernorm_forward
#define backend_layernorm_backward f64_layernorm_backward
#define backend_layernorm_scratch f64_layernorm_scratch
#define backend_gelu_forward f64_gelu_forward
#define backend_gelu_backward f64_gelu_backward
#define backend_add f64_add
#define backend_lora_forward f64_lora_forward
#define backend_lora_backward f64_lora_backward
#define backend_attention_forward f64_attention_forward
#define backend_attention_backward f64_attention_backward
#define backend_attention_scratch f64_attention_scratch
#define backend_attention_saved f64_attention_saved
#define backend_attention_gqa_forward f64_attention_gqa_forward
#define backend_attention_gqa_backward f64_attention_gqa_backward
#define backend_attention_kv_forward f64_attention_kv_forward
#define backend_cpu_attention_kernel f64_attention_kernel
#define backend_cpu_attention_use f64_attention_use
#define backend_rmsnorm_forward f64_rmsnorm_forward
#define backend_rmsnorm_backward f64_rmsnorm_backward
#define backend_rmsnorm_offset_forward f64_rmsnorm_offset_forward
#define backend_rmsnorm_offset_backward f64_rmsnorm_offset_backward
#define backend_rope_forward f64_rope_forward
#define backend_rope_backward f64_rope_backward
#define backend_swiglu_forward f64_swiglu_forward
#define backend_swiglu_backward f64_swiglu_backward
#define backend_embedding_forward f64_embedding_forward
#define backend_embedding_backward f64_embedding_backward
#define backend_crossentropy_forward f64_crossentropy_forward
#define backend_crossentropy_backward f64_crossentropy_backward
#define backend_crossentropy_backward_rows f64_crossentropy_backward_rows
#define backend_sum_squares f64_sum_squares
#define backend_all_finite f64_all_finite
#define backend_scale f64_scale
#define backend_scale_rows f64_scale_rows
#define backend_zero f64_zero
#define backend_copy f64_copy
/* backend.h's struct lora_out (float pointers) in the twin: the same members in double */
struct lora_out_f64 {
    double *y;
    const double *B;
    double *dB;
    int OC;
};
#define lora_out lora_out_f64
/* tiles of 8 queries x 16 keys, triangles in blocks of 3 rows in the twin (fp32: backend_cpu_attention.c's), so
 * that the short rows here cross several of them, packed samples too */
#define ATTN_TILE_Q 8
#define ATTN_TILE_K 16
#define ATTN_TILE_DIAG 3

#include "../../src/backend/cpu/backend_cpu.c"
#include "../../src/backend/cpu/backend_cpu_attention.c"

#undef lora_out
#undef ATTN_TILE_Q
#undef ATTN_TILE_K
#undef ATTN_TILE_DIAG

#undef float
#undef cblas_sgemm
#undef sqrtf
#undef expf
#undef tanhf
#undef logf
#undef backend_init
#undef backend_name
#undef backend_matmul_forward
#undef backend_matmul_backward
#undef backend_matmul_forward_transposed
#undef backend_matmul_backward_transposed
#undef backend_matmul_forward_gelu
#undef backend_matmul_backward_gelu
#undef backend_layernorm_forward
#undef backend_layernorm_backward
#undef backend_layernorm_scratch
#undef backend_gelu_forward
#undef backend_gelu_backward
#undef backend_add
#undef backend_lora_forward
#undef backend_lora_backward
#undef backend_attention_forward
#undef backend_attention_backward
#undef backend_attention_scratch
#undef backend_attention_saved
#undef backend_attention_gqa_forward
#undef backend_attention_gqa_backward
#undef backend_attention_kv_forward
#undef backend_cpu_attention_kernel
#undef backend_cpu_attention_use
#undef backend_rmsnorm_forward
#undef backend_rmsnorm_backward
#undef backend_rope_forward
#undef backend_rope_backward
#undef backend_swiglu_forward
#undef backend_swiglu_backward
#undef backend_embedding_forward
#undef backend_embedding_backward
#undef backend_crossentropy_forward
#undef backend_crossentropy_backward
#undef backend_crossentropy_backward_rows
#undef backend_sum_squares
#undef backend_all_finite
#undef backend_scale
#undef backend_scale_rows
#undef backend_zero

/* ---- tolerances ---------------------------------------------------------- */

/* Central-difference step. The objective's difference is taken output by
 * output (numeric_gradient), so outputs a step leaves alone cancel exactly;
 * what remains is the round-off of the outputs it moves, about
 * 1e-16 * |out| / h each, and the truncation error h^2 * f''' / 6 ~ 1e-13. */
#define FD_STEP 1e-6
/* Analytic vs numeric: max over a tensor of |a - n| / max(|n|, GRAD_FLOOR).
 * Measured: <= 1e-8 relative on every gradient above the floor; a wrong term
 * in a backward formula is off by 1e-3 .. 1. */
#define GRAD_TOL 1e-6
/* Below the floor the error is judged in absolute terms, GRAD_TOL * GRAD_FLOOR
 * = 1e-8: the round-off of the difference quotient reaches 1e-9 absolute
 * (attention at T = 70, where a step in one key moves 70 x 4 outputs), which
 * relative to a gradient of 1e-3 would already read as 1e-6. The gradients
 * here are O(0.01 .. 1). */
#define GRAD_FLOOR 1e-2
/* fp32 kernel vs its f64 twin on identical inputs: max |f - d| / max(|d|, FLOAT_FLOOR).
 * fp32 round-off is 6e-8 per operation; measured <= 1e-6, the worst on the
 * longest reductions (attention at T = 70). */
#define FLOAT_TOL 1e-5
/* The tensors compared are O(0.1 .. 10); entries below the floor are judged
 * in absolute terms, since fp32 cancellation makes tiny values meaningless. */
#define FLOAT_FLOOR 1e-1
/* Written into buffers a backward must overwrite: accumulating into them
 * instead would leave an error of this size. */
#define OVERWRITE_SENTINEL 1000.0
/* An f64 kernel against the same arithmetic written out in this file (the
 * rotate-half rotation, causal attention): only the order of operations
 * differs, about 1e-16 relative per operation; a wrong convention (pairs
 * interleaved instead of halves, the sign of sin, a table read at the wrong
 * position, a query head reading the wrong key/value head) is off by 1e-2 .. 1.
 * Measured: <= 2e-15. */
#define FORMULA_TOL 1e-12

/* ---- helpers ------------------------------------------------------------- */

/* n values uniform in [lo, hi), each exactly representable in fp32 so that the
 * float and double kernels see identical inputs. */
static double *random_tensor(size_t n, double lo, double hi, uint64_t *rng)
{
    double *x = xmalloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = (double)(float)(lo + (hi - lo) * (double)rng_uniform(rng));
    return x;
}

static double *filled_tensor(size_t n, double value)
{
    double *x = xmalloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = value;
    return x;
}

/* The fp32 buffer a backward must overwrite, filled with OVERWRITE_SENTINEL. */
static float *sentinel_tensor_f(size_t n)
{
    float *x = xmalloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)OVERWRITE_SENTINEL;
    return x;
}

static double *copy_tensor(const double *x, size_t n)
{
    double *y = xmalloc(n * sizeof *y);
    memcpy(y, x, n * sizeof *y);
    return y;
}

/* Packed rows (backend.h): row b holds samples of the lengths PACK_LENGTHS[(b + k) % n], k = 0, 1, ..., laid end
 * to end, the last one cut at T (as trailing padding would be). pos (B, T), freed by the caller. */
static const int PACK_LENGTHS[] = {1, 2, 7, 33, 3};

static int32_t *packed_positions(int B, int T)
{
    const int n = (int)(sizeof PACK_LENGTHS / sizeof PACK_LENGTHS[0]);
    int32_t *pos = xmalloc((size_t)B * T * sizeof *pos);
    for (int b = 0; b < B; b++)
        for (int t = 0, k = 0, at = 0; t < T; t++, at++) {
            if (at == PACK_LENGTHS[(b + k) % n])
                k++, at = 0;
            pos[(size_t)b * T + t] = at;
        }
    return pos;
}

/* The position of token t of row b: pos[b, t], or t without positions. */
static int position_of(const int32_t *pos, int b, int t, int T) { return pos ? pos[(size_t)b * T + t] : t; }

/* The fp32 copy of x (exact for random_tensor's values). */
static float *narrow(const double *x, size_t n)
{
    float *y = xmalloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++)
        y[i] = (float)x[i];
    return y;
}

/* after - before in double: what a backward added to a buffer. before may be NULL (zero). */
static double *increment(const double *after, const double *before, size_t n)
{
    double *d = xmalloc(n * sizeof *d);
    for (size_t i = 0; i < n; i++)
        d[i] = after[i] - (before ? before[i] : 0.0);
    return d;
}

static double *increment_f(const float *after, const double *before, size_t n)
{
    double *d = xmalloc(n * sizeof *d);
    for (size_t i = 0; i < n; i++)
        d[i] = (double)after[i] - (before ? before[i] : 0.0);
    return d;
}

/* max |got - want| / max(|want|, floor); NaN when any entry is NaN. */
static double max_rel_err(const double *got, const double *want, size_t n, double floor)
{
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double den = fabs(want[i]) > floor ? fabs(want[i]) : floor;
        double err = fabs(got[i] - want[i]) / den;
        if (isnan(err))
            return NAN;
        worst = err > worst ? err : worst;
    }
    return worst;
}

static double max_abs(const double *x, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

static double g_worst_grad_err, g_worst_float_err;

static void check_err(const char *what, const char *kernel, const char *tensor, double err, double tol)
{
    char name[160];
    snprintf(name, sizeof name, "%s %s %s", what, kernel, tensor);
    printf("# %s: max rel err %.2e (tol %.0e)\n", name, err, tol);
    CHECK(name, err <= tol, "max relative error %.3e > %.0e", err, tol);
}

/* Analytic gradient against the numeric one. A numeric gradient that is tiny
 * everywhere would be judged against the floor alone and pass almost anything,
 * so it must also reach well above the floor somewhere. */
static void check_gradient(const char *kernel, const char *tensor, const double *analytic,
                           const double *numeric, size_t n)
{
    double err = max_rel_err(analytic, numeric, n, GRAD_FLOOR);
    g_worst_grad_err = !(err <= g_worst_grad_err) ? err : g_worst_grad_err;
    check_err("gradcheck", kernel, tensor, err, GRAD_TOL);
    char name[160];
    snprintf(name, sizeof name, "gradcheck %s %s is non-trivial", kernel, tensor);
    CHECK(name, max_abs(numeric, n) > 10 * GRAD_FLOOR, "max |numeric gradient| %.3g", max_abs(numeric, n));
}

static void check_float(const char *kernel, const char *tensor, const double *got, const double *want, size_t n)
{
    double err = max_rel_err(got, want, n, FLOAT_FLOOR);
    g_worst_float_err = !(err <= g_worst_float_err) ? err : g_worst_float_err;
    check_err("fp32 matches f64", kernel, tensor, err, FLOAT_TOL);
}

static void check_float_f(const char *kernel, const char *tensor, const float *got, const double *want, size_t n)
{
    double *wide = increment_f(got, NULL, n);
    check_float(kernel, tensor, wide, want, n);
    free(wide);
}

/* ---- numeric gradient ---------------------------------------------------- */

/* L = sum(weight * out), out recomputed by forward(ctx, out) from inputs that ctx points to. */
struct objective {
    void (*forward)(void *ctx, double *out);
    void *ctx;
    const double *weight; /* (n_out) */
    size_t n_out;
};

/* grad (n) = dL/dx by central differences, x (n) being one of the inputs the
 * objective's forward reads; x is restored exactly. The difference is taken
 * output by output, so outputs the step leaves unchanged cancel exactly. */
static void numeric_gradient(double *grad, double *x, size_t n, const struct objective *obj)
{
    double *out_plus = xmalloc(obj->n_out * sizeof *out_plus);
    double *out_minus = xmalloc(obj->n_out * sizeof *out_minus);
    for (size_t i = 0; i < n; i++) {
        double saved = x[i];
        double up = saved + FD_STEP, down = saved - FD_STEP;
        x[i] = up;
        obj->forward(obj->ctx, out_plus);
        x[i] = down;
        obj->forward(obj->ctx, out_minus);
        x[i] = saved;
        double diff = 0.0;
        for (size_t k = 0; k < obj->n_out; k++)
            diff += obj->weight[k] * (out_plus[k] - out_minus[k]);
        grad[i] = diff / (up - down);
    }
    free(out_plus);
    free(out_minus);
}

static double *numeric(double *x, size_t n, const struct objective *obj)
{
    double *grad = xmalloc(n * sizeof *grad);
    numeric_gradient(grad, x, n, obj);
    return grad;
}

/* ---- matmul -------------------------------------------------------------- */

struct matmul_case {
    int N, C, OC;
    double *inp;    /* (N, C) */
    double *weight; /* (C, OC) */
    double *bias;   /* (OC) or NULL */
};

static void matmul_objective(void *ctx, double *out)
{
    struct matmul_case *m = ctx;
    f64_matmul_forward(out, m->inp, m->weight, m->bias, m->N, m->C, m->OC);
}

static void test_matmul(int with_bias, uint64_t *rng)
{
    const char *kernel = with_bias ? "matmul+bias" : "matmul";
    const int N = 3, C = 4, OC = 5;
    const size_t n_inp = (size_t)N * C, n_w = (size_t)C * OC, n_out = (size_t)N * OC;
    struct matmul_case m = {N, C, OC, random_tensor(n_inp, -1, 1, rng), random_tensor(n_w, -1, 1, rng),
                            with_bias ? random_tensor(OC, -1, 1, rng) : NULL};
    double *w = random_tensor(n_out, -1, 1, rng);
    double *dweight0 = random_tensor(n_w, -1, 1, rng), *dbias0 = random_tensor(OC, -1, 1, rng);

    /* analytic, f64 */
    double *out = xmalloc(n_out * sizeof *out);
    matmul_objective(&m, out);
    double *dinp = filled_tensor(n_inp, OVERWRITE_SENTINEL);
    double *dweight = copy_tensor(dweight0, n_w), *dbias = copy_tensor(dbias0, OC);
    f64_matmul_backward(dinp, dweight, with_bias ? dbias : NULL, w, m.inp, m.weight, N, C, OC);
    double *dweight_inc = increment(dweight, dweight0, n_w), *dbias_inc = increment(dbias, dbias0, OC);

    /* numeric */
    struct objective obj = {matmul_objective, &m, w, n_out};
    double *num_inp = numeric(m.inp, n_inp, &obj), *num_w = numeric(m.weight, n_w, &obj);
    check_gradient(kernel, "dinp (overwritten)", dinp, num_inp, n_inp);
    check_gradient(kernel, "dweight (accumulated)", dweight_inc, num_w, n_w);
    if (with_bias) {
        double *num_b = numeric(m.bias, OC, &obj);
        check_gradient(kernel, "dbias (accumulated)", dbias_inc, num_b, OC);
        free(num_b);
    } else {
        /* dbias NULL: skipped, so the buffer we did not pass stays as it was */
        CHECK("gradcheck matmul dbias NULL is skipped", memcmp(dbias, dbias0, OC * sizeof *dbias) == 0,
              "dbias changed");
        /* dinp NULL is skipped too; dweight accumulates a second time */
        f64_matmul_backward(NULL, dweight, NULL, w, m.inp, m.weight, N, C, OC);
        double *twice = increment(dweight, dweight0, n_w), *num_w2 = xmalloc(n_w * sizeof *num_w2);
        for (size_t i = 0; i < n_w; i++)
            num_w2[i] = 2 * num_w[i];
        check_gradient(kernel, "dweight after a second backward with dinp NULL", twice, num_w2, n_w);
        free(twice);
        free(num_w2);
    }

    /* fp32 against f64 */
    float *inp_f = narrow(m.inp, n_inp), *weight_f = narrow(m.weight, n_w);
    float *bias_f = with_bias ? narrow(m.bias, OC) : NULL, *w_f = narrow(w, n_out);
    float *out_f = xmalloc(n_out * sizeof *out_f), *dinp_f = narrow(dinp, n_inp);
    float *dweight_f = narrow(dweight0, n_w), *dbias_f = narrow(dbias0, OC);
    for (size_t i = 0; i < n_inp; i++)
        dinp_f[i] = (float)OVERWRITE_SENTINEL;
    backend_matmul_forward(out_f, inp_f, weight_f, bias_f, N, C, OC);
    backend_matmul_backward(dinp_f, dweight_f, with_bias ? dbias_f : NULL, w_f, inp_f, weight_f, N, C, OC);
    check_float_f(kernel, "out", out_f, out, n_out);
    check_float_f(kernel, "dinp", dinp_f, dinp, n_inp);
    double *dweight_f_inc = increment_f(dweight_f, dweight0, n_w);
    check_float(kernel, "dweight", dweight_f_inc, dweight_inc, n_w);
    if (with_bias) {
        double *dbias_f_inc = increment_f(dbias_f, dbias0, OC);
        check_float(kernel, "dbias", dbias_f_inc, dbias_inc, OC);
        free(dbias_f_inc);
    }

    free(m.inp), free(m.weight), free(m.bias), free(w), free(dweight0), free(dbias0), free(out);
    free(dinp), free(dweight), free(dbias), free(dweight_inc), free(dbias_inc), free(num_inp), free(num_w);
    free(inp_f), free(weight_f), free(bias_f), free(w_f), free(out_f), free(dinp_f), free(dweight_f);
    free(dbias_f), free(dweight_f_inc);
}

/* ---- matmul_transposed (the tied LM head) -------------------------------- */

struct matmul_t_case {
    int N, C, OC;
    double *inp;    /* (N, C) */
    double *weight; /* (OC, C) */
};

static void matmul_t_objective(void *ctx, double *out)
{
    struct matmul_t_case *m = ctx;
    f64_matmul_forward_transposed(out, m->inp, m->weight, m->N, m->C, m->OC);
}

static void test_matmul_transposed(uint64_t *rng)
{
    const char *kernel = "matmul_transposed";
    const int N = 3, C = 4, OC = 6;
    const size_t n_inp = (size_t)N * C, n_w = (size_t)OC * C, n_out = (size_t)N * OC;
    struct matmul_t_case m = {N, C, OC, random_tensor(n_inp, -1, 1, rng), random_tensor(n_w, -1, 1, rng)};
    double *w = random_tensor(n_out, -1, 1, rng), *dweight0 = random_tensor(n_w, -1, 1, rng);

    double *out = xmalloc(n_out * sizeof *out);
    matmul_t_objective(&m, out);
    double *dinp = filled_tensor(n_inp, OVERWRITE_SENTINEL), *dweight = copy_tensor(dweight0, n_w);
    f64_matmul_backward_transposed(dinp, dweight, w, m.inp, m.weight, N, C, OC);
    double *dweight_inc = increment(dweight, dweight0, n_w);

    struct objective obj = {matmul_t_objective, &m, w, n_out};
    double *num_inp = numeric(m.inp, n_inp, &obj), *num_w = numeric(m.weight, n_w, &obj);
    check_gradient(kernel, "dinp (overwritten)", dinp, num_inp, n_inp);
    check_gradient(kernel, "dweight (accumulated)", dweight_inc, num_w, n_w);

    float *inp_f = narrow(m.inp, n_inp), *weight_f = narrow(m.weight, n_w), *w_f = narrow(w, n_out);
    float *out_f = xmalloc(n_out * sizeof *out_f), *dinp_f = narrow(dinp, n_inp), *dweight_f = narrow(dweight0, n_w);
    for (size_t i = 0; i < n_inp; i++)
        dinp_f[i] = (float)OVERWRITE_SENTINEL;
    backend_matmul_forward_transposed(out_f, inp_f, weight_f, N, C, OC);
    backend_matmul_backward_transposed(dinp_f, dweight_f, w_f, inp_f, weight_f, N, C, OC);
    check_float_f(kernel, "out", out_f, out, n_out);
    check_float_f(kernel, "dinp", dinp_f, dinp, n_inp);
    double *dweight_f_inc = increment_f(dweight_f, dweight0, n_w);
    check_float(kernel, "dweight", dweight_f_inc, dweight_inc, n_w);

    free(m.inp), free(m.weight), free(w), free(dweight0), free(out), free(dinp), free(dweight);
    free(dweight_inc), free(num_inp), free(num_w), free(inp_f), free(weight_f), free(w_f), free(out_f);
    free(dinp_f), free(dweight_f), free(dweight_f_inc);
}

/* ---- layernorm ----------------------------------------------------------- */

struct layernorm_case {
    int N, C;
    double *inp;         /* (N, C) */
    double *weight;      /* (C) */
    double *bias;        /* (C) */
    double *mean, *rstd; /* (N) each, side outputs */
};

static void layernorm_objective(void *ctx, double *out)
{
    struct layernorm_case *l = ctx;
    f64_layernorm_forward(out, l->mean, l->rstd, l->inp, l->weight, l->bias, l->N, l->C);
}

static void test_layernorm(uint64_t *rng)
{
    const char *kernel = "layernorm";
    const int N = 3, C = 6;
    const size_t n_inp = (size_t)N * C;
    /* rows off zero mean and unit scale, so that mean and rstd both matter */
    struct layernorm_case l = {N, C, random_tensor(n_inp, -1.5, 2.5, rng), random_tensor(C, 0.5, 1.5, rng),
                               random_tensor(C, -0.5, 0.5, rng), xmalloc(N * sizeof(double)),
                               xmalloc(N * sizeof(double))};
    double *w = random_tensor(n_inp, -1, 1, rng);
    double *dinp0 = random_tensor(n_inp, -1, 1, rng), *dweight0 = random_tensor(C, -1, 1, rng);
    double *dbias0 = random_tensor(C, -1, 1, rng);

    double *out = xmalloc(n_inp * sizeof *out);
    layernorm_objective(&l, out);
    double *mean = copy_tensor(l.mean, N), *rstd = copy_tensor(l.rstd, N);
    double *dinp = copy_tensor(dinp0, n_inp), *dweight = copy_tensor(dweight0, C), *dbias = copy_tensor(dbias0, C);
    double *scratch = xmalloc(f64_layernorm_scratch(C) * sizeof *scratch);
    f64_layernorm_backward(dinp, dweight, dbias, w, l.inp, l.weight, mean, rstd, scratch, N, C);
    double *dinp_inc = increment(dinp, dinp0, n_inp), *dweight_inc = increment(dweight, dweight0, C);
    double *dbias_inc = increment(dbias, dbias0, C);

    struct objective obj = {layernorm_objective, &l, w, n_inp};
    double *num_inp = numeric(l.inp, n_inp, &obj), *num_w = numeric(l.weight, C, &obj);
    double *num_b = numeric(l.bias, C, &obj);
    check_gradient(kernel, "dinp (accumulated)", dinp_inc, num_inp, n_inp);
    check_gradient(kernel, "dweight (accumulated)", dweight_inc, num_w, C);
    check_gradient(kernel, "dbias (accumulated)", dbias_inc, num_b, C);

    float *inp_f = narrow(l.inp, n_inp), *weight_f = narrow(l.weight, C), *bias_f = narrow(l.bias, C);
    float *w_f = narrow(w, n_inp), *out_f = xmalloc(n_inp * sizeof *out_f);
    float *mean_f = xmalloc(N * sizeof *mean_f), *rstd_f = xmalloc(N * sizeof *rstd_f);
    float *dinp_f = narrow(dinp0, n_inp), *dweight_f = narrow(dweight0, C), *dbias_f = narrow(dbias0, C);
    float *scratch_f = xmalloc(backend_layernorm_scratch(C) * sizeof *scratch_f);
    backend_layernorm_forward(out_f, mean_f, rstd_f, inp_f, weight_f, bias_f, N, C);
    backend_layernorm_backward(dinp_f, dweight_f, dbias_f, w_f, inp_f, weight_f, mean_f, rstd_f, scratch_f, N, C);
    check_float_f(kernel, "out", out_f, out, n_inp);
    check_float_f(kernel, "mean", mean_f, mean, N);
    check_float_f(kernel, "rstd", rstd_f, rstd, N);
    double *dinp_f_inc = increment_f(dinp_f, dinp0, n_inp), *dweight_f_inc = increment_f(dweight_f, dweight0, C);
    double *dbias_f_inc = increment_f(dbias_f, dbias0, C);
    check_float(kernel, "dinp", dinp_f_inc, dinp_inc, n_inp);
    check_float(kernel, "dweight", dweight_f_inc, dweight_inc, C);
    check_float(kernel, "dbias", dbias_f_inc, dbias_inc, C);

    free(l.inp), free(l.weight), free(l.bias), free(l.mean), free(l.rstd), free(w), free(dinp0);
    free(dweight0), free(dbias0), free(out), free(mean), free(rstd), free(dinp), free(dweight), free(dbias);
    free(scratch), free(dinp_inc), free(dweight_inc), free(dbias_inc), free(num_inp), free(num_w), free(num_b);
    free(inp_f), free(weight_f), free(bias_f), free(w_f), free(out_f), free(mean_f), free(rstd_f);
    free(dinp_f), free(dweight_f), free(dbias_f), free(scratch_f), free(dinp_f_inc), free(dweight_f_inc);
    free(dbias_f_inc);
}

/* ---- rmsnorm ------------------------------------------------------------- */

/* Llama's rms_norm_eps, passed to both twins as the same float. */
#define RMSNORM_EPS 1e-5f

struct rmsnorm_case {
    int N, C;
    double *inp;    /* (N, C) */
    double *weight; /* (C) */
    double *rstd;   /* (N), side output */
};

static void rmsnorm_objective(void *ctx, double *out)
{
    struct rmsnorm_case *r = ctx;
    f64_rmsnorm_forward(out, r->rstd, r->inp, r->weight, RMSNORM_EPS, r->N, r->C);
}

static void test_rmsnorm(uint64_t *rng)
{
    const char *kernel = "rmsnorm";
    const int N = 3, C = 6;
    const size_t n_inp = (size_t)N * C;
    /* rows off zero mean: unlike layernorm, RMSNorm must not subtract it */
    struct rmsnorm_case r = {N, C, random_tensor(n_inp, -1.5, 2.5, rng), random_tensor(C, 0.5, 1.5, rng),
                             xmalloc(N * sizeof(double))};
    double *w = random_tensor(n_inp, -1, 1, rng);
    double *dinp0 = random_tensor(n_inp, -1, 1, rng), *dweight0 = random_tensor(C, -1, 1, rng);

    double *out = xmalloc(n_inp * sizeof *out);
    rmsnorm_objective(&r, out);
    double *rstd = copy_tensor(r.rstd, N);
    double *dinp = copy_tensor(dinp0, n_inp), *dweight = copy_tensor(dweight0, C);
    double *scratch = xmalloc(f64_layernorm_scratch(C) * sizeof *scratch);
    f64_rmsnorm_backward(dinp, dweight, w, r.inp, r.weight, rstd, scratch, N, C);
    double *dinp_inc = increment(dinp, dinp0, n_inp), *dweight_inc = increment(dweight, dweight0, C);

    struct objective obj = {rmsnorm_objective, &r, w, n_inp};
    double *num_inp = numeric(r.inp, n_inp, &obj), *num_w = numeric(r.weight, C, &obj);
    check_gradient(kernel, "dinp (accumulated)", dinp_inc, num_inp, n_inp);
    check_gradient(kernel, "dweight (accumulated)", dweight_inc, num_w, C);

    float *inp_f = narrow(r.inp, n_inp), *weight_f = narrow(r.weight, C), *w_f = narrow(w, n_inp);
    float *out_f = xmalloc(n_inp * sizeof *out_f), *rstd_f = xmalloc(N * sizeof *rstd_f);
    float *dinp_f = narrow(dinp0, n_inp), *dweight_f = narrow(dweight0, C);
    float *scratch_f = xmalloc(backend_layernorm_scratch(C) * sizeof *scratch_f);
    backend_rmsnorm_forward(out_f, rstd_f, inp_f, weight_f, RMSNORM_EPS, N, C);
    backend_rmsnorm_backward(dinp_f, dweight_f, w_f, inp_f, weight_f, rstd_f, scratch_f, N, C);
    check_float_f(kernel, "out", out_f, out, n_inp);
    check_float_f(kernel, "rstd", rstd_f, rstd, N);
    double *dinp_f_inc = increment_f(dinp_f, dinp0, n_inp), *dweight_f_inc = increment_f(dweight_f, dweight0, C);
    check_float(kernel, "dinp", dinp_f_inc, dinp_inc, n_inp);
    check_float(kernel, "dweight", dweight_f_inc, dweight_inc, C);

    free(r.inp), free(r.weight), free(r.rstd), free(w), free(dinp0), free(dweight0), free(out), free(rstd);
    free(dinp), free(dweight), free(scratch), free(dinp_inc), free(dweight_inc), free(num_inp), free(num_w);
    free(inp_f), free(weight_f), free(w_f), free(out_f), free(rstd_f), free(dinp_f), free(dweight_f);
    free(scratch_f), free(dinp_f_inc), free(dweight_f_inc);
}

/* ---- gelu ---------------------------------------------------------------- */

struct gelu_case {
    size_t n;
    double *inp; /* (n) */
};

static void gelu_objective(void *ctx, double *out)
{
    struct gelu_case *g = ctx;
    f64_gelu_forward(out, g->inp, g->n);
}

static void test_gelu(uint64_t *rng)
{
    const char *kernel = "gelu";
    const size_t n = 24;
    /* both tails and the curved middle */
    struct gelu_case g = {n, random_tensor(n, -4, 4, rng)};
    double *w = random_tensor(n, -1, 1, rng);

    double *out = xmalloc(n * sizeof *out);
    gelu_objective(&g, out);
    double *dinp = filled_tensor(n, OVERWRITE_SENTINEL);
    f64_gelu_backward(dinp, g.inp, w, n);

    struct objective obj = {gelu_objective, &g, w, n};
    double *num_inp = numeric(g.inp, n, &obj);
    check_gradient(kernel, "dinp (overwritten)", dinp, num_inp, n);

    float *inp_f = narrow(g.inp, n), *w_f = narrow(w, n), *out_f = xmalloc(n * sizeof *out_f);
    float *dinp_f = xmalloc(n * sizeof *dinp_f);
    for (size_t i = 0; i < n; i++)
        dinp_f[i] = (float)OVERWRITE_SENTINEL;
    backend_gelu_forward(out_f, inp_f, n);
    backend_gelu_backward(dinp_f, inp_f, w_f, n);
    check_float_f(kernel, "out", out_f, out, n);
    check_float_f(kernel, "dinp", dinp_f, dinp, n);

    free(g.inp), free(w), free(out), free(dinp), free(num_inp), free(inp_f), free(w_f), free(out_f), free(dinp_f);
}

/* ---- rope ---------------------------------------------------------------- */

struct rope_case {
    int B, T, NH, NKV, hs;
    double *qkv;                         /* (B, T, (NH + 2 NKV) hs), the input */
    const double *cos_table, *sin_table; /* (T, hs / 2) */
    const int32_t *pos;                  /* (B, T) packed rows, or NULL */
};

static void rope_objective(void *ctx, double *out)
{
    struct rope_case *r = ctx;
    memcpy(out, r->qkv, (size_t)r->B * r->T * (r->NH + 2 * r->NKV) * r->hs * sizeof *out);
    f64_rope_forward(out, r->cos_table, r->sin_table, r->pos, r->B, r->T, r->NH, r->NKV, r->hs, r->hs);
}

/* Element c of head `head` of row (b, t) after the rotation, from backend.h's
 * rotate-half convention: for i < hs/2, x[i] cos - x[i + hs/2] sin and
 * x[i + hs/2] cos + x[i] sin, cos and sin read at (position, i); value heads as they were. */
static double rope_reference(const struct rope_case *r, int b, int t, int head, int c)
{
    const int half = r->hs / 2, row = (r->NH + 2 * r->NKV) * r->hs;
    const double *x = r->qkv + ((size_t)b * r->T + t) * row + (size_t)head * r->hs;
    if (head >= r->NH + r->NKV)
        return x[c];
    const int i = c % half;
    const size_t p = (size_t)position_of(r->pos, b, t, r->T);
    const double cs = r->cos_table[p * half + i], sn = r->sin_table[p * half + i];
    return c < half ? x[i] * cs - x[i + half] * sn : x[i + half] * cs + x[i] * sn;
}

/* 1 when the value heads of every row of after equal those of before, bit for bit. */
static int value_heads_equal(const double *after, const double *before, const struct rope_case *r)
{
    const size_t row = (size_t)(r->NH + 2 * r->NKV) * r->hs, values = (size_t)(r->NH + r->NKV) * r->hs;
    int equal = 1;
    for (size_t n = 0; n < (size_t)r->B * r->T; n++)
        equal &= memcmp(after + n * row + values, before + n * row + values, (row - values) * sizeof *after) == 0;
    return equal;
}

/* packed: rows of several samples (packed_positions). */
static void test_rope(int B, int T, int NH, int NKV, int hs, int packed, uint64_t *rng)
{
    char kernel[80], name[160];
    snprintf(kernel, sizeof kernel, "rope B=%d T=%d NH=%d NKV=%d hs=%d%s", B, T, NH, NKV, hs, packed ? " packed" : "");
    int32_t *pos = packed ? packed_positions(B, T) : NULL;
    const int half = hs / 2, heads = NH + 2 * NKV;
    const size_t n_qkv = (size_t)B * T * heads * hs, n_table = (size_t)T * half;
    /* cos and sin of random angles, as the model's tables are of position times
     * frequency: each pair a rotation (up to fp32 rounding, the same in both twins) */
    double *angle = random_tensor(n_table, -M_PI, M_PI, rng);
    double *cos_table = xmalloc(n_table * sizeof *cos_table), *sin_table = xmalloc(n_table * sizeof *sin_table);
    for (size_t i = 0; i < n_table; i++) {
        cos_table[i] = (double)(float)cos(angle[i]);
        sin_table[i] = (double)(float)sin(angle[i]);
    }
    struct rope_case r = {B, T, NH, NKV, hs, random_tensor(n_qkv, -1, 1, rng), cos_table, sin_table, pos};
    double *w = random_tensor(n_qkv, -1, 1, rng);

    double *out = xmalloc(n_qkv * sizeof *out), *ref = xmalloc(n_qkv * sizeof *ref);
    rope_objective(&r, out);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < heads; h++)
                for (int c = 0; c < hs; c++)
                    ref[(((size_t)b * T + t) * heads + h) * hs + c] = rope_reference(&r, b, t, h, c);
    check_err("rotate-half formula", kernel, "out", max_rel_err(out, ref, n_qkv, FLOAT_FLOOR), FORMULA_TOL);
    /* the backward rotates dout in place: the gradient of the input */
    double *dqkv = copy_tensor(w, n_qkv);
    f64_rope_backward(dqkv, cos_table, sin_table, pos, B, T, NH, NKV, hs, hs);

    struct objective obj = {rope_objective, &r, w, n_qkv};
    double *num_qkv = numeric(r.qkv, n_qkv, &obj);
    check_gradient(kernel, "dqkv (in place on dout)", dqkv, num_qkv, n_qkv);

    float *qkv_f = narrow(r.qkv, n_qkv), *dqkv_f = narrow(w, n_qkv);
    float *cos_f = narrow(cos_table, n_table), *sin_f = narrow(sin_table, n_table);
    backend_rope_forward(qkv_f, cos_f, sin_f, pos, B, T, NH, NKV, hs, hs);
    backend_rope_backward(dqkv_f, cos_f, sin_f, pos, B, T, NH, NKV, hs, hs);
    check_float_f(kernel, "out", qkv_f, out, n_qkv);
    check_float_f(kernel, "dqkv", dqkv_f, dqkv, n_qkv);
    double *out_f_wide = increment_f(qkv_f, NULL, n_qkv), *dqkv_f_wide = increment_f(dqkv_f, NULL, n_qkv);
    snprintf(name, sizeof name, "%s value heads untouched by forward and backward (f64 and fp32)", kernel);
    CHECK(name,
          value_heads_equal(out, r.qkv, &r) && value_heads_equal(dqkv, w, &r) &&
              value_heads_equal(out_f_wide, r.qkv, &r) && value_heads_equal(dqkv_f_wide, w, &r),
          "a value head changed");

    free(angle), free(cos_table), free(sin_table), free(r.qkv), free(w), free(out), free(ref), free(dqkv);
    free(num_qkv), free(qkv_f), free(dqkv_f), free(cos_f), free(sin_f), free(out_f_wide), free(dqkv_f_wide), free(pos);
}

/* ---- swiglu -------------------------------------------------------------- */

struct swiglu_case {
    int N, F;
    double *gu; /* (N, 2F): gate, then up */
};

static void swiglu_objective(void *ctx, double *out)
{
    struct swiglu_case *s = ctx;
    f64_swiglu_forward(out, s->gu, s->N, s->F);
}

static void test_swiglu(uint64_t *rng)
{
    const char *kernel = "swiglu";
    const int N = 3, F = 5;
    const size_t n_gu = (size_t)N * 2 * F, n_out = (size_t)N * F;
    /* gates in both tails of the sigmoid and its middle */
    struct swiglu_case s = {N, F, random_tensor(n_gu, -4, 4, rng)};
    double *w = random_tensor(n_out, -1, 1, rng);

    double *out = xmalloc(n_out * sizeof *out);
    swiglu_objective(&s, out);
    double *dgu = filled_tensor(n_gu, OVERWRITE_SENTINEL);
    f64_swiglu_backward(dgu, w, s.gu, N, F);

    struct objective obj = {swiglu_objective, &s, w, n_out};
    double *num_gu = numeric(s.gu, n_gu, &obj);
    check_gradient(kernel, "dgu (overwritten)", dgu, num_gu, n_gu);

    float *gu_f = narrow(s.gu, n_gu), *w_f = narrow(w, n_out), *out_f = xmalloc(n_out * sizeof *out_f);
    float *dgu_f = sentinel_tensor_f(n_gu);
    backend_swiglu_forward(out_f, gu_f, N, F);
    backend_swiglu_backward(dgu_f, w_f, gu_f, N, F);
    check_float_f(kernel, "out", out_f, out, n_out);
    check_float_f(kernel, "dgu", dgu_f, dgu, n_gu);

    free(s.gu), free(w), free(out), free(dgu), free(num_gu), free(gu_f), free(w_f), free(out_f), free(dgu_f);
}

/* ---- attention ----------------------------------------------------------- */

/* Both CPU attention kernels (backend_cpu_attention.h), chosen in the fp32 backend and its f64 twin alike. */
static const char *use_attention(enum cpu_attention kernel)
{
    backend_cpu_attention_use(kernel);
    f64_attention_use(kernel);
    return kernel == CPU_ATTENTION_TILED ? "tiled" : "materialized";
}

struct attention_case {
    int B, T, NH, NKV, hs;
    int gpt2_call;      /* 1: through backend_attention_forward/backward (.., C, NH), which need NKV = NH */
    double *qkv;        /* (B, T, (NH + 2 NKV) hs) */
    double *att;        /* what the forward keeps: tiled the rows' log-sum-exp (B, NH, T), materialized the
                         * probabilities (B, NH, T, T) */
    double *scratch;    /* f64_attention_scratch(T, NH) */
    const int32_t *pos; /* (B, T) packed rows, or NULL */
    const struct attn_opts *opt; /* the variant (window, soft-cap, scale), NULL: plain causal */
};

/* Elements of what the forward keeps (both kernels keep one element type: fp32, or double in the twin). */
static size_t attention_saved_n(int B, int T, int NH) { return f64_attention_saved(B, T, NH) / sizeof(double); }

static void attention_objective(void *ctx, double *out)
{
    struct attention_case *a = ctx;
    if (a->gpt2_call)
        f64_attention_forward(out, a->att, a->qkv, a->scratch, a->pos, a->B, a->T, a->NH * a->hs, a->NH);
    else
        f64_attention_gqa_forward(out, a->att, a->qkv, a->scratch, a->pos, a->B, a->T, a->NH, a->NKV, a->hs, a->opt);
}

/* out: the forward's output (the tiled backward reads it). */
static void attention_backward_f64(double *dqkv, const double *dout, const double *att, const double *out,
                                   const struct attention_case *a)
{
    if (a->gpt2_call)
        f64_attention_backward(dqkv, dout, a->qkv, att, out, a->scratch, a->pos, a->B, a->T, a->NH * a->hs, a->NH);
    else
        f64_attention_gqa_backward(dqkv, dout, a->qkv, att, out, a->scratch, a->pos, a->B, a->T, a->NH, a->NKV,
                                   a->hs, a->opt);
}

/* The fp32 kernel's forward, then its backward with dout into dqkv, through
 * the call a->gpt2_call names. */
static void attention_f32(float *out, float *att, float *dqkv, const float *qkv, const float *dout,
                          const struct attention_case *a)
{
    const int B = a->B, T = a->T, NH = a->NH, NKV = a->NKV, hs = a->hs;
    float *scratch = xmalloc((backend_attention_scratch(T, NH) + 1) * sizeof *scratch);
    if (a->gpt2_call) {
        backend_attention_forward(out, att, qkv, scratch, a->pos, B, T, NH * hs, NH);
        backend_attention_backward(dqkv, dout, qkv, att, out, scratch, a->pos, B, T, NH * hs, NH);
    } else {
        backend_attention_gqa_forward(out, att, qkv, scratch, a->pos, B, T, NH, NKV, hs, a->opt);
        backend_attention_gqa_backward(dqkv, dout, qkv, att, out, scratch, a->pos, B, T, NH, NKV, hs, a->opt);
    }
    free(scratch);
}

/* The first key query i of row b sees (backend.h): its sample's first, or with a window W the key W - 1 before
 * it when that is later. */
static int reference_first_key(const struct attention_case *a, int b, int i)
{
    const int first = i - position_of(a->pos, b, i, a->T), W = a->opt ? a->opt->window : 0;
    return W > 0 && i - W + 1 > first ? i - W + 1 : first;
}

/* out (B, T, NH hs): causal softmax(q k^T / sqrt(hs)) v written out row by
 * row, query head h reading key and value head h / (NH / NKV), query i the
 * keys of its sample from i - pos[i] (backend.h); lse (B, NH, T): each row's
 * log-sum-exp of its scaled scores. With a->opt: the scale it gives, the
 * scores soft-capped (c tanh(s / c)) and the window (reference_first_key). */
static void attention_reference(double *out, double *lse, const struct attention_case *a)
{
    const int T = a->T, NH = a->NH, NKV = a->NKV, hs = a->hs;
    const int row = (NH + 2 * NKV) * hs, group = NH / NKV;
    double *p = xmalloc((size_t)T * sizeof *p);
    for (int b = 0; b < a->B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                const double *q = a->qkv + ((size_t)b * T + i) * row + (size_t)h * hs;
                double mx = -INFINITY, sum = 0.0;
                const int first = reference_first_key(a, b, i);
                const double scale = a->opt && a->opt->scale > 0 ? a->opt->scale : 1.0 / sqrt((double)hs);
                const double cap = a->opt ? a->opt->softcap : 0.0;
                for (int j = first; j <= i; j++) {
                    const double *k = a->qkv + ((size_t)b * T + j) * row + (size_t)(NH + h / group) * hs;
                    p[j] = 0.0;
                    for (int c = 0; c < hs; c++)
                        p[j] += q[c] * k[c];
                    p[j] *= scale;
                    if (cap > 0)
                        p[j] = cap * tanh(p[j] / cap);
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int j = first; j <= i; j++)
                    sum += p[j] = exp(p[j] - mx);
                lse[((size_t)b * NH + h) * T + i] = mx + log(sum);
                double *y = out + ((size_t)b * T + i) * NH * hs + (size_t)h * hs;
                for (int c = 0; c < hs; c++) {
                    y[c] = 0.0;
                    for (int j = first; j <= i; j++) {
                        const double *v = a->qkv + ((size_t)b * T + j) * row + (size_t)(NH + NKV + h / group) * hs;
                        y[c] += p[j] / sum * v[c];
                    }
                }
            }
    free(p);
}

/* What the forward kept, against the formula: tiled, the rows' log-sum-exp; materialized, the probabilities,
 * exactly 0 outside each query's keys (those before its sample or after it). */
static void check_attention_saved(const char *kernel, const double *att, const double *lse,
                                  const struct attention_case *a)
{
    const int B = a->B, T = a->T, NH = a->NH;
    if (backend_cpu_attention_kernel() == CPU_ATTENTION_TILED) {
        check_err("causal attention formula", kernel, "lse", max_rel_err(att, lse, (size_t)B * NH * T, FLOAT_FLOOR),
                  FORMULA_TOL);
        return;
    }
    size_t outside = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++)
                for (int j = 0; j < T; j++)
                    outside += (j < reference_first_key(a, b, i) || j > i) &&
                               att[(((size_t)b * NH + h) * T + i) * T + j] != 0.0;
    char name[320]; /* kernel: a case name of under 200 characters */
    snprintf(name, sizeof name, "gradcheck %s: probabilities outside each query's keys exactly 0", kernel);
    CHECK(name, outside == 0, "%zu nonzero", outside);
}

/* gpt2_call: the GPT-2 calls (NKV = NH), else the grouped-query ones; packed: rows of several samples
 * (packed_positions); the kernel use_attention chose last. */
static void test_attention_opt(int B, int T, int NH, int NKV, int hs, int gpt2_call, int packed,
                               const struct attn_opts *opt, uint64_t *rng)
{
    char kernel[200];
    const char *which = backend_cpu_attention_kernel() == CPU_ATTENTION_TILED ? "tiled" : "materialized";
    if (gpt2_call)
        snprintf(kernel, sizeof kernel, "attention %s B=%d T=%d C=%d NH=%d", which, B, T, NH * hs, NH);
    else
        snprintf(kernel, sizeof kernel, "attention_gqa %s B=%d T=%d NH=%d NKV=%d hs=%d", which, B, T, NH, NKV, hs);
    if (packed)
        strcat(kernel, " packed");
    if (opt)
        snprintf(kernel + strlen(kernel), sizeof kernel - strlen(kernel), " window=%d softcap=%g scale=%g",
                 opt->window, (double)opt->softcap, (double)opt->scale);
    int32_t *pos = packed ? packed_positions(B, T) : NULL;
    const size_t n_qkv = (size_t)B * T * (NH + 2 * NKV) * hs, n_out = (size_t)B * T * NH * hs;
    const size_t n_att = attention_saved_n(B, T, NH);
    /* scores of a few units: softmax rows neither uniform nor one-hot */
    struct attention_case a = {B, T, NH, NKV, hs, gpt2_call, random_tensor(n_qkv, -1.5, 1.5, rng),
                               xmalloc(n_att * sizeof(double)),
                               xmalloc((f64_attention_scratch(T, NH) + 1) * sizeof(double)), pos, opt};
    double *w = random_tensor(n_out, -1, 1, rng);

    double *out = xmalloc(n_out * sizeof *out), *ref = xmalloc(n_out * sizeof *ref);
    double *lse = xmalloc((size_t)B * NH * T * sizeof *lse);
    attention_objective(&a, out);
    attention_reference(ref, lse, &a);
    check_err("causal attention formula", kernel, "out", max_rel_err(out, ref, n_out, FLOAT_FLOOR), FORMULA_TOL);
    double *att = copy_tensor(a.att, n_att);
    check_attention_saved(kernel, att, lse, &a);
    double *dqkv = filled_tensor(n_qkv, OVERWRITE_SENTINEL);
    attention_backward_f64(dqkv, w, att, out, &a);

    struct objective obj = {attention_objective, &a, w, n_out};
    double *num_qkv = numeric(a.qkv, n_qkv, &obj);
    check_gradient(kernel, "dqkv (overwritten)", dqkv, num_qkv, n_qkv);

    float *qkv_f = narrow(a.qkv, n_qkv), *w_f = narrow(w, n_out), *out_f = xmalloc(n_out * sizeof *out_f);
    float *att_f = xmalloc(n_att * sizeof *att_f), *dqkv_f = sentinel_tensor_f(n_qkv);
    attention_f32(out_f, att_f, dqkv_f, qkv_f, w_f, &a);
    check_float_f(kernel, "out", out_f, out, n_out);
    check_float_f(kernel, "att", att_f, att, n_att);
    check_float_f(kernel, "dqkv", dqkv_f, dqkv, n_qkv);

    free(a.qkv), free(a.att), free(a.scratch), free(w), free(out), free(ref), free(lse), free(att), free(dqkv);
    free(num_qkv), free(qkv_f), free(w_f), free(out_f), free(att_f), free(dqkv_f), free(pos);
}

static void test_attention(int B, int T, int NH, int NKV, int hs, int gpt2_call, int packed, uint64_t *rng)
{
    test_attention_opt(B, T, NH, NKV, hs, gpt2_call, packed, NULL, rng);
}

/* The GPT-2 calls are the grouped-query ones with NKV = NH and hs = C / NH,
 * bit for bit (backend.h): the GPT-2 model keeps its results. */
static void test_attention_gpt2_is_gqa(int B, int T, int NH, int hs, int packed, uint64_t *rng)
{
    char name[160];
    snprintf(name, sizeof name, "attention %s B=%d T=%d C=%d NH=%d%s: the GPT-2 calls equal gqa NKV=NH bitwise (fp32)",
             backend_cpu_attention_kernel() == CPU_ATTENTION_TILED ? "tiled" : "materialized", B, T, NH * hs, NH,
             packed ? " packed" : "");
    int32_t *pos = packed ? packed_positions(B, T) : NULL;
    const size_t n_qkv = (size_t)B * T * 3 * NH * hs, n_out = (size_t)B * T * NH * hs;
    const size_t n_att = backend_attention_saved(B, T, NH) / sizeof(float);
    double *qkv = random_tensor(n_qkv, -1.5, 1.5, rng), *w = random_tensor(n_out, -1, 1, rng);
    float *qkv_f = narrow(qkv, n_qkv), *w_f = narrow(w, n_out);
    float *out[2], *att[2], *dqkv[2];
    for (int gpt2_call = 0; gpt2_call < 2; gpt2_call++) {
        struct attention_case a = {B, T, NH, NH, hs, gpt2_call, NULL, NULL, NULL, pos, NULL};
        out[gpt2_call] = xmalloc(n_out * sizeof(float));
        att[gpt2_call] = xmalloc(n_att * sizeof(float));
        dqkv[gpt2_call] = sentinel_tensor_f(n_qkv);
        attention_f32(out[gpt2_call], att[gpt2_call], dqkv[gpt2_call], qkv_f, w_f, &a);
    }
    CHECK(name,
          memcmp(out[0], out[1], n_out * sizeof(float)) == 0 && memcmp(att[0], att[1], n_att * sizeof(float)) == 0 &&
              memcmp(dqkv[0], dqkv[1], n_qkv * sizeof(float)) == 0,
          "out, att or dqkv differ");
    free(qkv), free(w), free(qkv_f), free(w_f), free(pos);
    for (int i = 0; i < 2; i++)
        free(out[i]), free(att[i]), free(dqkv[i]);
}

/* Every attention case with one kernel. Blocks and tiles: the materialized kernel's 64-row blocks, the tiled
 * kernel's tiles of 8 queries x 16 keys in the f64 twin (128 x 512 in fp32). */
static void test_attention_kernel(enum cpu_attention kernel, uint64_t *rng)
{
    use_attention(kernel);
    test_attention(2, 5, 2, 2, 4, 1, 0, rng);  /* T below the row block and the tiles */
    test_attention(2, 70, 2, 2, 4, 1, 0, rng); /* T past 64 rows: a second, partial block; partial tiles */
    test_attention(2, 5, 4, 1, 4, 0, 0, rng);  /* T prime: no head count or block size divides it */
    test_attention(2, 7, 4, 2, 3, 0, 0, rng);
    test_attention(2, 7, 4, 4, 4, 0, 0, rng);
    test_attention(2, 5, 4, 4, 3, 0, 0, rng);
    test_attention_gpt2_is_gqa(2, 7, 4, 3, 0, rng);
    test_attention_gpt2_is_gqa(2, 70, 2, 4, 0, rng);
    /* packed rows (backend.h): samples of 1, 2, 7, 33 and 3 tokens laid end to end, the last cut at T */
    test_attention(2, 13, 2, 2, 4, 1, 1, rng);  /* several samples a row, T below the row block */
    test_attention(2, 70, 2, 2, 4, 1, 1, rng);  /* a sample across the 64-row block border */
    test_attention(2, 13, 4, 2, 3, 0, 1, rng);  /* grouped-query, odd head size */
    test_attention(2, 70, 4, 1, 2, 0, 1, rng);
    test_attention(1, 47, 2, 1, 3, 0, 1, rng); /* a 33-token sample across three 16-key tiles */
    test_attention_gpt2_is_gqa(2, 70, 2, 4, 1, rng);
    /* the variants (backend.h struct attn_opts): a window shorter than T, crossing tiles and row blocks, alone,
     * in packed rows (windows and samples both cutting), grouped-query; soft-cap (d tanh in the backward) and a
     * scale of its own, with and without a window */
    const struct attn_opts window5 = {5, 0.0f, 0.0f}, window20 = {20, 0.0f, 0.0f};
    const struct attn_opts capped = {0, 1.5f, 0.45f}, all = {7, 2.0f, 0.3f};
    test_attention_opt(2, 13, 4, 2, 3, 0, 0, &window5, rng);
    test_attention_opt(2, 70, 4, 1, 2, 0, 0, &window20, rng);
    test_attention_opt(1, 47, 2, 1, 3, 0, 1, &window5, rng);
    test_attention_opt(2, 70, 4, 2, 2, 0, 1, &window20, rng);
    test_attention_opt(2, 13, 4, 2, 3, 0, 0, &capped, rng);
    test_attention_opt(2, 70, 2, 1, 3, 0, 1, &all, rng);
}

/* ---- embedding ----------------------------------------------------------- */

struct embedding_case {
    int B, T, C;
    const int32_t *tokens; /* (B, T) */
    double *wte;           /* (VOCAB, C) */
    double *wpe;           /* (MAX_T, C), or NULL: no positions (Llama) */
    const int32_t *pos;    /* (B, T) packed rows, or NULL */
};

static void embedding_objective(void *ctx, double *out)
{
    struct embedding_case *e = ctx;
    f64_embedding_forward(out, e->tokens, e->wte, e->wpe, e->pos, e->B, e->T, e->C);
}

/* 1 when every row of out (B T, C) is bitwise the row of wte its token names. */
static int rows_are_token_rows(const double *out, const double *wte, const int32_t *tokens, size_t rows, int C)
{
    int equal = 1;
    for (size_t n = 0; n < rows; n++)
        equal &= memcmp(out + n * C, wte + (size_t)tokens[n] * C, (size_t)C * sizeof *out) == 0;
    return equal;
}

/* with_positions 0: wpe and dwpe NULL, as the Llama model calls it; packed: rows of several samples, whose
 * positions repeat within a row (with or without the table: Llama's packed rows). */
static void test_embedding(int with_positions, int packed, uint64_t *rng)
{
    char kernel[64], name[160];
    snprintf(kernel, sizeof kernel, "embedding%s%s", with_positions ? "" : " without positions",
             packed ? " packed" : "");
    /* C = 5 does not split evenly over the threads' column ranges; tokens 3
     * and 0 repeat (within and across sequences), 2, 4 and 5 never occur, and
     * wpe has rows past the last position: their gradients must stay exactly
     * as they were. Packed: samples of 2, 1, 2 and 3, 2 tokens. */
    enum { B = 2, T = 5, C = 5, VOCAB = 7, MAX_T = 7 };
    static const int32_t tokens[B * T] = {3, 1, 3, 3, 0, 1, 6, 3, 0, 0};
    static const int32_t packed_pos[B * T] = {0, 1, 0, 0, 1, 0, 1, 2, 0, 1};
    const int32_t *pos = packed ? packed_pos : NULL;
    const int positions = packed ? 3 : T; /* rows of wpe that receive a gradient */
    const size_t n_wte = (size_t)VOCAB * C, n_wpe = (size_t)MAX_T * C, n_out = (size_t)B * T * C;
    struct embedding_case e = {B, T, C, tokens, random_tensor(n_wte, -1, 1, rng),
                               with_positions ? random_tensor(n_wpe, -1, 1, rng) : NULL, pos};
    double *w = random_tensor(n_out, -1, 1, rng);
    double *dwte0 = random_tensor(n_wte, -1, 1, rng), *dwpe0 = random_tensor(n_wpe, -1, 1, rng);

    double *out = xmalloc(n_out * sizeof *out);
    embedding_objective(&e, out);
    double *dwte = copy_tensor(dwte0, n_wte), *dwpe = copy_tensor(dwpe0, n_wpe);
    f64_embedding_backward(dwte, with_positions ? dwpe : NULL, w, tokens, pos, B, T, C);
    double *dwte_inc = increment(dwte, dwte0, n_wte), *dwpe_inc = increment(dwpe, dwpe0, n_wpe);

    struct objective obj = {embedding_objective, &e, w, n_out};
    double *num_wte = numeric(e.wte, n_wte, &obj);
    check_gradient(kernel, "dwte (accumulated, repeated tokens)", dwte_inc, num_wte, n_wte);
    static const int absent_tokens[] = {2, 4, 5};
    int untouched = 1;
    for (int c = 0; c < C; c++)
        for (size_t a = 0; a < sizeof absent_tokens / sizeof *absent_tokens; a++)
            untouched &= dwte[(size_t)absent_tokens[a] * C + c] == dwte0[(size_t)absent_tokens[a] * C + c];
    if (with_positions) {
        double *num_wpe = numeric(e.wpe, n_wpe, &obj);
        check_gradient(kernel, "dwpe (accumulated)", dwpe_inc, num_wpe, n_wpe);
        free(num_wpe);
        for (int c = 0; c < C; c++)
            for (int t = positions; t < MAX_T; t++)
                untouched &= dwpe[(size_t)t * C + c] == dwpe0[(size_t)t * C + c];
        snprintf(name, sizeof name, "gradcheck %s rows of absent tokens and positions untouched", kernel);
        CHECK(name, untouched, "a row changed");
    } else {
        snprintf(name, sizeof name, "gradcheck %s rows of absent tokens untouched", kernel);
        CHECK(name, untouched, "a row changed");
        /* nothing added to the token rows, and the token gradient is the one
         * a backward with positions leaves, to the bit */
        double *dwte_with = copy_tensor(dwte0, n_wte);
        f64_embedding_backward(dwte_with, dwpe, w, tokens, pos, B, T, C);
        snprintf(name, sizeof name, "gradcheck %s: out = wte[tokens], dwte = dwte with positions (bitwise)", kernel);
        CHECK(name,
              rows_are_token_rows(out, e.wte, tokens, (size_t)B * T, C) &&
                  memcmp(dwte, dwte_with, n_wte * sizeof *dwte) == 0,
              "out or dwte differ");
        free(dwte_with);
    }

    float *wte_f = narrow(e.wte, n_wte), *wpe_f = with_positions ? narrow(e.wpe, n_wpe) : NULL, *w_f = narrow(w, n_out);
    float *out_f = xmalloc(n_out * sizeof *out_f), *dwte_f = narrow(dwte0, n_wte), *dwpe_f = narrow(dwpe0, n_wpe);
    backend_embedding_forward(out_f, tokens, wte_f, wpe_f, pos, B, T, C);
    backend_embedding_backward(dwte_f, with_positions ? dwpe_f : NULL, w_f, tokens, pos, B, T, C);
    check_float_f(kernel, "out", out_f, out, n_out);
    double *dwte_f_inc = increment_f(dwte_f, dwte0, n_wte), *dwpe_f_inc = increment_f(dwpe_f, dwpe0, n_wpe);
    check_float(kernel, "dwte", dwte_f_inc, dwte_inc, n_wte);
    if (with_positions) {
        check_float(kernel, "dwpe", dwpe_f_inc, dwpe_inc, n_wpe);
    } else {
        double *out_f_wide = increment_f(out_f, NULL, n_out);
        snprintf(name, sizeof name, "fp32 %s: out = wte[tokens] (bitwise)", kernel);
        CHECK(name, rows_are_token_rows(out_f_wide, e.wte, tokens, (size_t)B * T, C), "a row differs");
        free(out_f_wide);
    }

    free(e.wte), free(e.wpe), free(w), free(dwte0), free(dwpe0), free(out), free(dwte), free(dwpe);
    free(dwte_inc), free(dwpe_inc), free(num_wte), free(wte_f), free(wpe_f), free(w_f);
    free(out_f), free(dwte_f), free(dwpe_f), free(dwte_f_inc), free(dwpe_f_inc);
}

/* ---- crossentropy -------------------------------------------------------- */

struct crossentropy_case {
    int N, V, Vp;
    const int32_t *targets; /* (N) */
    double *logits;         /* (N, Vp), the input */
    double *work;           /* (N, Vp), the forward overwrites its logits with probabilities */
};

static void crossentropy_objective(void *ctx, double *losses)
{
    struct crossentropy_case *x = ctx;
    memcpy(x->work, x->logits, (size_t)x->N * x->Vp * sizeof *x->work);
    f64_crossentropy_forward(losses, x->work, x->targets, x->N, x->V, x->Vp);
}

/* ignored: rows 1 and 3 have targets < 0 (not trained): loss 0, whole dlogits row 0. */
static void test_crossentropy(int ignored, uint64_t *rng)
{
    const char *kernel = ignored ? "crossentropy ignored targets" : "crossentropy";
    char name[160];
    enum { N = 4, V = 5, Vp = 8 };
    static const int32_t all_targets[N] = {2, 0, 4, 2}, some_targets[N] = {2, -1, 4, -100};
    const int32_t *targets = ignored ? some_targets : all_targets;
    const size_t n_logits = (size_t)N * Vp;
    struct crossentropy_case x = {N, V, Vp, targets, random_tensor(n_logits, -3, 3, rng),
                                  xmalloc(n_logits * sizeof(double))};
    /* Padded logits far above the real ones: a forward that let them into the
     * softmax would change the loss and its gradient completely. */
    for (int i = 0; i < N; i++)
        for (int j = V; j < Vp; j++)
            x.logits[(size_t)i * Vp + j] = 50.0 + j;
    const double dloss = 0.375; /* the backward takes one dloss for all rows: L = dloss * sum(losses) */
    double w[N];
    for (int i = 0; i < N; i++)
        w[i] = dloss;

    double losses[N];
    crossentropy_objective(&x, losses);
    double *probs = copy_tensor(x.work, n_logits);
    double *dlogits = copy_tensor(probs, n_logits);
    f64_crossentropy_backward(dlogits, targets, dloss, N, V, Vp);

    struct objective obj = {crossentropy_objective, &x, w, N};
    double *num_logits = numeric(x.logits, n_logits, &obj);
    check_gradient(kernel, "dlogits (replaces probs)", dlogits, num_logits, n_logits);
    int padded_zero = 1;
    for (int i = 0; i < N; i++)
        for (int j = V; j < Vp; j++) {
            size_t k = (size_t)i * Vp + j;
            padded_zero &= probs[k] == 0.0 && dlogits[k] == 0.0 && num_logits[k] == 0.0;
        }
    snprintf(name, sizeof name, "gradcheck %s padded columns: zero probability and zero gradient", kernel);
    CHECK(name, padded_zero, "a padded column is non-zero");

    float *logits_f = narrow(x.logits, n_logits), losses_f[N];
    backend_crossentropy_forward(losses_f, logits_f, targets, N, V, Vp);
    check_float_f(kernel, "losses", losses_f, losses, N);
    check_float_f(kernel, "probs", logits_f, probs, n_logits);
    backend_crossentropy_backward(logits_f, targets, (float)dloss, N, V, Vp);
    check_float_f(kernel, "dlogits", logits_f, dlogits, n_logits);
    if (ignored) { /* the ignored rows exactly: loss 0 and the whole row 0, f64 and fp32 */
        int zero = 1;
        for (int i = 0; i < N; i++) {
            if (targets[i] >= 0)
                continue;
            zero &= losses[i] == 0.0 && losses_f[i] == 0.0f;
            for (int j = 0; j < Vp; j++)
                zero &= dlogits[(size_t)i * Vp + j] == 0.0 && logits_f[(size_t)i * Vp + j] == 0.0f;
        }
        snprintf(name, sizeof name, "gradcheck %s: loss 0 and dlogits row 0 where the target is < 0", kernel);
        CHECK(name, zero, "an ignored row has a loss or a gradient");
    }

    free(x.logits), free(x.work), free(probs), free(dlogits), free(num_logits), free(logits_f);
}

/* ---- add ----------------------------------------------------------------- */

struct add_case {
    size_t n;
    double *a, *b; /* (n) each */
};

static void add_objective(void *ctx, double *out)
{
    struct add_case *s = ctx;
    f64_add(out, s->a, s->b, s->n);
}

/* add has no backward kernel: the model passes dout on to both inputs, which
 * is right only when d(a + b)/da = d(a + b)/db = identity; that is what is checked. */
static void test_add(uint64_t *rng)
{
    const char *kernel = "add";
    const size_t n = 17;
    struct add_case s = {n, random_tensor(n, -1, 1, rng), random_tensor(n, -1, 1, rng)};
    double *w = random_tensor(n, -1, 1, rng), *out = xmalloc(n * sizeof *out);
    add_objective(&s, out);

    struct objective obj = {add_objective, &s, w, n};
    double *num_a = numeric(s.a, n, &obj), *num_b = numeric(s.b, n, &obj);
    check_gradient(kernel, "da = dout", w, num_a, n);
    check_gradient(kernel, "db = dout", w, num_b, n);

    float *a_f = narrow(s.a, n), *b_f = narrow(s.b, n), *out_f = xmalloc(n * sizeof *out_f);
    backend_add(out_f, a_f, b_f, n);
    check_float_f(kernel, "out", out_f, out, n);

    free(s.a), free(s.b), free(w), free(out), free(num_a), free(num_b), free(a_f), free(b_f), free(out_f);
}

/* ---- LoRA ---------------------------------------------------------------- */

/* The k layers of a group are slices of one fused output, rows of LORA_LD:
 * layer j's columns [at_j, at_j + OC_j); the columns outside every slice stay. */
enum { LORA_LD = 11, LORA_MAX = 3 };

struct lora_case {
    int N, C, r, k;
    int OC[LORA_MAX], at[LORA_MAX];
    double *x, *A, *B[LORA_MAX];   /* (N, C), (k r, C): A_0 .. A_{k-1} stacked, (OC_j, r) */
    const double *y0;              /* (N, LORA_LD): what the layers' own matmul left in y */
    double *t, *scratch;           /* (N, k r), (N, C): side output, work space */
    double scale;
    const struct lora_dropout *d;  /* NULL: no dropout */
};

/* The group's lora_out (f64) on y (rows of LORA_LD; the gradient dy in the backward), dB NULL: none. */
static void lora_outs_f64(const struct lora_case *l, double *y, double *const *dB, struct lora_out_f64 *out)
{
    for (int j = 0; j < l->k; j++)
        out[j] = (struct lora_out_f64){y + l->at[j], l->B[j], dB ? dB[j] : NULL, l->OC[j]};
}

static void lora_objective(void *ctx, double *out)
{
    struct lora_case *l = ctx;
    struct lora_out_f64 o[LORA_MAX];
    memcpy(out, l->y0, (size_t)l->N * LORA_LD * sizeof *out);
    lora_outs_f64(l, out, NULL, o);
    f64_lora_forward(l->t, l->scratch, l->x, l->A, o, l->k, LORA_LD, l->scale, l->d, l->N, l->C, l->r);
}

/* 1 when the columns of rows of LORA_LD outside every layer's slice are bitwise as in y0. */
static int lora_other_columns_kept(const struct lora_case *l, const double *y, const double *y0)
{
    int kept = 1;
    for (size_t i = 0; i < (size_t)l->N * LORA_LD; i++) {
        const int c = (int)(i % LORA_LD);
        int inside = 0;
        for (int j = 0; j < l->k; j++)
            inside |= c >= l->at[j] && c < l->at[j] + l->OC[j];
        if (!inside)
            kept &= memcmp(&y[i], &y0[i], sizeof *y) == 0;
    }
    return kept;
}

/* drop(x)[n, c] of backend.h: x scaled by the CPU's 1 / (1 - p) (a float) where the mask keeps it, else 0. */
static double lora_dropped(const struct lora_dropout *d, const double *x, int n, int c, int C)
{
    if (!d || d->p <= 0.0f)
        return x[(size_t)n * C + c];
    return lora_dropout_keeps(d, (size_t)n, c) ? x[(size_t)n * C + c] * (double)(1.0f / (1.0f - d->p)) : 0.0;
}

/* k layers (a group that reads one x: OC and column offsets in oc, at) of rank r; p 0: no dropout (d NULL);
 * p > 0 (k = 1): a mask with T tokens a row from row row0, which drops some of x and keeps some. */
static void test_lora(int k, const int *oc, const int *at, float p, uint64_t *rng)
{
    char kernel[48], name[160], tensor[48];
    if (k == 1)
        snprintf(kernel, sizeof kernel, "lora p=%.2f", p);
    else
        snprintf(kernel, sizeof kernel, "lora k=%d p=%.2f", k, p);
    const int N = 6, C = 5, r = 3, kr = k * r;
    const size_t n_x = (size_t)N * C, n_A = (size_t)kr * C, n_t = (size_t)N * kr, n_out = (size_t)N * LORA_LD;
    size_t n_B[LORA_MAX];
    const struct lora_dropout drop = {p, 0x9E3779B97F4A7C15ull, 7, 3};
    double *y0 = random_tensor(n_out, -1, 1, rng);
    struct lora_case l = {N, C, r, k, {0}, {0}, random_tensor(n_x, -1, 1, rng), random_tensor(n_A, -1, 1, rng),
                          {NULL}, y0, xmalloc(n_t * sizeof(double)), filled_tensor(n_x, OVERWRITE_SENTINEL), 1.75,
                          p > 0 ? &drop : NULL};
    for (int j = 0; j < k; j++) {
        l.OC[j] = oc[j], l.at[j] = at[j], n_B[j] = (size_t)oc[j] * r;
        l.B[j] = random_tensor(n_B[j], -1, 1, rng);
    }
    /* dy = w, random in the other columns too: a backward that read them would be off */
    double *w = random_tensor(n_out, -1, 1, rng);
    double *dx0 = random_tensor(n_x, -1, 1, rng), *dA0 = random_tensor(n_A, -1, 1, rng), *dB0[LORA_MAX];
    for (int j = 0; j < k; j++)
        dB0[j] = random_tensor(n_B[j], -1, 1, rng);
    if (p > 0) {
        size_t dropped = 0;
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++)
                dropped += !lora_dropout_keeps(&drop, (size_t)n, c);
        snprintf(name, sizeof name, "gradcheck %s: the mask drops some of x and keeps some", kernel);
        CHECK(name, dropped > 0 && dropped < n_x, "%zu of %zu dropped", dropped, n_x);
    }

    double *out = xmalloc(n_out * sizeof *out);
    lora_objective(&l, out);
    double *t = copy_tensor(l.t, n_t);
    /* the forward against backend.h's formula written out (t: layer j's r columns at j r of rows of k r, from the
     * j-th of the stacked A), and the other columns untouched */
    double *ref = copy_tensor(y0, n_out), *t_ref = xmalloc(n_t * sizeof *t_ref);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < kr; i++) {
            double sum = 0.0;
            for (int c = 0; c < C; c++)
                sum += lora_dropped(l.d, l.x, n, c, C) * l.A[(size_t)i * C + c];
            t_ref[(size_t)n * kr + i] = sum;
        }
    for (int j = 0; j < k; j++)
        for (int n = 0; n < N; n++)
            for (int o = 0; o < l.OC[j]; o++) {
                double sum = 0.0;
                for (int i = 0; i < r; i++)
                    sum += t_ref[(size_t)n * kr + (size_t)j * r + i] * l.B[j][(size_t)o * r + i];
                ref[(size_t)n * LORA_LD + l.at[j] + o] += l.scale * sum;
            }
    check_err("LoRA formula", kernel, "out", max_rel_err(out, ref, n_out, FLOAT_FLOOR), FORMULA_TOL);
    check_err("LoRA formula", kernel, "t", max_rel_err(t, t_ref, n_t, FLOAT_FLOOR), FORMULA_TOL);
    snprintf(name, sizeof name, "gradcheck %s: the columns outside the slices untouched (f64)", kernel);
    CHECK(name, lora_other_columns_kept(&l, out, y0), "a column outside the slices changed");

    double *dx = copy_tensor(dx0, n_x), *dA = copy_tensor(dA0, n_A), *dB[LORA_MAX], *dB_inc[LORA_MAX];
    for (int j = 0; j < k; j++)
        dB[j] = copy_tensor(dB0[j], n_B[j]);
    double *dt = filled_tensor(n_t, OVERWRITE_SENTINEL), *scratch = filled_tensor(n_x, OVERWRITE_SENTINEL);
    struct lora_out_f64 o[LORA_MAX];
    lora_outs_f64(&l, w, dB, o);
    f64_lora_backward(dx, dA, dt, scratch, l.x, t, l.A, o, k, LORA_LD, l.scale, l.d, N, C, r);
    double *dx_inc = increment(dx, dx0, n_x), *dA_inc = increment(dA, dA0, n_A);
    for (int j = 0; j < k; j++)
        dB_inc[j] = increment(dB[j], dB0[j], n_B[j]);
    /* dt_j = scale dy_j @ B_j, overwritten, at j r of rows of k r */
    double *dt_ref = xmalloc(n_t * sizeof *dt_ref);
    for (int j = 0; j < k; j++)
        for (int n = 0; n < N; n++)
            for (int i = 0; i < r; i++) {
                double sum = 0.0;
                for (int oo = 0; oo < l.OC[j]; oo++)
                    sum += w[(size_t)n * LORA_LD + l.at[j] + oo] * l.B[j][(size_t)oo * r + i];
                dt_ref[(size_t)n * kr + (size_t)j * r + i] = l.scale * sum;
            }
    check_err("LoRA formula", kernel, "dt (overwritten)", max_rel_err(dt, dt_ref, n_t, FLOAT_FLOOR), FORMULA_TOL);

    struct objective obj = {lora_objective, &l, w, n_out};
    double *num_x = numeric(l.x, n_x, &obj), *num_A = numeric(l.A, n_A, &obj);
    check_gradient(kernel, "dx (accumulated)", dx_inc, num_x, n_x);
    check_gradient(kernel, k == 1 ? "dA (accumulated)" : "dA stacked (accumulated)", dA_inc, num_A, n_A);
    for (int j = 0; j < k; j++) {
        double *num_B = numeric(l.B[j], n_B[j], &obj);
        if (k == 1)
            snprintf(tensor, sizeof tensor, "dB (accumulated)");
        else
            snprintf(tensor, sizeof tensor, "dB_%d (accumulated)", j);
        check_gradient(kernel, tensor, dB_inc[j], num_B, n_B[j]);
        free(num_B);
    }

    /* frozen adapters (dA and every dB NULL): dx only, the same bits */
    double *dx_frozen = copy_tensor(dx0, n_x), *dt_frozen = filled_tensor(n_t, OVERWRITE_SENTINEL);
    lora_outs_f64(&l, w, NULL, o);
    f64_lora_backward(dx_frozen, NULL, dt_frozen, scratch, l.x, t, l.A, o, k, LORA_LD, l.scale, l.d, N, C, r);
    snprintf(name, sizeof name, "gradcheck %s: dA and dB NULL give the same dx (bitwise)", kernel);
    CHECK(name, memcmp(dx_frozen, dx, n_x * sizeof *dx) == 0, "dx differs");

    /* fp32 against f64 */
    float *x_f = narrow(l.x, n_x), *A_f = narrow(l.A, n_A), *w_f = narrow(w, n_out), *B_f[LORA_MAX], *dB_f[LORA_MAX];
    float *y_f = narrow(y0, n_out), *t_f = sentinel_tensor_f(n_t), *scratch_f = sentinel_tensor_f(n_x);
    float *dx_f = narrow(dx0, n_x), *dA_f = narrow(dA0, n_A), *dt_f = sentinel_tensor_f(n_t);
    struct lora_out o_f[LORA_MAX];
    for (int j = 0; j < k; j++) {
        B_f[j] = narrow(l.B[j], n_B[j]), dB_f[j] = narrow(dB0[j], n_B[j]);
        o_f[j] = (struct lora_out){y_f + l.at[j], B_f[j], NULL, l.OC[j]};
    }
    backend_lora_forward(t_f, scratch_f, x_f, A_f, o_f, k, LORA_LD, (float)l.scale, l.d, N, C, r);
    for (int j = 0; j < k; j++)
        o_f[j] = (struct lora_out){w_f + l.at[j], B_f[j], dB_f[j], l.OC[j]};
    backend_lora_backward(dx_f, dA_f, dt_f, scratch_f, x_f, t_f, A_f, o_f, k, LORA_LD, (float)l.scale, l.d, N, C, r);
    check_float_f(kernel, "y", y_f, out, n_out);
    double *y_f_wide = increment_f(y_f, NULL, n_out);
    snprintf(name, sizeof name, "fp32 %s: the columns outside the slices untouched", kernel);
    CHECK(name, lora_other_columns_kept(&l, y_f_wide, y0), "a column outside the slices changed");
    check_float_f(kernel, "t", t_f, t, n_t);
    check_float_f(kernel, "dt", dt_f, dt, n_t);
    double *dx_f_inc = increment_f(dx_f, dx0, n_x), *dA_f_inc = increment_f(dA_f, dA0, n_A);
    check_float(kernel, "dx", dx_f_inc, dx_inc, n_x);
    check_float(kernel, "dA", dA_f_inc, dA_inc, n_A);
    for (int j = 0; j < k; j++) {
        double *dB_f_inc = increment_f(dB_f[j], dB0[j], n_B[j]);
        if (k == 1)
            snprintf(tensor, sizeof tensor, "dB");
        else
            snprintf(tensor, sizeof tensor, "dB_%d", j);
        check_float(kernel, tensor, dB_f_inc, dB_inc[j], n_B[j]);
        free(dB_f_inc);
    }

    for (int j = 0; j < k; j++) {
        free(l.B[j]), free(dB0[j]), free(dB[j]), free(dB_inc[j]), free(B_f[j]), free(dB_f[j]);
    }
    free(y0), free(l.x), free(l.A), free(l.t), free(l.scratch), free(w), free(dx0), free(dA0);
    free(out), free(t), free(ref), free(t_ref), free(dx), free(dA), free(dt), free(scratch), free(dx_inc);
    free(dA_inc), free(dt_ref), free(num_x), free(num_A), free(dx_frozen), free(dt_frozen), free(x_f), free(A_f);
    free(w_f), free(y_f), free(t_f), free(scratch_f), free(dx_f), free(dA_f), free(dt_f), free(y_f_wide);
    free(dx_f_inc), free(dA_f_inc);
}

int main(void)
{
    uint64_t rng = 0x5eed0fc0ffee1234ull;
    test_matmul(1, &rng);
    test_matmul(0, &rng);
    test_matmul_transposed(&rng);
    test_layernorm(&rng);
    test_gelu(&rng);
    test_attention_kernel(CPU_ATTENTION_TILED, &rng);
    test_attention_kernel(CPU_ATTENTION_MATERIALIZED, &rng);
    use_attention(CPU_ATTENTION_TILED);
    test_embedding(1, 0, &rng);
    test_crossentropy(0, &rng);
    test_add(&rng);
    /* the Llama kernels */
    test_rmsnorm(&rng);
    test_rope(2, 3, 4, 2, 8, 0, &rng); /* NKV < NH */
    test_rope(2, 3, 4, 1, 2, 0, &rng);
    test_rope(2, 3, 3, 3, 8, 0, &rng); /* NKV = NH */
    test_rope(2, 3, 2, 2, 2, 0, &rng);
    test_swiglu(&rng);
    test_embedding(0, 0, &rng);
    /* packed rows (backend.h): samples of 1, 2, 7, 33 and 3 tokens laid end to end, the last cut at T */
    test_rope(2, 13, 4, 2, 8, 1, &rng);
    test_rope(2, 13, 3, 3, 2, 1, &rng);
    test_embedding(1, 1, &rng);
    test_embedding(0, 1, &rng);
    test_crossentropy(1, &rng);
    /* LoRA: a slice of a wider output, without dropout and with p = 0.25 (a fixed mask); a group of three layers
     * of different widths (q|k|v-like) side by side in one fused output, columns 0 and 10 outside them */
    const int lora_oc[] = {4}, lora_at[] = {3}, group_oc[] = {4, 2, 3}, group_at[] = {1, 5, 7};
    test_lora(1, lora_oc, lora_at, 0.0f, &rng);
    test_lora(1, lora_oc, lora_at, 0.25f, &rng);
    test_lora(3, group_oc, group_at, 0.0f, &rng);
    printf("# worst gradcheck error %.2e (tol %.0e), worst fp32-vs-f64 error %.2e (tol %.0e)\n",
           g_worst_grad_err, GRAD_TOL, g_worst_float_err, FLOAT_TOL);
    return check_status();
}
