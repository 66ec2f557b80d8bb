/*
 * cudnn_attention — causal attention forward and backward through cuDNN's fused flash attention (SDPA), by
 * cudnn-frontend's graph API (issue 45). The only file that includes cudnn-frontend (a header-only C++17
 * library whose one translation unit costs about a minute of nvcc): cudnn_attention.cu.
 *
 * cuDNN is found at run time, never linked: the first call dlopens libcudnn.so.9 from SHARDLM_CUDNN_LIB (a
 * file or its folder), else the loader's search path, else $CUDA_HOME/lib64 (CUDA_HOME, else /usr/local/cuda);
 * the GPU session points SHARDLM_CUDNN_LIB at the PyTorch wheel's nvidia/cudnn/lib. What backend.h's tensors
 * are to cuDNN is sdpa_layout.h's; one graph is built per shape, dtype and direction and kept for the
 * process; the backward is cuDNN's deterministic algorithm, so that a resumed run stays bit-exact. Built
 * without cudnn-frontend's headers (build/cudnn-frontend-*, tools/deps.sh; and always under tests/cudaemu),
 * the same functions say cuDNN is unavailable, and the caller (cuda_attention.cu) runs its own kernels.
 */
#ifndef SHARDLM_CUDNN_ATTENTION_H
#define SHARDLM_CUDNN_ATTENTION_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "core/dtype.h"

/* CUDNN_VERSION of the headers this file was compiled against (9.19.0: 91900), 0 when built without them. */
long cudnn_attention_headers(void);

/* The loaded library's cudnnGetVersion(), loading it at the first call; 0 when there is none, with *why (a
 * static message) saying what was tried. */
long cudnn_attention_library(const char **why);

struct attn_opts; /* backend.h: window, soft-cap, scale (NULL: plain causal) */

/* The forward as backend.h's attention_gqa_forward (out [A], lse (B, NH, T) fp32, from qkv [A] and pos or
 * NULL, pos in device memory) on stream: 1 when cuDNN ran it, 0 when it refused the call (why filled: one line;
 * nothing written). fp16/bf16 only. Of opt's variants, the window (a top-left causal band,
 * set_diagonal_band_left_bound: keys kv > q - W) and the scale go into the graph; a soft-cap is refused, so that
 * the own kernels (tensor-core, FP32) run those layers. */
int cudnn_attention_forward(void *out, float *lse, const void *qkv, const int32_t *pos, int B, int T, int NH,
                            int NKV, int hs, const struct attn_opts *opt, enum dtype act, cudaStream_t stream,
                            char *why, size_t why_cap);

/* The backward (dqkv [A] overwritten) from dout, the forward's out and lse; as above. */
int cudnn_attention_backward(void *dqkv, const void *dout, const void *out, const void *qkv, const float *lse,
                             const int32_t *pos, int B, int T, int NH, int NKV, int hs, const struct attn_opts *opt,
                             enum dtype act, cudaStream_t stream, char *why, size_t why_cap);

/* Packed rows' statistics between lse's (B, NH, T) and cuDNN's token-major (B T, NH) (sdpa_layout.h): dst = src
 * transposed, to_token_major 1: lse -> token-major, 0: back; on stream. Defined in cuda_attention.cu (this file's
 * translation unit has no device code: nvcc's device passes skip it). */
void attention_lse_transpose(float *dst, const float *src, int B, int T, int NH, int to_token_major,
                             cudaStream_t stream);

/* How many attention calls cuDNN ran so far (tests/gpu/check_kernels.c checks its cases take it). */
long backend_cuda_attention_cudnn_calls(void);
#ifdef __cplusplus
}
#endif

#endif
