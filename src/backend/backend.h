/*
 * backend — the kernels the model needs, on the "device" (DESIGN §9).
 *
 * The CPU backend (backend_cpu.c) computes in fp32 with OpenBLAS sgemm for
 * every matmul (attention included) and OpenMP for the rest; the CUDA backend
 * (cuda/) implements the same functions on device pointers. The engine and the
 * model code call only these functions; they never see BLAS, OpenMP or CUDA.
 *
 * Conventions, shared by every backend:
 *   - row-major tensors; shapes are given in the comment of each function;
 *     B batch, T sequence, C channels, NH heads, V real vocabulary,
 *     Vp padded vocabulary, OC output channels;
 *   - weight and bias gradients are accumulated (+=), so micro-batches add up;
 *   - a NULL weight gradient (the matmuls' and the norms' dweight) means the
 *     weights are frozen (zero.h): only the input gradient is computed, and
 *     the bias gradient is skipped with it, whatever dbias is;
 *   - input gradients of matmuls and attention are overwritten; layernorm's
 *     input gradient is accumulated, because its input is the residual stream
 *     whose gradient already holds the skip connection's share.
 *   - the statistics of layernorm, the softmax of attention and of the
 *     cross-entropy, and the loss are fp32 in every precision.
 *
 * Activation dtype. The tensors marked [A] hold elements of the activation
 * dtype (backend_set_act_dtype), whatever their C type: fp32 by default, the
 * parameter dtype when a device backend trains in fp16/bf16. Then matmul
 * operands, their outputs, attention's inputs and outputs, GELU, the
 * layernorm inputs, outputs and weights, the residual stream and its
 * gradient and the logits are half precision, as in a model held in that
 * dtype (DESIGN §5), while the layernorm statistics, the attention's
 * log-sum-exp, the softmax arithmetic and the losses stay fp32 (weight
 * gradients: [G] below). Unmarked float pointers are always fp32.
 */
#ifndef SHARDLM_BACKEND_H
#define SHARDLM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

#ifndef SHARDLM_MEM_SPACE /* tests/gpu/cpu_names_decl.h reads this header twice */
#define SHARDLM_MEM_SPACE
/* Memory spaces: where a buffer lives (backend_mem_alloc below; the arenas,
 * arena.h, hold one space each). */
enum mem_space { SPACE_DEVICE = 0, SPACE_PINNED, SPACE_HOST, SPACE_COUNT };

/* The space's name in messages and in the memory plan's tables. */
static inline const char *mem_space_name(enum mem_space s)
{
    static const char *const names[SPACE_COUNT] = {"device", "pinned host", "host"};
    return names[s];
}
#endif

/* Weight-gradient dtype: the tensors marked [G] (weight and bias gradients)
 * hold elements of it. fp32 by default; the parameter dtype when a device
 * backend keeps its unit gradient buffers in it (ZeRO stages 2-3 with
 * half-precision activations: DESIGN §5), so that a unit's gradient goes to
 * its reduce-scatter as the kernels wrote it. Accumulation (+=) then reads
 * the half-precision value, adds in fp32 and rounds once per call, as a GEMM
 * with beta 1 does. The CPU backend accepts half precision only under
 * SHARDLM_EMULATE_DEVICE, like backend_set_act_dtype. */
void backend_set_grad_dtype(enum dtype dt);
enum dtype backend_grad_dtype(void);

/* Sets thread counts (0: leave the defaults); call before sizing any scratch buffer. */
void backend_init(int threads);
/* The storage dtype of the [A] tensors (default fp32). The CPU backend
 * accepts half precision only under SHARDLM_EMULATE_DEVICE (it then converts
 * around its fp32 kernels); its own training computes in fp32. */
void backend_set_act_dtype(enum dtype dt);
enum dtype backend_act_dtype(void);
/* Warns once when the backend runs far below what the machine can do. */
void backend_check_performance(void);
const char *backend_name(void);
/* 1 when the pointers these functions take are device memory (CUDA), 0 when
 * they are host memory (CPU). */
int backend_is_device(void);

/* out [A] (N, OC) = inp [A] (N, C) @ weight [A] (C, OC) + bias [A] (OC); bias may be NULL. */
void backend_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                            int N, int C, int OC);
/* dinp [A] (N, C) = dout [A] @ weight [A]^T (overwritten; skipped when dinp is NULL); inp [A];
 * dweight [G] (C, OC) += inp^T @ dout; dbias [G] (OC) += column sums of dout (skipped when NULL). */
void backend_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, int N, int C, int OC);

/* The MLP's first matmul and its GELU in one call: pre [A] (N, OC) = inp [A] (N, C) @ weight [A] (C, OC)
 * + bias [A] (OC) (bias may be NULL), out [A] (N, OC) = tanh-approximated GELU(pre). pre is kept for
 * backend_matmul_backward_gelu. Equal to backend_matmul_forward then backend_gelu_forward (the CPU
 * backend computes exactly that; a device may fold bias and GELU into the matmul's epilogue, its
 * GELU then reading pre before the rounding to [A]). */
void backend_matmul_forward_gelu(float *pre, float *out, const float *inp, const float *weight, const float *bias,
                                 int N, int C, int OC);
/* The MLP's second matmul's backward with the GELU derivative of its input folded in:
 * dpre [A] (N, C) = GELU'(pre [A] (N, C)) * (dout [A] (N, OC) @ weight [A]^T) (overwritten), where
 * inp [A] (N, C) = GELU(pre) was the matmul's input; dweight [G] (C, OC) += inp^T @ dout; dbias [G] (OC) +=
 * column sums of dout (skipped when NULL). Equal to backend_matmul_backward then backend_gelu_backward
 * in place (the CPU backend's composition; a device may skip the rounding between the two). */
void backend_matmul_backward_gelu(float *dpre, float *dweight, float *dbias, const float *dout, const float *inp,
                                  const float *weight, const float *pre, int N, int C, int OC);

/* out [A] (N, OC) = inp [A] (N, C) @ weight [A]^T, weight (OC, C): the LM head tied to wte. */
void backend_matmul_forward_transposed(float *out, const float *inp, const float *weight, int N, int C, int OC);
/* nn.Linear with a bias (Qwen2's q|k|v): out [A] (N, OC) = inp [A] (N, C) @ weight [A]^T + bias [A] (OC), weight
 * (OC, C); bias NULL: backend_matmul_forward_transposed. The CPU backend computes exactly that matmul then
 * backend_bias_forward; a device adds the bias in the matmul's epilogue (one rounding to [A]), or runs the two
 * where its library offers no such epilogue. */
void backend_matmul_forward_transposed_bias(float *out, const float *inp, const float *weight, const float *bias, int N,
                                            int C, int OC);
/* dinp [A] (N, C) = dout [A] @ weight [A] (overwritten); dweight [G] (OC, C) += dout^T @ inp [A]. */
void backend_matmul_backward_transposed(float *dinp, float *dweight, const float *dout, const float *inp,
                                        const float *weight, int N, int C, int OC);

/* out [A], mean, rstd = layernorm(inp [A] (N, C)) * weight [A] + bias [A], eps 1e-5 as GPT-2. */
void backend_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                               const float *weight, const float *bias, int N, int C);
/* dinp [A] += ..., dweight [G] += ..., dbias [G] += ...; dout [A], inp [A], weight [A];
 * scratch: backend_layernorm_scratch(C) floats. */
void backend_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const float *weight, const float *mean,
                                const float *rstd, float *scratch, int N, int C);
size_t backend_layernorm_scratch(int C);

/* out [A] = tanh-approximated GELU(inp [A]), n elements */
void backend_gelu_forward(float *out, const float *inp, size_t n);
/* dinp [A] = GELU'(inp [A]) * dout [A] (overwritten) */
void backend_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);

/* out (n) = a + b */
void backend_add(float *out, const float *a, const float *b, size_t n);
/* out [A] (n) = a [A] + b [A]: a projection's output added into the residual stream. */
void backend_add_act(float *out, const float *a, const float *b, size_t n);

/* Packed rows (instruction fine-tuning: several samples laid end to end in
 * one row of T tokens). pos (B, T) int32, in the kernels' memory (device
 * memory on a device backend, like the token arrays), holds each token's
 * position within its sample: 0 at a sample's first token, then 1, 2, ...;
 * so pos[b, 0] = 0 and pos[b, t] is 0 or pos[b, t - 1] + 1. Token t belongs
 * to the sample that starts at t - pos[b, t]. pos NULL: one sample per row,
 * pos[b, t] = t, bit for bit today's results. The attention keeps each
 * query inside its sample (block-diagonal causal), rotary and the learned
 * position table read row pos[b, t]; trailing padding is one more sample (or
 * several) whose targets the cross-entropy ignores. */

/* Causal multi-head self-attention.
 * qkv [A] (B, T, 3C): q, k, v concatenated as GPT-2's c_attn produces them;
 * out [A] (B, T, C); att: what the forward keeps for the backward,
 * backend_attention_saved(B, T, NH) bytes: each row's log-sum-exp of its
 * scaled scores (natural log) (B, NH, T) in fp32, from which the backward
 * recomputes the probabilities (memory O(T)) — the CUDA backend, and the
 * CPU backend's tiled kernel (the default); the CPU backend's materialized
 * kernel (SHARDLM_ATTENTION=materialized, backend_cpu_attention.h) keeps
 * the softmax probabilities [A] (B, NH, T, T) (zero outside each row's
 * keys). scratch: backend_attention_scratch(T, NH) floats, for the forward
 * and the backward (the CPU's tiled kernel: a few tiles per thread, not
 * growing with T past one tile). Query t attends keys j with
 * t - pos[b, t] <= j <= t (pos NULL: 0 <= j <= t): the probabilities outside
 * are exactly 0, and a packed row gives each sample what it gives alone.
 * Keys outside every query's range are skipped, not computed and masked, so
 * a packed row costs less than T x T. */
void backend_attention_forward(float *out, float *att, const float *qkv, float *scratch, const int32_t *pos, int B,
                               int T, int C, int NH);
/* dqkv [A] (B, T, 3C) overwritten; dout [A], qkv [A], att as the forward
 * left it, out [A] the forward's output (D_i = dout_i . out_i where the
 * probabilities are recomputed), pos the forward's. */
void backend_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att, const float *out,
                                float *scratch, const int32_t *pos, int B, int T, int C, int NH);
size_t backend_attention_scratch(int T, int NH);
size_t backend_attention_saved(int B, int T, int NH);
/* One layer's attention variant, decided once at set-up (the model's config: family_acts.attn[l]) and read by
 * the kernels as data; NULL or all zero: full causal attention, no soft-cap, scores scaled by 1 / sqrt(hs).
 *   window   W > 0: the query at position p (within its sample, as pos says) sees the keys at positions
 *            p - W + 1 .. p of its sample, W keys with itself: transformers' sliding window (masking_utils:
 *            kv_idx > q_idx - sliding_window; Mistral, Qwen2's sliding layers, Gemma 2/3's sliding layers);
 *   softcap  c > 0: each scaled score s becomes c tanh(s / c) before the softmax (Gemma 2's
 *            attn_logit_softcapping); the backward carries d tanh exactly;
 *   scale    the scores' factor, s = scale q.k; 0: 1 / sqrt(hs) (Gemma: query_pre_attn_scalar^-0.5). */
#ifndef SHARDLM_ATTN_OPTS /* read twice by tests/gpu/cpu_names_decl.h, as mem_space above */
#define SHARDLM_ATTN_OPTS
struct attn_opts {
    int window;
    float softcap;
    float scale;
};
#endif

/* Grouped-query attention (Llama): the same, with qkv [A] (B, T, (NH + 2 NKV) hs)
 * holding NH query heads, then NKV key heads, then NKV value heads of hs
 * channels each; query head h reads key/value head h / (NH / NKV); out [A]
 * (B, T, NH hs); scores scaled, capped and windowed as opt says (NULL: 1 / sqrt(hs), full causal). NKV divides
 * NH. The GPT-2 calls above are this one with NKV = NH, hs = C / NH and opt NULL (the same bits). The
 * backward sums a key/value head's gradient over its query heads in head
 * order. att, scratch: sized for NH heads as above. */
void backend_attention_gqa_forward(float *out, float *att, const float *qkv, float *scratch, const int32_t *pos,
                                   int B, int T, int NH, int NKV, int hs, const struct attn_opts *opt);
void backend_attention_gqa_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                                    const float *out, float *scratch, const int32_t *pos, int B, int T, int NH,
                                    int NKV, int hs, const struct attn_opts *opt);

/* RMSNorm (Llama): rstd (N) = 1 / sqrt(mean(inp^2) + eps) in fp32, out [A] (N, C) =
 * inp [A] * rstd * weight [A], as Hugging Face's LlamaRMSNorm. */
/* Generation with a key/value cache (family.h struct family_kv): T new tokens
 * of each of B rows, qkv [A] (B, T, (NH + 2 NKV) hs) as above (after rotary);
 * row b's token t sits at position past[b] + t. kc, vc [A] (B, Tc, NKV hs)
 * hold the keys and values of the positions before past[b], position p in
 * slot p % Tc: a ring of the last Tc positions (a full layer: Tc the longest
 * sequence, so slot p = p; a sliding layer: Tc >= opt->window, the window
 * only). Each token attends to positions max(0, p - W + 1) .. p of its row
 * (W = opt->window, 0: from 0), those before past[b] from the cache, the
 * others from qkv: out [A] (B, T, NH hs). Then the first keep[b] tokens' keys
 * and values (the row's real ones; those after are padding) are stored, the
 * last Tc of them. Scores as backend_attention_gqa_forward's, softmax in
 * fp32. past, keep: int32 (B) in the kernels' memory (the device's on a
 * GPU); keep NULL: all T. A full layer needs past[b] + T <= Tc. */
void backend_attention_kv_forward(float *out, const float *qkv, float *kc, float *vc, const int32_t *past,
                                  const int32_t *keep, int B, int T, int NH, int NKV, int hs, int Tc,
                                  const struct attn_opts *opt);

void backend_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, float eps, int N, int C);
/* dinp [A] += ... (accumulated, as layernorm's), dweight [G] += ...; dout [A], inp [A], weight [A];
 * scratch: backend_layernorm_scratch(C) floats. */
void backend_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                              const float *rstd, float *scratch, int N, int C);

/* Gemma's RMSNorm: y = x s (offset + w), the same kernels with the weight
 * read as offset + w (offset 0: the plain RMSNorm above; Gemma 1, its
 * weights stored as w with (1 + w) applied, in fp32, as transformers'
 * Gemma2RMSNorm); dweight gets the same sum either way. */
void backend_rmsnorm_offset_forward(float *out, float *rstd, const float *inp, const float *weight, float offset,
                                    float eps, int N, int C);
void backend_rmsnorm_offset_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                     const float *weight, float offset, const float *rstd, float *scratch, int N,
                                     int C);

/* A bias on every row, for the matmuls without one of their own (the
 * transposed ones: Qwen2's q|k|v): out [A] (N, OC) += bias [A] (OC). */
void backend_bias_forward(float *out, const float *bias, int N, int OC);
/* dbias [G] (OC) += the column sums of dout [A] (N, OC), in a fixed order
 * (the same bits every run); nothing when dbias is NULL. */
void backend_bias_backward(float *dbias, const float *dout, int N, int OC);
/* Columns [src_col, src_col + width) of the N rows of src [A] (row stride
 * src_ld elements) into columns [dst_col, dst_col + width) of dst [A] (row
 * stride dst_ld): the query and key heads of qkv to and from contiguous rows
 * for the per-head RMSNorm (Qwen3's q_norm and k_norm). */
void backend_copy_cols(float *dst, int dst_ld, int dst_col, const float *src, int src_ld, int src_col, int N,
                       int width);

/* Rotary position embedding in place on the query and key heads of qkv [A]
 * (B, T, (NH + 2 NKV) hs) (the first NH + NKV heads of each row; values are
 * left alone), Hugging Face's rotate-half convention over the first rot
 * channels of each head (rot = hs, or fewer: a partial rotary, Phi-4-mini's
 * partial_rotary_factor; the others pass through): for i < rot / 2 and token
 * (b, t) at position p = pos[b, t] (pos NULL: p = t), (x[i], x[i + rot/2])
 * becomes (x[i] cos - x[i + rot/2] sin, x[i + rot/2] cos + x[i] sin) with
 * cos = cos[p, i], sin = sin[p, i], tables (at least T rows, rot / 2) fp32.
 * rot is even. The backward applies the inverse rotation (sin negated) to the
 * gradient dqkv [A] in place. */
void backend_rope_forward(float *qkv, const float *cos, const float *sin, const int32_t *pos, int B, int T, int NH,
                          int NKV, int hs, int rot);
void backend_rope_backward(float *dqkv, const float *cos, const float *sin, const int32_t *pos, int B, int T, int NH,
                           int NKV, int hs, int rot);

/* SwiGLU (Llama's MLP): out [A] (N, F) = silu(gu[:, :F]) * gu[:, F:] with gu [A]
 * (N, 2F) the gate and up projections side by side (one matmul over gate_proj
 * and up_proj, which a Llama unit stores one after the other), silu(x) =
 * x / (1 + exp(-x)). */
void backend_swiglu_forward(float *out, const float *gu, int N, int F);
/* dgu [A] (N, 2F) overwritten: d gate = dout * up * silu'(gate), d up = dout * silu(gate). */
void backend_swiglu_backward(float *dgu, const float *dout, const float *gu, int N, int F);
/* GeGLU (Gemma's MLP, hidden_activation gelu_pytorch_tanh): out [A] (N, F)
 * = gelu_tanh(gu[:, :F]) * gu[:, F:], the GELU of backend_gelu_forward. */
void backend_geglu_forward(float *out, const float *gu, int N, int F);
/* dgu [A] (N, 2F) overwritten: d gate = dout * up * gelu'(gate), d up = dout * gelu(gate). */
void backend_geglu_backward(float *dgu, const float *dout, const float *gu, int N, int F);
/* x [A] (n) *= s, in the activation dtype (Gemma's embedding times sqrt(n_embd)). */
void backend_scale_act(float *x, float s, size_t n);
/* Soft-capping of the final logits (Gemma 2's final_logit_softcapping), in
 * place on the first V of Vp columns of logits [A] (N, Vp): y = cap
 * tanh(z / cap), fp32; lse (N, fp32) receives each row's log-sum-exp of the
 * capped logits, which the backward needs once the cross-entropy has turned
 * them into probabilities. */
void backend_logit_softcap_forward(float *logits, float *lse, float cap, int N, int V, int Vp);
/* The cross-entropy's backward through the cap: probs [A] (N, Vp) (the
 * cross-entropy forward's, of capped logits y) are replaced by dz = (probs -
 * onehot) d (1 - (y / cap)^2), y = log probs + lse; d = dloss_rows[i]
 * (fp32, N) or dloss when dloss_rows is NULL; the whole row 0 where the
 * target is < 0, padded columns 0. */
void backend_crossentropy_softcap_backward(float *probs, const int32_t *targets, float dloss, const float *dloss_rows,
                                           const float *lse, float cap, int N, int V, int Vp);

/* The CUDA backend's (the planner plans the CUDA build from any build): no
 * scratch, and the rows' log-sum-exp. */
#define BACKEND_CUDA_ATTENTION_SCRATCH(T, NH) ((void)(T), (void)(NH), (size_t)0)
#define BACKEND_CUDA_ATTENTION_SAVED(B, T, NH) ((size_t)(B) * (size_t)(NH) * (size_t)(T) * sizeof(float))

/* The math libraries' workspace, in bytes, that the memory plan reserves in
 * the workspace class and hands over with backend_set_library_workspace (the
 * CPU backend: none). cuBLAS on Hopper: NVIDIA recommends 32 MiB
 * (cublasSetWorkspace); with it in the arena, cuBLAS allocates nothing of its
 * own during the run. */
#define BACKEND_CUDA_LIBRARY_WORKSPACE ((size_t)32 << 20)
size_t backend_library_workspace(void);
void backend_set_library_workspace(void *p, size_t bytes);

/* out [A] (B, T, C) = wte [A] [tokens] + wpe [A] [position], position = pos[b, t]
 * (pos NULL: t); wpe NULL: no position table (Llama, whose positions are rotary) */
void backend_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                               const int32_t *pos, int B, int T, int C);
/* dwte [G] [tokens] += dout [A]; dwpe [G] [position] += dout (skipped when dwpe is NULL), tokens in order */
void backend_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                                const int32_t *pos, int B, int T, int C);

/* Cross-entropy over the first V of Vp logits per row, fp32.
 * logits [A] (N, Vp) are replaced by the softmax probabilities (padded columns 0);
 * losses (N) receive -log p[target]. A target < 0 marks a position that is
 * not trained (a prompt token, padding): its loss is 0 (its probabilities
 * are still written). */
void backend_crossentropy_forward(float *losses, float *logits, const int32_t *targets, int N, int V, int Vp);
/* probs [A] (N, Vp) are replaced by dlogits = (probs - onehot(target)) * dloss; padded columns 0;
 * the whole row 0 where the target is < 0. */
void backend_crossentropy_backward(float *probs, const int32_t *targets, float dloss, int N, int V, int Vp);
/* The same with a scale per row: dloss (N) fp32 (DPO: each position's d loss / d its cross-entropy). */
void backend_crossentropy_backward_rows(float *probs, const int32_t *targets, const float *dloss, int N, int V,
                                        int Vp);

/* LoRA (issue 19): the low-rank adapters of k linear layers that read the
 * same input x (q|k|v, gate|up; k = 1 for one layer),
 *   y_j[:, 0:OC_j] += scale * (drop(x) @ A_j^T) @ B_j^T,   j < k,
 * x [A] (N, C); A [A] (k r, C): A_0 (r, C) (lora_A) to A_{k-1}, one after the
 * other, so that x is read once for all of them; out[j].B [A] (OC_j, r)
 * (lora_B); out[j].y [A] rows of ld elements, layer j's output at columns
 * [0, OC_j) of each row (ld > OC_j: a slice of a fused output such as q|k|v,
 * y pointing at the slice's first column; every layer of a group lives in
 * the same fused output, so one ld). t [A] (N, k r) receives drop(x) @ A^T
 * (layer j's r columns at j r), which the backward reads.
 * drop: inverted dropout with probability d->p (0: none, and d may be NULL):
 * element (n, c) of x is kept, and scaled by 1 / (1 - p), iff
 * lora_dropout_keeps(d, n, c); scratch [A] (N, C) holds drop(x) then, and
 * is unused without dropout (may be NULL). Each layer has its own mask (as
 * PEFT's separate dropout modules), so with dropout k must be 1. */
#ifndef SHARDLM_LORA_DROPOUT /* tests/gpu/cpu_names_decl.h reads this header twice */
#define SHARDLM_LORA_DROPOUT
struct lora_dropout {
    float p;          /* in [0, 1) */
    uint64_t key;     /* the mask of this layer, module and step (family.c dropout_of) */
    uint64_t row0;    /* the global index of the micro-batch's first row (sample or packed row) */
    int T;            /* tokens per row: token n is row row0 + n / T, position n % T */
};
#ifdef __CUDACC__
#define LORA_HD __host__ __device__
#else
#define LORA_HD
#endif
/* The mask as a function of the row, the position and the channel only, so
 * that it does not depend on the world size, the micro-batch split or the
 * padding: a splitmix64 finalizer over (key, row, position, channel). */
static inline LORA_HD uint64_t lora_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline LORA_HD int lora_dropout_keeps(const struct lora_dropout *d, size_t n, int c)
{
    const uint64_t row = d->row0 + n / (size_t)d->T, t = n % (size_t)d->T;
    const uint64_t h = lora_mix(d->key ^ lora_mix(row * 0x9E3779B97F4A7C15ull + (t << 32) + (uint64_t)c));
    /* keep iff the top 32 bits are at or above p * 2^32 */
    return (double)(h >> 32) >= (double)d->p * 4294967296.0;
}
struct lora_out {
    float *y;         /* forward: the layer's output slice; backward: its gradient dy (read only) */
    const float *B;   /* (OC, r) [A] */
    float *dB;        /* backward: [G] (OC, r), accumulated; NULL: frozen */
    int OC;
};
#endif
void backend_lora_forward(float *t, float *scratch, const float *x, const float *A, const struct lora_out *out, int k,
                          int ld, float scale, const struct lora_dropout *d, int N, int C, int r);
/* After the layers' own backward (which overwrote dx with dy @ W): with
 * out[j].y = dy_j [A] the gradient of y_j (rows of ld, columns [0, OC_j)),
 *   dB_j [G] (OC_j, r) += scale * dy_j^T @ t_j,  dt_j = scale * dy_j @ B_j  (dt [A] (N, k r), j r columns on),
 *   dA [G] (k r, C) += dt^T @ drop(x),           dx [A] (N, C) += drop'(dt @ A)
 * (accumulated: dx already holds the frozen weights' share). x, t, A, d as
 * in the forward (the mask is computed again, not stored); dt and scratch
 * [A] (N, C) (with dropout; else unused) are work space. dA and every dB
 * NULL: the adapters are frozen, dx only. The CPU backend's half-precision
 * emulation keeps t, dt and drop(x) in fp32 inside the call, where a device
 * rounds them to [A] between its GEMMs. */
void backend_lora_backward(float *dx, float *dA, float *dt, float *scratch, const float *x, const float *t,
                           const float *A, const struct lora_out *out, int k, int ld, float scale,
                           const struct lora_dropout *d, int N, int C, int r);

/* Sum of squares in double (for the global gradient norm). */
double backend_sum_squares(const float *x, size_t n);
/* 1 when every element is finite, else 0. */
int backend_all_finite(const float *x, size_t n);
/* The sum over k < count of backend_sum_squares(x[k], n[k]), added in k order
 * (the same bits); one synchronisation on a device. The arrays are host memory. */
double backend_sum_squares_multi(const float *const *x, const size_t *n, int count);

/* One range of the fused AdamW step: n elements of an fp32 master, its Adam
 * moments and its fp32 gradient, and where the updated parameters go in the
 * parameter dtype (param_out, NULL: nowhere). Pointers in the memory the
 * backend computes in (device memory on a device backend). */
#ifndef SHARDLM_ADAMW_RANGE /* tests/gpu/cpu_names_decl.h reads this header twice */
#define SHARDLM_ADAMW_RANGE
struct adamw_range {
    float *param, *m, *v;
    const float *grad;
    void *param_out;
    size_t n;
    float weight_decay; /* 0 for tensors that do not decay */
};
#endif
struct adamw_hparams;
/* AdamW (adamw.h's arithmetic, the same bits as adamw_update) over every
 * range, the cast to out_dtype folded in; on a device one multi-tensor
 * kernel launch per group of ranges. hp->weight_decay is ignored (each
 * range has its own). The range table is host memory. */
void backend_adamw(const struct adamw_range *r, int count, const struct adamw_hparams *hp, enum dtype out_dtype);
void backend_scale(float *x, float s, size_t n);
/* x [A] (N, C): row i times s[i] (fp32, N). */
void backend_scale_rows(float *x, const float *s, int N, int C);
void backend_zero(float *x, size_t n);
/* Copies bytes between any two memory spaces (device, pinned host, host). */
void backend_copy(void *dst, const void *src, size_t bytes);
/* The same, queued behind the kernels issued so far and returning at once
 * (host memory must be pinned); later kernels and collectives see the result. */
void backend_copy_async(void *dst, const void *src, size_t bytes);

/* ---- memory spaces and casts (the ZeRO engine's device side) ----------------
 *
 * On a device backend the engine keeps parameters, gathered units, gradient
 * buffers and activations in device memory, and the optimizer state (fp32
 * master, Adam m and v, fp32 gradient shard) in pinned host memory that the
 * device can address directly (mapped, unified addresses), so the functions
 * below and the kernels above accept pinned pointers as well as device ones.
 * Host code touches only pinned and host memory; device memory moves to and
 * from it with backend_copy.
 *
 * SHARDLM_EMULATE_DEVICE=1 makes the CPU backend act as a device backend: its
 * "device" memory is an address range the host cannot read or write (a
 * PROT_NONE view of pages whose other view only the kernels and the
 * collectives use), so any host access to device memory crashes at once. The
 * CUDA engine paths are tested this way on machines without a GPU. */

/* Memory of one space; 4096-byte aligned and zeroed. Out of memory is a
 * one-line error naming the space, the size and `what`, exit status 2. */
void *backend_mem_alloc(enum mem_space space, size_t bytes, const char *what);
void backend_mem_free(enum mem_space space, void *p, size_t bytes);
/* Free and total device memory in bytes; 0 when the backend cannot tell. */
int backend_mem_info(size_t *free_bytes, size_t *total_bytes);
/* dst (n, dst_dt) = src (n, src_dt), rounding to nearest even (dtype.h). */
void backend_convert(void *dst, enum dtype dst_dt, const void *src, enum dtype src_dt, size_t n);
/* bitsandbytes' 4-bit weights (core/quant4.h) dequantized, bit for bit as
 * quant4_dequantize: out (n, out_dt) element i = table[code i] * absmax[i / 64],
 * rounded once to out_dt, the codes (n + 1) / 2 bytes, the even element in the
 * high nibble; type is enum quant4_type. With double quantization (qabsmax
 * not NULL) absmax[b] = dynamic[qabsmax[b]] * nested_absmax[(first_block %
 * 256 + b) / 256] + *offset, the product and the sum rounded apart
 * (quant4_nested_dequantize), and absmax is not read. n elements from block
 * first_block of a tensor (a rank's share of whole blocks: nested_absmax
 * starts at the nested block of first_block); every pointer in backend
 * memory. */
void backend_dequant4(void *out, enum dtype out_dt, const uint8_t *codes, const float *absmax, const uint8_t *qabsmax,
                      const float *nested_absmax, const float *offset, size_t first_block, size_t n, int type);
/* acc (n, fp32) += src (n, dt). On a device, backend_convert and
 * backend_add_to_f32 from device memory into pinned host memory run on a
 * copy stream beside the kernels; every later call still sees the result. */
void backend_add_to_f32(float *acc, const void *src, enum dtype dt, size_t n);
/* Waits for every kernel and copy issued so far (a no-op on the CPU). */
void backend_synchronize(void);

struct comm;
/* Gives c a transport for collectives of device buffers (comm.h), after
 * backend_init: NCCL from an ncclUniqueId that rank 0 broadcasts over MPI,
 * or with SHARDLM_COMM=mpi the host-staged MPI path (several ranks on one
 * GPU). Nothing on the CPU, where device memory is host memory to MPI. */
void backend_attach_comm(struct comm *c);

#endif
