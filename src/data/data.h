/*
 * data — token shards in llm.c's .bin format and the deterministic loader.
 *
 * File format (DESIGN §8): a header of 256 little-endian int32, then tokens.
 *   header[0] = magic, header[1] = version, header[2] = number of tokens.
 *   magic 20240520 version 1: uint16 tokens (llm.c GPT-2 shards)
 *   magic 20240520 version 2: uint32 tokens (shardlm's variant for vocabularies > 65535)
 *   magic 20240801 version 7: uint32 tokens (llm.c's Llama-3 shards)
 * A path may be a glob; the matching files, sorted by name, form one data set.
 *
 * Samples: each file is cut into windows of T+1 tokens at stride T: window j
 * of a file is tokens [j*T, j*T + T + 1), so consecutive windows share one
 * boundary token and a file of n tokens has (n - 1) / T windows (0 when
 * n < T+1). Windows never cross files. Inputs are the first T tokens of a
 * window, targets the last T. Global sample k of the run is window
 * perm_e(k mod S) of epoch e = k / S, where perm_e is a keyed bijection of
 * [0, S) (a Feistel network with cycle walking) derived from the seed and the
 * epoch: no table in memory, the same order at any world size, and the
 * position is one integer (the checkpoint stores it).
 *
 * A file whose size is not exactly header + count tokens is an input error,
 * as in llm.c.
 *
 * Validation sets are read in file order without shuffling.
 *
 * Every token is checked against the vocabulary when the file is opened, so
 * a bad token id is an input error at start-up, never an out-of-bounds read
 * in a kernel. Windows are then read with pread (not from a mapping, where a
 * file truncated during the run would raise SIGBUS) and checked again, so a
 * file rewritten in place under a running job is an input error naming it.
 * Only regular files are accepted (a FIFO is refused, not waited on).
 */
#ifndef SHARDLM_DATA_H
#define SHARDLM_DATA_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#define DATA_MAGIC_LLMC 20240520
#define DATA_VERSION_U16 1
#define DATA_VERSION_U32 2
#define DATA_MAGIC_LLMC_LLAMA3 20240801
#define DATA_VERSION_LLAMA3_U32 7
#define DATA_HEADER_INTS 256

struct data_file {
    char *path;
    int fd;                /* open for pread: windows are read, never mapped (a file
                              truncated during a run is an input error, not SIGBUS) */
    size_t file_bytes;     /* its size when it was checked */
    size_t n_tokens;
    int token_bytes;       /* 2 or 4 */
    size_t first_window;   /* index of this file's first window in the data set */
    size_t n_windows;
};

struct dataset {
    struct data_file *files;
    int n_files;
    int seq_len;           /* T */
    size_t n_windows;      /* S: windows of T+1 tokens over all files */
    bool shuffle;
    uint64_t seed;
    int vocab_size;        /* every id read is checked against it */
    const char *what;      /* "train data", ... for messages (a literal) */
    void *window_buf;      /* (T + 1) tokens: the window being read */
};

/* Opens every file matching path, checks format and token ids < vocab_size.
 * Any problem is fail_input() naming the file. what: "train data", "validation data". */
void dataset_open(struct dataset *ds, const char *path, int seq_len, int vocab_size,
                  bool shuffle, uint64_t seed, const char *what);
void dataset_close(struct dataset *ds);

/* Position i of epoch `epoch`'s order of [0, S) (the keyed Feistel
 * bijection above, from seed and epoch; the sample files' shuffle too). */
size_t data_shuffle_index(uint64_t i, uint64_t S, uint64_t seed, uint64_t epoch);

/* Window index of global sample k (the permutation when shuffling). */
size_t dataset_window(const struct dataset *ds, uint64_t k);
/* Copies window w into inputs[0..T) and targets[0..T) as int32. */
void dataset_read_window(const struct dataset *ds, size_t w, int32_t *inputs, int32_t *targets);
/* Fills a micro-batch of B rows with global samples first, first+1, ... first+B-1. */
void dataset_read_batch(const struct dataset *ds, uint64_t first, int B, int32_t *inputs, int32_t *targets);

/* Writes tokens as a .bin shard (uint16 when token_bytes == 2, else uint32 v2). */
void data_write_bin(const char *path, const uint32_t *tokens, size_t n, int token_bytes);

#endif
