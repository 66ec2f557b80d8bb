#include "adamw.h"

#include <math.h>

void adamw_update(float *restrict param, float *restrict m, float *restrict v,
                  const float *restrict grad, size_t n, const struct adamw_hparams *hp)
{
    const float b1 = hp->beta1, b2 = hp->beta2, eps = hp->eps;
    const float step_size = hp->lr / hp->bias_correction1;
    const float inv_sqrt_bc2 = 1.0f / sqrtf(hp->bias_correction2);
    const float scale = hp->grad_scale;
    const float decay = hp->adam_w_mode ? 1.0f - hp->lr * hp->weight_decay : 1.0f;
    const float l2 = hp->adam_w_mode ? 0.0f : hp->weight_decay;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float p = param[i];
        float g = grad[i] * scale + l2 * p;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        p *= decay;
        param[i] = p - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
    }
}
