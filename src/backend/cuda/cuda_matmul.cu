/*
 * CUDA backend, matmuls: cublasGemmEx (gemm, also for LoRA), the matmuls whose bias, GELU or
 * bias gradient cuBLASLt folds in as an epilogue (with unfused fallbacks), the fixed-order
 * column sums of the bias gradients (shared with the norms), and the library workspace.
 */
#include "cuda_internal.h"

static void *g_workspace;            /* the plan's library workspace (backend_set_library_workspace) */
static size_t g_workspace_bytes;

static cudaDataType_t grad_type(void)
{
    return g_grad == DTYPE_BF16 ? CUDA_R_16BF : g_grad == DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
}

static cudaDataType_t act_type(void)
{
    return g_act == DTYPE_BF16 ? CUDA_R_16BF : g_act == DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* C (col-major m x n, ldc) = alpha op(A) op(B) + beta C. A and B are [A]; C
 * is [A] (c_grad 0) or [G] (1: weight gradients). fp32 accumulation always;
 * TF32 only when configured and only for fp32 storage. */
void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const void *A,
                 int lda, const void *B, int ldb, float beta, void *C, int ldc, int c_grad)
{
    cublasComputeType_t compute = g_act == DTYPE_F32 ? g_compute : CUBLAS_COMPUTE_32F;
    cublasCheck(cublasGemmEx(g_cublas, ta, tb, m, n, k, &alpha, A, act_type(), lda, B, act_type(), ldb, &beta, C,
                             c_grad ? grad_type() : act_type(), ldc, compute, CUBLAS_GEMM_DEFAULT));
}

/* ---- matmul ------------------------------------------------------------------------- */

template <typename A> __global__ static void fill_rows(A *out, const A *row, int N, int OC)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x, n = (size_t)N * OC;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = row[i % OC];
}

/* Row chunks for `sums` column sums of `cols` columns each over N rows: as many as
 * fit g_colsum (at most COLSUM_MAX_CHUNKS), a function of the shapes only. */
int colsum_chunks(int N, int cols, int sums)
{
    if ((size_t)cols * sums > COLSUM_FLOATS)
        fail_internal("column sums over %zu columns exceed the %zu-float buffer", (size_t)cols * sums,
                      (size_t)COLSUM_FLOATS);
    int chunks = (int)(COLSUM_FLOATS / ((size_t)cols * sums));
    chunks = chunks < COLSUM_MAX_CHUNKS ? chunks : COLSUM_MAX_CHUNKS;
    chunks = chunks < N ? chunks : N;
    return chunks > 0 ? chunks : 1;
}

/* Stage 1: partial[chunk][c] = sum of dout[:, c] over the chunk's rows, in row order. */
template <typename A>
__global__ static void column_sums_partial(float *partial, const A *dout, int N, int OC, int chunks)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (c >= OC)
        return;
    int r0 = (int)((long)N * chunk / chunks), r1 = (int)((long)N * (chunk + 1) / chunks);
    float s = 0.0f;
    for (int i = r0; i < r1; i++)
        s += ld(dout, (size_t)i * OC + c);
    partial[(size_t)chunk * OC + c] = s;
}

/* Stage 2: dst[c] += the chunks' partials in chunk order.
 * dst [G] (dtype dt): one rounding per element. */
__global__ void column_sums_finish(void *dst, enum dtype dt, const float *partial, int OC, int chunks)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= OC)
        return;
    float s = 0.0f;
    for (int k = 0; k < chunks; k++)
        s += partial[(size_t)k * OC + c];
    store_from_f32(dst, dt, c, load_as_f32(dst, dt, c) + s);
}

/* ---- matmuls with an epilogue (cuBLASLt) ----------------------------------------------------------
 *
 * cuBLASLt folds into the matmul what would otherwise be a pass of its own over the output: the bias
 * (EPILOGUE_BIAS), the MLP's bias + GELU keeping the GELU input (GELU_AUX_BIAS), GELU's derivative
 * on the input gradient (DGELU), and the bias gradient from the weight-gradient matmul (BGRADA:
 * row sums of A = dout over k = N). cuBLASLt's GELU is the tanh approximation GPT-2 uses (check_kernels
 * compares it to the CPU's tanh formula within 1e-5 in fp32, which an erf GELU would miss by ~1e-4).
 * BGRAD overwrites its vector (cublasLt.h: "Stores Bias gradient") while the backend's bias gradients
 * accumulate, so it goes to g_colsum and one small kernel adds it. When cuBLASLt has no algorithm for
 * a case (the heuristic answers NOT_SUPPORTED or none) or the aux leading dimension is not a multiple of
 * LT_AUX_LD_MULTIPLE, the unfused kernels compute the same thing. Workspace: the plan's library
 * workspace (backend_set_library_workspace), shared with cuBLAS: both run on g_stream, one after the
 * other. */

#define LT_AUX_LD_MULTIPLE 8 /* cublasLt.h: CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD "Must be divisible by 8" */

/* The largest power of two up to 256 that divides p (the alignment preference cuBLASLt must assume). */
static uint32_t alignment_of(const void *p)
{
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a)
        a /= 2;
    return a;
}

struct lt_epilogue {
    cublasLtEpilogue_t kind;
    const void *bias; /* BIAS: [A] (m); BGRADA: fp32 (m), written */
    const void *aux;  /* GELU_AUX: [A] output; DGELU: [A] input; (m x n, ld aux_ld) */
    int64_t aux_ld;
};

/* D (col-major m x n, ldd) = epilogue(op(A) op(B) + beta D), as gemm() (A, B [A]; D [A] or fp32 when
 * d_grad: [G]). Returns 0, having done nothing, when cuBLASLt offers no algorithm for it. */
static int lt_matmul(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *A, int lda,
                     const void *B, int ldb, float beta, void *D, int ldd, int d_grad, const struct lt_epilogue *e)
{
    const cublasComputeType_t compute = g_act == DTYPE_F32 ? g_compute : CUBLAS_COMPUTE_32F;
    const cudaDataType_t ab = act_type(), dt = d_grad ? grad_type() : act_type();
    const int32_t opa = ta, opb = tb;
    const uint32_t epilogue = e->kind;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    if (e->bias)
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e->bias, sizeof e->bias));
    if (e->kind == CUBLASLT_EPILOGUE_BGRADA || e->kind == CUBLASLT_EPILOGUE_BGRADB) {
        /* the bias gradient goes to the fp32 g_colsum whatever D's type ([G] may be half precision);
         * the default would be D's type */
        const int32_t f32 = CUDA_R_32F;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &f32, sizeof f32));
    }
    if (e->aux) {
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &e->aux,
                                                   sizeof e->aux));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &e->aux_ld,
                                                   sizeof e->aux_ld));
    }
    cublasCheck(cublasLtMatrixLayoutCreate(&la, ab, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda));
    cublasCheck(cublasLtMatrixLayoutCreate(&lb, ab, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&ld, dt, m, n, ldd));
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t workspace = g_workspace_bytes;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                     sizeof workspace));
    const uint32_t align[4] = {alignment_of(A), alignment_of(B), alignment_of(D), alignment_of(D)};
    for (int i = 0; i < 4; i++)
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(
            pref, (cublasLtMatmulPreferenceAttributes_t)(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES + i), &align[i],
            sizeof align[i]));
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(g_cublaslt, desc, la, lb, ld, ld, pref, 1, &result, &found);
    /* No algorithm: NOT_SUPPORTED, or INVALID_VALUE, which cuBLAS 13 on an H200 answered for the
     * bias epilogues in bf16 (the first GPU session: every bf16 GPT-2 run stopped here). The heuristic
     * runs nothing, so the unfused kernels can still do the same work; each kind is said once. */
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) {
        static unsigned said;
        const unsigned bit = 1u << (e->kind % 32);
        if (s == CUBLAS_STATUS_INVALID_VALUE && !(said & bit)) {
            said |= bit;
            fprintf(stderr, "shardlm: note: cuBLASLt refused the fused epilogue %u (inputs %d, output %d: %s); "
                            "the unfused kernels run instead\n",
                    (unsigned)e->kind, (int)ab, (int)dt, cublasGetStatusString(s));
        }
    } else {
        cublasCheck(s);
    }
    const int ok = s == CUBLAS_STATUS_SUCCESS && found > 0;
    if (ok) {
        const float alpha = 1.0f;
        cublasCheck(cublasLtMatmul(g_cublaslt, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &result.algo, g_workspace,
                                   g_workspace_bytes, g_stream));
    }
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    cublasCheck(cublasLtMatrixLayoutDestroy(ld));
    cublasCheck(cublasLtMatrixLayoutDestroy(lb));
    cublasCheck(cublasLtMatrixLayoutDestroy(la));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
    return ok;
}

extern "C" void backend_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                                       int C, int OC)
{
    float beta = 0.0f;
    if (bias) {
        const struct lt_epilogue e = {CUBLASLT_EPILOGUE_BIAS, bias, NULL, 0};
        if (lt_matmul(CUBLAS_OP_N, CUBLAS_OP_N, OC, N, C, weight, OC, inp, C, 0.0f, out, OC, 0, &e))
            return;
        WITH_ACT(fill_rows<A><<<blocks_for((size_t)N * OC, BLOCK), BLOCK, 0, g_stream>>>((A *)out, (const A *)bias,
                                                                                         N, OC));
        beta = 1.0f;
    }
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, OC, N, C, 1.0f, weight, OC, inp, C, beta, out, OC, 0);
}

extern "C" void backend_matmul_forward_gelu(float *pre, float *out, const float *inp, const float *weight,
                                            const float *bias, int N, int C, int OC)
{
    if (OC % LT_AUX_LD_MULTIPLE == 0) {
        const struct lt_epilogue e = {bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX, bias, pre,
                                      OC};
        if (lt_matmul(CUBLAS_OP_N, CUBLAS_OP_N, OC, N, C, weight, OC, inp, C, 0.0f, out, OC, 0, &e))
            return;
    }
    backend_matmul_forward(pre, inp, weight, bias, N, C, OC);
    backend_gelu_forward(out, pre, (size_t)N * OC);
}

/* dweight (C, OC) += inp^T @ dout; dbias (OC) += column sums of dout (skipped when NULL); nothing when
 * dweight is NULL (frozen weights, backend.h). */
static void weight_and_bias_grad(float *dweight, float *dbias, const float *dout, const float *inp, int N, int C,
                                 int OC)
{
    if (!dweight)
        return;
    if (dbias) {
        if ((size_t)OC > COLSUM_FLOATS)
            fail_internal("a bias of %d elements exceeds the %zu-float column-sum buffer", OC, (size_t)COLSUM_FLOATS);
        const struct lt_epilogue e = {CUBLASLT_EPILOGUE_BGRADA, g_colsum, NULL, 0};
        if (lt_matmul(CUBLAS_OP_N, CUBLAS_OP_T, OC, C, N, dout, OC, inp, C, 1.0f, dweight, OC, 1, &e)) {
            column_sums_finish<<<(OC + BLOCK - 1) / BLOCK, BLOCK, 0, g_stream>>>(dbias, g_grad, g_colsum, OC, 1);
            return;
        }
    }
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, OC, 1);
    if (dbias) {
        int chunks = colsum_chunks(N, OC, 1);
        dim3 grid((OC + BLOCK - 1) / BLOCK, chunks);
        WITH_ACT(column_sums_partial<A><<<grid, BLOCK, 0, g_stream>>>(g_colsum, (const A *)dout, N, OC, chunks));
        column_sums_finish<<<(OC + BLOCK - 1) / BLOCK, BLOCK, 0, g_stream>>>(dbias, g_grad, g_colsum, OC, chunks);
    }
}

extern "C" void backend_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                        const float *inp, const float *weight, int N, int C, int OC)
{
    if (dinp)
        gemm(CUBLAS_OP_T, CUBLAS_OP_N, C, N, OC, 1.0f, weight, OC, dout, OC, 0.0f, dinp, C, 0);
    weight_and_bias_grad(dweight, dbias, dout, inp, N, C, OC);
}

extern "C" void backend_matmul_backward_gelu(float *dpre, float *dweight, float *dbias, const float *dout,
                                             const float *inp, const float *weight, const float *pre, int N, int C,
                                             int OC)
{
    const struct lt_epilogue e = {CUBLASLT_EPILOGUE_DGELU, NULL, pre, C};
    if (C % LT_AUX_LD_MULTIPLE != 0 ||
        !lt_matmul(CUBLAS_OP_T, CUBLAS_OP_N, C, N, OC, weight, OC, dout, OC, 0.0f, dpre, C, 0, &e)) {
        gemm(CUBLAS_OP_T, CUBLAS_OP_N, C, N, OC, 1.0f, weight, OC, dout, OC, 0.0f, dpre, C, 0);
        backend_gelu_backward(dpre, pre, dpre, (size_t)N * C);
    }
    weight_and_bias_grad(dweight, dbias, dout, inp, N, C, OC);
}

extern "C" void backend_matmul_forward_transposed(float *out, const float *inp, const float *weight, int N, int C,
                                                  int OC)
{
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, 1.0f, weight, C, inp, C, 0.0f, out, OC, 0);
}

extern "C" void backend_matmul_forward_transposed_bias(float *out, const float *inp, const float *weight,
                                                       const float *bias, int N, int C, int OC)
{
    if (bias) {
        const struct lt_epilogue e = {CUBLASLT_EPILOGUE_BIAS, bias, NULL, 0};
        if (lt_matmul(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, weight, C, inp, C, 0.0f, out, OC, 0, &e))
            return;
    }
    backend_matmul_forward_transposed(out, inp, weight, N, C, OC);
    if (bias)
        backend_bias_forward(out, bias, N, OC);
}

extern "C" void backend_matmul_backward_transposed(float *dinp, float *dweight, const float *dout, const float *inp,
                                                   const float *weight, int N, int C, int OC)
{
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, 1.0f, weight, C, dout, OC, 0.0f, dinp, C, 0);
    if (dweight)
        gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dweight, C, 1);
}

/* ---- a bias on its own (the transposed matmuls have none: Qwen2's q|k|v) ------------------ */

template <typename A> __global__ static void add_rows(A *out, const A *row, int N, int OC)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x, n = (size_t)N * OC;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x)
        st(out, i, ld(out, i) + ld(row, i % OC));
}

extern "C" void backend_bias_forward(float *out, const float *bias, int N, int OC)
{
    WITH_ACT(add_rows<A><<<blocks_for((size_t)N * OC, BLOCK), BLOCK, 0, g_stream>>>((A *)out, (const A *)bias, N,
                                                                                      OC));
}

/* The same fixed-order column sums as a matmul's bias gradient. */
extern "C" void backend_bias_backward(float *dbias, const float *dout, int N, int OC)
{
    if (!dbias)
        return;
    int chunks = colsum_chunks(N, OC, 1);
    dim3 grid((OC + BLOCK - 1) / BLOCK, chunks);
    WITH_ACT(column_sums_partial<A><<<grid, BLOCK, 0, g_stream>>>(g_colsum, (const A *)dout, N, OC, chunks));
    column_sums_finish<<<(OC + BLOCK - 1) / BLOCK, BLOCK, 0, g_stream>>>(dbias, g_grad, g_colsum, OC, chunks);
}

extern "C" size_t backend_library_workspace(void) { return BACKEND_CUDA_LIBRARY_WORKSPACE; }

extern "C" void backend_set_library_workspace(void *p, size_t bytes)
{
    cublasCheck(cublasSetWorkspace(g_cublas, p, bytes));
    g_workspace = p;
    g_workspace_bytes = bytes;
}
