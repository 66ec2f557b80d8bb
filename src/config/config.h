/*
 * config — the run's configuration: a JSON file in DeepSpeed's vocabulary
 * (batch sizes, optimizer, scheduler, fp16/bf16, zero_optimization, clipping)
 * plus sections of shardlm's own (model, data, train, checkpoint).
 *
 * config_load() reads the main file, merges an optional DeepSpeed file
 * (--deepspeed), applies "--set a.b=c" overrides, then validates everything
 * before anything else is allocated. Every error names the key path and the
 * reason and exits with status 2 (fail_input). Keys that DeepSpeed defines but
 * that change nothing in this engine are accepted with one warning each.
 *
 * Batch sizes are resolved against the world size (train_batch_size =
 * micro × accumulation × world) by config_resolve_batch(), which the trainer
 * calls once the world size is known.
 *
 * The module fills struct config (its types are in core/options.h) and owns
 * the JSON document it was read from (kept for checkpoints as the resolved
 * config). It reads only JSON: it does not open data or model files, so the
 * keys of model.from_pretrained's config.json come from the caller, between
 * config_begin and config_end (run/run_config.h does the three steps).
 */
#ifndef SHARDLM_CONFIG_H
#define SHARDLM_CONFIG_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/options.h"

/* Reads and validates. deepspeed_path may be NULL; sets is an array of n "a.b=c".
 * For a config without model.from_pretrained (an internal error here): tests,
 * a checkpoint's resolved sections. */
void config_load(struct config *cfg, const char *path, const char *deepspeed_path,
                 const char *const *sets, int n_sets);
/* Same, from a JSON string. */
void config_load_string(struct config *cfg, const char *json_text, const char *const *sets, int n_sets);
/* Same, from a document in memory, which cfg takes (no text in between). */
void config_load_json(struct config *cfg, json_t *root, const char *const *sets, int n_sets);

/* config_load in three steps, for a config that may name a model directory:
 * config_begin[_string] builds the document (file, --deepspeed, --set),
 * checks its keys and records model.from_pretrained (cfg->model.pretrained,
 * empty when not given); the caller then reads that directory's config.json
 * with config_put_pretrained as the callback (io/hf.h, hf_config_keys, ctx
 * cfg); config_end reads and validates everything. */
void config_begin(struct config *cfg, const char *path, const char *deepspeed_path, const char *const *sets,
                  int n_sets);
void config_begin_string(struct config *cfg, const char *json_text, const char *const *sets, int n_sets);
/* Same from a document built in memory (a checkpoint's config): cfg takes root. */
void config_begin_json(struct config *cfg, json_t *root, const char *const *sets, int n_sets);
/* A model key (value: a reference it takes) the model directory determines:
 * into the document as if given, or an error when the config gives it with
 * another value. cfg: the struct config between the two steps. */
void config_put_pretrained(void *cfg, const char *key, json_t *value);

/* m->attention from root's model.sliding_window and model.sliding_layers (m->n_layer set), checked as
 * config_load checks them; also for a checkpoint's resolved config (run/ckpt_run.c). */
void config_read_sliding(struct model_config *m, json_t *root);
void config_end(struct config *cfg);
/* Derives the missing batch number for this world size; inconsistent triples fail. */
void config_resolve_batch(struct config *cfg, int world);
/* The resolved configuration as a JSON string (caller frees). */
char *config_dump(const struct config *cfg);
void config_free(struct config *cfg);
/* Prints the configuration reference (docs/configuration.md, markdown) from
 * the schema table: every key with its type, default, allowed values and
 * meaning, the DeepSpeed keys accepted without effect with their warning, and
 * those refused with their error (config_reference.c). */
void config_print_reference(FILE *out);


#endif
