/*
 * arch — the table of model architectures and presets (arch.h).
 */
#include "arch.h"

#include <stdio.h>
#include <string.h>

static const char type_gpt2[] = "gpt2", type_llama[] = "llama", type_gemma[] = "gemma";

static const char *const gpt2_hf_architectures[] = {"GPT2LMHeadModel", NULL};
static const char *const gpt2_hf_model_types[] = {"gpt2", NULL};
static const char *const gpt2_lora_targets[] = {"c_attn", NULL};
/* the Llama-like families: Llama's block, with Qwen2's q|k|v biases, Qwen3's q/k norms and head_dim
 * (io/hf_config.c reads which) */
static const char *const llama_hf_architectures[] = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                                     "Qwen3ForCausalLM", "Phi3ForCausalLM", NULL};
static const char *const llama_hf_model_types[] = {"llama", "mistral", "qwen2", "qwen3", "phi3", NULL};
static const char *const llama_lora_targets[] = {"q_proj", "v_proj", NULL};

/* Gemma 2 and 3 (text): the Llama block's projections with four (1 + w) norms, GeGLU, scaled embeddings; the
 * language model of Gemma3ForConditionalGeneration read alone (io/hf_gemma.c) */
static const char *const gemma_hf_architectures[] = {"Gemma2ForCausalLM", "Gemma3ForCausalLM",
                                                     "Gemma3ForConditionalGeneration", NULL};
static const char *const gemma_hf_model_types[] = {"gemma2", "gemma3_text", "gemma3", NULL};

static const struct arch arches[ARCH_COUNT] = {
    [ARCH_GPT2] = {ARCH_GPT2, type_gpt2, gpt2_hf_architectures, gpt2_hf_model_types, gpt2_lora_targets},
    [ARCH_LLAMA] = {ARCH_LLAMA, type_llama, llama_hf_architectures, llama_hf_model_types, llama_lora_targets},
    [ARCH_GEMMA] = {ARCH_GEMMA, type_gemma, gemma_hf_architectures, gemma_hf_model_types, llama_lora_targets},
};

const struct arch *arch_get(enum arch_id id) { return &arches[id]; }

const struct arch *arch_find(const char *type)
{
    for (int i = 0; i < ARCH_COUNT; i++)
        if (strcmp(arches[i].type, type) == 0)
            return &arches[i];
    return NULL;
}

bool arch_is(const char *type, enum arch_id id) { return strcmp(type, arches[id].type) == 0; }

/* "a, b, c" from name(0) .. name(n - 1), into out. */
static const char *name_list(char *out, size_t cap, int count, const char *(*name)(int))
{
    size_t n = 0;
    out[0] = '\0';
    for (int i = 0; i < count && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "%s%s", i ? ", " : "", name(i));
    return out;
}

static const char *type_at(int i) { return arches[i].type; }

const char *arch_type_names(void)
{
    static char names[64];
    return name_list(names, sizeof names, ARCH_COUNT, type_at);
}

const struct arch *arch_find_hf(const char *architecture)
{
    for (int i = 0; i < ARCH_COUNT; i++)
        for (const char *const *a = arches[i].hf_architectures; *a; a++)
            if (strcmp(*a, architecture) == 0)
                return &arches[i];
    return NULL;
}

const char *arch_hf_architecture_of(const char *model_type)
{
    for (int i = 0; i < ARCH_COUNT; i++)
        for (int k = 0; arches[i].hf_model_types[k]; k++)
            if (strcmp(arches[i].hf_model_types[k], model_type) == 0)
                return arches[i].hf_architectures[k];
    return NULL;
}

/* Published shapes. GPT-2: Radford et al. 2019 (HF gpt2, gpt2-medium, -large,
 * -xl; the 124M..1.5B names count the tied head once). Llama 2: Touvron et al.
 * 2023, HF meta-llama/Llama-2-*-hf config.json (70B: grouped-query attention
 * with 8 KV heads); parameter totals: the Hugging Face checkpoints' exact counts
 * (6.74 B, 13.0 B, 68.98 B as published). Llama 3.1 8B (Llama 3 8B's shape, context 131072) and 70B, Qwen2.5 7B/72B (q|k|v
 * biases) and Qwen3 8B/32B (head_dim 128, q/k norms): their Hugging Face
 * config.json, untied, and the exact totals of their safetensors indexes. Phi-4 (14B): microsoft/phi-4's
 * config.json (Phi3ForCausalLM, 10 KV heads, untied), the total computed from that shape. Gemma 2 9B/27B and Gemma 3
 * 4B/12B/27B: google/gemma-2-*, google/gemma-3-*-pt config.json (text_config for Gemma 3: head_dim 256 but
 * 128 on 27B, vocabulary 256000 / 262208, tied), the totals computed from those shapes (Gemma 3's language
 * model alone, without the vision tower). */
const struct model_preset arch_presets[] = {
    {"gpt2-124m", type_gpt2, 12, 12, 12, 768, 3072, 1024, 50257, 124439808.0, 0, false, false, 0, 0},
    {"gpt2-350m", type_gpt2, 24, 16, 16, 1024, 4096, 1024, 50257, 354823168.0, 0, false, false, 0, 0},
    {"gpt2-774m", type_gpt2, 36, 20, 20, 1280, 5120, 1024, 50257, 774030080.0, 0, false, false, 0, 0},
    {"gpt2-1.5b", type_gpt2, 48, 25, 25, 1600, 6400, 1024, 50257, 1557611200.0, 0, false, false, 0, 0},
    {"llama2-7b", type_llama, 32, 32, 32, 4096, 11008, 4096, 32000, 6738415616.0, 0, false, false, 0, 0},
    {"llama2-13b", type_llama, 40, 40, 40, 5120, 13824, 4096, 32000, 13015864320.0, 0, false, false, 0, 0},
    {"llama2-70b", type_llama, 80, 64, 8, 8192, 28672, 4096, 32000, 68976648192.0, 0, false, false, 0, 0},
    {"llama3-8b", type_llama, 32, 32, 8, 4096, 14336, 8192, 128256, 8030261248.0, 0, false, false, 0, 0},
    {"llama3.1-8b", type_llama, 32, 32, 8, 4096, 14336, 131072, 128256, 8030261248.0, 0, false, false, 0, 0},
    {"llama3.1-70b", type_llama, 80, 64, 8, 8192, 28672, 131072, 128256, 70553706496.0, 0, false, false, 0, 0},
    {"qwen2.5-7b", type_llama, 28, 28, 4, 3584, 18944, 32768, 152064, 7615616512.0, 0, true, false, 0, 0},
    {"qwen2.5-72b", type_llama, 80, 64, 8, 8192, 29568, 32768, 152064, 72706203648.0, 0, true, false, 0, 0},
    {"qwen3-8b", type_llama, 36, 32, 8, 4096, 12288, 40960, 151936, 8190735360.0, 128, false, true, 0, 0},
    {"qwen3-32b", type_llama, 64, 64, 8, 5120, 25600, 40960, 151936, 32762123264.0, 128, false, true, 0, 0},
    {"phi-4", type_llama, 40, 40, 10, 5120, 17920, 16384, 100352, 14659507200.0, 0, false, false, 0, 0},
    {"gemma-2-9b", type_gemma, 42, 16, 8, 3584, 14336, 8192, 256000, 9241705984.0, 256, false, false, 2, 0},
    {"gemma-2-27b", type_gemma, 46, 32, 16, 4608, 36864, 8192, 256000, 27227128320.0, 128, false, false, 2, 0},
    {"gemma-3-4b", type_gemma, 34, 8, 4, 2560, 10240, 131072, 262208, 3880263168.0, 256, false, true, 6, 10000.0},
    {"gemma-3-12b", type_gemma, 48, 16, 8, 3840, 15360, 131072, 262208, 11766034176.0, 256, false, true, 6, 10000.0},
    {"gemma-3-27b", type_gemma, 62, 32, 16, 5376, 21504, 131072, 262208, 27009346304.0, 128, false, true, 6, 10000.0},
};
const int arch_n_presets = (int)(sizeof arch_presets / sizeof arch_presets[0]);

const struct model_preset *arch_find_preset(const char *name)
{
    for (int i = 0; i < arch_n_presets; i++)
        if (strcmp(arch_presets[i].name, name) == 0)
            return &arch_presets[i];
    return NULL;
}

static const char *preset_at(int i) { return arch_presets[i].name; }

const char *arch_preset_names(void)
{
    static char names[256];
    return name_list(names, sizeof names, arch_n_presets, preset_at);
}
