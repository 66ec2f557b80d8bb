/*
 * config — reading, merging, checking and resolving the run's JSON config.
 *
 * Three passes over one jansson document:
 *   1. build it: the main file, the --deepspeed file merged in (a key given in
 *      both with different values is an error), then the --set overrides;
 *   2. check_keys(): every key against the schema below (unknown keys, JSON
 *      types, "auto", keys accepted without effect -> one warning each);
 *   3. read_*(): typed values with DeepSpeed's defaults into struct config, and
 *      range checks. Defaults that are read are written back into the
 *      document, so cfg->json (and config_dump) is the resolved config.
 *
 * Defaults follow DeepSpeed v0.19.5 (deepspeed/runtime/constants.py,
 * precision_config.py, zero/config.py, zero/offload_config.py,
 * ops/adam/fused_adam.py, lr_schedules.py); where shardlm departs from them the
 * constant says why.
 */
#include "config.h"
#include "io/hf.h"
#include "model/model.h"
#include "data/samples.h"

#include "core/util.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

/* ---- defaults ---------------------------------------------------------- */

/* GPT-2 124M (Radford et al. 2019; HF "gpt2"). */
#define MODEL_N_LAYER_DEFAULT 12
#define MODEL_N_HEAD_DEFAULT 12
#define MODEL_N_EMBD_DEFAULT 768
#define MODEL_N_POSITIONS_DEFAULT 1024
#define MODEL_VOCAB_SIZE_DEFAULT 50257
#define MODEL_INIT_STD_DEFAULT 0.02 /* GPT-2's initializer_range */
#define MODEL_INIT_SEED_DEFAULT 1337
/* Published shapes. GPT-2: Radford et al. 2019 (HF gpt2, gpt2-medium, -large,
 * -xl; the 124M..1.5B names count the tied head once). Llama 2: Touvron et al.
 * 2023, HF meta-llama/Llama-2-*-hf config.json (70B: grouped-query attention
 * with 8 KV heads); parameter totals: the Hugging Face checkpoints' exact counts
 * (6.74 B, 13.0 B, 68.98 B as published). */
const struct model_preset config_presets[] = {
    {"gpt2-124m", "gpt2", 12, 12, 12, 768, 3072, 1024, 50257, 124439808.0},
    {"gpt2-350m", "gpt2", 24, 16, 16, 1024, 4096, 1024, 50257, 354823168.0},
    {"gpt2-774m", "gpt2", 36, 20, 20, 1280, 5120, 1024, 50257, 774030080.0},
    {"gpt2-1.5b", "gpt2", 48, 25, 25, 1600, 6400, 1024, 50257, 1557611200.0},
    {"llama2-7b", "llama", 32, 32, 32, 4096, 11008, 4096, 32000, 6738415616.0},
    {"llama2-13b", "llama", 40, 40, 40, 5120, 13824, 4096, 32000, 13015864320.0},
    {"llama2-70b", "llama", 80, 64, 8, 8192, 28672, 4096, 32000, 68976648192.0},
    {"llama3-8b", "llama", 32, 32, 8, 4096, 14336, 8192, 128256, 8030261248.0},
};
const int config_n_presets = (int)(sizeof config_presets / sizeof config_presets[0]);

const struct model_preset *config_find_preset(const char *name)
{
    for (int i = 0; i < config_n_presets; i++)
        if (strcmp(config_presets[i].name, name) == 0)
            return &config_presets[i];
    return NULL;
}

const char *config_preset_names(void)
{
    static char names[256];
    size_t n = 0;
    names[0] = '\0';
    for (int i = 0; i < config_n_presets && n < sizeof names; i++)
        n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", i ? ", " : "", config_presets[i].name);
    return names;
}

/* Vocabulary padded so the logits matmul has tensor-core friendly shapes (llm.c). */
#define MODEL_VOCAB_ALIGN 128

#define TRAIN_STEPS_DEFAULT 100
#define TRAIN_SEED_DEFAULT 1337
#define TRAIN_EVAL_BATCHES_DEFAULT 4
#define CHECKPOINT_KEEP_DEFAULT 2

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
/* zero/offload_config.py: pin_memory defaults to true since v0.19.5. */
#define ZERO_OFFLOAD_PIN_MEMORY_DEFAULT true

/* lr_schedules.py constructor defaults. WarmupLR's warmup_max_lr defaults to
 * the optimizer's lr since v0.17.2 (PR #7360); WarmupDecayLR's stays 0.001. */
#define SCHED_WARMUP_MIN_LR_DEFAULT 0.0
#define SCHED_WARMUP_DECAY_MAX_LR_DEFAULT 0.001
#define SCHED_WARMUP_NUM_STEPS_DEFAULT 1000
#define SCHED_WARMUP_MIN_RATIO_DEFAULT 0.0
#define SCHED_COS_MIN_RATIO_DEFAULT 0.0001

/* Longest key path handled ("zero_optimization.offload_optimizer.pin_memory"
 * is 45 characters). */
#define KEY_PATH_CAP 512

/* PEFT's LoraConfig defaults (peft/tuners/lora/config.py), and its default
 * target_modules per architecture (peft/utils/constants.py,
 * TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING). */
#define LORA_R_DEFAULT 8
#define LORA_ALPHA_DEFAULT 8.0
#define LORA_DROPOUT_DEFAULT 0.0
static const char *const lora_default_targets_llama[] = {"q_proj", "v_proj", NULL};
static const char *const lora_default_targets_gpt2[] = {"c_attn", NULL};

/* ---- schema ------------------------------------------------------------ */

enum key_kind { K_INT, K_NUM, K_BOOL, K_STR, K_OBJ, K_ARRAY, K_ANY };

enum key_flags {
    F_NO_EFFECT = 1u << 0, /* accepted, warned about once, changes nothing */
    F_NULLABLE = 1u << 1,  /* null means "not given" (as DeepSpeed's None) */
    F_REJECT = 1u << 2,    /* a DeepSpeed key shardlm refuses; hint says why */
};

struct key_spec {
    const char *name;
    enum key_kind kind;
    unsigned flags;
    const struct key_spec *children; /* K_OBJ: its keys, ended by {0} */
    const char *hint;                /* F_NO_EFFECT: why; F_REJECT: the error */
};

static const struct key_spec rope_scaling_keys[] = {
    {"type", K_STR, 0, NULL, NULL},
    {"rope_type", K_STR, 0, NULL, NULL},
    {"factor", K_NUM, 0, NULL, NULL},
    {"low_freq_factor", K_NUM, 0, NULL, NULL},
    {"high_freq_factor", K_NUM, 0, NULL, NULL},
    {"original_max_position_embeddings", K_INT, 0, NULL, NULL},
    {0},
};

static const struct key_spec model_keys[] = {
    {"from_pretrained", K_STR, F_NULLABLE, NULL, NULL},
    {"preset", K_STR, 0, NULL, NULL},
    {"type", K_STR, 0, NULL, NULL},
    {"n_layer", K_INT, 0, NULL, NULL},
    {"n_head", K_INT, 0, NULL, NULL},
    {"n_kv_head", K_INT, 0, NULL, NULL},
    {"ffn_dim", K_INT, 0, NULL, NULL},
    {"n_embd", K_INT, 0, NULL, NULL},
    {"n_positions", K_INT, 0, NULL, NULL},
    {"vocab_size", K_INT, 0, NULL, NULL},
    {"init_std", K_NUM, 0, NULL, NULL},
    {"init_seed", K_INT, 0, NULL, NULL},
    {"rms_norm_eps", K_NUM, 0, NULL, NULL},
    {"rope_theta", K_NUM, 0, NULL, NULL},
    {"rope_scaling", K_OBJ, F_NULLABLE, rope_scaling_keys, NULL},
    {"tie_word_embeddings", K_BOOL, 0, NULL, NULL},
    {0},
};

static const struct key_spec data_keys[] = {
    {"train", K_STR, F_NULLABLE, NULL, NULL},
    {"val", K_STR, F_NULLABLE, NULL, NULL},
    {"seq_len", K_INT, 0, NULL, NULL},
    {"max_seq_length", K_INT, 0, NULL, NULL},
    {"shuffle", K_BOOL, 0, NULL, NULL},
    {"pad_to_multiple_of", K_INT, 0, NULL, NULL},
    {"group_by_length", K_BOOL, 0, NULL, NULL},
    {"truncation", K_STR, 0, NULL, NULL},
    {"packing", K_BOOL, 0, NULL, NULL},
    {"allow_tokenizer_mismatch", K_BOOL, 0, NULL, NULL},
    {0},
};

static const struct key_spec train_keys[] = {
    {"steps", K_INT, 0, NULL, NULL},
    {"seed", K_INT, 0, NULL, NULL},
    {"eval_every", K_INT, 0, NULL, NULL},
    {"eval_batches", K_INT, 0, NULL, NULL},
    {"sample_tokens", K_INT, 0, NULL, NULL},
    {"sample_temperature", K_NUM, 0, NULL, NULL},
    {"metrics", K_STR, F_NULLABLE, NULL, NULL},
    {"threads", K_INT, 0, NULL, NULL},
    {0},
};

static const struct key_spec checkpoint_keys[] = {
    {"dir", K_STR, F_NULLABLE, NULL, NULL},
    {"every", K_INT, 0, NULL, NULL},
    {"keep", K_INT, 0, NULL, NULL},
    {"on_error", K_STR, 0, NULL, NULL},
    {"export_hf", K_BOOL, 0, NULL, NULL},
    {0},
};

static const struct key_spec adam_param_keys[] = {
    {"lr", K_NUM, 0, NULL, NULL},
    {"betas", K_ARRAY, 0, NULL, NULL},
    {"eps", K_NUM, 0, NULL, NULL},
    {"weight_decay", K_NUM, 0, NULL, NULL},
    {"adam_w_mode", K_BOOL, 0, NULL, NULL},
    {"bias_correction", K_BOOL, 0, NULL, NULL},
    {"amsgrad", K_BOOL, 0, NULL, NULL},
    {"torch_adam", K_BOOL, F_NO_EFFECT, NULL, " (the AdamW update is shardlm's own, on the host)"},
    {"max_grad_norm", K_ANY, F_REJECT, NULL,
     "is not an optimizer parameter (DeepSpeed rejects it too); use the top-level \"gradient_clipping\""},
    {0},
};

static const struct key_spec optimizer_keys[] = {
    {"type", K_STR, 0, NULL, NULL},
    {"params", K_OBJ, 0, adam_param_keys, NULL},
    {0},
};

/* The union of the parameters of the three schedules; read_scheduler() then
 * rejects the ones the chosen schedule does not take, as DeepSpeed's
 * constructors would (TypeError). */
static const struct key_spec scheduler_param_keys[] = {
    {"warmup_min_lr", K_NUM, 0, NULL, NULL},
    {"warmup_max_lr", K_NUM, 0, NULL, NULL},
    {"warmup_num_steps", K_INT, 0, NULL, NULL},
    {"warmup_type", K_STR, 0, NULL, NULL},
    {"total_num_steps", K_INT, 0, NULL, NULL},
    {"warmup_min_ratio", K_NUM, 0, NULL, NULL},
    {"cos_min_ratio", K_NUM, 0, NULL, NULL},
    {"last_batch_iteration", K_INT, 0, NULL, NULL},
    {0},
};

static const struct key_spec scheduler_keys[] = {
    {"type", K_STR, 0, NULL, NULL},
    {"params", K_OBJ, 0, scheduler_param_keys, NULL},
    {0},
};

static const struct key_spec fp16_keys[] = {
    {"enabled", K_BOOL, 0, NULL, NULL},
    {"auto_cast", K_BOOL, F_NO_EFFECT, NULL, " (activations are always in the parameter dtype)"},
    {"loss_scale", K_NUM, 0, NULL, NULL},
    {"initial_scale_power", K_INT, 0, NULL, NULL},
    {"loss_scale_window", K_INT, 0, NULL, NULL},
    {"hysteresis", K_INT, 0, NULL, NULL},
    {"consecutive_hysteresis", K_BOOL, 0, NULL, NULL},
    {"min_loss_scale", K_NUM, 0, NULL, NULL},
    {"fp16_master_weights_and_grads", K_BOOL, 0, NULL, NULL},
    {0},
};

static const struct key_spec bf16_keys[] = {
    {"enabled", K_BOOL, 0, NULL, NULL},
    {"immediate_grad_update", K_BOOL, F_NO_EFFECT, NULL, NULL},
    {"check_grad_overflow", K_BOOL, F_NO_EFFECT, NULL, NULL},
    {"bf16_master_weights_and_grads", K_BOOL, 0, NULL, NULL},
    {"bf16_optimizer_states", K_BOOL, 0, NULL, NULL},
    {0},
};

static const struct key_spec offload_optimizer_keys[] = {
    {"device", K_STR, 0, NULL, NULL},
    {"pin_memory", K_BOOL, 0, NULL, NULL},
    {"ratio", K_NUM, 0, NULL, NULL},
    {"nvme_path", K_ANY, F_NO_EFFECT, NULL, NULL},
    {"buffer_count", K_INT, F_NO_EFFECT, NULL, NULL},
    {"pipeline_read", K_BOOL, F_NO_EFFECT, NULL, NULL},
    {"pipeline_write", K_BOOL, F_NO_EFFECT, NULL, NULL},
    {"fast_init", K_BOOL, F_NO_EFFECT, NULL, NULL},
    {"super_offload", K_BOOL, F_NO_EFFECT, NULL, NULL},
    {"cpuadam_cores_perc", K_NUM, F_NO_EFFECT, NULL, NULL},
    {0},
};

/* offload_param (stage 3): the parameter shards live in host memory and each
 * unit is gathered into device memory before use (ZeRO-Infinity's CPU path). */
static const struct key_spec offload_param_keys[] = {
    {"device", K_STR, 0, NULL, NULL},
    {"pin_memory", K_BOOL, 0, NULL, NULL},
    {"nvme_path", K_ANY, F_NO_EFFECT, NULL, NULL},
    {"buffer_count", K_INT, F_NO_EFFECT, NULL, " (units are gathered whole)"},
    {"buffer_size", K_INT, F_NO_EFFECT, NULL, " (units are gathered whole)"},
    {"max_in_cpu", K_INT, F_NO_EFFECT, NULL, NULL},
    {0},
};

#define CPU_OFFLOAD_HINT "is DeepSpeed's deprecated spelling, not accepted here; use \"offload_optimizer\": {\"device\": \"cpu\"}"
#define WHOLE_UNITS " (the engine reduces whole units)"

static const struct key_spec zero_keys[] = {
    {"stage", K_INT, 0, NULL, NULL},
    {"offload_optimizer", K_OBJ, F_NULLABLE, offload_optimizer_keys, NULL},
    {"offload_param", K_OBJ, F_NULLABLE, offload_param_keys, NULL},
    {"reduce_bucket_size", K_INT, F_NO_EFFECT, NULL, WHOLE_UNITS},
    {"contiguous_gradients", K_BOOL, F_NO_EFFECT, NULL, WHOLE_UNITS},
    {"overlap_comm", K_BOOL, F_NULLABLE, NULL, NULL},
    {"stage3_prefetch_bucket_size", K_INT, 0, NULL, NULL},
    {"stage3_max_live_parameters", K_INT, 0, NULL, NULL},
    {"stage3_param_persistence_threshold", K_INT, 0, NULL, NULL},
    {"allgather_bucket_size", K_INT, F_NO_EFFECT, NULL, " (the engine gathers whole units)"},
    {"reduce_scatter", K_BOOL, F_NO_EFFECT, NULL, NULL},
    {"allgather_partitions", K_BOOL, F_NO_EFFECT, NULL, NULL},
    {"stage3_max_reuse_distance", K_INT, F_NO_EFFECT, NULL, NULL},
    {"stage3_gather_16bit_weights_on_model_save", K_BOOL, F_NO_EFFECT, NULL, NULL},
    {"stage3_gather_fp16_weights_on_model_save", K_BOOL, F_NO_EFFECT, NULL, NULL},
    {"stage3_model_persistence_threshold", K_INT, F_NO_EFFECT, NULL, NULL},
    {"sub_group_size", K_INT, F_NO_EFFECT, NULL, NULL},
    {"round_robin_gradients", K_BOOL, F_NO_EFFECT, NULL, NULL},
    {"load_from_fp32_weights", K_BOOL, F_NO_EFFECT, NULL, NULL},
    {"elastic_checkpoint", K_BOOL, F_NO_EFFECT, NULL, NULL},
    {"ignore_unused_parameters", K_BOOL, F_NO_EFFECT, NULL, NULL},
    {"use_multi_rank_bucket_allreduce", K_BOOL, F_NO_EFFECT, NULL, NULL},
    {"memory_efficient_linear", K_BOOL, F_NO_EFFECT, NULL, NULL},
    {"cpu_offload", K_ANY, F_REJECT, NULL, CPU_OFFLOAD_HINT},
    {"cpu_offload_param", K_ANY, F_REJECT, NULL,
     "is DeepSpeed's deprecated spelling, not accepted here; use \"offload_param\": {\"device\": \"cpu\"}"},
    {"cpu_offload_use_pin_memory", K_ANY, F_REJECT, NULL,
     "is DeepSpeed's deprecated spelling, not accepted here; use \"offload_optimizer\": {\"pin_memory\": true}"},
    {0},
};

static const struct key_spec act_ckpt_keys[] = {
    {"enabled", K_BOOL, 0, NULL, NULL},
    {"interval", K_INT, 0, NULL, NULL},
    {"cpu_checkpointing", K_BOOL, 0, NULL, NULL},
    {"partition_activations", K_BOOL, F_NO_EFFECT, NULL, NULL},
    {"contiguous_memory_optimization", K_BOOL, F_NO_EFFECT, NULL, NULL},
    {"number_checkpoints", K_INT, F_NO_EFFECT | F_NULLABLE, NULL, NULL},
    {"synchronize_checkpoint_boundary", K_BOOL, F_NO_EFFECT, NULL, NULL},
    {"profile", K_BOOL, F_NO_EFFECT, NULL, NULL},
    {0},
};

static const struct key_spec lora_keys[] = {
    {"r", K_INT, 0, NULL, NULL},
    {"alpha", K_NUM, 0, NULL, NULL},
    {"lora_alpha", K_NUM, 0, NULL, NULL},     /* PEFT's name of alpha */
    {"dropout", K_NUM, 0, NULL, NULL},
    {"lora_dropout", K_NUM, 0, NULL, NULL},   /* PEFT's name of dropout */
    {"target_modules", K_ANY, 0, NULL, NULL}, /* a list of module names, or "all-linear" (read_lora) */
    {"modules_to_save", K_ARRAY, F_NULLABLE, NULL, NULL},
    {"init", K_ANY, 0, NULL, NULL},            /* "default", "gaussian", or PEFT's init_lora_weights true / false */
    {0},
};

static const struct key_spec top_keys[] = {
    {"train_batch_size", K_INT, F_NULLABLE, NULL, NULL},
    {"train_micro_batch_size_per_gpu", K_INT, F_NULLABLE, NULL, NULL},
    {"gradient_accumulation_steps", K_INT, F_NULLABLE, NULL, NULL},
    {"gradient_clipping", K_NUM, 0, NULL, NULL},
    {"steps_per_print", K_INT, 0, NULL, NULL},
    {"wall_clock_breakdown", K_BOOL, 0, NULL, NULL},
    {"optimizer", K_OBJ, 0, optimizer_keys, NULL},
    {"scheduler", K_OBJ, F_NULLABLE, scheduler_keys, NULL},
    {"fp16", K_OBJ, 0, fp16_keys, NULL},
    {"bf16", K_OBJ, 0, bf16_keys, NULL},
    {"bfloat16", K_OBJ, 0, bf16_keys, NULL}, /* DeepSpeed's old name for bf16 */
    {"zero_optimization", K_OBJ, 0, zero_keys, NULL},
    {"activation_checkpointing", K_OBJ, 0, act_ckpt_keys, NULL},
    {"model", K_OBJ, 0, model_keys, NULL},
    {"data", K_OBJ, 0, data_keys, NULL},
    {"train", K_OBJ, 0, train_keys, NULL},
    {"checkpoint", K_OBJ, 0, checkpoint_keys, NULL},
    {"lora", K_OBJ, F_NULLABLE, lora_keys, NULL},
    {"zero_allow_untested_optimizer", K_ANY, F_NO_EFFECT, NULL, NULL},
    {"zero_force_ds_cpu_optimizer", K_ANY, F_NO_EFFECT, NULL, NULL},
    {"prescale_gradients", K_ANY, F_NO_EFFECT, NULL, NULL},
    {"gradient_predivide_factor", K_ANY, F_NO_EFFECT, NULL, NULL},
    {"communication_data_type", K_ANY, F_NO_EFFECT, NULL, NULL},
    {"dump_state", K_ANY, F_NO_EFFECT, NULL, NULL},
    {"flops_profiler", K_ANY, F_NO_EFFECT, NULL, NULL},
    {"tensorboard", K_ANY, F_NO_EFFECT, NULL, NULL},
    {"wandb", K_ANY, F_NO_EFFECT, NULL, NULL},
    {"csv_monitor", K_ANY, F_NO_EFFECT, NULL, NULL},
    {"comms_logger", K_ANY, F_NO_EFFECT, NULL, NULL},
    {"memory_breakdown", K_ANY, F_NO_EFFECT, NULL, NULL},
    {0},
};

/* ---- small JSON helpers ------------------------------------------------ */

static void join_path(char *out, size_t cap, const char *prefix, const char *key)
{
    if (prefix && *prefix)
        snprintf(out, cap, "%s.%s", prefix, key);
    else
        snprintf(out, cap, "%s", key);
}

static const char *json_kind_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "number";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* Compact text of a value for messages, shortened to fit `cap`. */
static const char *json_brief(const json_t *v, char *out, size_t cap)
{
    char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(15));
    if (!text)
        fail_internal("config: cannot format a JSON value");
    size_t len = strlen(text);
    if (len < cap)
        memcpy(out, text, len + 1);
    else
        snprintf(out, cap, "%.*s...", (int)(cap > 4 ? cap - 4 : 0), text);
    free(text);
    return out;
}

/* The value at a dotted path; NULL when absent, null, or below a non-object. */
static json_t *doc_get(json_t *root, const char *path)
{
    char buf[KEY_PATH_CAP];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *node = root;
    for (char *comp = buf;;) {
        char *dot = strchr(comp, '.');
        if (dot)
            *dot = '\0';
        if (!json_is_object(node))
            return NULL;
        node = json_object_get(node, comp);
        if (!node)
            return NULL;
        if (!dot)
            break;
        comp = dot + 1;
    }
    return json_is_null(node) ? NULL : node;
}

/* Sets the value at a dotted path (the reference to `value` is stolen),
 * creating missing or null objects on the way. When something on the way is
 * neither, returns false and writes its path into `blocker`. */
static bool doc_put(json_t *root, const char *path, json_t *value, char *blocker, size_t blocker_cap)
{
    char buf[KEY_PATH_CAP];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *node = root;
    char *comp = buf;
    for (char *dot; (dot = strchr(comp, '.')) != NULL; comp = dot + 1) {
        *dot = '\0';
        json_t *next = json_object_get(node, comp);
        if (!next || json_is_null(next)) {
            next = json_object();
            json_object_set_new(node, comp, next);
        } else if (!json_is_object(next)) {
            snprintf(blocker, blocker_cap, "%.*s", (int)(dot - buf), path);
            json_decref(value);
            return false;
        }
        node = next;
    }
    json_object_set_new(node, comp, value);
    return true;
}

/* Writes a default back so the document shows the resolved value. */
static void put_default(json_t *root, const char *path, json_t *value)
{
    char blocker[KEY_PATH_CAP];
    if (!value || !doc_put(root, path, value, blocker, sizeof blocker))
        fail_internal("config: cannot record the default of '%s'", path);
}

/* ---- building the document --------------------------------------------- */

static json_t *read_json_file(const char *path, const char *what)
{
    struct stat st;
    if (stat(path, &st) != 0)
        fail_input("config: cannot read %s '%s': %s; give the path of a JSON file", what, path, strerror(errno));
    if (S_ISDIR(st.st_mode))
        fail_input("config: %s '%s' is a directory; give the path of a JSON file", what, path);
    json_error_t err;
    /* Duplicate keys are an error, as in DeepSpeed (dict_raise_error_on_duplicate_keys). */
    json_t *doc = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    if (!doc) {
        if (err.line < 0)
            fail_input("config: cannot read %s '%s': %s", what, path, err.text);
        fail_input("config: %s:%d:%d: %s", path, err.line, err.column, err.text);
    }
    if (!json_is_object(doc))
        fail_input("config: %s: the top level must be a JSON object ({...}), got %s", path, json_kind_name(doc));
    return doc;
}

static bool json_same_value(const json_t *a, const json_t *b)
{
    /* 5e8 in one file and 500000000 in the other are the same setting. */
    if (json_is_number(a) && json_is_number(b))
        return json_number_value(a) == json_number_value(b);
    return json_equal(a, b);
}

/* Deep-merges src into dst; a key present in both with different non-object
 * values is an error naming both files. */
static void merge_into(json_t *dst, json_t *src, const char *prefix, const char *dst_name, const char *src_name)
{
    const char *key;
    json_t *src_value;
    json_object_foreach(src, key, src_value) {
        char path[KEY_PATH_CAP];
        join_path(path, sizeof path, prefix, key);
        json_t *dst_value = json_object_get(dst, key);
        if (!dst_value) {
            json_object_set(dst, key, src_value);
        } else if (json_is_object(dst_value) && json_is_object(src_value)) {
            merge_into(dst_value, src_value, path, dst_name, src_name);
        } else if (!json_same_value(dst_value, src_value)) {
            char a[256], b[256];
            fail_input("config: '%s' is given in both %s (%s) and %s (%s) with different values; keep it in one file",
                       path, dst_name, json_brief(dst_value, a, sizeof a), src_name, json_brief(src_value, b, sizeof b));
        }
    }
}

/* Applies one "--set a.b.c=VALUE". VALUE is JSON when it parses as JSON
 * (numbers, true/false, null, "quoted", [..], {..}), else a plain string. */
static void apply_set(json_t *root, const char *assignment)
{
    const char *eq = strchr(assignment, '=');
    if (!eq)
        fail_input("config: --set '%s' has no '='; write --set key.path=value, e.g. --set optimizer.params.lr=3e-4",
                   assignment);
    size_t path_len = (size_t)(eq - assignment);
    if (path_len == 0)
        fail_input("config: --set '%s' has an empty key path; write --set key.path=value", assignment);
    if (path_len >= KEY_PATH_CAP)
        fail_input("config: --set '%.60s...': the key path is too long", assignment);
    char path[KEY_PATH_CAP];
    memcpy(path, assignment, path_len);
    path[path_len] = '\0';
    if (path[0] == '.' || path[path_len - 1] == '.' || strstr(path, ".."))
        fail_input("config: --set '%s': the key path '%s' has an empty component; write names joined by '.'",
                   assignment, path);

    const char *text = eq + 1;
    json_error_t err;
    json_t *value = json_loads(text, JSON_DECODE_ANY, &err);
    if (!value)
        value = json_string(text);
    if (!value)
        fail_input("config: --set '%s': the value is not valid UTF-8", assignment);
    char blocker[KEY_PATH_CAP];
    if (!doc_put(root, path, value, blocker, sizeof blocker)) {
        json_t *b = doc_get(root, blocker);
        fail_input("config: --set '%s': '%s' is %s, not an object, so it has no key '%s'", assignment, blocker,
                   b ? json_kind_name(b) : "not an object", path + strlen(blocker) + 1);
    }
}

/* ---- checking keys and types ------------------------------------------- */

/* Edit distance, case-insensitive, for "did you mean" (short names only). */
static int edit_distance(const char *a, const char *b)
{
    enum { MAX_LEN = 64 };
    size_t la = strlen(a), lb = strlen(b);
    if (la >= MAX_LEN || lb >= MAX_LEN)
        return INT_MAX;
    int row[MAX_LEN + 1];
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int cost = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
            int best = diag + cost;
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

static const char *closest_key(const char *key, const struct key_spec *specs)
{
    const char *best = NULL;
    int best_distance = INT_MAX;
    for (const struct key_spec *s = specs; s->name; s++) {
        if (s->flags & F_REJECT)
            continue;
        int d = edit_distance(key, s->name);
        if (d < best_distance) {
            best_distance = d;
            best = s->name;
        }
    }
    /* Close enough to be a typo: at most 2 edits, and under a third of the name. */
    size_t len = strlen(key);
    if (best && best_distance <= 2 && (size_t)best_distance * 3 <= len)
        return best;
    return NULL;
}

static void fail_unknown_key(const char *prefix, const char *key, const struct key_spec *specs)
{
    char path[KEY_PATH_CAP];
    join_path(path, sizeof path, prefix, key);
    const char *guess = closest_key(key, specs);
    if (guess) {
        char suggestion[KEY_PATH_CAP];
        join_path(suggestion, sizeof suggestion, prefix, guess);
        fail_input("config: unknown key '%s' (did you mean '%s'?)", path, suggestion);
    }
    char known[1024];
    size_t used = 0;
    known[0] = '\0';
    for (const struct key_spec *s = specs; s->name && used < sizeof known; s++)
        if (!(s->flags & F_REJECT))
            used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", used ? ", " : "", s->name);
    if (prefix && *prefix)
        fail_input("config: unknown key '%s'; the keys of '%s' are: %s", path, prefix, known);
    fail_input("config: unknown key '%s'; the top-level keys are: %s", path, known);
}

static const char *kind_wanted(enum key_kind kind)
{
    switch (kind) {
    case K_INT: return "an integer";
    case K_NUM: return "a number";
    case K_BOOL: return "true or false";
    case K_STR: return "a string";
    case K_OBJ: return "an object ({...})";
    case K_ARRAY: return "an array";
    case K_ANY: return "any value";
    }
    return "?";
}

/* Largest magnitude at which every integer is exactly representable in a double. */
#define EXACT_INTEGER_LIMIT 9007199254740992.0

static void check_type(const char *path, const struct key_spec *spec, const json_t *v)
{
    if (spec->kind == K_ANY)
        return;
    if (json_is_null(v)) {
        if (spec->flags & F_NULLABLE)
            return;
        fail_input("config: '%s' must be %s, got null", path, kind_wanted(spec->kind));
    }
    if (json_is_string(v) && strcmp(json_string_value(v), "auto") == 0 && spec->kind != K_STR)
        fail_input("config: '%s' is \"auto\": \"auto\" is filled in by the Hugging Face Trainer, which shardlm does "
                   "not use; give %s",
                   path, kind_wanted(spec->kind));
    bool ok = false;
    switch (spec->kind) {
    case K_INT:
        if (json_is_integer(v)) {
            ok = true;
        } else if (json_is_real(v)) {
            /* 5e8 and 8.0 are integers written as reals (common in DeepSpeed files). */
            double d = json_real_value(v);
            if (d != floor(d) || fabs(d) > EXACT_INTEGER_LIMIT)
                fail_input("config: '%s' must be an integer, got %.15g", path, d);
            ok = true;
        }
        break;
    case K_NUM: ok = json_is_number(v); break;
    case K_BOOL: ok = json_is_boolean(v); break;
    case K_STR: ok = json_is_string(v); break;
    case K_OBJ: ok = json_is_object(v); break;
    case K_ARRAY: ok = json_is_array(v); break;
    case K_ANY: ok = true; break;
    }
    if (!ok)
        fail_input("config: '%s' must be %s, got %s", path, kind_wanted(spec->kind), json_kind_name(v));
}

/* Checks every key of `obj` against `specs`, recursively; warns once for each
 * key that is accepted without effect. */
static void check_keys(json_t *obj, const char *prefix, const struct key_spec *specs)
{
    const char *key;
    json_t *value;
    json_object_foreach(obj, key, value) {
        const struct key_spec *spec = specs;
        while (spec->name && strcmp(spec->name, key) != 0)
            spec++;
        if (!spec->name)
            fail_unknown_key(prefix, key, specs);
        char path[KEY_PATH_CAP];
        join_path(path, sizeof path, prefix, key);
        if (spec->flags & F_REJECT)
            fail_input("config: '%s' %s", path, spec->hint);
        check_type(path, spec, value);
        if (spec->flags & F_NO_EFFECT)
            log_warn("%s is accepted but has no effect in shardlm%s", path, spec->hint ? spec->hint : "");
        if (spec->kind == K_OBJ && spec->children && json_is_object(value))
            check_keys(value, path, spec->children);
    }
}

/* ---- typed reads with defaults ----------------------------------------- */

enum fill_mode { NO_FILL = 0, FILL = 1 };

static bool is_given(json_t *root, const char *path) { return doc_get(root, path) != NULL; }

static long long read_int64(json_t *root, const char *path, long long def, enum fill_mode fill)
{
    json_t *v = doc_get(root, path);
    if (!v) {
        if (fill)
            put_default(root, path, json_integer(def));
        return def;
    }
    return json_is_integer(v) ? (long long)json_integer_value(v) : (long long)json_real_value(v);
}

static int read_int(json_t *root, const char *path, int def, enum fill_mode fill)
{
    long long v = read_int64(root, path, def, fill);
    if (v < INT_MIN || v > INT_MAX)
        fail_input("config: '%s' is %lld, out of range (at most %d)", path, v, INT_MAX);
    return (int)v;
}

static double read_num(json_t *root, const char *path, double def, enum fill_mode fill)
{
    json_t *v = doc_get(root, path);
    if (!v) {
        if (fill)
            put_default(root, path, json_real(def));
        return def;
    }
    return json_number_value(v);
}

static bool read_bool(json_t *root, const char *path, bool def, enum fill_mode fill)
{
    json_t *v = doc_get(root, path);
    if (!v) {
        if (fill)
            put_default(root, path, json_boolean(def));
        return def;
    }
    return json_is_true(v);
}

/* The string at path (owned by the document), or def (NULL: not given). */
static const char *read_str(json_t *root, const char *path, const char *def, enum fill_mode fill)
{
    json_t *v = doc_get(root, path);
    if (!v) {
        if (fill && def)
            put_default(root, path, json_string(def));
        return def;
    }
    return json_string_value(v);
}

/* An optional non-empty path string, copied (NULL when not given). */
static char *read_path(json_t *root, const char *path)
{
    const char *s = read_str(root, path, NULL, NO_FILL);
    if (!s)
        return NULL;
    if (!*s)
        fail_input("config: '%s' is an empty string; give a path or remove the key", path);
    return xstrdup(s);
}

static void require_positive(const char *path, long long v)
{
    if (v <= 0)
        fail_input("config: '%s' must be positive, got %lld", path, v);
}

static void require_non_negative(const char *path, long long v)
{
    if (v < 0)
        fail_input("config: '%s' must be >= 0, got %lld", path, v);
}

static void require_non_negative_num(const char *path, double v)
{
    if (!(v >= 0))
        fail_input("config: '%s' must be >= 0, got %g", path, v);
}

static void require_ratio(const char *path, double v)
{
    if (!(v >= 0 && v <= 1))
        fail_input("config: '%s' must be between 0 and 1, got %g", path, v);
}

/* ---- size bounds ------------------------------------------------------- */

/* Every size the keys multiply into is computed here first, in saturating
 * 64-bit arithmetic, and bounded, so that the model, the planner and the
 * kernels never see a product that wraps (size_t or the kernels' int row
 * counts). The bounds are far above any model or batch that fits a node:
 * 2^40 elements (4 TiB in fp32) for one tensor or activation buffer, 2^44 for
 * the activations of all layers, 2^16 layers. */
#define CONFIG_MAX_TENSOR (1LL << 40)
#define CONFIG_MAX_ALL_LAYERS (1LL << 44)
#define CONFIG_MAX_LAYERS 65536
#define CONFIG_MAX_SAMPLE_TOKENS (1 << 20)
#define CONFIG_MAX_THREADS 4096

static long long sat_mul(long long a, long long b)
{
    long long r;
    return __builtin_mul_overflow(a, b, &r) ? LLONG_MAX : r;
}

static long long sat_add(long long a, long long b)
{
    long long r;
    return __builtin_add_overflow(a, b, &r) ? LLONG_MAX : r;
}

/* Fails when n elements of what exceed limit; keys names the keys that set it
 * and their values, as the user wrote them. */
static void check_bound(const char *what, long long n, long long limit, const char *keys)
{
    if (n <= limit)
        return;
    fail_input("config: %s would hold %s%.3g elements (%s), more than the %.3g shardlm allows; lower one of "
               "these keys",
               what, n == LLONG_MAX ? "over " : "", (double)n, keys, (double)limit);
}

static void check_model_sizes(const struct model_config *m, bool gpt2)
{
    char keys[256];
    if (m->n_layer > CONFIG_MAX_LAYERS)
        fail_input("config: 'model.n_layer' is %d, more than the %d layers shardlm allows", m->n_layer,
                   CONFIG_MAX_LAYERS);
    const long long C = m->n_embd, F = m->ffn_dim, KV = C / m->n_head * m->n_kv_head;
    snprintf(keys, sizeof keys, "model.vocab_size %d x model.n_embd %d", m->vocab_size, m->n_embd);
    check_bound("the token embedding", sat_mul(m->padded_vocab, C), CONFIG_MAX_TENSOR, keys);
    if (gpt2) {
        snprintf(keys, sizeof keys, "model.n_positions %d x model.n_embd %d", m->n_positions, m->n_embd);
        check_bound("the position embedding", sat_mul(m->n_positions, C), CONFIG_MAX_TENSOR, keys);
    }
    snprintf(keys, sizeof keys, "model.n_embd %d x (model.n_embd + 2 x key/value width %lld)", m->n_embd, KV);
    check_bound("the attention's input projection", sat_mul(C, sat_add(C, 2 * KV)), CONFIG_MAX_TENSOR, keys);
    snprintf(keys, sizeof keys, "model.n_embd %d x model.ffn_dim %d", m->n_embd, m->ffn_dim);
    check_bound("one MLP matrix", sat_mul(C, F), CONFIG_MAX_TENSOR, keys);
    /* attention (2 C^2 + 2 C KV) and MLP (2 or 3 C F) matrices of every layer */
    long long per_layer = sat_add(sat_mul(2 * C, sat_add(C, KV)), sat_mul(gpt2 ? 2 : 3, sat_mul(C, F)));
    snprintf(keys, sizeof keys, "model.n_layer %d x %.3g per layer from model.n_embd %d and model.ffn_dim %d",
             m->n_layer, (double)per_layer, m->n_embd, m->ffn_dim);
    check_bound("the layers' parameters", sat_mul(m->n_layer, per_layer), CONFIG_MAX_TENSOR, keys);
}

/* The activation sizes of one micro-batch (after the batch is resolved). */
static void check_batch_sizes(const struct config *cfg)
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

/* Hugging Face's rope_scaling (type "llama3" only; null or absent: none). */
static void read_rope_scaling(struct model_config *m, json_t *root)
{
    if (!is_given(root, "model.rope_scaling"))
        return;
    const char *type = read_str(root, "model.rope_scaling.rope_type", NULL, NO_FILL);
    if (!type)
        type = read_str(root, "model.rope_scaling.type", NULL, NO_FILL);
    if (!type || strcmp(type, "default") == 0)
        return;
    if (strcmp(type, "llama3") != 0)
        fail_input("config: 'model.rope_scaling.rope_type' is \"%s\"; supported: \"llama3\" (Llama 3.1), or null for "
                   "none",
                   type);
    struct rope_scaling *r = &m->rope_scaling;
    r->type = ROPE_SCALING_LLAMA3;
    r->factor = read_num(root, "model.rope_scaling.factor", 8.0, FILL);
    r->low_freq_factor = read_num(root, "model.rope_scaling.low_freq_factor", 1.0, FILL);
    r->high_freq_factor = read_num(root, "model.rope_scaling.high_freq_factor", 4.0, FILL);
    r->original_max_positions = read_int(root, "model.rope_scaling.original_max_position_embeddings", 8192, FILL);
    if (!(r->factor >= 1.0) || !isfinite(r->factor))
        fail_input("config: 'model.rope_scaling.factor' must be at least 1, got %g", r->factor);
    if (!(r->low_freq_factor > 0) || !(r->high_freq_factor > r->low_freq_factor) || !isfinite(r->high_freq_factor))
        fail_input("config: 'model.rope_scaling.high_freq_factor' (%g) must be larger than "
                   "'model.rope_scaling.low_freq_factor' (%g) > 0",
                   r->high_freq_factor, r->low_freq_factor);
    require_positive("model.rope_scaling.original_max_position_embeddings", r->original_max_positions);
}

/* The keys only Llama has: refused for GPT-2, read with Hugging Face's
 * meaning (and Llama 2/3's published values as defaults) for Llama. */
static void read_llama_keys(struct model_config *m, json_t *root, bool gpt2)
{
    static const char *const only_llama[] = {"model.rms_norm_eps", "model.rope_theta", "model.rope_scaling",
                                              "model.tie_word_embeddings"};
    m->norm_eps = 1e-5f;
    m->rope_theta = 10000.0;
    m->tie_embeddings = gpt2;
    if (gpt2) {
        for (size_t i = 0; i < sizeof only_llama / sizeof only_llama[0]; i++)
            if (is_given(root, only_llama[i]))
                fail_input("config: '%s' is a Llama key; GPT-2 has LayerNorm, learned positions and a tied head. "
                           "Remove it or use model.type \"llama\"",
                           only_llama[i]);
        return;
    }
    if (m->n_embd / m->n_head % 2 != 0)
        fail_input("config: 'model.n_embd' / 'model.n_head' is %d, an odd head dimension: rotary embeddings rotate "
                   "channel pairs, so Llama needs an even head dimension",
                   m->n_embd / m->n_head);
    double eps = read_num(root, "model.rms_norm_eps", 1e-5, FILL);
    if (!(eps > 0) || eps > 1.0)
        fail_input("config: 'model.rms_norm_eps' must be in (0, 1], got %g", eps);
    m->norm_eps = (float)eps;
    double theta = read_num(root, "model.rope_theta", 10000.0, FILL);
    if (!(theta > 1.0) || !isfinite(theta))
        fail_input("config: 'model.rope_theta' must be larger than 1, got %g", theta);
    m->rope_theta = theta;
    m->tie_embeddings = read_bool(root, "model.tie_word_embeddings", false, FILL);
    read_rope_scaling(m, root);
}

struct pretrained_ctx {
    json_t *root;
    const char *dir;
};

/* A model key config.json determines: given beside from_pretrained with
 * another value it is an error; else it goes into the document as if given. */
static void put_pretrained(void *ctx_, const char *key, json_t *value)
{
    struct pretrained_ctx *ctx = ctx_;
    char path[64];
    snprintf(path, sizeof path, "model.%s", key);
    json_t *given = doc_get(ctx->root, path);
    if (given) {
        bool same = json_equal(given, value) ||
                    (json_is_number(given) && json_is_number(value) &&
                     json_number_value(given) == json_number_value(value)) ||
                    (json_is_real(value) && json_is_number(given) &&
                     (float)json_number_value(given) == (float)json_number_value(value));
        if (!same) {
            char a[128], b[128];
            fail_input("config: '%s' is %s but %s/config.json gives %s; remove the key (model.from_pretrained "
                       "sets the shape)",
                       path, json_brief(given, a, sizeof a), ctx->dir, json_brief(value, b, sizeof b));
        }
        json_decref(value);
        return;
    }
    put_default(ctx->root, path, value);
}

/* model.from_pretrained: the shape keys from the directory's config.json. */
static void read_pretrained(struct model_config *m, json_t *root)
{
    const char *dir = read_str(root, "model.from_pretrained", NULL, NO_FILL);
    if (!dir)
        return;
    if (!*dir)
        fail_input("config: 'model.from_pretrained' is an empty string; give a Hugging Face model directory");
    if (is_given(root, "model.preset"))
        fail_input("config: 'model.preset' and 'model.from_pretrained' are both given; the directory's "
                   "config.json sets the shape, remove model.preset");
    if (strlen(dir) >= sizeof m->pretrained)
        fail_input("config: 'model.from_pretrained' is longer than %zu characters", sizeof m->pretrained - 1);
    snprintf(m->pretrained, sizeof m->pretrained, "%s", dir);
    struct pretrained_ctx ctx = {root, m->pretrained};
    hf_config_keys(m->pretrained, put_pretrained, &ctx, &m->sliding_window);
}

static void read_model(struct config *cfg, json_t *root)
{
    struct model_config *m = &cfg->model;
    read_pretrained(m, root);
    /* A preset supplies the defaults of the shape keys; keys given beside it win. */
    const struct model_preset gpt2_default = {NULL, "gpt2", MODEL_N_LAYER_DEFAULT, MODEL_N_HEAD_DEFAULT, 0,
                                              MODEL_N_EMBD_DEFAULT, 0, MODEL_N_POSITIONS_DEFAULT,
                                              MODEL_VOCAB_SIZE_DEFAULT, 0};
    const struct model_preset *preset = &gpt2_default;
    const char *preset_name = read_str(root, "model.preset", NULL, NO_FILL);
    if (preset_name) {
        preset = config_find_preset(preset_name);
        if (!preset)
            fail_input("config: 'model.preset' is \"%s\"; known presets: %s", preset_name, config_preset_names());
        snprintf(m->preset, sizeof m->preset, "%s", preset_name);
    }
    const char *type = read_str(root, "model.type", preset->type, FILL);
    if (strcmp(type, "gpt2") != 0 && strcmp(type, "llama") != 0)
        fail_input("config: 'model.type' is \"%s\"; known model types: gpt2, llama", type);
    snprintf(m->type, sizeof m->type, "%s", type);

    m->n_layer = read_int(root, "model.n_layer", preset->n_layer, FILL);
    m->n_head = read_int(root, "model.n_head", preset->n_head, FILL);
    m->n_embd = read_int(root, "model.n_embd", preset->n_embd, FILL);
    m->n_positions = read_int(root, "model.n_positions", preset->n_positions, FILL);
    m->vocab_size = read_int(root, "model.vocab_size", preset->vocab_size, FILL);
    require_positive("model.n_layer", m->n_layer);
    require_positive("model.n_head", m->n_head);
    require_positive("model.n_embd", m->n_embd);
    require_positive("model.n_positions", m->n_positions);
    require_positive("model.vocab_size", m->vocab_size);
    if (m->n_embd % m->n_head != 0)
        fail_input("config: 'model.n_embd' (%d) must be divisible by 'model.n_head' (%d): each head gets "
                   "n_embd / n_head channels",
                   m->n_embd, m->n_head);
    bool gpt2 = strcmp(type, "gpt2") == 0;
    bool same_type = strcmp(type, preset->type) == 0;
    m->n_kv_head = read_int(root, "model.n_kv_head", same_type && preset->n_kv_head ? preset->n_kv_head : m->n_head,
                            NO_FILL);
    long long ffn_default = same_type && preset->ffn_dim ? preset->ffn_dim : 4LL * m->n_embd;
    if (!is_given(root, "model.ffn_dim") && ffn_default > INT_MAX)
        fail_input("config: 'model.n_embd' is %d; the MLP it implies (4 n_embd = %lld) is out of range (at most %d)",
                   m->n_embd, ffn_default, INT_MAX);
    m->ffn_dim = read_int(root, "model.ffn_dim", (int)ffn_default, NO_FILL);
    require_positive("model.n_kv_head", m->n_kv_head);
    require_positive("model.ffn_dim", m->ffn_dim);
    if (m->n_head % m->n_kv_head != 0)
        fail_input("config: 'model.n_head' (%d) must be a multiple of 'model.n_kv_head' (%d): each key/value head "
                   "serves n_head / n_kv_head query heads",
                   m->n_head, m->n_kv_head);
    if (gpt2 && (m->n_kv_head != m->n_head || m->ffn_dim != 4LL * m->n_embd))
        fail_input("config: GPT-2 has n_kv_head = n_head (%d) and ffn_dim = 4 n_embd (%lld), got %d and %d; remove "
                   "model.n_kv_head and model.ffn_dim or use model.type \"llama\"",
                   m->n_head, 4LL * m->n_embd, m->n_kv_head, m->ffn_dim);
    if (m->vocab_size > INT_MAX - MODEL_VOCAB_ALIGN)
        fail_input("config: 'model.vocab_size' (%d) is too large", m->vocab_size);
    m->padded_vocab = (int)round_up((size_t)m->vocab_size, MODEL_VOCAB_ALIGN);
    check_model_sizes(m, gpt2);

    read_llama_keys(m, root, gpt2);

    double std = read_num(root, "model.init_std", MODEL_INIT_STD_DEFAULT, FILL);
    if (!(std > 0))
        fail_input("config: 'model.init_std' must be positive, got %g", std);
    m->init_std = (float)std;
    long long seed = read_int64(root, "model.init_seed", MODEL_INIT_SEED_DEFAULT, FILL);
    require_non_negative("model.init_seed", seed);
    m->init_seed = (uint64_t)seed;
}

static void read_data(struct config *cfg, json_t *root)
{
    struct data_config *d = &cfg->data;
    d->train_path = read_path(root, "data.train");
    d->val_path = read_path(root, "data.val");
    /* max_seq_length (Hugging Face's name, for sample files) is seq_len */
    const int max_seq = read_int(root, "data.max_seq_length", 0, NO_FILL);
    d->seq_len = read_int(root, "data.seq_len", max_seq > 0 ? max_seq : cfg->model.n_positions, FILL);
    if (max_seq > 0 && max_seq != d->seq_len)
        fail_input("config: 'data.max_seq_length' (%d) and 'data.seq_len' (%d) name the same length; give one",
                   max_seq, d->seq_len);
    d->shuffle = read_bool(root, "data.shuffle", true, FILL);
    require_positive("data.seq_len", d->seq_len);
    d->samples = d->train_path && samples_is_sample_file(d->train_path);
    if (d->val_path && samples_is_sample_file(d->val_path) != d->samples)
        fail_input("config: 'data.train' and 'data.val' must both be sample files (.h5) or both token shards (.bin)");
    d->pad_multiple = read_int(root, "data.pad_to_multiple_of", 8, FILL);
    require_positive("data.pad_to_multiple_of", d->pad_multiple);
    d->group_by_length = read_bool(root, "data.group_by_length", false, FILL);
    d->packing = read_bool(root, "data.packing", false, FILL);
    d->allow_tokenizer_mismatch = read_bool(root, "data.allow_tokenizer_mismatch", false, FILL);
    const char *trunc = read_str(root, "data.truncation", "truncate", FILL);
    if (strcmp(trunc, "truncate") != 0 && strcmp(trunc, "drop") != 0)
        fail_input("config: 'data.truncation' is \"%s\"; use \"truncate\" (cut samples longer than data.seq_len) or "
                   "\"drop\" (leave them out)", trunc);
    d->truncate = strcmp(trunc, "truncate") == 0;
    if (!d->samples && (d->group_by_length || d->packing))
        fail_input("config: data.%s needs a sample file (.h5 from tools/prepare_data.py) in data.train; token "
                   "shards (.bin) are cut into full windows already", d->packing ? "packing" : "group_by_length");
    if (cfg->model.sliding_window > 0 && d->seq_len > cfg->model.sliding_window)
        fail_input("config: 'data.seq_len' (%d) is longer than the model's sliding attention window (%d, "
                   "sliding_window in %s/config.json), which shardlm does not implement; lower data.seq_len",
                   d->seq_len, cfg->model.sliding_window, cfg->model.pretrained);
    if (d->seq_len > cfg->model.n_positions)
        fail_input("config: 'data.seq_len' (%d) is larger than 'model.n_positions' (%d): a sequence longer than the "
                   "context; lower data.seq_len or raise model.n_positions",
                   d->seq_len, cfg->model.n_positions);
}

static void read_train(struct config *cfg, json_t *root)
{
    struct train_config *t = &cfg->train;
    t->steps = read_int(root, "train.steps", TRAIN_STEPS_DEFAULT, FILL);
    require_positive("train.steps", t->steps);
    long long seed = read_int64(root, "train.seed", TRAIN_SEED_DEFAULT, FILL);
    require_non_negative("train.seed", seed);
    t->seed = (uint64_t)seed;
    t->eval_every = read_int(root, "train.eval_every", 0, FILL);
    require_non_negative("train.eval_every", t->eval_every);
    t->eval_batches = read_int(root, "train.eval_batches", TRAIN_EVAL_BATCHES_DEFAULT, FILL);
    require_positive("train.eval_batches", t->eval_batches);
    t->sample_tokens = read_int(root, "train.sample_tokens", 0, FILL);
    require_non_negative("train.sample_tokens", t->sample_tokens);
    if (t->sample_tokens > CONFIG_MAX_SAMPLE_TOKENS)
        fail_input("config: 'train.sample_tokens' is %d, more than the %d the end-of-run sample allows",
                   t->sample_tokens, CONFIG_MAX_SAMPLE_TOKENS);
    double temperature = read_num(root, "train.sample_temperature", 1.0, FILL);
    if (!(temperature > 0))
        fail_input("config: 'train.sample_temperature' must be positive, got %g", temperature);
    t->sample_temperature = (float)temperature;
    t->metrics_path = read_path(root, "train.metrics");
    t->threads = read_int(root, "train.threads", 0, FILL);
    require_non_negative("train.threads", t->threads);
    if (t->threads > CONFIG_MAX_THREADS)
        fail_input("config: 'train.threads' is %d, more than %d; give the number of cores per rank (0: OpenMP's "
                   "default)",
                   t->threads, CONFIG_MAX_THREADS);
}

static void read_checkpoint(struct config *cfg, json_t *root)
{
    struct checkpoint_config *c = &cfg->checkpoint;
    c->dir = read_path(root, "checkpoint.dir");
    c->every = read_int(root, "checkpoint.every", 0, FILL);
    require_non_negative("checkpoint.every", c->every);
    c->keep = read_int(root, "checkpoint.keep", CHECKPOINT_KEEP_DEFAULT, FILL);
    require_non_negative("checkpoint.keep", c->keep);
    const char *on_error = read_str(root, "checkpoint.on_error", "stop", FILL);
    if (strcmp(on_error, "stop") == 0)
        c->on_error_continue = false;
    else if (strcmp(on_error, "continue") == 0)
        c->on_error_continue = true;
    else
        fail_input("config: 'checkpoint.on_error' must be \"stop\" or \"continue\", got \"%s\"", on_error);
    c->export_hf = read_bool(root, "checkpoint.export_hf", false, FILL);
    if (c->export_hf && !c->dir)
        fail_input("config: 'checkpoint.export_hf' needs checkpoint.dir (the export goes to checkpoint.dir/hf)");
}

static void read_batch(struct config *cfg, json_t *root)
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

static void read_optimizer(struct config *cfg, json_t *root)
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

static void read_scheduler(struct config *cfg, json_t *root)
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

static void read_precision(struct config *cfg, json_t *root)
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

static void read_zero(struct config *cfg, json_t *root)
{
    struct zero_config *z = &cfg->zero;
    z->stage = read_int(root, "zero_optimization.stage", 0, FILL);
    if (z->stage < 0 || z->stage > 3)
        fail_input("config: 'zero_optimization.stage' must be 0, 1, 2 or 3, got %d", z->stage);

    const char *device = read_str(root, "zero_optimization.offload_optimizer.device", "none", FILL);
    if (strcmp(device, "nvme") == 0)
        fail_input("config: 'zero_optimization.offload_optimizer.device' \"nvme\" is not supported in shardlm; use "
                   "\"cpu\" (optimizer state in pinned host memory) or \"none\"");
    if (strcmp(device, "cpu") != 0 && strcmp(device, "none") != 0)
        fail_input("config: 'zero_optimization.offload_optimizer.device' is \"%s\"; known: \"none\", \"cpu\"", device);
    z->offload_optimizer = strcmp(device, "cpu") == 0;
    z->offload_pin_memory =
        read_bool(root, "zero_optimization.offload_optimizer.pin_memory", ZERO_OFFLOAD_PIN_MEMORY_DEFAULT, FILL);
    const char *param_device = read_str(root, "zero_optimization.offload_param.device", "none", NO_FILL);
    if (strcmp(param_device, "nvme") == 0)
        fail_input("config: 'zero_optimization.offload_param.device' \"nvme\" is not supported in shardlm; use "
                   "\"cpu\" (parameter shards in pinned host memory) or \"none\"");
    if (strcmp(param_device, "cpu") != 0 && strcmp(param_device, "none") != 0)
        fail_input("config: 'zero_optimization.offload_param.device' is \"%s\"; known: \"none\", \"cpu\"",
                   param_device);
    z->offload_param = strcmp(param_device, "cpu") == 0;
    z->offload_param_pin_memory =
        read_bool(root, "zero_optimization.offload_param.pin_memory", ZERO_OFFLOAD_PIN_MEMORY_DEFAULT, NO_FILL);
    if (z->offload_param && z->stage != 3)
        fail_input("config: 'zero_optimization.offload_param' needs zero_optimization.stage 3 (as in DeepSpeed): "
                   "only stage 3 shards the parameters; raise the stage or set offload_param.device to \"none\"");
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

static void read_act_ckpt(struct config *cfg, json_t *root)
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

/* A setting with two names (PEFT's beside ours): the value of the one given
 * (written back under path), or def; *named: the key the user wrote. */
static double read_num_aliased(json_t *root, const char *path, const char *alias, double def, const char **named)
{
    const bool ours = is_given(root, path), theirs = is_given(root, alias);
    *named = theirs && !ours ? alias : path;
    if (ours && theirs && read_num(root, path, 0, NO_FILL) != read_num(root, alias, 0, NO_FILL))
        fail_input("config: '%s' and '%s' name the same setting with different values; give one", path, alias);
    return read_num(root, path, theirs ? read_num(root, alias, def, NO_FILL) : def, FILL);
}

/* A list of module names at path, each matching a module of the set in m
 * (strings owned by the document); what: the set's name in messages. */
static const char **read_module_list(json_t *root, const char *path, const struct model *m, enum model_modules set,
                                     const char *what, int *n)
{
    json_t *list = doc_get(root, path);
    char text[128], names[1024];
    *n = (int)json_array_size(list);
    if (*n == 0)
        fail_input("config: '%s' is empty; list module names (e.g. [\"q_proj\", \"v_proj\"]) or remove the key",
                   path);
    const char **out = xcalloc((size_t)*n, sizeof *out);
    for (int i = 0; i < *n; i++) {
        json_t *v = json_array_get(list, (size_t)i);
        if (!json_is_string(v))
            fail_input("config: '%s[%d]' must be a string (a module name), got %s", path, i,
                       json_brief(v, text, sizeof text));
        out[i] = json_string_value(v);
        if (model_module_matches(m, out[i], set))
            continue;
        model_module_names(m, set, names, sizeof names);
        const bool lm_head = strcmp(out[i], "lm_head") == 0;
        fail_input("config: '%s' has \"%s\", which matches no %s of this %s model%s; its %ss are: %s", path, out[i],
                   what, m->cfg.type,
                   lm_head && set == MODEL_MODULES_BLOCK_LINEAR ? " (to train the LM head, list it in "
                                                                  "lora.modules_to_save)"
                   : lm_head && m->cfg.tied_head ? " (its LM head is the token embedding, tied)"
                                                 : "",
                   what, names);
    }
    return out;
}

/* lora.target_modules: PEFT's default for the architecture when not given. */
static void read_lora_targets(struct lora_config *l, json_t *root, const struct model *m)
{
    const char *path = "lora.target_modules";
    json_t *v = doc_get(root, path);
    char text[128];
    if (!v || json_is_null(v)) {
        json_t *def = json_array();
        const char *const *names =
            strcmp(m->cfg.type, "llama") == 0 ? lora_default_targets_llama : lora_default_targets_gpt2;
        for (; *names; names++)
            json_array_append_new(def, json_string(*names));
        json_object_set_new(doc_get(root, "lora"), "target_modules", def);
    } else if (json_is_string(v)) {
        if (strcmp(json_string_value(v), "all-linear") != 0)
            fail_input("config: '%s' is \"%s\"; give a list of module names (e.g. [\"q_proj\", \"v_proj\"]) or "
                       "\"all-linear\" (regular expressions are not supported)",
                       path, json_string_value(v));
        l->all_linear = true;
        return;
    } else if (!json_is_array(v)) {
        fail_input("config: '%s' must be a list of module names or \"all-linear\", got %s", path,
                   json_brief(v, text, sizeof text));
    }
    l->target_modules =
        read_module_list(root, path, m, MODEL_MODULES_BLOCK_LINEAR, "linear layer", &l->n_target_modules);
}

static void read_lora(struct config *cfg, json_t *root)
{
    struct lora_config *l = &cfg->lora;
    json_t *section = doc_get(root, "lora");
    if (!section || json_is_null(section))
        return;
    l->enabled = true;
    const struct model_config *mc = &cfg->model;
    const char *named;
    char text[128];
    l->r = read_int(root, "lora.r", LORA_R_DEFAULT, FILL);
    if (l->r <= 0)
        fail_input("config: 'lora.r' must be a positive integer (the adapters' rank; PEFT's default is %d), got %d",
                   LORA_R_DEFAULT, l->r);
    const long long C = mc->n_embd, widest = mc->ffn_dim > 3 * C ? mc->ffn_dim : 3 * C;
    char keys[128];
    snprintf(keys, sizeof keys, "lora.r %d x (model.n_embd + the widest layer's outputs)", l->r);
    check_bound("the adapters of one linear layer", sat_mul(l->r, C + widest), CONFIG_MAX_TENSOR, keys);
    l->alpha = read_num_aliased(root, "lora.alpha", "lora.lora_alpha", LORA_ALPHA_DEFAULT, &named);
    if (!(l->alpha > 0) || !isfinite(l->alpha))
        fail_input("config: '%s' must be positive (the adapters' output is scaled by alpha / r; PEFT's default is "
                   "%g), got %g",
                   named, LORA_ALPHA_DEFAULT, l->alpha);
    l->dropout = read_num_aliased(root, "lora.dropout", "lora.lora_dropout", LORA_DROPOUT_DEFAULT, &named);
    if (!(l->dropout >= 0 && l->dropout < 1))
        fail_input("config: '%s' must be in [0, 1) (the probability that an adapter input is zeroed; 0: no "
                   "dropout), got %g",
                   named, l->dropout);
    json_t *init = doc_get(root, "lora.init");
    if (!init) { /* the resolved config shows the default */
        json_object_set_new(section, "init", json_string("default"));
        init = doc_get(root, "lora.init");
    }
    const char *init_name = json_is_string(init) ? json_string_value(init) : NULL;
    if (!init || json_is_true(init) || (init_name && strcmp(init_name, "default") == 0))
        l->init = LORA_INIT_DEFAULT;
    else if (json_is_false(init))
        l->init = LORA_INIT_RANDOM;
    else if (init_name && strcmp(init_name, "gaussian") == 0)
        l->init = LORA_INIT_GAUSSIAN;
    else
        fail_input("config: 'lora.init' is %s; known: \"default\" or true (PEFT's: A Kaiming-uniform, B zero), "
                   "\"gaussian\" (A normal with std 1 / r, B zero), false (A and B both as nn.Linear's default, "
                   "PEFT's init_lora_weights=False: the adapters change the output from the first step)",
                   json_brief(init, text, sizeof text));
    /* the module names are checked against the model they will adapt */
    struct model m;
    model_build(&m, mc);
    read_lora_targets(l, root, &m);
    json_t *save = doc_get(root, "lora.modules_to_save");
    if (save && !json_is_null(save))
        l->modules_to_save = read_module_list(root, "lora.modules_to_save", &m, MODEL_MODULES_ALL, "module",
                                              &l->n_modules_to_save);
    for (int i = 0; i < l->n_modules_to_save; i++) {
        const char *name = l->modules_to_save[i];
        bool adapted = l->all_linear && model_module_matches(&m, name, MODEL_MODULES_BLOCK_LINEAR);
        for (int j = 0; j < l->n_target_modules; j++)
            adapted = adapted || strcmp(name, l->target_modules[j]) == 0;
        if (adapted)
            fail_input("config: \"%s\" is in lora.modules_to_save and adapted by lora.target_modules; a module is "
                       "either adapted or trained in full: remove it from one of them",
                       name);
    }
    model_free(&m);
}

/* ---- public ------------------------------------------------------------ */

static void config_finish(struct config *cfg, json_t *root, const char *const *sets, int n_sets)
{
    for (int i = 0; i < n_sets; i++)
        apply_set(root, sets[i]);
    check_keys(root, "", top_keys);

    memset(cfg, 0, sizeof *cfg);
    cfg->json = root;
    /* Order matters: model before data (seq_len) and activation checkpointing
     * (interval); optimizer before scheduler (WarmupLR's default max lr). */
    read_model(cfg, root);
    read_lora(cfg, root);
    read_data(cfg, root);
    read_train(cfg, root);
    read_checkpoint(cfg, root);
    read_batch(cfg, root);
    read_optimizer(cfg, root);
    read_scheduler(cfg, root);
    read_precision(cfg, root);
    read_zero(cfg, root);
    read_act_ckpt(cfg, root);
}

void config_load(struct config *cfg, const char *path, const char *deepspeed_path, const char *const *sets,
                 int n_sets)
{
    if (!path)
        fail_internal("config_load: no config path");
    json_t *root = read_json_file(path, "config file");
    if (deepspeed_path) {
        json_t *ds = read_json_file(deepspeed_path, "DeepSpeed config");
        merge_into(root, ds, "", path, deepspeed_path);
        json_decref(ds);
    }
    config_finish(cfg, root, sets, n_sets);
}

void config_load_string(struct config *cfg, const char *json_text, const char *const *sets, int n_sets)
{
    json_error_t err;
    json_t *root = json_loads(json_text, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        fail_input("config: <string>:%d:%d: %s", err.line, err.column, err.text);
    if (!json_is_object(root))
        fail_input("config: <string>: the top level must be a JSON object ({...}), got %s", json_kind_name(root));
    config_finish(cfg, root, sets, n_sets);
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

char *config_dump(const struct config *cfg)
{
    /* 15 significant digits: user-given rates print as written (5e-05, not
     * 5.0000000000000002e-05) and still read back to the same float. */
    char *text = json_dumps(cfg->json, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
    if (!text)
        fail_internal("config: cannot serialise the configuration");
    return text;
}

void config_free(struct config *cfg)
{
    free(cfg->data.train_path);
    free(cfg->data.val_path);
    free(cfg->train.metrics_path);
    free(cfg->checkpoint.dir);
    free(cfg->lora.target_modules);
    free(cfg->lora.modules_to_save);
    json_decref(cfg->json);
    memset(cfg, 0, sizeof *cfg);
}
