/*
 * rawio — the bytes of large files moved straight between memory and disk:
 * O_DIRECT where the file system allows it, the page cache where it does not,
 * with a two-buffer pipeline so that copying and disk transfers overlap.
 *
 * Why: O_DIRECT skips filling the page cache with gigabytes that are written
 * or read once; on the development VM, whose free pages go back to the host,
 * that made a cold buffered write of a 1.5 GB state 4x slower than the same
 * write with O_DIRECT (tools/bench/ckpt_io.py prints both).
 *
 * How a transfer of n bytes at file offset `at` moves: the partial 4 KiB
 * blocks at either end of the range (which may be shared with a neighbouring
 * rank's range or with a format's metadata) go through the page cache; the
 * whole blocks in between go with O_DIRECT through two aligned 8 MiB bounce
 * buffers, a copy into (or out of) one overlapping the disk transfer of the
 * other on a helper thread that lives for that one call. The memory buffer and
 * the offset need no alignment. When the file system refuses O_DIRECT (tmpfs,
 * some network file systems: the O_DIRECT open fails, or a transfer fails
 * with EINVAL), the file falls back to the page cache for good.
 *
 * Contracts: a struct rawio_file is used by one thread at a time (its bounce
 * buffers are shared by its transfers). Errors are returned as errno values,
 * never printed; the caller names the file and what it was doing. The format
 * around the bytes (HDF5 for checkpoints, safetensors' header) is the
 * caller's: rawio only knows offsets.
 *
 * Callers: the checkpoint writer and reader (ckpt_write.c, ckpt_read.c), and
 * the safetensors reader and writer.
 */
#ifndef SHARDLM_RAWIO_H
#define SHARDLM_RAWIO_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* A file open for raw data I/O. */
struct rawio_file {
    int fd_direct;   /* opened with O_DIRECT, or -1 (refused: tmpfs, some network file systems) */
    int fd_buffered; /* through the page cache */
    char *bounce;    /* the two staging buffers of O_DIRECT transfers, aligned */
};

/* A struct rawio_file that is not open: rawio_close on it does nothing. */
#define RAWIO_FILE_CLOSED ((struct rawio_file){-1, -1, NULL})

/* rawio_read's result when the file ends before the range does. */
#define RAWIO_EOF (-1)

/* Opens an existing file PATH for reading, or for writing when WRITE (no
 * O_CREAT, no truncation: the file and its size are the caller's). Returns 0,
 * or the errno of the open through the page cache. Close f with rawio_close
 * whatever the result (it holds the bounce buffers either way). */
int rawio_open(struct rawio_file *f, const char *path, bool write);

/* Closes f and frees its buffers; f is RAWIO_FILE_CLOSED afterwards. Returns
 * 0 or the errno of closing the buffered descriptor, where a delayed write
 * error shows. */
int rawio_close(struct rawio_file *f);

/* Writes the n bytes at buf to the file at offset `at` (the file grows as
 * pwrite would make it). Returns 0 or an errno (EIO when the file system
 * takes no bytes). */
int rawio_write(struct rawio_file *f, const void *buf, size_t n, off_t at);

/* Reads n bytes at offset `at` of the file into buf. Returns 0, an errno, or
 * RAWIO_EOF when the file ends before at + n. */
int rawio_read(struct rawio_file *f, void *buf, size_t n, off_t at);

/* rawio_read, calling landed(ctx, k) on the calling thread each time the
 * first k bytes of buf hold what the file has there (k grows, in steps of
 * at most a bounce buffer; the last call, on success, has k = n), so that
 * the caller works on bytes still in cache while the next ones are read. */
int rawio_read_landed(struct rawio_file *f, void *buf, size_t n, off_t at, void (*landed)(void *ctx, size_t k),
                      void *ctx);

/* Makes PATH (a file, or a directory when DIRECTORY: after creating, renaming
 * or deleting entries in it) durable with fsync. Returns 0, or -1 with one
 * line in WHY: "cannot open 'PATH' to sync it: ..." or "cannot fsync 'PATH':
 * ...". */
int rawio_fsync(const char *path, bool directory, char *why, size_t why_cap);

#endif
