/*
 * pref_eval — a preference file (tools/prefdata.py: chosen = sample 2i,
 * rejected = 2i + 1) under an opened model (run/infer.h): every sample's
 * summed log-prob over its trained tokens, for `shardlm eval` on preference
 * pairs (DPO's reward accuracy and margins against a reference).
 *
 * The file is read by data/samples.h in pair mode, as training reads it
 * (format and version, tokenizer and vocabulary, damaged or truncated
 * files), in file order without packing: micro-batch m is pairs
 * [m P, m P + P) (2P rows: the chosen, then the rejected). A sample longer
 * than the eval length is cut to it (counted); a cut sample left without a
 * trained token is an error (give --seq-len). Micro-batches go to the ranks
 * in turn; every rank ends with every value (one allreduce).
 */
#ifndef SHARDLM_PREF_EVAL_H
#define SHARDLM_PREF_EVAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/samples.h"
#include "infer.h"

struct pref_data {
    struct sample_set smp; /* pairs, file order, cut to T */
    int64_t n_pairs;       /* pairs in the file (every one kept) */
    int T;                 /* the eval length */
    char sha256[65];       /* of the file's bytes (dpo_ref's samples_sha256) */
};

/* The tokens of the longest sample of a preference file (fail_input: not a
 * preference file, a damaged one). Local. */
size_t pref_data_longest(const char *path, int vocab_size);
/* Opens a preference file for forwards of at most T tokens a row under s's
 * model (its vocabulary, tokenizer, data.pad_to_multiple_of and
 * data.allow_tokenizer_mismatch): fail_input naming it as training would,
 * or when a cut sample has no trained token left. Local. */
void pref_data_open(struct pref_data *p, const struct infer *s, const char *path, int T);
void pref_data_free(struct pref_data *p);
/* Pairs the first max_batches micro-batches of P pairs a rank cover (0: the whole file). */
int64_t pref_data_pairs(const struct pref_data *p, int P, int world, int64_t max_batches);

/* Every sample's summed log-prob (logps) and trained-token count (n_targets)
 * of the first pref_data_pairs(p, P, world, max_batches) pairs, file order
 * (2 a pair), under s's model (started for 2P rows of p->T); adapters_off:
 * the LoRA base alone. Collective: every rank gets them all. */
void pref_sample_logps(struct infer *s, struct pref_data *p, int P, int64_t max_batches, bool adapters_off,
                       double *logps, int64_t *n_targets);

#endif
