/*
 * test_sched — learning-rate schedules against DeepSpeed's formulas
 * (deepspeed/runtime/lr_schedules.py, see src/engine/sched.h).
 *
 * Every expected value is worked out by hand from the formulas, with the
 * DeepSpeed off-by-one: optimizer step s runs with last_batch_iteration
 * it = s - 1, and it = -1 gives warmup_min_lr (WarmupLR/WarmupDecayLR) or a
 * ratio of 0 (WarmupCosineLR). W below is max(2, warmup_num_steps), T is
 * total_num_steps.
 */
#include "check.h"
#include "core/options.h"
#include "engine/sched.h"

#include <stdio.h>

/* sched_lr returns a float computed in double: float rounding only. */
#define SCHED_TOL 1e-6
#define SCHED_FLOOR 1e-12

struct sched_case {
    const char *name;
    long step;
    double want;
};

static void run_cases(const char *group, const struct scheduler_config *sc, float base_lr,
                      const struct sched_case *cases, int n)
{
    for (int i = 0; i < n; i++) {
        char name[128];
        snprintf(name, sizeof name, "%s %s (step %ld)", group, cases[i].name, cases[i].step);
        CHECK_CLOSE(name, sched_lr(sc, base_lr, cases[i].step), cases[i].want, SCHED_TOL, SCHED_FLOOR);
    }
}

#define N_CASES(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void test_constant(void)
{
    struct scheduler_config sc = {.type = SCHED_CONSTANT};
    /* No scheduler: the optimizer's lr at every step. */
    static const struct sched_case cases[] = {
        {"first", 0, 3e-4}, {"second", 1, 3e-4}, {"later", 12345, 3e-4},
    };
    run_cases("constant", &sc, 3e-4f, cases, N_CASES(cases));
}

static void test_warmup_lr_log(void)
{
    /* min 0, max 1e-3, W = 10, log: lr = 1e-3 * log(it + 1) / log(10). */
    struct scheduler_config sc = {.type = SCHED_WARMUP_LR, .warmup_min_lr = 0.0f, .warmup_max_lr = 1e-3f,
                                  .warmup_num_steps = 10, .warmup_type = WARMUP_LOG};
    static const struct sched_case cases[] = {
        {"step 0: it -1 -> min", 0, 0.0},
        {"step 1: it 0, log(1) = 0 -> min", 1, 0.0},
        {"step 2: it 1, 1e-3 log 2 / log 10", 2, 3.010299956639812e-4},
        {"warmup-1: it 8, 1e-3 log 9 / log 10", 9, 9.542425094393248e-4},
        {"warmup: it 9, log 10 / log 10 = 1", 10, 1e-3},
        {"after warmup: it 10 >= W -> max", 11, 1e-3},
        {"far past", 100000, 1e-3},
    };
    /* base_lr must not matter for WarmupLR (absolute rates). */
    run_cases("WarmupLR log", &sc, 123.0f, cases, N_CASES(cases));
}

static void test_warmup_lr_linear(void)
{
    /* min 1e-5, max 1e-3, W = 4, linear: lr = 1e-5 + 9.9e-4 * it / 4. */
    struct scheduler_config sc = {.type = SCHED_WARMUP_LR, .warmup_min_lr = 1e-5f, .warmup_max_lr = 1e-3f,
                                  .warmup_num_steps = 4, .warmup_type = WARMUP_LINEAR};
    static const struct sched_case cases[] = {
        {"step 0: it -1 -> min", 0, 1e-5},
        {"step 1: it 0 -> min", 1, 1e-5},
        {"step 2: it 1, 1e-5 + 9.9e-4 / 4", 2, 2.575e-4},
        {"warmup-1: it 2, 1e-5 + 9.9e-4 / 2", 3, 5.05e-4},
        {"warmup: it 3, 1e-5 + 9.9e-4 * 3/4", 4, 7.525e-4},
        {"after warmup: it 4 -> max", 5, 1e-3},
        {"far past", 5000, 1e-3},
    };
    run_cases("WarmupLR linear", &sc, 0.0f, cases, N_CASES(cases));
}

static void test_warmup_lr_clamped(void)
{
    /* warmup_num_steps 1 is raised to W = 2 by DeepSpeed: linear it 1 -> 1/2. */
    struct scheduler_config sc = {.type = SCHED_WARMUP_LR, .warmup_min_lr = 0.0f, .warmup_max_lr = 2e-3f,
                                  .warmup_num_steps = 1, .warmup_type = WARMUP_LINEAR};
    static const struct sched_case cases[] = {
        {"step 1: it 0 -> min", 1, 0.0},
        {"step 2: it 1 -> 2e-3 * 1/2", 2, 1e-3},
        {"step 3: it 2 >= W -> max", 3, 2e-3},
    };
    run_cases("WarmupLR W=1->2", &sc, 0.0f, cases, N_CASES(cases));
}

static void test_warmup_decay_linear(void)
{
    /* min 0, max 1e-3, W = 10, T = 110, linear warmup; decay factor
     * (T - it) / (T - W) = (110 - it) / 100 from it = 10. */
    struct scheduler_config sc = {.type = SCHED_WARMUP_DECAY_LR, .warmup_min_lr = 0.0f, .warmup_max_lr = 1e-3f,
                                  .warmup_num_steps = 10, .warmup_type = WARMUP_LINEAR, .total_num_steps = 110};
    static const struct sched_case cases[] = {
        {"step 0: it -1 -> min", 0, 0.0},
        {"step 1: it 0 -> min", 1, 0.0},
        {"step 2: it 1, 1e-3 * 1/10", 2, 1e-4},
        {"warmup-1: it 8, 1e-3 * 8/10", 9, 8e-4},
        {"warmup: it 9, 1e-3 * 9/10", 10, 9e-4},
        {"decay start: it 10, (110-10)/100 = 1", 11, 1e-3},
        {"mid decay: it 60, (110-60)/100 = 0.5", 61, 5e-4},
        {"end: it 109, 1/100", 110, 1e-5},
        {"past end: it 110, 0", 111, 0.0},
        {"far past: clamped at 0", 1000, 0.0},
    };
    run_cases("WarmupDecayLR linear", &sc, 0.0f, cases, N_CASES(cases));
}

static void test_warmup_decay_min(void)
{
    /* min 1e-5, max 1e-3, W = 10, T = 110: the decay ends at min, not 0:
     * lr = 1e-5 + 9.9e-4 * max(0, (110 - it) / 100). */
    struct scheduler_config sc = {.type = SCHED_WARMUP_DECAY_LR, .warmup_min_lr = 1e-5f, .warmup_max_lr = 1e-3f,
                                  .warmup_num_steps = 10, .warmup_type = WARMUP_LINEAR, .total_num_steps = 110};
    static const struct sched_case cases[] = {
        {"step 0: it -1 -> min", 0, 1e-5},
        {"mid decay: it 60, 1e-5 + 9.9e-4 / 2", 61, 5.05e-4},
        {"past end -> min", 500, 1e-5},
    };
    run_cases("WarmupDecayLR min", &sc, 0.0f, cases, N_CASES(cases));
}

static void test_warmup_decay_log(void)
{
    /* DeepSpeed's defaults W = 1000, log, with T = 2000, max 1e-3:
     * it 499: 1e-3 * log(500) / log(1000); it 1499: 1e-3 * 501 / 1000. */
    struct scheduler_config sc = {.type = SCHED_WARMUP_DECAY_LR, .warmup_min_lr = 0.0f, .warmup_max_lr = 1e-3f,
                                  .warmup_num_steps = 1000, .warmup_type = WARMUP_LOG, .total_num_steps = 2000};
    static const struct sched_case cases[] = {
        {"mid warmup: it 499", 500, 8.996566681120062e-4},
        {"warmup: it 999, log 1000 / log 1000", 1000, 1e-3},
        {"mid decay: it 1499", 1500, 5.01e-4},
    };
    run_cases("WarmupDecayLR log", &sc, 0.0f, cases, N_CASES(cases));
}

static void test_warmup_cosine(void)
{
    /* base lr 6e-4, W = 10, T = 110, warmup_min_ratio 0.1, cos_min_ratio 0.01,
     * linear warmup: ratio = 0.1 + 0.9 * it / 10 for it < 10; then
     * p = min(1, (it - 9) / 100), ratio = 0.01 + 0.99 * (1 + cos(pi p)) / 2. */
    struct scheduler_config sc = {.type = SCHED_WARMUP_COSINE_LR, .warmup_num_steps = 10,
                                  .warmup_type = WARMUP_LINEAR, .total_num_steps = 110,
                                  .warmup_min_ratio = 0.1f, .cos_min_ratio = 0.01f};
    static const struct sched_case cases[] = {
        {"step 0: it -1, ratio 0 (not warmup_min_ratio)", 0, 0.0},
        {"step 1: it 0, ratio 0.1", 1, 6e-5},
        {"step 2: it 1, ratio 0.19", 2, 1.14e-4},
        {"warmup-1: it 8, ratio 0.82", 9, 4.92e-4},
        {"warmup: it 9, ratio 0.91", 10, 5.46e-4},
        /* it 10: p = 1/100, ratio 0.9997557473810371 */
        {"cosine start: it 10", 11, 5.998534484286223e-4},
        /* it 59: p = 1/2, ratio 0.01 + 0.99 / 2 = 0.505 */
        {"mid cosine: it 59", 60, 3.03e-4},
        /* it 108: p = 99/100, ratio 0.010244252618962859 */
        {"end-1: it 108", 109, 6.146551571377715e-6},
        {"end: it 109, p = 1, ratio cos_min_ratio", 110, 6e-6},
        {"past end: p clamped at 1", 5000, 6e-6},
    };
    run_cases("WarmupCosineLR linear", &sc, 6e-4f, cases, N_CASES(cases));
}

static void test_warmup_cosine_log(void)
{
    /* Same with log warmup: it 4 -> ratio 0.1 + 0.9 log 5 / log 10 = 0.7290730039024168. */
    struct scheduler_config sc = {.type = SCHED_WARMUP_COSINE_LR, .warmup_num_steps = 10, .warmup_type = WARMUP_LOG,
                                  .total_num_steps = 110, .warmup_min_ratio = 0.1f, .cos_min_ratio = 0.01f};
    static const struct sched_case cases[] = {
        {"step 1: it 0, log 1 = 0 -> warmup_min_ratio", 1, 6e-5},
        {"step 5: it 4", 5, 4.3744380234145004e-4},
        {"warmup: it 9, ratio 1", 10, 6e-4},
    };
    run_cases("WarmupCosineLR log", &sc, 6e-4f, cases, N_CASES(cases));
}

int main(void)
{
    test_constant();
    test_warmup_lr_log();
    test_warmup_lr_linear();
    test_warmup_lr_clamped();
    test_warmup_decay_linear();
    test_warmup_decay_min();
    test_warmup_decay_log();
    test_warmup_cosine();
    test_warmup_cosine_log();
    return check_status();
}
