/*
 * cudaemu cuBLAS: cublasGemmEx and cublasGemmStridedBatchedEx on the CPU,
 * per NVIDIA's documentation: column-major, C = alpha op(A) op(B) + beta C
 * with op(A) m x k, op(B) k x n, C m x n; lda >= max(1, m) for A not
 * transposed (max(1, k) transposed), ldb >= max(1, k) (max(1, n)),
 * ldc >= max(1, m); the (A, B, C, compute) type combinations of the docs'
 * table for CUBLAS_COMPUTE_32F[_FAST_TF32]; products accumulated in double,
 * alpha/beta applied in float, C rounded to its type to nearest even; beta 0
 * never reads C. Every operand must lie inside one cudaMalloc/cudaHostAlloc
 * allocation (a GPU would fault on anything else). A violation returns
 * CUBLAS_STATUS_INVALID_VALUE (or NOT_SUPPORTED / EXECUTION_FAILED) and
 * prints why. Arguments are checked at the call; the product is enqueued on
 * the handle's stream (cublasSetStream) and computed when the stream runs.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <vector>

#include "blas_common.h"
#include "cublas_v2.h"
#include "cuda_runtime.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"

struct cudaemu_cublas {
    cudaStream_t stream;
};

extern "C" const char *cublasGetStatusName(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

extern "C" const char *cublasGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    default: return cublasGetStatusName(s);
    }
}

extern "C" cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    *h = new cudaemu_cublas{NULL};
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t) { return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED; }
/* The workspace must be device memory, 256-byte aligned, inside one allocation
 * (NVIDIA: cublasSetWorkspace); the emulated GEMMs do not use it. */
extern "C" cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *w, size_t bytes)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (bytes && (((uintptr_t)w & 255) != 0 || !blas_inside(w, bytes))) {
        fprintf(stderr, "cudaemu: cublasSetWorkspace: %zu bytes at %p: not 256-byte aligned inside one device "
                        "allocation\n", bytes, w);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

size_t blas_size(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

float blas_load(const void *p, cudaDataType_t t, size_t i)
{
    switch (t) {
    case CUDA_R_16F: return __half2float(((const __half *)p)[i]);
    case CUDA_R_16BF: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

void blas_store(void *p, cudaDataType_t t, size_t i, float v)
{
    switch (t) {
    case CUDA_R_16F: ((__half *)p)[i] = __float2half_rn(v); break;
    case CUDA_R_16BF: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
    default: ((float *)p)[i] = v;
    }
}

/* The docs' table for CUBLAS_COMPUTE_32F: A and B 16F, 16BF or 32F alike;
 * C the same type, or 32F for half inputs. FAST_TF32: all 32F. */
int blas_types_ok(cudaDataType_t a, cudaDataType_t b, cudaDataType_t c, cublasComputeType_t compute)
{
    if (a != b)
        return 0;
    if (compute == CUBLAS_COMPUTE_32F_FAST_TF32)
        return a == CUDA_R_32F && c == CUDA_R_32F;
    if (compute != CUBLAS_COMPUTE_32F)
        return 0;
    if (a == CUDA_R_32F)
        return c == CUDA_R_32F;
    return (a == CUDA_R_16F || a == CUDA_R_16BF) && (c == a || c == CUDA_R_32F);
}

/* Bytes from the first to one past the last element a column-major rows x cols matrix with leading dimension ld
 * touches. */
size_t blas_span(long long rows, long long cols, long long ld, size_t elem)
{
    return rows && cols ? (size_t)(((cols - 1) * ld + rows) * (long long)elem) : 0;
}

static cublasStatus_t invalid(const char *fn, const char *fmt, long long a, long long b)
{
    fprintf(stderr, "cudaemu: %s: ", fn);
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    return CUBLAS_STATUS_INVALID_VALUE;
}

int blas_inside(const void *p, size_t bytes)
{
    cudaMemoryType kind;
    return cudaemu_lookup(p, bytes, &kind);
}

void blas_product(std::vector<float> &out, std::vector<float> &opa, std::vector<float> &opb, cublasOperation_t ta,
                  cublasOperation_t tb, int m, int n, int k, float alpha, const void *A, cudaDataType_t at,
                  long long lda, const void *B, cudaDataType_t bt, long long ldb)
{
    for (int i = 0; i < m; i++)
        for (int l = 0; l < k; l++)
            opa[(size_t)i * k + l] = blas_load(A, at, ta == CUBLAS_OP_N ? i + (size_t)l * lda : l + (size_t)i * lda);
    for (int j = 0; j < n; j++)
        for (int l = 0; l < k; l++)
            opb[(size_t)j * k + l] = blas_load(B, bt, tb == CUBLAS_OP_N ? l + (size_t)j * ldb : j + (size_t)l * ldb);
    /* all of the product computed before any of C is written: C may not alias A or B, but if it does the result
     * is still each element's own */
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            const float *x = &opa[(size_t)i * k], *y = &opb[(size_t)j * k];
            double acc = 0.0;
            for (int l = 0; l < k; l++)
                acc += (double)x[l] * y[l];
            out[(size_t)j * m + i] = alpha * (float)acc;
        }
}

static cublasStatus_t gemm(const char *fn, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                           int k, const void *alpha_p, const void *A, cudaDataType_t at, int lda, long long sa,
                           const void *B, cudaDataType_t bt, int ldb, long long sb, const void *beta_p, void *C,
                           cudaDataType_t ct, int ldc, long long sc, int batch, cublasComputeType_t compute)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T && ta != CUBLAS_OP_C) ||
        (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T && tb != CUBLAS_OP_C))
        return invalid(fn, "bad transa/transb %lld/%lld", ta, tb);
    if (m < 0 || n < 0)
        return invalid(fn, "negative m or n (%lld, %lld)", m, n);
    if (k < 0 || batch < 0)
        return invalid(fn, "negative k or batchCount (%lld, %lld)", k, batch);
    long long a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
    long long b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
    if (lda < (a_rows > 1 ? a_rows : 1))
        return invalid(fn, "lda %lld < max(1, rows of A as stored = %lld)", lda, a_rows);
    if (ldb < (b_rows > 1 ? b_rows : 1))
        return invalid(fn, "ldb %lld < max(1, rows of B as stored = %lld)", ldb, b_rows);
    if (ldc < (m > 1 ? m : 1))
        return invalid(fn, "ldc %lld < max(1, m = %lld)", ldc, m);
    if (!blas_types_ok(at, bt, ct, compute)) {
        fprintf(stderr, "cudaemu: %s: types A %d B %d C %d compute %d are not a supported combination\n", fn, at, bt,
                ct, compute);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!m || !n || !batch)
        return CUBLAS_STATUS_SUCCESS;
    const float alpha = *(const float *)alpha_p, beta = *(const float *)beta_p;
    /* every operand of every batch inside one allocation */
    for (int b = 0; b < batch; b++) {
        const char *pa = (const char *)A + b * sa * (long long)blas_size(at);
        const char *pb = (const char *)B + b * sb * (long long)blas_size(bt);
        char *pc = (char *)C + b * sc * (long long)blas_size(ct);
        if (k && alpha != 0.0f && !blas_inside(pa, blas_span(a_rows, a_cols, lda, blas_size(at))))
            return fprintf(stderr, "cudaemu: %s: batch %d: A (%lld x %lld, lda %d) at %p is not inside one device "
                                   "allocation\n", fn, b, a_rows, a_cols, lda, pa),
                   CUBLAS_STATUS_EXECUTION_FAILED;
        if (k && alpha != 0.0f && !blas_inside(pb, blas_span(b_rows, b_cols, ldb, blas_size(bt))))
            return fprintf(stderr, "cudaemu: %s: batch %d: B (%lld x %lld, ldb %d) at %p is not inside one device "
                                   "allocation\n", fn, b, b_rows, b_cols, ldb, pb),
                   CUBLAS_STATUS_EXECUTION_FAILED;
        if (!blas_inside(pc, blas_span(m, n, ldc, blas_size(ct))))
            return fprintf(stderr, "cudaemu: %s: batch %d: C (%d x %d, ldc %d) at %p is not inside one device "
                                   "allocation\n", fn, b, m, n, ldc, pc),
                   CUBLAS_STATUS_EXECUTION_FAILED;
    }
    /* checked now, computed when the handle's stream reaches it; alpha and beta are host values read at the call
     * (CUBLAS_POINTER_MODE_HOST), the operands when it runs */
    cudaemu_enqueue(h->stream, [=] {
        std::vector<float> opa((size_t)m * k), opb((size_t)n * k); /* op(A) rows and op(B) columns, contiguous in k */
        std::vector<float> out((size_t)m * n);
        for (int b = 0; b < batch; b++) {
            const void *pa = (const char *)A + b * sa * (long long)blas_size(at);
            const void *pb = (const char *)B + b * sb * (long long)blas_size(bt);
            void *pc = (char *)C + b * sc * (long long)blas_size(ct);
            blas_product(out, opa, opb, ta, tb, m, n, k, alpha, pa, at, lda, pb, bt, ldb);
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++) {
                    size_t at_c = i + (size_t)j * ldc;
                    float v = out[(size_t)j * m + i];
                    if (beta != 0.0f) /* beta == 0: C is not read (NaN there must not leak) */
                        v += beta * blas_load(pc, ct, at_c);
                    blas_store(pc, ct, at_c, v);
                }
        }
    });
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                       int k, const void *alpha, const void *A, cudaDataType_t at, int lda,
                                       const void *B, cudaDataType_t bt, int ldb, const void *beta, void *C,
                                       cudaDataType_t ct, int ldc, cublasComputeType_t compute, cublasGemmAlgo_t)
{
    return gemm("cublasGemmEx", h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1,
                compute);
}

extern "C" cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                                     int m, int n, int k, const void *alpha, const void *A,
                                                     cudaDataType_t at, int lda, long long sa, const void *B,
                                                     cudaDataType_t bt, int ldb, long long sb, const void *beta,
                                                     void *C, cudaDataType_t ct, int ldc, long long sc, int batch,
                                                     cublasComputeType_t compute, cublasGemmAlgo_t)
{
    return gemm("cublasGemmStridedBatchedEx", h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct,
                ldc, sc, batch, compute);
}
