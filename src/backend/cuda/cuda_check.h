/*
 * cuda_check — checked calls into the CUDA runtime, cuBLAS and NCCL.
 *
 * Every call is wrapped: a failure ends the process with one line naming the
 * call's file and line and the library's own description of the error
 * (fail_internal: exit status 1, MPI_Abort when MPI is running).
 */
#ifndef SHARDLM_CUDA_CHECK_H
#define SHARDLM_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "core/util.h"
#ifdef __cplusplus
}
#endif

#define cudaCheck(call)                                                                                   \
    do {                                                                                                  \
        cudaError_t _e = (call);                                                                          \
        if (_e != cudaSuccess)                                                                            \
            fail_internal("CUDA error at %s:%d: %s (%s)", __FILE__, __LINE__, cudaGetErrorString(_e), #call); \
    } while (0)

#define cublasCheck(call)                                                                                 \
    do {                                                                                                  \
        cublasStatus_t _s = (call);                                                                       \
        if (_s != CUBLAS_STATUS_SUCCESS)                                                                  \
            fail_internal("cuBLAS error at %s:%d: %s (%s)", __FILE__, __LINE__, cublasGetStatusString(_s), #call); \
    } while (0)

#endif
