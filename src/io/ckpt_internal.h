/*
 * ckpt_internal — what the checkpoint files share; not for callers of ckpt.h.
 *
 * The checkpoint module is four files over rawio (the bytes, rawio.h):
 *   ckpt_write.c  saving: the collective phases, HDF5 dataset creation, the
 *                 CRC-32C pieces, agreement on failure (ckpt_try_save)
 *   ckpt_read.c   loading: opening, shape checks, verified range reads
 *   ckpt_dir.c    the checkpoint directory: step_N.h5 names, latest,
 *                 resolving --resume, publishing, pruning, the crash points
 *   ckpt_hdf5.c   HDF5 errors folded into one line, the MPI precondition
 * Functions here carry the ckpt_ prefix; none is collective.
 */
#ifndef SHARDLM_CKPT_INTERNAL_H
#define SHARDLM_CKPT_INTERNAL_H

#include "ckpt.h"

#include <hdf5.h>
#include <stdint.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ckpt writes values in host order into little-endian datasets: the host must be little-endian"
#endif

/* A save's one-line failure reason (ckpt_save_error), and the WHY buffers
 * the directory steps below fill for it. */
#define CKPT_ERROR_CAP 1024

/* ---- HDF5 errors (ckpt_hdf5.c) ---- */

struct hdf5_why {
    char text[512];
    int taken;
};

/* What HDF5 said about the call that just failed, as its two innermost
 * distinct descriptions (call before any other H5 call); clears the stack. */
const char *ckpt_hdf5_error(struct hdf5_why *why);
/* Turns HDF5's own printing of error stacks off (ckpt_hdf5_error folds them). */
void ckpt_quiet_hdf5(void);
/* fail_internal naming WHAT when MPI is not initialised. */
void ckpt_require_mpi(const char *what);

/* ---- Checksums (written by ckpt_write.c, verified by ckpt_read.c) ---- */

/* One checksummed piece of a dataset: flat elements [previous end, end).
 * 16 bytes, no padding: sent between ranks as bytes. */
struct piece {
    uint64_t end;
    uint32_t crc;
    uint32_t set; /* writing: index of the dataset in the save's list */
};

/* ---- The checkpoint directory (ckpt_dir.c) ---- */

/* The names a save of one step writes. */
struct ckpt_step_names {
    char name[64];                /* step_000123.h5 (the step zero-padded to 6 digits) */
    char path[CKPT_MAX_PATH];     /* DIR/step_000123.h5, once published */
    char tmp_path[CKPT_MAX_PATH]; /* DIR/step_000123.h5.tmp, what the ranks write */
};

/* Fills *names for STEP in DIR; fail_input when DIR is too long. */
void ckpt_step_names(const char *dir, long step, struct ckpt_step_names *names);

/* Creates DIR and its missing parents. 0, or -1 with one line in WHY. */
int ckpt_make_dir(const char *dir, char *why, size_t why_cap);

/* Test hook SHARDLM_CKPT_CRASH (see ckpt.h): the points of a save, in order. */
enum { CRASH_NONE = -1, CRASH_BEFORE_DATA, CRASH_MID_DATA, CRASH_BEFORE_RENAME, CRASH_BEFORE_LATEST };

/* A save's crash point: which is armed on this rank, and for the message,
 * the rank and the file being saved. */
struct ckpt_crash {
    int armed; /* CRASH_*, or CRASH_NONE */
    int rank;
    const char *path;
};

/* The point SHARDLM_CKPT_CRASH arms on RANK for this save, or CRASH_NONE.
 * It arms one save per process: the first that finds it set. fail_input when
 * it is malformed. */
int ckpt_crash_armed(int rank);
/* Kills this process with SIGKILL when POINT is the armed one. */
void ckpt_crash_reached(const struct ckpt_crash *crash, int point);

/* Rank 0, after every rank has written, closed and fsynced the .tmp file:
 * renames it to its published name, fsyncs DIR, then moves DIR/latest to it
 * (latest.tmp, renamed) and fsyncs DIR again. Passes CRASH_BEFORE_LATEST.
 * 0, or -1 with one line in WHY. */
int ckpt_publish(const struct ckpt_crash *crash, const char *dir, const struct ckpt_step_names *names, char *why,
                 size_t why_cap);

/* Rank 0: deletes all but the newest KEEP checkpoints of DIR (0: keeps all;
 * never CURRENT). Failures are warnings. */
void ckpt_prune(const char *dir, int keep, long current);

#endif
