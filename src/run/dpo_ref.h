/*
 * dpo_ref — the reference log-probabilities of a preference file (DPO,
 * issue 37), computed once with the initial model and kept beside the
 * samples: HDF5, attributes format "shardlm-ref-logps", version 1,
 * samples_path (absolute), samples_sha256 (of the preference file's bytes),
 * model (what the initial model was: its source and checksum); datasets
 * /logps float64 [2 n_pairs] (summed log-prob of file sample 2i, the chosen,
 * and 2i + 1, the rejected) and /n_targets int64 [2 n_pairs] (their trained
 * tokens, for ipo's mean). Independent of beta. Written atomically.
 *
 * NOTE: a minimal stand-in written by the trainer's branch (k37train) with
 * the API of the shared brief; the I/O module of k37aux replaces it.
 */
#ifndef SHARDLM_DPO_REF_H
#define SHARDLM_DPO_REF_H

#include <stddef.h>
#include <stdint.h>

#define DPO_REF_FORMAT "shardlm-ref-logps"
#define DPO_REF_VERSION 1
#define DPO_REF_MODEL_MAX 4300

struct dpo_ref {
    int64_t n_pairs;
    double *logps;      /* [2 n_pairs] */
    int64_t *n_targets; /* [2 n_pairs] */
    char sha256[65];    /* of the preference file */
    char model[DPO_REF_MODEL_MAX];
    char samples_path[4096]; /* the preference file (absolute), recorded by save */
};

/* Loads path; NULL when absent. A file that is not such a file, or whose samples_sha256 / model differ from
 * want_sha256 / want_model: fail_input naming the file and what to do (delete it or name another). */
struct dpo_ref *dpo_ref_load(const char *path, const char *want_sha256, const char *want_model);
/* Rank 0 only; atomic (tmp + rename). samples_path: recorded as given. */
void dpo_ref_save(const char *path, const struct dpo_ref *r);
void dpo_ref_free(struct dpo_ref *r);
/* The default path beside the preference file: <samples>.ref-logps.h5 */
void dpo_ref_default_path(const char *samples_path, char *out, size_t cap);

#endif
