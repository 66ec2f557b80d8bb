/*
 * loss_scaler — fp16 loss scaling as DeepSpeed does it under ZeRO
 * (deepspeed/runtime/fp16/loss_scaler.py: DynamicLossScaler.update_scale,
 * LossScaler, CreateLossScaler; created by deepspeed/runtime/zero/stage3.py
 * from the fp16 keys as deepspeed/runtime/precision_config.py
 * DeepSpeedFP16Config.dynamic_loss_scale_args() maps them).
 *
 * Three modes, chosen once from the config by loss_scaler_init():
 *   fp16, loss_scale 0     dynamic: starts at 2^initial_scale_power and moves
 *                          by the rules below.
 *   fp16, loss_scale > 0   static: the scale never changes, but an overflow
 *                          still skips the step (stage3.py checks overflow for
 *                          every fp16 run and returns before the optimizer;
 *                          the static LossScaler's update_scale does nothing).
 *   bf16 or fp32           scale 1, never changes, never skips: DeepSpeed does
 *                          not look for overflow outside fp16, so `overflow`
 *                          is ignored. A trainer that wants to stop on
 *                          non-finite gradients in those precisions does so
 *                          itself (skips_overflow tells which case it is in).
 *
 * The dynamic rules, applied by loss_scaler_update() once per optimizer step
 * (at the accumulation boundary, applied and skipped steps alike), with
 * W = loss_scale_window, H = hysteresis, factor 2:
 *   overflow:
 *     if H == 1 or hysteresis_left == 1:
 *       if scale == min_loss_scale: LS_AT_MINIMUM, and nothing changes (DeepSpeed
 *         raises "Current loss scale already at minimum - cannot decrease scale
 *         anymore. Exiting run." before touching its state);
 *       else scale = max(scale / 2, min_loss_scale)
 *     else hysteresis_left -= 1 (the scale stays)
 *     last_overflow_iter = iter; the step is skipped (LS_SKIP)
 *   no overflow:
 *     if consecutive_hysteresis: hysteresis_left = H
 *     stable = iter - last_overflow_iter - 1
 *     if stable > 0 and stable % W == 0:
 *       scale *= 2; if not consecutive_hysteresis: hysteresis_left = H
 *   then iter += 1 (on overflow too: a skipped step counts as an iteration).
 * Consequences worth knowing:
 *   - hysteresis_left never drops below 1: with H = 2 the first overflow only
 *     uses up the hysteresis and every later one halves, until it is refilled.
 *     Without consecutive_hysteresis it is refilled only when the scale grows,
 *     so two overflows far apart still halve; with it, after any clean step,
 *     so only back-to-back overflows halve.
 *   - The scale grows at the update where iter - last_overflow_iter - 1 is a
 *     positive multiple of W: from the start (last_overflow_iter = -1) at
 *     iter = W, W, 2W, ... i.e. after W + 1 clean steps; after an overflow at
 *     iteration o, at iter = o + 1 + W, o + 1 + 2W, ... (W + 1 clean steps
 *     at the reduced scale, the first of which has stable = 0).
 *   - The minimum is only checked when a halving is due, so at the minimum the
 *     hysteresis still absorbs overflows first; the scale is compared with
 *     min_loss_scale exactly, which max() makes reachable for any minimum.
 *   - A start below the minimum (2^initial_scale_power < min_loss_scale) is
 *     not an error in DeepSpeed: the first halving due raises the scale to
 *     min_loss_scale.
 *   - iter equals the engine's step count (applied + skipped) for a run that
 *     used fp16 from its start.
 *
 * Differences from DeepSpeed, on purpose: the scale is a double (as a Python
 * float is), so growth never rounds, and a doubling that would make it infinite
 * (past 2^1023, where DeepSpeed's scale becomes inf and its next overflow
 * message fails) leaves it as it is; on a resume the state comes from the
 * checkpoint but the settings from the current config (DeepSpeed's stage 3
 * unpickles the whole scaler, settings included); LS_AT_MINIMUM is returned,
 * never raised or exited on: the trainer stops the run with a clear error.
 * In the static and bf16/fp32 modes iter still counts updates (as DeepSpeed's
 * fused fp16 optimizer does); hysteresis_left and last_overflow_iter stay 0
 * and -1 there.
 *
 * The module owns nothing but the struct; no allocation, no I/O. Callers: the
 * trainer (init, update), the checkpoint code (saves and restores the four
 * state fields, then calls loss_scaler_check_state).
 */
#ifndef SHARDLM_LOSS_SCALER_H
#define SHARDLM_LOSS_SCALER_H

#include <stdbool.h>

#include "core/options.h"

/* DeepSpeed DynamicLossScaler.scale_factor: the scale halves and doubles. */
#define LOSS_SCALE_FACTOR 2.0

enum loss_scaler_result {
    LS_OK = 0,     /* apply the step */
    LS_SKIP,       /* overflow: skip the optimizer and LR-scheduler step, count it */
    LS_AT_MINIMUM, /* overflow with the scale already at min_loss_scale: stop the run */
};

struct loss_scaler {
    /* State: what a checkpoint saves and restores (DeepSpeed's names in brackets). */
    double scale;            /* [cur_scale] the loss is multiplied by it; gradients divided */
    int hysteresis_left;     /* [cur_hysteresis] dynamic: 1..hysteresis; else 0 */
    long iter;               /* [cur_iter] updates so far, skipped steps included */
    long last_overflow_iter; /* [last_overflow_iter] iter of the last overflow; -1: none */

    /* Settings, from the config by loss_scaler_init (not saved). */
    bool dynamic;               /* fp16 with loss_scale 0 */
    bool skips_overflow;        /* fp16 (dynamic or static): an overflow skips the step */
    double initial_scale;       /* the scale a fresh run starts with (the fixed one if not dynamic) */
    int window;                 /* [scale_window] loss_scale_window */
    int hysteresis;             /* [delayed_shift] */
    bool consecutive_hysteresis;
    double min_scale;           /* [min_scale] min_loss_scale */
};

/* Sets the settings from cfg (fp16, bf16, dtype) and the state to a fresh
 * run's: scale 2^initial_scale_power (dynamic), fp16.loss_scale (static) or 1
 * (bf16/fp32); hysteresis_left = hysteresis (dynamic); iter 0; last_overflow_iter
 * -1. cfg has been validated by config_load (window > 0, hysteresis >= 1,
 * min_loss_scale > 0 for dynamic scaling). */
void loss_scaler_init(struct loss_scaler *ls, const struct config *cfg);

/* One optimizer step's update; `overflow`: some rank's gradients hold inf or
 * NaN (already agreed across ranks). Returns LS_OK, LS_SKIP or LS_AT_MINIMUM by
 * the rules above. On LS_AT_MINIMUM the state is left as it was; the caller
 * stops the run (and should say: the loss scale is at fp16.min_loss_scale and
 * the gradients still overflow; lower the learning rate, enable
 * gradient_clipping, lower min_loss_scale or use bf16). */
enum loss_scaler_result loss_scaler_update(struct loss_scaler *ls, bool overflow);

/* After a checkpoint's state fields were written into a scaler initialised from
 * the current config: NULL when they are consistent with it, else a static
 * string saying what is wrong (for the loader's error message). Checks: the
 * scale is finite and positive, >= min(min_loss_scale, 2^initial_scale_power)
 * (dynamic) or equal to the fixed
 * scale (static, bf16/fp32, with hysteresis_left 0 and last_overflow_iter -1);
 * iter >= 0; -1 <= last_overflow_iter < iter;
 * hysteresis_left >= 1 (dynamic; a value above the current hysteresis, left by
 * a run with a larger one, is allowed and only delays the next halving). */
const char *loss_scaler_check_state(const struct loss_scaler *ls);

/* "ok", "skip", "at minimum" (messages, tests). */
const char *loss_scaler_result_name(enum loss_scaler_result r);

#endif
