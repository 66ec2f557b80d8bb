#include "sched.h"

#include <math.h>

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/* DeepSpeed clamps warmup_num_steps to at least 2 so that log(W) is never 0. */
enum { SCHED_MIN_WARMUP_STEPS = 2 };

static double warmup_steps(const struct scheduler_config *sc)
{
    return sc->warmup_num_steps > SCHED_MIN_WARMUP_STEPS ? sc->warmup_num_steps : SCHED_MIN_WARMUP_STEPS;
}

/* Warmup progress in [0, 1) for 0 <= it < W. */
static double warmup_gamma(const struct scheduler_config *sc, long it)
{
    double w = warmup_steps(sc);
    if (sc->warmup_type == WARMUP_LINEAR)
        return (double)it / w;
    return log((double)it + 1.0) / log(w);
}

static double warmup_lr(const struct scheduler_config *sc, long it)
{
    double min_lr = sc->warmup_min_lr, max_lr = sc->warmup_max_lr;
    if (it < 0)
        return min_lr;
    if (it < (long)warmup_steps(sc))
        return min_lr + (max_lr - min_lr) * warmup_gamma(sc, it);
    return max_lr;
}

static double warmup_decay_lr(const struct scheduler_config *sc, long it)
{
    double w = warmup_steps(sc);
    if (it < (long)w)
        return warmup_lr(sc, it);
    double remaining = (double)sc->total_num_steps - (double)it;
    double span = fmax(1.0, (double)sc->total_num_steps - w);
    double gamma = fmax(0.0, remaining / span);
    return sc->warmup_min_lr + (sc->warmup_max_lr - sc->warmup_min_lr) * gamma;
}

static double warmup_cosine_ratio(const struct scheduler_config *sc, long it)
{
    if (it < 0)
        return 0.0;
    double w = warmup_steps(sc);
    if (it < (long)w) {
        double wmin = sc->warmup_min_ratio;
        return wmin + (1.0 - wmin) * warmup_gamma(sc, it);
    }
    double done = (double)it - w + 1.0;
    double span = fmax(1.0, (double)sc->total_num_steps - w);
    double progress = fmin(1.0, done / span);
    double cmin = sc->cos_min_ratio;
    return fmax(0.0, cmin + (1.0 - cmin) * (1.0 + cos(M_PI * progress)) / 2.0);
}

float sched_lr(const struct scheduler_config *sc, float base_lr, long step)
{
    /* DeepSpeed's last_batch_iteration while optimizer step `step` runs. */
    long it = step - 1;
    switch (sc->type) {
    case SCHED_WARMUP_LR:
        return (float)warmup_lr(sc, it);
    case SCHED_WARMUP_DECAY_LR:
        return (float)warmup_decay_lr(sc, it);
    case SCHED_WARMUP_COSINE_LR:
        return (float)((double)base_lr * warmup_cosine_ratio(sc, it));
    case SCHED_CONSTANT:
    default:
        return base_lr;
    }
}
