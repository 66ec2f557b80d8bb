/*
 * CUDA backend, LoRA (issue 19): the adapters' forward and backward through gemm, with the
 * dropout mask of backend.h applied on the device.
 */
#include "cuda_internal.h"

/* ---- LoRA (issue 19) ------------------------------------------------------------------------------ */

/* out (N, C) [A] = drop(x), or out += drop(x) (accumulate): element (n, c) kept, times keep_scale, iff
 * lora_dropout_keeps(d, n, c), else 0; added in fp32, rounded once. The CPU backend's lora_drop, the same mask
 * (backend.h's function on the device) and the same keep_scale (computed on the host as the CPU does). */
template <typename A>
__global__ static void lora_drop_kernel(A *out, const A *x, struct lora_dropout d, float keep_scale, int N, int C,
                                        int accumulate)
{
    const size_t n = (size_t)N * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float v = lora_dropout_keeps(&d, i / C, (int)(i % C)) ? ld(x, i) * keep_scale : 0.0f;
        st(out, i, accumulate ? ld(out, i) + v : v);
    }
}

static int lora_drops(const struct lora_dropout *d) { return d && d->p > 0.0f; }

static void lora_drop(float *out, const float *x, const struct lora_dropout *d, int N, int C, int accumulate)
{
    const float keep_scale = 1.0f / (1.0f - d->p);
    WITH_ACT(lora_drop_kernel<A><<<blocks_for((size_t)N * C, BLOCK), BLOCK, 0, g_stream>>>(
        (A *)out, (const A *)x, *d, keep_scale, N, C, accumulate));
}

/* Element i of [A] memory (a layer's columns of t or dt). */
static float *act_at(const float *p, size_t i) { return (float *)((const char *)p + i * dtype_size(g_act)); }

static void lora_check_group(const struct lora_dropout *d, int k)
{
    if (lora_drops(d) && k != 1)
        fail_internal("LoRA dropout with %d layers in one call: each layer has its own mask", k);
}

/* t [A] (N, k r) = drop(x) @ A^T for the k stacked A_j at once, then per layer y_j [A] (rows of ld) += scale t_j
 * @ B_j^T with beta 1, t_j the r columns at j r of rows of k r, the GEMM writing columns [0, OC_j) of each row only
 * (column-major: t^T = op_T(A) x^T, y_j^T += scale op_T(B_j) t_j^T with ldb = k r, ldc = ld). */
extern "C" void backend_lora_forward(float *t, float *scratch, const float *x, const float *A, const struct lora_out *out,
                                     int k, int ld, float scale, const struct lora_dropout *d, int N, int C, int r)
{
    lora_check_group(d, k);
    if (N <= 0 || C <= 0 || r <= 0 || k <= 0)
        return;
    if (lora_drops(d)) {
        lora_drop(scratch, x, d, N, C, 0);
        x = scratch;
    }
    const int kr = k * r;
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, kr, N, C, 1.0f, A, C, x, C, 0.0f, t, kr, 0);
    for (int j = 0; j < k; j++)
        gemm(CUBLAS_OP_T, CUBLAS_OP_N, out[j].OC, N, r, scale, out[j].B, r, act_at(t, (size_t)j * r), kr, 1.0f,
             out[j].y, ld, 0);
}

/* Per layer dB_j [G] (OC_j, r) += scale dy_j^T @ t_j and dt_j [A] = scale dy_j @ B_j (the r columns at j r of dt's
 * rows of k r); then over all k r columns dA [G] (k r, C) += dt^T @ drop(x) and dx [A] += dt @ A, through scratch
 * and the mask with dropout (k = 1). */
extern "C" void backend_lora_backward(float *dx, float *dA, float *dt, float *scratch, const float *x, const float *t,
                                      const float *A, const struct lora_out *out, int k, int ld, float scale,
                                      const struct lora_dropout *d, int N, int C, int r)
{
    lora_check_group(d, k);
    if (N <= 0 || C <= 0 || r <= 0 || k <= 0)
        return;
    const int kr = k * r;
    for (int j = 0; j < k; j++) {
        const int OC = out[j].OC;
        if (out[j].dB)
            gemm(CUBLAS_OP_N, CUBLAS_OP_T, r, OC, N, scale, act_at(t, (size_t)j * r), kr, out[j].y, ld, 1.0f,
                 out[j].dB, r, 1);
        gemm(CUBLAS_OP_N, CUBLAS_OP_N, r, N, OC, scale, out[j].B, r, out[j].y, ld, 0.0f, act_at(dt, (size_t)j * r), kr,
             0);
    }
    const int drops = lora_drops(d);
    if (dA) {
        if (drops)
            lora_drop(scratch, x, d, N, C, 0);
        gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, kr, N, 1.0f, drops ? scratch : x, C, dt, kr, 1.0f, dA, C, 1);
    }
    if (!drops) {
        gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, kr, 1.0f, A, C, dt, kr, 1.0f, dx, C, 0);
        return;
    }
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, r, 1.0f, A, C, dt, r, 0.0f, scratch, C, 0);
    lora_drop(dx, scratch, d, N, C, 1);
}
