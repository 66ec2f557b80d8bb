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
 * master range). A model's LoRA adapter units are not part of a Hugging Face
 * model and are not written (peft_export.h writes them).
 *
 * The writer underneath (hf_writer_open / hf_writer_close) serves any
 * selection of a model's tensors under any names: peft_export.h uses it for
 * PEFT's adapter directory.
 */
#ifndef SHARDLM_HF_EXPORT_H
#define SHARDLM_HF_EXPORT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "model/model.h"
#include "safetensors.h"

/* config.json's record of the checkpoint directory an export came from */
#define HF_ORIGIN_KEY "shardlm_checkpoint_dir"
#define HF_DEFAULT_MAX_FILE ((uint64_t)5000000000ull) /* transformers' max_shard_size default, "5GB" */

struct hf_writer {
    const struct model *m;
    struct st_layout layout;
    struct st_files files;
    int *first;          /* model tensor k (unit-major) -> its layout tensor; -1: not written */
    size_t *elem0;       /* model tensor k -> where it starts in that layout tensor (a fused part's rows) */
    uint64_t bytes_written;
    char dir[1024];
};

/* Collective: checks that DIR holds no other model (its config.json, if any,
 * must describe the same shape and be an earlier export of the checkpoint
 * directory ckpt_dir, which config.json records as shardlm_checkpoint_dir,
 * unless overwrite), creates DIR, plans the files and opens them. */
void hf_export_begin(struct hf_writer *w, const struct model *m, enum dtype dt, uint64_t max_file, const char *dir,
                     const char *ckpt_dir, bool overwrite, struct comm *comm);
/* Writes elements [begin, begin + count) of model tensor t of unit u (the
 * checkpoint's padded indexing; padded rows are dropped) from fp32 src;
 * nothing for a tensor the writer does not write (hf_export_writes). */
void hf_export_write(struct hf_writer *w, int u, int t, size_t begin, size_t count, const float *src);
/* The same for the model tensor called name (the trainer's master slices,
 * which list tensors by name); a name the model lacks is a fail_internal. */
void hf_export_write_named(struct hf_writer *w, const char *name, size_t begin, size_t count, const float *src);
/* Whether the writer writes tensor t of unit u. */
bool hf_export_writes(const struct hf_writer *w, int u, int t);
/* Collective: closes, then rank 0 publishes the files, config.json (from
 * src_dir's when given) and src_dir's tokenizer files. */
void hf_export_end(struct hf_writer *w, enum dtype dt, const char *src_dir, struct comm *comm);

/* ---- the writer underneath, for other selections of a model's tensors ---- */

struct hf_writer_spec {
    const char *file_name; /* the weights' file name when they fit in one file (NULL: model.safetensors) */
    uint64_t max_file;     /* largest weight file (0: one file) */
    /* The name tensor t of unit u has in the files, into out; false: not written. */
    bool (*name)(const struct model *m, int u, int t, char *out, size_t cap);
    /* Rank 0, once DIR exists: refuses (fail_input) a directory holding something this export must not mix with. */
    void (*check_dir)(const struct model *m, const char *dir);
};

/* Collective: rank 0 creates DIR and checks it, then every rank plans the
 * same files and opens them (rank 0 creates them as NAME.tmp). */
void hf_writer_open(struct hf_writer *w, const struct model *m, enum dtype dt, const struct hf_writer_spec *spec,
                    const char *dir, struct comm *comm);
/* Collective: closes the files; rank 0 renames them into place, then calls
 * publish(ctx, dir) (the JSON files, written last); every rank waits for it
 * and the writer is freed. */
void hf_writer_close(struct hf_writer *w, void (*publish)(void *ctx, const char *dir), void *ctx, struct comm *comm);
/* JSON as transformers and PEFT write it (indent 2, keys sorted, numbers in
 * the fewest digits that read back exactly) to path, through path.tmp renamed
 * into place. */
void hf_write_json(const char *path, json_t *j);

#endif
