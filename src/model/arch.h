/*
 * arch — the model architectures shardlm knows, in one table (as llama.cpp's
 * llama-arch): per family its model.type name, the names Hugging Face gives
 * it in config.json ("architectures" and "model_type"), PEFT's default LoRA
 * target modules, and the presets of published shapes (model.preset). Code
 * that tells the families apart by name asks this table; the families'
 * kernels are in families/ (struct family), their tensors in model.c.
 *
 * Data only: nothing here builds a model or opens a file, so the config
 * layer may read it.
 */
#ifndef SHARDLM_ARCH_H
#define SHARDLM_ARCH_H

#include <stdbool.h>

enum arch_id { ARCH_GPT2, ARCH_LLAMA, ARCH_GEMMA, ARCH_COUNT };

struct arch {
    enum arch_id id;
    const char *type; /* model.type: "gpt2", "llama" */
    /* config.json's "architectures" names read as this family, NULL-ended,
     * each beside its "model_type" (hf_model_types, same order); the first
     * pair is what an export writes */
    const char *const *hf_architectures;
    const char *const *hf_model_types;
    /* PEFT's default lora.target_modules (peft/utils/constants.py,
     * TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING), NULL-ended */
    const char *const *lora_targets;
};

/* The entry of family id. */
const struct arch *arch_get(enum arch_id id);
/* The family whose model.type is type, or NULL. */
const struct arch *arch_find(const char *type);
/* Whether type is family id's model.type. */
bool arch_is(const char *type, enum arch_id id);
/* "gpt2, llama" for messages. */
const char *arch_type_names(void);
/* The family that reads config.json architecture name, or NULL. */
const struct arch *arch_find_hf(const char *architecture);
/* The architecture name of a config.json model_type ("llama" ->
 * "LlamaForCausalLM"), or NULL. */
const char *arch_hf_architecture_of(const char *model_type);

/* Published shapes (model.preset). */
struct model_preset {
    const char *name;
    const char *type;
    int n_layer, n_head, n_kv_head, n_embd, ffn_dim, n_positions, vocab_size;
    double published_params; /* the total the paper / model card gives, for tests */
    int head_dim;            /* 0: n_embd / n_head */
    bool qkv_bias, qk_norm;  /* Qwen2's q|k|v biases, Qwen3's q/k norms (model_config) */
    int window_pattern;      /* Gemma: local layers to one global (model_config) */
    double rope_local_theta; /* Gemma 3: the local layers' rotary base */
};
/* The preset called name, or NULL. */
const struct model_preset *arch_find_preset(const char *name);
/* "gpt2-124m, gpt2-350m, ..." for messages. */
const char *arch_preset_names(void);
extern const struct model_preset arch_presets[];
extern const int arch_n_presets;

#endif
