/*
 * hf_gemma — Gemma 2 and Gemma 3's config.json (hf_config_internal.h): what
 * sets them apart from the Llama-like families, read as transformers 5.25's
 * Gemma2Config and Gemma3TextConfig read it, and written back by an export.
 *
 *  - layer_types (transformers 5; absent: Gemma2Config's alternation,
 *    Gemma3TextConfig's 5 local to 1 global from sliding_window_pattern) as
 *    model.sliding_window_pattern: a layer is local unless (l + 1) is a
 *    multiple of it. Any other list is refused.
 *  - The window of the local layers: sliding_window, put as
 *    model.sliding_window and model.sliding_layers (the local ones), which
 *    become each layer's attention options; use_bidirectional_attention is
 *    refused.
 *  - The rotary settings: Gemma 2 one dictionary for every layer; Gemma 3
 *    rope_parameters keyed by layer type (full_attention: rope_theta and its
 *    scaling; sliding_attention: the local base, unscaled), or the older
 *    rope_theta, rope_local_base_freq and rope_scaling (applied to the
 *    global layers), with Gemma3TextConfig's defaults 1e6 and 1e4.
 *  - final_logit_softcapping, attn_logit_softcapping (null: none) and
 *    query_pre_attn_scalar.
 * Gemma3ForConditionalGeneration: its text_config is the language model;
 * the vision tower's keys and tensors are skipped, with one log line.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/hf_json.h"
#include "core/util.h"
#include "hf_config_internal.h"
#include "model/model.h"

/* Gemma2Config's and Gemma3TextConfig's defaults for the keys read here */
#define GEMMA2_PATTERN 2
#define GEMMA3_PATTERN 6
#define GEMMA2_FINAL_SOFTCAP 30.0
#define GEMMA2_ATTN_SOFTCAP 50.0
#define GEMMA_QUERY_SCALAR 256.0
#define GEMMA3_GLOBAL_THETA 1000000.0
#define GEMMA3_LOCAL_THETA 10000.0
#define GEMMA2_THETA 10000.0

static bool gemma3(const struct reader *r) { return strcmp(r->cls, "Gemma3TextConfig") == 0; }

bool hfc_gemma_text_config(struct reader *outer, struct reader *text, const char *architecture)
{
    if (strcmp(architecture, "Gemma3ForConditionalGeneration") != 0)
        return false;
    json_t *tc = hfc_get(outer, "text_config");
    if (!json_is_object(tc))
        fail_input("%s: Gemma3ForConditionalGeneration without a text_config object; shardlm reads its language "
                   "model from there",
                   outer->path);
    const char *key;
    json_t *v;
    json_object_foreach(outer->root, key, v) json_object_set_new(outer->used, key, json_true());
    log_info("%s: Gemma3ForConditionalGeneration: the language model (text_config) is read; the vision tower is "
             "skipped (shardlm trains on text)",
             outer->path);
    /* the outer tie_word_embeddings is the one Gemma3ForConditionalGeneration ties by (transformers 5) */
    json_t *copy = json_deep_copy(tc), *tie = json_object_get(outer->root, "tie_word_embeddings");
    if (json_is_boolean(tie))
        json_object_set(copy, "tie_word_embeddings", tie);
    *text = (struct reader){copy, outer->path, "Gemma3TextConfig", json_object()};
    hfc_read_dtype(text);
    const char *type = hfc_str_key(text, "model_type", "gemma3_text");
    if (strcmp(type, "gemma3_text") != 0)
        fail_input("%s: text_config.model_type is \"%s\"; shardlm reads a Gemma3ForConditionalGeneration whose "
                   "language model is gemma3_text",
                   outer->path, type);
    return true;
}

void hfc_gemma_text_done(const struct reader *outer, struct reader *text)
{
    if (text->root == outer->root)
        return;
    hfc_check_other_keys(text);
    json_decref(text->used);
    json_decref(text->root);
}

/* The sliding-window pattern of layer_types (absent: the class's own). */
static int read_pattern(struct reader *r, long long L)
{
    json_t *p = hfc_get(r, "sliding_window_pattern"), *old = hfc_get(r, "_sliding_window_pattern");
    int pattern = gemma3(r) ? GEMMA3_PATTERN : GEMMA2_PATTERN;
    if (p || old) {
        json_t *given = p ? p : old;
        if (!json_is_integer(given) || json_integer_value(given) <= 0)
            fail_input("%s: sliding_window_pattern must be a positive integer", r->path);
        pattern = (int)json_integer_value(given);
    }
    json_t *lt = hfc_get(r, "layer_types");
    if (!lt)
        return pattern;
    if (!json_is_array(lt) || (long long)json_array_size(lt) != L)
        fail_input("%s: 'layer_types' must be a list of num_hidden_layers (%lld) strings", r->path, L);
    for (size_t i = 0; i < json_array_size(lt); i++)
        if (json_is_string(json_array_get(lt, i)) && !strcmp(json_string_value(json_array_get(lt, i)), "full_attention")) {
            pattern = (int)i + 1; /* the first global layer */
            break;
        }
    const char *at_pattern = pattern <= L ? json_string_value(json_array_get(lt, (size_t)pattern - 1)) : NULL;
    if (pattern <= L && (!at_pattern || strcmp(at_pattern, "full_attention") != 0))
        pattern = (int)L + 1; /* no global layer: every layer local */
    size_t i;
    json_t *e;
    json_array_foreach(lt, i, e) {
        const char *want = ((long long)i + 1) % pattern == 0 ? "full_attention" : "sliding_attention";
        if (!json_is_string(e) || strcmp(json_string_value(e), want) != 0)
            fail_input("%s: layer_types[%zu] is %s where a pattern of %d local layers then a global one has \"%s\"; "
                       "shardlm's %s takes layer types that repeat that way",
                       r->path, i, json_is_string(e) ? json_string_value(e) : "not a string", pattern - 1, want, r->cls);
    }
    return pattern;
}

/* A soft-cap key: absent takes def (0: none), null means none. */
static double softcap_key(struct reader *r, const char *key, double def)
{
    json_t *v = json_object_get(r->root, key);
    json_object_set_new(r->used, key, json_true());
    if (!v) {
        char text[32];
        snprintf(text, sizeof text, "%g", def);
        if (def > 0)
            hfc_log_default(r, key, text);
        return def;
    }
    double x;
    if (json_is_null(v))
        return 0.0;
    if (!hf_json_number(v, &x) || !(x > 0) || !isfinite(x))
        fail_input("%s: '%s' must be a number > 0 or null", r->path, key);
    return x;
}

/* The theta and scaling of one layer type's dictionary ({"rope_theta", "rope_scaling"}, a new object). */
static json_t *rope_of(struct reader *r, json_t *d, const char *where, double theta, long long max_pos)
{
    if (d && !json_is_object(d))
        fail_input("%s: %s must be an object", r->path, where);
    return d ? hfc_read_rope_dict(r, d, where, theta, true, max_pos)
             : json_pack("{s:f, s:n}", "rope_theta", theta, "rope_scaling");
}

/* rope_theta, rope_scaling and rope_local_theta put from either spelling. */
static void read_rope(struct reader *r, long long max_pos, void (*put)(void *, const char *, json_t *), void *ctx)
{
    json_t *params = hfc_get(r, "rope_parameters"), *scaling = hfc_get(r, "rope_scaling");
    json_t *top = hfc_get(r, "rope_theta"), *local = hfc_get(r, "rope_local_base_freq");
    double theta = gemma3(r) ? GEMMA3_GLOBAL_THETA : GEMMA2_THETA, local_theta = GEMMA3_LOCAL_THETA;
    if (top && (!hf_json_number(top, &theta) || !(theta > 1.0)))
        fail_input("%s: 'rope_theta' must be a number larger than 1", r->path);
    if (local && (!hf_json_number(local, &local_theta) || !(local_theta > 1.0)))
        fail_input("%s: 'rope_local_base_freq' must be a number larger than 1", r->path);
    if (params && !json_is_object(params))
        fail_input("%s: 'rope_parameters' must be an object", r->path);
    json_t *full = NULL, *sliding = NULL;
    if (params && (json_object_get(params, "full_attention") || json_object_get(params, "sliding_attention"))) {
        full = json_object_get(params, "full_attention"); /* transformers 5's nesting by layer type */
        sliding = json_object_get(params, "sliding_attention");
    } else {
        full = scaling ? scaling : params;
    }
    json_t *g = rope_of(r, full, scaling ? "rope_scaling" : "rope_parameters.full_attention", theta, max_pos);
    put(ctx, "rope_theta", json_incref(json_object_get(g, "rope_theta")));
    if (!json_is_null(json_object_get(g, "rope_scaling")))
        put(ctx, "rope_scaling", json_incref(json_object_get(g, "rope_scaling")));
    json_t *l = rope_of(r, sliding, "rope_parameters.sliding_attention", gemma3(r) ? local_theta : json_number_value(
                                                                                     json_object_get(g, "rope_theta")),
                        max_pos);
    if (!json_is_null(json_object_get(l, "rope_scaling")))
        fail_input("%s: rope_parameters.sliding_attention is scaled; transformers' Gemma scales the global layers' "
                   "rotary only, and so does shardlm",
                   r->path);
    put(ctx, "rope_local_theta", json_incref(json_object_get(l, "rope_theta")));
    json_decref(g);
    json_decref(l);
}

void hfc_gemma_keys(struct reader *r, long long L, long long head_dim, long long max_pos,
                    void (*put)(void *, const char *, json_t *), void *ctx)
{
    if (hfc_bool_key(r, "use_bidirectional_attention", false, true))
        fail_input("%s: use_bidirectional_attention is true (a bidirectional encoder, EmbeddingGemma); shardlm trains "
                   "causal language models",
                   r->path);
    hfc_get(r, "hidden_act"); /* Gemma 1's key, which Gemma2Config keeps and does not use */
    const int pattern = read_pattern(r, L);
    json_t *w = json_object_get(r->root, "sliding_window");
    json_object_set_new(r->used, "sliding_window", json_true());
    long long window = w && !json_is_null(w) ? hfc_int_key(r, "sliding_window", -1) : 0;
    if (!w) {
        hfc_log_default(r, "sliding_window", "4096");
        window = 4096;
    }
    if (window && pattern > 1 && L > MODEL_MAX_WINDOWED_LAYERS)
        fail_input("%s: %lld layers with a sliding window; shardlm's windowed models have at most %d layers", r->path,
                   L, MODEL_MAX_WINDOWED_LAYERS);
    struct attention_layers att = {0};
    att.window = window && pattern > 1 ? (int)window : 0;
    for (long long l = 0; att.window && l < L; l++)
        if ((l + 1) % pattern != 0)
            model_attention_set_sliding(&att, (int)l);
    hfc_put_window(&att, L, put, ctx); /* the local layers' window: each layer's attention options */
    put(ctx, "sliding_window_pattern", json_integer(window ? pattern : 0));
    read_rope(r, max_pos, put, ctx);
    const double final_cap = softcap_key(r, "final_logit_softcapping", gemma3(r) ? 0.0 : GEMMA2_FINAL_SOFTCAP);
    const double attn_cap = softcap_key(r, "attn_logit_softcapping", gemma3(r) ? 0.0 : GEMMA2_ATTN_SOFTCAP);
    if (final_cap > 0)
        put(ctx, "final_logit_softcapping", json_real(final_cap));
    if (attn_cap > 0)
        put(ctx, "attn_logit_softcapping", json_real(attn_cap));
    double scalar = hfc_num_key(r, "query_pre_attn_scalar", GEMMA_QUERY_SCALAR, "256");
    put(ctx, "query_pre_attn_scalar", json_real(scalar));
    put(ctx, "head_dim", json_integer(head_dim));
    if (gemma3(r))
        put(ctx, "qk_norm", json_true());
}

json_t *hfc_gemma_config_base(json_t *out)
{
    json_t *tc = json_object_get(out, "text_config");
    if (!json_is_object(tc))
        return out;
    json_t *text = json_deep_copy(tc);
    json_decref(out);
    json_object_set_new(text, "architectures", json_pack("[s]", "Gemma3ForCausalLM"));
    json_object_set_new(text, "model_type", json_string("gemma3_text"));
    return text;
}

/* null for 0 (none), else the value */
static json_t *cap_json(double x) { return x > 0 ? json_real(x) : json_null(); }

void hfc_gemma_config_keys(const struct model_config *c, json_t *out)
{
    json_t *lt = json_array();
    for (int l = 0; l < c->n_layer; l++)
        json_array_append_new(lt, json_string(c->window_pattern > 0 && (l + 1) % c->window_pattern != 0
                                                  ? "sliding_attention"
                                                  : "full_attention"));
    json_object_set_new(out, "layer_types", lt);
    json_object_del(out, "sliding_window_pattern");
    json_object_del(out, "_sliding_window_pattern");
    json_object_set_new(out, "final_logit_softcapping", cap_json(c->final_softcap));
    json_object_set_new(out, "attn_logit_softcapping", cap_json(c->attn_softcap));
    const double scalar = c->query_scalar > 0 ? c->query_scalar : c->head_dim;
    /* Gemma2Config and Gemma3TextConfig type it int (transformers 5 refuses 256.0) */
    json_object_set_new(out, "query_pre_attn_scalar", scalar == floor(scalar) ? json_integer((json_int_t)scalar)
                                                                              : json_real(scalar));
    if (c->attention.window)
        json_object_set_new(out, "sliding_window", json_integer(c->attention.window));
    if (!c->qk_norm)
        return;
    /* Gemma 3: the rotary settings by layer type (transformers 5) and as 4.x spelled them */
    json_t *params = json_object_get(out, "rope_parameters"); /* put_rope's, the global layers' */
    const double local = c->rope_local_theta > 0 ? c->rope_local_theta : c->rope_theta;
    json_object_set_new(out, "rope_parameters",
                        json_pack("{s:O, s:{s:s, s:f}}", "full_attention", params, "sliding_attention", "rope_type",
                                  "default", "rope_theta", local));
    json_object_set_new(out, "rope_local_base_freq", json_real(local));
    json_object_set_new(out, "use_bidirectional_attention", json_false());
}
