#include "hf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/hf_json.h"
#include "core/util.h"
#include "model/arch.h"

/* ---- config.json ------------------------------------------------------------------- */

void hf_refuse_gguf(const char *path, const char *what)
{
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
        return;
    char magic[4] = {0};
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(magic, 1, sizeof magic, f) : 0;
    if (f)
        fclose(f);
    if (got == 4 && memcmp(magic, "GGUF", 4) == 0)
        fail_input("%s '%s' is a GGUF file (llama.cpp), not a Hugging Face directory; convert it once with "
                   "tools/gguf_to_hf.py '%s' DIR and give DIR",
                   what, path, path);
}

/* A GGUF file or another file given where a model directory belongs: named,
 * with what to do, before config.json is looked for. */
static void refuse_model_file(const char *dir)
{
    struct stat sb;
    if (stat(dir, &sb) != 0 || S_ISDIR(sb.st_mode))
        return;
    hf_refuse_gguf(dir, "model.from_pretrained");
    fail_input("model.from_pretrained '%s' is a file, not a directory; give the Hugging Face model directory "
               "(config.json and its .safetensors files)",
               dir);
}

static json_t *load_config_json(const char *dir, char *path, size_t cap)
{
    refuse_model_file(dir);
    snprintf(path, cap, "%s/config.json", dir);
    const char *kind = util_irregular(path);
    if (kind)
        fail_input("model.from_pretrained: '%s' is %s, not a file; give a Hugging Face model directory (config.json "
                   "and its .safetensors files)",
                   path, kind);
    json_error_t err;
    char why[300];
    json_t *root = hf_json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        fail_input("model.from_pretrained: cannot read '%s': %s; give a Hugging Face model directory "
                   "(config.json and its .safetensors files)",
                   path, hf_json_why(&err, why, sizeof why));
    if (!json_is_object(root))
        fail_input("model.from_pretrained: '%s' is not a JSON object", path);
    return root;
}

/* An integer field; def < 0: required. */
static long long int_field(json_t *root, const char *path, const char *key, long long def)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (def < 0)
            fail_input("%s: '%s' is missing; shardlm needs it to lay out the model", path, key);
        return def;
    }
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > (1ll << 31))
        fail_input("%s: '%s' must be a positive integer", path, key);
    return json_integer_value(v);
}

static double num_field(json_t *root, const char *path, const char *key, double def)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v))
        return def;
    double x;
    if (!hf_json_number(v, &x))
        fail_input("%s: '%s' must be a number", path, key);
    return x;
}

static int bool_field(json_t *root, const char *path, const char *key, int def)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v))
        return def;
    if (!json_is_boolean(v))
        fail_input("%s: '%s' must be true or false", path, key);
    return json_is_true(v);
}

static const char *str_field(json_t *root, const char *key, const char *def)
{
    json_t *v = json_object_get(root, key);
    return v && json_is_string(v) ? json_string_value(v) : def;
}

/* The architecture: architectures[0], else from model_type. */
static const char *architecture(json_t *root, const char *path)
{
    json_t *a = json_object_get(root, "architectures");
    if (json_is_array(a) && json_array_size(a) > 0 && json_is_string(json_array_get(a, 0)))
        return json_string_value(json_array_get(a, 0));
    const char *type = str_field(root, "model_type", NULL);
    const char *named = type ? arch_hf_architecture_of(type) : NULL;
    if (named)
        return named;
    fail_input("%s: no 'architectures' and model_type '%s'; shardlm reads %s", path, type ? type : "(none)",
               HF_ARCHITECTURES);
}

static void llama_keys(json_t *root, const char *path, void (*put)(void *, const char *, json_t *), void *ctx,
                       int *sliding_window)
{
    const char *act = str_field(root, "hidden_act", "silu");
    if (strcmp(act, "silu") != 0)
        fail_input("%s: hidden_act is \"%s\"; shardlm's Llama MLP is SwiGLU (silu)", path, act);
    if (bool_field(root, path, "attention_bias", 0) || bool_field(root, path, "mlp_bias", 0))
        fail_input("%s: attention_bias / mlp_bias is true; shardlm's Llama has no biases", path);
    long long C = int_field(root, path, "hidden_size", -1), NH = int_field(root, path, "num_attention_heads", -1);
    long long hd = int_field(root, path, "head_dim", C / NH);
    if (hd * NH != C)
        fail_input("%s: head_dim %lld x num_attention_heads %lld != hidden_size %lld; shardlm needs head_dim = "
                   "hidden_size / num_attention_heads",
                   path, hd, NH, C);
    put(ctx, "type", json_string(arch_get(ARCH_LLAMA)->type));
    put(ctx, "n_layer", json_integer(int_field(root, path, "num_hidden_layers", -1)));
    put(ctx, "n_head", json_integer(NH));
    put(ctx, "n_kv_head", json_integer(int_field(root, path, "num_key_value_heads", NH)));
    put(ctx, "n_embd", json_integer(C));
    put(ctx, "ffn_dim", json_integer(int_field(root, path, "intermediate_size", -1)));
    put(ctx, "n_positions", json_integer(int_field(root, path, "max_position_embeddings", -1)));
    put(ctx, "vocab_size", json_integer(int_field(root, path, "vocab_size", -1)));
    static const char *const defaulted[] = {"rms_norm_eps", "rope_theta", "tie_word_embeddings"};
    for (int i = 0; i < 3; i++)
        if (!json_object_get(root, defaulted[i]))
            log_info("%s has no %s: transformers' LlamaConfig default, %s", path, defaulted[i],
                     i == 0 ? "1e-6" : i == 1 ? "10000" : "false (an lm_head.weight of its own)");
    put(ctx, "rms_norm_eps", json_real(num_field(root, path, "rms_norm_eps", 1e-6))); /* LlamaConfig's default */
    put(ctx, "rope_theta", json_real(num_field(root, path, "rope_theta", 10000.0)));
    put(ctx, "tie_word_embeddings", json_boolean(bool_field(root, path, "tie_word_embeddings", 0)));
    json_t *rs = json_object_get(root, "rope_scaling");
    if (rs && !json_is_null(rs))
        put(ctx, "rope_scaling", json_deep_copy(rs));
    *sliding_window = (int)int_field(root, path, "sliding_window", 0);
}

static void gpt2_keys(json_t *root, const char *path, void (*put)(void *, const char *, json_t *), void *ctx)
{
    const char *act = str_field(root, "activation_function", "gelu_new");
    if (strcmp(act, "gelu_new") != 0 && strcmp(act, "gelu_pytorch_tanh") != 0)
        fail_input("%s: activation_function is \"%s\"; shardlm's GPT-2 uses the tanh GELU (gelu_new)", path, act);
    double eps = num_field(root, path, "layer_norm_epsilon", 1e-5);
    if (fabs(eps - 1e-5) > 1e-12)
        fail_input("%s: layer_norm_epsilon is %g; shardlm's GPT-2 LayerNorm uses 1e-5", path, eps);
    long long C = int_field(root, path, "n_embd", -1);
    json_t *inner = json_object_get(root, "n_inner");
    if (inner && !json_is_null(inner) && (!json_is_integer(inner) || json_integer_value(inner) != 4 * C))
        fail_input("%s: n_inner is not 4 n_embd; shardlm's GPT-2 MLP is 4 n_embd wide", path);
    if (bool_field(root, path, "scale_attn_by_inverse_layer_idx", 0) || bool_field(root, path, "reorder_and_upcast_attn", 0) ||
        !bool_field(root, path, "scale_attn_weights", 1))
        fail_input("%s: GPT-2 attention variants (scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn, "
                   "scale_attn_weights false) are not supported",
                   path);
    put(ctx, "type", json_string(arch_get(ARCH_GPT2)->type));
    put(ctx, "n_layer", json_integer(int_field(root, path, "n_layer", -1)));
    put(ctx, "n_head", json_integer(int_field(root, path, "n_head", -1)));
    put(ctx, "n_embd", json_integer(C));
    put(ctx, "n_positions", json_integer(int_field(root, path, "n_positions", int_field(root, path, "n_ctx", 1024))));
    put(ctx, "vocab_size", json_integer(int_field(root, path, "vocab_size", -1)));
}

void hf_config_keys(const char *dir, void (*put)(void *ctx, const char *key, json_t *value), void *ctx,
                    int *sliding_window)
{
    char path[1100];
    json_t *root = load_config_json(dir, path, sizeof path);
    const char *arch = architecture(root, path);
    *sliding_window = 0;
    const struct arch *family = arch_find_hf(arch);
    if (family && family->id == ARCH_LLAMA)
        llama_keys(root, path, put, ctx, sliding_window);
    else if (family && family->id == ARCH_GPT2)
        gpt2_keys(root, path, put, ctx);
    else
        fail_input("%s: architecture %s is not supported; shardlm reads %s", path, arch, HF_ARCHITECTURES);
    json_decref(root);
}

static const char *torch_dtype(enum dtype dt)
{
    return dt == DTYPE_BF16 ? "bfloat16" : dt == DTYPE_F16 ? "float16" : "float32";
}

json_t *hf_config_json(const struct model *m, enum dtype dt, const char *src_dir)
{
    const struct model_config *c = &m->cfg;
    json_t *out = NULL;
    if (src_dir && src_dir[0]) {
        char path[1100];
        snprintf(path, sizeof path, "%s/config.json", src_dir);
        out = util_irregular(path) ? NULL : hf_json_load_file(path, 0, NULL);
    }
    if (!json_is_object(out)) {
        json_decref(out);
        out = json_object();
    }
    bool llama = arch_is(c->type, ARCH_LLAMA);
    const struct arch *family = arch_get(llama ? ARCH_LLAMA : ARCH_GPT2);
    if (llama) {
        if (!json_object_get(out, "architectures")) {
            json_object_set_new(out, "architectures", json_pack("[s]", family->hf_architectures[0]));
            json_object_set_new(out, "model_type", json_string(family->hf_model_types[0]));
        }
        json_object_set_new(out, "hidden_size", json_integer(c->n_embd));
        json_object_set_new(out, "num_hidden_layers", json_integer(c->n_layer));
        json_object_set_new(out, "num_attention_heads", json_integer(c->n_head));
        json_object_set_new(out, "num_key_value_heads", json_integer(c->n_kv_head));
        json_object_set_new(out, "intermediate_size", json_integer(c->ffn_dim));
        json_object_set_new(out, "max_position_embeddings", json_integer(c->n_positions));
        json_object_set_new(out, "vocab_size", json_integer(c->vocab_size));
        json_object_set_new(out, "rms_norm_eps", json_real(c->norm_eps));
        json_object_set_new(out, "rope_theta", json_real(c->rope_theta));
        json_object_set_new(out, "tie_word_embeddings", json_boolean(c->tied_head));
        json_object_set_new(out, "hidden_act", json_string("silu"));
        json_object_set_new(out, "attention_bias", json_false());
        if (c->rope_scaling.type == ROPE_SCALING_LLAMA3)
            json_object_set_new(out, "rope_scaling",
                                json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor",
                                          c->rope_scaling.factor, "low_freq_factor", c->rope_scaling.low_freq_factor,
                                          "high_freq_factor", c->rope_scaling.high_freq_factor,
                                          "original_max_position_embeddings", c->rope_scaling.original_max_positions));
        else
            json_object_set_new(out, "rope_scaling", json_null());
    } else {
        json_object_set_new(out, "architectures", json_pack("[s]", family->hf_architectures[0]));
        json_object_set_new(out, "model_type", json_string(family->hf_model_types[0]));
        json_object_set_new(out, "n_embd", json_integer(c->n_embd));
        json_object_set_new(out, "n_layer", json_integer(c->n_layer));
        json_object_set_new(out, "n_head", json_integer(c->n_head));
        json_object_set_new(out, "n_positions", json_integer(c->n_positions));
        json_object_set_new(out, "n_ctx", json_integer(c->n_positions));
        json_object_set_new(out, "vocab_size", json_integer(c->vocab_size));
        json_object_set_new(out, "activation_function", json_string("gelu_new"));
        json_object_set_new(out, "layer_norm_epsilon", json_real(1e-5));
        json_object_set_new(out, "tie_word_embeddings", json_true());
    }
    json_object_set_new(out, "torch_dtype", json_string(torch_dtype(dt)));
    return out;
}

/* The shape fields that say which model a config.json describes. */
static const char *const shape_keys[] = {"hidden_size", "num_hidden_layers", "num_attention_heads",
                                         "num_key_value_heads", "intermediate_size", "vocab_size",
                                         "n_embd", "n_layer", "n_head"};

int hf_config_differs(const struct model *m, const char *dir, const char **key, long long *have, long long *want)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *file = util_irregular(path) ? NULL : hf_json_load_file(path, 0, NULL);
    if (!json_is_object(file)) {
        json_decref(file);
        return -1;
    }
    json_t *model = hf_config_json(m, DTYPE_F32, NULL);
    int differs = 0;
    for (size_t i = 0; !differs && i < sizeof shape_keys / sizeof shape_keys[0]; i++) {
        json_t *a = json_object_get(file, shape_keys[i]), *b = json_object_get(model, shape_keys[i]);
        if (b && (!a || !json_equal(a, b))) {
            differs = 1;
            *key = shape_keys[i];
            *have = a ? (long long)json_integer_value(a) : -1LL;
            *want = (long long)json_integer_value(b);
        }
    }
    json_decref(file);
    json_decref(model);
    return differs;
}

/* ---- tensor names --------------------------------------------------------------------- */

void hf_tensor_name(const struct model *m, const struct tensor_desc *t, int prefix, char *out, size_t cap)
{
    bool gpt2 = arch_is(m->cfg.type, ARCH_GPT2);
    snprintf(out, cap, "%s%s", gpt2 && prefix ? "transformer." : "", t->name);
}

/* ---- the parameter source --------------------------------------------------------------- */

static const struct st_tensor *find_tensor(const struct hf_source *s, const struct tensor_desc *t)
{
    char name[ST_MAX_NAME + 16];
    hf_tensor_name(s->m, t, 0, name, sizeof name);
    const struct st_tensor *st = st_find(&s->st, name);
    if (!st) {
        hf_tensor_name(s->m, t, 1, name, sizeof name);
        st = st_find(&s->st, name);
    }
    return st;
}

/* Whether a tensor the model does not read is one transformers does not load
 * either: GPT-2's causal-mask buffers, Llama's rotary frequencies, or an LM
 * head stored beside the embedding it is tied to. */
static bool ignorable_tensor(const struct model *m, const char *name)
{
    static const char *const ends[] = {".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq"};
    const size_t len = strlen(name);
    for (size_t k = 0; k < sizeof ends / sizeof ends[0]; k++)
        if (len >= strlen(ends[k]) && strcmp(name + len - strlen(ends[k]), ends[k]) == 0)
            return true;
    return m->cfg.tied_head && strcmp(name, "lm_head.weight") == 0;
}

/* Every tensor of the files must be one the model reads: weights of layers
 * config.json does not count (num_hidden_layers below the files') would
 * otherwise be dropped without a word. */
static void refuse_unused_tensors(const struct hf_source *s, const char *dir)
{
    bool *used = xcalloc((size_t)s->st.n_tensors + 1, sizeof *used);
    for (int u = 0; u < s->m->n_units; u++)
        for (int i = 0; i < s->m->units[u].n_tensors; i++)
            if (s->map[u][i])
                used[s->map[u][i] - s->st.tensors] = true;
    char list[512] = "";
    int n = 0;
    for (int k = 0; k < s->st.n_tensors; k++)
        if (!used[k] && !ignorable_tensor(s->m, s->st.tensors[k].name) && n++ < 3) {
            size_t len = strlen(list);
            snprintf(list + len, sizeof list - len, "%s'%s'", len ? ", " : "", s->st.tensors[k].name);
        }
    free(used);
    if (n)
        fail_input("model.from_pretrained '%s': %d tensor%s of its .safetensors files the model of its config.json "
                   "does not use (%s%s): config.json and the weights do not match (num_hidden_layers?); fix "
                   "config.json or the files",
                   dir, n, n == 1 ? "" : "s", list, n > 3 ? ", ..." : "");
}

void hf_source_open(struct hf_source *s, const struct model *m, const char *dir)
{
    memset(s, 0, sizeof *s);
    s->m = m;
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    st_open(&s->st, dir);
    s->map = xcalloc((size_t)m->n_units, sizeof *s->map);
    for (int u = 0; u < m->n_units; u++) {
        const struct unit_desc *ud = &m->units[u];
        s->map[u] = xcalloc((size_t)ud->n_tensors, sizeof *s->map[u]);
        for (int i = 0; i < ud->n_tensors && !model_is_adapter(m, u); i++) {
            const struct tensor_desc *t = &ud->tensors[i];
            const struct st_tensor *st = find_tensor(s, t);
            if (!st)
                fail_input("model.from_pretrained '%s': tensor '%s' is in no .safetensors file of the directory; "
                           "the checkpoint does not match its config.json",
                           dir, t->name);
            /* (out, in) or (in, out) as stored; the embedding and LM head without the vocabulary padding */
            int64_t want0 = t->rows_valid, want1 = t->ndim == 2 ? t->shape[1] : 0;
            bool ok = st->ndim == t->ndim && st->shape[0] == want0 && (t->ndim == 1 || st->shape[1] == want1);
            if (!ok)
                fail_input("%s: tensor '%s' has shape [%lld%s%lld]; config.json gives [%lld%s%lld]",
                           s->st.paths[st->file], st->name, (long long)st->shape[0], st->ndim > 1 ? ", " : "",
                           st->ndim > 1 ? (long long)st->shape[1] : 0LL, (long long)want0, t->ndim > 1 ? ", " : "",
                           t->ndim > 1 ? (long long)want1 : 0LL);
            s->map[u][i] = st;
        }
    }
    refuse_unused_tensors(s, dir);
}

void hf_source_close(struct hf_source *s)
{
    for (int u = 0; s->map && u < s->m->n_units; u++)
        free(s->map[u]);
    free(s->map);
    st_close(&s->st);
    memset(s, 0, sizeof *s);
}

/* Walks unit u's elements [begin, begin + count) in order: the file's rows of
 * each tensor go to read(t, first element in t, count, index into out), the
 * rest (alignment gaps, padded rows, unit padding) to zero(index, count). */
static void walk_range(const struct hf_source *s, int u, size_t begin, size_t count,
                       void (*read)(void *, const struct st_tensor *, size_t, size_t, size_t),
                       void (*zero)(void *, size_t, size_t), void *ctx)
{
    const struct unit_desc *ud = &s->m->units[u];
    const size_t end = begin + count;
    size_t pos = begin;
    for (int i = 0; i < ud->n_tensors; i++) {
        const struct tensor_desc *t = &ud->tensors[i];
        size_t valid = (size_t)t->rows_valid * (size_t)t->shape[1];
        size_t lo = t->offset > pos ? t->offset : pos;
        size_t hi = t->offset + valid < end ? t->offset + valid : end;
        if (!s->map[u][i] || lo >= hi)
            continue;
        if (lo > pos)
            zero(ctx, pos - begin, lo - pos);
        read(ctx, s->map[u][i], lo - t->offset, hi - lo, lo - begin);
        pos = hi;
    }
    if (pos < end)
        zero(ctx, pos - begin, end - pos);
}

struct read_ctx {
    struct hf_source *s;
    void *out;
    size_t esize; /* of an element of out */
    void (*landed)(void *, size_t); /* hf_source_read_as's progress, or NULL */
    void *landed_ctx;
    size_t at;    /* where in out the tensor being read starts */
};

static void landed_in_tensor(void *c, size_t k)
{
    struct read_ctx *r = c;
    r->landed(r->landed_ctx, r->at + k);
}

/* A NaN or Inf weight is named here: the first step would otherwise report
 * a non-finite loss and advise a lower learning rate. */
static void check_finite(const struct read_ctx *r, const struct st_tensor *t, const void *x, enum dtype dt, size_t n)
{
    if (!dtype_all_finite(x, dt, n))
        fail_input("%s: tensor '%s' holds NaN or Inf values; the weights are damaged (download or convert them again)",
                   r->s->st.paths[t->file], t->name);
}

static void read_f32(void *c, const struct st_tensor *t, size_t first, size_t n, size_t at)
{
    struct read_ctx *r = c;
    st_read(&r->s->st, t, first, n, (float *)r->out + at);
    check_finite(r, t, (float *)r->out + at, DTYPE_F32, n);
}

static void read_raw(void *c, const struct st_tensor *t, size_t first, size_t n, size_t at)
{
    struct read_ctx *r = c;
    r->at = at;
    st_read_raw(&r->s->st, t, first, n, (char *)r->out + at * r->esize, r->landed ? landed_in_tensor : NULL, r);
    check_finite(r, t, (char *)r->out + at * r->esize, t->dtype, n);
}

static void zero_out(void *c, size_t at, size_t n)
{
    struct read_ctx *r = c;
    memset((char *)r->out + at * r->esize, 0, n * r->esize);
    if (r->landed)
        r->landed(r->landed_ctx, at + n);
}

void hf_source_read(void *source, int u, size_t begin, size_t count, float *out)
{
    const struct hf_source *s = source;
    if (model_is_adapter(s->m, u)) { /* LoRA's adapters are not in the base model's files: their init */
        model_init_range(s->m, u, begin, count, out);
        return;
    }
    struct read_ctx r = {source, out, sizeof(float), NULL, NULL, 0};
    walk_range(source, u, begin, count, read_f32, zero_out, &r);
}

bool hf_source_read_as(void *source, int u, size_t begin, size_t count, enum dtype dt, void *out,
                       void (*landed)(void *ctx, size_t elems), void *ctx)
{
    struct hf_source *s = source;
    if (model_is_adapter(s->m, u))
        return false;
    for (int i = 0; i < s->m->units[u].n_tensors; i++)
        if (s->map[u][i] && s->map[u][i]->dtype != dt)
            return false;
    struct read_ctx r = {s, out, (size_t)dtype_size(dt), landed, ctx, 0};
    walk_range(s, u, begin, count, read_raw, zero_out, &r);
    return true;
}

double hf_source_bytes(const struct hf_source *s)
{
    double total = 0;
    for (int u = 0; u < s->m->n_units; u++)
        for (int i = 0; i < s->m->units[u].n_tensors; i++)
            if (s->map[u][i])
                total += (double)s->map[u][i]->numel * dtype_size(s->map[u][i]->dtype);
    return total;
}

/* ---- tokenizer files ------------------------------------------------------------------- */

static void copy_file(const char *src, const char *dst)
{
    int in = util_irregular(src) ? -1 : open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return; /* absent (or a FIFO, ...): nothing to copy */
    char tmp[2200];
    snprintf(tmp, sizeof tmp, "%s.tmp", dst);
    int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0)
        fail_input("cannot write '%s': %s", tmp, strerror(errno));
    char buf[1 << 16];
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)n) != n)
            fail_input("cannot write '%s': %s", tmp, strerror(errno));
    if (n < 0 || fsync(out) != 0 || close(out) != 0)
        fail_input("cannot copy '%s' to '%s': %s", src, tmp, strerror(errno));
    close(in);
    if (rename(tmp, dst) != 0)
        fail_input("cannot rename '%s' to '%s': %s", tmp, dst, strerror(errno));
}

void hf_copy_tokenizer(const char *src_dir, const char *dst_dir)
{
    /* chat_template.jinja and additional_chat_templates/ hold the chat templates of a tokenizer that
     * transformers 5 saved (no longer in tokenizer_config.json); chat_template.json a processor's. */
    static const char *const files[] = {"tokenizer.json",      "tokenizer_config.json", "special_tokens_map.json",
                                        "tokenizer.model",     "generation_config.json", "vocab.json",
                                        "merges.txt",          "chat_template.jinja",   "chat_template.json"};
    static const char named_dir[] = "additional_chat_templates";
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char src[2100], dst[2100];
        snprintf(src, sizeof src, "%s/%s", src_dir, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dst_dir, files[i]);
        copy_file(src, dst);
    }
    char src[2100], dst[2100];
    snprintf(src, sizeof src, "%s/%s", src_dir, named_dir);
    DIR *named = opendir(src);
    if (!named)
        return; /* none: nothing to copy */
    snprintf(dst, sizeof dst, "%s/%s", dst_dir, named_dir);
    if (mkdir(dst, 0755) != 0 && errno != EEXIST)
        fail_input("cannot make '%s': %s", dst, strerror(errno));
    for (struct dirent *e; (e = readdir(named));) {
        const size_t len = strlen(e->d_name);
        if (len <= 6 || strcmp(e->d_name + len - 6, ".jinja") != 0) /* what transformers reads there */
            continue;
        char src_file[2400], dst_file[2400];
        snprintf(src_file, sizeof src_file, "%s/%s", src, e->d_name);
        snprintf(dst_file, sizeof dst_file, "%s/%s", dst, e->d_name);
        copy_file(src_file, dst_file);
    }
    closedir(named);
}
