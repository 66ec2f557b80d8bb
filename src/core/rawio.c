/*
 * rawio — O_DIRECT double-buffered file I/O (see rawio.h for the contracts).
 */
#define _GNU_SOURCE /* O_DIRECT */
#include "rawio.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* O_DIRECT transfers start, end and sit in memory at multiples of this: the
 * largest logical block size of common devices (512 or 4096 bytes). */
#define RAWIO_ALIGN ((size_t)4096)
/* Each of the two staging buffers of O_DIRECT transfers: large enough that
 * each transfer is one big request, small enough to stay in warm memory. */
#define RAWIO_BOUNCE_BYTES ((size_t)8 << 20)

int rawio_open(struct rawio_file *f, const char *path, bool write)
{
    int flags = write ? O_WRONLY : O_RDONLY;
    f->fd_direct = open(path, flags | O_DIRECT);
    f->fd_buffered = open(path, flags);
    f->bounce = xalloc_aligned(2 * RAWIO_BOUNCE_BYTES);
    return f->fd_buffered < 0 ? errno : 0;
}

int rawio_close(struct rawio_file *f)
{
    if (f->fd_direct >= 0)
        close(f->fd_direct);
    int e = f->fd_buffered >= 0 && close(f->fd_buffered) != 0 ? errno : 0;
    free(f->bounce);
    *f = RAWIO_FILE_CLOSED;
    return e;
}

/* pread or pwrite of all n bytes; 0, an errno, or RAWIO_EOF when a read
 * meets the end of the file. */
static int transfer_all(int fd, bool write, char *buf, size_t n, off_t at)
{
    while (n > 0) {
        ssize_t done = write ? pwrite(fd, buf, n, at) : pread(fd, buf, n, at);
        if (done < 0 && errno == EINTR)
            continue;
        if (done <= 0)
            return done < 0 ? errno : write ? EIO : RAWIO_EOF;
        buf += done, n -= (size_t)done, at += done;
    }
    return 0;
}

/* The O_DIRECT part of a transfer as a two-stage pipeline over the two
 * bounce buffers: pieces of RAWIO_BOUNCE_BYTES are copied between memory and
 * a bounce buffer on one thread and transferred between that buffer and the
 * file on another, so a copy overlaps the transfer of the other buffer. For a
 * write the copy produces a piece and the transfer consumes it; for a read,
 * the other way round. The helper thread lives for one call: no thread
 * outlives a transfer. */
struct pipeline {
    struct rawio_file *f;
    bool write;
    char *mem;
    size_t n;          /* bytes, a multiple of RAWIO_ALIGN */
    off_t at;
    size_t n_pieces;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    size_t produced, consumed; /* pieces */
    int error;                 /* first error of either stage */
    void (*landed)(void *, size_t); /* a read's progress (rawio_read_landed), or NULL */
    void *landed_ctx;
    size_t landed_base;        /* bytes of the caller's buffer before mem */
};

/* One stage's work on piece k: the file transfer (io) or the copy. */
static int pipeline_step(struct pipeline *p, size_t k, bool io)
{
    char *slot = p->f->bounce + (k % 2) * RAWIO_BOUNCE_BYTES, *mem = p->mem + k * RAWIO_BOUNCE_BYTES;
    size_t len = p->n - k * RAWIO_BOUNCE_BYTES < RAWIO_BOUNCE_BYTES ? p->n - k * RAWIO_BOUNCE_BYTES : RAWIO_BOUNCE_BYTES;
    if (io)
        return transfer_all(p->f->fd_direct, p->write, slot, len, p->at + (off_t)(k * RAWIO_BOUNCE_BYTES));
    if (p->write) {
        memcpy(slot, mem, len);
    } else {
        memcpy(mem, slot, len);
        if (p->landed)
            p->landed(p->landed_ctx, p->landed_base + k * RAWIO_BOUNCE_BYTES + len);
    }
    return 0;
}

/* Runs one stage over every piece: the producer fills a free bounce buffer
 * (at most two ahead of the consumer), the consumer empties a filled one. */
static void pipeline_run(struct pipeline *p, bool producer)
{
    bool io = producer != p->write; /* write: copy, then transfer; read: transfer, then copy */
    for (size_t k = 0; k < p->n_pieces; k++) {
        pthread_mutex_lock(&p->lock);
        while (!p->error && (producer ? p->produced - p->consumed == 2 : p->consumed == p->produced))
            pthread_cond_wait(&p->cond, &p->lock);
        bool stop = p->error != 0;
        pthread_mutex_unlock(&p->lock);
        if (stop)
            return;
        int e = pipeline_step(p, k, io);
        pthread_mutex_lock(&p->lock);
        if (e && !p->error)
            p->error = e;
        if (producer)
            p->produced++;
        else
            p->consumed++;
        pthread_cond_broadcast(&p->cond);
        pthread_mutex_unlock(&p->lock);
        if (e)
            return;
    }
}

static void *pipeline_thread(void *arg)
{
    struct pipeline *p = arg;
    pipeline_run(p, !p->write); /* the helper does the file transfers */
    return NULL;
}

/* 0, an errno (EINVAL: no O_DIRECT here), or RAWIO_EOF. */
static int direct_transfer(struct rawio_file *f, bool write, char *mem, size_t n, off_t at,
                           const struct pipeline *progress)
{
    struct pipeline p = {.f = f, .write = write, .mem = mem, .n = n, .at = at,
                         .n_pieces = (n + RAWIO_BOUNCE_BYTES - 1) / RAWIO_BOUNCE_BYTES,
                         .landed = progress->landed, .landed_ctx = progress->landed_ctx,
                         .landed_base = progress->landed_base};
    pthread_mutex_init(&p.lock, NULL);
    pthread_cond_init(&p.cond, NULL);
    pthread_t helper;
    if (p.n_pieces > 1 && pthread_create(&helper, NULL, pipeline_thread, &p) == 0) {
        pipeline_run(&p, write);
        pthread_join(helper, NULL);
    } else { /* one piece, or no thread to be had: one after the other */
        for (size_t k = 0; k < p.n_pieces && !p.error; k++) {
            p.error = pipeline_step(&p, k, !write);
            if (!p.error)
                p.error = pipeline_step(&p, k, write);
        }
    }
    pthread_cond_destroy(&p.cond);
    pthread_mutex_destroy(&p.lock);
    return p.error;
}

/* Reads n bytes at `at` through the page cache in bounce-sized steps,
 * reporting each to progress->landed (when set) as bytes base + done. */
static int buffered_read(struct rawio_file *f, char *buf, size_t n, off_t at, const struct pipeline *progress)
{
    for (size_t done = 0; done < n || n == 0;) {
        size_t len = n - done < RAWIO_BOUNCE_BYTES || !progress->landed ? n - done : RAWIO_BOUNCE_BYTES;
        int e = transfer_all(f->fd_buffered, false, buf + done, len, at + (off_t)done);
        if (e)
            return e;
        done += len;
        if (progress->landed)
            progress->landed(progress->landed_ctx, progress->landed_base + done);
        if (n == 0)
            break;
    }
    return 0;
}

/* Writes buf to, or reads it from, n bytes at file offset `at`: the partial
 * blocks at either end through the page cache, the whole blocks between them
 * with O_DIRECT (direct_transfer). Falls back to the page cache for good when
 * the file system refuses an O_DIRECT transfer (EINVAL). 0, an errno, or
 * RAWIO_EOF. A write only reads buf. A read reports its progress to
 * progress->landed when that is set. */
static int transfer(struct rawio_file *f, bool write, char *buf, size_t n, off_t at, struct pipeline *progress)
{
    size_t head = (size_t)((RAWIO_ALIGN - (size_t)at % RAWIO_ALIGN) % RAWIO_ALIGN);
    if (f->fd_direct < 0 || n < head + RAWIO_ALIGN)
        return write ? transfer_all(f->fd_buffered, true, buf, n, at) : buffered_read(f, buf, n, at, progress);
    size_t middle = (n - head) / RAWIO_ALIGN * RAWIO_ALIGN, tail = n - head - middle;
    int e = write ? transfer_all(f->fd_buffered, true, buf, head, at) : buffered_read(f, buf, head, at, progress);
    progress->landed_base = head;
    if (!e)
        e = direct_transfer(f, write, buf + head, middle, at + (off_t)head, progress);
    if (e == EINVAL) { /* no O_DIRECT here after all: the page cache, now and from now on */
        close(f->fd_direct);
        f->fd_direct = -1;
        e = write ? transfer_all(f->fd_buffered, true, buf + head, middle, at + (off_t)head)
                  : buffered_read(f, buf + head, middle, at + (off_t)head, progress);
    }
    progress->landed_base = head + middle;
    if (e)
        return e;
    return write ? transfer_all(f->fd_buffered, true, buf + head + middle, tail, at + (off_t)(head + middle))
                 : buffered_read(f, buf + head + middle, tail, at + (off_t)(head + middle), progress);
}

int rawio_write(struct rawio_file *f, const void *buf, size_t n, off_t at)
{
    struct pipeline none = {0};
    return transfer(f, true, (char *)buf, n, at, &none); /* a write never stores into buf */
}

int rawio_read(struct rawio_file *f, void *buf, size_t n, off_t at)
{
    struct pipeline none = {0};
    return transfer(f, false, buf, n, at, &none);
}

int rawio_read_landed(struct rawio_file *f, void *buf, size_t n, off_t at, void (*landed)(void *ctx, size_t k),
                      void *ctx)
{
    struct pipeline progress = {.landed = landed, .landed_ctx = ctx};
    return transfer(f, false, buf, n, at, &progress);
}

int rawio_fsync(const char *path, bool directory, char *why, size_t why_cap)
{
    int fd = open(path, directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
    if (fd < 0) {
        snprintf(why, why_cap, "cannot open '%s' to sync it: %s", path, strerror(errno));
        return -1;
    }
    if (fsync(fd) != 0) {
        snprintf(why, why_cap, "cannot fsync '%s': %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    close(fd);
    return 0;
}
