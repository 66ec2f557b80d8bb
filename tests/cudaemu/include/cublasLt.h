/*
 * cudaemu: the cuBLASLt subset shardlm uses (tests/cudaemu, cublaslt.cc).
 * Enumerator values and attribute sizes are those of NVIDIA's cublasLt.h;
 * only column-major layouts, no batches, and the epilogues DEFAULT, BIAS,
 * GELU_AUX(_BIAS), DGELU and BGRADA/BGRADB are implemented. Anything else
 * (an attribute, an epilogue, a type combination) returns
 * CUBLAS_STATUS_NOT_SUPPORTED or CUBLAS_STATUS_INVALID_VALUE and says why on
 * stderr.
 */
#ifndef CUDAEMU_CUBLASLT_H
#define CUDAEMU_CUBLASLT_H
#include <stddef.h>
#include <stdint.h>

#include "cublas_v2.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cudaemu_lt *cublasLtHandle_t;
typedef struct cudaemu_lt_desc *cublasLtMatmulDesc_t;
typedef struct cudaemu_lt_layout *cublasLtMatrixLayout_t;
typedef struct cudaemu_lt_pref *cublasLtMatmulPreference_t;

typedef struct {
    uint64_t data[8];
} cublasLtMatmulAlgo_t;

typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

typedef enum {
    CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,         /* int32_t */
    CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,           /* int32_t */
    CUBLASLT_MATMUL_DESC_POINTER_MODE = 2,         /* int32_t */
    CUBLASLT_MATMUL_DESC_TRANSA = 3,               /* int32_t, default CUBLAS_OP_N */
    CUBLASLT_MATMUL_DESC_TRANSB = 4,               /* int32_t, default CUBLAS_OP_N */
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,             /* uint32_t, default CUBLASLT_EPILOGUE_DEFAULT */
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,         /* void *, default NULL */
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11, /* void *, default NULL */
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12,     /* int64_t, default 0 */
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE = 22, /* int32_t, default -1: D's type */
    CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26,      /* int32_t, default -1: D's type */
} cublasLtMatmulDescAttributes_t;

typedef enum {
    CUBLASLT_EPILOGUE_DEFAULT = 1,
    CUBLASLT_EPILOGUE_RELU = 2,
    CUBLASLT_EPILOGUE_BIAS = 4,
    CUBLASLT_EPILOGUE_GELU = 32,
    CUBLASLT_EPILOGUE_GELU_AUX = (CUBLASLT_EPILOGUE_GELU | 128),
    CUBLASLT_EPILOGUE_GELU_BIAS = (CUBLASLT_EPILOGUE_GELU | CUBLASLT_EPILOGUE_BIAS),
    CUBLASLT_EPILOGUE_GELU_AUX_BIAS = (CUBLASLT_EPILOGUE_GELU_AUX | CUBLASLT_EPILOGUE_BIAS),
    CUBLASLT_EPILOGUE_DGELU = 64 | 128,
    CUBLASLT_EPILOGUE_DGELU_BGRAD = CUBLASLT_EPILOGUE_DGELU | 16,
    CUBLASLT_EPILOGUE_BGRADA = 256,
    CUBLASLT_EPILOGUE_BGRADB = 512,
} cublasLtEpilogue_t;

typedef enum {
    CUBLASLT_MATRIX_LAYOUT_TYPE = 0,
    CUBLASLT_MATRIX_LAYOUT_ORDER = 1,
    CUBLASLT_MATRIX_LAYOUT_ROWS = 2,
    CUBLASLT_MATRIX_LAYOUT_COLS = 3,
    CUBLASLT_MATRIX_LAYOUT_LD = 4,
    CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,
} cublasLtMatrixLayoutAttribute_t;

typedef enum {
    CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0,
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,     /* uint64_t, default 0 */
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,   /* uint32_t, default 256 */
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
} cublasLtMatmulPreferenceAttributes_t;

cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle);
const char *cublasLtGetStatusString(cublasStatus_t status);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t sizeInBytes);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t sizeInBytes);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int *returnAlgoCount);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Adesc, const void *B,
                              cublasLtMatrixLayout_t Bdesc, const void *beta, const void *C,
                              cublasLtMatrixLayout_t Cdesc, void *D, cublasLtMatrixLayout_t Ddesc,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspaceSizeInBytes,
                              cudaStream_t stream);
#ifdef __cplusplus
}
#endif
#endif
