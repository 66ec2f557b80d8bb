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
 * config). It does not open data or model files.
 */
#ifndef SHARDLM_CONFIG_H
#define SHARDLM_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "core/options.h"

/* Reads and validates. deepspeed_path may be NULL; sets is an array of n "a.b=c". */
void config_load(struct config *cfg, const char *path, const char *deepspeed_path,
                 const char *const *sets, int n_sets);
/* Same, from a JSON string (tests). */
void config_load_string(struct config *cfg, const char *json_text, const char *const *sets, int n_sets);
/* Derives the missing batch number for this world size; inconsistent triples fail. */
void config_resolve_batch(struct config *cfg, int world);
/* The resolved configuration as a JSON string (caller frees). */
char *config_dump(const struct config *cfg);
void config_free(struct config *cfg);


#endif
