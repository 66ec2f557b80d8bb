/*
 * run_config — a run's configuration: the JSON config (config/config.h) with
 * the shape keys of model.from_pretrained read from that directory's
 * config.json (io/hf.h). The config layer reads only JSON; this is where the
 * two meet, for every command that loads a config naming a model directory
 * (train, plan, eval and generate).
 */
#ifndef SHARDLM_RUN_CONFIG_H
#define SHARDLM_RUN_CONFIG_H

#include "config/config.h"

/* config_load, model.from_pretrained included. */
void run_config_load(struct config *cfg, const char *path, const char *deepspeed_path, const char *const *sets,
                     int n_sets);
/* config_load_string, model.from_pretrained included. */
void run_config_load_string(struct config *cfg, const char *json_text, const char *const *sets, int n_sets);
/* The same from a document in memory, which cfg takes. */
void run_config_load_json(struct config *cfg, json_t *root, const char *const *sets, int n_sets);

#endif
