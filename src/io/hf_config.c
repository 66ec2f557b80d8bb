/*
 * hf_config — config.json in and out (declared in hf.h): what shardlm reads
 * of a Hugging Face directory's config.json, as transformers 4.x and 5.x
 * write it, and the config.json an export writes so that both load it as the
 * same model.
 *
 * Every key of the file is accounted for, so that a model is never silently
 * read as another one:
 *  - the keys a family reads (the reader records each one it looks at);
 *  - keys known not to change what the model computes (inert_keys below);
 *  - keys that are inert only at one value (fixed_keys: pruned_heads {}, ...);
 *  - anything else is unknown: refused, naming it, when its name says it is a
 *    rope, attention, norm, activation or other setting of the computation
 *    (computation_words), else accepted with one warning line listing them.
 * A key that is absent takes the default transformers' own configuration
 * class gives it for that architecture (transformers 4.40 and 5.25 agree on
 * every one read here), and the log says which default was taken.
 *
 * transformers 5 moved the rotary settings into "rope_parameters" (rope_type,
 * rope_theta and the scaling keys; nested by layer type for models with local
 * and global layers) and writes "dtype" for "torch_dtype". Both spellings are
 * read with transformers 5's precedence (modeling_rope_utils.py,
 * convert_rope_params_to_dict): a non-null rope_scaling wins over
 * rope_parameters, a rope_theta inside the dictionary wins over a top-level
 * one, and llama3 scaling without original_max_position_embeddings takes
 * max_position_embeddings.
 */
#include "hf.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/dtype.h"
#include "core/hf_json.h"
#include "core/quant4.h"
#include "core/util.h"
#include "hf_export.h"
#include "hf_config_internal.h"
#include "model/arch.h"
#include "model/model.h"

static void check_quantization(const char *path, json_t *q);

/* ---- the keys ------------------------------------------------------------------------- */

/* Keys that do not change what the model computes, whatever their value:
 * bookkeeping, token ids (the tokenizer's and generation's business), the
 * generation settings transformers 4 kept in config.json, output switches,
 * GPT-2's sequence-summary head (GPT2DoubleHeadsModel, not the LM),
 * pretraining_tp (Llama's sliced matmuls: the same product), and the dropout
 * rates (training-time noise; shardlm trains without dropout and says so). */
static const char *const inert_keys[] = {
    "transformers_version", "initializer_range", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id",
    "sep_token_id", "decoder_start_token_id", "id2label", "label2id", "problem_type", "return_dict",
    "output_attentions", "output_hidden_states", "torchscript", "use_bfloat16", "tf_legacy_loss",
    "chunk_size_feed_forward", "finetuning_task", "tokenizer_class", "prefix", "task_specific_params", "is_decoder",
    "cross_attention_hidden_size", "tie_encoder_decoder", "pretraining_tp", HF_ORIGIN_KEY,
    /* generation settings of transformers 4 (GenerationConfig's since) */
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
    "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    /* GPT-2's sequence-summary head */
    "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels", "summary_first_dropout",
    /* dropout (logged when not zero) */
    "attention_dropout", "attn_pdrop", "embd_pdrop", "resid_pdrop", NULL};

/* The dropout keys among them: a non-zero rate is logged once. */
static const char *const dropout_keys[] = {"attention_dropout", "attn_pdrop", "embd_pdrop", "resid_pdrop", NULL};

/* Keys that are inert only at the value transformers writes by default: any
 * other value changes the model's layout or computation. */
static const struct {
    const char *key, *value; /* the value as JSON */
    const char *meaning;
} fixed_keys[] = {
    {"pruned_heads", "{}", "heads pruned from the attention"},
    {"add_cross_attention", "false", "cross-attention layers"},
    {"is_encoder_decoder", "false", "an encoder-decoder model"},
};

/* Words (between underscores) that mark an unknown key as a setting of the
 * computation: refused rather than ignored. */
static const char *const computation_words[] = {
    "rope", "rotary", "attn", "attention", "norm", "layernorm", "rmsnorm", "eps", "epsilon", "act", "activation",
    "gelu", "silu", "softcap", "softcapping", "logit", "logits", "scale", "scaling", "scalar", "multiplier", "window",
    "sliding", "bias", "qk", "qkv", "kv", "head", "heads", "expert", "experts", "moe", "residual", "alibi", "position",
    "positions", "embedding", "embeddings", "embd", "layer", "layers", "hidden", "intermediate", "mlp", "ffn",
    "clip", "quantization", "partial", "parallel", "dim", "query", NULL};

bool hfc_in_list(const char *const *list, const char *s)
{
    for (; *list; list++)
        if (strcmp(*list, s) == 0)
            return true;
    return false;
}

static bool is_computation_key(const char *key)
{
    char word[64];
    for (const char *p = key; *p;) {
        size_t n = strcspn(p, "_");
        if (n > 0 && n < sizeof word) {
            memcpy(word, p, n);
            word[n] = '\0';
            if (hfc_in_list(computation_words, word))
                return true;
        }
        p += n + (p[n] == '_');
    }
    return false;
}

/* ---- reading --------------------------------------------------------------------------- */

json_t *hfc_get(struct reader *r, const char *key)
{
    json_object_set_new(r->used, key, json_true());
    json_t *v = json_object_get(r->root, key);
    return v && !json_is_null(v) ? v : NULL;
}

void hfc_log_default(const struct reader *r, const char *key, const char *value)
{
    log_info("%s has no %s: transformers' %s default, %s", r->path, key, r->cls, value);
}

/* A positive integer (def when absent, logged; def < 0: required). */
long long hfc_int_key(struct reader *r, const char *key, long long def)
{
    json_t *v = hfc_get(r, key);
    if (!v) {
        if (def < 0)
            fail_input("%s: '%s' is missing; shardlm needs it to lay out the model", r->path, key);
        char text[32];
        snprintf(text, sizeof text, "%lld", def);
        hfc_log_default(r, key, text);
        return def;
    }
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > (1ll << 31))
        fail_input("%s: '%s' must be a positive integer", r->path, key);
    return json_integer_value(v);
}

/* The first of two spellings present (GPT-2's n_embd or hidden_size, ...). */
static long long int_key2(struct reader *r, const char *key, const char *alias, long long def)
{
    hfc_get(r, alias);
    if (json_object_get(r->root, alias) && !json_object_get(r->root, key))
        return hfc_int_key(r, alias, def);
    return hfc_int_key(r, key, def);
}

double hfc_num_key(struct reader *r, const char *key, double def, const char *def_text)
{
    json_t *v = hfc_get(r, key);
    if (!v) {
        hfc_log_default(r, key, def_text);
        return def;
    }
    double x;
    if (!hf_json_number(v, &x) || !isfinite(x))
        fail_input("%s: '%s' must be a finite number", r->path, key);
    return x;
}

bool hfc_bool_key(struct reader *r, const char *key, bool def, bool quiet)
{
    json_t *v = hfc_get(r, key);
    if (!v) {
        if (!quiet)
            hfc_log_default(r, key, def ? "true" : "false");
        return def;
    }
    if (!json_is_boolean(v))
        fail_input("%s: '%s' must be true or false", r->path, key);
    return json_is_true(v);
}

const char *hfc_str_key(struct reader *r, const char *key, const char *def)
{
    json_t *v = hfc_get(r, key);
    if (!v)
        return def;
    if (!json_is_string(v))
        fail_input("%s: '%s' must be a string", r->path, key);
    return json_string_value(v);
}

/* dtype (transformers 5) or torch_dtype (4.x): how the weights are stored.
 * Checked only: the run's precision is its own config's, and the weights are
 * read in whatever dtype each tensor's header gives. */
void hfc_read_dtype(struct reader *r)
{
    const char *dt = hfc_str_key(r, "dtype", NULL), *old = hfc_str_key(r, "torch_dtype", NULL);
    const char *name = dt ? dt : old;
    static const char *const known[] = {"float32", "float16", "bfloat16", "auto", "float64", NULL};
    if (name && !hfc_in_list(known, name))
        fail_input("%s: '%s' is \"%s\"; shardlm reads weights stored as float32, float16 or bfloat16", r->path,
                   dt ? "dtype" : "torch_dtype", name);
}

/* Every key of the file not read by the family: inert, fixed at its
 * default, refused as a setting of the computation, or warned about. */
void hfc_check_other_keys(struct reader *r)
{
    const char *key;
    json_t *v;
    char unknown[512] = "";
    json_object_foreach(r->root, key, v) {
        if (json_object_get(r->used, key) || key[0] == '_')
            continue; /* read, or private (_name_or_path, _attn_implementation: how, not what) */
        if (hfc_in_list(inert_keys, key)) {
            double rate;
            if (hfc_in_list(dropout_keys, key) && hf_json_number(v, &rate) && rate != 0)
                log_info("%s: %s is %g; shardlm trains without dropout", r->path, key, rate);
            continue;
        }
        bool fixed = false;
        for (size_t i = 0; i < sizeof fixed_keys / sizeof fixed_keys[0]; i++) {
            if (strcmp(key, fixed_keys[i].key) != 0)
                continue;
            json_t *want = json_loads(fixed_keys[i].value, JSON_DECODE_ANY, NULL);
            bool same = json_is_null(v) || json_equal(v, want);
            json_decref(want);
            if (!same)
                fail_input("%s: '%s' is not %s: %s are not implemented; shardlm reads the model transformers "
                           "builds with the default",
                           r->path, key, fixed_keys[i].value, fixed_keys[i].meaning);
            fixed = true;
        }
        if (fixed)
            continue;
        if (strcmp(key, "quantization_config") == 0) {
            check_quantization(r->path, v);
            continue;
        }
        if (is_computation_key(key))
            fail_input("%s: '%s' is not a %s setting shardlm implements, and it may change what the model computes; "
                       "remove it if it does not apply to this model",
                       r->path, key, r->cls);
        size_t len = strlen(unknown);
        if (len + strlen(key) + 3 < sizeof unknown)
            snprintf(unknown + len, sizeof unknown - len, "%s%s", len ? ", " : "", key);
    }
    if (unknown[0])
        log_warn("%s: keys shardlm does not know, taken as not changing the model: %s", r->path, unknown);
}

/* config.json's quantization_config: bitsandbytes' 4-bit (read, hf_bnb.h)
 * or refused, naming the method (GPTQ, AWQ, GGUF, compressed-tensors, 8-bit). */
static void check_quantization(const char *path, json_t *q)
{
    const char *method = json_string_value(json_object_get(q, "quant_method"));
    if (!method || strcmp(method, "bitsandbytes") != 0)
        fail_input("%s: quantization_config.quant_method is \"%s\": shardlm reads unquantized weights or "
                   "bitsandbytes' 4-bit ones, not %s; give the unquantized model's directory (a quantization "
                   "section quantizes it as it is read)",
                   path, method ? method : "(none)", method ? method : "this format");
    if (!json_is_true(json_object_get(q, "load_in_4bit")))
        fail_input("%s: quantization_config is bitsandbytes without load_in_4bit (LLM.int8): shardlm reads only "
                   "4-bit bitsandbytes weights; give the unquantized model's directory",
                   path);
}

int hf_quantization(const char *dir, int *quant_type, bool *double_quant)
{
    char path[2100];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *root = util_irregular(path) ? NULL : hf_json_load_file(path, 0, NULL);
    json_t *q = root ? json_object_get(root, "quantization_config") : NULL;
    int found = 0;
    if (json_is_object(q)) {
        check_quantization(path, q);
        const char *type = json_string_value(json_object_get(q, "bnb_4bit_quant_type"));
        *quant_type = quant4_type_parse(type ? type : "fp4");
        if (*quant_type < 0)
            fail_input("%s: quantization_config.bnb_4bit_quant_type \"%s\" is not nf4 or fp4", path, type);
        *double_quant = json_is_true(json_object_get(q, "bnb_4bit_use_double_quant"));
        found = 1;
    }
    json_decref(root);
    return found;
}

/* The layer types of layer_types (transformers 5), each checked against
 * allowed ("full_attention", ...); NULL when the file has none. */
static json_t *read_layer_types(struct reader *r, long long n_layer, const char *const *allowed)
{
    json_t *lt = hfc_get(r, "layer_types");
    if (!lt)
        return NULL;
    if (!json_is_array(lt) || (long long)json_array_size(lt) != n_layer)
        fail_input("%s: 'layer_types' must be a list of num_hidden_layers (%lld) strings", r->path, n_layer);
    size_t i;
    json_t *e;
    json_array_foreach(lt, i, e) {
        if (!json_is_string(e) || !hfc_in_list(allowed, json_string_value(e)))
            fail_input("%s: layer_types[%zu] is %s; %s layers here may only be \"%s\"", r->path, i,
                       json_is_string(e) ? json_string_value(e) : "not a string", r->cls, allowed[0]);
    }
    return lt;
}

/* ---- families ------------------------------------------------------------------------- */

/* The Llama-like architectures: what each one's block has, and the defaults
 * of transformers' configuration class for the keys shardlm reads (the same
 * in 4.40 and 5.25 for Llama and Mistral; Qwen2Config and Qwen3Config of
 * 5.25). One row per architecture: the readers and the export ask it, never
 * the architecture's name. */
struct llama_like {
    const char *architecture, *model_type, *cls;
    long long vocab, hidden, ffn, layers, heads, kv_heads /* -1: heads */, max_pos;
    long long head_dim;   /* -1: hidden / heads */
    long long window;     /* Mistral: sliding_window when absent (0: none) */
    bool qkv_bias;        /* Qwen2: q_proj, k_proj, v_proj always carry biases */
    bool qk_norm;         /* Qwen3: q_norm and k_norm */
    bool bias_keys;       /* attention_bias (and, Llama, mlp_bias) are keys of the class, refused when true */
    bool mlp_bias_key;
    bool qwen_window;     /* use_sliding_window / sliding_window / max_window_layers (Qwen) */
    bool fused;           /* Phi-3: qkv_proj and gate_up_proj in the files (model_config.fused_projections) */
    double eps;           /* rms_norm_eps when absent */
    const char *eps_text;
    enum arch_id family;  /* the model.type it reads as (Gemma's block is its own family) */
    const char *act_key, *act; /* the activation's key and the one value shardlm implements */
    bool tied;            /* tie_word_embeddings when absent */
    bool window_key;      /* sliding_window, when set, slides every layer (Mistral, Phi-3); LlamaModel ignores it */
};
static const struct llama_like llama_likes[] = {
    {"LlamaForCausalLM", "llama", "LlamaConfig", 32000, 4096, 11008, 32, 32, -1, 2048, -1, 0, false, false, true, true,
     false, false, 1e-6, "1e-6", ARCH_LLAMA, "hidden_act", "silu", false, false},
    {"MistralForCausalLM", "mistral", "MistralConfig", 32000, 4096, 14336, 32, 32, 8, 4096 * 32, -1, 4096, false,
     false, true, true, false, false, 1e-6, "1e-6", ARCH_LLAMA, "hidden_act", "silu", false, true},
    {"Qwen2ForCausalLM", "qwen2", "Qwen2Config", 151936, 4096, 22016, 32, 32, 32, 32768, -1, 0, true, false, false,
     false, true, false, 1e-6, "1e-6", ARCH_LLAMA, "hidden_act", "silu", false, false},
    {"Qwen3ForCausalLM", "qwen3", "Qwen3Config", 151936, 4096, 22016, 32, 32, 32, 32768, 128, 0, false, true, true,
     false, true, false, 1e-6, "1e-6", ARCH_LLAMA, "hidden_act", "silu", false, false},
    /* Phi-3, 3.5 and 4 (sliding_window: Phi3Config's default is none, Phi-3-mini-4k's file gives 2047) */
    {"Phi3ForCausalLM", "phi3", "Phi3Config", 32064, 3072, 8192, 32, 32, -1, 4096, -1, 0, false, false, false, false,
     false, true, 1e-5, "1e-5", ARCH_LLAMA, "hidden_act", "silu", false, true},
    /* Gemma 2 and 3 (hf_gemma.c reads their window, layer types, rotary settings and soft-caps) */
    {"Gemma2ForCausalLM", "gemma2", "Gemma2Config", 256000, 2304, 9216, 26, 8, 4, 8192, 256, 4096, false, false, true,
     false, false, false, 1e-6, "1e-6", ARCH_GEMMA, "hidden_activation", "gelu_pytorch_tanh", true, false},
    {"Gemma3ForCausalLM", "gemma3_text", "Gemma3TextConfig", 262208, 2304, 9216, 26, 8, 4, 131072, 256, 4096, false,
     true, true, false, false, false, 1e-6, "1e-6", ARCH_GEMMA, "hidden_activation", "gelu_pytorch_tanh", true, false},
};

static const struct llama_like *llama_like(const char *architecture)
{
    for (size_t i = 0; i < sizeof llama_likes / sizeof llama_likes[0]; i++)
        if (architecture && strcmp(llama_likes[i].architecture, architecture) == 0)
            return &llama_likes[i];
    return &llama_likes[0];
}

/* A model with sliding layers fits struct attention_layers. */
static void check_windowed_layers(struct reader *r, long long window, long long L)
{
    if (window && L > MODEL_MAX_WINDOWED_LAYERS)
        fail_input("%s: %lld layers with a sliding window; shardlm's windowed models have at most %d layers", r->path,
                   L, MODEL_MAX_WINDOWED_LAYERS);
}

/* Qwen2Config's and Qwen3Config's defaults of 5.25 for the window keys. */
#define QWEN_DEFAULT_WINDOW 4096
#define QWEN_DEFAULT_MAX_WINDOW_LAYERS 28

/* Qwen's window as transformers 5.25 reads it: use_sliding_window (false as
 * released) keeps sliding_window (absent: 4096; null: none), else none; the
 * sliding layers are layer_types' "sliding_attention" entries, or without
 * layer_types the blocks from max_window_layers on (absent: 28). Returns W
 * and marks the sliding blocks in *att. */
static long long qwen_window(struct reader *r, long long L, struct attention_layers *att)
{
    json_t *w = hfc_get(r, "sliding_window"), *m = hfc_get(r, "max_window_layers");
    static const char *const full[] = {"full_attention", NULL};
    static const char *const both[] = {"full_attention", "sliding_attention", NULL};
    if (!hfc_bool_key(r, "use_sliding_window", false, true)) {
        read_layer_types(r, L, full);
        return 0;
    }
    long long window = !w ? QWEN_DEFAULT_WINDOW : json_is_null(w) ? 0 : hfc_int_key(r, "sliding_window", -1);
    if (!w)
        hfc_log_default(r, "sliding_window", "4096");
    json_t *lt = read_layer_types(r, L, window ? both : full);
    long long mwl = QWEN_DEFAULT_MAX_WINDOW_LAYERS; /* 0 is valid: every layer slides */
    if (!lt && window && !m)
        hfc_log_default(r, "max_window_layers", "28");
    else if (!lt && window && (!json_is_integer(m) || (mwl = json_integer_value(m)) < 0))
        fail_input("%s: 'max_window_layers' must be an integer >= 0 (the first layer that slides)", r->path);
    check_windowed_layers(r, window, L);
    for (long long l = 0; window && l < L; l++)
        if (lt ? strcmp(json_string_value(json_array_get(lt, (size_t)l)), "sliding_attention") == 0 : l >= mwl)
            model_attention_set_sliding(att, (int)l);
    return window;
}

/* Mistral's and Phi-3's window: absent takes the class's default (MistralConfig's 4096, Phi3Config's none), null
 * means none. Llama's class has no window (LlamaModel ignores a sliding_window key). */
static long long mistral_window(struct reader *r, const struct llama_like *df)
{
    json_t *w = json_object_get(r->root, "sliding_window");
    json_object_set_new(r->used, "sliding_window", json_true());
    if (!df->window_key)
        return 0;
    if (df->window && !w) {
        hfc_log_default(r, "sliding_window", "4096");
        return df->window;
    }
    return w && !json_is_null(w) ? hfc_int_key(r, "sliding_window", -1) : 0;
}

/* The window as shardlm's model keys: model.sliding_window, and model.sliding_layers unless every layer slides. */
void hfc_put_window(const struct attention_layers *att, long long L, void (*put)(void *, const char *, json_t *),
                    void *ctx)
{
    if (!att->window)
        return;
    put(ctx, "sliding_window", json_integer(att->window));
    json_t *layers = json_array();
    for (int l = 0; l < L; l++)
        if (model_attention_sliding(att, l))
            json_array_append_new(layers, json_integer(l));
    if ((long long)json_array_size(layers) < L)
        put(ctx, "sliding_layers", layers);
    else
        json_decref(layers);
}

static void llama_keys(struct reader *r, const struct llama_like *df, void (*put)(void *, const char *, json_t *),
                       void *ctx)
{
    r->cls = df->cls;
    const char *act = hfc_str_key(r, df->act_key, df->act);
    if (strcmp(act, df->act) != 0)
        fail_input("%s: %s is \"%s\"; shardlm's %s MLP uses %s", r->path, df->act_key, act, df->cls, df->act);
    if (df->bias_keys && (hfc_bool_key(r, "attention_bias", false, true) ||
                          (df->mlp_bias_key && hfc_bool_key(r, "mlp_bias", false, true))))
        fail_input("%s: attention_bias / mlp_bias is true; %s's projections have no biases in shardlm", r->path,
                   df->cls);
    long long C = hfc_int_key(r, "hidden_size", df->hidden), NH = hfc_int_key(r, "num_attention_heads", df->heads);
    /* head_dim: absent is hidden / heads in every class but Qwen3's (128), which is logged as a default */
    long long hd = df->head_dim > 0 || hfc_get(r, "head_dim") ? hfc_int_key(r, "head_dim", df->head_dim) : C / NH;
    /* Qwen3 and Gemma are the families whose attention need not be hidden_size wide */
    if (!df->qk_norm && df->family != ARCH_GEMMA && hd * NH != C)
        fail_input("%s: head_dim %lld x num_attention_heads %lld != hidden_size %lld; shardlm's %s needs head_dim = "
                   "hidden_size / num_attention_heads",
                   r->path, hd, NH, C, df->cls);
    long long L = hfc_int_key(r, "num_hidden_layers", df->layers);
    long long max_pos = hfc_int_key(r, "max_position_embeddings", df->max_pos);
    put(ctx, "type", json_string(arch_get(df->family)->type));
    put(ctx, "n_layer", json_integer(L));
    put(ctx, "n_head", json_integer(NH));
    put(ctx, "n_kv_head", json_integer(hfc_int_key(r, "num_key_value_heads", df->kv_heads < 0 ? NH : df->kv_heads)));
    put(ctx, "n_embd", json_integer(C));
    put(ctx, "ffn_dim", json_integer(hfc_int_key(r, "intermediate_size", df->ffn)));
    put(ctx, "n_positions", json_integer(max_pos));
    put(ctx, "vocab_size", json_integer(hfc_int_key(r, "vocab_size", df->vocab)));
    if (hd * NH != C)
        put(ctx, "head_dim", json_integer(hd));
    if (df->qkv_bias)
        put(ctx, "qkv_bias", json_true());
    if (df->qk_norm)
        put(ctx, "qk_norm", json_true());
    if (df->fused)
        put(ctx, "fused_projections", json_true());
    double eps = hfc_num_key(r, "rms_norm_eps", df->eps, df->eps_text);
    if (!(eps > 0) || eps > 1.0)
        fail_input("%s: 'rms_norm_eps' must be in (0, 1], got %g", r->path, eps);
    put(ctx, "rms_norm_eps", json_real(eps));
    put(ctx, "tie_word_embeddings", json_boolean(hfc_bool_key(r, "tie_word_embeddings", df->tied, false)));
    if (df->family == ARCH_GEMMA) {
        hfc_gemma_keys(r, L, hd, max_pos, put, ctx);
        return;
    }
    if (df->fused) /* Phi-3 keeps it beside rope_parameters; read for longrope, which shardlm refuses */
        hfc_get(r, "original_max_position_embeddings");
    long long window = 0;
    json_t *lt = NULL;
    struct attention_layers window_layers = {0}, *att = &window_layers;
    if (df->qwen_window) {
        window = qwen_window(r, L, att);
        lt = hfc_get(r, "layer_types");
    } else {
        window = mistral_window(r, df);
        static const char *const full[] = {"full_attention", NULL}, *const sliding[] = {"sliding_attention", NULL};
        lt = read_layer_types(r, L, window ? sliding : full);
        check_windowed_layers(r, window, L);
        for (long long l = 0; window && l < L; l++) /* Mistral: every block through the window */
            model_attention_set_sliding(att, (int)l);
    }
    if (window > INT_MAX / 2)
        window = INT_MAX / 2; /* longer than any sequence: the same as full causal attention */
    hfc_read_rope(r, lt, max_pos, put, ctx);
    att->window = (int)window;
    hfc_put_window(att, L, put, ctx);
}

/* Mixture-of-experts architectures: named, so that the refusal says what is missing. */
static const char *const moe_architectures[] = {"MixtralForCausalLM",    "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM",
                                                "GptOssForCausalLM",     "DeepseekV2ForCausalLM",
                                                "DeepseekV3ForCausalLM", "OlmoeForCausalLM",    NULL};

/* GPT2Config's defaults (4.40 and 5.25). */
#define GPT2_DEFAULT_VOCAB 50257
#define GPT2_DEFAULT_POSITIONS 1024
#define GPT2_DEFAULT_EMBD 768
#define GPT2_DEFAULT_LAYERS 12
#define GPT2_DEFAULT_HEADS 12

static void gpt2_keys(struct reader *r, void (*put)(void *, const char *, json_t *), void *ctx)
{
    r->cls = "GPT2Config";
    const char *act = hfc_str_key(r, "activation_function", "gelu_new");
    if (strcmp(act, "gelu_new") != 0 && strcmp(act, "gelu_pytorch_tanh") != 0)
        fail_input("%s: activation_function is \"%s\"; shardlm's GPT-2 uses the tanh GELU (gelu_new)", r->path, act);
    json_t *eps_v = hfc_get(r, "layer_norm_epsilon");
    double eps = 1e-5;
    if (eps_v && (!hf_json_number(eps_v, &eps) || fabs(eps - 1e-5) > 1e-12))
        fail_input("%s: layer_norm_epsilon is %g; shardlm's GPT-2 LayerNorm uses 1e-5", r->path, eps);
    long long C = int_key2(r, "n_embd", "hidden_size", GPT2_DEFAULT_EMBD);
    json_t *inner = hfc_get(r, "n_inner");
    if (inner && (!json_is_integer(inner) || json_integer_value(inner) != 4 * C))
        fail_input("%s: n_inner is not 4 n_embd; shardlm's GPT-2 MLP is 4 n_embd wide", r->path);
    if (hfc_bool_key(r, "scale_attn_by_inverse_layer_idx", false, true) ||
        hfc_bool_key(r, "reorder_and_upcast_attn", false, true) || !hfc_bool_key(r, "scale_attn_weights", true, true))
        fail_input("%s: GPT-2 attention variants (scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn, "
                   "scale_attn_weights false) are not supported",
                   r->path);
    if (!hfc_bool_key(r, "tie_word_embeddings", true, true))
        fail_input("%s: tie_word_embeddings is false; shardlm's GPT-2 ties its LM head to the token embedding",
                   r->path);
    put(ctx, "type", json_string(arch_get(ARCH_GPT2)->type));
    put(ctx, "n_layer", json_integer(int_key2(r, "n_layer", "num_hidden_layers", GPT2_DEFAULT_LAYERS)));
    put(ctx, "n_head", json_integer(int_key2(r, "n_head", "num_attention_heads", GPT2_DEFAULT_HEADS)));
    put(ctx, "n_embd", json_integer(C));
    hfc_get(r, "n_ctx"); /* transformers < 4 kept the context here too; n_positions is what GPT2Config reads */
    put(ctx, "n_positions",
        json_integer(int_key2(r, "n_positions", "max_position_embeddings", GPT2_DEFAULT_POSITIONS)));
    put(ctx, "vocab_size", json_integer(hfc_int_key(r, "vocab_size", GPT2_DEFAULT_VOCAB)));
}

/* ---- config.json ------------------------------------------------------------------------ */

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

/* The architecture: architectures[0], else from model_type. */
static const char *architecture(struct reader *r)
{
    json_t *a = hfc_get(r, "architectures");
    const char *type = hfc_str_key(r, "model_type", NULL);
    if (json_is_array(a) && json_array_size(a) > 0 && json_is_string(json_array_get(a, 0)))
        return json_string_value(json_array_get(a, 0));
    const char *named = type ? arch_hf_architecture_of(type) : NULL;
    if (named)
        return named;
    fail_input("%s: no 'architectures' and model_type '%s'; shardlm reads %s", r->path, type ? type : "(none)",
               HF_ARCHITECTURES);
}

void hf_config_keys(const char *dir, void (*put)(void *ctx, const char *key, json_t *value), void *ctx)
{
    char path[1100];
    struct reader r = {load_config_json(dir, path, sizeof path), path, "PretrainedConfig", json_object()};
    const char *arch = architecture(&r);
    const struct arch *family = arch_find_hf(arch);
    struct reader text = r; /* Gemma3ForConditionalGeneration: its text_config */
    if (family && family->id == ARCH_GEMMA && hfc_gemma_text_config(&r, &text, arch))
        arch = "Gemma3ForCausalLM";
    if (family && family->id != ARCH_GPT2)
        llama_keys(&text, llama_like(arch), put, ctx);
    else if (family && family->id == ARCH_GPT2)
        gpt2_keys(&r, put, ctx);
    else if (hfc_in_list(moe_architectures, arch) || json_object_get(r.root, "num_local_experts") ||
             json_object_get(r.root, "num_experts"))
        fail_input("%s: %s is a mixture-of-experts model, which shardlm does not implement yet (its dense families: "
                   "%s)",
                   path, arch, HF_ARCHITECTURES);
    else
        fail_input("%s: architecture %s is not supported; shardlm reads %s", path, arch, HF_ARCHITECTURES);
    hfc_read_dtype(&r);
    hfc_check_other_keys(&r);
    hfc_gemma_text_done(&r, &text);
    json_decref(r.used);
    json_decref(r.root);
}

/* ---- writing ---------------------------------------------------------------------------- */

static const char *torch_dtype(enum dtype dt)
{
    return dt == DTYPE_BF16 ? "bfloat16" : dt == DTYPE_F16 ? "float16" : "float32";
}

struct int_key {
    const char *key;
    int value;
};

static void set_ints(json_t *out, const struct int_key *keys, size_t n)
{
    for (size_t i = 0; i < n; i++)
        json_object_set_new(out, keys[i].key, json_integer(keys[i].value));
}

/* The model's window in the keys of its architecture: Qwen's use_sliding_window, sliding_window, layer_types and
 * max_window_layers; Mistral's and Phi-3's sliding_window (every layer slides there). Without a window the
 * source's keys stay as they were. */
static void put_export_window(json_t *out, const struct model_config *c, const struct llama_like *df)
{
    int sliding = 0, first = -1;
    for (int l = 0; l < c->n_layer; l++)
        if (model_attention_sliding(&c->attention, l)) {
            sliding++;
            first = first < 0 ? l : first;
        }
    if (!sliding)
        return;
    if (df->qwen_window) {
        json_t *lt = json_array();
        for (int l = 0; l < c->n_layer; l++)
            json_array_append_new(lt, json_string(model_attention_sliding(&c->attention, l) ? "sliding_attention"
                                                                                            : "full_attention"));
        json_object_set_new(out, "use_sliding_window", json_true());
        json_object_set_new(out, "max_window_layers", json_integer(first));
        json_object_set_new(out, "layer_types", lt);
    } else if (!df->window_key || sliding != c->n_layer) {
        fail_input("export: %d of the %d layers attend through a window of %d, which %s cannot say (its window is "
                   "on every layer or none); export from the checkpoint of a model that came with its config.json",
                   sliding, c->n_layer, c->attention.window, df->architecture);
    }
    json_object_set_new(out, "sliding_window", json_integer(c->attention.window));
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
    const bool gemma = arch_is(c->type, ARCH_GEMMA), llama = arch_is(c->type, ARCH_LLAMA) || gemma;
    const struct arch *family = arch_get(gemma ? ARCH_GEMMA : llama ? ARCH_LLAMA : ARCH_GPT2);
    if (llama) {
        out = gemma ? hfc_gemma_config_base(out) : out;
        const char *arch = json_string_value(json_array_get(json_object_get(out, "architectures"), 0));
        /* without a source: the architecture whose block this model has */
        const struct llama_like *df = llama_like(arch ? arch
                                                 : gemma ? (c->qk_norm ? "Gemma3ForCausalLM" : "Gemma2ForCausalLM")
                                                 : c->qk_norm ? "Qwen3ForCausalLM"
                                                 : c->qkv_bias ? "Qwen2ForCausalLM"
                                                 : c->attention.window ? "MistralForCausalLM"
                                                               : family->hf_architectures[0]);
        if (!arch) {
            json_object_set_new(out, "architectures", json_pack("[s]", df->architecture));
            json_object_set_new(out, "model_type", json_string(df->model_type));
        }
        const struct int_key shape[] = {{"hidden_size", c->n_embd},          {"num_hidden_layers", c->n_layer},
                                        {"num_attention_heads", c->n_head},   {"num_key_value_heads", c->n_kv_head},
                                        {"head_dim", c->head_dim},  {"intermediate_size", c->ffn_dim},
                                        {"max_position_embeddings", c->n_positions}, {"vocab_size", c->vocab_size}};
        set_ints(out, shape, sizeof shape / sizeof shape[0]);
        json_object_set_new(out, "rms_norm_eps", json_real(c->norm_eps));
        json_object_set_new(out, "tie_word_embeddings", json_boolean(c->tied_head));
        json_object_set_new(out, df->act_key, json_string(df->act));
        if (df->bias_keys)
            json_object_set_new(out, "attention_bias", json_false());
        if (df->mlp_bias_key)
            json_object_set_new(out, "mlp_bias", json_false());
        if (df->qwen_window && !json_object_get(out, "use_sliding_window"))
            json_object_set_new(out, "use_sliding_window", json_false());
        hfc_put_rope(out, c);
        if (gemma)
            hfc_gemma_config_keys(c, out);
        else
            put_export_window(out, c, df);
    } else {
        json_object_set_new(out, "architectures", json_pack("[s]", family->hf_architectures[0]));
        json_object_set_new(out, "model_type", json_string(family->hf_model_types[0]));
        const struct int_key shape[] = {{"n_embd", c->n_embd},           {"n_layer", c->n_layer},
                                        {"n_head", c->n_head},           {"n_positions", c->n_positions},
                                        {"n_ctx", c->n_positions},       {"vocab_size", c->vocab_size}};
        set_ints(out, shape, sizeof shape / sizeof shape[0]);
        json_object_set_new(out, "activation_function", json_string("gelu_new"));
        json_object_set_new(out, "layer_norm_epsilon", json_real(1e-5));
        json_object_set_new(out, "tie_word_embeddings", json_true());
    }
    /* transformers 5 reads dtype, 4.x torch_dtype (5.x takes dtype when both are there) */
    json_object_set_new(out, "dtype", json_string(torch_dtype(dt)));
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
