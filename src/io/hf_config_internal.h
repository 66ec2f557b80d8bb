/*
 * hf_config_internal — the config.json reader that hf_config.c and the
 * families' own readers (hf_gemma.c) share: a reader records each key it
 * looks at, so that hfc_check_other_keys can account for every other one.
 * Private to io/.
 */
#ifndef SHARDLM_HF_CONFIG_INTERNAL_H
#define SHARDLM_HF_CONFIG_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>

/* One config.json being read: its path for messages, the transformers class
 * whose defaults apply (for the log), and the keys read so far. */
struct reader {
    json_t *root;
    const char *path;
    const char *cls; /* "LlamaConfig", ... */
    json_t *used;    /* object: key -> true */
};

bool hfc_in_list(const char *const *list, const char *s);
/* The value of key (NULL: absent or null), recorded as read. */
json_t *hfc_get(struct reader *r, const char *key);
void hfc_log_default(const struct reader *r, const char *key, const char *value);
/* A positive integer (def when absent, logged; def < 0: required). */
long long hfc_int_key(struct reader *r, const char *key, long long def);
/* A finite number (def when absent, logged as def_text). */
double hfc_num_key(struct reader *r, const char *key, double def, const char *def_text);
bool hfc_bool_key(struct reader *r, const char *key, bool def, bool quiet);
const char *hfc_str_key(struct reader *r, const char *key, const char *def);
/* dtype / torch_dtype checked. */
void hfc_read_dtype(struct reader *r);
/* Every key not read: inert, fixed at its default, refused as a setting of the computation, or warned about. */
void hfc_check_other_keys(struct reader *r);
/* rope_theta, rope_scaling and partial_rotary_factor of the whole model (one setting for every layer; layer_types:
 * the file's, or NULL), from either spelling: puts the shardlm keys (hf_rope.c). */
void hfc_read_rope(struct reader *r, json_t *layer_types, long long max_pos, void (*put)(void *, const char *, json_t *),
                   void *ctx);
struct model_config;
/* The model's rotary settings into an exported config.json in both spellings (hf_rope.c). */
void hfc_put_rope(json_t *out, const struct model_config *c);
/* One rotary dictionary into {"rope_theta": x, "rope_scaling": {...} or null} (a new object); where names it in
 * messages. */
json_t *hfc_read_rope_dict(struct reader *r, json_t *d, const char *where, double top_theta, bool top_given,
                           long long max_pos);

/* Gemma 2 and Gemma 3 (hf_gemma.c), after the keys they share with the Llama-like families (hf_config.c
 * llama_keys): layer_types as sliding_window_pattern, the window, the rotary settings of each layer type, the
 * soft-caps and query_pre_attn_scalar, put as shardlm's model keys. */
void hfc_gemma_keys(struct reader *r, long long n_layer, long long head_dim, long long max_pos,
                    void (*put)(void *, const char *, json_t *), void *ctx);
/* The window as shardlm's model keys: model.sliding_window, and model.sliding_layers unless every layer slides. */
struct attention_layers;
void hfc_put_window(const struct attention_layers *att, long long L, void (*put)(void *, const char *, json_t *),
                    void *ctx);
/* Gemma3ForConditionalGeneration: text becomes a reader of a copy of its text_config (the language model; the
 * caller frees text->root and text->used) with the outer tie_word_embeddings, every other key of the outer file
 * is marked read and the vision tower's skipping logged; true then. False (text
 * untouched) for the other architectures. */
bool hfc_gemma_text_config(struct reader *outer, struct reader *text, const char *architecture);
/* After the keys are read: text's other keys accounted for and text freed, when it is not outer itself. */
void hfc_gemma_text_done(const struct reader *outer, struct reader *text);
/* The config.json an export of a Gemma model writes, from out (the source's, or empty): first its base (a
 * multimodal source's text_config becomes the whole file of a Gemma3ForCausalLM; the object returned replaces
 * out), then, after the keys the Llama-like families share, Gemma's own keys. */
struct model_config;
json_t *hfc_gemma_config_base(json_t *out);
void hfc_gemma_config_keys(const struct model_config *c, json_t *out);

#endif
