/*
 * run_config — config_begin, model.from_pretrained's config.json, config_end
 * (run_config.h).
 */
#include "run_config.h"

#include "io/hf.h"

#include "core/quant4.h"
#include "core/util.h"

#include <jansson.h>
#include <string.h>

/* A directory saved from a bitsandbytes 4-bit model: its weights are read
 * dequantized (io/hf_bnb.h), so the run is a QLoRA run of that type. The
 * quantization section is filled in when absent, and must agree when given. */
static bool take_quantized_dir(struct config *cfg)
{
    int type;
    bool double_quant;
    if (!hf_quantization(cfg->model.pretrained, &type, &double_quant))
        return false;
    json_t *root = cfg->json, *q = json_object_get(root, "quantization");
    if (!json_is_object(q)) {
        q = json_object();
        json_object_set_new(root, "quantization", q);
        json_object_set_new(q, "load_in_4bit", json_true());
        json_object_set_new(q, "bnb_4bit_quant_type", json_string(quant4_type_name((enum quant4_type)type)));
        json_object_set_new(q, "bnb_4bit_use_double_quant", json_boolean(double_quant));
        return true;
    }
    const char *given = json_string_value(json_object_get(q, "bnb_4bit_quant_type"));
    if (!json_is_true(json_object_get(q, "load_in_4bit")) || (given && quant4_type_parse(given) != type) ||
        (json_object_get(q, "bnb_4bit_use_double_quant") &&
         json_is_true(json_object_get(q, "bnb_4bit_use_double_quant")) != double_quant))
        fail_input("model.from_pretrained '%s' holds bitsandbytes %s weights%s; the quantization section says "
                   "otherwise: make it agree (load_in_4bit true, bnb_4bit_quant_type \"%s\", "
                   "bnb_4bit_use_double_quant %s) or remove it",
                   cfg->model.pretrained, quant4_type_name((enum quant4_type)type),
                   double_quant ? " with double quantization" : "", quant4_type_name((enum quant4_type)type),
                   double_quant ? "true" : "false");
    return true;
}

/* The keys model.from_pretrained's config.json determines, then the rest. */
static void run_config_end(struct config *cfg)
{
    bool prequantized = false;
    if (cfg->model.pretrained[0]) {
        hf_config_keys(cfg->model.pretrained, config_put_pretrained, cfg);
        prequantized = take_quantized_dir(cfg);
    }
    config_end(cfg);
    cfg->quant.prequantized = prequantized;
}

void run_config_load(struct config *cfg, const char *path, const char *deepspeed_path, const char *const *sets,
                     int n_sets)
{
    config_begin(cfg, path, deepspeed_path, sets, n_sets);
    run_config_end(cfg);
}

void run_config_load_json(struct config *cfg, json_t *root, const char *const *sets, int n_sets)
{
    config_begin_json(cfg, root, sets, n_sets);
    run_config_end(cfg);
}

void run_config_load_string(struct config *cfg, const char *json_text, const char *const *sets, int n_sets)
{
    config_begin_string(cfg, json_text, sets, n_sets);
    run_config_end(cfg);
}
