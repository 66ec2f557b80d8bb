/*
 * hf — Hugging Face model directories: config.json to shardlm's model keys
 * and back, the names of a family's tensors in a Hugging Face checkpoint, and
 * the weights of DIR as the source of a run's initial parameters, each rank
 * reading only the element ranges it owns (safetensors.h).
 *
 * Architectures: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and
 * Qwen3ForCausalLM (model.type "llama": Llama's block, with Qwen2's q|k|v
 * biases or Qwen3's q/k norms and head_dim), GPT2LMHeadModel ("gpt2");
 * mixture-of-experts models are refused naming what is missing, anything
 * else with the list (hf_config.c reads config.json, one row per
 * architecture). Tensor names: a Llama's are shardlm's own; a GPT-2 checkpoint's may
 * carry the "transformer." prefix, its tied lm_head.weight is not read, and
 * the attn.bias / attn.masked_bias buffers of older files are ignored.
 */
#ifndef SHARDLM_HF_H
#define SHARDLM_HF_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "hf_bnb.h"
#include "model/model.h"
#include "safetensors.h"

#define HF_ARCHITECTURES                                                                                               \
    "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM, Gemma2ForCausalLM, " \
    "Gemma3ForCausalLM, Gemma3ForConditionalGeneration (text), GPT2LMHeadModel"

/* Reads DIR/config.json and calls put(ctx, key, value) for every shardlm
 * model key it determines ("type", "n_layer", ...; value a new reference the
 * callee owns). Refuses (fail_input, naming the file and the field) an
 * unknown architecture and settings shardlm does not implement (a hidden_act
 * other than silu, attention or MLP biases in a Llama, a GPT-2 activation
 * other than gelu_new, ...). A sliding window (Mistral's, Phi-3's, Qwen's
 * use_sliding_window) puts sliding_window and, unless every layer slides,
 * sliding_layers (the layers from 0 that do). */
void hf_config_keys(const char *dir, void (*put)(void *ctx, const char *key, json_t *value), void *ctx);

/* Whether DIR/config.json says its weights are bitsandbytes' 4-bit (1, with
 * the type, enum quant4_type, and the double quantization), 0 when it has no
 * quantization_config; another quantization is fail_input. */
int hf_quantization(const char *dir, int *quant_type, bool *double_quant);

/* config.json for model m in dtype dt (torch_dtype), as transformers writes
 * it; when src_dir is given, its config.json's other fields (token ids,
 * initializer_range, ...) are kept. A new reference. */
json_t *hf_config_json(const struct model *m, enum dtype dt, const char *src_dir);

/* Whether DIR/config.json describes another shape than model m's: 1 with
 * the first field that differs in *key and its values in *have (the file's;
 * -1: absent) and *want (m's), 0 when every field that lays out the tensors
 * agrees, -1 when the file is missing or not a JSON object. */
int hf_config_differs(const struct model *m, const char *dir, const char **key, long long *have, long long *want);

/* The source of a run's initial parameters: DIR's weights. */
struct hf_source {
    const struct model *m;
    struct st_model st;
    const struct st_tensor ***map; /* [unit][tensor]: the file's tensor, NULL when not read (tied) */
    size_t **elem0;                /* [unit][tensor]: where in the file's tensor it starts (a fused part's rows) */
    struct hf_bnb_weight **bnb;    /* [file tensor]: the reader of a 4-bit weight (hf_bnb.h), NULL: not 4-bit */
    bool *bnb_used;                /* [file tensor]: a 4-bit weight's companion (absmax, quant state, ...) */
    int bnb_weights;               /* how many weights are 4-bit (a directory saved from a bitsandbytes model) */
    /* tied, with an lm_head.weight beside it: the embedding's own tensor, read in its place (hf.c says why) */
    const struct st_tensor *tied_embed_unread;
    char dir[1024];
};

/* Opens DIR's weights and checks that every tensor of m is there with the
 * shape config.json implies (fail_input naming the file and the tensor). A
 * linear weight stored as bitsandbytes' 4-bit (hf_bnb.h) is read dequantized. */
void hf_source_open(struct hf_source *s, const struct model *m, const char *dir);
void hf_source_close(struct hf_source *s);
/* fp32 values of unit u's elements [begin, begin + count): the file's
 * tensors where the unit has them, zero in alignment gaps and padded rows. */
void hf_source_read(void *source, int u, size_t begin, size_t count, float *out);
/* The same elements in dtype dt, read as the files store them, when every
 * tensor of unit u is stored in dt (true; the same answer on every rank);
 * false, reading nothing, when one is not. landed (optional) is told each
 * time the first k elements of out are final. */
bool hf_source_read_as(void *source, int u, size_t begin, size_t count, enum dtype dt, void *out,
                       void (*landed)(void *ctx, size_t elems), void *ctx);
/* A 4-bit weight's share as the directory stores it (hf_bnb_read_q4): tensor t of unit u, elements
 * [first, first + n); param_source.read_q4 (zero.h). A weight not stored 4-bit is an input error. */
void hf_source_read_q4(void *source, int u, int t, size_t first, size_t n, const struct quant4_range *out);
/* Bytes of the file tensors the model reads (buffers and unused tensors not counted). */
double hf_source_bytes(const struct hf_source *s);

/* Whether tensor t of m is part of a fused Hugging Face tensor (Phi-3's
 * qkv_proj, gate_up_proj, when m->cfg.fused_projections): the whole's name
 * into whole, its rows in *whole_rows, and the part's first row in *row0. The
 * parts follow each other in their unit without gaps (model.c packs them),
 * so the whole is one contiguous range of the unit as well. */
bool hf_fused_part(const struct model *m, const struct tensor_desc *t, char *whole, size_t cap, int *row0,
                   int *whole_rows);

/* The name tensor t of m has in a Hugging Face checkpoint ("transformer."
 * prefixed for GPT-2 when prefix is set), into out. */
void hf_tensor_name(const struct model *m, const struct tensor_desc *t, int prefix, char *out, size_t cap);

/* Copies the tokenizer and generation files of src_dir (tokenizer.json,
 * tokenizer_config.json, special_tokens_map.json, tokenizer.model,
 * generation_config.json, vocab.json, merges.txt, chat_template.jinja,
 * chat_template.json and additional_chat_templates/'s *.jinja, when present)
 * into dst_dir. */
void hf_copy_tokenizer(const char *src_dir, const char *dst_dir);

/* Fails (exit status 2) when PATH is a GGUF file (llama.cpp), naming the
 * conversion command; WHAT names the option or argument that gave it. */
void hf_refuse_gguf(const char *path, const char *what);

#endif
