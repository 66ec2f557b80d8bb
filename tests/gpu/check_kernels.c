/*
 * check_kernels — every CUDA backend kernel against the CPU backend on fresh
 * random inputs (tests/gpu/session.sh stage 2; needs a GPU).
 *
 * The CPU backend is linked beside the CUDA one with its functions renamed
 * cpu_* (tests/gpu/cpu_names.h). Each check copies the same inputs to both,
 * fills the CUDA outputs with NaN first (so an element a kernel forgets to
 * write fails the check), gives accumulated outputs (+=) the same random
 * start on both sides, and compares: max |gpu - cpu| <= tol * max |cpu|, with
 * tol 1e-5 in fp32 (TF32 off). Casts must equal dtype.h's to the bit, and
 * the kernels that the engine runs on pinned host memory (mapped) are run on
 * it here. Prints "ok NAME" / "FAIL NAME: why".
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/adamw.h"
#include "backend/backend.h"
#include "backend/cpu/backend_cpu_attention.h"
#include "cpu_names_decl.h"
#include "core/dtype.h"
#include "core/quant4.h"

#define TOL 1e-5
/* The rows' log-sum-exp, fp32 on both sides from the same (rounded) inputs in every activation dtype: the
 * scores' sums in other orders, about 1e-7 relative. */
#define LSE_TOL 1e-5

static int g_failed, g_passed;

/* A CUDA error (a kernel that faulted shows at the next synchronisation)
 * ends the run naming the check: the later checks would fail for it too. */
static void cuda_ok(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return;
    printf("FAIL %s: CUDA error %s\n", what, cudaGetErrorString(e));
    printf("%d passed, %d failed\n", g_passed, g_failed + 1);
    exit(1);
}
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static float uniform(void)
{
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
}

static float *host_random(size_t n, float scale)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = uniform() * scale;
    return x;
}

static void *to_device(const void *host, size_t bytes)
{
    void *d = NULL;
    cuda_ok(cudaMalloc(&d, bytes ? bytes : 1), "cudaMalloc");
    cuda_ok(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
    /* the backend's stream does not wait for the default stream: finish the copy first */
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize after a copy");
    return d;
}

/* A device buffer of n floats filled with NaN (all bits set). */
static float *poisoned(size_t n)
{
    float *d = NULL;
    cuda_ok(cudaMalloc((void **)&d, n * sizeof *d), "cudaMalloc");
    cuda_ok(cudaMemset(d, 0xFF, n * sizeof *d), "cudaMemset");
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize after poisoning"); /* before the backend's stream writes it */
    return d;
}

static void compare(const char *name, const float *want, const float *device, size_t n, double tol)
{
    float *got = malloc(n * sizeof *got);
    cuda_ok(cudaDeviceSynchronize(), name);
    cuda_ok(cudaMemcpy(got, device, n * sizeof *got, cudaMemcpyDeviceToHost), name);
    double worst = 0.0, scale = 0.0;
    size_t bad_at = n;
    for (size_t i = 0; i < n; i++) {
        scale = fmax(scale, fabs(want[i]));
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= worst)) { /* also catches NaN */
            worst = isnan(d) ? INFINITY : d;
            bad_at = i;
        }
    }
    double rel = worst / (scale > 0 ? scale : 1e-30);
    if (rel <= tol) {
        printf("ok %s\n", name);
        g_passed++;
    } else {
        printf("FAIL %s: max error %.3g relative to max |ref| %.3g (tol %g), worst at %zu: got %g want %g\n", name,
               rel, scale, tol, bad_at, bad_at < n ? got[bad_at] : 0.0, bad_at < n ? want[bad_at] : 0.0);
        g_failed++;
    }
    free(got);
}

static void check_value(const char *name, int ok, const char *why)
{
    printf(ok ? "ok %s\n" : "FAIL %s: %s\n", name, why);
    ok ? g_passed++ : g_failed++;
}

/* ---- [A] tensors (backend.h): the activation dtype under test ---------------------------------- */

static enum dtype g_act = DTYPE_F32;
static const char *g_tag = "";
static double g_tol = TOL;

static size_t act_bytes(size_t n) { return n * (size_t)dtype_size(g_act); }

/* Rounds host values to the activation dtype in place: both sides then see the same inputs. */
static float *act_round(float *x, size_t n)
{
    void *tmp = malloc(act_bytes(n));
    dtype_convert(tmp, g_act, x, DTYPE_F32, n);
    dtype_convert(x, DTYPE_F32, tmp, g_act, n);
    free(tmp);
    return x;
}

static float *act_to_device(const float *host, size_t n)
{
    void *tmp = malloc(act_bytes(n));
    dtype_convert(tmp, g_act, host, DTYPE_F32, n);
    float *d = to_device(tmp, act_bytes(n));
    free(tmp);
    return d;
}

/* NaN in every dtype: all bits set. */
static float *act_poisoned(size_t n)
{
    float *d = NULL;
    cuda_ok(cudaMalloc((void **)&d, act_bytes(n)), "cudaMalloc");
    cuda_ok(cudaMemset(d, 0xFF, act_bytes(n)), "cudaMemset");
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize after poisoning");
    return d;
}

static void compare_act(const char *name, const float *want, const float *device, size_t n, double tol)
{
    void *tmp = malloc(act_bytes(n));
    float *wide = malloc(n * sizeof *wide);
    cuda_ok(cudaDeviceSynchronize(), name);
    cuda_ok(cudaMemcpy(tmp, device, act_bytes(n), cudaMemcpyDeviceToHost), name);
    dtype_convert(wide, DTYPE_F32, tmp, g_act, n);
    float *d = to_device(wide, n * sizeof *wide);
    compare(name, want, d, n, tol);
    cudaFree(d);
    free(wide);
    free(tmp);
}

/* Activations (and the tolerance, and the tag of the check names) under test from here on. */
static void use_act(enum dtype dt, double tol, const char *tag)
{
    g_act = dt;
    g_tag = tag;
    g_tol = tol;
    backend_set_act_dtype(dt);
}

static const char *named(const char *name)
{
    static char buf[96];
    snprintf(buf, sizeof buf, "%s%s", name, g_tag);
    return buf;
}

/* 1 when the device buffers a and b hold the same bytes. */
static int same_bits(const void *a, const void *b, size_t bytes)
{
    unsigned char *ha = malloc(bytes), *hb = malloc(bytes);
    cuda_ok(cudaDeviceSynchronize(), "same_bits");
    cuda_ok(cudaMemcpy(ha, a, bytes, cudaMemcpyDeviceToHost), "same_bits");
    cuda_ok(cudaMemcpy(hb, b, bytes, cudaMemcpyDeviceToHost), "same_bits");
    int same = memcmp(ha, hb, bytes) == 0;
    free(ha), free(hb);
    return same;
}

/* Packed rows (backend.h): row b holds samples of the lengths PACK_LENGTHS rotated by b, laid end to end, the
 * last one cut at T; what is left after them is trailing padding: one more sample (b even) or one token samples
 * (b odd). Every third row is a single sample of T tokens (pos = t, what NULL means). Host memory, (B, T). */
static const int PACK_LENGTHS[] = {1, 2, 7, 33};
#define PACK_COUNT ((int)(sizeof PACK_LENGTHS / sizeof PACK_LENGTHS[0]))

static int32_t *packed_positions(int B, int T)
{
    int32_t *pos = malloc((size_t)B * T * sizeof *pos);
    for (int b = 0; b < B; b++) {
        int32_t *row = pos + (size_t)b * T;
        int t = 0;
        for (int k = 0; k < PACK_COUNT && b % 3 != 2; k++)
            for (int i = 0; i < PACK_LENGTHS[(b + k) % PACK_COUNT] && t < T; i++)
                row[t++] = i;
        for (int i = 0; t < T; i++, t++)
            row[t] = b % 2 && b % 3 != 2 ? 0 : i;
    }
    return pos;
}

/* Every kernel with [A] operands, activations in dt: inputs rounded to dt on
 * both sides, CPU reference in fp32, outputs compared within tol. */
struct shape {
    int B, T, C, NH, OC, V, Vp;
};
/* Block-friendly sizes, and odd ones: T = 50 leaves a partial warp in the
 * softmax rows, N = 150 a partial row block, V = 301 a partial vocabulary tile. */
static const struct shape EVEN = {2, 64, 96, 4, 288, 300, 384}, ODD = {3, 50, 72, 3, 200, 301, 320};

static const char *named2(const char *name, const char *variant)
{
    static char buf[256];
    snprintf(buf, sizeof buf, "%s%s%s", name, variant, g_tag);
    return buf;
}

/* backend_matmul_forward_gelu and backend_matmul_backward_gelu against the CPU backend's composition:
 * inp (N, C), w (C, OC), bias (OC) or NULL, on both sides; outputs poisoned, gradients from random starts. */
static void check_fused_mlp(const float *d_inp, const float *inp, const float *d_w, const float *w,
                            const float *d_bias, const float *bias, int N, int C, int OC, const char *variant)
{
    const size_t NO = (size_t)N * OC, NC = (size_t)N * C;
    float *pre = malloc(NO * 4), *out = malloc(NO * 4), *d_pre = act_poisoned(NO), *d_out = act_poisoned(NO);
    cpu_matmul_forward_gelu(pre, out, inp, w, bias, N, C, OC);
    backend_matmul_forward_gelu(d_pre, d_out, d_inp, d_w, d_bias, N, C, OC);
    compare_act(named2("matmul_forward_gelu_pre", variant), pre, d_pre, NO, g_tol);
    compare_act(named2("matmul_forward_gelu_out", variant), out, d_out, NO, g_tol);
    /* backward of the MLP's second matmul, (N, OC) -> (N, C): its input is GELU(pre2), pre2 (N, C) */
    float *pre2 = act_round(host_random(NC, 2), NC), *gin = malloc(NC * 4);
    cpu_gelu_forward(gin, pre2, NC);
    act_round(gin, NC);
    float *d_pre2 = act_to_device(pre2, NC), *d_gin = act_to_device(gin, NC);
    float *dout = act_round(host_random(NO, 1), NO), *d_dout = act_to_device(dout, NO);
    float *w2 = act_round(host_random((size_t)C * OC, 0.2f), (size_t)C * OC), *d_w2 = act_to_device(w2, (size_t)C * OC);
    float *dpre = malloc(NC * 4), *d_dpre = act_poisoned(NC);
    float *dw = host_random((size_t)C * OC, 1), *d_dw = to_device(dw, (size_t)C * OC * 4);
    float *db = host_random(OC, 1), *d_db = to_device(db, OC * 4);
    cpu_matmul_backward_gelu(dpre, dw, bias ? db : NULL, dout, gin, w2, pre2, N, C, OC);
    backend_matmul_backward_gelu(d_dpre, d_dw, bias ? d_db : NULL, d_dout, d_gin, d_w2, d_pre2, N, C, OC);
    compare_act(named2("matmul_backward_gelu_dpre", variant), dpre, d_dpre, NC, g_tol);
    compare(named2("matmul_backward_gelu_dweight_accumulates", variant), dw, d_dw, (size_t)C * OC, g_tol);
    compare(named2(bias ? "matmul_backward_gelu_dbias_accumulates" : "matmul_backward_gelu_dbias_untouched", variant),
            db, d_db, OC, g_tol);
    /* frozen weights (dweight NULL): the same input gradient bits, the bias gradient untouched */
    float *d_dpre_frozen = act_poisoned(NC), *d_db_kept = to_device(db, OC * 4), *d_db_was = to_device(db, OC * 4);
    backend_matmul_backward_gelu(d_dpre_frozen, NULL, d_db_kept, d_dout, d_gin, d_w2, d_pre2, N, C, OC);
    check_value(named2("matmul_backward_gelu_frozen_same_dpre_no_dbias", variant),
                same_bits(d_dpre_frozen, d_dpre, act_bytes(NC)) && same_bits(d_db_kept, d_db_was, OC * 4),
                "dweight NULL changed dpre or wrote dbias");
    cudaFree(d_dpre_frozen), cudaFree(d_db_kept), cudaFree(d_db_was);
    cudaFree(d_pre), cudaFree(d_out), cudaFree(d_pre2), cudaFree(d_gin), cudaFree(d_dout), cudaFree(d_w2);
    cudaFree(d_dpre), cudaFree(d_dw), cudaFree(d_db);
    free(pre), free(out), free(pre2), free(gin), free(dout), free(w2), free(dpre), free(dw), free(db);
}

/* The embedding with its position table at shape sh: tokens (N), pos NULL or packed rows (host); wte, wpe, out,
 * dout [A]; the backward into random starting dwte, dwpe fp32. */
static void check_embedding(const int32_t *tokens, const int32_t *pos, struct shape sh, const char *variant)
{
    const int B = sh.B, T = sh.T, C = sh.C, Vp = sh.Vp, N = B * T;
    const size_t NC = (size_t)N * C, VC = (size_t)Vp * C, TC = (size_t)T * C;
    int32_t *d_tokens = to_device(tokens, N * 4), *d_pos = pos ? to_device(pos, N * 4) : NULL;
    float *wte = act_round(host_random(VC, 1), VC), *wpe = act_round(host_random(TC, 1), TC);
    float *d_wte = act_to_device(wte, VC), *d_wpe = act_to_device(wpe, TC);
    float *emb = malloc(NC * 4), *d_emb = act_poisoned(NC);
    cpu_embedding_forward(emb, tokens, wte, wpe, pos, B, T, C);
    backend_embedding_forward(d_emb, d_tokens, d_wte, d_wpe, d_pos, B, T, C);
    compare_act(named2("embedding_forward", variant), emb, d_emb, NC, g_tol);
    float *dout = act_round(host_random(NC, 1), NC), *d_dout = act_to_device(dout, NC);
    float *dwte = host_random(VC, 1), *dwpe = host_random(TC, 1);
    float *d_dwte = to_device(dwte, VC * 4), *d_dwpe = to_device(dwpe, TC * 4);
    cpu_embedding_backward(dwte, dwpe, dout, tokens, pos, B, T, C);
    backend_embedding_backward(d_dwte, d_dwpe, d_dout, d_tokens, d_pos, B, T, C);
    compare(named2("embedding_backward_dwte", variant), dwte, d_dwte, VC, TOL);
    compare(named2("embedding_backward_dwpe", variant), dwpe, d_dwpe, TC, TOL);
    cudaFree(d_tokens), cudaFree(d_pos), cudaFree(d_wte), cudaFree(d_wpe), cudaFree(d_emb), cudaFree(d_dout);
    cudaFree(d_dwte), cudaFree(d_dwpe);
    free(wte), free(wpe), free(emb), free(dout), free(dwte), free(dwpe);
}

/* The cross-entropy over random logits [A] (in place) at shape sh, targets (N); losses fp32. Where a target is
 * < 0 (not trained) the loss and the whole dlogits row must be exactly 0 too. */
static void check_crossentropy(const int32_t *targets, struct shape sh, const char *variant)
{
    const int N = sh.B * sh.T, V = sh.V, Vp = sh.Vp;
    const size_t NV = (size_t)N * Vp;
    int32_t *d_targets = to_device(targets, N * 4);
    float *logits = act_round(host_random(NV, 4), NV), *d_logits = act_to_device(logits, NV);
    float *losses = malloc(N * 4), *d_losses = poisoned(N);
    cpu_crossentropy_forward(losses, logits, targets, N, V, Vp);
    backend_crossentropy_forward(d_losses, d_logits, d_targets, N, V, Vp);
    compare(named2("crossentropy_forward_losses", variant), losses, d_losses, N, TOL);
    compare_act(named2("crossentropy_forward_probs", variant), logits, d_logits, NV, g_tol);
    act_round(logits, NV);
    cpu_crossentropy_backward(logits, targets, 1.0f / N, N, V, Vp);
    backend_crossentropy_backward(d_logits, d_targets, 1.0f / N, N, V, Vp);
    compare_act(named2("crossentropy_backward", variant), logits, d_logits, NV, g_tol);
    /* per-row scales (DPO): from the same probabilities, each row its own scale, some negative */
    float *rows = host_random(N, 5), *probs = host_random(NV, 6), *d_rows = to_device(rows, N * 4);
    for (size_t i = 0; i < NV; i++) /* the padded columns as the forward leaves them */
        probs[i] = (int)(i % Vp) < V ? probs[i] : 0.0f;
    act_round(probs, NV);
    float *d_probs = act_to_device(probs, NV);
    cpu_crossentropy_backward_rows(probs, targets, rows, N, V, Vp);
    backend_crossentropy_backward_rows(d_probs, d_targets, d_rows, N, V, Vp);
    compare_act(named2("crossentropy_backward_rows", variant), probs, d_probs, NV, g_tol);
    /* the same scales on the rows of an activation (DPO, a frozen LM head's input gradient) */
    float *x = act_round(host_random(NV, 2), NV), *d_x = act_to_device(x, NV);
    cpu_scale_rows(x, rows, N, Vp);
    backend_scale_rows(d_x, d_rows, N, Vp);
    compare_act(named2("scale_rows", variant), x, d_x, NV, g_tol);
    cudaFree(d_rows), cudaFree(d_probs), cudaFree(d_x);
    free(rows), free(probs), free(x);
    float *got_losses = malloc(N * 4);
    unsigned char *got = malloc(act_bytes(NV));
    cuda_ok(cudaDeviceSynchronize(), "crossentropy");
    cuda_ok(cudaMemcpy(got_losses, d_losses, N * 4, cudaMemcpyDeviceToHost), "crossentropy");
    cuda_ok(cudaMemcpy(got, d_logits, act_bytes(NV), cudaMemcpyDeviceToHost), "crossentropy");
    size_t ignored = 0, nonzero = 0;
    for (int i = 0; i < N; i++) {
        if (targets[i] >= 0)
            continue;
        ignored++;
        nonzero += got_losses[i] != 0.0f;
        for (size_t j = 0; j < act_bytes(Vp); j++) /* +0.0 in every dtype: all bits clear */
            nonzero += got[act_bytes((size_t)i * Vp) + j] != 0;
    }
    if (ignored)
        check_value(named2("crossentropy_ignored_rows_exactly_zero", variant), nonzero == 0,
                    "an ignored target has a nonzero loss or dlogits element");
    cudaFree(d_targets), cudaFree(d_logits), cudaFree(d_losses);
    free(logits), free(losses), free(got_losses), free(got);
}

static void check_act_kernels(enum dtype dt, double tol, const char *tag, struct shape sh)
{
    use_act(dt, tol, tag);
    const int B = sh.B, T = sh.T, C = sh.C, NH = sh.NH, OC = sh.OC, V = sh.V, N = B * T;
    const size_t NC = (size_t)N * C;

    /* matmul: inp, weight, bias, out, dout, dinp [A]; dweight, dbias fp32 (accumulated) */
    float *inp = act_round(host_random(NC, 1), NC), *w = act_round(host_random((size_t)C * OC, 0.2f), (size_t)C * OC);
    float *bias = act_round(host_random(OC, 0.5f), OC);
    float *d_inp = act_to_device(inp, NC), *d_w = act_to_device(w, (size_t)C * OC), *d_bias = act_to_device(bias, OC);
    float *out = malloc((size_t)N * OC * 4), *d_out = act_poisoned((size_t)N * OC);
    cpu_matmul_forward(out, inp, w, bias, N, C, OC);
    backend_matmul_forward(d_out, d_inp, d_w, d_bias, N, C, OC);
    compare_act(named("matmul_forward"), out, d_out, (size_t)N * OC, tol);
    float *dout = act_round(host_random((size_t)N * OC, 1), (size_t)N * OC), *d_dout = act_to_device(dout, (size_t)N * OC);
    float *dinp = malloc(NC * 4), *d_dinp = act_poisoned(NC);
    float *dw = host_random((size_t)C * OC, 1), *d_dw = to_device(dw, (size_t)C * OC * 4);
    float *db = host_random(OC, 1), *d_db = to_device(db, OC * 4);
    cpu_matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC);
    backend_matmul_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, N, C, OC);
    compare_act(named("matmul_backward_dinp"), dinp, d_dinp, NC, tol);
    compare(named("matmul_backward_dweight_accumulates"), dw, d_dw, (size_t)C * OC, tol);
    compare(named("matmul_backward_dbias_accumulates"), db, d_db, OC, tol);
    /* frozen weights (dweight NULL, backend.h): the same input gradient bits, the bias gradient untouched */
    float *d_dinp_frozen = act_poisoned(NC), *d_db_kept = to_device(db, OC * 4), *d_db_was = to_device(db, OC * 4);
    backend_matmul_backward(d_dinp_frozen, NULL, d_db_kept, d_dout, d_inp, d_w, N, C, OC);
    check_value(named("matmul_backward_frozen_same_dinp_no_dbias"),
                same_bits(d_dinp_frozen, d_dinp, act_bytes(NC)) && same_bits(d_db_kept, d_db_was, OC * 4),
                "dweight NULL changed dinp or wrote dbias");
    /* tied head: weight (OC, C) */
    float *d_out2 = act_poisoned((size_t)N * OC);
    cpu_matmul_forward_transposed(out, inp, w, N, C, OC);
    backend_matmul_forward_transposed(d_out2, d_inp, d_w, N, C, OC);
    compare_act(named("matmul_forward_transposed"), out, d_out2, (size_t)N * OC, tol);
    float *d_dinp2 = act_poisoned(NC);
    cpu_matmul_backward_transposed(dinp, dw, dout, inp, w, N, C, OC);
    backend_matmul_backward_transposed(d_dinp2, d_dw, d_dout, d_inp, d_w, N, C, OC);
    compare_act(named("matmul_backward_transposed_dinp"), dinp, d_dinp2, NC, tol);
    compare(named("matmul_backward_transposed_dweight"), dw, d_dw, (size_t)C * OC, tol);
    backend_matmul_backward_transposed(d_dinp_frozen, NULL, d_dout, d_inp, d_w, N, C, OC);
    check_value(named("matmul_backward_transposed_frozen_same_dinp"), same_bits(d_dinp_frozen, d_dinp2, act_bytes(NC)),
                "dweight NULL changed dinp");
    cudaFree(d_dinp_frozen), cudaFree(d_db_kept), cudaFree(d_db_was);

    /* the fused MLP matmuls: as OC and C are, multiples of 8 (cuBLASLt's epilogues), and 4 less (the unfused
     * fallback); with and without the bias */
    for (int variant = 0; variant < 3; variant++) {
        const int c = variant == 1 ? C - 4 : C, oc = variant == 1 ? OC - 4 : OC;
        char tag[48];
        snprintf(tag, sizeof tag, "%s%s", variant == 1 ? "_fallback" : "", variant == 2 ? "_nobias" : "");
        check_fused_mlp(d_inp, inp, d_w, w, variant == 2 ? NULL : d_bias, variant == 2 ? NULL : bias, N, c, oc, tag);
    }

    /* layernorm: input and its gradient (the residual stream), output, dout, weight, bias [A] */
    float *x = act_round(host_random(NC, 1), NC), *d_x = act_to_device(x, NC);
    float *lw = act_round(host_random(C, 1), C), *lb = act_round(host_random(C, 1), C);
    float *d_lw = act_to_device(lw, C), *d_lb = act_to_device(lb, C);
    float *mean = malloc(N * 4), *rstd = malloc(N * 4), *d_mean = poisoned(N), *d_rstd = poisoned(N);
    float *ln = malloc(NC * 4), *d_ln = act_poisoned(NC);
    cpu_layernorm_forward(ln, mean, rstd, x, lw, lb, N, C);
    backend_layernorm_forward(d_ln, d_mean, d_rstd, d_x, d_lw, d_lb, N, C);
    compare_act(named("layernorm_forward"), ln, d_ln, NC, tol);
    compare(named("layernorm_forward_mean"), mean, d_mean, N, TOL);
    compare(named("layernorm_forward_rstd"), rstd, d_rstd, N, TOL);
    float *lndout = act_round(host_random(NC, 1), NC), *d_lndout = act_to_device(lndout, NC);
    float *lndinp = act_round(host_random(NC, 1), NC), *d_lndinp = act_to_device(lndinp, NC);
    float *ldw = host_random(C, 1), *ldb = host_random(C, 1), *d_ldw = to_device(ldw, C * 4), *d_ldb = to_device(ldb, C * 4);
    float *scratch = malloc((cpu_layernorm_scratch(C) + 1) * 4);
    float *d_scratch = poisoned(backend_layernorm_scratch(C) + 1);
    float *d_lndinp_frozen = act_to_device(lndinp, NC); /* the same start as d_lndinp */
    cpu_layernorm_backward(lndinp, ldw, ldb, lndout, x, lw, mean, rstd, scratch, N, C);
    backend_layernorm_backward(d_lndinp, d_ldw, d_ldb, d_lndout, d_x, d_lw, d_mean, d_rstd, d_scratch, N, C);
    compare_act(named("layernorm_backward_dinp_accumulates"), lndinp, d_lndinp, NC, tol);
    compare(named("layernorm_backward_dweight"), ldw, d_ldw, C, tol);
    compare(named("layernorm_backward_dbias"), ldb, d_ldb, C, tol);
    backend_layernorm_backward(d_lndinp_frozen, NULL, NULL, d_lndout, d_x, d_lw, d_mean, d_rstd, d_scratch, N, C);
    check_value(named("layernorm_backward_frozen_same_dinp"), same_bits(d_lndinp_frozen, d_lndinp, act_bytes(NC)),
                "dweight NULL changed dinp");
    cudaFree(d_lndinp_frozen);

    /* element-wise: GELU [A]; add_act: [A] + [A] */
    float *g = malloc(NC * 4), *d_g = act_poisoned(NC);
    cpu_gelu_forward(g, inp, NC);
    backend_gelu_forward(d_g, d_inp, NC);
    compare_act(named("gelu_forward"), g, d_g, NC, tol);
    float *d_gb = act_poisoned(NC);
    cpu_gelu_backward(g, inp, lndout, NC);
    backend_gelu_backward(d_gb, d_inp, d_lndout, NC);
    compare_act(named("gelu_backward"), g, d_gb, NC, tol);
    float *d_sum = act_poisoned(NC);
    cpu_add(g, x, inp, NC);
    backend_add_act(d_sum, d_x, d_inp, NC);
    compare_act(named("add_act"), g, d_sum, NC, tol);

    /* attention: qkv, out, dout, dqkv [A]; both keep each row's log-sum-exp (att, fp32: the CPU's tiled
     * kernel) and recompute the probabilities in the backward */
    size_t nqkv = (size_t)N * 3 * C;
    float *qkv = act_round(host_random(nqkv, 1), nqkv), *d_qkv = act_to_device(qkv, nqkv);
    float *att = malloc(cpu_attention_saved(B, T, NH) + 4), *aout = malloc(NC * 4), *d_aout = act_poisoned(NC);
    float *d_att = poisoned(backend_attention_saved(B, T, NH) / 4 + 1);
    float *d_fscratch = poisoned(backend_attention_scratch(T, NH) + 1);
    float *ascratch = malloc((cpu_attention_scratch(T, NH) + 1) * 4);
    cpu_attention_forward(aout, att, qkv, ascratch, NULL, B, T, C, NH);
    backend_attention_forward(d_aout, d_att, d_qkv, d_fscratch, NULL, B, T, C, NH);
    compare_act(named("attention_forward_out"), aout, d_aout, NC, tol);
    compare(named("attention_forward_lse"), att, d_att, (size_t)B * NH * T, LSE_TOL);
    float *dqkv = malloc(nqkv * 4), *d_dqkv = act_poisoned(nqkv);
    float *d_ascratch = poisoned(backend_attention_scratch(T, NH) + 1);
    cpu_attention_backward(dqkv, lndout, qkv, att, aout, ascratch, NULL, B, T, C, NH);
    backend_attention_backward(d_dqkv, d_lndout, d_qkv, d_att, d_aout, d_ascratch, NULL, B, T, C, NH);
    compare_act(named("attention_backward"), dqkv, d_dqkv, nqkv, tol);
    /* backend.h: the GPT-2 calls are the grouped-query ones with NKV = NH, to the bit */
    float *d_gqa_out = act_poisoned(NC), *d_gqa_att = poisoned(backend_attention_saved(B, T, NH) / 4 + 1);
    float *d_gqa_dqkv = act_poisoned(nqkv);
    backend_attention_gqa_forward(d_gqa_out, d_gqa_att, d_qkv, d_fscratch, NULL, B, T, NH, NH, C / NH, NULL);
    backend_attention_gqa_backward(d_gqa_dqkv, d_lndout, d_qkv, d_gqa_att, d_gqa_out, d_ascratch, NULL, B, T, NH, NH,
                                   C / NH, NULL);
    check_value(named("attention_gqa_equals_mha_bits"),
                same_bits(d_gqa_out, d_aout, act_bytes(NC)) && same_bits(d_gqa_dqkv, d_dqkv, act_bytes(nqkv)) &&
                    same_bits(d_gqa_att, d_att, (size_t)B * NH * T * 4),
                "the grouped-query attention with NKV = NH differs from the GPT-2 call");
    cudaFree(d_gqa_out), cudaFree(d_gqa_att), cudaFree(d_gqa_dqkv);

    /* embedding and cross-entropy: a repeated token (its rows add up), every target trained */
    int32_t *tokens = malloc(N * sizeof *tokens), *targets = malloc(N * sizeof *targets);
    for (int i = 0; i < N; i++) {
        tokens[i] = (int32_t)((uniform() + 1.0f) * 0.5f * (V - 1));
        targets[i] = (int32_t)((uniform() + 1.0f) * 0.5f * (V - 1));
    }
    tokens[1] = tokens[0];
    check_embedding(tokens, NULL, sh, "");
    check_crossentropy(targets, sh, "");
    free(tokens), free(targets);
    use_act(DTYPE_F32, TOL, "");
}

/* ---- the Llama kernels: grouped-query attention, RMSNorm, rotary, SwiGLU, embedding without positions -------- */

#define RMSNORM_EPS 1e-5f   /* Llama 2's rms_norm_eps */
#define ROPE_THETA 10000.0  /* Llama 2's rope_theta */

struct llama_shape {
    int B, T, NH, NKV, hs, F, V; /* C = NH hs; F the MLP's hidden width */
};
/* Grouped-query ratios NH / NKV of 4, 2 and 1 (NKV = NH), head sizes that are odd multiples of 2 (6, 10) beside
 * a power of two; T = 50, 70, 33 leave partial row blocks of the attention kernels (64 rows), C = 24, 40, 30
 * partial warps in the norms, odd F partial blocks in SwiGLU. */
static const struct llama_shape LLAMA_SHAPES[] = {
    {2, 64, 8, 2, 16, 88, 300},
    {2, 50, 4, 1, 6, 37, 97},
    {1, 70, 4, 2, 10, 51, 130},
    {3, 33, 3, 3, 10, 19, 64},
};

/* The rotary tables (T, hs / 2): angle t theta^(-2i / hs), as Llama's. */
static void rope_tables(float *cos_t, float *sin_t, int T, int hs)
{
    for (int t = 0; t < T; t++)
        for (int i = 0; i < hs / 2; i++) {
            const double angle = t * pow(ROPE_THETA, -2.0 * i / hs);
            cos_t[(size_t)t * (hs / 2) + i] = (float)cos(angle);
            sin_t[(size_t)t * (hs / 2) + i] = (float)sin(angle);
        }
}

/* A gated MLP activation (SwiGLU, Gemma's GeGLU): gu (N, 2F), out (N, F), dout, dgu [A], forward and backward
 * against the CPU's. */
static void check_gate(const char *name, void (*cpu_forward)(float *, const float *, int, int),
                       void (*forward)(float *, const float *, int, int),
                       void (*cpu_backward)(float *, const float *, const float *, int, int),
                       void (*backward)(float *, const float *, const float *, int, int), int N, int F, const char *v)
{
    const size_t NF = (size_t)N * F;
    char what[64];
    float *gu = act_round(host_random(2 * NF, 3), 2 * NF), *d_gu = act_to_device(gu, 2 * NF);
    float *mlp = malloc(NF * 4), *d_mlp = act_poisoned(NF);
    cpu_forward(mlp, gu, N, F);
    forward(d_mlp, d_gu, N, F);
    snprintf(what, sizeof what, "%s_forward", name);
    compare_act(named2(what, v), mlp, d_mlp, NF, g_tol);
    float *dmlp = act_round(host_random(NF, 1), NF), *d_dmlp = act_to_device(dmlp, NF);
    float *dgu = malloc(2 * NF * 4), *d_dgu = act_poisoned(2 * NF);
    cpu_backward(dgu, dmlp, gu, N, F);
    backward(d_dgu, d_dmlp, d_gu, N, F);
    snprintf(what, sizeof what, "%s_backward", name);
    compare_act(named2(what, v), dgu, d_dgu, 2 * NF, g_tol);
    cudaFree(d_gu), cudaFree(d_mlp), cudaFree(d_dmlp), cudaFree(d_dgu);
    free(gu), free(mlp), free(dmlp), free(dgu);
}

static void check_llama_norm_and_mlp(const struct llama_shape *sh, const char *v)
{
    const int N = sh->B * sh->T, C = sh->NH * sh->hs, F = sh->F;
    const size_t NC = (size_t)N * C;
    /* RMSNorm: inp, out, weight, dout and dinp (the residual stream's gradient, accumulated) [A]; dweight fp32 */
    float *x = act_round(host_random(NC, 1), NC), *w = act_round(host_random(C, 1), C);
    float *d_x = act_to_device(x, NC), *d_w = act_to_device(w, C);
    float *out = malloc(NC * 4), *rstd = malloc(N * 4), *d_out = act_poisoned(NC), *d_rstd = poisoned(N);
    cpu_rmsnorm_forward(out, rstd, x, w, RMSNORM_EPS, N, C);
    backend_rmsnorm_forward(d_out, d_rstd, d_x, d_w, RMSNORM_EPS, N, C);
    compare_act(named2("rmsnorm_forward", v), out, d_out, NC, g_tol);
    compare(named2("rmsnorm_forward_rstd", v), rstd, d_rstd, N, TOL);
    float *dout = act_round(host_random(NC, 1), NC), *dinp = act_round(host_random(NC, 1), NC);
    float *d_dout = act_to_device(dout, NC), *d_dinp = act_to_device(dinp, NC);
    float *dw = host_random(C, 1), *d_dw = to_device(dw, C * 4);
    float *scratch = malloc((cpu_layernorm_scratch(C) + 1) * 4), *d_scratch = poisoned(backend_layernorm_scratch(C) + 1);
    float *d_dinp_frozen = act_to_device(dinp, NC); /* the same start as d_dinp */
    cpu_rmsnorm_backward(dinp, dw, dout, x, w, rstd, scratch, N, C);
    backend_rmsnorm_backward(d_dinp, d_dw, d_dout, d_x, d_w, d_rstd, d_scratch, N, C);
    compare_act(named2("rmsnorm_backward_dinp_accumulates", v), dinp, d_dinp, NC, g_tol);
    backend_rmsnorm_backward(d_dinp_frozen, NULL, d_dout, d_x, d_w, d_rstd, d_scratch, N, C);
    check_value(named2("rmsnorm_backward_frozen_same_dinp", v), same_bits(d_dinp_frozen, d_dinp, act_bytes(NC)),
                "dweight NULL changed dinp");
    cudaFree(d_dinp_frozen);
    compare(named2("rmsnorm_backward_dweight_accumulates", v), dw, d_dw, C, g_tol);

    check_gate("swiglu", cpu_swiglu_forward, backend_swiglu_forward, cpu_swiglu_backward, backend_swiglu_backward, N,
               F, v);

    /* the embedding without a position table: wte, out, dout [A]; dwte fp32, a repeated token */
    int32_t *tokens = malloc(N * sizeof *tokens);
    for (int i = 0; i < N; i++)
        tokens[i] = (int32_t)((uniform() + 1.0f) * 0.5f * (sh->V - 1));
    tokens[1] = tokens[0];
    int32_t *d_tokens = to_device(tokens, N * 4);
    float *wte = act_round(host_random((size_t)sh->V * C, 1), (size_t)sh->V * C);
    float *d_wte = act_to_device(wte, (size_t)sh->V * C), *d_emb = act_poisoned(NC);
    cpu_embedding_forward(out, tokens, wte, NULL, NULL, sh->B, sh->T, C);
    backend_embedding_forward(d_emb, d_tokens, d_wte, NULL, NULL, sh->B, sh->T, C);
    compare_act(named2("embedding_forward_nopos", v), out, d_emb, NC, g_tol);
    float *dwte = host_random((size_t)sh->V * C, 1), *d_dwte = to_device(dwte, (size_t)sh->V * C * 4);
    cpu_embedding_backward(dwte, NULL, dout, tokens, NULL, sh->B, sh->T, C);
    backend_embedding_backward(d_dwte, NULL, d_dout, d_tokens, NULL, sh->B, sh->T, C);
    compare(named2("embedding_backward_nopos_dwte", v), dwte, d_dwte, (size_t)sh->V * C, TOL);

    cudaFree(d_x), cudaFree(d_w), cudaFree(d_out), cudaFree(d_rstd), cudaFree(d_dout), cudaFree(d_dinp);
    cudaFree(d_dw), cudaFree(d_scratch), cudaFree(d_tokens), cudaFree(d_wte), cudaFree(d_emb), cudaFree(d_dwte);
    free(x), free(w), free(out), free(rstd), free(dout), free(dinp), free(dw), free(scratch), free(tokens), free(wte);
    free(dwte);
}

/* The Llama-like families' extras: a bias on every row of the fused q|k|v output and its gradient (Qwen2), and
 * the column copies that take the query heads to contiguous rows and back (Qwen3's per-head norm), at the
 * shape's q|k|v width. */
static void check_llama_extras(const struct llama_shape *sh, const char *v)
{
    const int N = sh->B * sh->T, Q = sh->NH * sh->hs, QKV = Q + 2 * sh->NKV * sh->hs;
    const size_t n = (size_t)N * QKV;
    float *y = act_round(host_random(n, 1), n), *b = act_round(host_random(QKV, 1), QKV);
    float *d_y = act_to_device(y, n), *d_b = act_to_device(b, QKV);
    cpu_bias_forward(y, b, N, QKV);
    backend_bias_forward(d_y, d_b, N, QKV);
    compare_act(named2("bias_forward_accumulates", v), y, d_y, n, g_tol);
    float *db = host_random(QKV, 1), *d_db = to_device(db, QKV * 4);
    cpu_bias_backward(db, y, N, QKV);
    backend_bias_backward(d_db, d_y, N, QKV);
    compare(named2("bias_backward_accumulates", v), db, d_db, QKV, g_tol);
    backend_bias_backward(NULL, d_y, N, QKV); /* frozen: nothing to do, nothing touched */
    /* q|k|v = x W^T + b with the bias in the matmul's epilogue (one rounding) against the CPU's matmul then bias */
    {
        const int C = sh->NH * sh->hs / 2 + 8;
        float *x = act_round(host_random((size_t)N * C, 3), (size_t)N * C);
        float *w = act_round(host_random((size_t)QKV * C, 4), (size_t)QKV * C), *o = malloc(n * 4);
        float *d_x = act_to_device(x, (size_t)N * C), *d_w = act_to_device(w, (size_t)QKV * C), *d_o = act_poisoned(n);
        cpu_matmul_forward_transposed_bias(o, x, w, b, N, C, QKV);
        backend_matmul_forward_transposed_bias(d_o, d_x, d_w, d_b, N, C, QKV);
        compare_act(named2("matmul_forward_transposed_bias", v), o, d_o, n, g_tol);
        cpu_matmul_forward_transposed_bias(o, x, w, NULL, N, C, QKV);
        backend_matmul_forward_transposed_bias(d_o, d_x, d_w, NULL, N, C, QKV);
        compare_act(named2("matmul_forward_transposed_nobias", v), o, d_o, n, g_tol);
        cudaFree(d_x), cudaFree(d_w), cudaFree(d_o);
        free(x), free(w), free(o);
    }
    act_round(y, n); /* the device's y is in the activation dtype: the copies below move those values */
    /* the key heads (columns Q .. Q + NKV hs) out to contiguous rows and back into a copy of another matrix */
    const int width = sh->NKV * sh->hs;
    float *heads = malloc((size_t)N * width * 4), *d_heads = act_poisoned((size_t)N * width);
    cpu_copy_cols(heads, width, 0, y, QKV, Q, N, width);
    backend_copy_cols(d_heads, width, 0, d_y, QKV, Q, N, width);
    compare_act(named2("copy_cols_out", v), heads, d_heads, (size_t)N * width, 0.0);
    float *z = act_round(host_random(n, 2), n), *d_z = act_to_device(z, n);
    cpu_copy_cols(z, QKV, Q, heads, width, 0, N, width);
    backend_copy_cols(d_z, QKV, Q, d_heads, width, 0, N, width);
    compare_act(named2("copy_cols_back", v), z, d_z, n, 0.0);
    cudaFree(d_y), cudaFree(d_b), cudaFree(d_db), cudaFree(d_heads), cudaFree(d_z);
    free(y), free(b), free(db), free(heads), free(z);
}

/* Attention on qkv (host, already rounded to the activation dtype) against the CPU backend, pos NULL or packed
 * rows (host; the device gets a copy): forward output, the device's log-sum-exp, backward. gpt2_call: through the
 * GPT-2 calls (NKV = NH), which must then also equal the grouped-query ones to the bit. opt: the variant (window,
 * soft-cap, scale; backend.h), grouped-query calls only. */
static void check_attention_opt(const float *qkv, const int32_t *pos, int B, int T, int NH, int NKV, int hs,
                                int gpt2_call, const struct attn_opts *opt, const char *v)
{
    const int N = B * T, C = NH * hs;
    const size_t nqkv = (size_t)N * (NH + 2 * NKV) * hs, nout = (size_t)N * C;
    const char *kind = gpt2_call ? "attention" : "attention_gqa";
    char name[96];
    float *d_qkv = act_to_device(qkv, nqkv);
    int32_t *d_pos = pos ? to_device(pos, (size_t)N * sizeof *pos) : NULL;
    float *att = malloc(cpu_attention_saved(B, T, NH) + 4), *out = malloc(nout * 4), *d_out = act_poisoned(nout);
    float *scratch = malloc((cpu_attention_scratch(T, NH) + 1) * 4);
    float *d_att = poisoned(backend_attention_saved(B, T, NH) / 4 + 1);
    float *d_scratch = poisoned(backend_attention_scratch(T, NH) + 1);
    float *dout = act_round(host_random(nout, 1), nout), *d_dout = act_to_device(dout, nout);
    float *dqkv = malloc(nqkv * 4), *d_dqkv = act_poisoned(nqkv);
    if (gpt2_call) {
        cpu_attention_forward(out, att, qkv, scratch, pos, B, T, C, NH);
        backend_attention_forward(d_out, d_att, d_qkv, d_scratch, d_pos, B, T, C, NH);
        cpu_attention_backward(dqkv, dout, qkv, att, out, scratch, pos, B, T, C, NH);
        backend_attention_backward(d_dqkv, d_dout, d_qkv, d_att, d_out, d_scratch, d_pos, B, T, C, NH);
    } else {
        cpu_attention_gqa_forward(out, att, qkv, scratch, pos, B, T, NH, NKV, hs, opt);
        backend_attention_gqa_forward(d_out, d_att, d_qkv, d_scratch, d_pos, B, T, NH, NKV, hs, opt);
        cpu_attention_gqa_backward(dqkv, dout, qkv, att, out, scratch, pos, B, T, NH, NKV, hs, opt);
        backend_attention_gqa_backward(d_dqkv, d_dout, d_qkv, d_att, d_out, d_scratch, d_pos, B, T, NH, NKV, hs, opt);
    }
    snprintf(name, sizeof name, "%s_forward_out", kind);
    compare_act(named2(name, v), out, d_out, nout, g_tol);
    snprintf(name, sizeof name, "%s_forward_lse", kind);
    compare(named2(name, v), att, d_att, (size_t)B * NH * T, LSE_TOL);
    snprintf(name, sizeof name, "%s_backward", kind);
    compare_act(named2(name, v), dqkv, d_dqkv, nqkv, g_tol);
    if (gpt2_call) { /* backend.h: the GPT-2 calls are the grouped-query ones with NKV = NH, to the bit */
        float *d_gqa_out = act_poisoned(nout), *d_gqa_att = poisoned(backend_attention_saved(B, T, NH) / 4 + 1);
        float *d_gqa_dqkv = act_poisoned(nqkv);
        backend_attention_gqa_forward(d_gqa_out, d_gqa_att, d_qkv, d_scratch, d_pos, B, T, NH, NH, hs, NULL);
        backend_attention_gqa_backward(d_gqa_dqkv, d_dout, d_qkv, d_gqa_att, d_gqa_out, d_scratch, d_pos, B, T, NH, NH,
                                       hs, NULL);
        check_value(named2("attention_gqa_equals_mha_bits", v),
                    same_bits(d_gqa_out, d_out, act_bytes(nout)) && same_bits(d_gqa_dqkv, d_dqkv, act_bytes(nqkv)) &&
                        same_bits(d_gqa_att, d_att, (size_t)B * NH * T * 4),
                    "the grouped-query attention with NKV = NH differs from the GPT-2 call");
        cudaFree(d_gqa_out), cudaFree(d_gqa_att), cudaFree(d_gqa_dqkv);
    }
    cudaFree(d_qkv), cudaFree(d_pos), cudaFree(d_out), cudaFree(d_att), cudaFree(d_scratch), cudaFree(d_dout);
    cudaFree(d_dqkv);
    free(att), free(out), free(scratch), free(dout), free(dqkv);
}

static void check_attention(const float *qkv, const int32_t *pos, int B, int T, int NH, int NKV, int hs, int gpt2_call,
                            const char *v)
{
    check_attention_opt(qkv, pos, B, T, NH, NKV, hs, gpt2_call, NULL, v);
}

/* Rotary and grouped-query attention at a Llama shape; pos NULL or packed rows (host). */
static void check_llama_attention(const struct llama_shape *sh, const int32_t *pos, const char *v)
{
    const int B = sh->B, T = sh->T, NH = sh->NH, NKV = sh->NKV, hs = sh->hs, N = B * T;
    const size_t nqkv = (size_t)N * (NH + 2 * NKV) * hs;
    int32_t *d_pos = pos ? to_device(pos, (size_t)N * sizeof *pos) : NULL;
    /* rotary, in place on qkv [A]: the value heads must come back untouched */
    float *cos_t = malloc((size_t)T * (hs / 2) * 4), *sin_t = malloc((size_t)T * (hs / 2) * 4);
    rope_tables(cos_t, sin_t, T, hs);
    float *d_cos = to_device(cos_t, (size_t)T * (hs / 2) * 4), *d_sin = to_device(sin_t, (size_t)T * (hs / 2) * 4);
    float *qkv = act_round(host_random(nqkv, 1), nqkv), *d_qkv = act_to_device(qkv, nqkv);
    /* first over part of each head (a partial rotary, Phi-4-mini's: the first rot channels, the tables' first
     * rot / 2 columns of a row read at a stride of rot / 2), then over all of it */
    const int rot = hs / 2 % 2 ? hs / 2 + 1 : hs / 2;
    float *part = malloc(nqkv * 4), *d_part = act_to_device(qkv, nqkv);
    memcpy(part, qkv, nqkv * 4);
    cpu_rope_forward(part, cos_t, sin_t, pos, B, T, NH, NKV, hs, rot);
    backend_rope_forward(d_part, d_cos, d_sin, d_pos, B, T, NH, NKV, hs, rot);
    compare_act(named2("rope_forward_partial", v), part, d_part, nqkv, g_tol);
    cpu_rope_backward(part, cos_t, sin_t, pos, B, T, NH, NKV, hs, rot);
    backend_rope_backward(d_part, d_cos, d_sin, d_pos, B, T, NH, NKV, hs, rot);
    compare_act(named2("rope_backward_partial", v), part, d_part, nqkv, g_tol);
    cpu_rope_forward(qkv, cos_t, sin_t, pos, B, T, NH, NKV, hs, hs);
    backend_rope_forward(d_qkv, d_cos, d_sin, d_pos, B, T, NH, NKV, hs, hs);
    compare_act(named2("rope_forward", v), qkv, d_qkv, nqkv, g_tol);
    float *grad = act_round(host_random(nqkv, 1), nqkv), *d_grad = act_to_device(grad, nqkv);
    cpu_rope_backward(grad, cos_t, sin_t, pos, B, T, NH, NKV, hs, hs);
    backend_rope_backward(d_grad, d_cos, d_sin, d_pos, B, T, NH, NKV, hs, hs);
    compare_act(named2("rope_backward", v), grad, d_grad, nqkv, g_tol);
    cudaFree(d_part), free(part);

    /* grouped-query attention on the rotated qkv (both sides from the same rounded values) */
    act_round(qkv, nqkv);
    check_attention(qkv, pos, B, T, NH, NKV, hs, 0, v);

    cudaFree(d_pos), cudaFree(d_cos), cudaFree(d_sin), cudaFree(d_qkv), cudaFree(d_grad);
    free(cos_t), free(sin_t), free(qkv), free(grad);
}

/* Generation's attention with a key/value cache: T new tokens per row at
 * different positions (one row starting empty, one half full, one whose
 * chunk of keys spans more than a device block: 300 positions), the caches
 * given the same random start on both sides; the new keys and values land
 * in both caches and the outputs agree. With opt's window W the cache is a
 * ring of Tmax = W slots (backend.h), positions past it wrap, and row 1
 * keeps one token fewer than the call's T (the rest padding). */
static void check_attention_kv_opt(int NH, int NKV, int hs, int T, const struct attn_opts *opt, const char *v)
{
    const int B = 3, Tmax = opt && opt->window ? opt->window : 320;
    const int32_t past[3] = {0, 7, opt && opt->window ? 300 : Tmax - T - 3}, keep[3] = {T, T - 1 > 0 ? T - 1 : T, T};
    const size_t nqkv = (size_t)B * T * (NH + 2 * NKV) * hs, nout = (size_t)B * T * NH * hs;
    const size_t ncache = (size_t)B * Tmax * NKV * hs;
    float *qkv = act_round(host_random(nqkv, 1), nqkv), *d_qkv = act_to_device(qkv, nqkv);
    float *kc = act_round(host_random(ncache, 1), ncache), *d_kc = act_to_device(kc, ncache);
    float *vc = act_round(host_random(ncache, 1), ncache), *d_vc = act_to_device(vc, ncache);
    float *out = malloc(nout * 4), *d_out = act_poisoned(nout);
    int32_t *d_past = to_device(past, sizeof past), *d_keep = to_device(keep, sizeof keep);
    const int32_t *h_keep = opt ? keep : NULL, *dev_keep = opt ? d_keep : NULL;
    cpu_attention_kv_forward(out, qkv, kc, vc, past, h_keep, B, T, NH, NKV, hs, Tmax, opt);
    backend_attention_kv_forward(d_out, d_qkv, d_kc, d_vc, d_past, dev_keep, B, T, NH, NKV, hs, Tmax, opt);
    compare_act(named2("attention_kv_out", v), out, d_out, nout, g_tol);
    compare_act(named2("attention_kv_keys", v), kc, d_kc, ncache, 0.0);
    compare_act(named2("attention_kv_values", v), vc, d_vc, ncache, 0.0);
    cudaFree(d_qkv), cudaFree(d_kc), cudaFree(d_vc), cudaFree(d_out), cudaFree(d_past), cudaFree(d_keep);
    free(qkv), free(kc), free(vc), free(out);
}

/* Gemma's kernels (issue 49) at the Llama shapes, against the CPU's: the (1 + w) RMSNorm forward and backward
 * (weights near 0, as Gemma's), GeGLU with the tanh GELU, the scaling of activations, the final logits'
 * soft-cap (the capped logits and each row's log-sum-exp) and the cross-entropy's backward through it, at one
 * scale and at a scale per row, an ignored row zero. The cap (2) is below the logits' range (up to 4), so it
 * bends them. */
#define GEMMA_NORM_OFFSET 1.0f
#define GEMMA_SOFTCAP 2.0f
static void check_gemma(const struct llama_shape *sh, const char *v)
{
    const int N = sh->B * sh->T, C = sh->NH * sh->hs, F = sh->F, V = sh->V, Vp = (V + 127) / 128 * 128;
    const size_t NC = (size_t)N * C, NV = (size_t)N * Vp;
    float *x = act_round(host_random(NC, 1), NC), *w = act_round(host_random(C, 0.3f), C);
    float *d_x = act_to_device(x, NC), *d_w = act_to_device(w, C);
    float *out = malloc(NC * 4), *rstd = malloc(N * 4), *d_out = act_poisoned(NC), *d_rstd = poisoned(N);
    cpu_rmsnorm_offset_forward(out, rstd, x, w, GEMMA_NORM_OFFSET, RMSNORM_EPS, N, C);
    backend_rmsnorm_offset_forward(d_out, d_rstd, d_x, d_w, GEMMA_NORM_OFFSET, RMSNORM_EPS, N, C);
    compare_act(named2("gemma_rmsnorm_forward", v), out, d_out, NC, g_tol);
    float *dout = act_round(host_random(NC, 1), NC), *dinp = act_round(host_random(NC, 1), NC);
    float *d_dout = act_to_device(dout, NC), *d_dinp = act_to_device(dinp, NC);
    float *dw = host_random(C, 1), *d_dw = to_device(dw, C * 4);
    float *scratch = malloc((cpu_layernorm_scratch(C) + 1) * 4), *d_scratch = poisoned(backend_layernorm_scratch(C) + 1);
    cpu_rmsnorm_offset_backward(dinp, dw, dout, x, w, GEMMA_NORM_OFFSET, rstd, scratch, N, C);
    backend_rmsnorm_offset_backward(d_dinp, d_dw, d_dout, d_x, d_w, GEMMA_NORM_OFFSET, d_rstd, d_scratch, N, C);
    compare_act(named2("gemma_rmsnorm_backward_dinp", v), dinp, d_dinp, NC, g_tol);
    compare(named2("gemma_rmsnorm_backward_dweight", v), dw, d_dw, C, g_tol);
    cpu_scale_act(x, 6.9282f, NC);
    backend_scale_act(d_x, 6.9282f, NC);
    compare_act(named2("gemma_scale_act", v), x, d_x, NC, g_tol);

    check_gate("geglu", cpu_geglu_forward, backend_geglu_forward, cpu_geglu_backward, backend_geglu_backward, N, F,
               v);

    int32_t *targets = malloc(N * sizeof *targets);
    for (int i = 0; i < N; i++)
        targets[i] = i == 1 ? -1 : (int32_t)((uniform() + 1.0f) * 0.5f * (V - 1));
    int32_t *d_targets = to_device(targets, N * 4);
    float *logits = act_round(host_random(NV, 4), NV), *d_logits = act_to_device(logits, NV);
    float *lse = malloc(N * 4), *d_lse = poisoned(N), *losses = malloc(N * 4), *d_losses = poisoned(N);
    float *rows = host_random(N, 1), *d_rows = to_device(rows, N * 4);
    cpu_logit_softcap_forward(logits, lse, GEMMA_SOFTCAP, N, V, Vp);
    backend_logit_softcap_forward(d_logits, d_lse, GEMMA_SOFTCAP, N, V, Vp);
    compare_act(named2("logit_softcap_forward", v), logits, d_logits, NV, g_tol);
    compare(named2("logit_softcap_forward_lse", v), lse, d_lse, N, g_tol);
    cpu_crossentropy_forward(losses, logits, targets, N, V, Vp);
    backend_crossentropy_forward(d_losses, d_logits, d_targets, N, V, Vp);
    float *probs = malloc(NV * 4), *d_probs = act_poisoned(NV);
    memcpy(probs, logits, NV * 4);
    cuda_ok(cudaMemcpy(d_probs, d_logits, act_bytes(NV), cudaMemcpyDeviceToDevice), "softcap");
    cpu_crossentropy_softcap_backward(logits, targets, 1.0f / N, NULL, lse, GEMMA_SOFTCAP, N, V, Vp);
    backend_crossentropy_softcap_backward(d_logits, d_targets, 1.0f / N, NULL, d_lse, GEMMA_SOFTCAP, N, V, Vp);
    compare_act(named2("crossentropy_softcap_backward", v), logits, d_logits, NV, g_tol);
    cpu_crossentropy_softcap_backward(probs, targets, 0.0f, rows, lse, GEMMA_SOFTCAP, N, V, Vp);
    backend_crossentropy_softcap_backward(d_probs, d_targets, 0.0f, d_rows, d_lse, GEMMA_SOFTCAP, N, V, Vp);
    compare_act(named2("crossentropy_softcap_backward_rows", v), probs, d_probs, NV, g_tol);

    cudaFree(d_x), cudaFree(d_w), cudaFree(d_out), cudaFree(d_rstd), cudaFree(d_dout), cudaFree(d_dinp);
    cudaFree(d_dw), cudaFree(d_scratch), cudaFree(d_targets), cudaFree(d_logits), cudaFree(d_lse), cudaFree(d_losses);
    cudaFree(d_rows), cudaFree(d_probs);
    free(x), free(w), free(out), free(rstd), free(dout), free(dinp), free(dw), free(scratch), free(targets);
    free(logits), free(lse), free(losses), free(rows), free(probs);
}

/* RMSNorm and layernorm at widths and row counts that take every path of the backward (cuda_norm.cu): the fused
 * pass with 1, 2, 4 and 8 vectors per thread and chunks of several rows (600 rows of 40), and the two-kernel one
 * where a row is not a whole number of 16-byte vectors (2058) or is too wide for the fused pass (fp32 8200). */
static void check_wide_norms(enum dtype dt, double tol, const char *tag)
{
    static const int shapes[][2] = {{600, 40}, {5, 1032}, {3, 2056}, {3, 4104}, {2, 8200}, {3, 2058}};
    use_act(dt, tol, tag);
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int N = shapes[k][0], C = shapes[k][1];
        const size_t NC = (size_t)N * C;
        char v[32];
        snprintf(v, sizeof v, "_%dx%d", N, C);
        float *x = act_round(host_random(NC, 1), NC), *w = act_round(host_random(C, 1), C);
        float *b = act_round(host_random(C, 1), C), *dout = act_round(host_random(NC, 1), NC);
        float *dinp = act_round(host_random(NC, 1), NC), *dw = host_random(C, 1), *db = host_random(C, 1);
        float *d_x = act_to_device(x, NC), *d_w = act_to_device(w, C), *d_b = act_to_device(b, C);
        float *d_dout = act_to_device(dout, NC), *d_dinp = act_to_device(dinp, NC);
        float *d_frozen = act_to_device(dinp, NC), *d_dw = to_device(dw, C * 4), *d_db = to_device(db, C * 4);
        float *out = malloc(NC * 4), *mean = malloc(N * 4), *rstd = malloc(N * 4);
        float *d_out = act_poisoned(NC), *d_mean = poisoned(N), *d_rstd = poisoned(N);
        float *scratch = malloc((cpu_layernorm_scratch(C) + 1) * 4);
        float *d_scratch = poisoned(backend_layernorm_scratch(C) + 1);
        /* RMSNorm, then layernorm on the same buffers (dinp, dw accumulate on across both, on both sides) */
        cpu_rmsnorm_forward(out, rstd, x, w, RMSNORM_EPS, N, C);
        backend_rmsnorm_forward(d_out, d_rstd, d_x, d_w, RMSNORM_EPS, N, C);
        compare(named2("wide_rmsnorm_forward_rstd", v), rstd, d_rstd, N, TOL);
        cpu_rmsnorm_backward(dinp, dw, dout, x, w, rstd, scratch, N, C);
        backend_rmsnorm_backward(d_dinp, d_dw, d_dout, d_x, d_w, d_rstd, d_scratch, N, C);
        backend_rmsnorm_backward(d_frozen, NULL, d_dout, d_x, d_w, d_rstd, d_scratch, N, C);
        compare_act(named2("wide_rmsnorm_backward_dinp", v), dinp, d_dinp, NC, g_tol);
        compare(named2("wide_rmsnorm_backward_dweight", v), dw, d_dw, C, g_tol);
        check_value(named2("wide_rmsnorm_backward_frozen_same_dinp", v), same_bits(d_frozen, d_dinp, act_bytes(NC)),
                    "dweight NULL changed dinp");
        cpu_layernorm_forward(out, mean, rstd, x, w, b, N, C);
        backend_layernorm_forward(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C);
        compare_act(named2("wide_layernorm_forward", v), out, d_out, NC, g_tol);
        cpu_layernorm_backward(dinp, dw, db, dout, x, w, mean, rstd, scratch, N, C);
        backend_layernorm_backward(d_dinp, d_dw, d_db, d_dout, d_x, d_w, d_mean, d_rstd, d_scratch, N, C);
        compare_act(named2("wide_layernorm_backward_dinp", v), dinp, d_dinp, NC, g_tol);
        compare(named2("wide_layernorm_backward_dweight", v), dw, d_dw, C, g_tol);
        compare(named2("wide_layernorm_backward_dbias", v), db, d_db, C, g_tol);
        cudaFree(d_x), cudaFree(d_w), cudaFree(d_b), cudaFree(d_dout), cudaFree(d_dinp), cudaFree(d_frozen);
        cudaFree(d_dw), cudaFree(d_db), cudaFree(d_out), cudaFree(d_mean), cudaFree(d_rstd), cudaFree(d_scratch);
        free(x), free(w), free(b), free(dout), free(dinp), free(dw), free(db), free(out), free(mean), free(rstd);
        free(scratch);
    }
    use_act(DTYPE_F32, TOL, "");
}

static void check_attention_kv(int NH, int NKV, int hs, int T, const char *v)
{
    check_attention_kv_opt(NH, NKV, hs, T, NULL, v);
}

static void check_llama_kernels(enum dtype dt, double tol, const char *tag)
{
    use_act(dt, tol, tag);
    for (size_t k = 0; k < sizeof LLAMA_SHAPES / sizeof LLAMA_SHAPES[0]; k++) {
        const struct llama_shape *sh = &LLAMA_SHAPES[k];
        char v[48];
        snprintf(v, sizeof v, "_nh%d_kv%d_hs%d", sh->NH, sh->NKV, sh->hs);
        check_llama_norm_and_mlp(sh, v);
        check_llama_extras(sh, v);
        check_gemma(sh, v);
        check_llama_attention(sh, NULL, v);
        int32_t *pos = packed_positions(sh->B, sh->T);
        snprintf(v, sizeof v, "_nh%d_kv%d_hs%d_packed", sh->NH, sh->NKV, sh->hs);
        check_llama_attention(sh, pos, v);
        free(pos);
        for (int T = 1; T <= 3; T += 2) {
            snprintf(v, sizeof v, "_nh%d_kv%d_hs%d_T%d", sh->NH, sh->NKV, sh->hs, T);
            check_attention_kv(sh->NH, sh->NKV, sh->hs, T, v);
        }
        /* a sliding layer's ring of 8: a prefill of 11 wraps it (plain), one token past 300 positions (soft-capped,
         * with a scale of its own) */
        const struct attn_opts ring = {8, 0.0f, 0.0f}, capped = {8, 3.0f, 0.2f};
        snprintf(v, sizeof v, "_nh%d_kv%d_hs%d_T11_window8", sh->NH, sh->NKV, sh->hs);
        check_attention_kv_opt(sh->NH, sh->NKV, sh->hs, 11, &ring, v);
        snprintf(v, sizeof v, "_nh%d_kv%d_hs%d_T1_window8_softcap", sh->NH, sh->NKV, sh->hs);
        check_attention_kv_opt(sh->NH, sh->NKV, sh->hs, 1, &capped, v);
    }
    use_act(DTYPE_F32, TOL, "");
}

/* Attention over packed rows at odd head sizes and partial row blocks (the device's 32 rows a block; T = 130: a
 * fifth, partial one), through the GPT-2 calls and the grouped-query ones; and at the head sizes of real models,
 * whose staged tiles of keys or queries hold 64 (hs 64), 32 (128) or 16 (256) rows, so that a block walks
 * several tiles, partial ones and tiles cut by the sample boundaries of the packed rows. */
struct packed_attention_shape {
    int B, T, NH, NKV, hs, gpt2_call;
};
static const struct packed_attention_shape PACKED_ATTENTION_SHAPES[] = {
    {3, 50, 3, 3, 5, 1},  {2, 130, 2, 2, 7, 1},   {2, 70, 4, 2, 3, 0},   {3, 64, 3, 1, 9, 0},
    {3, 150, 4, 2, 64, 0}, {3, 170, 2, 1, 128, 0}, {3, 97, 2, 2, 256, 1},
};

/* The kernels that read pos or ignore targets, activations in dt: attention (above), the embedding with its
 * position table and the cross-entropy with ignored targets (< 0) at shape sh. */
static void check_packing(enum dtype dt, double tol, const char *tag, struct shape sh)
{
    use_act(dt, tol, tag);
    for (size_t k = 0; k < sizeof PACKED_ATTENTION_SHAPES / sizeof PACKED_ATTENTION_SHAPES[0]; k++) {
        const struct packed_attention_shape *a = &PACKED_ATTENTION_SHAPES[k];
        const size_t nqkv = (size_t)a->B * a->T * (a->NH + 2 * a->NKV) * a->hs;
        char v[64];
        snprintf(v, sizeof v, "_packed_T%d_nh%d_kv%d_hs%d", a->T, a->NH, a->NKV, a->hs);
        float *qkv = act_round(host_random(nqkv, 1.5f), nqkv);
        int32_t *pos = packed_positions(a->B, a->T);
        check_attention(qkv, pos, a->B, a->T, a->NH, a->NKV, a->hs, a->gpt2_call, v);
        free(qkv), free(pos);
    }

    const int N = sh.B * sh.T, V = sh.V;
    int32_t *pos = packed_positions(sh.B, sh.T), *tokens = malloc(N * sizeof *tokens);
    int32_t *targets = malloc(N * sizeof *targets);
    for (int i = 0; i < N; i++) {
        tokens[i] = (int32_t)((uniform() + 1.0f) * 0.5f * (V - 1));
        /* every third target ignored, one of them far below 0 */
        targets[i] = i % 3 == 1 ? (i == 1 ? -100 : -1) : (int32_t)((uniform() + 1.0f) * 0.5f * (V - 1));
    }
    check_embedding(tokens, pos, sh, "_packed"); /* position rows repeated within and across rows */
    check_crossentropy(targets, sh, "_ignored");
    free(pos), free(tokens), free(targets);
    use_act(DTYPE_F32, TOL, "");
}

/* ---- attention on tensor cores (src/backend/cuda/attention_tc.cu) -------------------------------------------- */

long backend_cuda_attention_tc_calls(void); /* attention_tc.h: the attention calls the tensor cores took */

/* fp16/bf16 at head sizes 64 and 128 (the two builds of the kernels: 64-key tiles, 32-key tiles), packed rows and
 * grouped-query attention, and T past several 64-row query blocks and key tiles: each case must take the tensor
 * cores (forward and backward) and agree with the CPU within the dtype's tolerance. The FP32 kernel must take the
 * rest: fp32 activations, a head size not a multiple of 16, and SHARDLM_ATTN_TC=0. */
static const struct packed_attention_shape TC_ATTENTION_SHAPES[] = {
    {3, 150, 4, 2, 64, 0}, {2, 100, 4, 1, 128, 0}, {3, 130, 2, 2, 128, 1}, {1, 100, 2, 2, 64, 1},
};

/* check_attention on a fresh random qkv (1.5 scale, rounded to the dtype) with packed rows or none; 1 when calls()
 * (a kernel's count of the calls it ran) counted every attention call the case made. */
static int attention_case_took_opt(const struct packed_attention_shape *a, int packed, const struct attn_opts *opt,
                                   const char *v, long (*calls)(void))
{
    const size_t nqkv = (size_t)a->B * a->T * (a->NH + 2 * a->NKV) * a->hs;
    float *qkv = act_round(host_random(nqkv, 1.5f), nqkv);
    int32_t *pos = packed ? packed_positions(a->B, a->T) : NULL;
    const long before = calls();
    check_attention_opt(qkv, pos, a->B, a->T, a->NH, a->NKV, a->hs, a->gpt2_call, opt, v);
    /* forward and backward, and the GPT-2 call's second pass through the grouped-query calls */
    const long want = a->gpt2_call ? 4 : 2, took = calls() - before;
    free(qkv), free(pos);
    return took == want;
}

static int attention_case_took(const struct packed_attention_shape *a, int packed, const char *v, long (*calls)(void))
{
    return attention_case_took_opt(a, packed, NULL, v, calls);
}

static int attention_case_took_tc(const struct packed_attention_shape *a, int packed, const char *v)
{
    return attention_case_took(a, packed, v, backend_cuda_attention_tc_calls);
}

static void check_attention_tc(void)
{
    const enum dtype dts[2] = {DTYPE_BF16, DTYPE_F16};
    const double tols[2] = {1e-2, 5e-3};
    for (int d = 0; d < 2; d++) {
        const char *tag = dts[d] == DTYPE_BF16 ? "_bf16" : "_fp16";
        use_act(dts[d], tols[d], tag);
        /* fp16: the packed cases (check_packing's fp16 attention takes the tensor cores too) */
        for (size_t k = 0; k < sizeof TC_ATTENTION_SHAPES / sizeof TC_ATTENTION_SHAPES[0]; k += 1 + d) {
            const struct packed_attention_shape *a = &TC_ATTENTION_SHAPES[k];
            const int packed = k % 2 == 0;
            char v[64];
            snprintf(v, sizeof v, "_tc_T%d_nh%d_kv%d_hs%d%s", a->T, a->NH, a->NKV, a->hs, packed ? "_packed" : "");
            check_value(named2("attention_tc_taken", v), attention_case_took_tc(a, packed, v),
                        "an attention call of this case did not run on tensor cores");
        }
    }
    /* the FP32 kernel's cases: fp32 activations; hs 72 (not a multiple of 16) in bf16; SHARDLM_ATTN_TC=0 */
    const struct packed_attention_shape f32_case = {2, 70, 4, 2, 64, 0}, odd_case = {2, 70, 2, 1, 72, 0};
    use_act(DTYPE_F32, TOL, "");
    check_value("attention_tc_not_taken_fp32", !attention_case_took_tc(&f32_case, 1, "_tc_fallback_fp32") &&
                                                   backend_cuda_attention_tc_calls() > 0,
                "fp32 activations ran on the tensor cores");
    use_act(DTYPE_BF16, 1e-2, "_bf16");
    long before = backend_cuda_attention_tc_calls();
    attention_case_took_tc(&odd_case, 1, "_tc_fallback_hs72");
    check_value(named("attention_tc_not_taken_hs72"), backend_cuda_attention_tc_calls() == before,
                "head size 72 ran on the tensor cores");
    setenv("SHARDLM_ATTN_TC", "0", 1);
    before = backend_cuda_attention_tc_calls();
    attention_case_took_tc(&f32_case, 1, "_tc_off");
    check_value(named("attention_tc_not_taken_when_off"), backend_cuda_attention_tc_calls() == before,
                "SHARDLM_ATTN_TC=0 still ran on the tensor cores");
    unsetenv("SHARDLM_ATTN_TC");
    use_act(DTYPE_F32, TOL, "");
}

/* ---- attention variants: sliding window, soft-cap, scale (backend.h struct attn_opts) ------------------------ */

long backend_cuda_attention_cudnn_calls(void); /* cudnn_attention.h */
long cudnn_attention_library(const char **why);

/* Windows shorter than T and than a tile (5) or across tiles and 64-row blocks (40), alone and in packed rows
 * (window and sample boundaries both cutting), grouped-query; a soft-cap and a scale of their own, alone and with
 * a window. */
static const struct attn_opts ATTN_VARIANTS[] = {{5, 0.0f, 0.0f}, {40, 0.0f, 0.0f}, {0, 2.0f, 0.2f}, {16, 5.0f, 0.0f}};
/* T past the FP32 kernel's 32-row blocks and 64-row tiles, the tensor cores' 64-row blocks and their key tiles (64
 * at hs 64, 32 at 128); the second shape takes every other variant (check_kernels' time under tests/cudaemu) */
static const struct packed_attention_shape VARIANT_SHAPES[] = {{1, 100, 4, 2, 64, 0}, {1, 80, 2, 1, 128, 0}};

/* Every variant at every shape, packed and not, against the CPU: fp32 through the FP32 kernel, bf16 and fp16
 * through the tensor cores (each call taken by them: SHARDLM_ATTENTION=tc), and, where cuDNN is there, through
 * cuDNN, which takes the windows and scales and must leave the soft-capped variants to the tensor cores
 * (cudnn_attention.h). */
static void check_attention_variants(void)
{
    const enum dtype dts[3] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16};
    const double tols[3] = {TOL, 1e-2, 5e-3};
    const char *tags[3] = {"", "_bf16", "_fp16"};
    const long cudnn = cudnn_attention_library(NULL);
    for (int d = 0; d < 3; d++) {
        use_act(dts[d], tols[d], tags[d]);
        for (int want_cudnn = 0; want_cudnn <= (d > 0 && cudnn > 0); want_cudnn++) {
            setenv("SHARDLM_ATTENTION", want_cudnn ? "cudnn" : d ? "tc" : "fp32", 1);
            for (size_t k = 0; k < sizeof VARIANT_SHAPES / sizeof VARIANT_SHAPES[0]; k++)
                for (size_t o = k; o < sizeof ATTN_VARIANTS / sizeof ATTN_VARIANTS[0]; o += 1 + k)
                    for (int packed = 0; packed <= 1; packed++) {
                        const struct packed_attention_shape *a = &VARIANT_SHAPES[k];
                        const struct attn_opts *opt = &ATTN_VARIANTS[o];
                        char v[96];
                        snprintf(v, sizeof v, "_%s_T%d_nh%d_kv%d_hs%d_window%d_softcap%g_scale%g%s",
                                 want_cudnn ? "cudnn" : d ? "tc" : "fp32", a->T, a->NH, a->NKV, a->hs, opt->window,
                                 (double)opt->softcap, (double)opt->scale, packed ? "_packed" : "");
                        const long tc_before = backend_cuda_attention_tc_calls();
                        const int took_cudnn =
                            attention_case_took_opt(a, packed, opt, v, backend_cuda_attention_cudnn_calls);
                        const long tc = backend_cuda_attention_tc_calls() - tc_before;
                        if (d == 0)
                            check_value(named2("attention_variant_fp32_kernel", v), tc == 0 && !took_cudnn,
                                        "fp32 activations ran elsewhere than the FP32 kernel");
                        else if (!want_cudnn || opt->softcap > 0.0f)
                            check_value(named2("attention_variant_taken_tc", v), tc == 2 && !took_cudnn,
                                        "an attention call of this case did not run on tensor cores");
                        else
                            check_value(named2("attention_variant_taken_cudnn", v), took_cudnn,
                                        "an attention call of this case did not run through cuDNN");
                    }
        }
    }
    unsetenv("SHARDLM_ATTENTION");
    use_act(DTYPE_F32, TOL, "");
}

/* ---- attention through cuDNN (src/backend/cuda/cudnn_attention.cu, issue 45) -------------------------------- */

long cudnn_attention_library(const char **why);
void attention_lse_transpose(float *dst, const float *src, int B, int T, int NH, int to_token_major,
                             cudaStream_t stream);

/* Packed rows' statistics to cuDNN's token-major layout and back (cudnn_attention.h): element (b, h, t) of lse
 * at (b T + t) NH + h, and the round trip the same bits. */
static void check_lse_transpose(void)
{
    const int B = 3, T = 37, NH = 5;
    const size_t n = (size_t)B * T * NH;
    float *lse = host_random(n, 1), *want = malloc(n * 4);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++)
                want[((size_t)b * T + t) * NH + h] = lse[((size_t)b * NH + h) * T + t];
    float *d_lse = to_device(lse, n * 4), *d_tok = poisoned(n), *d_back = poisoned(n);
    attention_lse_transpose(d_tok, d_lse, B, T, NH, 1, 0);
    compare("attention_lse_to_token_major", want, d_tok, n, 0.0);
    attention_lse_transpose(d_back, d_tok, B, T, NH, 0, 0);
    check_value("attention_lse_round_trip_bits", same_bits(d_back, d_lse, n * 4),
                "lse to token-major and back is not the same bits");
    cudaFree(d_lse), cudaFree(d_tok), cudaFree(d_back);
    free(lse), free(want);
}

/* Head sizes 64 and 128; T = 1, 63, 64, 192 (T mod 128 = 64 has broken cuDNN before) and 2048; grouped-query
 * (NKV < NH, one kv head for all) and not; the GPT-2 call; packed rows (each sample a ragged sequence). */
static const struct packed_attention_shape CUDNN_ATTENTION_SHAPES[] = {
    {2, 1, 4, 4, 64, 0},    {2, 63, 4, 4, 64, 1},  {2, 64, 4, 2, 64, 0},   {2, 192, 8, 2, 64, 0},
    {1, 1, 4, 1, 128, 0},   {2, 63, 4, 1, 128, 0}, {2, 192, 4, 4, 128, 0}, {1, 2048, 8, 2, 128, 0},
    {1, 2048, 4, 1, 128, 0},
};
/* which of them also run with packed rows */
static const int CUDNN_PACKED[] = {0, 1, 0, 1, 0, 1, 1, 0, 1};

static int attention_case_took_cudnn(const struct packed_attention_shape *a, int packed, const char *v)
{
    return attention_case_took(a, packed, v, backend_cuda_attention_cudnn_calls);
}

/* cuDNN's forward, then the tensor-core backward from its log-sum-exp (so both keep the same one: either backward
 * follows either forward), and cuDNN's backward twice to the same bits (deterministic: bit-exact resume). */
static void check_cudnn_lse_and_determinism(int packed)
{
    const int B = 2, T = 192, NH = 4, NKV = 2, hs = 64, N = B * T;
    const size_t nqkv = (size_t)N * (NH + 2 * NKV) * hs, nout = (size_t)N * NH * hs;
    const char *v = packed ? "_cudnn_mixed_packed" : "_cudnn_mixed";
    float *qkv = act_round(host_random(nqkv, 1.5f), nqkv), *d_qkv = act_to_device(qkv, nqkv);
    int32_t *pos = packed ? packed_positions(B, T) : NULL, *d_pos = pos ? to_device(pos, (size_t)N * 4) : NULL;
    float *att = malloc(cpu_attention_saved(B, T, NH) + 4), *out = malloc(nout * 4);
    float *scratch = malloc((cpu_attention_scratch(T, NH) + 1) * 4), *dqkv = malloc(nqkv * 4);
    float *dout = act_round(host_random(nout, 1), nout), *d_dout = act_to_device(dout, nout);
    float *d_out = act_poisoned(nout), *d_att = poisoned(backend_attention_saved(B, T, NH) / 4 + 1);
    float *d_dqkv = act_poisoned(nqkv), *d_dqkv2 = act_poisoned(nqkv);
    cpu_attention_gqa_forward(out, att, qkv, scratch, pos, B, T, NH, NKV, hs, NULL);
    cpu_attention_gqa_backward(dqkv, dout, qkv, att, out, scratch, pos, B, T, NH, NKV, hs, NULL);
    setenv("SHARDLM_ATTENTION", "cudnn", 1);
    backend_attention_gqa_forward(d_out, d_att, d_qkv, NULL, d_pos, B, T, NH, NKV, hs, NULL);
    compare(named2("attention_cudnn_lse", v), att, d_att, (size_t)B * NH * T, LSE_TOL);
    setenv("SHARDLM_ATTENTION", "tc", 1);
    backend_attention_gqa_backward(d_dqkv, d_dout, d_qkv, d_att, d_out, NULL, d_pos, B, T, NH, NKV, hs, NULL);
    compare_act(named2("attention_tc_backward_after_cudnn_forward", v), dqkv, d_dqkv, nqkv, g_tol);
    setenv("SHARDLM_ATTENTION", "cudnn", 1);
    backend_attention_gqa_backward(d_dqkv, d_dout, d_qkv, d_att, d_out, NULL, d_pos, B, T, NH, NKV, hs, NULL);
    backend_attention_gqa_backward(d_dqkv2, d_dout, d_qkv, d_att, d_out, NULL, d_pos, B, T, NH, NKV, hs, NULL);
    check_value(named2("attention_cudnn_backward_deterministic", v), same_bits(d_dqkv, d_dqkv2, act_bytes(nqkv)),
                "cuDNN's backward gave other bits the second time");
    cudaFree(d_qkv), cudaFree(d_pos), cudaFree(d_dout), cudaFree(d_out), cudaFree(d_att), cudaFree(d_dqkv);
    cudaFree(d_dqkv2);
    free(qkv), free(pos), free(att), free(out), free(scratch), free(dqkv), free(dout);
}

/* Every case in bf16 and fp16 against the CPU's FP32 attention, each call taken by cuDNN. Where cuDNN is not
 * there (no library, tests/cudaemu), the cases are skipped with the reason, and one case checks that the
 * tensor-core kernel runs in its place. */
static void check_attention_cudnn(void)
{
    const char *missing = NULL;
    check_lse_transpose();
    const long version = cudnn_attention_library(&missing);
    setenv("SHARDLM_ATTENTION", "cudnn", 1);
    if (!version) {
        printf("skip attention_cudnn: %s\n", missing ? missing : "cuDNN unavailable");
        use_act(DTYPE_BF16, 1e-2, "_bf16");
        const long tc_before = backend_cuda_attention_tc_calls();
        const int took = attention_case_took_cudnn(&TC_ATTENTION_SHAPES[0], 1, "_cudnn_unavailable");
        check_value("attention_cudnn_unavailable_runs_tc", !took && backend_cuda_attention_tc_calls() - tc_before == 2,
                    "without cuDNN the attention did not run on the tensor cores");
        use_act(DTYPE_F32, TOL, "");
        return;
    }
    printf("cuDNN %ld\n", version);
    const enum dtype dts[2] = {DTYPE_BF16, DTYPE_F16};
    const double tols[2] = {1e-2, 5e-3};
    for (int d = 0; d < 2; d++) {
        use_act(dts[d], tols[d], dts[d] == DTYPE_BF16 ? "_bf16" : "_fp16");
        for (size_t k = 0; k < sizeof CUDNN_ATTENTION_SHAPES / sizeof CUDNN_ATTENTION_SHAPES[0]; k++)
            for (int packed = 0; packed <= CUDNN_PACKED[k]; packed++) {
                const struct packed_attention_shape *a = &CUDNN_ATTENTION_SHAPES[k];
                char v[64];
                snprintf(v, sizeof v, "_cudnn_T%d_nh%d_kv%d_hs%d%s%s", a->T, a->NH, a->NKV, a->hs,
                         a->gpt2_call ? "_gpt2" : "", packed ? "_packed" : "");
                check_value(named2("attention_cudnn_taken", v), attention_case_took_cudnn(a, packed, v),
                            "an attention call of this case did not run through cuDNN");
            }
        check_cudnn_lse_and_determinism(0);
        check_cudnn_lse_and_determinism(1);
    }
    /* fp32 activations: not cuDNN's (the FP32 kernel runs) */
    use_act(DTYPE_F32, TOL, "");
    setenv("SHARDLM_ATTENTION", "cudnn", 1);
    check_value("attention_cudnn_not_taken_fp32", !attention_case_took_cudnn(&TC_ATTENTION_SHAPES[0], 0, "_cudnn_fp32"),
                "fp32 activations ran through cuDNN");
}

/* The packed position-table gradient over more than one window of the device's fp32 sums (T x C beyond its
 * 2^20 floats: columns in windows), fp32, one sequence. */
static void check_packed_wpe_windows(void)
{
    enum { T = 1000, C = 1050, V = 16 };
    int32_t *pos = packed_positions(1, T), *tokens = malloc(T * sizeof *tokens);
    for (int i = 0; i < T; i++)
        tokens[i] = i % V;
    float *dout = host_random((size_t)T * C, 1), *dwte = host_random((size_t)V * C, 1);
    float *dwpe = host_random((size_t)T * C, 1);
    int32_t *d_pos = to_device(pos, T * 4), *d_tokens = to_device(tokens, T * 4);
    float *d_dout = to_device(dout, (size_t)T * C * 4), *d_dwte = to_device(dwte, (size_t)V * C * 4);
    float *d_dwpe = to_device(dwpe, (size_t)T * C * 4);
    cpu_embedding_backward(dwte, dwpe, dout, tokens, pos, 1, T, C);
    backend_embedding_backward(d_dwte, d_dwpe, d_dout, d_tokens, d_pos, 1, T, C);
    compare("embedding_backward_packed_dwpe_windows", dwpe, d_dwpe, (size_t)T * C, TOL);
    cudaFree(d_pos), cudaFree(d_tokens), cudaFree(d_dout), cudaFree(d_dwte), cudaFree(d_dwpe);
    free(pos), free(tokens), free(dout), free(dwte), free(dwpe);
}

/* ---- LoRA (issue 19) ------------------------------------------------------------------------------ */

/* The element i of device [A] memory (a slice's first column). */
static float *act_at(float *device, size_t i) { return (float *)((char *)device + act_bytes(i)); }

/* How many elements of the device [A] buffer differ in their bits from the host values rounded to the activation
 * dtype; only the columns c of rows of ld with cols[c] set when cols is given, else all n. */
static size_t act_bits_differ(const float *device, const float *want, size_t n, int ld, const unsigned char *cols)
{
    const size_t es = act_bytes(1);
    unsigned char *got = malloc(act_bytes(n)), *ref = malloc(act_bytes(n));
    cuda_ok(cudaDeviceSynchronize(), "act_bits_differ");
    cuda_ok(cudaMemcpy(got, device, act_bytes(n), cudaMemcpyDeviceToHost), "act_bits_differ");
    dtype_convert(ref, g_act, want, DTYPE_F32, n);
    size_t diff = 0;
    for (size_t i = 0; i < n; i++)
        if (!cols || cols[i % (size_t)ld])
            diff += memcmp(got + i * es, ref + i * es, es) != 0;
    free(got), free(ref);
    return diff;
}

/* compare_act on the columns [c0, c0 + w) of N rows of ld: want the whole host buffer, device the whole [A] one. */
static void compare_act_cols(const char *name, const float *want, const float *device, int N, int ld, int c0, int w,
                             double tol)
{
    const size_t n = (size_t)N * ld, m = (size_t)N * w;
    void *tmp = malloc(act_bytes(n));
    float *wide = malloc(n * sizeof *wide), *got = malloc(m * sizeof *got), *ref = malloc(m * sizeof *ref);
    cuda_ok(cudaDeviceSynchronize(), name);
    cuda_ok(cudaMemcpy(tmp, device, act_bytes(n), cudaMemcpyDeviceToHost), name);
    dtype_convert(wide, DTYPE_F32, tmp, g_act, n);
    for (int i = 0; i < N; i++)
        for (int c = 0; c < w; c++) {
            got[(size_t)i * w + c] = wide[(size_t)i * ld + c0 + c];
            ref[(size_t)i * w + c] = want[(size_t)i * ld + c0 + c];
        }
    float *d = to_device(got, m * sizeof *got);
    compare(name, ref, d, m, tol);
    cudaFree(d);
    free(tmp), free(wide), free(got), free(ref);
}

/* name, layer j's index when the group has more than one layer, suffix, then the variant and the tag. */
static const char *named_layer(const char *name, int k, int j, const char *suffix, const char *variant)
{
    static char buf[256];
    char index[16] = "";
    if (k > 1)
        snprintf(index, sizeof index, "%d", j);
    snprintf(buf, sizeof buf, "%s%s%s%s%s", name, index, suffix, variant, g_tag);
    return buf;
}

enum { LORA_MAX_GROUP = 3 };

/* backend_lora_forward and backend_lora_backward against the CPU backend, for one layer or a group of three that
 * read one x (N, C): A (k r, C) the stacked A_j, B_j (OC_j, r), scale alpha / r. One layer (group 0): its output y
 * and gradient dy are the middle OC of rows of 3 OC (the k slice of a fused q|k|v output). A group (group 1, q|k|v
 * as grouped-query attention has it): layers of OC, OC/2 and OC/2 side by side at columns 0, OC and 3 OC / 2 of
 * rows of 2 OC + 5, the last 5 columns belonging to none. Every column outside the slices must come back bit for
 * bit (and dy's, random, must not be read); every slice, t (N, k r), dt, dx, dA and each dB_j are compared. t, dt
 * and scratch are poisoned (overwritten); dx, dA, dB start random (accumulated); dA, dB [G] in the activation dtype
 * when half_grads. p 0: d NULL, and a d of p = 0 gives the same bits; p > 0 (one layer only): the mask with row0 5
 * and T tokens a row, drop(x) in scratch equal to the CPU's to the bit, about p of it dropped. dA and every dB NULL
 * (frozen adapters): the same dx bits. */
static void check_lora(float p, int r, int half_grads, struct shape sh, int group, const char *variant)
{
    const int N = sh.B * sh.T, C = sh.C, OC = sh.OC, k = group ? 3 : 1, kr = k * r;
    const int LD = group ? 2 * OC + 5 : 3 * OC;
    int oc[LORA_MAX_GROUP] = {OC}, at[LORA_MAX_GROUP] = {OC};
    if (group) {
        oc[0] = OC, oc[1] = OC / 2, oc[2] = OC / 2;
        at[0] = 0, at[1] = OC, at[2] = OC + OC / 2;
    }
    unsigned char *outside = malloc((size_t)LD); /* the columns of no layer */
    memset(outside, 1, (size_t)LD);
    for (int j = 0; j < k; j++)
        memset(outside + at[j], 0, (size_t)oc[j]);
    const size_t NC = (size_t)N * C, NY = (size_t)N * LD, NR = (size_t)N * kr, RC = (size_t)kr * C;
    size_t OR[LORA_MAX_GROUP];
    const float scale = 16.0f / r;
    const struct lora_dropout drop = {p, 0x243F6A8885A308D3ull, 5, sh.T}, no_drop = {0.0f, 0x243F6A8885A308D3ull, 5,
                                                                                     sh.T};
    const struct lora_dropout *d = p > 0 ? &drop : NULL;
    char why[160];
    if (half_grads)
        backend_set_grad_dtype(g_act);
    float *x = act_round(host_random(NC, 1), NC), *A = act_round(host_random(RC, 0.2f), RC);
    float *B[LORA_MAX_GROUP], *d_B[LORA_MAX_GROUP];
    for (int j = 0; j < k; j++) {
        OR[j] = (size_t)oc[j] * r;
        B[j] = act_round(host_random(OR[j], 0.2f), OR[j]);
        d_B[j] = act_to_device(B[j], OR[j]);
    }
    float *y0 = act_round(host_random(NY, 1), NY);
    float *d_x = act_to_device(x, NC), *d_A = act_to_device(A, RC);
    float *d_y = act_to_device(y0, NY), *y = malloc(NY * 4), *t = malloc(NR * 4), *scratch = malloc(NC * 4);
    memcpy(y, y0, NY * 4);
    float *d_t = act_poisoned(NR), *d_scratch = p > 0 ? act_poisoned(NC) : NULL;
    struct lora_out out[LORA_MAX_GROUP], d_out[LORA_MAX_GROUP];
    for (int j = 0; j < k; j++) {
        out[j] = (struct lora_out){y + at[j], B[j], NULL, oc[j]};
        d_out[j] = (struct lora_out){act_at(d_y, at[j]), d_B[j], NULL, oc[j]};
    }
    cpu_lora_forward(t, scratch, x, A, out, k, LD, scale, d, N, C, r);
    backend_lora_forward(d_t, d_scratch, d_x, d_A, d_out, k, LD, scale, d, N, C, r);
    for (int j = 0; j < k; j++)
        compare_act_cols(named_layer("lora_forward_y", k, j, "", variant), y, d_y, N, LD, at[j], oc[j], g_tol);
    compare_act(named2("lora_forward_t", variant), t, d_t, NR, g_tol);
    const size_t moved = act_bits_differ(d_y, y0, NY, LD, outside);
    snprintf(why, sizeof why, "%zu elements outside the slices changed", moved);
    check_value(named2("lora_forward_other_columns_untouched", variant), moved == 0, why);
    if (p > 0) {
        size_t dropped = 0, nonzero = 0;
        for (size_t i = 0; i < NC; i++)
            if (x[i] != 0.0f)
                nonzero++, dropped += scratch[i] == 0.0f;
        const double frac = (double)dropped / (double)nonzero;
        const size_t diff = act_bits_differ(d_scratch, scratch, NC, C, NULL);
        snprintf(why, sizeof why, "%zu of %zu elements of drop(x) differ from the CPU's; dropped %.3f (p %.2f)", diff,
                 NC, frac, p);
        check_value(named2("lora_forward_dropout_mask_bits", variant), diff == 0 && fabs(frac - p) < 0.05, why);
    } else {
        float *d_y_p0 = act_to_device(y0, NY), *d_t_p0 = act_poisoned(NR);
        struct lora_out p0_out[LORA_MAX_GROUP];
        for (int j = 0; j < k; j++)
            p0_out[j] = (struct lora_out){act_at(d_y_p0, at[j]), d_B[j], NULL, oc[j]};
        backend_lora_forward(d_t_p0, NULL, d_x, d_A, p0_out, k, LD, scale, &no_drop, N, C, r);
        check_value(named2("lora_forward_p0_same_bits_as_no_dropout", variant),
                    same_bits(d_y_p0, d_y, act_bytes(NY)) && same_bits(d_t_p0, d_t, act_bytes(NR)),
                    "a dropout of p = 0 changed y or t");
        cudaFree(d_y_p0), cudaFree(d_t_p0);
    }

    /* the backward from the forward's t as both sides hold it (rounded to the activation dtype) */
    act_round(t, NR);
    float *d_t_in = act_to_device(t, NR);
    float *dy = act_round(host_random(NY, 1), NY), *d_dy = act_to_device(dy, NY);
    float *dx = act_round(host_random(NC, 1), NC), *d_dx = act_to_device(dx, NC), *d_dx_frozen = act_to_device(dx, NC);
    float *dA = host_random(RC, 1), *dB[LORA_MAX_GROUP], *d_dB[LORA_MAX_GROUP];
    if (half_grads)
        act_round(dA, RC);
    float *d_dA = half_grads ? act_to_device(dA, RC) : to_device(dA, RC * 4);
    for (int j = 0; j < k; j++) {
        dB[j] = host_random(OR[j], 1);
        if (half_grads)
            act_round(dB[j], OR[j]);
        d_dB[j] = half_grads ? act_to_device(dB[j], OR[j]) : to_device(dB[j], OR[j] * 4);
    }
    float *dt = malloc(NR * 4), *d_dt = act_poisoned(NR), *d_dt_frozen = act_poisoned(NR);
    float *d_scratch_frozen = p > 0 ? act_poisoned(NC) : NULL;
    struct lora_out frozen[LORA_MAX_GROUP];
    for (int j = 0; j < k; j++) {
        out[j] = (struct lora_out){dy + at[j], B[j], dB[j], oc[j]};
        d_out[j] = (struct lora_out){act_at(d_dy, at[j]), d_B[j], d_dB[j], oc[j]};
        frozen[j] = (struct lora_out){act_at(d_dy, at[j]), d_B[j], NULL, oc[j]};
    }
    cpu_lora_backward(dx, dA, dt, scratch, x, t, A, out, k, LD, scale, d, N, C, r);
    backend_lora_backward(d_dx, d_dA, d_dt, d_scratch, d_x, d_t_in, d_A, d_out, k, LD, scale, d, N, C, r);
    compare_act(named2("lora_backward_dx_accumulates", variant), dx, d_dx, NC, g_tol);
    compare_act(named2("lora_backward_dt", variant), dt, d_dt, NR, g_tol);
    (half_grads ? compare_act : compare)(named2("lora_backward_dA_accumulates", variant), dA, d_dA, RC, g_tol);
    for (int j = 0; j < k; j++)
        (half_grads ? compare_act : compare)(named_layer("lora_backward_dB", k, j, "_accumulates", variant), dB[j],
                                             d_dB[j], OR[j], g_tol);
    backend_lora_backward(d_dx_frozen, NULL, d_dt_frozen, d_scratch_frozen, d_x, d_t_in, d_A, frozen, k, LD, scale, d,
                          N, C, r);
    check_value(named2("lora_backward_frozen_same_dx", variant), same_bits(d_dx_frozen, d_dx, act_bytes(NC)),
                "dA and dB NULL changed dx");
    backend_set_grad_dtype(DTYPE_F32);
    for (int j = 0; j < k; j++) {
        cudaFree(d_B[j]), cudaFree(d_dB[j]);
        free(B[j]), free(dB[j]);
    }
    cudaFree(d_x), cudaFree(d_A), cudaFree(d_y), cudaFree(d_t), cudaFree(d_scratch);
    cudaFree(d_t_in), cudaFree(d_dy), cudaFree(d_dx), cudaFree(d_dx_frozen), cudaFree(d_dA);
    cudaFree(d_dt), cudaFree(d_dt_frozen), cudaFree(d_scratch_frozen);
    free(x), free(A), free(y0), free(y), free(t), free(scratch), free(dy), free(dx), free(dA);
    free(dt), free(outside);
}

/* LoRA with activations in dt (and its gradients [G] when half_grads): one layer without dropout and with p = 0.3,
 * rank 8 and an odd rank at the odd shape; a q|k|v group of three at both shapes. */
static void check_lora_kernels(enum dtype dt, double tol, const char *tag, int half_grads)
{
    use_act(dt, tol, tag);
    check_lora(0.0f, 8, half_grads, EVEN, 0, "");
    check_lora(0.3f, 8, half_grads, EVEN, 0, "_p0.3");
    check_lora(0.0f, 5, half_grads, ODD, 0, "_odd_r5");
    check_lora(0.3f, 5, half_grads, ODD, 0, "_odd_r5_p0.3");
    check_lora(0.0f, 8, half_grads, EVEN, 1, "_qkv");
    check_lora(0.0f, 5, half_grads, ODD, 1, "_qkv_odd_r5");
    use_act(DTYPE_F32, TOL, "");
}

/* ---- the optimizer: fused AdamW and the gradient statistics ------------------------------------ */

/* 40 ranges (more than one launch's group), sizes from 0 to beyond a chunk,
 * against adamw_update on the host: the same bits, for every output dtype
 * and both decay modes; and backend_sum_squares_multi against the sum of the
 * CPU backend's per-range sums. */
/* bitsandbytes' 4-bit dequantization (backend_dequant4): NF4 and FP4, with and without double quantization (from
 * a tensor's start and from a block inside a nested block), into fp32, bf16 and fp16, an odd length (a short last
 * block, a pad nibble): the device's bytes equal the CPU's. */
static void check_dequant4(void)
{
    const size_t n = (size_t)QUANT4_BLOCK * (2 * QUANT4_NESTED_BLOCK + 7) + 33, blocks = quant4_blocks(n);
    const size_t nested_blocks = quant4_nested_blocks(blocks), bytes = quant4_code_bytes(n);
    uint8_t *codes = malloc(bytes), *qabsmax = malloc(blocks);
    for (size_t i = 0; i < bytes; i++)
        codes[i] = (uint8_t)(uniform() * 128.0f + 128.0f);
    for (size_t b = 0; b < blocks; b++)
        qabsmax[b] = (uint8_t)(uniform() * 128.0f + 128.0f);
    float *absmax = host_random(blocks, 2.0f), *nested = host_random(nested_blocks, 0.05f);
    for (size_t b = 0; b < blocks; b++)
        absmax[b] = fabsf(absmax[b]) + 1e-3f;
    uint8_t *d_codes = to_device(codes, bytes), *d_qabsmax = to_device(qabsmax, blocks);
    float *d_absmax = to_device(absmax, blocks * 4), *d_nested = to_device(nested, nested_blocks * 4);
    const float offset = 0.0371f;
    float *d_offset = to_device(&offset, sizeof offset);
    const enum dtype outs[3] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16};
    void *want = malloc(n * 4), *got = malloc(n * 4);
    void *d_out = backend_mem_alloc(SPACE_DEVICE, n * 4, "check_kernels");
    /* nested: from a tensor's start, and a rank's share that starts 100 blocks into a nested block (its
     * nested_absmax from that nested block: 3 of them) */
    const size_t firsts[2] = {0, 3 * QUANT4_NESTED_BLOCK + 100};
    for (int type = 0; type < 2; type++)
        for (int variant = 0; variant < 3; variant++)
            for (int o = 0; o < 3; o++) {
                const bool double_quant = variant > 0;
                const size_t first = firsts[variant == 2];
                const size_t out_bytes = n * (size_t)dtype_size(outs[o]);
                cpu_dequant4(want, outs[o], codes, absmax, double_quant ? qabsmax : NULL, nested, &offset, first, n,
                             type);
                backend_dequant4(d_out, outs[o], d_codes, d_absmax, double_quant ? d_qabsmax : NULL, d_nested, d_offset,
                                 first, n, type);
                backend_synchronize();
                cuda_ok(cudaMemcpy(got, d_out, out_bytes, cudaMemcpyDeviceToHost), "dequant4 result");
                char name[64];
                snprintf(name, sizeof name, "dequant4_%s%s_%s", quant4_type_name((enum quant4_type)type),
                         variant == 2 ? "_nested_phase" : double_quant ? "_nested" : "", dtype_name(outs[o]));
                check_value(name, memcmp(want, got, out_bytes) == 0, "the device's bytes differ from the CPU's");
            }
    backend_mem_free(SPACE_DEVICE, d_out, n * 4);
    cudaFree(d_codes), cudaFree(d_qabsmax), cudaFree(d_absmax), cudaFree(d_nested), cudaFree(d_offset);
    free(codes), free(qabsmax), free(absmax), free(nested), free(want), free(got);
}

static void check_optimizer(void)
{
    enum { RANGES = 40 };
    size_t n[RANGES], total = 0;
    for (int k = 0; k < RANGES; k++) {
        n[k] = k == 3 ? 0 : (size_t)(k * 997 + 1) % 9001 + (k == 7 ? 20000 : 0);
        total += n[k];
    }
    float *p0 = host_random(total, 1), *m0 = host_random(total, 0.01f), *v0 = host_random(total, 0.001f);
    float *g = host_random(total, 3);
    for (size_t i = 0; i < total; i++)
        v0[i] = fabsf(v0[i]);
    const enum dtype outs[3] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16};
    for (int mode = 0; mode < 2; mode++)
        for (int o = 0; o < 3; o++) {
            struct adamw_hparams hp = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                       .adam_w_mode = mode == 0, .bias_correction1 = 1 - 0.9f * 0.9f,
                                       .bias_correction2 = 1 - 0.95f * 0.95f, .grad_scale = 0.37f};
            const size_t es = (size_t)dtype_size(outs[o]);
            float *hp_p = malloc(total * 4), *hm = malloc(total * 4), *hv = malloc(total * 4);
            unsigned char *hout = malloc(total * es), *gout = malloc(total * es);
            memcpy(hp_p, p0, total * 4), memcpy(hm, m0, total * 4), memcpy(hv, v0, total * 4);
            float *dp = to_device(p0, total * 4), *dm = to_device(m0, total * 4), *dv = to_device(v0, total * 4);
            float *dg = to_device(g, total * 4);
            void *dout = poisoned(total * es / 4 + 1);
            struct adamw_range r[RANGES];
            size_t at = 0;
            for (int k = 0; k < RANGES; k++) {
                float wd = k % 3 == 0 ? 0.0f : 0.1f;
                hp.weight_decay = wd;
                adamw_update(hp_p + at, hm + at, hv + at, g + at, n[k], &hp, hout + at * es, outs[o]);
                r[k] = (struct adamw_range){dp + at, dm + at, dv + at, dg + at, (char *)dout + at * es, n[k], wd};
                at += n[k];
            }
            backend_adamw(r, RANGES, &hp, outs[o]);
            float *gp = malloc(total * 4), *gm = malloc(total * 4), *gv = malloc(total * 4);
            cuda_ok(cudaMemcpy(gp, dp, total * 4, cudaMemcpyDeviceToHost), "adamw");
            cuda_ok(cudaMemcpy(gm, dm, total * 4, cudaMemcpyDeviceToHost), "adamw");
            cuda_ok(cudaMemcpy(gv, dv, total * 4, cudaMemcpyDeviceToHost), "adamw");
            cuda_ok(cudaMemcpy(gout, dout, total * es, cudaMemcpyDeviceToHost), "adamw");
            size_t diff = 0;
            for (size_t i = 0; i < total; i++)
                diff += memcmp(&gp[i], &hp_p[i], 4) != 0 || memcmp(&gm[i], &hm[i], 4) != 0 ||
                        memcmp(&gv[i], &hv[i], 4) != 0 || memcmp(gout + i * es, hout + i * es, es) != 0;
            char name[64], why[128];
            snprintf(name, sizeof name, "adamw_%s_%s", mode == 0 ? "decoupled" : "l2", dtype_name(outs[o]));
            snprintf(why, sizeof why, "%zu of %zu elements differ from adamw_update's bits", diff, total);
            check_value(name, diff == 0, why);
            cudaFree(dp), cudaFree(dm), cudaFree(dv), cudaFree(dg), cudaFree(dout);
            free(hp_p), free(hm), free(hv), free(hout), free(gout), free(gp), free(gm), free(gv);
        }
    float *dg = to_device(g, total * 4);
    const float *x[RANGES], *hx[RANGES];
    size_t at = 0;
    double want = 0.0;
    for (int k = 0; k < RANGES; k++) {
        x[k] = dg + at, hx[k] = g + at;
        want += n[k] ? cpu_sum_squares(hx[k], n[k]) : 0.0;
        at += n[k];
    }
    double got = backend_sum_squares_multi(x, n, RANGES);
    char why[128];
    snprintf(why, sizeof why, "got %.17g want %.17g", got, want);
    check_value("sum_squares_multi", fabs(got - want) <= 1e-12 * want, why);
    cudaFree(dg);
    free(p0), free(m0), free(v0), free(g);
}

/* ---- [G]: weight gradients in the parameter dtype (backend_set_grad_dtype) ------------------------ */

/* Every kernel that accumulates a weight or bias gradient, with the gradient
 * in half precision (as a device's unit gradient buffers hold it at ZeRO
 * stages 2-3): the CPU backend accumulates the same half-rounded start in
 * fp32; the device result, widened, must be within the dtype's tolerance. */
static void check_half_grads(enum dtype dt, double tol, const char *tag, struct shape sh)
{
    use_act(dt, tol, tag);
    backend_set_grad_dtype(dt);
    const int B = sh.B, T = sh.T, C = sh.C, OC = sh.OC, Vp = sh.Vp, N = B * T;
    const size_t NC = (size_t)N * C, CO = (size_t)C * OC;
    float *inp = act_round(host_random(NC, 1), NC), *w = act_round(host_random(CO, 0.2f), CO);
    float *dout = act_round(host_random((size_t)N * OC, 1), (size_t)N * OC);
    float *d_inp = act_to_device(inp, NC), *d_w = act_to_device(w, CO), *d_dout = act_to_device(dout, (size_t)N * OC);
    float *dinp = malloc(NC * 4), *d_dinp = act_poisoned(NC);
    float *dw = act_round(host_random(CO, 1), CO), *db = act_round(host_random(OC, 1), OC);
    float *d_dw = act_to_device(dw, CO), *d_db = act_to_device(db, OC);
    cpu_matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC);
    backend_matmul_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, N, C, OC);
    compare_act(named("grad_matmul_backward_dweight"), dw, d_dw, CO, tol);
    compare_act(named("grad_matmul_backward_dbias"), db, d_db, OC, tol);
    cpu_matmul_backward_transposed(dinp, dw, dout, inp, w, N, C, OC);
    backend_matmul_backward_transposed(d_dinp, d_dw, d_dout, d_inp, d_w, N, C, OC);
    compare_act(named("grad_matmul_backward_transposed_dweight"), dw, d_dw, CO, tol);
    /* the fused MLP backward: pre is the GELU input, inp = GELU(pre) */
    float *pre = act_round(host_random(NC, 1), NC), *d_pre = act_to_device(pre, NC);
    float *gin = malloc(NC * 4);
    cpu_gelu_forward(gin, pre, NC);
    act_round(gin, NC);
    float *d_gin = act_to_device(gin, NC);
    cpu_matmul_backward(dinp, dw, db, dout, gin, w, N, C, OC);
    backend_matmul_backward_gelu(d_dinp, d_dw, d_db, d_dout, d_gin, d_w, d_pre, N, C, OC);
    compare_act(named("grad_matmul_backward_gelu_dweight"), dw, d_dw, CO, tol);
    compare_act(named("grad_matmul_backward_gelu_dbias"), db, d_db, OC, tol);
    /* layernorm: x [A], its statistics fp32 */
    float *x = act_round(host_random(NC, 1), NC), *d_x = act_to_device(x, NC);
    float *lw = act_round(host_random(C, 1), C), *lb = act_round(host_random(C, 1), C), *ln = malloc(NC * 4);
    float *mean = malloc(N * 4), *rstd = malloc(N * 4);
    cpu_layernorm_forward(ln, mean, rstd, x, lw, lb, N, C);
    float *d_mean = to_device(mean, N * 4), *d_rstd = to_device(rstd, N * 4), *d_lw = act_to_device(lw, C);
    float *lndinp = act_round(host_random(NC, 1), NC), *d_lndinp = act_to_device(lndinp, NC);
    float *ldw = act_round(host_random(C, 1), C), *ldb = act_round(host_random(C, 1), C);
    float *d_ldw = act_to_device(ldw, C), *d_ldb = act_to_device(ldb, C);
    float *scratch = malloc((cpu_layernorm_scratch(C) + 1) * 4), *d_scratch = poisoned(backend_layernorm_scratch(C) + 1);
    float *lndout = act_round(host_random(NC, 1), NC), *d_lndout = act_to_device(lndout, NC);
    cpu_layernorm_backward(lndinp, ldw, ldb, lndout, x, lw, mean, rstd, scratch, N, C);
    backend_layernorm_backward(d_lndinp, d_ldw, d_ldb, d_lndout, d_x, d_lw, d_mean, d_rstd, d_scratch, N, C);
    compare_act(named("grad_layernorm_backward_dweight"), ldw, d_ldw, C, tol);
    compare_act(named("grad_layernorm_backward_dbias"), ldb, d_ldb, C, tol);
    /* RMSNorm on the same x: its rstd fp32 */
    float *rms_rstd = malloc(N * 4), *rms_dw = act_round(host_random(C, 1), C);
    cpu_rmsnorm_forward(ln, rms_rstd, x, lw, RMSNORM_EPS, N, C);
    float *d_rms_rstd = to_device(rms_rstd, N * 4), *d_rms_dw = act_to_device(rms_dw, C);
    cpu_rmsnorm_backward(lndinp, rms_dw, lndout, x, lw, rms_rstd, scratch, N, C);
    backend_rmsnorm_backward(d_lndinp, d_rms_dw, d_lndout, d_x, d_lw, d_rms_rstd, d_scratch, N, C);
    compare_act(named("grad_rmsnorm_backward_dweight"), rms_dw, d_rms_dw, C, tol);
    /* embedding: dout [A] (the residual stream's gradient); a repeated token */
    int32_t *tokens = malloc(N * sizeof *tokens);
    for (int i = 0; i < N; i++)
        tokens[i] = (int32_t)((uniform() + 1.0f) * 0.5f * (sh.V - 1));
    tokens[1] = tokens[0];
    int32_t *d_tokens = to_device(tokens, N * 4);
    float *dwte = act_round(host_random((size_t)Vp * C, 1), (size_t)Vp * C);
    float *dwpe = act_round(host_random((size_t)T * C, 1), (size_t)T * C);
    float *d_dwte = act_to_device(dwte, (size_t)Vp * C), *d_dwpe = act_to_device(dwpe, (size_t)T * C);
    cpu_embedding_backward(dwte, dwpe, x, tokens, NULL, B, T, C);
    backend_embedding_backward(d_dwte, d_dwpe, d_x, d_tokens, NULL, B, T, C);
    compare_act(named("grad_embedding_backward_dwte"), dwte, d_dwte, (size_t)Vp * C, tol);
    compare_act(named("grad_embedding_backward_dwpe"), dwpe, d_dwpe, (size_t)T * C, tol);
    int32_t *pos = packed_positions(B, T), *d_pos = to_device(pos, N * 4);
    cpu_embedding_backward(dwte, dwpe, x, tokens, pos, B, T, C);
    backend_embedding_backward(d_dwte, d_dwpe, d_x, d_tokens, d_pos, B, T, C);
    compare_act(named("grad_embedding_backward_packed_dwte"), dwte, d_dwte, (size_t)Vp * C, tol);
    compare_act(named("grad_embedding_backward_packed_dwpe"), dwpe, d_dwpe, (size_t)T * C, tol);
    cudaFree(d_pos), free(pos);
    cpu_embedding_backward(dwte, NULL, x, tokens, NULL, B, T, C);
    backend_embedding_backward(d_dwte, NULL, d_x, d_tokens, NULL, B, T, C);
    compare_act(named("grad_embedding_backward_nopos_dwte"), dwte, d_dwte, (size_t)Vp * C, tol);
    backend_set_grad_dtype(DTYPE_F32);
    cudaFree(d_inp), cudaFree(d_w), cudaFree(d_dout), cudaFree(d_dinp), cudaFree(d_dw), cudaFree(d_db);
    cudaFree(d_pre), cudaFree(d_gin), cudaFree(d_x), cudaFree(d_mean), cudaFree(d_rstd), cudaFree(d_lw);
    cudaFree(d_lndinp), cudaFree(d_ldw), cudaFree(d_ldb), cudaFree(d_scratch), cudaFree(d_lndout);
    cudaFree(d_tokens), cudaFree(d_dwte), cudaFree(d_dwpe), cudaFree(d_rms_rstd), cudaFree(d_rms_dw);
    free(rms_rstd), free(rms_dw);
    free(inp), free(w), free(dout), free(dinp), free(dw), free(db), free(pre), free(gin), free(x), free(lw);
    free(lb), free(ln), free(mean), free(rstd), free(lndinp), free(ldw), free(ldb), free(scratch), free(lndout);
    free(tokens), free(dwte), free(dwpe);
}

int main(void)
{
    backend_init(0);
    /* the CPU's attention keeps what the device's does (each row's log-sum-exp), whatever SHARDLM_ATTENTION says */
    backend_cpu_attention_use(CPU_ATTENTION_TILED);
    /* the own kernels' checks below test the tensor-core and FP32 kernels; cuDNN's are check_attention_cudnn's */
    setenv("SHARDLM_ATTENTION", "tc", 1);
    check_half_grads(DTYPE_BF16, 1e-2, "_bf16", EVEN);
    check_half_grads(DTYPE_F16, 5e-3, "_fp16", ODD);
    check_act_kernels(DTYPE_F32, TOL, "", EVEN);
    check_act_kernels(DTYPE_BF16, 1e-2, "_bf16", EVEN);
    check_act_kernels(DTYPE_F16, 5e-3, "_fp16", EVEN);
    check_act_kernels(DTYPE_F32, TOL, "_odd", ODD);
    check_act_kernels(DTYPE_BF16, 1e-2, "_odd_bf16", ODD);
    check_llama_kernels(DTYPE_F32, TOL, "");
    check_llama_kernels(DTYPE_BF16, 1e-2, "_bf16");
    check_llama_kernels(DTYPE_F16, 5e-3, "_fp16");
    check_wide_norms(DTYPE_F32, TOL, "");
    check_wide_norms(DTYPE_BF16, 1e-2, "_bf16");
    check_packing(DTYPE_F32, TOL, "", ODD);
    check_packing(DTYPE_BF16, 1e-2, "_bf16", EVEN);
    check_packing(DTYPE_F16, 5e-3, "_fp16", ODD);
    check_packed_wpe_windows();
    check_attention_tc();
    check_attention_cudnn();
    check_attention_variants();
    setenv("SHARDLM_ATTENTION", "tc", 1);
    check_lora_kernels(DTYPE_F32, TOL, "", 0);
    check_lora_kernels(DTYPE_BF16, 1e-2, "_bf16", 0);
    check_lora_kernels(DTYPE_BF16, 1e-2, "_bf16_grads_bf16", 1);
    check_lora_kernels(DTYPE_F16, 5e-3, "_fp16_grads_fp16", 1);

    /* fp32-only kernels */
    const size_t NC = 2 * 64 * 96;
    float *inp = host_random(NC, 1), *other = host_random(NC, 1), *g = malloc(NC * 4);
    float *d_inp = to_device(inp, NC * 4), *d_other = to_device(other, NC * 4), *d_sum = poisoned(NC);
    cpu_add(g, inp, other, NC);
    backend_add(d_sum, d_inp, d_other, NC);
    compare("add", g, d_sum, NC, TOL);
    cpu_scale(g, 0.37f, NC);
    backend_scale(d_sum, 0.37f, NC);
    compare("scale", g, d_sum, NC, TOL);

    /* reductions */
    double want = cpu_sum_squares(inp, NC), got = backend_sum_squares(d_inp, NC);
    char why[128], name_buf[64];
    snprintf(why, sizeof why, "got %.17g want %.17g", got, want);
    check_value("sum_squares", fabs(got - want) <= 1e-12 * want, why);
    check_value("all_finite_true", backend_all_finite(d_inp, NC) == 1, "reported a non-finite value");
    float inf = INFINITY;
    cudaMemcpy(d_inp + NC / 3, &inf, 4, cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
    check_value("all_finite_false", backend_all_finite(d_inp, NC) == 0, "missed an inf");
    backend_zero(d_inp, NC);
    check_value("zero", backend_sum_squares(d_inp, NC) == 0.0, "not all zero");

    /* casts, device <-> pinned host, bit for bit against dtype.h */
    const size_t NX = 100003;
    float *src = host_random(NX, 300.0f);
    src[1] = INFINITY, src[2] = -0.0f, src[3] = 1e-8f, src[4] = 65520.0f; /* edge cases, fp16 overflow */
    float *pinned = backend_mem_alloc(SPACE_PINNED, NX * 4, "check_kernels");
    memcpy(pinned, src, NX * 4);
    uint16_t *d16 = backend_mem_alloc(SPACE_DEVICE, NX * 2, "check_kernels");
    uint16_t *want16 = malloc(NX * 2), *got16 = malloc(NX * 2);
    const enum dtype halves[2] = {DTYPE_BF16, DTYPE_F16};
    for (int h = 0; h < 2; h++) {
        const char *tag = halves[h] == DTYPE_BF16 ? "bf16" : "fp16";
        dtype_convert(want16, halves[h], src, DTYPE_F32, NX);
        backend_convert(d16, halves[h], pinned, DTYPE_F32, NX); /* reads mapped pinned memory */
        backend_copy(got16, d16, NX * 2);
        size_t diff = 0;
        for (size_t i = 0; i < NX; i++)
            diff += want16[i] != got16[i];
        snprintf(why, sizeof why, "%zu of %zu elements differ from dtype_convert", diff, NX);
        snprintf(name_buf, sizeof name_buf, "convert_f32_to_%s_bits", tag);
        check_value(name_buf, diff == 0, why);
        /* accumulate into pinned fp32, as the engine adds a reduced shard */
        float *acc = malloc(NX * 4);
        memcpy(acc, src, NX * 4);
        dtype_add_to_f32(acc, want16, halves[h], NX);
        backend_add_to_f32(pinned, d16, halves[h], NX);
        backend_synchronize();
        diff = 0;
        for (size_t i = 0; i < NX; i++)
            diff += memcmp(&acc[i], &pinned[i], 4) != 0;
        snprintf(why, sizeof why, "%zu of %zu elements differ from dtype_add_to_f32", diff, NX);
        snprintf(name_buf, sizeof name_buf, "add_%s_to_pinned_f32", tag);
        check_value(name_buf, diff == 0, why);
        memcpy(pinned, src, NX * 4);
        free(acc);
    }
    double pinned_sq = backend_sum_squares(pinned + 5, NX - 5), host_sq = cpu_sum_squares(src + 5, NX - 5);
    snprintf(why, sizeof why, "got %.17g want %.17g", pinned_sq, host_sq);
    check_value("sum_squares_on_pinned", fabs(pinned_sq - host_sq) <= 1e-12 * host_sq, why);
    backend_zero(pinned, NX);
    backend_synchronize();
    size_t nonzero = 0;
    for (size_t i = 0; i < NX; i++)
        nonzero += pinned[i] != 0.0f;
    check_value("zero_on_pinned", nonzero == 0, "elements left nonzero");
    backend_mem_free(SPACE_DEVICE, d16, NX * 2);
    backend_mem_free(SPACE_PINNED, pinned, NX * 4);

    check_optimizer();
    check_dequant4();
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}
