/*
 * backend_cpu_act — the CPU backend's half-precision activation path
 * (backend_cpu_act.c): act_half() says whether the [A] tensors are fp16/bf16
 * now, and act_X runs kernel X on them by widening to fp32 and back.
 * backend_cpu.c and backend_cpu_attention.c call these at the top of each
 * kernel with [A] operands (ACT_DISPATCH).
 */
#ifndef SHARDLM_BACKEND_CPU_ACT_H
#define SHARDLM_BACKEND_CPU_ACT_H

#include "backend/backend.h"

/* At the top of a CPU kernel with [A] operands: hands half-precision
 * activations to the act_ wrapper (emulated devices only). The f64 gradient
 * check and check_kernels' renamed CPU backend compile the kernels without
 * that path (BACKEND_CPU_NO_ACT). */
#ifdef BACKEND_CPU_NO_ACT
#define ACT_DISPATCH(call) ((void)0)
#else
#define ACT_DISPATCH(call)  \
    do {                    \
        if (act_half()) {   \
            call;           \
            return;         \
        }                   \
    } while (0)
#endif

int act_half(void);
void act_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, const int32_t *pos,
                            int B, int T, int C);
void act_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int C, int OC);
void act_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                         const float *weight, int N, int C, int OC);
void act_matmul_forward_transposed(float *out, const float *inp, const float *weight, int N, int C, int OC);
void act_matmul_backward_transposed(float *dinp, float *dweight, const float *dout, const float *inp,
                                    const float *weight, int N, int C, int OC);
void act_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                           const float *bias, int N, int C);
void act_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, const float *mean, const float *rstd, float *scratch, int N, int C);
void act_gelu_forward(float *out, const float *inp, size_t n);
void act_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
void act_attention_forward(float *out, float *att, const float *qkv, float *scratch, const int32_t *pos, int B, int T,
                           int NH, int NKV, int hs);
void act_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att, const float *out,
                            float *scratch, const int32_t *pos, int B, int T, int NH, int NKV, int hs);
void act_attention_kv_forward(float *out, const float *qkv, float *kc, float *vc, const int32_t *past, int B, int T,
                              int NH, int NKV, int hs, int Tmax);
void act_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, float eps, int N, int C);
void act_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                          const float *rstd, float *scratch, int N, int C);
void act_rope(float *x, const float *cos, const float *sin, const int32_t *pos, float sign, int B, int T, int NH,
              int NKV, int hs);
void act_swiglu_forward(float *out, const float *gu, int N, int F);
void act_swiglu_backward(float *dgu, const float *dout, const float *gu, int N, int F);
void act_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                           const int32_t *pos, int B, int T, int C);
void act_crossentropy_forward(float *losses, float *logits, const int32_t *targets, int N, int V, int Vp);
void act_crossentropy_backward(float *probs, const int32_t *targets, float dloss, int N, int V, int Vp);
void act_lora_forward(float *t, const float *x, const float *A, const struct lora_out *out, int k, int ld,
                      float scale, const struct lora_dropout *d, int N, int C, int r);
void act_lora_backward(float *dx, float *dA, const float *x, const float *t, const float *A,
                       const struct lora_out *out, int k, int ld, float scale, const struct lora_dropout *d, int N,
                       int C, int r);

#endif
