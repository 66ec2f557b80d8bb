/*
 * samples — fine-tuning data: the HDF5 sample files of tools/prepare_data.py
 * (DESIGN §8), ordered, padded or packed into micro-batches.
 *
 * File: /tokens int32 [n_tokens], /trained uint8 [n_tokens] (1: the token is
 * a training target, its prediction from the tokens before it counts; the
 * first token of a sample never is), /offsets int64 [n_samples + 1], and the
 * root attributes format "shardlm-samples", version 1, vocab_size (of the
 * tokenizer that made it), tokenizer_sha256 (of its tokenizer.json's bytes,
 * compared with the run's tokenizer.json), pad_token_id, ...
 * (tools/prepare_data.py).
 *
 * A sample of L tokens occupies L positions of a row, as in Hugging Face:
 * position p < L - 1 predicts token p + 1 when that token is trained (target
 * -1 otherwise: no loss, no gradient), the last position predicts nothing.
 * Samples longer than the row (max_len = data.seq_len) are cut to max_len
 * tokens (truncation "truncate") or left out ("drop"); samples with no
 * trained target left are left out too. Both counts are kept and printed.
 *
 * Units: without packing one unit is one sample; with packing, one row of at
 * most max_len tokens holding whole samples (first fit over the epoch's
 * order, a bounded number of rows open at a time). Global unit k of the run
 * is unit k - (units of the earlier epochs) of its epoch; an epoch's order of
 * samples is the seeded keyed permutation of data.c (or file order without
 * shuffling), with group_by_length sorting each megabatch of 50 steps' units
 * by length, longest first (Hugging Face's LengthGroupedSampler). Everything
 * follows from the seed: every rank computes the same order without
 * communicating, and the position in the run is one integer.
 *
 * A micro-batch of B units is padded to its longest unit rounded up to
 * pad_multiple (at most max_len): dynamic padding. Packed rows carry each
 * token's position in its sample, so attention and positions restart at
 * every sample (padding forms a segment of its own).
 *
 * Pairs (DPO, sample_opts.pairs: a preference file of tools/prefdata.py,
 * chosen = file sample 2i, rejected = 2i + 1): the shuffled, grouped and
 * packed item is a pair, kept only when both its samples are. A unit has two
 * lanes, chosen and rejected: without packing a unit is one pair; with it, a
 * unit is two rows filled in step, pair by pair, each pair's chosen sample in
 * the first row and its rejected one in the second (so a pair never splits).
 * A micro-batch of B units is 2B rows: the B chosen rows, then the B rejected
 * rows (TRL's concatenated_forward); the k-th sample of the chosen rows (in
 * row order) pairs with the k-th of the rejected rows.
 */
#ifndef SHARDLM_SAMPLES_H
#define SHARDLM_SAMPLES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SAMPLES_FORMAT "shardlm-samples"
#define PREFERENCES_FORMAT "shardlm-preferences" /* tools/prefdata.py: DPO pairs (sample_opts.pairs) */
#define SAMPLES_VERSION 1
/* group_by_length: a megabatch is this many steps' units (Hugging Face's megabatch_mult) */
#define SAMPLES_MEGABATCH_STEPS 50
/* packing: rows open for a sample to be placed in (first fit) */
#define SAMPLES_OPEN_ROWS 64

struct sample_opts {
    int max_len;            /* data.seq_len: a row's tokens at most */
    int pad_multiple;       /* data.pad_to_multiple_of */
    bool truncate;          /* data.truncation "truncate" (else "drop") */
    bool packing, shuffle, group_by_length;
    uint64_t seed;
    int step_units;         /* units per optimizer step (train_batch_size), for group_by_length */
    int vocab_size;         /* the model's: every token id must be below it */
    const char *tokenizer_json; /* the run's tokenizer (from_pretrained's tokenizer.json), or NULL; read by
                                 * samples_open only (NULL in the set's copy after it) */
    bool allow_tokenizer_mismatch; /* data.allow_tokenizer_mismatch: another tokenizer is a warning */
    bool pairs;             /* DPO: the file must be a preference file; an item is a pair */
};

struct sample_epoch {
    int64_t epoch;          /* -1: empty slot */
    uint32_t *order;        /* the kept samples in this epoch's order */
    uint32_t *row_first;    /* packing: row r holds order[row_first[r] .. row_first[r + 1]) */
    size_t n_rows;
};

struct sample_set {
    char *path;
    const char *what;       /* "train data", "validation data" (a literal) */
    int64_t file, tokens, trained; /* HDF5 ids */
    size_t n_file;          /* samples in the file */
    int64_t *offsets;       /* n_file + 1 */
    uint32_t n;             /* samples kept (pairs: kept sample 2j chosen, 2j + 1 rejected of kept pair j) */
    uint32_t n_items;       /* what an epoch orders: samples kept, or pairs kept */
    uint32_t *item_len;     /* an item's length for group_by_length (a pair's: its longer sample) */
    uint32_t *index;        /* kept sample -> file sample */
    uint32_t *len;          /* kept sample's tokens (after truncation) */
    uint32_t *n_trained;    /* kept sample's trained targets */
    size_t n_truncated, n_dropped_long, n_dropped_untrained; /* samples; the drops count pairs with pairs */
    int64_t max_prompt_length; /* a preference file's attribute (tools/prefdata.py; 0: not cut), -1 without */
    uint64_t tokens_kept, trained_kept;
    int pad_id;
    struct sample_opts o;
    struct sample_epoch cache[2];
    uint64_t *epoch_start;  /* units before epoch e, for the epochs computed so far */
    int64_t n_epoch_start;
    int32_t *tok_buf;       /* max_len tokens of one sample */
    uint8_t *tr_buf;
};

/* What a micro-batch of B units holds. */
struct sample_batch {
    int T;                  /* the padded row length */
    uint64_t real;          /* tokens of samples (not padding) */
    uint64_t trained;       /* trained targets */
    uint64_t pairs;         /* pairs (sample_opts.pairs; 0 otherwise) */
};

/* The SHA-256 of a file's bytes as 64 lowercase hex digits (hashlib.sha256); false with errno set when it
 * cannot be read. */
bool samples_file_sha256(const char *path, char hex[65]);
/* True when path names a sample file (.h5 / .hdf5), not .bin token shards. */
bool samples_is_sample_file(const char *path);
/* The format attribute of an HDF5 file ("" without a fixed-length string one); false when path is not a file
 * HDF5 opens (never fails). */
bool samples_file_format(const char *path, char *format, size_t cap);
/* True when path is an HDF5 file whose format attribute is a preference file's (never fails). */
bool samples_is_preference_file(const char *path);
/* The length in tokens of the longest sample of a sample file (what an eval
 * sizes its rows by), after the file's header (pairs: a preference file's)
 * and offsets are checked. */
size_t samples_longest(const char *path, int vocab_size, bool pairs, const char *what);
/* Opens and checks the file (fail_input naming it: not a sample file, a
 * token id at or above the model's vocabulary, another tokenizer than the
 * run's, a truncated file), counts what truncation drops. */
void samples_open(struct sample_set *s, const char *path, const struct sample_opts *o, const char *what);
void samples_close(struct sample_set *s);
/* Rows of a unit: 2 with pairs (chosen, rejected), else 1. */
int samples_lanes(const struct sample_set *s);
/* Units in the first epoch (samples, pairs, or packed rows / row pairs). */
uint64_t samples_epoch_units(struct sample_set *s);
/* Length, real and trained tokens of the micro-batch of units [first, first + B). */
struct sample_batch samples_batch(struct sample_set *s, uint64_t first, int B);
/* Fills B rows of T (samples_batch's T) from units [first, first + B): token
 * ids, targets (-1: not trained) and, packing, each token's position in its
 * sample (positions may be NULL without packing). */
void samples_read_batch(struct sample_set *s, uint64_t first, int B, int T, int32_t *inputs, int32_t *targets,
                        int32_t *positions);
/* Pairs: the file pair index (i of samples 2i, 2i + 1) of each pair of units [first, first + B), in the
 * order their samples come in the rows (dpo_sequence_logps), at most cap; returns how many. */
int samples_batch_pairs(struct sample_set *s, uint64_t first, int B, int64_t *file_pairs, int cap);

#endif
