/*
 * nvme — optimizer state in a file on a local disk (offload_optimizer
 * "device": "nvme", DeepSpeed's ZeRO-Infinity), streamed through a few
 * pinned host buffers for the AdamW step.
 *
 * One file per job and rank, NAME = <nvme_path>/shardlm-<job>-rank<R>.optim,
 * held with an exclusive flock for the file's lifetime: a second job (or a
 * second rank with the same name) that reaches the same file stops with one
 * line instead of sharing it. A process that fails (fail_input) removes its file;
 * one that is killed leaves it, and the next nvme_open in that directory
 * removes it once it is unlocked and a minute old (NVME_STALE_SECONDS). The file is scratch: checkpoints hold the state
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
 * last checkpoint is intact. A file-size limit (ulimit -f) is such an error,
 * not a SIGXFSZ kill (nvme_open ignores the signal).
 *
 * Test hook: SHARDLM_INJECT_NVME=short_write:K makes the K-th piece write of
 * the AdamW steps (nvme_adamw_step; counted from the first step of the
 * process) come back short (the error above, as a failing disk gives it);
 * SHARDLM_INJECT_NVME=kill:K raises SIGKILL on the process once that write is
 * done (a job killed in the middle of an optimizer step, its file half old
 * and half new).
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
/* Bytes: the alignment of O_DIRECT offsets and lengths (a piece of NVME_PIECE_ALIGN fp32; a parameter shard's
 * place and buffers in its file). */
#define NVME_BLOCK ((size_t)4096)
/* Buffers: at least 3 (read-ahead, update, write-behind). */
#define NVME_BUFFERS_MIN 3
/* A file of another job that is not locked and was not written for this long
 * is a kill's leftover: nvme_open removes it (with a warning). */
#define NVME_STALE_SECONDS 60

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
/* The piece nvme_sizes starts from: NVME_PIECE_DEFAULT, or the environment's
 * SHARDLM_NVME_PIECE (elements, rounded up to NVME_PIECE_ALIGN; a test and
 * benchmark hook: a small model's state then outweighs its buffers). */
size_t nvme_piece_default(void);

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
 * through the buffers: no copy of the whole state in memory; of each part
 * given, only the 4 KiB blocks that hold the range move. */
void nvme_write_range(struct nvme_file *f, size_t at, size_t count, const float *p, const float *m, const float *v);
void nvme_read_range(struct nvme_file *f, size_t at, size_t count, float *p, float *m, float *v);
/* Reads the master of elements [at, at + count) into out as dtype (converted
 * from the file's buffer: no scratch). */
void nvme_read_master_as(struct nvme_file *f, size_t at, size_t count, void *out, enum dtype dtype);

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

/* ---- shared with the parameter file (nvme_param.c) ------------------------------ */

/* Checks dir (nvme_check_dir) and opens *path_out = <dir>/shardlm-<job>-rank<R>.<ext> (malloc'd; O_DIRECT
 * when the file system allows it, else buffered and a warning naming dir; *direct says which), locks it
 * (another holder: one line, exit 2), truncates and sizes it to bytes; its descriptor. */
int nvme_open_locked(const char *dir, const char *job, int rank, const char *ext, size_t bytes, char **path_out,
                     bool *direct);
/* One line naming the file and the cause of a failed or short read/write, exit 2. */
__attribute__((noreturn)) void nvme_io_failed(const char *path, const char *what, long res, size_t want);
/* n buffers of bytes each, 4 KiB aligned, zeroed, mlocked where the limit allows; freed by nvme_release. */
void **nvme_pinned_buffers(int n, size_t bytes);
struct io_uring;
/* The end both file kinds share: ring (when async) torn down, the n buffers of bytes each freed, the file (fd,
 * path) removed, unlocked and closed, path freed. */
void nvme_release(struct io_uring *ring, bool async, void **bufs, int n, size_t bytes, int fd, char *path);
/* Reads or writes bytes at off of path (fd) synchronously, whole (errors: nvme_io_failed). */
void nvme_sync_io(int fd, const char *path, void *buf, size_t bytes, size_t off, bool write);
/* Waits for one completion of ring (liburing): the buffer index its request carried; *res its result. */
int nvme_ring_reap(struct io_uring *ring, const char *path, int *res);

/*
 * The parameter file (offload_param "device": "nvme", stage 3; the engine's
 * side is zero_nvme.c): NAME = <nvme_path>/shardlm-<job>-rank<R>.param,
 * locked like the optimizer's file, holding the rank's parameter shards in
 * the parameter dtype, each unit's at an offset the caller chooses (multiples
 * of NVME_BLOCK). `buffers` pinned buffers of buf_bytes (a multiple of
 * NVME_BLOCK) move whole shards: a read or write of one buffer is started
 * (liburing; synchronous where it is not available) and waited for by buffer.
 */
struct nvme_params;
struct nvme_params *nvme_params_open(const char *dir, const char *job, int rank, size_t file_bytes, size_t buf_bytes,
                                     int buffers);
/* Waits for what is in flight, closes, unlocks and removes the file. NULL: nothing. */
void nvme_params_close(struct nvme_params *f);
int nvme_params_buffers(const struct nvme_params *f);
void *nvme_params_buffer(const struct nvme_params *f, int b);
/* Starts moving bytes (<= buf_bytes, both it and off multiples of NVME_BLOCK)
 * between buffer b and the file at off; b must be idle (nvme_params_wait). */
void nvme_params_start(struct nvme_params *f, int b, size_t off, size_t bytes, bool write);
/* Waits until buffer b's read or write is done (at once when it has none). */
void nvme_params_wait(struct nvme_params *f, int b);
const char *nvme_params_path(const struct nvme_params *f);
bool nvme_params_direct(const struct nvme_params *f);
size_t nvme_params_host_bytes(const struct nvme_params *f);
void nvme_params_traffic(const struct nvme_params *f, double *read_bytes, double *written_bytes);

#endif
