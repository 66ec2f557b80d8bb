/*
 * dpo_ref — the reference log-probability file of DPO (issue 37): every
 * pair's two reference log-probs, computed once with the initial weights
 * before step 1 of a full fine-tune (TRL's precompute_ref_log_probs), so that
 * training holds one model; `shardlm eval --preferences` reads it too.
 *
 * File (HDF5, readable by h5py): root attributes format "shardlm-ref-logps",
 * version 2, samples_path (the preference file, absolute), samples_sha256
 * (SHA-256 of the preference file's bytes), model (what the values were
 * computed with: dpo_ref_model_id), seq_len (the data.seq_len every sample
 * was cut to), max_prompt_length (the preference file's, when it has one:
 * tools/prefdata.py's prompt cut, 0 for none); datasets /logps float64 [2 n_pairs] (the
 * summed log-prob of sample 2i, chosen, and 2i + 1, rejected, in file order)
 * and /n_targets int64 [2 n_pairs] (each sample's trained tokens, for ipo's
 * mean); a pair the run left out (too long, nothing trained) has log-prob NaN
 * and 0 targets (dpo_ref_has). Independent of beta and the loss type. Written atomically (a .tmp,
 * then rename).
 *
 * Version 3 adds dtype (the parameter dtype the values were computed in, "fp32", "fp16" or "bf16": the
 * parameters are rounded to it, so another dtype gives other values; the trainer refuses such a file for a
 * fresh start) and data_crc32c (CRC-32C of /logps then /n_targets, as stored, little-endian: a value edited
 * in the file is refused, as a checkpoint's is). Versions 1 and 2 are read without either check.
 *
 * Version 1 (issue 37's first files) lacks seq_len and max_prompt_length;
 * such files are still read (seq_len 0: unknown), and their users compare
 * each sample's trained-token count with their own instead (a sample cut at
 * another length has another count).
 */
#ifndef SHARDLM_DPO_REF_H
#define SHARDLM_DPO_REF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DPO_REF_FORMAT "shardlm-ref-logps"
#define DPO_REF_VERSION 3
#define DPO_REF_OLDEST_VERSION 1 /* still read */
#define DPO_REF_MODEL_CAP 4300 /* a path (CKPT_MAX_PATH) and a checksum */

struct dpo_ref {
    int64_t n_pairs;
    double *logps;       /* [2 n_pairs]: chosen of pair i at 2i, rejected at 2i + 1 */
    int64_t *n_targets;  /* [2 n_pairs] */
    char sha256[65];     /* of the preference file */
    char model[DPO_REF_MODEL_CAP];
    char samples_path[4096]; /* as recorded (informative: the sha decides) */
    int seq_len;         /* data.seq_len of the computation; 0: unknown (a version-1 file) */
    int64_t max_prompt_length; /* the preference file's (0: prompts not cut); -1: it has none */
    char dtype[8];       /* the parameter dtype of the computation (dtype_name); "": unknown (version < 3) */
    uint32_t data_crc32c; /* as read (version 3), checked by dpo_ref_load */
    int version;         /* as read */
};

/* Whether sample i (2 pair + 0 chosen / 1 rejected) has a value. */
static inline bool dpo_ref_has(const struct dpo_ref *r, int64_t i) { return r->n_targets[i] > 0; }
/* Loads path; NULL when there is no such file. A file that is not such a
 * file, or whose samples_sha256 / model differ from want_sha256 / want_model
 * (either NULL: not compared): fail_input naming the file and what to do
 * (delete it or name another). */
struct dpo_ref *dpo_ref_load(const char *path, const char *want_sha256, const char *want_model);
/* fail_input when r (loaded from path) was computed at another data.seq_len
 * than seq_len (a version-1 file, which does not say, passes): one line
 * naming both and what to do (`todo`). */
void dpo_ref_check_seq_len(const struct dpo_ref *r, const char *path, int seq_len, const char *todo);
/* fail_input when r (loaded from path) was computed in another parameter dtype than dtype (a file before
 * version 3, which does not say, passes): one line naming both and what to do (`todo`). */
void dpo_ref_check_dtype(const struct dpo_ref *r, const char *path, const char *dtype, const char *todo);
/* Writes r to path (r->samples_path made absolute; r->dtype set); rank 0 only; atomic. */
void dpo_ref_save(const char *path, const struct dpo_ref *r);
/* A zeroed struct with room for n_pairs pairs (max_prompt_length -1). */
struct dpo_ref *dpo_ref_new(int64_t n_pairs);
void dpo_ref_free(struct dpo_ref *r);
/* The default path beside the preference file: <samples>.ref-logps.h5 */
void dpo_ref_default_path(const char *samples_path, char *out, size_t cap);
/* The model a reference was computed with, as a dpo_ref's model: the
 * from_pretrained directory ("" without one) and the checksum of the base
 * parameters as read (the one a LoRA checkpoint records as base_checksum). */
void dpo_ref_model_id(const char *pretrained, const char *checksum, char *out, size_t cap);
/* The SHA-256 of a file's bytes as 64 lowercase hex digits; fail_input
 * naming it (with what) when it cannot be read. */
void dpo_ref_file_sha256(const char *path, const char *what, char hex[65]);

#endif
