/*
 * loss_scaler — DeepSpeed's fp16 loss scaling; the rules are in loss_scaler.h.
 */
#include "loss_scaler.h"

#include <math.h>
#include <string.h>

void loss_scaler_init(struct loss_scaler *ls, const struct config *cfg)
{
    const struct fp16_config *f = &cfg->fp16;
    memset(ls, 0, sizeof *ls);
    ls->last_overflow_iter = -1;
    ls->skips_overflow = cfg->dtype == DTYPE_F16;
    ls->dynamic = ls->skips_overflow && f->loss_scale == 0.0f;
    ls->window = f->loss_scale_window;
    ls->hysteresis = f->hysteresis;
    ls->consecutive_hysteresis = f->consecutive_hysteresis;
    ls->min_scale = f->min_loss_scale;
    if (ls->dynamic) {
        ls->scale = ldexp(1.0, f->initial_scale_power);
        ls->hysteresis_left = f->hysteresis;
    } else {
        ls->scale = ls->skips_overflow ? (double)f->loss_scale : 1.0;
    }
    ls->initial_scale = ls->scale;
}

/* DynamicLossScaler.update_scale(overflow=True). */
static enum loss_scaler_result on_overflow(struct loss_scaler *ls)
{
    if (ls->hysteresis == 1 || ls->hysteresis_left == 1) {
        if (ls->scale == ls->min_scale)
            return LS_AT_MINIMUM; /* DeepSpeed raises here, before any change */
        ls->scale = fmax(ls->scale / LOSS_SCALE_FACTOR, ls->min_scale);
    } else {
        ls->hysteresis_left--;
    }
    ls->last_overflow_iter = ls->iter;
    return LS_SKIP;
}

/* DynamicLossScaler.update_scale(overflow=False). */
static void on_clean_step(struct loss_scaler *ls)
{
    if (ls->consecutive_hysteresis)
        ls->hysteresis_left = ls->hysteresis;
    long stable = ls->iter - ls->last_overflow_iter - 1;
    if (stable > 0 && stable % ls->window == 0) {
        if (!ls->consecutive_hysteresis)
            ls->hysteresis_left = ls->hysteresis;
        /* DeepSpeed's Python float would reach inf here (and then fail
         * formatting int(inf) in its next overflow message); stay finite. */
        if (isfinite(ls->scale * LOSS_SCALE_FACTOR))
            ls->scale *= LOSS_SCALE_FACTOR;
    }
}

enum loss_scaler_result loss_scaler_update(struct loss_scaler *ls, bool overflow)
{
    enum loss_scaler_result result = LS_OK;
    if (ls->dynamic && !overflow) {
        on_clean_step(ls);
    } else if (ls->dynamic) {
        result = on_overflow(ls);
        if (result == LS_AT_MINIMUM)
            return result; /* the run stops; iter does not count it */
    } else if (ls->skips_overflow && overflow) {
        result = LS_SKIP; /* static fp16 scale: skip, keep the scale */
    }
    ls->iter++;
    return result;
}

const char *loss_scaler_check_state(const struct loss_scaler *ls)
{
    if (!isfinite(ls->scale) || !(ls->scale > 0.0))
        return "the loss scale is not a finite positive number";
    if (ls->iter < 0)
        return "the loss-scaler iteration is negative";
    if (ls->last_overflow_iter < -1 || ls->last_overflow_iter >= ls->iter)
        return "the loss scaler's last overflow iteration is not in [-1, iteration)";
    if (ls->dynamic) {
        /* Halving clamps at min_scale and growth only raises, so the scale never
         * drops below the smaller of the two (a start below the minimum is
         * allowed, as in DeepSpeed). */
        if (ls->scale < fmin(ls->min_scale, ls->initial_scale))
            return "the loss scale is below fp16.min_loss_scale";
        if (ls->hysteresis_left < 1)
            return "the loss scaler's hysteresis left is below 1";
        return NULL;
    }
    if (ls->scale != ls->initial_scale || ls->hysteresis_left != 0 || ls->last_overflow_iter != -1)
        return "the loss scaler's state is not that of the fixed scale the config asks for";
    return NULL;
}

const char *loss_scaler_result_name(enum loss_scaler_result r)
{
    switch (r) {
    case LS_OK: return "ok";
    case LS_SKIP: return "skip";
    case LS_AT_MINIMUM: return "at minimum";
    }
    return "?";
}
