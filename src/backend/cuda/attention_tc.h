/*
 * attention_tc — causal attention with its matrix products on tensor cores (attention_tc.cu), for fp16/bf16
 * activations and head sizes that are multiples of 16 up to 128. backend_cuda.cu's attention calls these first
 * and runs its FP32 kernels when they answer 0.
 */
#ifndef SHARDLM_ATTENTION_TC_H
#define SHARDLM_ATTENTION_TC_H

#include <cuda_runtime.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "core/dtype.h"

struct attn_opts; /* backend.h: window, soft-cap, scale (NULL: plain causal) */

/* The forward (out [A], lse (B, NH, T) fp32, from qkv [A] and pos or NULL, as backend.h's) on stream, or 0 when it
 * does not apply: activations fp32, a head size not a multiple of 16 or above 128, or SHARDLM_ATTN_TC=0. */
int attention_tc_forward(void *out, float *lse, const void *qkv, const int32_t *pos, int B, int T, int NH, int NKV,
                         int hs, const struct attn_opts *opt, enum dtype act, cudaStream_t stream);

/* The backward (dqkv [A], overwritten) from dout, the forward's out [A] and lse, as backend.h's; 0 when it does
 * not apply (as above). */
int attention_tc_backward(void *dqkv, const void *dout, const void *out, const void *qkv, const float *lse,
                          const int32_t *pos, int B, int T, int NH, int NKV, int hs, const struct attn_opts *opt,
                          enum dtype act, cudaStream_t stream);

/* How many attention calls ran on tensor cores so far (tests/gpu/check_kernels.c checks its cases take them). */
long backend_cuda_attention_tc_calls(void);
#ifdef __cplusplus
}
#endif

#endif
