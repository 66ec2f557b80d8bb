/*
 * hf_rope — the rotary settings of config.json (hf_config_internal.h): read in
 * either spelling, transformers 4's rope_theta and rope_scaling or 5's
 * rope_parameters, with transformers 5's precedence (a non-null rope_scaling
 * wins, a rope_theta inside the dictionary wins over a top-level one, llama3
 * scaling without original_max_position_embeddings takes
 * max_position_embeddings, Phi-3's partial_rotary_factor from the dictionary,
 * else the top level), and written back in both for an export.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/hf_json.h"
#include "core/util.h"
#include "hf_config_internal.h"
#include "model/model.h"

/* The keys one rope_type may carry (beside rope_type / type and rope_theta). */
static bool rope_key_allowed(const char *type, const char *key)
{
    if (!strcmp(key, "rope_type") || !strcmp(key, "type") || !strcmp(key, "rope_theta"))
        return true;
    if (!strcmp(type, "linear"))
        return !strcmp(key, "factor");
    if (!strcmp(type, "llama3"))
        return !strcmp(key, "factor") || !strcmp(key, "low_freq_factor") || !strcmp(key, "high_freq_factor") ||
               !strcmp(key, "original_max_position_embeddings");
    if (!strcmp(type, "longrope"))
        return !strcmp(key, "short_factor") || !strcmp(key, "long_factor") || !strcmp(key, "factor") ||
               !strcmp(key, "attention_factor") || !strcmp(key, "original_max_position_embeddings");
    return false;
}

static double rope_num(struct reader *r, json_t *d, const char *where, const char *key)
{
    json_t *v = json_object_get(d, key);
    double x;
    if (!v || !hf_json_number(v, &x) || !isfinite(x))
        fail_input("%s: %s.%s is missing or not a number; transformers refuses this rope_type without it", r->path,
                   where, key);
    return x;
}

/* Phi-3's longrope (transformers 5's _compute_longrope_parameters): the
 * factor lists as given, original_max_position_embeddings (the top-level key
 * first, as Phi3Config gives it priority), and attention_factor as given or
 * computed from max_position_embeddings / original: sqrt(1 + ln(factor) /
 * ln(original)) above 1, else 1. */
static json_t *read_longrope(struct reader *r, json_t *d, const char *where, long long max_pos)
{
    static const char *const lists[] = {"short_factor", "long_factor"};
    for (int i = 0; i < 2; i++)
        if (!json_is_array(json_object_get(d, lists[i])))
            fail_input("%s: %s.%s is missing or not a list; transformers refuses a longrope without it", r->path,
                       where, lists[i]);
    json_t *top = hfc_get(r, "original_max_position_embeddings"), *o = json_object_get(d, "original_max_position_embeddings");
    json_t *omax_v = top && json_is_integer(top) ? top : o;
    if (!json_is_integer(omax_v) || json_integer_value(omax_v) <= 0)
        fail_input("%s: original_max_position_embeddings is missing or not a positive integer; longrope needs it",
                   r->path);
    const long long omax = json_integer_value(omax_v);
    double factor = (double)max_pos / (double)omax, att;
    json_t *f = json_object_get(d, "factor"), *a = json_object_get(d, "attention_factor");
    if (f && !json_is_null(f) && !hf_json_number(f, &factor))
        fail_input("%s: %s.factor must be a number", r->path, where);
    if (a && !json_is_null(a)) {
        if (!hf_json_number(a, &att) || !(att > 0))
            fail_input("%s: %s.attention_factor must be a number > 0", r->path, where);
    } else {
        att = factor <= 1.0 ? 1.0 : sqrt(1.0 + log(factor) / log((double)omax));
    }
    return json_pack("{s:s, s:O, s:O, s:f, s:I}", "rope_type", "longrope", "short_factor",
                     json_object_get(d, "short_factor"), "long_factor", json_object_get(d, "long_factor"),
                     "attention_factor", att, "original_max_position_embeddings", (json_int_t)omax);
}

/* One rotary dictionary (rope_parameters, rope_scaling, or one layer type's
 * entry) into the shardlm model keys rope_theta and rope_scaling: a new
 * object {"rope_theta": x, "rope_scaling": {...} or null}. top_theta: the
 * top-level rope_theta (or the default; top_given: the file's);
 * max_pos: max_position_embeddings. */
json_t *hfc_read_rope_dict(struct reader *r, json_t *d, const char *where, double top_theta, bool top_given,
                              long long max_pos)
{
    const char *type = "default";
    json_t *t = json_object_get(d, "rope_type");
    if (!t || json_is_null(t))
        t = json_object_get(d, "type");
    if (t && !json_is_null(t)) {
        if (!json_is_string(t))
            fail_input("%s: %s.rope_type must be a string", r->path, where);
        type = json_string_value(t);
    }
    if (!strcmp(type, "su") || !strcmp(type, "yarn")) /* Phi3Config reads both as longrope */
        type = !strcmp(r->cls, "Phi3Config") ? "longrope" : type;
    if (strcmp(type, "default") && strcmp(type, "linear") && strcmp(type, "llama3") &&
        (strcmp(type, "longrope") || strcmp(r->cls, "Phi3Config")))
        fail_input("%s: %s.rope_type is \"%s\", which shardlm does not implement for %s; it implements \"default\", "
                   "\"linear\", \"llama3\" and Phi-3's \"longrope\"",
                   r->path, where, type, r->cls);
    const char *key;
    json_t *v;
    json_object_foreach(d, key, v) {
        if (!strcmp(key, "partial_rotary_factor")) { /* Phi-3's: hfc_read_rope reads it */
            double f;
            if (!strcmp(r->cls, "Phi3Config") || (hf_json_number(v, &f) && f == 1.0))
                continue;
            fail_input("%s: %s.partial_rotary_factor is not 1: a partly rotated head is implemented for "
                       "Phi3ForCausalLM (Phi-4-mini), not for %s",
                       r->path, where, r->cls);
        }
        if (!rope_key_allowed(type, key))
            fail_input("%s: %s.%s is not a key of rope_type \"%s\" that shardlm implements, and it changes the "
                       "rotary embedding; remove it if it does not apply",
                       r->path, where, key, type);
    }
    double theta = top_theta;
    json_t *th = json_object_get(d, "rope_theta");
    if (!top_given && (!th || json_is_null(th)))
        hfc_log_default(r, "rope_theta", "10000 (default_theta)");
    if (th && !json_is_null(th) && (!hf_json_number(th, &theta) || !(theta > 1.0) || !isfinite(theta)))
        fail_input("%s: %s.rope_theta must be a number larger than 1", r->path, where);
    json_t *out = json_pack("{s:f, s:n}", "rope_theta", theta, "rope_scaling");
    if (!strcmp(type, "longrope")) {
        json_object_set_new(out, "rope_scaling", read_longrope(r, d, where, max_pos));
    } else if (!strcmp(type, "linear")) {
        json_object_set_new(out, "rope_scaling",
                            json_pack("{s:s, s:f}", "rope_type", "linear", "factor", rope_num(r, d, where, "factor")));
    } else if (!strcmp(type, "llama3")) {
        long long omax = max_pos;
        json_t *o = json_object_get(d, "original_max_position_embeddings");
        json_t *top = json_object_get(r->root, "original_max_position_embeddings");
        json_object_set_new(r->used, "original_max_position_embeddings", json_true());
        if (top && json_is_integer(top)) /* transformers 5 gives a top-level one priority (Phi-3's layout) */
            omax = json_integer_value(top);
        else if (o && json_is_integer(o))
            omax = json_integer_value(o);
        else
            log_info("%s has no %s.original_max_position_embeddings: transformers 5 takes max_position_embeddings, "
                     "%lld",
                     r->path, where, omax);
        json_object_set_new(out, "rope_scaling",
                            json_pack("{s:s, s:f, s:f, s:f, s:I}", "rope_type", "llama3", "factor",
                                      rope_num(r, d, where, "factor"), "low_freq_factor",
                                      rope_num(r, d, where, "low_freq_factor"), "high_freq_factor",
                                      rope_num(r, d, where, "high_freq_factor"), "original_max_position_embeddings",
                                      (json_int_t)omax));
    }
    return out;
}

/* Whether name is one of layer_types' entries. */
static bool names_layer_type(json_t *layer_types, const char *name)
{
    size_t i;
    json_t *e;
    json_array_foreach(layer_types, i, e) if (strcmp(json_string_value(e), name) == 0) return true;
    return false;
}

/* rope_theta and rope_scaling of the whole model (one setting for every
 * layer), from either spelling: puts the shardlm keys. */
void hfc_read_rope(struct reader *r, json_t *layer_types, long long max_pos, void (*put)(void *, const char *, json_t *),
                   void *ctx)
{
    json_t *scaling = hfc_get(r, "rope_scaling"), *params = hfc_get(r, "rope_parameters");
    json_t *top = hfc_get(r, "rope_theta");
    double top_theta = 10000.0; /* transformers' default_theta (4.x: LlamaConfig's rope_theta) */
    if (top && (!hf_json_number(top, &top_theta) || !(top_theta > 1.0) || !isfinite(top_theta)))
        fail_input("%s: 'rope_theta' must be a number larger than 1", r->path);
    json_t *d = scaling ? scaling : params;
    const char *where = scaling ? "rope_scaling" : "rope_parameters";
    if (d && !json_is_object(d))
        fail_input("%s: '%s' must be an object", r->path, where);
    /* Keyed by layer type (transformers 5's nested_rope_parameter_keys: keys that
     * are layer types of layer_types), as models with local and global layers
     * write it. Llama and Mistral have one kind of layer, and transformers'
     * LlamaRotaryEmbedding reads the dictionary's own top-level keys whatever
     * else it holds: such a file is ambiguous, and refused. */
    const char *key;
    json_t *v;
    if (d && layer_types)
        json_object_foreach(d, key, v) if (names_layer_type(layer_types, key))
            fail_input("%s: %s is keyed by layer type ('%s'); %s has one rotary setting for every layer and "
                       "transformers' Llama reads only the dictionary's own keys; write rope_parameters without "
                       "layer-type keys",
                       r->path, where, key, r->cls);
    if (!d && !top)
        hfc_log_default(r, "rope_theta", "10000 (default_theta)");
    json_t *res = d ? hfc_read_rope_dict(r, d, where, top_theta, top != NULL, max_pos)
                    : json_pack("{s:f, s:n}", "rope_theta", top_theta, "rope_scaling");
    /* partial_rotary_factor (Phi-4-mini: 0.75): the dictionary's, else the top-level one, as Phi3Config takes it */
    json_t *top_partial = hfc_get(r, "partial_rotary_factor"), *partial = json_object_get(d, "partial_rotary_factor");
    partial = partial ? partial : top_partial;
    double f = 1.0;
    if (partial && !json_is_null(partial) && (!hf_json_number(partial, &f) || !(f > 0 && f <= 1)))
        fail_input("%s: partial_rotary_factor must be a number in (0, 1]", r->path);
    if (f != 1.0 && strcmp(r->cls, "Phi3Config") != 0)
        fail_input("%s: partial_rotary_factor is %g: a partly rotated head is implemented for Phi3ForCausalLM "
                   "(Phi-4-mini), not for %s", r->path, f, r->cls);
    if (f != 1.0)
        put(ctx, "partial_rotary_factor", json_real(f));
    json_t *rs = json_object_get(res, "rope_scaling");
    put(ctx, "rope_theta", json_incref(json_object_get(res, "rope_theta")));
    if (!json_is_null(rs))
        put(ctx, "rope_scaling", json_incref(rs));
    json_decref(res);
}

/* The rotary settings in both spellings: top-level rope_theta and
 * rope_scaling (transformers 4.x reads these) and rope_parameters
 * (transformers 5), which 5.x reads as the same model when both are there. */
void hfc_put_rope(json_t *out, const struct model_config *c)
{
    json_t *scaling = json_null(), *params = json_pack("{s:s, s:f}", "rope_type", "default", "rope_theta",
                                                        c->rope_theta);
    const struct rope_scaling *s = &c->rope_scaling;
    if (s->type == ROPE_SCALING_LLAMA3) {
        scaling = json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor", s->factor,
                            "low_freq_factor", s->low_freq_factor, "high_freq_factor", s->high_freq_factor,
                            "original_max_position_embeddings", s->original_max_positions);
    } else if (s->type == ROPE_SCALING_LINEAR) {
        scaling = json_pack("{s:s, s:f}", "rope_type", "linear", "factor", s->factor);
    } else if (s->type == ROPE_SCALING_LONGROPE) {
        json_t *sf = json_array(), *lf = json_array();
        for (int i = 0; i < s->n_factors; i++) {
            json_array_append_new(sf, json_real(s->short_factor[i]));
            json_array_append_new(lf, json_real(s->long_factor[i]));
        }
        scaling = json_pack("{s:s, s:o, s:o, s:f, s:i}", "rope_type", "longrope", "short_factor", sf, "long_factor",
                            lf, "attention_factor", s->attention_factor, "original_max_position_embeddings",
                            s->original_max_positions);
    }
    if (!json_is_null(scaling)) {
        json_object_update(params, scaling);
        json_object_set_new(params, "rope_theta", json_real(c->rope_theta));
    }
    if (c->partial_rotary != 1.0) { /* both places, as transformers 5 writes Phi3Config's */
        json_object_set_new(params, "partial_rotary_factor", json_real(c->partial_rotary));
        json_object_set_new(out, "partial_rotary_factor", json_real(c->partial_rotary));
    }
    json_object_set_new(out, "rope_theta", json_real(c->rope_theta));
    json_object_set_new(out, "rope_scaling", scaling);
    json_object_set_new(out, "rope_parameters", params);
}

