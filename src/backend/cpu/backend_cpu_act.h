/*
 * backend_cpu_act — the CPU backend's half-precision activation path
 * (backend_cpu_act.c): act_half() says whether the [A] tensors are fp16/bf16
 * now, and act_X(f32, ...) runs the fp32 kernel f32 it is handed on them by
 * widening to fp32 and back. The entry points of backend_cpu.c and
 * backend_cpu_attention.c (backend.h's functions with [A] operands) run
 * either their static fp32 kernel or, through ACT_DISPATCH, its act_ wrapper
 * with that kernel: the wrappers never call backend.h's entry points back.
 */
#ifndef SHARDLM_BACKEND_CPU_ACT_H
#define SHARDLM_BACKEND_CPU_ACT_H

#include "backend/backend.h"

/* At the top of a CPU entry point with [A] operands: hands half-precision
 * activations to the act_ wrapper (emulated devices only). The f64 gradient
 * check and check_kernels' renamed CPU backend compile the entry points
 * without that path (BACKEND_CPU_NO_ACT). */
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
void act_embedding_backward(void (*f32)(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                                        const int32_t *pos, int B, int T, int C),
                            float *dwte, float *dwpe, const float *dout, const int32_t *tokens, const int32_t *pos,
                            int B, int T, int C);
void act_matmul_forward(void (*f32)(float *out, const float *inp, const float *weight, const float *bias, int N, int C,
                                    int OC),
                        float *out, const float *inp, const float *weight, const float *bias, int N, int C, int OC);
void act_matmul_backward(void (*f32)(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                     const float *weight, int N, int C, int OC),
                         float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                         const float *weight, int N, int C, int OC);
void act_matmul_forward_transposed(void (*f32)(float *out, const float *inp, const float *weight, int N, int C, int OC),
                                   float *out, const float *inp, const float *weight, int N, int C, int OC);
void act_matmul_backward_transposed(void (*f32)(float *dinp, float *dweight, const float *dout, const float *inp,
                                                const float *weight, int N, int C, int OC),
                                    float *dinp, float *dweight, const float *dout, const float *inp,
                                    const float *weight, int N, int C, int OC);
void act_layernorm_forward(void (*f32)(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                                       const float *bias, int N, int C),
                           float *out, float *mean, float *rstd, const float *inp, const float *weight,
                           const float *bias, int N, int C);
void act_layernorm_backward(void (*f32)(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                        const float *weight, const float *mean, const float *rstd, float *scratch,
                                        int N, int C),
                            float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, const float *mean, const float *rstd, float *scratch, int N, int C);
void act_gelu_forward(void (*f32)(float *out, const float *inp, size_t n), float *out, const float *inp, size_t n);
void act_gelu_backward(void (*f32)(float *dinp, const float *inp, const float *dout, size_t n), float *dinp,
                       const float *inp, const float *dout, size_t n);
void act_attention_forward(void (*f32)(float *out, float *att, const float *qkv, float *scratch, const int32_t *pos,
                                       int B, int T, int NH, int NKV, int hs, const struct attn_opts *opt),
                           float *out, float *att, const float *qkv, float *scratch, const int32_t *pos, int B, int T,
                           int NH, int NKV, int hs, const struct attn_opts *opt);
void act_attention_backward(void (*f32)(float *dqkv, const float *dout, const float *qkv, const float *att,
                                        const float *out, float *scratch, const int32_t *pos, int B, int T, int NH,
                                        int NKV, int hs, const struct attn_opts *opt),
                            float *dqkv, const float *dout, const float *qkv, const float *att, const float *out,
                            float *scratch, const int32_t *pos, int B, int T, int NH, int NKV, int hs,
                            const struct attn_opts *opt);
void act_attention_kv_forward(void (*f32)(float *out, const float *qkv, float *kc, float *vc, const int32_t *past,
                                          const int32_t *keep, int B, int T, int NH, int NKV, int hs, int Tc,
                                          const struct attn_opts *opt),
                              float *out, const float *qkv, float *kc, float *vc, const int32_t *past,
                              const int32_t *keep, int B, int T, int NH, int NKV, int hs, int Tc,
                              const struct attn_opts *opt);
void act_rmsnorm_forward(void (*f32)(float *out, float *rstd, const float *inp, const float *weight, float offset,
                                     float eps, int N, int C),
                         float *out, float *rstd, const float *inp, const float *weight, float offset, float eps, int N,
                         int C);
void act_rmsnorm_backward(void (*f32)(float *dinp, float *dweight, const float *dout, const float *inp,
                                      const float *weight, float offset, const float *rstd, float *scratch, int N,
                                      int C),
                          float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                          float offset, const float *rstd, float *scratch, int N, int C);
/* A kernel that works in place on n [A] elements of x (its other arguments in args): x widened, f32 run, x
 * narrowed (backend_cpu_gemma.c's soft-capping and scaling). */
void act_in_place(void (*f32)(float *x, const void *args), float *x, size_t n, const void *args);
void act_rope(void (*f32)(float *qkv, const float *cos, const float *sin, const int32_t *pos, int B, int T, int NH,
                          int NKV, int hs, int rot),
              float *x, const float *cos, const float *sin, const int32_t *pos, int B, int T, int NH, int NKV, int hs,
              int rot);
void act_swiglu_forward(void (*f32)(float *out, const float *gu, int N, int F), float *out, const float *gu, int N,
                        int F);
void act_swiglu_backward(void (*f32)(float *dgu, const float *dout, const float *gu, int N, int F), float *dgu,
                         const float *dout, const float *gu, int N, int F);
void act_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, const int32_t *pos,
                           int B, int T, int C);
void act_crossentropy_forward(void (*f32)(float *losses, float *logits, const int32_t *targets, int N, int V, int Vp),
                              float *losses, float *logits, const int32_t *targets, int N, int V, int Vp);
void act_crossentropy_backward(void (*f32)(float *probs, const int32_t *targets, float dloss, int N, int V, int Vp),
                               float *probs, const int32_t *targets, float dloss, int N, int V, int Vp);
void act_crossentropy_backward_rows(void (*f32)(float *probs, const int32_t *targets, const float *dloss, int N,
                                                int V, int Vp),
                                    float *probs, const int32_t *targets, const float *dloss, int N, int V, int Vp);
void act_bias_forward(void (*f32)(float *out, const float *bias, int N, int OC), float *out, const float *bias, int N,
                      int OC);
void act_bias_backward(void (*f32)(float *dbias, const float *dout, int N, int OC), float *dbias, const float *dout,
                       int N, int OC);
void act_scale_rows(void (*f32)(float *x, const float *s, int N, int C), float *x, const float *s, int N, int C);
void act_lora_forward(void (*f32)(float *t, float *scratch, const float *x, const float *A, const struct lora_out *out,
                                  int k, int ld, float scale, const struct lora_dropout *d, int N, int C, int r),
                      float *t, const float *x, const float *A, const struct lora_out *out, int k, int ld, float scale,
                      const struct lora_dropout *d, int N, int C, int r);
void act_lora_backward(void (*f32)(float *dx, float *dA, float *dt, float *scratch, const float *x, const float *t,
                                   const float *A, const struct lora_out *out, int k, int ld, float scale,
                                   const struct lora_dropout *d, int N, int C, int r),
                       float *dx, float *dA, const float *x, const float *t, const float *A, const struct lora_out *out,
                       int k, int ld, float scale, const struct lora_dropout *d, int N, int C, int r);

#endif
