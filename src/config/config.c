/*
 * config — reading, merging, checking and resolving the run's JSON config.
 * This file builds the document and runs the passes; the schema, the typed
 * reads and the sections are in the other config_*.c (config_internal.h).
 *
 * Three passes over one jansson document:
 *   1. build it: the main file, the --deepspeed file merged in (a key given in
 *      both with different values is an error), then the --set overrides;
 *   2. check_keys(): every key against the schema of config_schema.c (unknown
 *      keys, JSON types, "auto", keys accepted without effect -> one warning
 *      each); model.from_pretrained recorded (config_begin ends here, and the
 *      caller adds the keys of that directory's config.json);
 *   3. read_*(): typed values with DeepSpeed's defaults into struct config, and
 *      range checks (config_end). Defaults that are read are written back into
 *      the document, so cfg->json (and config_dump) is the resolved config.
 *
 * Defaults follow DeepSpeed v0.19.5 (deepspeed/runtime/constants.py,
 * precision_config.py, zero/config.py, zero/offload_config.py,
 * ops/adam/fused_adam.py, lr_schedules.py); where shardlm departs from them the
 * constant says why.
 */
#include "config_internal.h"

#include "core/util.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

/* ---- public ------------------------------------------------------------ */

/* The --set overrides and the keys' check on a document read; cfg takes it. */
void config_begin_json(struct config *cfg, json_t *root, const char *const *sets, int n_sets)
{
    if (!json_is_object(root))
        fail_input("config: the top level must be a JSON object ({...}), got %s", json_kind_name(root));
    for (int i = 0; i < n_sets; i++)
        apply_set(root, sets[i]);
    check_keys(root, "", top_keys);

    memset(cfg, 0, sizeof *cfg);
    cfg->json = root;
    read_pretrained(&cfg->model, root);
}

void config_end(struct config *cfg)
{
    json_t *root = cfg->json;
    /* Order matters: model before data (seq_len) and activation checkpointing
     * (interval); optimizer before scheduler (WarmupLR's default max lr). */
    read_model(cfg, root);
    read_lora(cfg, root);
    read_dpo(cfg, root);
    read_data(cfg, root);
    read_train(cfg, root);
    read_checkpoint(cfg, root);
    read_batch(cfg, root);
    read_optimizer(cfg, root);
    read_scheduler(cfg, root);
    read_precision(cfg, root);
    read_quantization(cfg, root); /* after lora (a frozen base) and the precision (the compute dtype) */
    read_zero(cfg, root);
    read_act_ckpt(cfg, root);
}

void config_begin(struct config *cfg, const char *path, const char *deepspeed_path, const char *const *sets,
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
    config_begin_json(cfg, root, sets, n_sets);
}

void config_begin_string(struct config *cfg, const char *json_text, const char *const *sets, int n_sets)
{
    json_error_t err;
    json_t *root = json_loads(json_text, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        fail_input("config: <string>:%d:%d: %s", err.line, err.column, err.text);
    if (!json_is_object(root))
        fail_input("config: <string>: the top level must be a JSON object ({...}), got %s", json_kind_name(root));
    config_begin_json(cfg, root, sets, n_sets);
}

/* config_load's callers have no model directory to read. */
static void config_end_alone(struct config *cfg, const char *what)
{
    if (cfg->model.pretrained[0])
        fail_internal("%s: model.from_pretrained needs its config.json read between config_begin and config_end "
                      "(run/run_config.h)",
                      what);
    config_end(cfg);
}

void config_load(struct config *cfg, const char *path, const char *deepspeed_path, const char *const *sets,
                 int n_sets)
{
    config_begin(cfg, path, deepspeed_path, sets, n_sets);
    config_end_alone(cfg, "config_load");
}

void config_load_string(struct config *cfg, const char *json_text, const char *const *sets, int n_sets)
{
    config_begin_string(cfg, json_text, sets, n_sets);
    config_end_alone(cfg, "config_load_string");
}

void config_load_json(struct config *cfg, json_t *root, const char *const *sets, int n_sets)
{
    config_begin_json(cfg, root, sets, n_sets);
    config_end_alone(cfg, "config_load_json");
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
    free(cfg->dpo.ref_log_probs_path);
    free(cfg->lora.target_modules);
    free(cfg->lora.modules_to_save);
    json_decref(cfg->json);
    memset(cfg, 0, sizeof *cfg);
}
