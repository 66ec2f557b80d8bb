/*
 * sched — the learning-rate schedules of DeepSpeed's config vocabulary
 * (deepspeed/runtime/lr_schedules.py): WarmupLR, WarmupDecayLR, WarmupCosineLR,
 * plus a constant rate when the config has no "scheduler" section.
 *
 * The module is a pure function of the scheduler settings and the step index;
 * it owns no state. The trainer calls sched_lr() once per optimizer step and
 * stores nothing but the step count (which a checkpoint carries), so a resumed
 * run gets the same rates.
 *
 * Which rate a step gets (DeepSpeed's off-by-one). In DeepSpeed the scheduler
 * keeps last_batch_iteration, starting at -1. Its constructor does NOT step: it
 * writes get_lr() at last_batch_iteration = -1 into the optimizer (PR #6597,
 * "Add first Step in LR Schedulers"), and the engine calls scheduler.step()
 * after every optimizer step that was applied (never after one skipped for an
 * fp16 overflow; engine.py _take_model_step). So the optimizer step with 0-based
 * index s (counting applied steps only) runs with the rate for
 *     it = s - 1
 * and at it = -1 ("before the scheduler has started") the rate is
 *     WarmupLR, WarmupDecayLR: warmup_min_lr
 *     WarmupCosineLR:          0 (ratio 0, whatever warmup_min_ratio is)
 * For it >= 0, with W = max(2, warmup_num_steps) and T = total_num_steps:
 *     warmup gamma g(it) = log(it + 1) / log(W)   (warmup_type "log")
 *                        = it / W                  (warmup_type "linear")
 *     WarmupLR:       it < W: min + (max - min) g(it);   else max
 *     WarmupDecayLR:  it < W: as WarmupLR;
 *                     else min + (max - min) * max(0, (T - it) / max(1, T - W))
 *     WarmupCosineLR: it < W: lr * (wmin + (1 - wmin) g(it))
 *                     else    lr * max(0, cmin + (1 - cmin) (1 + cos(pi p)) / 2)
 *                     with p = min(1, (it - W + 1) / max(1, T - W))
 * where min/max are warmup_min_lr/warmup_max_lr (absolute rates), lr is the
 * optimizer's lr, wmin = warmup_min_ratio and cmin = cos_min_ratio.
 * Consequences worth knowing: with log or linear warmup the first two steps
 * both use warmup_min_lr (it = -1 and g(0) = 0); WarmupCosineLR's first step
 * has rate 0.
 */
#ifndef SHARDLM_SCHED_H
#define SHARDLM_SCHED_H

#include "core/options.h"

/* The rate of the optimizer step with 0-based index `step` (applied steps only).
 * base_lr is optimizer.params.lr: the rate itself for SCHED_CONSTANT, the rate
 * the ratio multiplies for WarmupCosineLR, unused by WarmupLR/WarmupDecayLR. */
float sched_lr(const struct scheduler_config *sc, float base_lr, long step);

#endif
