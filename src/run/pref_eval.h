/*
 * pref_eval — a preference file (tools/prefdata.py: chosen = sample 2i,
 * rejected = 2i + 1) under an opened model (run/infer.h): every sample's
 * summed log-prob over its trained tokens, for `shardlm eval` on preference
 * pairs (DPO's reward accuracy and margins against a reference).
 *
 * The file is read whole into memory (5 bytes a token): eval files are held
 * out slices. A sample longer than the eval length is cut to it (warned); a
 * cut sample left without a trained token is an error (give --seq-len).
 * Rows are one sample each, a pair's two side by side, P pairs (2P rows) a
 * forward per rank; every rank ends with every value (one allreduce).
 */
#ifndef SHARDLM_PREF_EVAL_H
#define SHARDLM_PREF_EVAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "infer.h"

struct pref_data {
    char path[4096];
    int64_t n_pairs;
    int64_t *offsets;  /* [2 n_pairs + 1] */
    int32_t *tokens;
    uint8_t *trained;
    size_t longest;    /* tokens of the longest sample */
    int T;             /* the eval length (pref_data_cut) */
    char sha256[65];   /* of the file's bytes (dpo_ref's samples_sha256) */
};

/* Whether path is an HDF5 file whose format attribute is a preference file's. */
bool pref_data_is_preferences(const char *path);
/* Reads a preference file (fail_input naming it: not a preference file, a
 * damaged one, a token id at or above vocab_size). Local. */
void pref_data_open(struct pref_data *p, const char *path, int vocab_size);
/* Sets the eval length T (every sample cut to T tokens); fail_input when a
 * cut sample has no trained token left; returns how many samples were cut. */
size_t pref_data_cut(struct pref_data *p, int T);
void pref_data_free(struct pref_data *p);

/* Every sample's summed log-prob (logps) and trained-token count (n_targets),
 * file order, 2 n_pairs each, under s's model (started for 2P rows of p->T);
 * adapters_off: the LoRA base alone. Collective: every rank gets them all. */
void pref_sample_logps(struct infer *s, const struct pref_data *p, int P, bool adapters_off, double *logps,
                       int64_t *n_targets);

#endif
