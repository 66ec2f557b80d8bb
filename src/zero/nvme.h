/*
 * nvme — optimizer state in a file on a local disk (offload_optimizer
 * "device": "nvme", DeepSpeed's ZeRO-Infinity), streamed through a few
 * pinned host buffers for the AdamW step.
 *
 * One file per job and rank, NAME = <nvme_path>/shardlm-<job>-rank<R>.optim,
 * held with an exclusive flock for the file's lifetime: a second job (or a
 * second rank with the same name) that reaches the same file stops with one
 * line instead of sharing it. The file is scratch: checkpoints hold the state
 * (nvme_read_range), a resume rewrites it (nvme_write_range).
 *
 * Layout: the rank's optimizer range (the concatenation of the ranges of
 * zero's adam ranges, n elements) cut into pieces of `piece` elements; piece
 * i sits at byte i * 12 * piece as [master fp32 | adam m fp32 | adam v fp32]
 * of `piece` elements each (the last piece padded with zeros), so one read and
 * one write move a piece's whole state. piece is a multiple of 1024 elements,
 * so every piece starts and ends on a 4 KiB boundary as O_DIRECT needs.
 *
 * The step (nvme_adamw_step): with B buffers, piece k+1.. are read ahead
 * while piece k is updated (adamw_update, the same per-element arithmetic as
 * the in-memory path, so the same bits) and piece k-1.. written behind, via
 * liburing (one ring, O_DIRECT with aligned buffers when the file system
 * allows it, else buffered I/O and a warning). Built without liburing
 * (SHARDLM_NO_URING: a KIT= build whose kit lacks it), or where the kernel
 * refuses io_uring (a seccomp filter), the same order with synchronous
 * pread/pwrite and a warning naming why.
 *
 * Errors (a disk that fills up, an I/O error, a short read): one line naming
 * the file and the cause, exit 2 (fail_input); the file is scratch, so the
 * last checkpoint is intact.
 */
#ifndef SHARDLM_NVME_H
#define SHARDLM_NVME_H

#include <stdbool.h>
#include <stddef.h>

#include "core/adamw.h"
#include "core/dtype.h"

/* Default piece: 2M elements (24 MiB of state per buffer): on the development
 * machine's virtual disk, 12 MiB requests reached 0.4 of a plain read + write,
 * 24 MiB ~0.8 (tools/bench/nvme.sh). */
#define NVME_PIECE_DEFAULT ((size_t)2 << 20)
#define NVME_PIECE_ALIGN ((size_t)1024)
/* Bytes: the alignment of O_DIRECT offsets and lengths this module keeps (a piece of NVME_PIECE_ALIGN fp32). */
#define NVME_BLOCK ((size_t)4096)
/* Buffers: at least 3 (read-ahead, update, write-behind). */
#define NVME_BUFFERS_MIN 3

/* What nvme_check_dir found. */
struct nvme_dir_info {
    bool tmpfs;          /* the directory is memory (tmpfs, ramfs), not a disk */
    double free_bytes;   /* statvfs: bytes an unprivileged writer may still use */
};

/*
 * Checks nvme_path before step 1: exists or can be made (parents too), is a
 * directory, has room for need_bytes (statvfs). Bad: fail_input with one line
 * naming the path and what to do. A tmpfs/ramfs path: a warning that it is
 * memory, not disk.
 */
void nvme_check_dir(const char *dir, double need_bytes, struct nvme_dir_info *info);

/* Bytes of the file for n elements in pieces of `piece`. */
size_t nvme_file_bytes(size_t n, size_t piece);

/* Bytes of the file and of the pinned buffers for a range of n elements with
 * `buffers` buffers (below NVME_BUFFERS_MIN: that many), and the piece
 * (elements) nvme_open is to be given: NVME_PIECE_DEFAULT, or, when the range
 * is smaller, the range rounded up to NVME_PIECE_ALIGN. The engine opens its
 * file with these and the memory plan counts them: one function for both. */
void nvme_sizes(size_t n, int buffers, size_t *file_bytes, size_t *host_bytes, size_t *piece);

struct nvme_file;

/*
 * Makes (or truncates) and locks the rank's file under dir, sized for n
 * elements, zero state; `buffers` pinned buffers of 12 * piece bytes each
 * (piece rounded up to NVME_PIECE_ALIGN; 0 takes NVME_PIECE_DEFAULT;
 * buffers below NVME_BUFFERS_MIN take it). Checks dir (nvme_check_dir).
 */
struct nvme_file *nvme_open(const char *dir, const char *job, int rank, size_t n, size_t piece, int buffers);
/* Closes, unlocks and removes the file; frees the buffers. NULL: nothing. */
void nvme_close(struct nvme_file *f);

const char *nvme_path(const struct nvme_file *f);
bool nvme_direct(const struct nvme_file *f);   /* O_DIRECT in use */
bool nvme_async(const struct nvme_file *f);    /* io_uring in use */
size_t nvme_host_bytes(const struct nvme_file *f); /* the buffers' bytes */

/* Writes / reads elements [at, at + count) of the state; any of p, m, v may
 * be NULL (write: that part is left as it is; read: not read). Synchronous,
 * through the buffers: no copy of the whole state in memory. */
void nvme_write_range(struct nvme_file *f, size_t at, size_t count, const float *p, const float *m, const float *v);
void nvme_read_range(struct nvme_file *f, size_t at, size_t count, float *p, float *m, float *v);

/* One tensor slice of the step: elements [at, at + n) of the state, their
 * fp32 gradients, the decay, and where the new parameters go in out_dtype
 * (NULL: nowhere). Segments ascend in `at` and do not overlap. */
struct nvme_segment {
    size_t at, n;
    const float *grad;
    float weight_decay;
    void *param_out;
};

/* The AdamW step over every segment (hp->weight_decay is taken from each segment). */
void nvme_adamw_step(struct nvme_file *f, const struct nvme_segment *segs, int n_segs, const struct adamw_hparams *hp,
                     enum dtype out_dtype);

/* Bytes read and written since the file was opened. */
void nvme_traffic(const struct nvme_file *f, double *read_bytes, double *written_bytes);

#endif
