/*
 * config_quant — the quantization section (issue 50): transformers'
 * BitsAndBytesConfig names, so that the quantization_config of a config.json
 * (its to_dict()) can be pasted whole. Checked here: the library (only
 * bitsandbytes' formats), the 4-bit type, that a 4-bit base is frozen (a lora
 * section), and that the compute dtype is the run's parameter dtype (shardlm
 * computes in one dtype). Read after lora and the precision sections.
 */
#include "config_internal.h"

#include "core/quant4.h"
#include "core/util.h"

#include <jansson.h>
#include <string.h>

/* transformers' BitsAndBytesConfig default bnb_4bit_quant_type. */
#define QUANT_TYPE_DEFAULT "fp4"

/* A torch dtype name as BitsAndBytesConfig takes it ("bfloat16" or
 * "torch.bfloat16"); 0 with *dt set, -1 when unknown. */
static int parse_torch_dtype(const char *name, enum dtype *dt)
{
    if (strncmp(name, "torch.", 6) == 0)
        name += 6;
    if (strcmp(name, "float32") == 0 || strcmp(name, "float") == 0)
        *dt = DTYPE_F32;
    else if (strcmp(name, "bfloat16") == 0)
        *dt = DTYPE_BF16;
    else if (strcmp(name, "float16") == 0 || strcmp(name, "half") == 0)
        *dt = DTYPE_F16;
    else
        return -1;
    return 0;
}

static const char *torch_dtype_name(enum dtype dt)
{
    return dt == DTYPE_BF16 ? "bfloat16" : dt == DTYPE_F16 ? "float16" : "float32";
}

static void read_skip_modules(json_t *root)
{
    const char *path = "quantization.llm_int8_skip_modules";
    json_t *v = doc_get(root, path);
    if (!v || json_is_null(v))
        return;
    char text[128];
    if (!json_is_array(v))
        fail_input("config: '%s' must be null or a list of module names, got %s", path,
                   json_brief(v, text, sizeof text));
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *name = json_array_get(v, i);
        if (!json_is_string(name) || strcmp(json_string_value(name), "lm_head") != 0)
            fail_input("config: '%s[%zu]' is %s; only \"lm_head\" may be listed (the LM head, embeddings and norms "
                       "stay unquantized; every linear layer of the blocks is quantized)",
                       path, i, json_brief(name, text, sizeof text));
    }
}

void read_quantization(struct config *cfg, json_t *root)
{
    struct quant_config *q = &cfg->quant;
    json_t *section = doc_get(root, "quantization");
    if (!section || json_is_null(section))
        return;
    const char *method = read_str(root, "quantization.quant_method", "bitsandbytes", FILL);
    if (strcmp(method, "bitsandbytes") != 0)
        fail_input("config: 'quantization.quant_method' is \"%s\"; shardlm quantizes with bitsandbytes' 4-bit "
                   "formats only: set it to \"bitsandbytes\" (and start from the unquantized model)",
                   method);
    if (read_bool(root, "quantization.load_in_8bit", false, FILL))
        fail_input("config: 'quantization.load_in_8bit' is true; 8-bit (LLM.int8) bases are not supported: use "
                   "\"load_in_4bit\": true (QLoRA) or remove the quantization section");
    q->load_in_4bit = read_bool(root, "quantization.load_in_4bit", false, FILL);
    const char *type = read_str(root, "quantization.bnb_4bit_quant_type", QUANT_TYPE_DEFAULT, FILL);
    q->quant_type = quant4_type_parse(type);
    if (q->quant_type < 0)
        fail_input("config: 'quantization.bnb_4bit_quant_type' is \"%s\"; known: \"nf4\" (QLoRA's NormalFloat), "
                   "\"fp4\"",
                   type);
    q->double_quant = read_bool(root, "quantization.bnb_4bit_use_double_quant", false, FILL);
    const char *compute = read_str(root, "quantization.bnb_4bit_compute_dtype", torch_dtype_name(cfg->dtype), FILL);
    if (parse_torch_dtype(compute, &q->compute_dtype) != 0)
        fail_input("config: 'quantization.bnb_4bit_compute_dtype' is \"%s\"; known: \"float32\", \"bfloat16\", "
                   "\"float16\"",
                   compute);
    if (q->compute_dtype != cfg->dtype)
        fail_input("config: 'quantization.bnb_4bit_compute_dtype' is \"%s\" but the run's parameters are %s; "
                   "shardlm computes in the parameter dtype: set %s, or bnb_4bit_compute_dtype \"%s\"",
                   compute, torch_dtype_name(cfg->dtype),
                   q->compute_dtype == DTYPE_BF16   ? "bf16.enabled true"
                   : q->compute_dtype == DTYPE_F16 ? "fp16.enabled true"
                                                   : "neither bf16 nor fp16",
                   torch_dtype_name(cfg->dtype));
    const char *storage = read_str(root, "quantization.bnb_4bit_quant_storage", "uint8", FILL);
    q->storage_bytes = strcmp(storage, "uint8") == 0 || strcmp(storage, "torch.uint8") == 0;
    if (!q->storage_bytes && parse_torch_dtype(storage, &q->storage_dtype) != 0)
        fail_input("config: 'quantization.bnb_4bit_quant_storage' is \"%s\"; known: \"uint8\", \"bfloat16\", "
                   "\"float16\", \"float32\"",
                   storage);
    read_skip_modules(root);
    if (q->load_in_4bit && (strcmp(cfg->model.type, "llama") != 0 || cfg->model.fused_projections))
        fail_input("config: 'quantization.load_in_4bit' is supported for Llama-family models with separate "
                   "projections (Llama, Mistral, Qwen2, Qwen3), not %s%s; remove the quantization section",
                   cfg->model.type, cfg->model.fused_projections ? " with fused qkv_proj/gate_up_proj (Phi-3)" : "");
    if (q->load_in_4bit && !cfg->lora.enabled)
        fail_input("config: 'quantization.load_in_4bit' makes the base 4-bit and frozen, so it cannot be fine-tuned "
                   "in full; add a lora section (QLoRA) or remove the quantization section");
}
