/* nvme_param — the parameter file of offload_param "nvme" and its buffers (see nvme.h). */
#define _GNU_SOURCE
#include "nvme.h"

#include "core/util.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef SHARDLM_NO_URING
#include <liburing.h>
#endif

struct nvme_params {
    char *path;
    int fd;
    bool direct, async;
    size_t buf_bytes;
    int n_bufs;
    void **bufs;     /* buf_bytes each, NVME_BLOCK aligned, mlocked where allowed */
    bool *busy;      /* a read or write of the buffer is in flight */
    bool *writing;
    size_t *bytes;   /* what the buffer's request moves */
    int in_flight;
    double read_bytes, written_bytes;
#ifndef SHARDLM_NO_URING
    struct io_uring ring;
#endif
};

static void count_done(struct nvme_params *f, int b)
{
    if (f->writing[b])
        f->written_bytes += (double)f->bytes[b];
    else
        f->read_bytes += (double)f->bytes[b];
    f->busy[b] = false;
}

/* Waits for one completion (a ring is in use and something is in flight). */
static void reap_one(struct nvme_params *f)
{
#ifndef SHARDLM_NO_URING
    int res;
    const int b = nvme_ring_reap(&f->ring, f->path, &res);
    f->in_flight--;
    if (res < 0 || (size_t)res != f->bytes[b])
        nvme_io_failed(f->path, f->writing[b] ? "write" : "read", res, f->bytes[b]);
    count_done(f, b);
#else
    (void)f;
    fail_internal("nvme: nothing in flight without a ring");
#endif
}

void nvme_params_start(struct nvme_params *f, int b, size_t off, size_t bytes, bool write)
{
    if (b < 0 || b >= f->n_bufs || f->busy[b] || bytes > f->buf_bytes || off % NVME_BLOCK || bytes % NVME_BLOCK)
        fail_internal("nvme: bad parameter-file request (buffer %d, %zu bytes at %zu)", b, bytes, off);
    f->busy[b] = true;
    f->writing[b] = write;
    f->bytes[b] = bytes;
#ifndef SHARDLM_NO_URING
    if (f->async) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&f->ring);
        if (!sqe) /* the ring has an entry per buffer */
            fail_internal("nvme: no free submission entry");
        if (write)
            io_uring_prep_write(sqe, f->fd, f->bufs[b], (unsigned)bytes, (uint64_t)off);
        else
            io_uring_prep_read(sqe, f->fd, f->bufs[b], (unsigned)bytes, (uint64_t)off);
        io_uring_sqe_set_data64(sqe, (uint64_t)b);
        int r = io_uring_submit(&f->ring);
        if (r < 0)
            nvme_io_failed(f->path, "submit", r, bytes);
        f->in_flight++;
        return;
    }
#endif
    nvme_sync_io(f->fd, f->path, f->bufs[b], bytes, off, write);
    count_done(f, b);
}

void nvme_params_wait(struct nvme_params *f, int b)
{
    while (f->busy[b])
        reap_one(f);
}

struct nvme_params *nvme_params_open(const char *dir, const char *job, int rank, size_t file_bytes, size_t buf_bytes,
                                     int buffers)
{
    struct nvme_params *f = xcalloc(1, sizeof *f);
    f->fd = nvme_open_locked(dir, job, rank, "param", file_bytes, &f->path, &f->direct);
    f->buf_bytes = round_up(buf_bytes ? buf_bytes : NVME_BLOCK, NVME_BLOCK);
    f->n_bufs = buffers < 1 ? 1 : buffers;
    f->bufs = nvme_pinned_buffers(f->n_bufs, f->buf_bytes);
    f->busy = xcalloc((size_t)f->n_bufs, sizeof *f->busy);
    f->writing = xcalloc((size_t)f->n_bufs, sizeof *f->writing);
    f->bytes = xcalloc((size_t)f->n_bufs, sizeof *f->bytes);
#ifndef SHARDLM_NO_URING
    int r = io_uring_queue_init((unsigned)f->n_bufs, &f->ring, 0);
    f->async = r == 0;
    if (!f->async)
        log_warn("nvme: io_uring is not available here (%s); '%s' uses synchronous reads", strerror(-r), f->path);
#else
    log_warn("nvme: built without liburing; '%s' uses synchronous reads", f->path);
#endif
    return f;
}

void nvme_params_close(struct nvme_params *f)
{
    if (!f)
        return;
    for (int b = 0; b < f->n_bufs; b++)
        nvme_params_wait(f, b);
#ifndef SHARDLM_NO_URING
    struct io_uring *ring = &f->ring;
#else
    struct io_uring *ring = NULL;
#endif
    nvme_release(ring, f->async, f->bufs, f->n_bufs, f->buf_bytes, f->fd, f->path);
    free(f->busy);
    free(f->writing);
    free(f->bytes);
    free(f);
}

int nvme_params_buffers(const struct nvme_params *f) { return f->n_bufs; }
void *nvme_params_buffer(const struct nvme_params *f, int b) { return f->bufs[b]; }
const char *nvme_params_path(const struct nvme_params *f) { return f->path; }
bool nvme_params_direct(const struct nvme_params *f) { return f->direct; }
size_t nvme_params_host_bytes(const struct nvme_params *f) { return (size_t)f->n_bufs * f->buf_bytes; }

void nvme_params_traffic(const struct nvme_params *f, double *read_bytes, double *written_bytes)
{
    *read_bytes = f->read_bytes;
    *written_bytes = f->written_bytes;
}
