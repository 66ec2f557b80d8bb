/*
 * cudaemu cuBLASLt: cublasLtMatmul with the epilogues shardlm uses, per
 * NVIDIA's cublasLt.h and cuBLAS documentation:
 *   D = epilogue(alpha op(A) op(B) + beta C), column-major, op(A) m x k,
 *   op(B) k x n, C and D m x n (C read only when beta != 0);
 *   BIAS: + bias[row], bias of m elements ("Bias vector length must match
 *     matrix D rows ... broadcasted to all columns");
 *   GELU_AUX(_BIAS): aux = the GELU input (after the bias), D = GELU(it);
 *     aux has D's shape, leading dimension EPILOGUE_AUX_LD ("Must be
 *     divisible by 8 and be no less than the number of rows in the output
 *     matrix"), elements of D's type unless EPILOGUE_AUX_DATA_TYPE says;
 *     GELU is GPT-2's tanh approximation, applied to the fp32 value before
 *     it is rounded into aux or D;
 *   DGELU: D = (alpha op(A) op(B) + beta C) * GELU'(aux), aux an input laid
 *     out as above;
 *   BGRADA / BGRADB: bias = the sums of op(A)'s rows / op(B)'s columns over
 *     k ("The reduction happens over the GEMM's k dimension. Stores Bias
 *     gradient": overwritten, never accumulated), m / n elements of D's type.
 * Bias/aux types default to D's (-1). Arguments are checked at the call as
 * in cublas.cc: layouts that do not match the operation, a leading
 * dimension below the rows, an operand, bias or aux outside one allocation,
 * or a pointer less aligned than the preference the algorithm was chosen
 * for (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES, default 256) return
 * CUBLAS_STATUS_INVALID_VALUE and say why; an epilogue or type combination
 * not emulated returns CUBLAS_STATUS_NOT_SUPPORTED (heuristic: no
 * algorithm). CUDAEMU_LT_REFUSE=all makes the heuristic find no algorithm
 * for any epilogue but DEFAULT, to exercise a caller's fallback. The product
 * is enqueued on the given stream, computed when it runs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>

#include <vector>

#include "blas_common.h"
#include "cublasLt.h"
#include "cuda_runtime.h"

#define LT_ALGO_MAGIC 0x4c54414c474f3031ull /* marks an algorithm our heuristic returned */
#define GELU_SCALE 0.7978845608028654f      /* sqrt(2 / pi): GPT-2's tanh approximation */
#define AUX_LD_MULTIPLE 8                   /* cublasLt.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD */

struct cudaemu_lt {
    int alive;
};
struct cudaemu_lt_desc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    int32_t ta, tb;
    uint32_t epilogue;
    const void *bias;
    void *aux;
    int64_t aux_ld;
    int32_t bias_type, aux_type;
};
struct cudaemu_lt_layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};
struct cudaemu_lt_pref {
    uint64_t workspace;
    uint32_t align[4]; /* A, B, C, D */
};

static cublasStatus_t lt_fail(cublasStatus_t s, const char *fn, const char *why)
{
    fprintf(stderr, "cudaemu: %s: %s\n", fn, why);
    return s;
}

extern "C" cublasStatus_t cublasLtCreate(cublasLtHandle_t *h)
{
    *h = new cudaemu_lt{1};
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtDestroy(cublasLtHandle_t h)
{
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" const char *cublasLtGetStatusString(cublasStatus_t s) { return cublasGetStatusString(s); }

extern "C" cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                                   cudaDataType_t scale)
{
    *d = new cudaemu_lt_desc{compute, scale, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0, -1, -1};
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d)
{
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}

/* Copies an attribute whose size must be exactly `size` (the real library's check). */
static cublasStatus_t set_attr(void *dst, size_t size, const void *buf, size_t given, const char *fn)
{
    if (!buf || given != size)
        return lt_fail(CUBLAS_STATUS_INVALID_VALUE, fn, "attribute buffer NULL or of the wrong size");
    memcpy(dst, buf, size);
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                                         const void *buf, size_t size)
{
    const char *fn = "cublasLtMatmulDescSetAttribute";
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return set_attr(&d->ta, sizeof d->ta, buf, size, fn);
    case CUBLASLT_MATMUL_DESC_TRANSB: return set_attr(&d->tb, sizeof d->tb, buf, size, fn);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set_attr(&d->epilogue, sizeof d->epilogue, buf, size, fn);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set_attr(&d->bias, sizeof d->bias, buf, size, fn);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return set_attr(&d->aux, sizeof d->aux, buf, size, fn);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return set_attr(&d->aux_ld, sizeof d->aux_ld, buf, size, fn);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set_attr(&d->bias_type, sizeof d->bias_type, buf, size, fn);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return set_attr(&d->aux_type, sizeof d->aux_type, buf, size, fn);
    default: return lt_fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "attribute not emulated");
    }
}

extern "C" cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows,
                                                     uint64_t cols, int64_t ld)
{
    *l = new cudaemu_lt_layout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l)
{
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p)
{
    *p = new cudaemu_lt_pref{0, {256, 256, 256, 256}};
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p)
{
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                               cublasLtMatmulPreferenceAttributes_t attr,
                                                               const void *buf, size_t size)
{
    const char *fn = "cublasLtMatmulPreferenceSetAttribute";
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES)
        return set_attr(&p->workspace, sizeof p->workspace, buf, size, fn);
    if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES)
        return set_attr(&p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], sizeof p->align[0], buf, size,
                        fn);
    return lt_fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "attribute not emulated");
}

/* The problem a descriptor and its layouts describe, checked. */
struct lt_problem {
    int m, n, k;
    cudaDataType_t bias_type, aux_type;
    long long bias_len; /* elements of the bias (gradient) vector, 0: none */
    int aux;            /* 1: aux written (GELU_AUX), 2: aux read (DGELU) */
};

static int uses_bias(uint32_t e) { return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
static int bias_grad(uint32_t e) { return e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB; }

static cublasStatus_t check_problem(const char *fn, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t la,
                                    cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld,
                                    struct lt_problem *p)
{
    char why[256];
    if (!d || !la || !lb || !lc || !ld)
        return lt_fail(CUBLAS_STATUS_INVALID_VALUE, fn, "a descriptor is NULL");
    if ((d->ta != CUBLAS_OP_N && d->ta != CUBLAS_OP_T) || (d->tb != CUBLAS_OP_N && d->tb != CUBLAS_OP_T))
        return lt_fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "transa/transb other than N or T");
    p->m = (int)ld->rows, p->n = (int)ld->cols;
    p->k = (int)(d->ta == CUBLAS_OP_N ? la->cols : la->rows);
    uint64_t a_m = d->ta == CUBLAS_OP_N ? la->rows : la->cols;
    uint64_t b_k = d->tb == CUBLAS_OP_N ? lb->rows : lb->cols, b_n = d->tb == CUBLAS_OP_N ? lb->cols : lb->rows;
    if (a_m != ld->rows || b_n != ld->cols || b_k != (uint64_t)p->k || lc->rows != ld->rows || lc->cols != ld->cols) {
        snprintf(why, sizeof why, "layouts do not match: op(A) %llu x %d, op(B) %llu x %llu, C %llu x %llu, D %d x %d",
                 (unsigned long long)a_m, p->k, (unsigned long long)b_k, (unsigned long long)b_n,
                 (unsigned long long)lc->rows, (unsigned long long)lc->cols, p->m, p->n);
        return lt_fail(CUBLAS_STATUS_INVALID_VALUE, fn, why);
    }
    const cudaemu_lt_layout *all[4] = {la, lb, lc, ld};
    for (int i = 0; i < 4; i++)
        if (all[i]->ld < (int64_t)(all[i]->rows > 1 ? all[i]->rows : 1)) {
            snprintf(why, sizeof why, "%c: ld %lld < rows %llu", "ABCD"[i], (long long)all[i]->ld,
                     (unsigned long long)all[i]->rows);
            return lt_fail(CUBLAS_STATUS_INVALID_VALUE, fn, why);
        }
    if (lc->type != ld->type || lc->ld != ld->ld)
        return lt_fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "C and D differ in type or leading dimension");
    if (d->scale != CUDA_R_32F || !blas_types_ok(la->type, lb->type, ld->type, d->compute))
        return lt_fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "type combination not supported");
    const uint32_t e = d->epilogue;
    const int known = e == CUBLASLT_EPILOGUE_DEFAULT || uses_bias(e) || bias_grad(e) || e == CUBLASLT_EPILOGUE_DGELU ||
                      e == CUBLASLT_EPILOGUE_GELU_AUX;
    if (!known)
        return lt_fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "epilogue not emulated");
    p->bias_type = d->bias_type == -1 ? ld->type : (cudaDataType_t)d->bias_type;
    p->aux_type = d->aux_type == -1 ? ld->type : (cudaDataType_t)d->aux_type;
    if (p->bias_type != ld->type || p->aux_type != ld->type)
        return lt_fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "bias or aux type other than D's not emulated");
    p->bias_len = uses_bias(e) || e == CUBLASLT_EPILOGUE_BGRADA ? p->m : e == CUBLASLT_EPILOGUE_BGRADB ? p->n : 0;
    if (p->bias_len && !d->bias)
        return lt_fail(CUBLAS_STATUS_INVALID_VALUE, fn, "the epilogue needs CUBLASLT_MATMUL_DESC_BIAS_POINTER");
    if (p->bias_len && !blas_inside(d->bias, (size_t)p->bias_len * blas_size(p->bias_type)))
        return lt_fail(CUBLAS_STATUS_INVALID_VALUE, fn, "the bias vector is not inside one device allocation");
    if ((uintptr_t)d->bias % blas_size(p->bias_type))
        return lt_fail(CUBLAS_STATUS_INVALID_VALUE, fn, "the bias vector is misaligned for its type");
    p->aux = e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ? 1
             : e == CUBLASLT_EPILOGUE_DGELU                                            ? 2
                                                                                       : 0;
    if (p->aux) {
        if (!d->aux)
            return lt_fail(CUBLAS_STATUS_INVALID_VALUE, fn, "the epilogue needs CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER");
        if (d->aux_ld < p->m || d->aux_ld % AUX_LD_MULTIPLE) {
            snprintf(why, sizeof why, "EPILOGUE_AUX_LD %lld must be >= the rows of D (%d) and divisible by %d",
                     (long long)d->aux_ld, p->m, AUX_LD_MULTIPLE);
            return lt_fail(CUBLAS_STATUS_INVALID_VALUE, fn, why);
        }
        if (!blas_inside(d->aux, blas_span(p->m, p->n, d->aux_ld, blas_size(p->aux_type))))
            return lt_fail(CUBLAS_STATUS_INVALID_VALUE, fn, "the aux matrix is not inside one device allocation");
        if ((uintptr_t)d->aux % blas_size(p->aux_type))
            return lt_fail(CUBLAS_STATUS_INVALID_VALUE, fn, "the aux matrix is misaligned for its type");
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* CUDAEMU_LT_REFUSE: "all" answers NOT_SUPPORTED for every epilogue; "invalid" answers INVALID_VALUE for the
 * bias epilogues, as cuBLAS 13 on an H200 did in bf16 (the first GPU session). Returns the status, or SUCCESS. */
static cublasStatus_t refused(uint32_t epilogue)
{
    const char *r = getenv("CUDAEMU_LT_REFUSE");
    if (!r || epilogue == CUBLASLT_EPILOGUE_DEFAULT)
        return CUBLAS_STATUS_SUCCESS;
    if (strcmp(r, "all") == 0)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (strcmp(r, "invalid") == 0 && (epilogue == CUBLASLT_EPILOGUE_BIAS || epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
                                      epilogue == CUBLASLT_EPILOGUE_BGRADA))
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                                         cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                                                         cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld,
                                                         cublasLtMatmulPreference_t pref, int requested,
                                                         cublasLtMatmulHeuristicResult_t results[], int *count)
{
    const char *fn = "cublasLtMatmulAlgoGetHeuristic";
    if (!h || !pref || !count || requested < 1 || !results)
        return lt_fail(CUBLAS_STATUS_INVALID_VALUE, fn, "NULL handle, preference or results, or requestedAlgoCount < 1");
    *count = 0;
    struct lt_problem p;
    cublasStatus_t s = check_problem(fn, d, la, lb, lc, ld, &p);
    if (s != CUBLAS_STATUS_SUCCESS)
        return s;
    if ((s = refused(d->epilogue)) != CUBLAS_STATUS_SUCCESS)
        return s;
    memset(&results[0], 0, sizeof results[0]);
    results[0].algo.data[0] = LT_ALGO_MAGIC;
    for (int i = 0; i < 4; i++) /* the alignments the algorithm may assume, checked by cublasLtMatmul */
        results[0].algo.data[1 + i] = pref->align[i];
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *count = 1;
    return CUBLAS_STATUS_SUCCESS;
}

static float gelu(float x) { return 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x))); }

static float gelu_grad(float x)
{
    float t = tanhf(GELU_SCALE * (x + 0.044715f * x * x * x)), du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

extern "C" cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha_p,
                                         const void *A, cublasLtMatrixLayout_t la, const void *B,
                                         cublasLtMatrixLayout_t lb, const void *beta_p, const void *C,
                                         cublasLtMatrixLayout_t lc, void *D, cublasLtMatrixLayout_t ld,
                                         const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_bytes,
                                         cudaStream_t stream)
{
    const char *fn = "cublasLtMatmul";
    char why[256];
    if (!h || !alpha_p || !beta_p)
        return lt_fail(CUBLAS_STATUS_INVALID_VALUE, fn, "NULL handle, alpha or beta");
    struct lt_problem p;
    cublasStatus_t s = check_problem(fn, d, la, lb, lc, ld, &p);
    if (s != CUBLAS_STATUS_SUCCESS)
        return s;
    if (algo && algo->data[0] != LT_ALGO_MAGIC)
        return lt_fail(CUBLAS_STATUS_INVALID_VALUE, fn, "algo does not come from cublasLtMatmulAlgoGetHeuristic");
    /* the emulated algorithms need no workspace, but a given one must be device memory */
    if (workspace_bytes && !blas_inside(workspace, workspace_bytes))
        return lt_fail(CUBLAS_STATUS_INVALID_VALUE, fn, "the workspace is not inside one device allocation");
    const void *ptrs[4] = {A, B, C, D};
    for (int i = 0; algo && i < 4; i++)
        if ((uintptr_t)ptrs[i] % algo->data[1 + i]) {
            snprintf(why, sizeof why, "%c at %p is less aligned than the %llu bytes the algorithm was chosen for "
                                      "(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%c_BYTES)",
                     "ABCD"[i], ptrs[i], (unsigned long long)algo->data[1 + i], "ABCD"[i]);
            return lt_fail(CUBLAS_STATUS_INVALID_VALUE, fn, why);
        }
    const float alpha = *(const float *)alpha_p, beta = *(const float *)beta_p;
    const int m = p.m, n = p.n, k = p.k;
    if (bias_grad(d->epilogue) && alpha != 1.0f)
        return lt_fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "bias gradient with alpha != 1 is not emulated");
    const cudaemu_lt_layout *all[4] = {la, lb, lc, ld};
    for (int i = 0; i < 4; i++) {
        const int is_input_ab = i < 2, reads_c = i == 2;
        if ((is_input_ab && (!k || alpha == 0.0f)) || (reads_c && beta == 0.0f) || !m || !n)
            continue;
        if (!blas_inside(ptrs[i], blas_span((long long)all[i]->rows, (long long)all[i]->cols, all[i]->ld,
                                            blas_size(all[i]->type)))) {
            snprintf(why, sizeof why, "%c (%llu x %llu, ld %lld) at %p is not inside one device allocation", "ABCD"[i],
                     (unsigned long long)all[i]->rows, (unsigned long long)all[i]->cols, (long long)all[i]->ld,
                     ptrs[i]);
            return lt_fail(CUBLAS_STATUS_EXECUTION_FAILED, fn, why);
        }
    }
    const cublasOperation_t ta = (cublasOperation_t)d->ta, tb = (cublasOperation_t)d->tb;
    const cudaDataType_t at = la->type, bt = lb->type, dt = ld->type;
    const long long lda = la->ld, ldb = lb->ld, ldc = lc->ld, ldd = ld->ld, aux_ld = d->aux_ld;
    const uint32_t e = d->epilogue;
    void *bias = (void *)d->bias, *aux = d->aux;
    const cudaDataType_t bias_type = p.bias_type, aux_type = p.aux_type;
    /* checked now, computed when the stream reaches it (alpha and beta are host values read at the call) */
    cudaemu_enqueue(stream, [=] {
        std::vector<float> opa((size_t)m * k), opb((size_t)n * k), out((size_t)m * n);
        blas_product(out, opa, opb, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb);
        if (bias_grad(e)) { /* over k, from the operands as loaded */
            const int len = e == CUBLASLT_EPILOGUE_BGRADA ? m : n;
            const std::vector<float> &op = e == CUBLASLT_EPILOGUE_BGRADA ? opa : opb;
            for (int r = 0; r < len; r++) {
                double sum = 0.0;
                for (int l = 0; l < k; l++)
                    sum += op[(size_t)r * k + l];
                blas_store(bias, bias_type, (size_t)r, (float)sum);
            }
        }
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float v = out[(size_t)j * m + i];
                if (beta != 0.0f) /* beta == 0: C is not read */
                    v += beta * blas_load(C, dt, i + (size_t)j * ldc);
                if (uses_bias(e))
                    v += blas_load(bias, bias_type, (size_t)i);
                if (e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
                    blas_store(aux, aux_type, i + (size_t)j * aux_ld, v);
                    v = gelu(v);
                } else if (e == CUBLASLT_EPILOGUE_DGELU) {
                    v *= gelu_grad(blas_load(aux, aux_type, i + (size_t)j * aux_ld));
                }
                blas_store(D, dt, i + (size_t)j * ldd, v);
            }
    });
    return CUBLAS_STATUS_SUCCESS;
}
