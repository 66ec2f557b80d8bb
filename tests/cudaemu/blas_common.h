/* cudaemu: what the emulated cuBLAS (cublas.cc) and cuBLASLt (cublaslt.cc) share: element access by
 * cudaDataType_t, the supported type table, operand extents, and the product itself. */
#ifndef CUDAEMU_BLAS_COMMON_H
#define CUDAEMU_BLAS_COMMON_H
#include <stddef.h>

#include <vector>

#include "cublas_v2.h"

size_t blas_size(cudaDataType_t t);
/* Element i of p (type t) widened to float; a float rounded to nearest even into it. */
float blas_load(const void *p, cudaDataType_t t, size_t i);
void blas_store(void *p, cudaDataType_t t, size_t i, float v);
/* The docs' table for CUBLAS_COMPUTE_32F[_FAST_TF32] (cublas.cc). */
int blas_types_ok(cudaDataType_t a, cudaDataType_t b, cudaDataType_t c, cublasComputeType_t compute);
/* Bytes from the first to one past the last element of a column-major rows x cols matrix, leading dimension ld. */
size_t blas_span(long long rows, long long cols, long long ld, size_t elem);
/* 1 when [p, p + bytes) lies inside one cudaMalloc/cudaHostAlloc allocation. */
int blas_inside(const void *p, size_t bytes);
/* out (col-major m x n, ld m) = alpha op(A) op(B), products accumulated in double; opa (m * k) and opb (n * k)
 * hold op(A)'s rows and op(B)'s columns afterwards. */
void blas_product(std::vector<float> &out, std::vector<float> &opa, std::vector<float> &opb, cublasOperation_t ta,
                  cublasOperation_t tb, int m, int n, int k, float alpha, const void *A, cudaDataType_t at,
                  long long lda, const void *B, cudaDataType_t bt, long long ldb);
#endif
