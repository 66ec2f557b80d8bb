/*
 * run_config — config_begin, model.from_pretrained's config.json, config_end
 * (run_config.h).
 */
#include "run_config.h"

#include "io/hf.h"

/* The keys model.from_pretrained's config.json determines, then the rest. */
static void run_config_end(struct config *cfg)
{
    if (cfg->model.pretrained[0])
        hf_config_keys(cfg->model.pretrained, config_put_pretrained, cfg);
    config_end(cfg);
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
