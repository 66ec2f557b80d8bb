/*
 * safetensors — Hugging Face's weight files, read and written by ranges.
 *
 * Format (huggingface/safetensors): an 8-byte little-endian header length N,
 * N bytes of JSON {"NAME": {"dtype": "BF16", "shape": [r, c], "data_offsets":
 * [b, e]}, ..., "__metadata__": {...}} (padded with spaces to a multiple of 8),
 * then the data: tensor NAME's bytes are [8 + N + b, 8 + N + e) of the file,
 * row-major, little-endian. A model of several files has
 * model.safetensors.index.json {"metadata": {"total_size": S}, "weight_map":
 * {"NAME": "model-00001-of-00003.safetensors", ...}}.
 *
 * The data of both directions move through rawio (the checkpoints' raw I/O
 * pipeline: O_DIRECT where the file system allows it).
 *
 * Reading: every rank opens the headers (small) and reads only the element
 * ranges it owns, converted to fp32 on the way (F32, F16, BF16; U8 tensors
 * are read as bytes, for bitsandbytes' 4-bit weights, hf_bnb.h; any other
 * dtype is refused). Writing: the layout (which tensor in which file at which
 * offset) is computed identically on every rank from the tensor list, rank 0
 * creates the files at their final size with their headers, and every rank
 * then writes its own element ranges at their offsets: nothing is gathered.
 *
 * Every error is fail_input (one line naming the file and, where there is
 * one, the tensor; exit status 2).
 */
#ifndef SHARDLM_SAFETENSORS_H
#define SHARDLM_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/options.h"
#include "core/rawio.h"

#define ST_MAX_NAME 160
#define ST_MAX_DIMS 4

/* A model's files on the data path: one rawio file open at a time (each holds
 * two 8 MiB bounce buffers; a 70B model has 30 files), switched as the ranges
 * move from file to file; a written file is fsynced when left. */
struct st_files {
    int n;
    char **paths;
    int write;
    int current;               /* the open one, -1: none */
    struct rawio_file raw;
};

struct st_tensor {
    char name[ST_MAX_NAME];
    enum dtype dtype;          /* F32, F16 or BF16 (unless bytes) */
    bool bytes;                /* U8: bytes, not values (bitsandbytes' packed 4-bit weights, their
                                * 8-bit statistics and quant state); st_read_raw only */
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t numel;
    int file;                  /* index into st_model.paths */
    uint64_t offset;           /* absolute byte offset of element 0 in its file */
};

struct st_model {
    int n_files;
    char **paths;              /* DIR/model.safetensors or the index's files, in index order */
    int n_tensors;
    struct st_tensor *tensors; /* every tensor of every file, sorted by name */
    uint64_t bytes_read;       /* data bytes st_read and st_read_raw read so far (the per-rank figure the logs print) */
    int *fds;                  /* open file descriptors, one per file (headers, checks) */
    struct st_files data;      /* the same files for the data (rawio.h: O_DIRECT where it can) */
};

/* Opens the weights of a Hugging Face directory: DIR/model.safetensors, or
 * DIR/model.safetensors.index.json and every file its weight_map names (the
 * single file first when both are there, as transformers looks).
 * Validates each header before any data is read: the header length inside
 * the file, valid JSON, a supported dtype, a shape and data_offsets whose size
 * is numel x the dtype's size, offsets inside the file and not overlapping
 * another tensor's; with an index, every tensor it maps is in the file it
 * names and the files it names exist. A tensor name in two files is refused. */
void st_open(struct st_model *st, const char *dir);
void st_close(struct st_model *st);
/* Bytes per element of t (1 for U8). */
size_t st_elem_size(const struct st_tensor *t);
/* The tensor called name, or NULL. */
const struct st_tensor *st_find(const struct st_model *st, const char *name);
/* Elements [begin, begin + count) of t (row-major), converted to fp32 into out. */
void st_read(struct st_model *st, const struct st_tensor *t, size_t begin, size_t count, float *out);
/* The same elements as the file stores them (t->dtype), unconverted; when
 * landed is given, landed(ctx, k) whenever the first k elements of out are
 * final (rawio_read_landed). */
void st_read_raw(struct st_model *st, const struct st_tensor *t, size_t begin, size_t count, void *out,
                 void (*landed)(void *ctx, size_t elems), void *ctx);

/* ---- writing ---- */

struct st_out {
    const char *name;
    int ndim;
    int64_t shape[2];
};

struct st_layout {
    enum dtype dtype;
    int n_tensors;
    struct st_tensor *tensors; /* in the order given, with file and absolute offset */
    int n_files;
    char (*file_names)[64];    /* model.safetensors, or model-00001-of-0000N.safetensors ... */
    uint64_t *file_sizes;      /* bytes of each file, header included */
    char **headers;            /* each file's header (the 8-byte length is written before it) */
    size_t *header_lens;       /* multiple of 8 */
    uint64_t total_data;       /* sum of the tensors' bytes */
};

/* The files tensors t[0..n) take in dtype dt: in the order given, a new file
 * whenever the next tensor would take the current one past max_file_bytes of
 * data (a tensor larger than that gets a file of its own), one file when they
 * all fit; max_file_bytes 0: no limit. Deterministic: every rank computes the
 * same layout. Two tensors of the same name are a fail_internal. */
void st_layout_plan(struct st_layout *L, const struct st_out *t, int n, enum dtype dt, uint64_t max_file_bytes);
void st_layout_free(struct st_layout *L);
/* Rank 0 (create != 0): creates DIR/NAME.tmp for each file at its final size
 * with its header written; the data bytes are left for st_write. Then every
 * rank opens them for writing (after the caller's barrier): create == 0 only
 * opens, create != 0 creates and keeps the descriptors open. *fds_out: one
 * descriptor per file, freed by st_close_files. */
void st_create(const struct st_layout *L, const char *dir, int create, struct st_files *files);
/* Writes elements [begin, begin + count) of tensor i from fp32 src, converted
 * to the layout's dtype (round to nearest even), at their offset. */
void st_write(const struct st_layout *L, struct st_files *files, int i, size_t begin, size_t count,
              const float *src);
/* Each rank: fsync and close its descriptors, and free fds. Then rank 0
 * (after the caller's barrier, st_publish): renames every NAME.tmp to NAME,
 * writes model.safetensors.index.json when there is more than one file, removes
 * the other kind an earlier export left in DIR (model.safetensors beside a new
 * index, an index beside a new model.safetensors: a loader would take the
 * stale one), and fsyncs the directory. A failed export leaves NAME.tmp files
 * only, which the next export overwrites. */
void st_close_files(const struct st_layout *L, struct st_files *files);
void st_publish(const struct st_layout *L, const char *dir);

#endif
