/*
 * loader — what a run trains and validates on, behind one interface: token
 * shards (.bin, data.h: full windows of seq_len) or sample files (.h5,
 * samples.h: variable-length samples with trained targets, dynamically padded
 * or packed; DPO's pairs). Units are windows, samples, pairs or packed rows; a step takes
 * train_batch_size of them, micro-batch m of rank r the B units from
 * first + (m N + r) B (N ranks), so every rank knows the whole step's units
 * (and their trained targets) without communicating.
 */
#ifndef SHARDLM_LOADER_H
#define SHARDLM_LOADER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/options.h"
#include "data.h"
#include "samples.h"

struct loader {
    bool samples;
    struct dataset bin;
    struct sample_set smp;
    int T;                  /* data.seq_len: the longest row */
    const char *what;
};

/* Opens path as the run's train data (shuffled as data.shuffle says) or its
 * validation data (file order); tokenizer_json: the run's tokenizer, or NULL. */
void loader_open(struct loader *l, const struct config *cfg, const char *path, bool train, const char *tokenizer_json,
                 const char *what);
void loader_close(struct loader *l);
/* Rows of a micro-batch of B units: 2B for DPO's pairs (the chosen rows, then the rejected: samples.h), else B. */
int loader_rows(const struct loader *l, int B);
/* Units in one epoch. */
uint64_t loader_units(struct loader *l);
/* Row length, real and trained tokens of the micro-batch of units [first, first + B). */
struct sample_batch loader_batch(struct loader *l, uint64_t first, int B);
/* Fills the micro-batch of units [first, first + B) (inputs, targets -1 where
 * not trained, positions when packing: positions NULL otherwise) and returns
 * its row length. */
int loader_read(struct loader *l, uint64_t first, int B, int32_t *inputs, int32_t *targets, int32_t *positions);
/* A step's totals: the micro-batches of units from first, accum per rank on
 * world ranks; *slots: rows x their lengths. */
struct sample_batch loader_step(struct loader *l, uint64_t first, int B, int accum, int world, uint64_t *slots);
/* True when path is one of the loader's files (an output must not be). */
bool loader_has_file(const struct loader *l, const char *out, const char **name);

#endif
