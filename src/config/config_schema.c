/*
 * config_schema — every key the config accepts, as a table (struct key_spec,
 * config_internal.h): its JSON type, whether null means "not given", keys
 * DeepSpeed defines that change nothing here (one warning each) and keys
 * refused with a hint; check_keys() walks the document against it (unknown
 * keys with a "did you mean", wrong types, "auto").
 */
#include "config_internal.h"

#include "core/util.h"

#include <ctype.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <string.h>

/* ---- schema ------------------------------------------------------------ */

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
    {"head_dim", K_INT, 0, NULL, NULL},
    {"qkv_bias", K_BOOL, 0, NULL, NULL},
    {"qk_norm", K_BOOL, 0, NULL, NULL},
    {"fused_projections", K_BOOL, 0, NULL, NULL},
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
    {"nvme_path", K_STR, F_NULLABLE, NULL, NULL},
    {"buffer_count", K_INT, 0, NULL, NULL},
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
    {"nvme_path", K_STR, F_NULLABLE, NULL, NULL},
    {"buffer_count", K_INT, 0, NULL, NULL},
    {"buffer_size", K_INT, 0, NULL, NULL},
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

/* DeepSpeed's asynchronous I/O section (ZeRO-Infinity's NVMe offload). */
static const struct key_spec aio_keys[] = {
    {"block_size", K_INT, F_NO_EFFECT, NULL, NULL},
    {"queue_depth", K_INT, F_NO_EFFECT, NULL, NULL},
    {"thread_count", K_INT, F_NO_EFFECT, NULL, NULL},
    {"intra_op_parallelism", K_INT, F_NO_EFFECT, NULL, NULL},
    {"single_submit", K_BOOL, F_NO_EFFECT, NULL, NULL},
    {"overlap_events", K_BOOL, F_NO_EFFECT, NULL, NULL},
    {"use_gds", K_BOOL, F_NO_EFFECT, NULL, NULL},
    {0},
};

/* dpo (issue 37): TRL's DPOConfig names. */
static const struct key_spec dpo_keys[] = {
    {"beta", K_NUM, 0, NULL, NULL},
    {"loss_type", K_STR, 0, NULL, NULL},
    {"label_smoothing", K_NUM, 0, NULL, NULL},
    {"precompute_ref_log_probs", K_BOOL, 0, NULL, NULL},
    {"ref_log_probs_path", K_STR, F_NULLABLE, NULL, NULL},
    {"max_length", K_ANY, F_REJECT, NULL,
     "is a data preparation setting here: pass --max-seq-length to tools/prepare_data.py"},
    {"max_prompt_length", K_ANY, F_REJECT, NULL,
     "is a data preparation setting here: pass --max-prompt-length to tools/prepare_data.py"},
    {0},
};

const struct key_spec top_keys[] = {
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
    {"dpo", K_OBJ, F_NULLABLE, dpo_keys, NULL},
    {"aio", K_OBJ, 0, aio_keys, NULL},
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
void check_keys(json_t *obj, const char *prefix, const struct key_spec *specs)
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
