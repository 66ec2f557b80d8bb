/*
 * ckpt — checkpoint storage: a sharded training state in ONE parallel HDF5
 * file per checkpoint (DESIGN §7).
 *
 * Layout of DIR/step_000123.h5 (readable by h5py / h5dump without shardlm):
 *   /<group>/<tensor name>   fp32, the tensor's full Hugging Face shape, e.g.
 *                            /master/h.3.attn.c_attn.weight (C, 3C); groups
 *                            are chosen by the caller ("master", "adam_m", ...)
 *   /rank_state/<name>       uint64 (world at save, n): one row per saving rank
 *   root attributes          format = "shardlm-checkpoint", format_version,
 *                            shardlm_version, step, world_size, plus the
 *                            caller's scalars and strings (loss scale, config
 *                            JSON, model description JSON, ...)
 * Every dataset is contiguous and carries its CRC-32C checksums as two
 * attributes: crc32c_ends (uint64) cuts the flattened dataset into pieces
 * [end[i-1], end[i]), and crc32c (uint32) is the CRC-32C of each piece's
 * little-endian bytes. Pieces end at the multiples of CKPT_PIECE_ELEMS and at
 * the ends of the saving ranks' ranges, so each rank checksums what it wrote
 * without seeing the others' data. (Format 1 used chunked datasets with
 * HDF5's Fletcher32 filter; they are still read, and HDF5 verifies them. The
 * filter made saving 5x slower than a plain write: HDF5's Fletcher32 is a
 * byte loop, and filtered chunks must go through collective I/O.)
 *
 * Writing: every rank calls ckpt_save with the same groups, tensors (names,
 * shapes, order) and attributes; only its slices' ranges and data differ. A
 * rank that holds nothing of a tensor passes count 0. Each element must be
 * written by exactly one rank (stage 0: let rank 0 pass the whole tensor and
 * the others count 0, or split it); ckpt_save checks that the counts of all
 * ranks add up to each tensor's size. Creating the datasets (contiguous,
 * allocated at creation) and writing the checksum attributes are collective
 * (MPI-IO); in between, each rank writes its ranges straight to the
 * datasets' file offsets, with O_DIRECT where the file system allows it
 * (see rawio.h), without waiting for the others.
 *
 * Publishing is atomic: the file is written as step_N.h5.tmp, flushed, closed
 * and fsynced, and only after every rank is done does rank 0 rename it to
 * step_N.h5, fsync the directory and move DIR/latest (a one-line file naming
 * it) by writing latest.tmp and renaming. Older checkpoints are pruned after
 * that. A crash at any point leaves the previous checkpoint and latest intact.
 *
 * Reading: ckpt_open is collective; ckpt_read is independent, so any rank can
 * ask for any flat range of any tensor, at any world size: the range is read
 * from the 2-D dataset as up to three hyperslab blocks (partial first row,
 * whole middle rows, partial last row). Corruption (checksum), a missing
 * dataset, a wrong shape, a truncated or unreadable file end the process
 * through fail_input (exit status 2) with one line naming the file and the
 * dataset. Every piece overlapping the range read is verified: the parts of
 * the first and last piece outside the range are read too (at most two
 * pieces more per call). When the ranks read the whole state between them,
 * every piece is verified.
 *
 * MPI: this is the storage layer, so it uses MPI_COMM_WORLD directly (through
 * HDF5's MPI-IO driver, plus a few collectives of its own); MPI must be
 * initialised. Callers: the trainer (save every N steps, resume), export, tests.
 *
 * Implementation: ckpt_write.c (saving), ckpt_read.c (loading), ckpt_dir.c
 * (the directory: names, latest, resolving, publishing, pruning, crash
 * points), ckpt_hdf5.c (HDF5 errors), sharing ckpt_internal.h; the bytes move
 * through rawio.c.
 */
#ifndef SHARDLM_CKPT_H
#define SHARDLM_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CKPT_FORMAT "shardlm-checkpoint"
#define CKPT_FORMAT_VERSION 2
/* Elements per checksummed piece at most: 1 MiB of fp32. Small enough that
 * verifying a range costs at most 2 MiB of extra reading and a mismatch names
 * a small region; large enough that the tables stay small (12 bytes per MiB:
 * 3 MB for the 840 GB state of a 70B model). */
#define CKPT_PIECE_ELEMS ((size_t)1 << 18)
#define CKPT_ATTR_CRC "crc32c"
#define CKPT_ATTR_CRC_ENDS "crc32c_ends"
#define CKPT_MAX_PATH 4096

/* This rank's flat range [begin, begin+count) of a tensor of the given full
 * shape (row-major), fp32. */
struct ckpt_slice {
    const char *name;   /* Hugging Face name, e.g. "h.0.attn.c_attn.weight" */
    int ndim;           /* 1 or 2 */
    size_t shape[2];    /* full shape; shape[1] unused when ndim == 1 */
    size_t begin;       /* elements from the tensor's start */
    size_t count;       /* 0: this rank holds nothing of it (still listed) */
    const float *data;  /* count values, or NULL when `read` gives them */
    /* With data NULL: read(src, from, n, out) puts the slice's elements [from, from + n) (from its begin) in
     * out. For a state kept out of memory (offload_optimizer "nvme"): the writer takes it a piece of
     * CKPT_READ_ELEMS at a time, never the whole slice in memory. */
    void (*read)(const void *src, size_t from, size_t n, float *out);
    const void *src;
};

/* Elements a slice's read is asked for at most (a multiple of CKPT_PIECE_ELEMS): 8 MiB of fp32. */
#define CKPT_READ_ELEMS ((size_t)1 << 21)

/* The slice's elements [from, from + n): its data, or read into buf (n elements). */
const float *ckpt_slice_values(const struct ckpt_slice *s, size_t from, size_t n, float *buf);

/* One HDF5 group of tensors: "master", "adam_m", "adam_v". */
struct ckpt_group {
    const char *name;
    const struct ckpt_slice *slices;
    int n_slices;
};

/* Small per-rank state (data position, RNG state): n values per rank, stored
 * as /rank_state/<name> of shape (world, n). */
struct ckpt_rank_state {
    const char *name;
    int n;
    const uint64_t *values;
};

enum ckpt_attr_kind { CKPT_ATTR_I64, CKPT_ATTR_F64, CKPT_ATTR_STR };

/* A scalar attribute of the file's root group; same value on every rank. */
struct ckpt_attr {
    const char *name;
    enum ckpt_attr_kind kind;
    int64_t i64;
    double f64;
    const char *str;
};

struct ckpt_contents {
    const struct ckpt_group *groups;
    int n_groups;
    const struct ckpt_rank_state *rank_state;
    int n_rank_state;
    const struct ckpt_attr *attrs;
    int n_attrs;
};

/* Writes DIR/step_<step>.h5 (step zero-padded to 6 digits), publishes it
 * atomically, moves DIR/latest to it, then keeps only the newest `keep`
 * checkpoints of DIR (0: keeps all). Collective. Creates DIR when missing.
 * The published path goes to path_out (may be NULL).
 *
 * Returns 0, or -1 when writing failed (a full disk, a file-size limit, an
 * unwritable or impossible directory, a failed fsync or rename): the ranks
 * agree on failure after every collective phase (an all-reduce of a status
 * flag), so every rank returns -1 together and none is left waiting in a
 * collective; ckpt_save_error() then holds the same one-line reason on every
 * rank (the lowest failing rank's, e.g. "cannot create directory 'x/y': Not a
 * directory" or "cannot write dataset '/master/wte.weight': ...; File too
 * large"). On failure the partial DIR/step_N.h5.tmp is removed and the
 * previous checkpoint and DIR/latest are untouched. Before HDF5 opens the
 * file, rank 0 checks the file-size limit against the state's size (+1 MiB)
 * and fallocates that much for the .tmp file, so a full disk or a file-size
 * limit is found where the ranks can agree on it: a write failing inside a
 * collective HDF5 call on some ranks only (space taken by someone else in
 * between) can still leave the others waiting inside HDF5 (seen with a 64 KiB
 * ulimit before this check existed). SIGXFSZ is ignored from
 * the first call on, so a file-size limit (ulimit -f) fails the write with
 * EFBIG instead of killing the process. Programming errors (ranks passing
 * different layouts, slices not covering a tensor) are still fail_internal.
 *
 * Test hook: SHARDLM_CKPT_CRASH=POINT[:RANK] makes rank RANK (default 0) raise
 * SIGKILL on itself at POINT of the next save this process makes (only that
 * one): before_data (the .tmp file created, nothing written), mid_data (after
 * half of the datasets are written), before_rename (file flushed, closed,
 * fsynced, every rank done, before rank 0 renames .tmp to step_N.h5; use
 * rank 0), before_latest (after the rename and the directory fsync, before
 * latest moves; rank 0). In every case the previous checkpoint and latest stay
 * valid; after before_latest, step_N.h5 exists but latest still names the
 * previous one, so --resume auto resumes from the previous checkpoint. Leftover
 * .tmp files are ignored by resolving and pruning and overwritten by the next
 * save of that step. */
int ckpt_try_save(const char *dir, long step, int keep, const struct ckpt_contents *contents, char *path_out,
                  size_t path_cap);
/* The reason of the last failed ckpt_try_save ("" after a success). */
const char *ckpt_save_error(void);
/* Collective end of the job after a failed save: one line "cannot save a
 * checkpoint in 'DIR': WHY" from rank 0, exit status 2 (fail_input). */
__attribute__((noreturn)) void ckpt_fail_agreed(const char *dir, const char *why);
/* ckpt_try_save, and ckpt_fail_agreed when it fails. */
void ckpt_save(const char *dir, long step, int keep, const struct ckpt_contents *contents, char *path_out,
               size_t path_cap);

/* Before training (one rank): DIR exists or is created, is a directory, and
 * a file can be created in it, so that a read-only or impossible
 * checkpoint.dir is found before any step, not at the first save. Returns 0,
 * or -1 with the problem (one line naming DIR) in WHY. Local (no MPI). */
int ckpt_check_dir(const char *dir, char *why, size_t why_cap);
/* One run at a time on DIR (issue 46): takes DIR's lock for the life of the
 * process (an flock on DIR/.shardlm.lock, which the kernel releases however
 * the process ends, kill -9 included; where the file system does not honour
 * flock, the existence of DIR/.shardlm.lock.held: ckpt_lock.c says which
 * file systems and what then). Returns 0, or -1 with one line in WHY naming
 * DIR and the run holding it (host, pid, Slurm job, since when). DIR must
 * exist. Rank 0, before anything in DIR is read or written. Local (no MPI). */
int ckpt_lock_dir(const char *dir, char *why, size_t why_cap);
/* 1 when a file called NAME (no directory part) is one that a checkpoint
 * directory's saves write, replace or delete: step_<N>.h5, its .tmp, latest
 * and latest.tmp. */
int ckpt_managed_name(const char *name);
/* Removes, naming each, the temporary files of saves that did not finish
 * (step_N.h5.tmp, latest.tmp: a rank killed mid-save) from DIR. Rank 0, at
 * the start of a run, before any save, and only once ckpt_lock_dir holds DIR:
 * then no live run is writing any of them. */
void ckpt_remove_stale_tmp(const char *dir);

/* The newest step of the published checkpoints (step_N.h5) DIR holds, with
 * LIST "step_000020.h5, step_000010.h5 (2 in all)" (newest first, a few
 * named); -1 and LIST "" when it holds none. Local (no MPI). */
long ckpt_dir_checkpoints(const char *dir, char *list, size_t list_cap);

/* The checkpoint file SPEC means, malloc'd, or NULL for a fresh start.
 *   "auto"  DIR/latest's target. Without a usable latest (absent, malformed,
 *           naming a missing file) it is NULL only when DIR holds no
 *           step_*.h5; otherwise fail_input names them and how to go on
 *           (never start over on top of checkpoints).
 *   "none"  NULL: start fresh whatever DIR holds.
 *   a directory, or a file named "latest": that latest's target (fail_input
 *           when it is unusable); any other path: itself.
 * latest holds a file name in its directory (as ckpt_save writes it) or an
 * absolute path; trailing white space is ignored. "" is an error. Local (no
 * MPI). */
char *ckpt_resolve(const char *dir, const char *spec);

struct ckpt_reader;

/* Opens a checkpoint for reading (collective) and checks its format
 * attributes. fail_input when it is missing, truncated or not a checkpoint. */
struct ckpt_reader *ckpt_open(const char *path);
void ckpt_close(struct ckpt_reader *r); /* collective */

/* Reads [begin, begin+count) of /<group>/<name> into out, after checking the
 * dataset exists with exactly the given shape. Independent (any rank, any
 * range). count 0 still checks the dataset. */
void ckpt_read(struct ckpt_reader *r, const char *group, const char *name, int ndim, const size_t shape[2],
               size_t begin, size_t count, float *out);
/* Reads the slice's range into out (the slice's data pointer is ignored). */
void ckpt_read_slice(struct ckpt_reader *r, const char *group, const struct ckpt_slice *s, float *out);

/* World size the checkpoint was saved at. */
int ckpt_saved_world(const struct ckpt_reader *r);
/* The whole /rank_state/<name>: saved_world rows of n values into out. */
void ckpt_read_rank_state(struct ckpt_reader *r, const char *name, int n, uint64_t *out);

/* Root attributes; fail_input when missing or of another kind. */
int64_t ckpt_attr_i64(struct ckpt_reader *r, const char *name);
double ckpt_attr_f64(struct ckpt_reader *r, const char *name);
char *ckpt_attr_str(struct ckpt_reader *r, const char *name); /* malloc'd */
bool ckpt_has_attr(struct ckpt_reader *r, const char *name);

/* The part of a range [range_begin, range_begin+range_count) of a unit's flat
 * buffer that falls in a tensor at [tensor_offset, tensor_offset+numel):
 * sets *begin (from the tensor's start) and *count (0 when disjoint), and
 * returns the index of its first element inside the range. The ZeRO mapping
 * from a rank's shard to the slices it saves. */
size_t ckpt_intersect(size_t tensor_offset, size_t numel, size_t range_begin, size_t range_count, size_t *begin,
                      size_t *count);

#endif
