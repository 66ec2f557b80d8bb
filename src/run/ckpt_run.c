/*
 * ckpt_run — what a run writes into a checkpoint and reads back (see
 * ckpt_run.h).
 */
#include "ckpt_run.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "core/util.h"
#include "io/hf.h"
#include "io/hf_export.h"
#include "io/peft_export.h"
#include "train_internal.h"
#include "zero/zero.h"

/* ---- the trainer's checkpoints: save and resume ---------------------------------------- */

/* Model shape attributes checked on resume: a checkpoint of another model is
 * refused. n_kv_head, ffn_dim and tie_word_embeddings are absent from
 * checkpoints of GPT-2 runs made before Llama trained: there they take GPT-2's
 * values. */
#define N_MODEL_ATTRS 8
static const char *const model_attr_names[N_MODEL_ATTRS] = {
    "n_layer", "n_head", "n_embd", "n_positions", "vocab_size", "n_kv_head", "ffn_dim", "tie_word_embeddings"};

static void model_attr_values(const struct model_config *mc, int64_t v[N_MODEL_ATTRS])
{
    const int64_t values[N_MODEL_ATTRS] = {mc->n_layer, mc->n_head,  mc->n_embd,  mc->n_positions,
                                           mc->vocab_size, mc->n_kv_head, mc->ffn_dim, mc->tie_embeddings};
    memcpy(v, values, sizeof values);
}

/* checkpoint.export_hf: the model as a Hugging Face directory in
 * checkpoint.dir/hf, or with LoRA its adapters as PEFT's directory there,
 * every rank writing its own master range in the parameter dtype
 * (collective). The slices are matched to tensors by name: with LoRA, the
 * frozen units have no master. */
static void export_hf(struct trainer *tr)
{
    const struct config *cfg = tr->cfg;
    char dir[CKPT_MAX_PATH];
    snprintf(dir, sizeof dir, "%s/hf", cfg->checkpoint.dir);
    double t0 = now_seconds();
    const int n = zero_ckpt_n_slices(&tr->sess.zero);
    zero_ckpt_stage(&tr->sess.zero);
    struct ckpt_slice *slices = xcalloc((size_t)n, sizeof *slices);
    zero_export_slices(&tr->sess.zero, slices);
    struct hf_writer w;
    if (cfg->lora.enabled)
        peft_export_begin(&w, &tr->sess.model, cfg->dtype, dir, tr->sess.comm);
    else
        /* checkpoint.dir/hf is the run's own (an older shardlm's export there does not record its origin) */
        hf_export_begin(&w, &tr->sess.model, cfg->dtype, HF_DEFAULT_MAX_FILE, dir, cfg->checkpoint.dir, true,
                        tr->sess.comm);
    float *buf = NULL; /* a master in the nvme file: read a piece at a time (ckpt_slice.read) */
    for (int k = 0; k < n; k++)
        for (size_t at = 0; at < slices[k].count; at += CKPT_READ_ELEMS) {
            const size_t c = slices[k].count - at < CKPT_READ_ELEMS ? slices[k].count - at : CKPT_READ_ELEMS;
            buf = buf || slices[k].data ? buf : xmalloc(CKPT_READ_ELEMS * sizeof *buf);
            hf_export_write_named(&w, slices[k].name, slices[k].begin + at, c,
                                  ckpt_slice_values(&slices[k], at, c, buf));
        }
    free(buf);
    if (cfg->lora.enabled)
        peft_export_end(&w, &cfg->lora, cfg->model.pretrained, tr->sess.comm);
    else
        hf_export_end(&w, cfg->dtype, cfg->model.pretrained, tr->sess.comm);
    free(slices);
    zero_ckpt_unstage(&tr->sess.zero);
    log_info("step %5ld | %s export %s (%s, %.2f s)", tr->step, cfg->lora.enabled ? "PEFT adapter" : "Hugging Face",
             dir, dtype_name(cfg->dtype), now_seconds() - t0);
}

/* Saves the whole training state: fp32 master weights, Adam m and v, and the
 * step, scaler, scheduler and data positions (DESIGN §7). Collective. */
void ckpt_run_save(struct trainer *tr)
{
    const struct config *cfg = tr->cfg;
    const int n = zero_ckpt_n_slices(&tr->sess.zero);
    zero_ckpt_stage(&tr->sess.zero); /* a device's optimizer state, copied to the host for the save */
    struct ckpt_slice *slices = xcalloc((size_t)n * ZERO_CKPT_GROUPS, sizeof *slices);
    struct ckpt_group groups[ZERO_CKPT_GROUPS];
    for (int g = 0; g < ZERO_CKPT_GROUPS; g++) {
        zero_ckpt_slices(&tr->sess.zero, g, slices + (size_t)g * n);
        groups[g] = (struct ckpt_group){zero_ckpt_group_names[g], slices + (size_t)g * n, n};
    }
    uint64_t data_position = tr->samples_seen, rng = cfg->train.seed;
    struct ckpt_rank_state state[2] = {{"data_position", 1, &data_position}, {"rng", 1, &rng}};
    char *config_json = config_dump(cfg);
    int64_t shape[N_MODEL_ATTRS];
    model_attr_values(&cfg->model, shape);
    struct ckpt_attr attrs[] = {
        {"skipped_steps", CKPT_ATTR_I64, tr->skipped_steps, 0, NULL},
        {"adam_steps", CKPT_ATTR_I64, tr->sess.zero.adam_steps, 0, NULL},
        {"samples_seen", CKPT_ATTR_I64, (int64_t)tr->samples_seen, 0, NULL},
        {"loss_scale", CKPT_ATTR_F64, 0, tr->scaler.scale, NULL},
        {"hysteresis_left", CKPT_ATTR_I64, tr->scaler.hysteresis_left, 0, NULL},
        {"scaler_iter", CKPT_ATTR_I64, tr->scaler.iter, 0, NULL},
        {"last_overflow_iter", CKPT_ATTR_I64, tr->scaler.last_overflow_iter, 0, NULL},
        {"dtype", CKPT_ATTR_STR, 0, 0, dtype_name(cfg->dtype)},
        {"config", CKPT_ATTR_STR, 0, 0, config_json},
        {"model_type", CKPT_ATTR_STR, 0, 0, cfg->model.type},
        {"n_layer", CKPT_ATTR_I64, shape[0], 0, NULL},
        {"n_head", CKPT_ATTR_I64, shape[1], 0, NULL},
        {"n_embd", CKPT_ATTR_I64, shape[2], 0, NULL},
        {"n_positions", CKPT_ATTR_I64, shape[3], 0, NULL},
        {"vocab_size", CKPT_ATTR_I64, shape[4], 0, NULL},
        {"n_kv_head", CKPT_ATTR_I64, shape[5], 0, NULL},
        {"ffn_dim", CKPT_ATTR_I64, shape[6], 0, NULL},
        {"tie_word_embeddings", CKPT_ATTR_I64, shape[7], 0, NULL},
        {"rms_norm_eps", CKPT_ATTR_F64, 0, cfg->model.norm_eps, NULL},
        {"rope_theta", CKPT_ATTR_F64, 0, cfg->model.rope_theta, NULL},
        {NULL, CKPT_ATTR_I64, 0, 0, NULL}, /* room for the four below */
        {NULL, CKPT_ATTR_I64, 0, 0, NULL},
        {NULL, CKPT_ATTR_I64, 0, 0, NULL},
        {NULL, CKPT_ATTR_I64, 0, 0, NULL},
    };
    int n_attrs = (int)(sizeof attrs / sizeof *attrs) - 4;
    if (tr->sess.model.lora.on) { /* LoRA: the adapters only; the base is named and checksummed */
        attrs[n_attrs++] = (struct ckpt_attr){"base_source", CKPT_ATTR_STR, 0, 0, tr->base_source};
        attrs[n_attrs++] = (struct ckpt_attr){"base_checksum", CKPT_ATTR_STR, 0, 0, tr->base_checksum};
    }
    if (tr->dpo.ref) { /* DPO's precomputed reference log-probs: a resume loads this file, as it was */
        attrs[n_attrs++] = (struct ckpt_attr){"dpo_ref_path", CKPT_ATTR_STR, 0, 0, tr->dpo.ref_path};
        attrs[n_attrs++] = (struct ckpt_attr){"dpo_ref_sha256", CKPT_ATTR_STR, 0, 0, tr->dpo.ref_sha256};
    }
    struct ckpt_contents contents = {groups, ZERO_CKPT_GROUPS, state, 2, attrs, n_attrs};
    char path[4096];
    double t0 = now_seconds();
    train_fault_point("save");
    /* Every rank gets the same status (ckpt_try_save agrees on failure). */
    comm_watch_begin(tr->sess.comm, "saving a checkpoint");
    int rc = ckpt_try_save(cfg->checkpoint.dir, tr->step, cfg->checkpoint.keep, &contents, path, sizeof path);
    comm_watch_end(tr->sess.comm);
    free(config_json);
    free(slices);
    zero_ckpt_unstage(&tr->sess.zero);
    if (rc != 0) {
        if (!cfg->checkpoint.on_error_continue)
            ckpt_fail_agreed(cfg->checkpoint.dir, ckpt_save_error());
        log_warn("step %ld: cannot save a checkpoint in '%s': %s; training continues (checkpoint.on_error is "
                 "\"continue\"; the previous checkpoint and latest are unchanged)",
                 tr->step, cfg->checkpoint.dir, ckpt_save_error());
        return;
    }
    log_info("step %5ld | checkpoint %s (%.2f s)", tr->step, path, now_seconds() - t0);
    if (cfg->checkpoint.export_hf)
        export_hf(tr);
}

/* A LoRA checkpoint holds adapters for one base: the run's must be it. */
static void check_base(struct trainer *tr, struct ckpt_reader *r, const char *path)
{
    const bool lora_ckpt = ckpt_has_attr(r, "base_checksum");
    if (!tr->sess.model.lora.on && lora_ckpt)
        fail_input("checkpoint '%s' holds LoRA adapters, not a whole model; resume it with the 'lora' section it was "
                   "trained with, or start fresh (--resume none --overwrite)",
                   path);
    if (!tr->sess.model.lora.on)
        return;
    if (!lora_ckpt)
        fail_input("checkpoint '%s' holds a whole model, not LoRA adapters; to train adapters on it, export it "
                   "(shardlm export) and give that directory as model.from_pretrained, or start fresh (--resume "
                   "none --overwrite)",
                   path);
    char *sum = ckpt_attr_str(r, "base_checksum"), *source = ckpt_attr_str(r, "base_source");
    if (strcmp(sum, tr->base_checksum) != 0)
        fail_input("checkpoint '%s' trained its adapters on another base: %s (checksum %s), and this run's base is "
                   "%s (checksum %s); resume with the base it was trained on, or start fresh (--resume none "
                   "--overwrite)",
                   path, source, sum, tr->base_source, tr->base_checksum);
    free(sum);
    free(source);
}

/* A resume at another world size keeps the micro-batch and the accumulation the config gives, so the batch
 * (train_batch_size: samples, or DPO pairs, per step) follows the ranks: the learning rate's meaning and the data
 * each step takes change. Said in one line (the config may well mean it); the batch the checkpoint trained with
 * is the one of its resolved config. */
static void say_batch_change(const struct trainer *tr, struct ckpt_reader *r, const char *path, int saved_world)
{
    const struct config *cfg = tr->cfg;
    char *text = ckpt_has_attr(r, "config") ? ckpt_attr_str(r, "config") : NULL;
    json_t *doc = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    json_t *saved = json_object_get(doc, "train_batch_size");
    if (json_is_integer(saved) && json_integer_value(saved) != cfg->train_batch_size) {
        const long long was = (long long)json_integer_value(saved);
        log_warn("checkpoint '%s' trained with train_batch_size %lld (%d rank%s); this run's is %d (micro-batch %d "
                 "x accumulation %d x %d rank%s), so each step takes another number of %s: to keep %lld, give "
                 "train_batch_size %lld (the accumulation follows)",
                 path, was, saved_world, saved_world > 1 ? "s" : "", cfg->train_batch_size, cfg->micro_batch,
                 cfg->grad_accum, tr->sess.world, tr->sess.world > 1 ? "s" : "", tr->dpo.on ? "pairs" : "samples",
                 was, was);
    }
    json_decref(doc);
}

/* Continues from a checkpoint when --resume names one (or "auto" finds one). */
void ckpt_run_resume(struct trainer *tr, const char *spec)
{
    const struct config *cfg = tr->cfg;
    if (strcmp(spec, "none") == 0) {
        log_info("--resume none: starting fresh");
        return;
    }
    if (!cfg->checkpoint.dir && strcmp(spec, "auto") == 0)
        fail_input("--resume auto needs checkpoint.dir in the config (where the checkpoints are)");
    char *path = ckpt_resolve(cfg->checkpoint.dir, spec);
    if (!path) {
        log_info("no checkpoint in %s: starting fresh", cfg->checkpoint.dir);
        return;
    }
    double t0 = now_seconds();
    struct ckpt_reader *r = ckpt_open(path);
    char *saved_type = ckpt_attr_str(r, "model_type");
    if (strcmp(saved_type, cfg->model.type) != 0)
        fail_input("checkpoint '%s' holds a %s model and the config a %s model (model.type)", path, saved_type,
                   cfg->model.type);
    free(saved_type);
    struct model_config gpt2_defaults = cfg->model; /* what a checkpoint without the newer attributes means */
    gpt2_defaults.n_kv_head = cfg->model.n_head;
    gpt2_defaults.ffn_dim = 4 * cfg->model.n_embd;
    gpt2_defaults.tie_embeddings = true;
    int64_t want[N_MODEL_ATTRS], absent[N_MODEL_ATTRS];
    model_attr_values(&cfg->model, want);
    model_attr_values(&gpt2_defaults, absent);
    for (int i = 0; i < N_MODEL_ATTRS; i++) {
        int64_t got = i >= 5 && !ckpt_has_attr(r, model_attr_names[i]) ? absent[i] : ckpt_attr_i64(r, model_attr_names[i]);
        if (got != want[i])
            fail_input("checkpoint '%s' holds a different model: %s is %lld there and %lld in the config", path,
                       model_attr_names[i], (long long)got, (long long)want[i]);
    }
    check_base(tr, r, path);
    if (ckpt_has_attr(r, "dpo_ref_path")) { /* dpo_prepare loads (and checks) that file */
        char *ref = ckpt_attr_str(r, "dpo_ref_path"), *sha = ckpt_attr_str(r, "dpo_ref_sha256");
        snprintf(tr->dpo.saved_path, sizeof tr->dpo.saved_path, "%s", ref);
        snprintf(tr->dpo.saved_sha256, sizeof tr->dpo.saved_sha256, "%s", sha);
        free(ref);
        free(sha);
    }
    zero_ckpt_load(&tr->sess.zero, r);
    train_fault_point("resume");
    tr->step = (long)ckpt_attr_i64(r, "step");
    tr->skipped_steps = (long)ckpt_attr_i64(r, "skipped_steps");
    tr->sess.zero.adam_steps = (long)ckpt_attr_i64(r, "adam_steps");
    tr->samples_seen = (uint64_t)ckpt_attr_i64(r, "samples_seen");
    char *saved_dtype = ckpt_attr_str(r, "dtype");
    if (strcmp(saved_dtype, dtype_name(cfg->dtype)) != 0)
        log_info("checkpoint '%s' was trained in %s, this run in %s: the fp32 master weights and Adam state carry "
                 "over%s",
                 path, saved_dtype, dtype_name(cfg->dtype),
                 tr->scaler.skips_overflow ? "; the fp16 loss scaler starts fresh, as the checkpoint has none" : "");
    /* only an fp16 run has a loss scaler to continue */
    if (tr->scaler.skips_overflow && strcmp(saved_dtype, dtype_name(DTYPE_F16)) == 0) {
        tr->scaler.scale = ckpt_attr_f64(r, "loss_scale");
        tr->scaler.hysteresis_left = (int)ckpt_attr_i64(r, "hysteresis_left");
        tr->scaler.iter = (long)ckpt_attr_i64(r, "scaler_iter");
        tr->scaler.last_overflow_iter = (long)ckpt_attr_i64(r, "last_overflow_iter");
        const char *why = loss_scaler_check_state(&tr->scaler);
        if (why)
            fail_input("checkpoint '%s': loss-scaler state is invalid (%s)", path, why);
    }
    free(saved_dtype);
    int saved_world = ckpt_saved_world(r);
    say_batch_change(tr, r, path, saved_world);
    ckpt_close(r);
    log_info("resumed from %s at step %ld (saved by %d rank%s, now %d) (%.2f s)", path, tr->step, saved_world,
             saved_world > 1 ? "s" : "", tr->sess.world, now_seconds() - t0);
    free(path);
}

/* ---- a checkpoint read back by generate, eval and the checkpoint tools ------------------ */

/* The sections of a checkpoint's run config that say what the model is and
 * how it runs (model, lora, dtype, ZeRO, the data options), the rest dropped;
 * its model.from_pretrained goes to base (the weights come from the
 * checkpoint, or for LoRA from the base, which may have moved). */
json_t *ckpt_run_infer_config(struct ckpt_reader *r, const char *path, char *base, size_t cap)
{
    char *text = ckpt_has_attr(r, "config") ? ckpt_attr_str(r, "config") : NULL;
    json_t *doc = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    if (!json_is_object(doc) || !json_is_object(json_object_get(doc, "model")))
        fail_input("checkpoint '%s' holds no run config with a model section: it was not written by shardlm train",
                   path);
    json_t *out = json_object();
    /* quantization: a QLoRA base is quantized again as it is read (its checksum is of the 4-bit values) */
    static const char *const keep[] = {"model", "lora", "bf16", "fp16", "zero_optimization", "data", "quantization"};
    for (size_t i = 0; i < sizeof keep / sizeof *keep; i++) {
        json_t *v = json_object_get(doc, keep[i]);
        if (v && !json_is_null(v))
            json_object_set_new(out, keep[i], json_deep_copy(v));
    }
    json_t *model = json_object_get(out, "model"), *from = json_object_get(model, "from_pretrained");
    base[0] = '\0';
    if (json_is_string(from))
        snprintf(base, cap, "%s", json_string_value(from));
    json_object_del(model, "from_pretrained");
    /* the optimizer state in files (offload_optimizer "nvme") is the training's, not the inference's */
    json_t *oo = json_object_get(json_object_get(out, "zero_optimization"), "offload_optimizer");
    if (json_is_object(oo) && json_is_string(json_object_get(oo, "device")) &&
        strcmp(json_string_value(json_object_get(oo, "device")), "nvme") == 0)
        json_object_del(json_object_get(out, "zero_optimization"), "offload_optimizer");
    json_t *data = json_object_get(out, "data");
    if (data) {
        json_object_del(data, "train");
        json_object_del(data, "val");
    }
    json_t *threads = json_object_get(json_object_get(doc, "train"), "threads");
    if (threads)
        json_object_set_new(out, "train", json_pack("{sO}", "threads", threads));
    json_decref(doc);
    return out;
}

/* A checkpoint's fp32 masters as a parameter source: unit u's elements from
 * its tensors' datasets, zero in alignment gaps. */
void ckpt_run_source_read(void *ctx, int u, size_t begin, size_t count, float *out)
{
    const struct ckpt_run_source *cs = ctx;
    const struct unit_desc *ud = &cs->m->units[u];
    memset(out, 0, count * sizeof *out);
    for (int i = 0; i < ud->n_tensors; i++) {
        const struct tensor_desc *t = &ud->tensors[i];
        const size_t lo = t->offset > begin ? t->offset : begin;
        const size_t hi = t->offset + t->numel < begin + count ? t->offset + t->numel : begin + count;
        if (lo >= hi)
            continue;
        const size_t shape[2] = {(size_t)t->shape[0], t->ndim == 2 ? (size_t)t->shape[1] : 0};
        ckpt_read(cs->r, zero_ckpt_group_names[0], t->name, t->ndim, shape, lo - t->offset, hi - lo,
                  out + (lo - begin));
    }
}

static int attr_int(struct ckpt_reader *r, const char *path, const char *name)
{
    int64_t v = ckpt_attr_i64(r, name);
    if (v < 1 || v > (1 << 28))
        fail_input("checkpoint '%s': attribute '%s' is %lld, not a valid model size", path, name, (long long)v);
    return (int)v;
}

/* The model described by the checkpoint's attributes. */
void ckpt_run_model(struct ckpt_reader *r, const char *path, struct model *m)
{
    struct model_config mc;
    memset(&mc, 0, sizeof mc);
    char *type = ckpt_attr_str(r, "model_type");
    snprintf(mc.type, sizeof mc.type, "%s", type);
    free(type);
    mc.n_layer = attr_int(r, path, "n_layer");
    mc.n_head = attr_int(r, path, "n_head");
    mc.n_embd = attr_int(r, path, "n_embd");
    mc.n_positions = attr_int(r, path, "n_positions");
    mc.vocab_size = attr_int(r, path, "vocab_size");
    mc.padded_vocab = (int)round_up((size_t)mc.vocab_size, MODEL_VOCAB_ALIGN);
    /* absent from checkpoints of GPT-2 runs made before Llama trained: GPT-2's shapes */
    mc.n_kv_head = ckpt_has_attr(r, "n_kv_head") ? attr_int(r, path, "n_kv_head") : mc.n_head;
    mc.ffn_dim = ckpt_has_attr(r, "ffn_dim") ? attr_int(r, path, "ffn_dim") : 4 * mc.n_embd;
    mc.tie_embeddings = ckpt_has_attr(r, "tie_word_embeddings") ? ckpt_attr_i64(r, "tie_word_embeddings") != 0 : true;
    mc.norm_eps = ckpt_has_attr(r, "rms_norm_eps") ? ckpt_attr_f64(r, "rms_norm_eps") : 1e-5;
    mc.rope_theta = ckpt_has_attr(r, "rope_theta") ? ckpt_attr_f64(r, "rope_theta") : 10000.0;
    /* the rest from the run's resolved config: rope_scaling, and the directory it started from */
    char *config = ckpt_has_attr(r, "config") ? ckpt_attr_str(r, "config") : NULL;
    json_t *doc = config ? json_loads(config, 0, NULL) : NULL;
    json_t *model = json_object_get(doc, "model");
    json_t *rs = json_object_get(model, "rope_scaling");
    const char *rs_type = json_string_value(json_object_get(rs, "rope_type"));
    if (!rs_type)
        rs_type = json_string_value(json_object_get(rs, "type"));
    if (json_is_object(rs) && rs_type && strcmp(rs_type, "longrope") == 0) {
        struct rope_scaling *r = &mc.rope_scaling;
        json_t *sf = json_object_get(rs, "short_factor"), *lf = json_object_get(rs, "long_factor");
        r->type = ROPE_SCALING_LONGROPE;
        r->n_factors = (int)json_array_size(sf) < ROPE_MAX_FACTORS ? (int)json_array_size(sf) : ROPE_MAX_FACTORS;
        for (int i = 0; i < r->n_factors; i++) {
            r->short_factor[i] = json_number_value(json_array_get(sf, (size_t)i));
            r->long_factor[i] = json_number_value(json_array_get(lf, (size_t)i));
        }
        r->attention_factor = json_number_value(json_object_get(rs, "attention_factor"));
        r->original_max_positions = (int)json_integer_value(json_object_get(rs, "original_max_position_embeddings"));
    } else if (json_is_object(rs) && rs_type && strcmp(rs_type, "linear") == 0) {
        mc.rope_scaling.type = ROPE_SCALING_LINEAR;
        mc.rope_scaling.factor = json_number_value(json_object_get(rs, "factor"));
    } else if (json_is_object(rs) && (!rs_type || strcmp(rs_type, "default") != 0)) {
        mc.rope_scaling.type = ROPE_SCALING_LLAMA3;
        mc.rope_scaling.factor = json_number_value(json_object_get(rs, "factor"));
        mc.rope_scaling.low_freq_factor = json_number_value(json_object_get(rs, "low_freq_factor"));
        mc.rope_scaling.high_freq_factor = json_number_value(json_object_get(rs, "high_freq_factor"));
        mc.rope_scaling.original_max_positions =
            (int)json_integer_value(json_object_get(rs, "original_max_position_embeddings"));
    }
    /* the Llama-like families' extras (absent before Qwen: a Llama's) */
    json_t *hd = json_object_get(model, "head_dim");
    mc.head_dim = json_is_integer(hd) ? (int)json_integer_value(hd) : 0;
    mc.qkv_bias = json_is_true(json_object_get(model, "qkv_bias"));
    mc.partial_rotary = json_is_number(json_object_get(model, "partial_rotary_factor"))
                            ? json_number_value(json_object_get(model, "partial_rotary_factor"))
                            : 1.0;
    if (doc)
        config_read_sliding(&mc, doc);
    mc.qk_norm = json_is_true(json_object_get(model, "qk_norm"));
    mc.fused_projections = json_is_true(json_object_get(model, "fused_projections"));
    /* Gemma's (absent for the other types: 0) */
    mc.final_softcap = json_number_value(json_object_get(model, "final_logit_softcapping"));
    mc.attn_softcap = json_number_value(json_object_get(model, "attn_logit_softcapping"));
    mc.query_scalar = json_number_value(json_object_get(model, "query_pre_attn_scalar"));
    mc.window_pattern = (int)json_integer_value(json_object_get(model, "sliding_window_pattern"));
    mc.rope_local_theta = json_number_value(json_object_get(model, "rope_local_theta"));
    json_t *src = json_object_get(model, "from_pretrained");
    if (json_is_string(src))
        snprintf(mc.pretrained, sizeof mc.pretrained, "%s", json_string_value(src));
    json_decref(doc);
    free(config);
    model_build(m, &mc);
}

/* A LoRA checkpoint's lora section, read from the run's resolved config
 * with its model section alone (whose keys are all there, resolved) and
 * without model.from_pretrained (the base directory may have moved), so
 * that the rest of the run's config neither warns nor fails again here;
 * false, with cfg untouched, for a checkpoint without one. cfg owns the
 * strings model_add_lora keeps. */
bool ckpt_run_lora(struct ckpt_reader *r, const char *path, struct config *cfg)
{
    char *text = ckpt_has_attr(r, "config") ? ckpt_attr_str(r, "config") : NULL;
    json_t *doc = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    json_t *lora = json_object_get(doc, "lora"), *model = json_object_get(doc, "model");
    bool on = lora && !json_is_null(lora);
    if (on && !json_is_object(model))
        fail_input("checkpoint '%s': its config has a lora section but no model section; it was not written by "
                   "shardlm train",
                   path);
    if (on) {
        json_t *part = json_pack("{sosO}", "model", json_deep_copy(model), "lora", lora);
        json_object_del(json_object_get(part, "model"), "from_pretrained");
        /* a QLoRA checkpoint: its quantization, checked against the run's precision */
        static const char *const with[] = {"quantization", "bf16", "bfloat16", "fp16"};
        for (size_t k = 0; k < sizeof with / sizeof with[0]; k++)
            if (json_object_get(doc, with[k]))
                json_object_set(part, with[k], json_object_get(doc, with[k]));
        config_load_json(cfg, part, NULL, 0); /* the config takes part */
    }
    json_decref(doc);
    return on;
}

