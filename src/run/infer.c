/*
 * infer — a model opened for forward passes only (see infer.h).
 */
#include "infer.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "ckpt_run.h"
#include "io/ckpt.h"
#include "io/hf.h"
#include "run_config.h"
#include "core/hf_json.h"
#include "tokenizer/tokenizer.h"
#include "core/util.h"

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool readable(const char *path) { return access(path, R_OK) == 0; }

/* ---- the config ------------------------------------------------------------------------- */

/* generation_config.json's eos_token_id into s->eos: an id of the model's vocabulary, or a list of up to 8.
 * A file that is not a JSON object, or an eos_token_id of another kind (a string, a fraction, an object, a
 * number outside the vocabulary, -1), leaves s->eos_problem naming the file and the value, which generate
 * refuses (infer_require_eos): transformers would never stop on such an id. Absent or null: nothing. */
static void read_generation_eos(struct infer *s, const char *path)
{
    json_error_t err;
    json_t *doc = hf_json_load_file(path, 0, &err);
    char why[512], value[64] = "";
    if (!json_is_object(doc)) {
        snprintf(s->eos_problem, sizeof s->eos_problem, "%s: %s; fix it, or remove it to stop at config.json's or "
                 "the tokenizer's end token", path, doc ? "not a JSON object" : hf_json_why(&err, why, sizeof why));
        json_decref(doc);
        return;
    }
    json_t *eos = json_object_get(doc, "eos_token_id");
    const size_t n = json_is_array(eos) ? json_array_size(eos) : 1;
    bool ok = eos && !json_is_null(eos) && n >= 1 && n <= sizeof s->eos / sizeof s->eos[0];
    for (size_t i = 0; ok && i < n; i++) {
        json_t *id = json_is_array(eos) ? json_array_get(eos, i) : eos;
        ok = json_is_integer(id) && json_integer_value(id) >= 0 &&
             json_integer_value(id) < s->cfg.model.vocab_size;
        if (ok)
            s->eos[s->n_eos++] = (int32_t)json_integer_value(id);
    }
    if (eos && !json_is_null(eos) && !ok) {
        s->n_eos = 0;
        char *text = json_dumps(eos, JSON_ENCODE_ANY | JSON_COMPACT);
        snprintf(value, sizeof value, "%.40s%s", text ? text : "?", text && strlen(text) > 40 ? "..." : "");
        free(text);
        snprintf(s->eos_problem, sizeof s->eos_problem, "%s: eos_token_id %s is not a token id of this model (an "
                 "integer from 0 to %d, or a list of 1 to %zu of them); fix it, or remove it to stop at "
                 "config.json's or the tokenizer's end token", path, value, s->cfg.model.vocab_size - 1,
                 sizeof s->eos / sizeof s->eos[0]);
    }
    json_decref(doc);
}

void infer_require_eos(const struct infer *s)
{
    if (s->eos_problem[0])
        fail_input("%s", s->eos_problem);
}

/* The end-of-sequence ids of a Hugging Face directory: generation_config.json's
 * eos_token_id (read_generation_eos), else config.json's (a number or a list). */
static void read_eos(struct infer *s, const char *dir)
{
    char generation[4200];
    snprintf(generation, sizeof generation, "%s/generation_config.json", dir);
    if (access(generation, F_OK) == 0)
        read_generation_eos(s, generation);
    if (s->n_eos || s->eos_problem[0])
        return;
    /* config.json's, as io/hf_config reads it (token ids are inert there; GPT2Config's 50256 may lie outside
     * a small vocabulary, where it never matches) */
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *doc = readable(path) ? hf_json_load_file(path, 0, NULL) : NULL;
    json_t *eos = json_object_get(doc, "eos_token_id");
    if (json_is_integer(eos))
        s->eos[s->n_eos++] = (int32_t)json_integer_value(eos);
    for (size_t i = 0; json_is_array(eos) && i < json_array_size(eos) && s->n_eos < 8; i++)
        if (json_is_integer(json_array_get(eos, i)))
            s->eos[s->n_eos++] = (int32_t)json_integer_value(json_array_get(eos, i));
    json_decref(doc);
}

static void find_tokenizer(struct infer *s, const struct infer_options *o)
{
    char path[4200] = "";
    if (o->tokenizer)
        snprintf(path, sizeof path, "%s", o->tokenizer);
    else if (s->hf_dir[0])
        snprintf(path, sizeof path, "%s/tokenizer.json", s->hf_dir);
    if (o->tokenizer && !readable(path))
        fail_input("--tokenizer '%s': %s", path, strerror(errno));
    if (!path[0] || !readable(path))
        return; /* none: token ids only, or bytes for a byte-level model (vocabulary 256) */
    char err[512];
    s->tok = tokenizer_load(path, err, sizeof err);
    if (!s->tok)
        fail_input("%s", err);
    snprintf(s->tokenizer_path, sizeof s->tokenizer_path, "%s", path);
    if (tokenizer_vocab_size(s->tok) > (size_t)s->cfg.model.vocab_size)
        fail_input("tokenizer '%s' has %zu tokens and the model's vocabulary %d: it is not this model's tokenizer; "
                   "give the right one with --tokenizer FILE",
                   path, tokenizer_vocab_size(s->tok), s->cfg.model.vocab_size);
    if (!s->n_eos && tokenizer_eos_id(s->tok) >= 0)
        s->eos[s->n_eos++] = tokenizer_eos_id(s->tok);
}

/* Resolves MODEL into the config's JSON; a checkpoint stays open in *r. */
static json_t *resolve_model(struct infer *s, const struct infer_options *o, struct ckpt_reader **r)
{
    char cfgpath[4200];
    snprintf(cfgpath, sizeof cfgpath, "%s/config.json", o->model);
    if (is_dir(o->model) && readable(cfgpath)) {
        snprintf(s->hf_dir, sizeof s->hf_dir, "%s", o->model);
        json_t *doc = json_pack("{s{ss}}", "model", "from_pretrained", o->model);
        if (s->sess.world > 1)
            json_object_set_new(doc, "zero_optimization", json_pack("{si}", "stage", 3));
        return doc;
    }
    if (access(o->model, F_OK) != 0)
        fail_input("MODEL '%s' does not exist: give a Hugging Face directory (config.json and safetensors), a "
                   "checkpoint file or a run's checkpoint.dir",
                   o->model);
    hf_refuse_gguf(o->model, "MODEL");
    char *path = ckpt_resolve(o->model, o->model);
    if (!path)
        fail_input("MODEL '%s' holds no checkpoint and no config.json: give a Hugging Face directory, a checkpoint "
                   "file or a run's checkpoint.dir",
                   o->model);
    snprintf(s->ckpt_path, sizeof s->ckpt_path, "%s", path);
    free(path);
    *r = ckpt_open(s->ckpt_path);
    char base[1024];
    json_t *doc = ckpt_run_infer_config(*r, s->ckpt_path, base, sizeof base);
    s->lora_ckpt = ckpt_has_attr(*r, "base_checksum");
    const char *dir = o->base ? o->base : base;
    if (o->base && !s->lora_ckpt)
        fail_input("--base '%s': checkpoint '%s' holds a whole model, not LoRA adapters; drop --base", o->base,
                   s->ckpt_path);
    if (dir[0]) {
        snprintf(cfgpath, sizeof cfgpath, "%s/config.json", dir);
        if (readable(cfgpath))
            snprintf(s->hf_dir, sizeof s->hf_dir, "%s", dir);
        else if (s->lora_ckpt)
            fail_input("the base of LoRA checkpoint '%s', '%s', is not a Hugging Face directory (no config.json "
                       "there): give the base it was trained on with --base DIR",
                       s->ckpt_path, dir);
    }
    return doc;
}

/* The run's config from the checkpoint's document (which the config takes), its model and tokenizer; a
 * failure on any rank is reported once, by the lowest. */
static void read_config(struct infer *s, json_t *doc, const struct infer_options *o, struct comm *comm)
{
    struct fail_trap trap;
    if (FAIL_TRAP(&trap) == 0) {
        run_config_load_json(&s->cfg, doc, o->sets, o->n_sets);
        model_build(&s->sess.model, &s->cfg.model);
        model_add_lora(&s->sess.model, &s->cfg.lora);
        if (s->hf_dir[0])
            read_eos(s, s->hf_dir);
        find_tokenizer(s, o);
    }
    fail_untrap();
    comm_agree_failure(comm, &trap);
}

void infer_open(struct infer *s, struct comm *comm, const struct infer_options *o)
{
    memset(s, 0, sizeof *s);
    session_init(&s->sess, comm, &s->cfg);
    struct ckpt_reader *r = NULL;
    json_t *doc = resolve_model(s, o, &r);
    if (r)
        ckpt_close(r);
    json_t *data = json_object_get(doc, "data");
    /* a length given here (eval --seq-len, --set) replaces the checkpoint's under either of its two names */
    bool own_length = o->seq_len > 0;
    for (int i = 0; i < o->n_sets; i++)
        own_length |= strncmp(o->sets[i], "data.seq_len=", 13) == 0 ||
                      strncmp(o->sets[i], "data.max_seq_length=", 20) == 0;
    if (data && own_length) {
        json_object_del(data, "seq_len");
        json_object_del(data, "max_seq_length");
    }
    if (o->data) {
        if (!data)
            json_object_set_new(doc, "data", data = json_object());
        json_object_set_new(data, "train", json_string(o->data));
    }
    read_config(s, doc, o, comm);
    backend_init(s->cfg.train.threads);
    backend_attach_comm(comm);
    backend_set_act_dtype(backend_is_device() ? s->cfg.dtype : DTYPE_F32);
}

void infer_require_tokenizer(const struct infer *s, const char *model, const char *why)
{
    if (s->tok || s->cfg.model.vocab_size <= 256)
        return;
    fail_input("no tokenizer for MODEL '%s' (%s), and %s: give its tokenizer.json with --tokenizer FILE", model,
               s->hf_dir[0] ? "its Hugging Face directory has no tokenizer.json"
                            : "a checkpoint of a run that did not start from a Hugging Face directory",
               why);
}

/* ---- the weights ------------------------------------------------------------------------ */

/* Reads the weights: a Hugging Face directory, a whole-model checkpoint, or
 * a LoRA checkpoint's adapters over its base (checked against its checksum). */
static void load_weights(struct infer *s)
{
    struct hf_source hf;
    const bool from_hf = s->hf_dir[0] && (!s->ckpt_path[0] || s->lora_ckpt);
    const char *key;
    long long have, want;
    if (s->lora_ckpt && from_hf && hf_config_differs(&s->sess.model, s->hf_dir, &key, &have, &want) > 0)
        fail_input("the base '%s' is another model than LoRA checkpoint '%s' was trained on: its config.json has %s "
                   "%lld, the checkpoint's model %lld; give the base it was trained on with --base DIR",
                   s->hf_dir, s->ckpt_path, key, have, want);
    if (from_hf)
        hf_source_open(&hf, &s->sess.model, s->hf_dir);
    struct ckpt_reader *r = s->ckpt_path[0] ? ckpt_open(s->ckpt_path) : NULL;
    struct ckpt_run_source cs = {&s->sess.model, r};
    struct param_source hf_src = {hf_source_read, hf_source_read_as, &hf, hf_source_read_q4}, ck_src = {ckpt_run_source_read, NULL, &cs, NULL};
    const struct param_source *first = from_hf ? &hf_src : r && !s->lora_ckpt ? &ck_src : NULL;
    struct session_base base; /* a 4-bit base: the quantized values are the base (and its checksum) */
    if (first != &ck_src)
        first = session_base_source(&s->sess, first, &base);
    else
        memset(&base, 0, sizeof base);
    struct base_hash hash; /* a LoRA checkpoint's base: its checksum as read (zero.h) */
    zero_hash_source(&hash, &s->sess.model, s->sess.model.n_base_units, first);
    if (s->lora_ckpt)
        first = &hash.src;
    session_load(&s->sess, first);
    session_base_free(&base);
    if (from_hf)
        hf_source_close(&hf);
    if (s->lora_ckpt) {
        char sum[24];
        snprintf(sum, sizeof sum, "%016llx",
                 (unsigned long long)zero_hash_total(&hash, s->sess.comm, s->sess.rank, s->sess.world));
        char *want = ckpt_attr_str(r, "base_checksum"), *source = ckpt_attr_str(r, "base_source");
        if (strcmp(sum, want) != 0)
            fail_input("LoRA checkpoint '%s' was trained on another base: %s (checksum %s), and the base read here is "
                       "%s (checksum %s); give the base it was trained on with --base DIR",
                       s->ckpt_path, source, want, s->hf_dir[0] ? s->hf_dir : "the run's seeded init", sum);
        free(want);
        free(source);
        /* the adapters and modules_to_save: the units the run trained (model_add_lora's choice) */
        zero_load_units(&s->sess.zero, &ck_src, s->trained);
    }
    if (r)
        ckpt_close(r);
}

void infer_start(struct infer *s, const struct infer_options *o, int B, int T, int Tmax)
{
    (void)o;
    struct config *cfg = &s->cfg;
    const struct session_shape shape = {B, T, Tmax};
    struct fail_trap trap;
    if (FAIL_TRAP(&trap) == 0) {
        cfg->micro_batch = B;
        cfg->grad_accum = 1;
        cfg->train_batch_size = B * s->sess.world;
        cfg->data.seq_len = T;
        /* forward only: one set of block activations, the block inputs kept */
        cfg->act_ckpt.enabled = true;
        cfg->act_ckpt.interval = 1;
        s->trained = xcalloc((size_t)s->sess.model.n_units, sizeof *s->trained);
        for (int u = 0; u < s->sess.model.n_units; u++)
            s->trained[u] = !s->sess.model.units[u].frozen;
        model_freeze_all(&s->sess.model);
        session_plan(&s->sess, &shape);
    }
    fail_untrap();
    comm_agree_failure(s->sess.comm, &trap);
    load_weights(s);
    session_acts(&s->sess, &shape);
}

void infer_close(struct infer *s)
{
    session_close(&s->sess);
    free(s->trained);
    if (s->tok)
        tokenizer_free(s->tok);
    config_free(&s->cfg);
    memset(s, 0, sizeof *s);
}
