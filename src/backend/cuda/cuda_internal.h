/*
 * cuda_internal — what the files of the CUDA backend share (private to src/backend/cuda/).
 *
 * CUDA backend: backend.h on device pointers (DESIGN §9).
 *
 * Matmuls (attention's included) go through cublasGemmEx, or cublasLtMatmul
 * where an epilogue folds in bias, GELU or the bias gradient (see "matmuls
 * with an epilogue"), with fp32 accumulation, on [A] operands (backend.h: fp32, or fp16/bf16 when training
 * in half precision, on tensor cores); TF32 only when SHARDLM_TF32=1 and only
 * for fp32 storage. Every other kernel loads [A] elements into fp32
 * registers, computes in fp32 and rounds its [A] outputs to nearest even:
 * the statistics of layernorm and RMSNorm, softmax, rotary tables, SwiGLU's
 * sigmoid, cross-entropy and the loss are fp32 always.
 * Row-major tensors are handed to column-major cuBLAS as their transposes: a
 * row-major (R, S) matrix is a column-major (S, R) one, so out = inp @ W
 * becomes out^T = W^T @ inp^T with the operands swapped.
 *
 * Every reduction has a fixed order (no atomics), so results are the same
 * from run to run: bit-exact resume holds on the GPU as on the CPU.
 *
 * All work is on one stream per process (backend_cuda_stream()); the
 * functions that return a value to the host (sum of squares, finite check,
 * copies) wait for it, never forever (stream_wait).
 *
 * One file per kernel family: cuda_matmul.cu (cuBLAS GEMMs, the cuBLASLt epilogues, the
 * library workspace), cuda_lora.cu (the LoRA adapters), cuda_norm.cu (layernorm, RMSNorm),
 * cuda_elementwise.cu (GELU, residual adds, scale, zero, RoPE, SwiGLU), cuda_attention.cu (causal
 * attention and attention with a key/value cache), cuda_embedding_loss.cu (embeddings and
 * cross-entropy), cuda_reduce.cu (sums of squares, the finite check, the fused AdamW step),
 * cudnn_attention.cu (cuDNN's fused attention, the one file that includes cudnn-frontend) and
 * cuda_memory.cu (device selection, the handles and streams, memory spaces, copies and casts);
 * comm_nccl.cu is the NCCL transport. This header holds what more than one of them uses: the
 * launch geometry, the device state (defined once, in cuda_memory.cu), the loads and stores of
 * [A] elements and the helpers that several families call.
 */
#ifndef SHARDLM_CUDA_INTERNAL_H
#define SHARDLM_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"

extern "C" {
#include "core/adamw.h"
#include "backend/backend.h"
}

#define WARP 32
#define BLOCK 256

/* The device state, defined in cuda_memory.cu (backend_init sets it up). */
extern cublasHandle_t g_cublas;
extern cublasLtHandle_t g_cublaslt; /* the matmuls with a fused epilogue (lt_matmul) */
extern cudaStream_t g_stream;
extern cublasComputeType_t g_compute;
extern double *g_partials;   /* device: per-block partial sums */
extern double *g_partials_h; /* pinned host copy */
extern int *g_flag;          /* device: finite check */
#define MAX_REDUCE_BLOCKS 1024
/* Column sums over many rows (bias and layernorm gradients) in two fixed-order
 * stages: row chunks in parallel into g_colsum, then the chunks in order. */
#define COLSUM_FLOATS (1u << 20)
#define COLSUM_MAX_CHUNKS 64
extern float *g_colsum;
extern enum dtype g_act;  /* [A] in backend.h */
extern enum dtype g_grad; /* [G] in backend.h */

/* cuda_memory.cu */
/* Before a kernel of the compute stream touches host (pinned) memory: the
 * copy stream's transfers into it come first. */
void order_host(const void *p, size_t bytes);
/* Waits for the stream like cudaStreamSynchronize, but never forever: work
 * queued behind a collective that waits for a dead rank would block the host
 * for good, so the wait polls, asks the NCCL watchdog, and after the timeout
 * ends the job (fail_internal: the abort hooks abort NCCL and MPI). */
void stream_wait(void);
unsigned blocks_for(size_t n, unsigned threads);

/* cuda_matmul.cu */
/* C (col-major m x n, ldc) = alpha op(A) op(B) + beta C. A and B are [A]; C
 * is [A] (c_grad 0) or [G] (1: weight gradients). fp32 accumulation always;
 * TF32 only when configured and only for fp32 storage. */
void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const void *A, int lda,
          const void *B, int ldb, float beta, void *C, int ldc, int c_grad);
/* Row chunks for `sums` column sums of `cols` columns each over N rows: as many as
 * fit g_colsum (at most COLSUM_MAX_CHUNKS), a function of the shapes only. */
int colsum_chunks(int N, int cols, int sums);
/* Stage 2 of a column sum: dst[c] += the chunks' partials in chunk order.
 * dst [G] (dtype dt): one rounding per element. */
__global__ void column_sums_finish(void *dst, enum dtype dt, const float *partial, int OC, int chunks);

/* cuda_elementwise.cu: x[i] = 0 for i < n. */
__global__ void zero_kernel(float *x, size_t n);

/* Loads and stores of [A] elements, in fp32 registers; stores round to nearest even. */
__device__ __forceinline__ float ld(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __half *p, size_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float ld(const __nv_bfloat16 *p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__half *p, size_t i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void st(__nv_bfloat16 *p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }

/* Runs `body` with A bound to the C type of the activation dtype. */
#define WITH_ACT(...)                           \
    do {                                        \
        if (g_act == DTYPE_BF16) {              \
            typedef __nv_bfloat16 A;            \
            __VA_ARGS__;                        \
        } else if (g_act == DTYPE_F16) {        \
            typedef __half A;                   \
            __VA_ARGS__;                        \
        } else {                                \
            typedef float A;                    \
            __VA_ARGS__;                        \
        }                                       \
    } while (0)

/* Element i of an fp32, fp16 or bf16 buffer, in fp32. */
__device__ static inline float load_as_f32(const void *src, enum dtype dt, size_t i)
{
    if (dt == DTYPE_F16)
        return __half2float(((const __half *)src)[i]);
    if (dt == DTYPE_BF16)
        return __bfloat162float(((const __nv_bfloat16 *)src)[i]);
    return ((const float *)src)[i];
}

/* Round to nearest even, as dtype.h does on the host. */
__device__ static inline void store_from_f32(void *dst, enum dtype dt, size_t i, float v)
{
    if (dt == DTYPE_F16)
        ((__half *)dst)[i] = __float2half_rn(v);
    else if (dt == DTYPE_BF16)
        ((__nv_bfloat16 *)dst)[i] = __float2bfloat16_rn(v);
    else
        ((float *)dst)[i] = v;
}

/* The block's (BLOCK threads) sum, or maximum, of v: every thread gets it. */
__device__ static inline float block_reduce(float v, bool take_max)
{
    __shared__ float shared[BLOCK / WARP];
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    for (int o = WARP / 2; o > 0; o /= 2) {
        float other = __shfl_xor_sync(0xffffffffu, v, o);
        v = take_max ? fmaxf(v, other) : v + other;
    }
    __syncthreads();
    if (lane == 0)
        shared[warp] = v;
    __syncthreads();
    v = take_max ? -INFINITY : 0.0f;
    for (int w = 0; w < BLOCK / WARP; w++)
        v = take_max ? fmaxf(v, shared[w]) : v + shared[w];
    return v;
}

#endif
