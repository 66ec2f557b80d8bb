/*
 * adamw — the AdamW update of one contiguous range of a shard, on the host.
 *
 * One fused pass over p, m, v and g (fp32), optionally writing the updated
 * parameters cast to the parameter dtype in the same pass (param_out), so
 * that the cast of DESIGN §4 costs no second pass over the master shard.
 * Unscale and clip are folded into grad_scale; decoupled weight decay
 * (Loshchilov & Hutter) or L2 (adam_w_mode false); bias corrections as
 * PyTorch's torch.optim.AdamW computes them:
 *   g  = grad_scale * g  (+ wd * p in L2 mode)
 *   p -= lr * wd * p                      (AdamW mode; wd 0 where the tensor does not decay)
 *   m  = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
 *   p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),  bc_i = 1 - b_i^t
 *
 * Arithmetic, per element, in this order on every SIMD level (so every level
 * and the scalar code give the same bits; tests/unit/test_adamw.c checks):
 *   g = grad * grad_scale;            L2 mode: g = fma(wd, p, g)
 *   m = fma(1 - b1, g, b1 * m);       v = fma(1 - b2, g * g, b2 * v)
 *   d = fma(sqrt(v), 1 / sqrt(bc2), eps)
 *   p = fma(-lr / bc1, m / d, p * (1 - lr * wd))
 * sqrt and the division are the correctly rounded IEEE operations (no
 * reciprocal approximations): each result is within an ulp or two of
 * PyTorch's sequence of roundings.
 *
 * Speed: the pass is memory bound: 16 bytes read and 12 written per element,
 * +2 or +4 for param_out (+ as much again for its write-allocate read unless
 * streamed, see ADAMW_STREAM_MIN). Explicit AVX-512F or AVX2+FMA+F16C code,
 * picked at run time (dtype_simd_best), 16 elements per iteration (gcc left
 * the plain loop scalar, as sqrtf may set errno, at half this speed), with
 * software prefetch 1 KiB ahead.
 * OpenMP over the range with omp_get_max_threads() threads, each share
 * starting on a 64-byte boundary; ranges below 32768 elements run on the
 * calling thread. On the 2-core development machine, 100M parameters take
 * as long as a bare sweep that reads 16 and writes 12 bytes per element
 * (tools/bench/adamw.sh: ~55 ms, 6-7x torch.optim.AdamW(foreach=True)).
 *
 * Called by zero_optimizer_step() per tensor range of a shard.
 */
#ifndef SHARDLM_ADAMW_H
#define SHARDLM_ADAMW_H

#include <stdbool.h>
#include <stddef.h>

#include "options.h"
#include "dtype.h"

struct adamw_hparams {
    float lr;
    float beta1, beta2, eps;
    float weight_decay;     /* 0 for tensors that do not decay */
    bool adam_w_mode;
    float bias_correction1; /* 1 - beta1^t */
    float bias_correction2; /* 1 - beta2^t */
    float grad_scale;       /* multiplies g: 1 / loss_scale * clip coefficient */
};

/* The per-element constants of the update, derived once from the
 * hyper-parameters; a device kernel that uses them with the arithmetic above
 * (IEEE sqrt and division, fmaf) gives the host's bits. */
struct adamw_coeffs {
    float beta1, one_minus_beta1;
    float beta2, one_minus_beta2;
    float eps;
    float neg_step_size; /* -lr / bc1 */
    float inv_sqrt_bc2;  /* 1 / sqrt(bc2) */
    float grad_scale;
    float decay;         /* 1 - lr * wd in AdamW mode, else 1 */
    float l2;            /* wd in L2 mode, else 0 */
    int has_l2;
};
struct adamw_coeffs adamw_make_coeffs(const struct adamw_hparams *hp);

/*
 * Updates param, m, v (n elements each) in place from grad. When param_out is
 * not NULL, also writes the updated parameters there, converted to out_dtype
 * (fp32, fp16 or bf16, rounded as dtype_convert rounds). param_out must not
 * overlap the other arrays; out_dtype is ignored when param_out is NULL.
 */
void adamw_update(float *param, float *m, float *v, const float *grad, size_t n, const struct adamw_hparams *hp,
                  void *param_out, enum dtype out_dtype);

/* From this many elements on (64 MiB of p, m, v and g), ADAMW_STORES_AUTO
 * writes param_out with non-temporal stores: little of such a range would
 * still be cached when param_out is next read, and a streaming store costs
 * no write-allocate read (about 4% faster with a bf16 param_out at 100M
 * parameters). p, m and v keep ordinary stores: their lines were just read,
 * so storing costs no extra read, and streaming them measured 20% slower
 * (tools/bench/adamw.sh). */
#define ADAMW_STREAM_MIN ((size_t)4 << 20)

/* Store kinds, for tests and benchmarks; adamw_update uses ADAMW_STORES_AUTO
 * (STREAM_OUT from ADAMW_STREAM_MIN elements on, else CACHED). */
enum adamw_stores {
    ADAMW_STORES_AUTO = 0,
    ADAMW_STORES_CACHED,     /* ordinary stores */
    ADAMW_STORES_STREAM_OUT, /* non-temporal stores for param_out only */
    ADAMW_STORES_STREAMING,  /* non-temporal stores for p, m, v and param_out */
};

/* adamw_update at a given SIMD level (a level the CPU lacks falls back to the
 * next one below) and store kind. */
void adamw_update_with(float *param, float *m, float *v, const float *grad, size_t n, const struct adamw_hparams *hp,
                       void *param_out, enum dtype out_dtype, enum dtype_simd level, enum adamw_stores stores);

#endif
