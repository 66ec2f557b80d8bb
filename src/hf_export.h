/*
 * hf_export — a Hugging Face model directory written in parallel: config.json,
 * the weights in model.safetensors or model-0000K-of-0000N.safetensors files
 * of at most a given size with model.safetensors.index.json, and the
 * tokenizer files of the directory the run started from.
 *
 * Every rank computes the same layout; rank 0 creates the files at their
 * final size with their headers; every rank then writes the element ranges it
 * holds at their offsets (nothing is gathered); rank 0 publishes (renames the
 * files into place, writes the index and config.json last). Used by `shardlm
 * export CKPT DIR` (each rank reads 1/N of every tensor from the checkpoint)
 * and by training with checkpoint.export_hf (each rank writes its own fp32
 * master range).
 */
#ifndef SHARDLM_HF_EXPORT_H
#define SHARDLM_HF_EXPORT_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "model.h"
#include "safetensors.h"

#define HF_DEFAULT_MAX_FILE ((uint64_t)5000000000ull) /* transformers' max_shard_size default, "5GB" */

struct hf_writer {
    const struct model *m;
    struct st_layout layout;
    struct st_files files;
    int *first;          /* model tensor k (unit-major) -> its layout tensor; -1: not written */
    uint64_t bytes_written;
    char dir[1024];
};

/* Collective: checks that DIR holds no other model (its config.json, if any,
 * must describe the same shape), creates DIR, plans the files and opens them. */
void hf_export_begin(struct hf_writer *w, const struct model *m, enum dtype dt, uint64_t max_file, const char *dir,
                     struct comm *comm);
/* Writes elements [begin, begin + count) of model tensor t of unit u (the
 * checkpoint's padded indexing; padded rows are dropped) from fp32 src. */
void hf_export_write(struct hf_writer *w, int u, int t, size_t begin, size_t count, const float *src);
/* Collective: closes, then rank 0 publishes the files, config.json (from
 * src_dir's when given) and src_dir's tokenizer files. */
void hf_export_end(struct hf_writer *w, enum dtype dt, const char *src_dir, struct comm *comm);

#endif
