/*
 * config_deepspeed — the sections in DeepSpeed's vocabulary: the batch sizes
 * (and their resolution against the world size, config_resolve_batch),
 * gradient clipping and printing, optimizer, scheduler, fp16 / bf16,
 * zero_optimization and activation_checkpointing, with DeepSpeed's defaults
 * and its checks.
 */
#include "config_internal.h"

#include "core/util.h"

#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- defaults ---------------------------------------------------------- */

/* FusedAdam / DeepSpeedCPUAdam constructor defaults. */
#define ADAM_LR_DEFAULT 1e-3
#define ADAM_BETA1_DEFAULT 0.9
#define ADAM_BETA2_DEFAULT 0.999
#define ADAM_EPS_DEFAULT 1e-8
#define ADAM_WEIGHT_DECAY_DEFAULT 0.0

/* constants.py GRADIENT_CLIPPING_DEFAULT: 1.0 since DeepSpeed v0.19.3 (PR #8068,
 * "Default gradient_clipping to 1.0"); it was 0 (off) before. */
#define GRADIENT_CLIPPING_DEFAULT 1.0
/* DeepSpeed's STEPS_PER_PRINT_DEFAULT was 10 until v0.15.2 and is now None (its
 * own progress line is off). shardlm's progress line is its main output, so it
 * keeps the old 10. */
#define STEPS_PER_PRINT_DEFAULT 10

/* precision_config.py DeepSpeedFP16Config. */
#define FP16_LOSS_SCALE_DEFAULT 0.0 /* dynamic */
#define FP16_INITIAL_SCALE_POWER_DEFAULT 16
#define FP16_LOSS_SCALE_WINDOW_DEFAULT 1000
#define FP16_HYSTERESIS_DEFAULT 2
#define FP16_MIN_LOSS_SCALE_DEFAULT 1.0
/* 2^power must be a finite fp32 number. */
#define FP16_INITIAL_SCALE_POWER_MAX 127

/* zero/config.py DeepSpeedZeroConfig (element counts). overlap_comm's default
 * is dynamic there: true for stage 3, false otherwise. */
#define ZERO_REDUCE_BUCKET_SIZE_DEFAULT 5e8
#define ZERO_PREFETCH_BUCKET_SIZE_DEFAULT 50000000LL
#define ZERO_MAX_LIVE_PARAMETERS_DEFAULT 1000000000LL
#define ZERO_PERSISTENCE_THRESHOLD_DEFAULT 100000LL
/* zero/offload_config.py: buffer counts and the parameter buffer size. */
#define ZERO_OPTIMIZER_BUFFER_COUNT_DEFAULT 4
#define ZERO_PARAM_BUFFER_COUNT_DEFAULT 5
#define ZERO_PARAM_BUFFER_SIZE_DEFAULT 1e8
/* zero/offload_config.py: pin_memory defaults to true since v0.19.5. */
#define ZERO_OFFLOAD_PIN_MEMORY_DEFAULT true

/* lr_schedules.py constructor defaults. WarmupLR's warmup_max_lr defaults to
 * the optimizer's lr since v0.17.2 (PR #7360); WarmupDecayLR's stays 0.001. */
#define SCHED_WARMUP_MIN_LR_DEFAULT 0.0
#define SCHED_WARMUP_DECAY_MAX_LR_DEFAULT 0.001
#define SCHED_WARMUP_NUM_STEPS_DEFAULT 1000
#define SCHED_WARMUP_MIN_RATIO_DEFAULT 0.0
#define SCHED_COS_MIN_RATIO_DEFAULT 0.0001

/* The activation sizes of one micro-batch (after the batch is resolved). */
void check_batch_sizes(const struct config *cfg)
{
    const struct model_config *m = &cfg->model;
    const long long B = cfg->micro_batch, T = cfg->data.seq_len, BT = sat_mul(B, T);
    char keys[256];
    if (BT > INT_MAX)
        fail_input("config: train_micro_batch_size_per_gpu (%lld) x data.seq_len (%lld) = %lld tokens per "
                   "micro-batch, more than the %d shardlm allows; lower one of them",
                   B, T, BT, INT_MAX);
    snprintf(keys, sizeof keys, "train_micro_batch_size_per_gpu %lld x data.seq_len %lld x model.vocab_size %d", B,
             T, m->vocab_size);
    check_bound("the logits of one micro-batch", sat_mul(BT, m->padded_vocab), CONFIG_MAX_TENSOR, keys);
    /* the attention keeps its rows' statistics, not their scores, unless the CPU's materialized kernel is
     * chosen (SHARDLM_ATTENTION=materialized, backend_cpu_attention.h): then its T x T scores of every head */
    const char *kernel = getenv("SHARDLM_ATTENTION");
    long long att = 0;
    if (kernel && strcmp(kernel, "materialized") == 0) {
        snprintf(keys, sizeof keys,
                 "train_micro_batch_size_per_gpu %lld x model.n_head %d x data.seq_len %lld squared (SHARDLM_ATTENTION="
                 "materialized)",
                 B, m->n_head, T);
        att = sat_mul(sat_mul(B, m->n_head), sat_mul(T, T));
        check_bound("the attention scores of one layer", att, CONFIG_MAX_TENSOR, keys);
    }
    const long long C = m->n_embd, KV = C / m->n_head * m->n_kv_head;
    long long width = sat_add(sat_mul(6, C), sat_add(sat_mul(2, KV), sat_mul(3, m->ffn_dim)));
    long long per_layer = sat_add(sat_mul(BT, width), att);
    snprintf(keys, sizeof keys,
             "model.n_layer %d x train_micro_batch_size_per_gpu %lld x data.seq_len %lld x width from model.n_embd, "
             "model.ffn_dim and model.n_head",
             m->n_layer, B, T);
    check_bound("the activations of all layers", sat_mul(m->n_layer, per_layer), CONFIG_MAX_ALL_LAYERS, keys);
}

/* ---- sections ---------------------------------------------------------- */

void read_batch(struct config *cfg, json_t *root)
{
    /* Not filled in: config_resolve_batch() writes the resolved three. */
    static const char *const names[3] = {"train_batch_size", "train_micro_batch_size_per_gpu",
                                         "gradient_accumulation_steps"};
    int *fields[3] = {&cfg->train_batch_size, &cfg->micro_batch, &cfg->grad_accum};
    for (int i = 0; i < 3; i++) {
        *fields[i] = read_int(root, names[i], 0, NO_FILL);
        if (is_given(root, names[i]))
            require_positive(names[i], *fields[i]);
    }
    double clip = read_num(root, "gradient_clipping", GRADIENT_CLIPPING_DEFAULT, FILL);
    require_non_negative_num("gradient_clipping", clip);
    cfg->gradient_clipping = (float)clip;
    cfg->steps_per_print = read_int(root, "steps_per_print", STEPS_PER_PRINT_DEFAULT, FILL);
    require_positive("steps_per_print", cfg->steps_per_print);
    cfg->wall_clock_breakdown = read_bool(root, "wall_clock_breakdown", false, FILL);
}

static void read_betas(struct optimizer_config *o, json_t *root)
{
    const char *path = "optimizer.params.betas";
    json_t *betas = doc_get(root, path);
    if (!betas) {
        json_t *def = json_pack("[ff]", ADAM_BETA1_DEFAULT, ADAM_BETA2_DEFAULT);
        put_default(root, path, def);
        o->beta1 = (float)ADAM_BETA1_DEFAULT;
        o->beta2 = (float)ADAM_BETA2_DEFAULT;
        return;
    }
    if (json_array_size(betas) != 2 || !json_is_number(json_array_get(betas, 0)) ||
        !json_is_number(json_array_get(betas, 1))) {
        char text[128];
        fail_input("config: '%s' must be an array of two numbers [beta1, beta2], got %s", path,
                   json_brief(betas, text, sizeof text));
    }
    double b[2];
    for (int i = 0; i < 2; i++) {
        b[i] = json_number_value(json_array_get(betas, (size_t)i));
        if (!(b[i] >= 0 && b[i] < 1))
            fail_input("config: '%s[%d]' must be in [0, 1), got %g", path, i, b[i]);
    }
    o->beta1 = (float)b[0];
    o->beta2 = (float)b[1];
}

void read_optimizer(struct config *cfg, json_t *root)
{
    struct optimizer_config *o = &cfg->optimizer;
    /* Without optimizer.type DeepSpeed would need a client optimizer; shardlm
     * has one family, so a config that sets only optimizer.params (or a
     * --set optimizer.params.lr=...) gets AdamW with FusedAdam's defaults. */
    const char *type = read_str(root, "optimizer.type", "AdamW", FILL);
    /* DeepSpeed lower-cases the optimizer name before comparing. */
    bool adamw;
    if (strcasecmp(type, "adamw") == 0)
        adamw = true;
    else if (strcasecmp(type, "adam") == 0)
        adamw = false;
    else
        fail_input("config: 'optimizer.type' is \"%s\"; shardlm implements the optimizer types Adam and AdamW", type);
    snprintf(o->type, sizeof o->type, "%s", adamw ? "AdamW" : "Adam");

    o->lr = (float)read_num(root, "optimizer.params.lr", ADAM_LR_DEFAULT, FILL);
    require_non_negative_num("optimizer.params.lr", o->lr);
    read_betas(o, root);
    o->eps = (float)read_num(root, "optimizer.params.eps", ADAM_EPS_DEFAULT, FILL);
    require_non_negative_num("optimizer.params.eps", o->eps);
    o->weight_decay = (float)read_num(root, "optimizer.params.weight_decay", ADAM_WEIGHT_DECAY_DEFAULT, FILL);
    require_non_negative_num("optimizer.params.weight_decay", o->weight_decay);

    /* DeepSpeed (engine.py _configure_basic_optimizer): type AdamW forces
     * decoupled decay; type Adam uses adam_w_mode, which defaults to true. */
    bool adam_w_mode = read_bool(root, "optimizer.params.adam_w_mode", true, FILL);
    if (adamw && !adam_w_mode)
        log_warn("optimizer.params.adam_w_mode=false has no effect with optimizer type AdamW (as in DeepSpeed); "
                 "use type \"Adam\" for L2 regularisation");
    o->adam_w_mode = adamw || adam_w_mode;

    if (!read_bool(root, "optimizer.params.bias_correction", true, FILL))
        fail_input("config: 'optimizer.params.bias_correction' is false, which shardlm does not support; remove it "
                   "or set it to true");
    if (read_bool(root, "optimizer.params.amsgrad", false, NO_FILL))
        fail_input("config: 'optimizer.params.amsgrad' is true: AMSGrad is not supported (DeepSpeed's FusedAdam "
                   "rejects it too); remove it");
}

struct sched_kind {
    const char *name;
    enum sched_type type;
    const char *const *params; /* the keys its constructor takes, ended by NULL */
};

static const char *const warmup_lr_params[] = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                                               "last_batch_iteration", NULL};
static const char *const warmup_decay_params[] = {"total_num_steps", "warmup_min_lr", "warmup_max_lr",
                                                  "warmup_num_steps", "warmup_type", "last_batch_iteration", NULL};
static const char *const warmup_cosine_params[] = {"total_num_steps", "warmup_min_ratio", "warmup_num_steps",
                                                   "cos_min_ratio", "warmup_type", "last_batch_iteration", NULL};

static const struct sched_kind sched_kinds[] = {
    {"WarmupLR", SCHED_WARMUP_LR, warmup_lr_params},
    {"WarmupDecayLR", SCHED_WARMUP_DECAY_LR, warmup_decay_params},
    {"WarmupCosineLR", SCHED_WARMUP_COSINE_LR, warmup_cosine_params},
};
#define SCHED_KNOWN "WarmupLR, WarmupDecayLR, WarmupCosineLR"

static const struct sched_kind *find_sched_kind(const char *type)
{
    for (size_t i = 0; i < sizeof sched_kinds / sizeof sched_kinds[0]; i++)
        if (strcmp(sched_kinds[i].name, type) == 0)
            return &sched_kinds[i];
    for (size_t i = 0; i < sizeof sched_kinds / sizeof sched_kinds[0]; i++)
        if (strcasecmp(sched_kinds[i].name, type) == 0)
            fail_input("config: 'scheduler.type' is \"%s\"; scheduler names are case-sensitive (as in DeepSpeed): "
                       "did you mean \"%s\"?",
                       type, sched_kinds[i].name);
    if (strcmp(type, "OneCycle") == 0 || strcmp(type, "LRRangeTest") == 0)
        fail_input("config: 'scheduler.type' %s is a DeepSpeed schedule that shardlm does not implement; known: %s",
                   type, SCHED_KNOWN);
    fail_input("config: 'scheduler.type' is \"%s\"; known scheduler types: %s", type, SCHED_KNOWN);
}

/* Rejects parameters the chosen schedule's constructor does not take. */
static void check_sched_params(json_t *root, const struct sched_kind *kind)
{
    json_t *params = doc_get(root, "scheduler.params");
    if (!params)
        return;
    const char *key;
    json_t *value;
    json_object_foreach(params, key, value) {
        const char *const *p = kind->params;
        while (*p && strcmp(*p, key) != 0)
            p++;
        if (*p)
            continue;
        char list[512];
        size_t used = 0;
        for (const char *const *q = kind->params; *q && used < sizeof list; q++)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", q == kind->params ? "" : ", ", *q);
        fail_input("config: 'scheduler.params.%s' is not a parameter of %s (it takes: %s)", key, kind->name, list);
    }
}

void read_scheduler(struct config *cfg, json_t *root)
{
    struct scheduler_config *s = &cfg->scheduler;
    if (!is_given(root, "scheduler")) {
        s->type = SCHED_CONSTANT;
        return;
    }
    const char *type = read_str(root, "scheduler.type", NULL, NO_FILL);
    if (!type)
        fail_input("config: 'scheduler.type' is missing; known scheduler types: %s (or remove the \"scheduler\" "
                   "section for a constant rate)",
                   SCHED_KNOWN);
    const struct sched_kind *kind = find_sched_kind(type);
    s->type = kind->type;
    check_sched_params(root, kind);

    s->warmup_num_steps = read_int(root, "scheduler.params.warmup_num_steps", SCHED_WARMUP_NUM_STEPS_DEFAULT, FILL);
    require_positive("scheduler.params.warmup_num_steps", s->warmup_num_steps);
    const char *warmup_type = read_str(root, "scheduler.params.warmup_type", "log", FILL);
    if (strcmp(warmup_type, "log") == 0)
        s->warmup_type = WARMUP_LOG;
    else if (strcmp(warmup_type, "linear") == 0)
        s->warmup_type = WARMUP_LINEAR;
    else
        fail_input("config: 'scheduler.params.warmup_type' is \"%s\"; known: \"log\", \"linear\"", warmup_type);
    /* shardlm resumes schedules from the step a checkpoint stores. */
    if (read_int64(root, "scheduler.params.last_batch_iteration", -1, NO_FILL) != -1)
        fail_input("config: 'scheduler.params.last_batch_iteration' must be -1 (or absent); a resumed run takes "
                   "its step from the checkpoint");

    if (s->type == SCHED_WARMUP_LR || s->type == SCHED_WARMUP_DECAY_LR) {
        /* The optimizer's lr as written (a double), not the float in cfg, so the
         * filled-in default prints as the user wrote it. */
        double optimizer_lr = read_num(root, "optimizer.params.lr", ADAM_LR_DEFAULT, NO_FILL);
        double max_default = s->type == SCHED_WARMUP_LR ? optimizer_lr : SCHED_WARMUP_DECAY_MAX_LR_DEFAULT;
        double min_lr = read_num(root, "scheduler.params.warmup_min_lr", SCHED_WARMUP_MIN_LR_DEFAULT, FILL);
        double max_lr = read_num(root, "scheduler.params.warmup_max_lr", max_default, FILL);
        require_non_negative_num("scheduler.params.warmup_min_lr", min_lr);
        require_non_negative_num("scheduler.params.warmup_max_lr", max_lr);
        s->warmup_min_lr = (float)min_lr;
        s->warmup_max_lr = (float)max_lr;
    }
    if (s->type == SCHED_WARMUP_COSINE_LR) {
        double wmin = read_num(root, "scheduler.params.warmup_min_ratio", SCHED_WARMUP_MIN_RATIO_DEFAULT, FILL);
        double cmin = read_num(root, "scheduler.params.cos_min_ratio", SCHED_COS_MIN_RATIO_DEFAULT, FILL);
        require_ratio("scheduler.params.warmup_min_ratio", wmin);
        require_ratio("scheduler.params.cos_min_ratio", cmin);
        s->warmup_min_ratio = (float)wmin;
        s->cos_min_ratio = (float)cmin;
    }
    if (s->type == SCHED_WARMUP_DECAY_LR || s->type == SCHED_WARMUP_COSINE_LR) {
        if (!is_given(root, "scheduler.params.total_num_steps"))
            fail_input("config: 'scheduler.params.total_num_steps' is required by %s; set it to the run's length "
                       "(train.steps is %d)",
                       kind->name, cfg->train.steps);
        s->total_num_steps = read_int(root, "scheduler.params.total_num_steps", 0, NO_FILL);
        require_positive("scheduler.params.total_num_steps", s->total_num_steps);
        /* DeepSpeed only warns; a decay that never starts is a mistake. */
        if (s->total_num_steps < s->warmup_num_steps)
            fail_input("config: 'scheduler.params.total_num_steps' (%d) is smaller than "
                       "'scheduler.params.warmup_num_steps' (%d): the schedule would end before its warmup does; "
                       "raise total_num_steps or lower warmup_num_steps",
                       s->total_num_steps, s->warmup_num_steps);
    }
}

void read_precision(struct config *cfg, json_t *root)
{
    struct fp16_config *f = &cfg->fp16;
    f->enabled = read_bool(root, "fp16.enabled", false, FILL);
    f->loss_scale = (float)read_num(root, "fp16.loss_scale", FP16_LOSS_SCALE_DEFAULT, FILL);
    if (!(f->loss_scale >= 0))
        fail_input("config: 'fp16.loss_scale' must be >= 0 (0 selects dynamic loss scaling), got %g", f->loss_scale);
    f->initial_scale_power = read_int(root, "fp16.initial_scale_power", FP16_INITIAL_SCALE_POWER_DEFAULT, FILL);
    if (f->initial_scale_power < 0 || f->initial_scale_power > FP16_INITIAL_SCALE_POWER_MAX)
        fail_input("config: 'fp16.initial_scale_power' must be between 0 and %d (the scale is 2^power), got %d",
                   FP16_INITIAL_SCALE_POWER_MAX, f->initial_scale_power);
    f->loss_scale_window = read_int(root, "fp16.loss_scale_window", FP16_LOSS_SCALE_WINDOW_DEFAULT, FILL);
    f->hysteresis = read_int(root, "fp16.hysteresis", FP16_HYSTERESIS_DEFAULT, FILL);
    f->consecutive_hysteresis = read_bool(root, "fp16.consecutive_hysteresis", false, FILL);
    f->min_loss_scale = (float)read_num(root, "fp16.min_loss_scale", FP16_MIN_LOSS_SCALE_DEFAULT, FILL);
    /* As DeepSpeed: these only matter, so are only checked, with dynamic scaling. */
    if (f->enabled && f->loss_scale == 0) {
        if (f->loss_scale_window <= 0)
            fail_input("config: 'fp16.loss_scale_window' must be positive with dynamic loss scaling, got %d",
                       f->loss_scale_window);
        if (f->hysteresis < 1)
            fail_input("config: 'fp16.hysteresis' must be at least 1 (overflows tolerated before the scale drops), "
                       "got %d",
                       f->hysteresis);
        if (!(f->min_loss_scale > 0))
            fail_input("config: 'fp16.min_loss_scale' must be positive with dynamic loss scaling, got %g",
                       f->min_loss_scale);
    }
    if (read_bool(root, "fp16.fp16_master_weights_and_grads", false, NO_FILL))
        fail_input("config: 'fp16.fp16_master_weights_and_grads' is true, which shardlm does not support: master "
                   "weights are always fp32; remove it");

    /* DeepSpeed reads "bf16", else its old name "bfloat16". */
    const char *bf16 = is_given(root, "bf16") || !is_given(root, "bfloat16") ? "bf16" : "bfloat16";
    char path[KEY_PATH_CAP];
    snprintf(path, sizeof path, "%s.enabled", bf16);
    cfg->bf16 = read_bool(root, path, false, FILL);
    static const char *const bf16_unsupported[] = {"bf16_master_weights_and_grads", "bf16_optimizer_states"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s.%s", bf16, bf16_unsupported[i]);
        if (read_bool(root, path, false, NO_FILL))
            fail_input("config: '%s' is true, which shardlm does not support: master weights and Adam moments are "
                       "always fp32; remove it",
                       path);
    }
    if (f->enabled && cfg->bf16)
        fail_input("config: 'fp16.enabled' and '%s.enabled' are both true; choose one precision", bf16);
    cfg->dtype = f->enabled ? DTYPE_F16 : cfg->bf16 ? DTYPE_BF16 : DTYPE_F32;
}

/* offload_optimizer.device / offload_param.device: "none", "cpu" or
 * "nvme" (ZeRO-Infinity: "nvme" offloads to host memory as "cpu" does and
 * keeps the state in files under nvme_path besides). */
static const char *read_offload_device(json_t *root, const char *what, bool *host, bool *nvme,
                                       enum fill_mode fill)
{
    char key[KEY_PATH_CAP], path_key[KEY_PATH_CAP];
    snprintf(key, sizeof key, "zero_optimization.%s.device", what);
    snprintf(path_key, sizeof path_key, "zero_optimization.%s.nvme_path", what);
    const char *device = read_str(root, key, "none", fill);
    if (strcmp(device, "cpu") != 0 && strcmp(device, "none") != 0 && strcmp(device, "nvme") != 0)
        fail_input("config: '%s' is \"%s\"; known: \"none\", \"cpu\", \"nvme\"", key, device);
    *nvme = strcmp(device, "nvme") == 0;
    *host = *nvme || strcmp(device, "cpu") == 0;
    const char *dir = read_str(root, path_key, NULL, NO_FILL);
    if (*nvme && (!dir || !*dir))
        fail_input("config: '%s' is \"nvme\" but '%s' is not set; set it to a directory on a local NVMe disk "
                   "(each rank keeps its files there)",
                   key, path_key);
    return dir && *dir ? dir : NULL; /* kept with "cpu" and "none" too: `shardlm plan --fit` may move the state there */
}

static void read_offload(struct zero_config *z, json_t *root)
{
    z->optimizer_nvme_path =
        read_offload_device(root, "offload_optimizer", &z->offload_optimizer, &z->offload_optimizer_nvme, FILL);
    z->offload_pin_memory =
        read_bool(root, "zero_optimization.offload_optimizer.pin_memory", ZERO_OFFLOAD_PIN_MEMORY_DEFAULT, FILL);
    z->optimizer_buffer_count = read_int(root, "zero_optimization.offload_optimizer.buffer_count",
                                         ZERO_OPTIMIZER_BUFFER_COUNT_DEFAULT, NO_FILL);
    require_positive("zero_optimization.offload_optimizer.buffer_count", z->optimizer_buffer_count);
    z->param_nvme_path =
        read_offload_device(root, "offload_param", &z->offload_param, &z->offload_param_nvme, NO_FILL);
    z->offload_param_pin_memory =
        read_bool(root, "zero_optimization.offload_param.pin_memory", ZERO_OFFLOAD_PIN_MEMORY_DEFAULT, NO_FILL);
    z->param_buffer_count =
        read_int(root, "zero_optimization.offload_param.buffer_count", ZERO_PARAM_BUFFER_COUNT_DEFAULT, NO_FILL);
    require_positive("zero_optimization.offload_param.buffer_count", z->param_buffer_count);
    z->param_buffer_size =
        read_num(root, "zero_optimization.offload_param.buffer_size", ZERO_PARAM_BUFFER_SIZE_DEFAULT, NO_FILL);
    if (!(z->param_buffer_size >= 1))
        fail_input("config: 'zero_optimization.offload_param.buffer_size' must be at least 1 (elements), got %g",
                   z->param_buffer_size);
    if (z->offload_param && z->stage != 3)
        fail_input("config: 'zero_optimization.offload_param' needs zero_optimization.stage 3 (as in DeepSpeed): "
                   "only stage 3 shards the parameters; raise the stage or set offload_param.device to \"none\"");
}

void read_zero(struct config *cfg, json_t *root)
{
    struct zero_config *z = &cfg->zero;
    z->stage = read_int(root, "zero_optimization.stage", 0, FILL);
    if (z->stage < 0 || z->stage > 3)
        fail_input("config: 'zero_optimization.stage' must be 0, 1, 2 or 3, got %d", z->stage);

    read_offload(z, root);
    double ratio = read_num(root, "zero_optimization.offload_optimizer.ratio", 1.0, NO_FILL);
    if (ratio != 1.0)
        fail_input("config: 'zero_optimization.offload_optimizer.ratio' is %g: partial optimizer offload is not "
                   "supported in shardlm; remove it or set it to 1",
                   ratio);

    z->reduce_bucket_size = read_num(root, "zero_optimization.reduce_bucket_size", ZERO_REDUCE_BUCKET_SIZE_DEFAULT,
                                     NO_FILL);
    require_non_negative_num("zero_optimization.reduce_bucket_size", z->reduce_bucket_size);
    z->contiguous_gradients = read_bool(root, "zero_optimization.contiguous_gradients", true, NO_FILL);
    z->overlap_comm = read_bool(root, "zero_optimization.overlap_comm", z->stage == 3, FILL);

    static const struct {
        const char *path;
        long long def;
    } sizes[] = {
        {"zero_optimization.stage3_prefetch_bucket_size", ZERO_PREFETCH_BUCKET_SIZE_DEFAULT},
        {"zero_optimization.stage3_max_live_parameters", ZERO_MAX_LIVE_PARAMETERS_DEFAULT},
        {"zero_optimization.stage3_param_persistence_threshold", ZERO_PERSISTENCE_THRESHOLD_DEFAULT},
    };
    double *fields[] = {&z->stage3_prefetch_bucket_size, &z->stage3_max_live_parameters,
                        &z->stage3_param_persistence_threshold};
    for (int i = 0; i < 3; i++) {
        long long v = read_int64(root, sizes[i].path, sizes[i].def, FILL);
        require_non_negative(sizes[i].path, v);
        *fields[i] = (double)v;
    }
}

void read_act_ckpt(struct config *cfg, json_t *root)
{
    struct act_ckpt_config *a = &cfg->act_ckpt;
    /* DeepSpeed has no "enabled" key (the model code decides); here it is the switch. */
    if (is_given(root, "activation_checkpointing") && !is_given(root, "activation_checkpointing.enabled"))
        log_warn("activation_checkpointing has no \"enabled\" key, so activation checkpointing is off; set "
                 "activation_checkpointing.enabled=true to turn it on");
    a->enabled = read_bool(root, "activation_checkpointing.enabled", false, FILL);
    a->interval = read_int(root, "activation_checkpointing.interval", 1, FILL);
    if (a->interval < 1 || a->interval > cfg->model.n_layer)
        fail_input("config: 'activation_checkpointing.interval' must be between 1 and model.n_layer (%d), got %d",
                   cfg->model.n_layer, a->interval);
    a->cpu_checkpointing = read_bool(root, "activation_checkpointing.cpu_checkpointing", false, FILL);
}

/* micro x accum x world, or -1 when it does not fit in an int (each factor
 * does, so the product cannot overflow long long before the check). */
static long long batch_product(long long micro, long long accum, int world)
{
    long long micro_accum = micro * accum; /* < 2^62 */
    if (micro_accum > INT_MAX || micro_accum * world > INT_MAX)
        return -1;
    return micro_accum * world;
}

void config_resolve_batch(struct config *cfg, int world)
{
    if (world < 1)
        fail_internal("config_resolve_batch: world size %d", world);
    long long tbs = cfg->train_batch_size, micro = cfg->micro_batch, accum = cfg->grad_accum;
    /* DeepSpeed's _set_batch_related_parameters, except that a division must be
     * exact (DeepSpeed floors, then its assertion fails with a vaguer message). */
    if (tbs && micro && accum) {
        long long product = batch_product(micro, accum, world);
        if (tbs != product)
            fail_input("config: train_batch_size (%lld) must equal train_micro_batch_size_per_gpu (%lld) x "
                       "gradient_accumulation_steps (%lld) x world size (%d) = %lld; fix one of them, or drop "
                       "train_batch_size to have it derived",
                       tbs, micro, accum, world, product);
    } else if (tbs && micro) {
        if (tbs % (micro * world) != 0)
            fail_input("config: train_batch_size (%lld) is not a multiple of train_micro_batch_size_per_gpu (%lld) x "
                       "world size (%d), so gradient_accumulation_steps cannot be derived; adjust one of them",
                       tbs, micro, world);
        accum = tbs / (micro * world);
    } else if (tbs && accum) {
        if (tbs % (accum * world) != 0)
            fail_input("config: train_batch_size (%lld) is not a multiple of gradient_accumulation_steps (%lld) x "
                       "world size (%d), so train_micro_batch_size_per_gpu cannot be derived; adjust one of them",
                       tbs, accum, world);
        micro = tbs / (accum * world);
    } else if (micro && accum) {
        tbs = batch_product(micro, accum, world);
    } else if (tbs) {
        if (tbs % world != 0)
            fail_input("config: train_batch_size (%lld) is not a multiple of the world size (%d), so "
                       "train_micro_batch_size_per_gpu cannot be derived; adjust it or give "
                       "train_micro_batch_size_per_gpu",
                       tbs, world);
        accum = 1;
        micro = tbs / world;
    } else if (micro) {
        accum = 1;
        tbs = batch_product(micro, 1, world);
    } else {
        fail_input("config: train_batch_size or train_micro_batch_size_per_gpu must be given (DeepSpeed requires one "
                   "of them; gradient_accumulation_steps alone is not enough)");
    }
    if (tbs < 0)
        fail_input("config: train_batch_size (train_micro_batch_size_per_gpu %lld x gradient_accumulation_steps "
                   "%lld x world size %d) is too large",
                   micro, accum, world);
    cfg->train_batch_size = (int)tbs;
    cfg->micro_batch = (int)micro;
    cfg->grad_accum = (int)accum;
    check_batch_sizes(cfg);
    json_t *root = cfg->json;
    if (root) {
        json_object_set_new(root, "train_batch_size", json_integer(tbs));
        json_object_set_new(root, "train_micro_batch_size_per_gpu", json_integer(micro));
        json_object_set_new(root, "gradient_accumulation_steps", json_integer(accum));
    }
}
