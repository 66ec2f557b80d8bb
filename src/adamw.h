/*
 * adamw — the AdamW update of one contiguous range of a shard, on the host.
 *
 * One pass over p, m, v and g: unscale and clip are folded into grad_scale,
 * decoupled weight decay (Loshchilov & Hutter) or L2 (adam_w_mode false), bias
 * correction as PyTorch's torch.optim.AdamW computes it:
 *   p -= lr * wd * p                      (decay only where the tensor decays)
 *   m  = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
 *   p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),  bc_i = 1 - b_i^t
 * OpenMP over the range, vectorised by the compiler.
 */
#ifndef SHARDLM_ADAMW_H
#define SHARDLM_ADAMW_H

#include <stdbool.h>
#include <stddef.h>

struct adamw_hparams {
    float lr;
    float beta1, beta2, eps;
    float weight_decay;     /* 0 for tensors that do not decay */
    bool adam_w_mode;
    float bias_correction1; /* 1 - beta1^t */
    float bias_correction2; /* 1 - beta2^t */
    float grad_scale;       /* multiplies g: 1 / loss_scale * clip coefficient */
};

void adamw_update(float *param, float *m, float *v, const float *grad, size_t n,
                  const struct adamw_hparams *hp);

#endif
