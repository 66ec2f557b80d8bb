/*
 * test_loss_scaler — fp16 loss scaling against DeepSpeed's rules
 * (deepspeed/runtime/fp16/loss_scaler.py DynamicLossScaler.update_scale, as
 * stage3.py uses it; see src/engine/loss_scaler.h).
 *
 * Every expected sequence below was worked out by hand from those rules, one
 * update at a time, from the state (scale s, hysteresis left h, iter it, last
 * overflow lo), starting at s = 2^initial_scale_power, h = hysteresis, it = 0,
 * lo = -1:
 *   overflow X: if hysteresis == 1 or h == 1: (s == min: at minimum, nothing
 *               changes) else s = max(s/2, min); otherwise h -= 1; lo = it
 *   clean    .: if consecutive: h = hysteresis; stable = it - lo - 1;
 *               stable > 0 and stable % window == 0: s *= 2 (and h = hysteresis
 *               when not consecutive)
 *   then it += 1 (not after "at minimum": the run stops there).
 * The same tables were also replayed through DeepSpeed's DynamicLossScaler
 * itself (its class text run by Python with stubs for logging and dist).
 */
#include "check.h"
#include "core/options.h"
#include "engine/loss_scaler.h"
#include "core/util.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define N_ITEMS(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define MAX_SEQ 32

/* DeepSpeed's defaults (precision_config.py DeepSpeedFP16Config). */
#define DS_INITIAL_SCALE_POWER 16
#define DS_LOSS_SCALE_WINDOW 1000
#define DS_HYSTERESIS 2
#define DS_MIN_LOSS_SCALE 1.0f

#define FP16_DYNAMIC(power, window, hyst, consecutive, min)                                              \
    {.enabled = true, .loss_scale = 0.0f, .initial_scale_power = (power), .loss_scale_window = (window), \
     .hysteresis = (hyst), .consecutive_hysteresis = (consecutive), .min_loss_scale = (min)}
#define FP16_DEFAULTS(enabled_, loss_scale_)                                                             \
    {.enabled = (enabled_), .loss_scale = (loss_scale_), .initial_scale_power = DS_INITIAL_SCALE_POWER,  \
     .loss_scale_window = DS_LOSS_SCALE_WINDOW, .hysteresis = DS_HYSTERESIS,                             \
     .consecutive_hysteresis = false, .min_loss_scale = DS_MIN_LOSS_SCALE}

static struct config make_config(enum dtype dtype, struct fp16_config fp16)
{
    struct config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.fp16 = fp16;
    cfg.bf16 = dtype == DTYPE_BF16;
    cfg.dtype = dtype;
    return cfg;
}

static char result_char(enum loss_scaler_result r)
{
    return r == LS_OK ? 'o' : r == LS_SKIP ? 's' : r == LS_AT_MINIMUM ? 'M' : '?';
}

/* One sequence: an overflow pattern and what must follow each update. */
struct sequence_case {
    const char *name;
    enum dtype dtype;
    struct fp16_config fp16;
    const char *overflows;       /* per update: '.' clean, 'X' overflow */
    const char *results;         /* per update: 'o' LS_OK, 's' LS_SKIP, 'M' LS_AT_MINIMUM */
    double scales[MAX_SEQ];      /* scale after each update */
    int hysteresis_left[MAX_SEQ];/* hysteresis_left after each update */
};

static const struct sequence_case sequences[] = {
    /* s=16 h=2. u0 X: h->1. u1 X: h==1 -> s=8, lo=1. u2..u4: stable 0,1,2.
     * u5: stable 3 = window -> s=16, h=2 (refilled only here). u8: stable 6 -> 32.
     * u9 X: h->1, lo=9. u10 clean (stable 0, h stays 1). u11 X: h==1 -> 16: two
     * overflows two steps apart halve. u12..u15 halve to 1 = min. u16 X at the
     * minimum with h == 1: at minimum. */
    {"hysteresis 2, not consecutive", DTYPE_F16, FP16_DYNAMIC(4, 3, 2, false, 1.0f),
     "XX" "......." "X" "." "XXXXX" "X",
     "ss" "ooooooo" "s" "o" "sssss" "M",
     {16, 8, 8, 8, 8, 16, 16, 16, 32, 32, 32, 16, 8, 4, 2, 1, 1},
     {1, 1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1}},
    /* consecutive: every clean step refills h, so only back-to-back overflows
     * halve. u0 X h->1; u1 . h=2; u2 X h->1 lo=2; u3 X s=8 lo=3; u4..u6 stable
     * 0,1,2; u7 stable 3 -> 16; u8 X h->1; u9 . h=2; u10 X h->1; u11 . h=2. */
    {"hysteresis 2, consecutive", DTYPE_F16, FP16_DYNAMIC(4, 3, 2, true, 1.0f),
     "X.XX....X.X.",
     "sossoooososo",
     {16, 16, 16, 8, 8, 8, 8, 16, 16, 16, 16, 16},
     {1, 2, 1, 1, 2, 2, 2, 2, 1, 2, 1, 2}},
    /* The same pattern without consecutive hysteresis: u0 X h->1; u1 . (h stays
     * 1); u2 X s=8 lo=2; u3 X s=4 lo=3; u7 stable 3 -> 8, h=2; u8 X h->1;
     * u10 X s=4. */
    {"same pattern, not consecutive", DTYPE_F16, FP16_DYNAMIC(4, 3, 2, false, 1.0f),
     "X.XX....X.X.",
     "sossoooososo",
     {16, 16, 8, 4, 4, 4, 4, 8, 8, 8, 4, 4},
     {1, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1}},
    /* hysteresis 3: two overflows absorbed, then every one halves. */
    {"hysteresis 3, not consecutive", DTYPE_F16, FP16_DYNAMIC(5, 100, 3, false, 1.0f),
     "XXXX",
     "ssss",
     {32, 32, 16, 8},
     {2, 1, 1, 1}},
    /* hysteresis 3, consecutive: runs of two overflows are absorbed, the third
     * in a row (u8) halves. */
    {"hysteresis 3, consecutive", DTYPE_F16, FP16_DYNAMIC(5, 100, 3, true, 1.0f),
     "XX.XX.XXX",
     "ssossosss",
     {32, 32, 32, 32, 32, 32, 32, 32, 16},
     {2, 1, 3, 2, 1, 3, 2, 1, 1}},
    /* Growth from the start (lo = -1): stable = it, so at it = 3, 6, 9: after
     * window + 1 clean updates, then every window. */
    {"window growth from the start", DTYPE_F16, FP16_DYNAMIC(2, 3, 2, false, 1.0f),
     "..........",
     "oooooooooo",
     {4, 4, 4, 8, 8, 8, 16, 16, 16, 32},
     {2, 2, 2, 2, 2, 2, 2, 2, 2, 2}},
    /* An overflow that only uses up hysteresis still restarts the window:
     * u1 X h->1 lo=1; u2..u3 stable 0,1; u4 stable 2 -> 32 and h=2.
     * Without it the scale would have grown at u2 (next case). */
    {"absorbed overflow restarts the window", DTYPE_F16, FP16_DYNAMIC(4, 2, 2, false, 1.0f),
     ".X...",
     "osooo",
     {16, 16, 16, 16, 32},
     {2, 1, 1, 1, 2}},
    {"window 2 without overflow", DTYPE_F16, FP16_DYNAMIC(4, 2, 2, false, 1.0f),
     ".....",
     "ooooo",
     {16, 16, 32, 32, 64},
     {2, 2, 2, 2, 2}},
    /* window 1: any stable > 0 grows: u1, u2; u3 X -> 8 lo=3; u4 stable 0;
     * u5, u6 grow. */
    {"window 1", DTYPE_F16, FP16_DYNAMIC(2, 1, 1, false, 1.0f),
     "...X...",
     "ooosooo",
     {4, 8, 16, 8, 8, 16, 32},
     {1, 1, 1, 1, 1, 1, 1}},
    /* hysteresis 1 halves at once; at s == min (2) the next overflow stops. */
    {"hysteresis 1 down to the minimum", DTYPE_F16, FP16_DYNAMIC(3, 2, 1, false, 2.0f),
     "XXX",
     "ssM",
     {4, 2, 2},
     {1, 1, 1}},
    /* min 3: 16 -> 8 -> 4 -> max(2, 3) = 3, then 3 == min: at minimum. */
    {"min clamps a non-power of two", DTYPE_F16, FP16_DYNAMIC(4, 1000, 1, false, 3.0f),
     "XXXX",
     "sssM",
     {8, 4, 3, 3},
     {1, 1, 1, 1}},
    /* Starting at the minimum (2^0 = 1 = min): hysteresis still absorbs first.
     * u0 X h->1; u1 . h=2 (stable 0); u2 X h->1 lo=2; u3, u4 stable 0, 1;
     * u5 stable 2 -> 2; u6 X h->1; u7 X -> max(1, 1) = 1; u8 X at 1: stop. */
    {"at the minimum, consecutive", DTYPE_F16, FP16_DYNAMIC(0, 2, 2, true, 1.0f),
     "X.X...XXX",
     "sosooossM",
     {1, 1, 1, 1, 1, 2, 2, 1, 1},
     {1, 2, 1, 2, 2, 2, 1, 1, 1}},
    /* Start below the minimum (2^0 < 2): DeepSpeed does not object; the halving
     * gives max(1/2, 2) = 2, raising the scale; at 2 the next one stops. */
    {"start below the minimum", DTYPE_F16, FP16_DYNAMIC(0, 100, 1, false, 2.0f),
     "XX",
     "sM",
     {2, 2},
     {1, 1}},
    /* Static scale: an overflow skips the step, the scale never moves and no
     * minimum applies (stage3.py checks overflow for any fp16 run; LossScaler's
     * update_scale does nothing). */
    {"static scale 128", DTYPE_F16, FP16_DEFAULTS(true, 128.0f),
     "X..XX.",
     "soosso",
     {128, 128, 128, 128, 128, 128},
     {0, 0, 0, 0, 0, 0}},
    {"static scale 1 equal to min_loss_scale", DTYPE_F16, FP16_DEFAULTS(true, 1.0f),
     "XXXX",
     "ssss",
     {1, 1, 1, 1},
     {0, 0, 0, 0}},
    /* bf16 and fp32: DeepSpeed never checks overflow: never a skip, scale 1. */
    {"bf16", DTYPE_BF16, FP16_DEFAULTS(false, 0.0f),
     "XX.X",
     "oooo",
     {1, 1, 1, 1},
     {0, 0, 0, 0}},
    {"fp32", DTYPE_F32, FP16_DEFAULTS(false, 0.0f),
     "X.",
     "oo",
     {1, 1},
     {0, 0}},
    /* fp16.loss_scale set but fp16 off: the static value does not apply. */
    {"bf16 with an fp16 loss_scale", DTYPE_BF16, FP16_DEFAULTS(false, 64.0f),
     "X",
     "o",
     {1},
     {0}},
};

static void run_sequence(const struct sequence_case *c)
{
    struct config cfg = make_config(c->dtype, c->fp16);
    struct loss_scaler ls;
    loss_scaler_init(&ls, &cfg);
    int n = (int)strlen(c->overflows);
    char name[160];
    snprintf(name, sizeof name, "%s: table well formed", c->name);
    CHECK(name, n == (int)strlen(c->results) && n <= MAX_SEQ, "%d overflows, %d results", n, (int)strlen(c->results));

    char got[MAX_SEQ + 1] = {0};
    for (int i = 0; i < n && i < MAX_SEQ; i++) {
        long iter_before = ls.iter, last_before = ls.last_overflow_iter;
        enum loss_scaler_result r = loss_scaler_update(&ls, c->overflows[i] == 'X');
        got[i] = result_char(r);

        snprintf(name, sizeof name, "%s: update %d result", c->name, i);
        CHECK(name, got[i] == c->results[i], "got '%c', want '%c'", got[i], c->results[i]);
        snprintf(name, sizeof name, "%s: update %d scale", c->name, i);
        CHECK(name, ls.scale == c->scales[i], "got %.17g, want %.17g", ls.scale, c->scales[i]);
        snprintf(name, sizeof name, "%s: update %d hysteresis left", c->name, i);
        CHECK(name, ls.hysteresis_left == c->hysteresis_left[i], "got %d, want %d", ls.hysteresis_left,
              c->hysteresis_left[i]);

        /* iter counts every update, skipped ones too, except the one that stops
         * the run; a dynamic overflow records the iteration it happened at. */
        long want_iter = r == LS_AT_MINIMUM ? iter_before : iter_before + 1;
        long want_last = ls.dynamic && r == LS_SKIP ? iter_before : last_before;
        snprintf(name, sizeof name, "%s: update %d iter", c->name, i);
        CHECK(name, ls.iter == want_iter && ls.iter == (r == LS_AT_MINIMUM ? i : i + 1), "got %ld, want %ld",
              ls.iter, want_iter);
        snprintf(name, sizeof name, "%s: update %d last overflow iter", c->name, i);
        CHECK(name, ls.last_overflow_iter == want_last, "got %ld, want %ld", ls.last_overflow_iter, want_last);
        snprintf(name, sizeof name, "%s: update %d state consistent", c->name, i);
        const char *why = loss_scaler_check_state(&ls);
        CHECK(name, why == NULL, "%s", why ? why : "");
    }
    snprintf(name, sizeof name, "%s: whole sequence", c->name);
    CHECK(name, strcmp(got, c->results) == 0, "got %s, want %s", got, c->results);
}

static void test_sequences(void)
{
    for (int i = 0; i < N_ITEMS(sequences); i++)
        run_sequence(&sequences[i]);
}

/* What loss_scaler_init sets from the config. */
struct init_case {
    const char *name;
    enum dtype dtype;
    struct fp16_config fp16;
    double scale;
    bool dynamic, skips_overflow;
    int hysteresis_left;
};

static const struct init_case inits[] = {
    {"fp16 defaults: 2^16", DTYPE_F16, FP16_DEFAULTS(true, 0.0f), 65536.0, true, true, DS_HYSTERESIS},
    {"initial_scale_power 0", DTYPE_F16, FP16_DYNAMIC(0, 1000, 2, false, 1.0f), 1.0, true, true, 2},
    {"initial_scale_power 24", DTYPE_F16, FP16_DYNAMIC(24, 1000, 5, false, 1.0f), 16777216.0, true, true, 5},
    /* 2^127 is a float's largest power of two; held exactly as a double. */
    {"initial_scale_power 127", DTYPE_F16, FP16_DYNAMIC(127, 1000, 2, false, 1.0f), 0x1p127, true, true, 2},
    {"static 128", DTYPE_F16, FP16_DEFAULTS(true, 128.0f), 128.0, false, true, 0},
    {"static 0.5", DTYPE_F16, FP16_DEFAULTS(true, 0.5f), 0.5, false, true, 0},
    {"bf16", DTYPE_BF16, FP16_DEFAULTS(false, 0.0f), 1.0, false, false, 0},
    {"fp32", DTYPE_F32, FP16_DEFAULTS(false, 0.0f), 1.0, false, false, 0},
    {"fp32 with fp16.loss_scale", DTYPE_F32, FP16_DEFAULTS(false, 256.0f), 1.0, false, false, 0},
};

static void test_init(void)
{
    for (int i = 0; i < N_ITEMS(inits); i++) {
        const struct init_case *c = &inits[i];
        struct config cfg = make_config(c->dtype, c->fp16);
        struct loss_scaler ls;
        memset(&ls, 0x5a, sizeof ls); /* init must set every field */
        loss_scaler_init(&ls, &cfg);
        char name[128];
        snprintf(name, sizeof name, "init %s: scale", c->name);
        CHECK(name, ls.scale == c->scale, "got %.17g, want %.17g", ls.scale, c->scale);
        snprintf(name, sizeof name, "init %s: modes", c->name);
        CHECK(name, ls.dynamic == c->dynamic && ls.skips_overflow == c->skips_overflow,
              "dynamic %d skips %d, want %d %d", ls.dynamic, ls.skips_overflow, c->dynamic, c->skips_overflow);
        snprintf(name, sizeof name, "init %s: counters", c->name);
        CHECK(name, ls.iter == 0 && ls.last_overflow_iter == -1 && ls.hysteresis_left == c->hysteresis_left,
              "iter %ld last %ld hysteresis %d", ls.iter, ls.last_overflow_iter, ls.hysteresis_left);
        snprintf(name, sizeof name, "init %s: state consistent", c->name);
        const char *why = loss_scaler_check_state(&ls);
        CHECK(name, why == NULL, "%s", why ? why : "");
    }
}

/* DeepSpeed's defaults over a long clean run: window 1000, hysteresis 2. */
static void test_default_window(void)
{
    struct config cfg = make_config(DTYPE_F16, (struct fp16_config)FP16_DEFAULTS(true, 0.0f));
    struct loss_scaler ls;
    loss_scaler_init(&ls, &cfg);
    /* From the start stable = iter: the scale first doubles at update 1000,
     * the 1001st clean one. */
    bool steady = true;
    for (int i = 0; i < 1000; i++)
        steady &= loss_scaler_update(&ls, false) == LS_OK && ls.scale == 65536.0;
    CHECK("default window: updates 0..999 keep 2^16", steady, "scale %.17g at iter %ld", ls.scale, ls.iter);
    CHECK("default window: update 1000 doubles",
          loss_scaler_update(&ls, false) == LS_OK && ls.scale == 131072.0 && ls.iter == 1001,
          "scale %.17g iter %ld", ls.scale, ls.iter);

    /* Update 1001 overflows: hysteresis 2 -> 1, scale kept, lo = 1001. */
    CHECK("default window: overflow at 1001 is skipped",
          loss_scaler_update(&ls, true) == LS_SKIP && ls.scale == 131072.0 && ls.hysteresis_left == 1 &&
              ls.last_overflow_iter == 1001 && ls.iter == 1002,
          "scale %.17g hysteresis %d last %ld iter %ld", ls.scale, ls.hysteresis_left, ls.last_overflow_iter,
          ls.iter);
    /* Then growth at iter = 1001 + 1 + 1000 = 2002; hysteresis is not refilled
     * before that (consecutive_hysteresis false). */
    steady = true;
    for (int i = 1002; i <= 2001; i++)
        steady &= loss_scaler_update(&ls, false) == LS_OK && ls.scale == 131072.0 && ls.hysteresis_left == 1;
    CHECK("default window: updates 1002..2001 keep the scale and hysteresis 1", steady,
          "scale %.17g hysteresis %d at iter %ld", ls.scale, ls.hysteresis_left, ls.iter);
    CHECK("default window: update 2002 doubles and refills hysteresis",
          loss_scaler_update(&ls, false) == LS_OK && ls.scale == 262144.0 && ls.hysteresis_left == 2 &&
              ls.iter == 2003,
          "scale %.17g hysteresis %d iter %ld", ls.scale, ls.hysteresis_left, ls.iter);
    /* and every 1000 after that. */
    for (int i = 2003; i < 3002; i++)
        loss_scaler_update(&ls, false);
    CHECK("default window: update 3001 still 2^18", ls.scale == 262144.0, "scale %.17g", ls.scale);
    loss_scaler_update(&ls, false);
    CHECK("default window: update 3002 doubles", ls.scale == 524288.0, "scale %.17g", ls.scale);
}

/* Same start, consecutive_hysteresis true: the clean step after an overflow
 * refills the hysteresis at once, the window is the same. */
static void test_default_window_consecutive(void)
{
    struct fp16_config f = FP16_DEFAULTS(true, 0.0f);
    f.consecutive_hysteresis = true;
    struct config cfg = make_config(DTYPE_F16, f);
    struct loss_scaler ls;
    loss_scaler_init(&ls, &cfg);
    for (int i = 0; i < 1001; i++)
        loss_scaler_update(&ls, false);
    loss_scaler_update(&ls, true); /* iter 1001 */
    CHECK("consecutive defaults: overflow uses hysteresis", ls.hysteresis_left == 1 && ls.scale == 131072.0,
          "hysteresis %d scale %.17g", ls.hysteresis_left, ls.scale);
    loss_scaler_update(&ls, false); /* iter 1002 */
    CHECK("consecutive defaults: next clean step refills it", ls.hysteresis_left == 2 && ls.scale == 131072.0,
          "hysteresis %d scale %.17g", ls.hysteresis_left, ls.scale);
    for (int i = 1003; i <= 2001; i++)
        loss_scaler_update(&ls, false);
    CHECK("consecutive defaults: update 2001 still 2^17", ls.scale == 131072.0, "scale %.17g", ls.scale);
    loss_scaler_update(&ls, false);
    CHECK("consecutive defaults: update 2002 doubles", ls.scale == 262144.0, "scale %.17g", ls.scale);
}

/* Defaults, every step overflowing: the first only uses hysteresis, then 16
 * halvings 2^16 -> 1 (updates 1..16), and update 17 finds the minimum. */
static void test_default_descent(void)
{
    struct config cfg = make_config(DTYPE_F16, (struct fp16_config)FP16_DEFAULTS(true, 0.0f));
    struct loss_scaler ls;
    loss_scaler_init(&ls, &cfg);
    CHECK("descent: update 0 skipped at 2^16", loss_scaler_update(&ls, true) == LS_SKIP && ls.scale == 65536.0,
          "scale %.17g", ls.scale);
    bool halving = true;
    for (int k = 1; k <= 16; k++)
        halving &= loss_scaler_update(&ls, true) == LS_SKIP && ls.scale == ldexp(1.0, 16 - k);
    CHECK("descent: updates 1..16 halve to 1", halving, "scale %.17g at iter %ld", ls.scale, ls.iter);
    CHECK("descent: update 17 at minimum", loss_scaler_update(&ls, true) == LS_AT_MINIMUM, "scale %.17g",
          ls.scale);
    CHECK("descent: state left as it was", ls.scale == 1.0 && ls.iter == 17 && ls.last_overflow_iter == 16 &&
                                               ls.hysteresis_left == 1,
          "scale %.17g iter %ld last %ld hysteresis %d", ls.scale, ls.iter, ls.last_overflow_iter,
          ls.hysteresis_left);
}

/* Growth past a float's range: the scale is a double, as in Python. */
static void test_growth_beyond_float(void)
{
    struct config cfg = make_config(DTYPE_F16, (struct fp16_config)FP16_DYNAMIC(127, 1, 1, false, 1.0f));
    struct loss_scaler ls;
    loss_scaler_init(&ls, &cfg);
    loss_scaler_update(&ls, false); /* stable 0 */
    loss_scaler_update(&ls, false); /* stable 1 -> 2^128 */
    CHECK("growth beyond float: 2^128 exact", ls.scale == 0x1p128, "scale %.17g", ls.scale);
    loss_scaler_update(&ls, true);
    CHECK("growth beyond float: halves back to 2^127", ls.scale == 0x1p127, "scale %.17g", ls.scale);
    /* With window 1 every clean update after the first doubles: 2^127 reaches
     * 2^1023 after 896 more and then stays there, finite (the hysteresis is
     * still refilled: the growth condition held). */
    for (int i = 0; i < 2000; i++)
        loss_scaler_update(&ls, false);
    CHECK("growth beyond float: capped at the largest finite power of two", ls.scale == 0x1p1023,
          "scale %.17g", ls.scale);
    const char *why = loss_scaler_check_state(&ls);
    CHECK("growth beyond float: state still consistent", why == NULL, "%s", why ? why : "");
    CHECK("growth beyond float: an overflow halves it", loss_scaler_update(&ls, true) == LS_SKIP &&
                                                             ls.scale == 0x1p1022,
          "scale %.17g", ls.scale);
}

/* A checkpoint saves the four state fields; a scaler initialised from the same
 * config with them restored must continue exactly as the original. */
static void test_checkpoint_roundtrip(void)
{
    struct config cfg = make_config(DTYPE_F16, (struct fp16_config)FP16_DYNAMIC(10, 5, 3, false, 0.25f));
    struct loss_scaler original;
    loss_scaler_init(&original, &cfg);
    uint64_t rng = 42;
    const int save_at = 137, total = 600;
    int i = 0, diverged = -1, overflows = 0, skips = 0;
    for (; i < save_at; i++) {
        bool overflow = splitmix64(&rng) % 5 == 0;
        overflows += overflow;
        if (loss_scaler_update(&original, overflow) == LS_AT_MINIMUM)
            break;
    }
    CHECK("checkpoint: reached the save point", i == save_at, "stopped at %d", i);
    struct loss_scaler resumed;
    loss_scaler_init(&resumed, &cfg);
    resumed.scale = original.scale;
    resumed.hysteresis_left = original.hysteresis_left;
    resumed.iter = original.iter;
    resumed.last_overflow_iter = original.last_overflow_iter;
    const char *why = loss_scaler_check_state(&resumed);
    CHECK("checkpoint: restored state consistent", why == NULL, "%s", why ? why : "");
    for (; i < total && diverged < 0; i++) {
        bool overflow = splitmix64(&rng) % 5 == 0;
        enum loss_scaler_result a = loss_scaler_update(&original, overflow);
        enum loss_scaler_result b = loss_scaler_update(&resumed, overflow);
        skips += a == LS_SKIP;
        if (a != b || memcmp(&original, &resumed, sizeof original) != 0)
            diverged = i;
        if (a == LS_AT_MINIMUM)
            break;
    }
    CHECK("checkpoint: resumed scaler identical to the original", diverged < 0, "diverged at update %d",
          diverged);
    /* The walk must exercise the rules: overflows before and after the save. */
    CHECK("checkpoint: the walk overflowed on both sides", overflows > 10 && skips > 10, "%d before, %d after",
          overflows, skips);
}

/* A checkpoint from a run with a larger hysteresis, resumed with a smaller one
 * (settings come from the current config). DeepSpeed's test is
 * "delayed_shift == 1 or cur_hysteresis == 1": with hysteresis 1 every
 * overflow halves whatever is left; with hysteresis 2 the left-over 3 absorbs
 * two overflows. Growth refills to the current setting. */
static void test_resume_with_smaller_hysteresis(void)
{
    struct config cfg = make_config(DTYPE_F16, (struct fp16_config)FP16_DYNAMIC(8, 2, 1, false, 1.0f));
    struct loss_scaler ls;
    loss_scaler_init(&ls, &cfg);
    ls.hysteresis_left = 3;
    CHECK("resume, hysteresis 1 with 3 left: overflow halves at once",
          loss_scaler_update(&ls, true) == LS_SKIP && ls.scale == 128.0 && ls.hysteresis_left == 3,
          "scale %.17g hysteresis %d", ls.scale, ls.hysteresis_left);
    loss_scaler_update(&ls, false); /* stable 0 */
    loss_scaler_update(&ls, false); /* stable 1 */
    loss_scaler_update(&ls, false); /* stable 2: grows, refills to 1 */
    CHECK("resume, hysteresis 1: growth refills to the config's 1", ls.scale == 256.0 && ls.hysteresis_left == 1,
          "scale %.17g hysteresis %d", ls.scale, ls.hysteresis_left);

    cfg = make_config(DTYPE_F16, (struct fp16_config)FP16_DYNAMIC(8, 2, 2, false, 1.0f));
    loss_scaler_init(&ls, &cfg);
    ls.hysteresis_left = 3;
    enum loss_scaler_result r0 = loss_scaler_update(&ls, true);
    enum loss_scaler_result r1 = loss_scaler_update(&ls, true);
    CHECK("resume, hysteresis 2 with 3 left: two overflows absorbed",
          r0 == LS_SKIP && r1 == LS_SKIP && ls.scale == 256.0 && ls.hysteresis_left == 1,
          "scale %.17g hysteresis %d", ls.scale, ls.hysteresis_left);
    CHECK("resume, hysteresis 2: the third halves", loss_scaler_update(&ls, true) == LS_SKIP && ls.scale == 128.0,
          "scale %.17g", ls.scale);
}

/* loss_scaler_check_state on corrupted or mismatched state. */
struct bad_state {
    const char *name;
    enum dtype dtype;
    struct fp16_config fp16;
    double scale;
    int hysteresis_left;
    long iter, last_overflow_iter;
    bool valid;
};

static const struct bad_state states[] = {
    {"dynamic, mid-run", DTYPE_F16, FP16_DYNAMIC(16, 1000, 2, false, 1.0f), 4096.0, 1, 500, 480, true},
    {"dynamic, hysteresis above config", DTYPE_F16, FP16_DYNAMIC(16, 1000, 2, false, 1.0f), 4096.0, 3, 5, 1, true},
    {"dynamic, no overflow yet", DTYPE_F16, FP16_DYNAMIC(16, 1000, 2, false, 1.0f), 65536.0, 2, 7, -1, true},
    {"dynamic, NaN scale", DTYPE_F16, FP16_DYNAMIC(16, 1000, 2, false, 1.0f), NAN, 2, 7, -1, false},
    {"dynamic, infinite scale", DTYPE_F16, FP16_DYNAMIC(16, 1000, 2, false, 1.0f), INFINITY, 2, 7, -1, false},
    {"dynamic, zero scale", DTYPE_F16, FP16_DYNAMIC(16, 1000, 2, false, 1.0f), 0.0, 2, 7, -1, false},
    {"dynamic, below min", DTYPE_F16, FP16_DYNAMIC(16, 1000, 2, false, 4.0f), 2.0, 2, 7, -1, false},
    {"dynamic, started below min", DTYPE_F16, FP16_DYNAMIC(0, 1000, 2, false, 4.0f), 1.0, 2, 7, -1, true},
    {"dynamic, below a start below min", DTYPE_F16, FP16_DYNAMIC(1, 1000, 2, false, 4.0f), 1.0, 2, 7, -1, false},
    {"dynamic, hysteresis 0", DTYPE_F16, FP16_DYNAMIC(16, 1000, 2, false, 1.0f), 8.0, 0, 7, 3, false},
    {"dynamic, negative iter", DTYPE_F16, FP16_DYNAMIC(16, 1000, 2, false, 1.0f), 8.0, 2, -1, -1, false},
    {"dynamic, overflow at iter", DTYPE_F16, FP16_DYNAMIC(16, 1000, 2, false, 1.0f), 8.0, 2, 7, 7, false},
    {"dynamic, overflow below -1", DTYPE_F16, FP16_DYNAMIC(16, 1000, 2, false, 1.0f), 8.0, 2, 7, -2, false},
    {"static, fresh", DTYPE_F16, FP16_DEFAULTS(true, 128.0f), 128.0, 0, 9, -1, true},
    {"static, other scale", DTYPE_F16, FP16_DEFAULTS(true, 128.0f), 256.0, 0, 9, -1, false},
    {"static, dynamic state", DTYPE_F16, FP16_DEFAULTS(true, 128.0f), 128.0, 2, 9, 4, false},
    {"bf16, scale 1", DTYPE_BF16, FP16_DEFAULTS(false, 0.0f), 1.0, 0, 9, -1, true},
    {"bf16, fp16 checkpoint's scale", DTYPE_BF16, FP16_DEFAULTS(false, 0.0f), 65536.0, 2, 9, -1, false},
};

static void test_check_state(void)
{
    for (int i = 0; i < N_ITEMS(states); i++) {
        const struct bad_state *c = &states[i];
        struct config cfg = make_config(c->dtype, c->fp16);
        struct loss_scaler ls;
        loss_scaler_init(&ls, &cfg);
        ls.scale = c->scale;
        ls.hysteresis_left = c->hysteresis_left;
        ls.iter = c->iter;
        ls.last_overflow_iter = c->last_overflow_iter;
        const char *why = loss_scaler_check_state(&ls);
        char name[128];
        snprintf(name, sizeof name, "check state: %s %s", c->name, c->valid ? "accepted" : "rejected");
        CHECK(name, (why == NULL) == c->valid, "got %s", why ? why : "valid");
    }
}

static void test_result_names(void)
{
    CHECK("result names", strcmp(loss_scaler_result_name(LS_OK), "ok") == 0 &&
                              strcmp(loss_scaler_result_name(LS_SKIP), "skip") == 0 &&
                              strcmp(loss_scaler_result_name(LS_AT_MINIMUM), "at minimum") == 0,
          "unexpected names");
}

int main(void)
{
    test_init();
    test_sequences();
    test_default_window();
    test_default_window_consecutive();
    test_default_descent();
    test_growth_beyond_float();
    test_checkpoint_roundtrip();
    test_resume_with_smaller_hysteresis();
    test_check_state();
    test_result_names();
    return check_status();
}
