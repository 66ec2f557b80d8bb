/*
 * config_shardlm — shardlm's own sections: model (presets, from_pretrained,
 * the shape and its bounds, the Llama keys), data, train and checkpoint.
 * model.from_pretrained is recorded here; the keys of the directory's
 * config.json come from the caller (config_put_pretrained, config.h).
 */
#include "config_internal.h"
#include "model/arch.h"
#include "model/model.h"
#include "data/samples.h"

#include "core/util.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- defaults ---------------------------------------------------------- */

/* GPT-2 124M (Radford et al. 2019; HF "gpt2"). */
#define MODEL_N_LAYER_DEFAULT 12
#define MODEL_N_HEAD_DEFAULT 12
#define MODEL_N_EMBD_DEFAULT 768
#define MODEL_N_POSITIONS_DEFAULT 1024
#define MODEL_VOCAB_SIZE_DEFAULT 50257
#define MODEL_INIT_STD_DEFAULT 0.02 /* GPT-2's initializer_range */
#define MODEL_INIT_SEED_DEFAULT 1337

#define TRAIN_STEPS_DEFAULT 100
#define TRAIN_SEED_DEFAULT 1337
#define TRAIN_EVAL_BATCHES_DEFAULT 4
#define CHECKPOINT_KEEP_DEFAULT 2

static void check_model_sizes(const struct model_config *m, bool gpt2)
{
    char keys[256];
    if (m->n_layer > CONFIG_MAX_LAYERS)
        fail_input("config: 'model.n_layer' is %d, more than the %d layers shardlm allows", m->n_layer,
                   CONFIG_MAX_LAYERS);
    const long long hs = m->head_dim > 0 ? m->head_dim : m->n_embd / m->n_head;
    const long long C = m->n_embd, F = m->ffn_dim, KV = hs * m->n_kv_head;
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

/* ---- sections ---------------------------------------------------------- */

/* Hugging Face's rope_scaling: type "llama3" or "linear" (null, absent or "default": none). */
/* A longrope factor list: rotary_dim / 2 numbers > 0 (head_dim / 2 without a partial rotary). */
static int read_factors(json_t *root, const char *key, int want, double *out)
{
    char path[64];
    snprintf(path, sizeof path, "model.rope_scaling.%s", key);
    json_t *a = doc_get(root, path);
    if (!json_is_array(a) || (int)json_array_size(a) != want)
        fail_input("config: '%s' must be a list of %d numbers (the rotated channels / 2), as longrope has one per "
                   "channel pair", path, want);
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) {
        double x = json_number_value(v);
        if (!json_is_number(v) || !(x > 0) || !isfinite(x))
            fail_input("config: '%s[%zu]' must be a number > 0", path, i);
        out[i] = x;
    }
    return want;
}

/* Phi-3's longrope: the short factors (rows whose positions stay within original_max_position_embeddings), the
 * long ones (rows reaching past it: families/llama.c llama_prepare), and the cos/sin scale, all as io/hf_config.c
 * resolved them. */
static void read_longrope(struct model_config *m, json_t *root)
{
    struct rope_scaling *r = &m->rope_scaling;
    const int half = (int)(m->head_dim * m->partial_rotary) / 2;
    if (half > ROPE_MAX_FACTORS)
        fail_input("config: longrope over %d channel pairs: at most %d are implemented", half, ROPE_MAX_FACTORS);
    r->type = ROPE_SCALING_LONGROPE;
    r->n_factors = read_factors(root, "short_factor", half, r->short_factor);
    read_factors(root, "long_factor", half, r->long_factor);
    r->attention_factor = read_num(root, "model.rope_scaling.attention_factor", 1.0, NO_FILL);
    r->original_max_positions = read_int(root, "model.rope_scaling.original_max_position_embeddings", 0, NO_FILL);
    if (!(r->attention_factor > 0) || !isfinite(r->attention_factor))
        fail_input("config: 'model.rope_scaling.attention_factor' must be a number > 0");
    require_positive("model.rope_scaling.original_max_position_embeddings", r->original_max_positions);
}

static void read_rope_scaling(struct model_config *m, json_t *root)
{
    if (!is_given(root, "model.rope_scaling"))
        return;
    const char *type = read_str(root, "model.rope_scaling.rope_type", NULL, NO_FILL);
    if (!type)
        type = read_str(root, "model.rope_scaling.type", NULL, NO_FILL);
    if (!type || strcmp(type, "default") == 0)
        return;
    if (strcmp(type, "llama3") != 0 && strcmp(type, "linear") != 0 && strcmp(type, "longrope") != 0)
        fail_input("config: 'model.rope_scaling.rope_type' is \"%s\"; supported: \"llama3\" (Llama 3.1), \"linear\", "
                   "\"longrope\" (Phi-3), or null for none",
                   type);
    struct rope_scaling *r = &m->rope_scaling;
    if (strcmp(type, "longrope") == 0) {
        read_longrope(m, root);
        return;
    }
    if (strcmp(type, "linear") == 0) {
        r->type = ROPE_SCALING_LINEAR;
        r->factor = read_num(root, "model.rope_scaling.factor", 1.0, NO_FILL);
        if (!is_given(root, "model.rope_scaling.factor") || !(r->factor >= 1.0) || !isfinite(r->factor))
            fail_input("config: 'model.rope_scaling.factor' of a \"linear\" rope_scaling must be given, at least 1");
        return;
    }
    r->type = ROPE_SCALING_LLAMA3;
    /* transformers 5 refuses a llama3 scaling without these three (a KeyError naming them), as 4.43+ did: taking
     * Llama 3.1's values instead would compute another model without a word (issue 46) */
    static const char *const needed[] = {"factor", "low_freq_factor", "high_freq_factor"};
    char missing[128] = "";
    for (size_t i = 0; i < sizeof needed / sizeof needed[0]; i++) {
        char key[64];
        snprintf(key, sizeof key, "model.rope_scaling.%s", needed[i]);
        if (!is_given(root, key))
            snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s", missing[0] ? ", " : "",
                     needed[i]);
    }
    if (missing[0])
        fail_input("config: 'model.rope_scaling' of rope_type \"llama3\" lacks %s, as transformers refuses it; give "
                   "the model's own values (Llama 3.1: factor 8, low_freq_factor 1, high_freq_factor 4)",
                   missing);
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

/* Gemma's keys, refused for the other types. The attention's soft-cap and scale become each layer's attention
 * options in model_build (model.c set_arch), so that a checkpoint's model gets them too. */
static void read_gemma_keys(struct model_config *m, json_t *root, bool gemma)
{
    static const char *const only_gemma[] = {"model.final_logit_softcapping", "model.attn_logit_softcapping",
                                             "model.query_pre_attn_scalar", "model.sliding_window_pattern",
                                             "model.rope_local_theta"};
    if (!gemma) {
        for (size_t i = 0; i < sizeof only_gemma / sizeof only_gemma[0]; i++)
            if (is_given(root, only_gemma[i]))
                fail_input("config: '%s' is a Gemma key; remove it or use model.type \"gemma\"", only_gemma[i]);
        return;
    }
    m->final_softcap = read_num(root, "model.final_logit_softcapping", 0.0, NO_FILL);
    m->attn_softcap = read_num(root, "model.attn_logit_softcapping", 0.0, NO_FILL);
    m->query_scalar = read_num(root, "model.query_pre_attn_scalar", m->head_dim, NO_FILL);
    m->window_pattern = read_int(root, "model.sliding_window_pattern", m->window_pattern, FILL);
    m->rope_local_theta = read_num(root, "model.rope_local_theta", m->rope_local_theta > 0 ? m->rope_local_theta
                                                                                             : m->rope_theta, FILL);
    if (!(m->final_softcap >= 0) || !isfinite(m->final_softcap))
        fail_input("config: 'model.final_logit_softcapping' must be a number > 0 or null, got %g", m->final_softcap);
    if (m->window_pattern < 0)
        fail_input("config: 'model.sliding_window_pattern' must be >= 0, got %d", m->window_pattern);
    if (!(m->rope_local_theta > 1.0) || !isfinite(m->rope_local_theta))
        fail_input("config: 'model.rope_local_theta' must be larger than 1, got %g", m->rope_local_theta);
    if (!(m->attn_softcap >= 0) || !isfinite(m->attn_softcap))
        fail_input("config: 'model.attn_logit_softcapping' must be a number > 0 or null, got %g", m->attn_softcap);
    if (!(m->query_scalar > 0) || !isfinite(m->query_scalar))
        fail_input("config: 'model.query_pre_attn_scalar' must be a number > 0, got %g", m->query_scalar);
}

/* The sliding window (core/options.h struct attention_layers): model.sliding_window W, on the layers
 * model.sliding_layers lists (absent: every layer). */
void config_read_sliding(struct model_config *m, json_t *root)
{
    memset(&m->attention, 0, sizeof m->attention);
    const int W = read_int(root, "model.sliding_window", 0, NO_FILL);
    json_t *layers = doc_get(root, "model.sliding_layers");
    if (W < 0)
        fail_input("config: 'model.sliding_window' must be >= 0 (0: no window), got %d", W);
    if (W == 0) {
        if (layers && json_array_size(layers) > 0)
            fail_input("config: 'model.sliding_layers' is given without 'model.sliding_window'; give the window "
                       "or remove the layers");
        return;
    }
    if (m->n_layer > MODEL_MAX_WINDOWED_LAYERS)
        fail_input("config: a sliding window on a model of %d layers; shardlm's windowed models have at most %d",
                   m->n_layer, MODEL_MAX_WINDOWED_LAYERS);
    m->attention.window = W;
    if (!layers) {
        for (int l = 0; l < m->n_layer; l++)
            model_attention_set_sliding(&m->attention, l);
        return;
    }
    size_t i;
    json_t *v;
    json_array_foreach(layers, i, v) {
        const long long l = json_is_integer(v) ? json_integer_value(v) : -1;
        if (l < 0 || l >= m->n_layer || model_attention_sliding(&m->attention, (int)l))
            fail_input("config: 'model.sliding_layers[%zu]' must be a layer number from 0 to %d, each once", i,
                       m->n_layer - 1);
        model_attention_set_sliding(&m->attention, (int)l);
    }
}

/* The keys only Llama has: refused for GPT-2, read with Hugging Face's
 * meaning (and Llama 2/3's published values as defaults) for Llama. */
static void read_llama_keys(struct model_config *m, json_t *root, bool gpt2)
{
    static const char *const only_llama[] = {"model.rms_norm_eps", "model.rope_theta", "model.rope_scaling",
                                              "model.tie_word_embeddings", "model.head_dim", "model.qkv_bias",
                                              "model.qk_norm", "model.fused_projections", "model.sliding_window",
                                              "model.sliding_layers", "model.partial_rotary_factor"};
    m->norm_eps = 1e-5f;
    m->rope_theta = 10000.0;
    m->tie_embeddings = gpt2;
    if (gpt2) {
        for (size_t i = 0; i < sizeof only_llama / sizeof only_llama[0]; i++)
            if (is_given(root, only_llama[i]))
                fail_input("config: '%s' is a Llama key; GPT-2 has LayerNorm, learned positions and a tied head. "
                           "Remove it or use model.type \"llama\"",
                           only_llama[i]);
        read_gemma_keys(m, root, false);
        return;
    }
    /* head_dim: Hugging Face's, Qwen3's apart from n_embd / n_head */
    m->head_dim = read_int(root, "model.head_dim", m->head_dim > 0 ? m->head_dim : m->n_embd / m->n_head, NO_FILL);
    require_positive("model.head_dim", m->head_dim);
    if (m->head_dim % 2 != 0)
        fail_input("config: the head dimension ('model.head_dim', else 'model.n_embd' / 'model.n_head') is %d, odd: "
                   "rotary embeddings rotate channel pairs, so Llama needs an even head dimension",
                   m->head_dim);
    m->partial_rotary = read_num(root, "model.partial_rotary_factor", 1.0, NO_FILL);
    const int rot = (int)(m->head_dim * m->partial_rotary);
    if (!(m->partial_rotary > 0 && m->partial_rotary <= 1) || rot < 2 || rot % 2)
        fail_input("config: 'model.partial_rotary_factor' is %g: the rotary turns int(head_dim x factor) = %d of a "
                   "head's %d channels, which must be an even number from 2 up; give a factor in (0, 1]",
                   m->partial_rotary, rot, m->head_dim);
    if (m->partial_rotary != 1.0 && arch_is(m->type, ARCH_GEMMA))
        fail_input("config: 'model.partial_rotary_factor' is for the Llama-like families (Phi-4-mini); Gemma turns "
                   "every channel of a head. Remove it");
    m->qkv_bias = read_bool(root, "model.qkv_bias", m->qkv_bias, NO_FILL);
    m->qk_norm = read_bool(root, "model.qk_norm", m->qk_norm, NO_FILL);
    m->fused_projections = read_bool(root, "model.fused_projections", false, NO_FILL);
    config_read_sliding(m, root);
    double eps = read_num(root, "model.rms_norm_eps", 1e-5, FILL);
    if (!(eps > 0) || eps > 1.0)
        fail_input("config: 'model.rms_norm_eps' must be in (0, 1], got %g", eps);
    m->norm_eps = eps;
    double theta = read_num(root, "model.rope_theta", 10000.0, FILL);
    if (!(theta > 1.0) || !isfinite(theta))
        fail_input("config: 'model.rope_theta' must be larger than 1, got %g", theta);
    m->rope_theta = theta;
    m->tie_embeddings = read_bool(root, "model.tie_word_embeddings", arch_is(m->type, ARCH_GEMMA), FILL);
    read_rope_scaling(m, root);
    read_gemma_keys(m, root, arch_is(m->type, ARCH_GEMMA));
}

void config_put_pretrained(void *cfg_, const char *key, json_t *value)
{
    struct config *cfg = cfg_;
    char path[64];
    snprintf(path, sizeof path, "model.%s", key);
    json_t *given = doc_get(cfg->json, path);
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
                       path, json_brief(given, a, sizeof a), cfg->model.pretrained, json_brief(value, b, sizeof b));
        }
        json_decref(value);
        return;
    }
    put_default(cfg->json, path, value);
}

/* model.from_pretrained: the directory whose config.json gives the shape keys
 * (read by the caller, config_put_pretrained). */
void read_pretrained(struct model_config *m, json_t *root)
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
}

void read_model(struct config *cfg, json_t *root)
{
    struct model_config *m = &cfg->model;
    /* A preset supplies the defaults of the shape keys; keys given beside it win. */
    const struct model_preset gpt2_default = {NULL, arch_get(ARCH_GPT2)->type, MODEL_N_LAYER_DEFAULT,
                                              MODEL_N_HEAD_DEFAULT, 0, MODEL_N_EMBD_DEFAULT, 0,
                                              MODEL_N_POSITIONS_DEFAULT, MODEL_VOCAB_SIZE_DEFAULT, 0, 0, false, false, 0, 0};
    const struct model_preset *preset = &gpt2_default;
    const char *preset_name = read_str(root, "model.preset", NULL, NO_FILL);
    if (preset_name) {
        preset = arch_find_preset(preset_name);
        if (!preset)
            fail_input("config: 'model.preset' is \"%s\"; known presets: %s", preset_name, arch_preset_names());
        snprintf(m->preset, sizeof m->preset, "%s", preset_name);
    }
    const char *type = read_str(root, "model.type", preset->type, FILL);
    if (!arch_find(type))
        fail_input("config: 'model.type' is \"%s\"; known model types: %s", type, arch_type_names());
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
    if (m->n_embd % m->n_head != 0 && !is_given(root, "model.head_dim"))
        fail_input("config: 'model.n_embd' (%d) must be divisible by 'model.n_head' (%d): each head gets "
                   "n_embd / n_head channels",
                   m->n_embd, m->n_head);
    bool gpt2 = arch_is(type, ARCH_GPT2);
    bool same_type = strcmp(type, preset->type) == 0;
    m->n_kv_head = read_int(root, "model.n_kv_head", same_type && preset->n_kv_head ? preset->n_kv_head : m->n_head,
                            NO_FILL);
    long long ffn_default = same_type && preset->ffn_dim ? preset->ffn_dim : 4LL * m->n_embd;
    if (!is_given(root, "model.ffn_dim") && ffn_default > INT_MAX)
        fail_input("config: 'model.n_embd' is %d; the MLP it implies (4 n_embd = %lld) is out of range (at most %d)",
                   m->n_embd, ffn_default, INT_MAX);
    m->ffn_dim = read_int(root, "model.ffn_dim", (int)ffn_default, NO_FILL);
    if (same_type) { /* the preset's Llama-like extras, as defaults of their keys (read_llama_keys) */
        m->head_dim = preset->head_dim;
        m->qkv_bias = preset->qkv_bias;
        m->qk_norm = preset->qk_norm;
        m->window_pattern = preset->window_pattern;
        m->rope_local_theta = preset->rope_local_theta;
    }
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
    read_llama_keys(m, root, gpt2);
    check_model_sizes(m, gpt2);

    double std = read_num(root, "model.init_std", MODEL_INIT_STD_DEFAULT, FILL);
    if (!(std > 0))
        fail_input("config: 'model.init_std' must be positive, got %g", std);
    m->init_std = (float)std;
    long long seed = read_int64(root, "model.init_seed", MODEL_INIT_SEED_DEFAULT, FILL);
    require_non_negative("model.init_seed", seed);
    m->init_seed = (uint64_t)seed;
}

void read_data(struct config *cfg, json_t *root)
{
    struct data_config *d = &cfg->data;
    d->train_path = read_path(root, "data.train");
    d->val_path = read_path(root, "data.val");
    /* max_seq_length (Hugging Face's name, for sample files) is seq_len */
    const int max_seq = read_int(root, "data.max_seq_length", 0, NO_FILL);
    /* the default is the model's context (a sliding window limits what each token sees, not the length):
     * eval and generate, which choose their own lengths, start from it too */
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
    if (d->seq_len > cfg->model.n_positions)
        fail_input("config: 'data.seq_len' (%d) is larger than 'model.n_positions' (%d): a sequence longer than the "
                   "context; lower data.seq_len or raise model.n_positions",
                   d->seq_len, cfg->model.n_positions);
}

void read_train(struct config *cfg, json_t *root)
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

void read_checkpoint(struct config *cfg, json_t *root)
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
