/* nvme — optimizer state in a file, streamed through pinned buffers (see nvme.h). */
#define _GNU_SOURCE
#include "nvme.h"

#include "core/util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <linux/magic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#ifndef SHARDLM_NO_URING
#include <liburing.h>
#endif

enum buf_state { BUF_FREE, BUF_READING, BUF_READY, BUF_WRITING };

struct nvme_file {
    char *path;
    int fd;
    bool direct, async;
    size_t n, piece, n_pieces;
    int n_bufs;
    float **bufs;              /* 3 * piece floats each, 4 KiB aligned, mlocked where allowed */
    enum buf_state *state;
    size_t *buf_piece;         /* the piece a buffer holds or moves */
    int in_flight;
    bool stepping;             /* in nvme_adamw_step (the fault hook counts its writes) */
    double read_bytes, written_bytes;
#ifndef SHARDLM_NO_URING
    struct io_uring ring;
#endif
};

static size_t piece_bytes(const struct nvme_file *f) { return 3 * f->piece * sizeof(float); }

size_t nvme_file_bytes(size_t n, size_t piece)
{
    piece = round_up(piece ? piece : NVME_PIECE_DEFAULT, NVME_PIECE_ALIGN);
    return (n + piece - 1) / piece * 3 * piece * sizeof(float);
}

size_t nvme_piece_default(void)
{
    const char *e = getenv("SHARDLM_NVME_PIECE");
    char *end = NULL;
    const unsigned long long v = e && *e ? strtoull(e, &end, 10) : 0;
    if (e && *e && (*end || v == 0))
        fail_input("SHARDLM_NVME_PIECE='%s' is not a number of elements above 0; unset it or give one, e.g. 262144", e);
    return v ? round_up((size_t)v, NVME_PIECE_ALIGN) : NVME_PIECE_DEFAULT;
}

void nvme_sizes(size_t n, int buffers, size_t *file_bytes, size_t *host_bytes, size_t *piece)
{
    const size_t dflt = nvme_piece_default();
    size_t p = n < dflt ? round_up(n ? n : 1, NVME_PIECE_ALIGN) : dflt;
    const size_t b = (size_t)(buffers < NVME_BUFFERS_MIN ? NVME_BUFFERS_MIN : buffers);
    *piece = p;
    *file_bytes = nvme_file_bytes(n, p);
    *host_bytes = b * 3 * p * sizeof(float);
}

/* ---- the directory ------------------------------------------------------------ */

static void make_dirs(const char *dir)
{
    char *p = xstrdup(dir);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = 0;
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            int e = errno;
            free(p);
            fail_input("nvme_path '%s' cannot be made (%s); make it, or set the offload's nvme_path "
                       "to a directory on a local disk", dir, strerror(e));
        }
        *s = '/';
    }
    free(p);
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        fail_input("nvme_path '%s' cannot be made (%s); make it, or set the offload's nvme_path "
                   "to a directory on a local disk", dir, strerror(errno));
}

void nvme_check_dir(const char *dir, double need_bytes, struct nvme_dir_info *info)
{
    struct stat st;
    if (!dir || !*dir)
        fail_input("offload device \"nvme\" needs nvme_path: set it to a directory on a local NVMe disk");
    if (stat(dir, &st) != 0) {
        if (errno != ENOENT)
            fail_input("nvme_path '%s' cannot be read (%s); set it to a directory on a local disk", dir,
                       strerror(errno));
        make_dirs(dir);
        if (stat(dir, &st) != 0)
            fail_input("nvme_path '%s' cannot be read (%s)", dir, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
        fail_input("nvme_path '%s' is not a directory; set it to a directory on a local disk", dir);
    if (access(dir, W_OK | X_OK) != 0)
        fail_input("nvme_path '%s' is not writable (%s); set it to a directory this job may write", dir,
                   strerror(errno));
    struct statvfs vfs;
    if (statvfs(dir, &vfs) != 0)
        fail_input("nvme_path '%s': statvfs failed (%s)", dir, strerror(errno));
    info->free_bytes = (double)vfs.f_bavail * (double)vfs.f_frsize;
    struct statfs fs; /* the warning first: a tmpfs too small to hold the state is memory all the same */
    info->tmpfs = statfs(dir, &fs) == 0 && (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC);
    if (info->tmpfs)
        log_warn("nvme_path '%s' is tmpfs: memory, not disk; the offloaded state takes host memory there", dir);
    if (info->free_bytes < need_bytes)
        fail_input("nvme_path '%s' has %.0f bytes (%.3f GiB) free; the offloaded state needs %.0f bytes (%.3f GiB): "
                   "free space or choose another disk",
                   dir, info->free_bytes, info->free_bytes / 1073741824.0, need_bytes, need_bytes / 1073741824.0);
}

/* ---- I/O ------------------------------------------------------------------- */

/* SHARDLM_INJECT_NVME (nvme.h): what a completed (or, for kill, issued) piece
 * write is turned into. Returns the result the write is to be seen with. */
static long inject_write(long res)
{
    static int looked;
    static long kill_at, short_at, writes;
    if (!looked) {
        const char *spec = getenv("SHARDLM_INJECT_NVME");
        looked = 1;
        if (spec && strncmp(spec, "kill:", 5) == 0)
            kill_at = atol(spec + 5);
        else if (spec && strncmp(spec, "short_write:", 12) == 0)
            short_at = atol(spec + 12);
        else if (spec && *spec)
            fail_input("SHARDLM_INJECT_NVME='%s': give kill:K or short_write:K", spec);
    }
    writes++;
    if (writes == kill_at)
        raise(SIGKILL);
    return writes == short_at && res > 0 ? res / 2 : res;
}

void nvme_io_failed(const char *path, const char *what, long res, size_t want)
{
    if (res < 0)
        fail_input("nvme: %s of '%s' failed: %s%s", what, path, strerror((int)-res),
                   -res == ENOSPC ? " (the disk is full: free space; the last checkpoint is intact)"
                                  : " (the last checkpoint is intact)");
    fail_input("nvme: short %s of '%s' (%ld of %zu bytes; the file was changed or truncated; the last checkpoint "
               "is intact)", what, path, res, want);
}

__attribute__((noreturn)) static void io_failed(const struct nvme_file *f, const char *what, long res, size_t want)
{
    nvme_io_failed(f->path, what, res, want);
}

void nvme_sync_io(int fd, const char *path, void *buf, size_t bytes, size_t off, bool write)
{
    size_t done = 0;
    while (done < bytes) {
        ssize_t r = write ? pwrite(fd, (char *)buf + done, bytes - done, (off_t)(off + done))
                          : pread(fd, (char *)buf + done, bytes - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            nvme_io_failed(path, write ? "write" : "read", r < 0 ? -errno : (long)done, bytes);
        done += (size_t)r;
    }
}

/* Moves `bytes` between buffer b (from byte `at` of it) and the file (from byte `at` of the buffer's piece). */
static void sync_bytes(struct nvme_file *f, int b, size_t at, size_t bytes, bool write)
{
    nvme_sync_io(f->fd, f->path, (char *)f->bufs[b] + at, bytes, f->buf_piece[b] * piece_bytes(f) + at, write);
    if (write && f->stepping && inject_write((long)bytes) != (long)bytes)
        io_failed(f, "write", (long)bytes / 2, bytes); /* the injected short write (SHARDLM_INJECT_NVME) */
    if (write)
        f->written_bytes += (double)bytes;
    else
        f->read_bytes += (double)bytes;
}

static void sync_io(struct nvme_file *f, int b, bool write)
{
    sync_bytes(f, b, 0, piece_bytes(f), write);
    f->state[b] = write ? BUF_FREE : BUF_READY;
}

/* Starts reading or writing buffer b (its piece); synchronous without a ring. */
static void start_io(struct nvme_file *f, int b, bool write)
{
    f->state[b] = write ? BUF_WRITING : BUF_READING;
#ifndef SHARDLM_NO_URING
    if (f->async) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&f->ring);
        if (!sqe) { /* the ring has an entry per buffer; none free is a broken invariant */
            fail_internal("nvme: no free submission entry");
        }
        const size_t bytes = piece_bytes(f);
        if (write)
            io_uring_prep_write(sqe, f->fd, f->bufs[b], (unsigned)bytes, (uint64_t)(f->buf_piece[b] * bytes));
        else
            io_uring_prep_read(sqe, f->fd, f->bufs[b], (unsigned)bytes, (uint64_t)(f->buf_piece[b] * bytes));
        io_uring_sqe_set_data64(sqe, (uint64_t)b);
        int r = io_uring_submit(&f->ring);
        if (r < 0)
            io_failed(f, "submit", r, bytes);
        f->in_flight++;
        return;
    }
#endif
    sync_io(f, b, write);
}

#ifndef SHARDLM_NO_URING
int nvme_ring_reap(struct io_uring *ring, const char *path, int *res)
{
    struct io_uring_cqe *cqe;
    int r;
    do
        r = io_uring_wait_cqe(ring, &cqe);
    while (r == -EINTR);
    if (r < 0)
        nvme_io_failed(path, "wait", r, 0);
    const int b = (int)io_uring_cqe_get_data64(cqe);
    *res = cqe->res;
    io_uring_cqe_seen(ring, cqe);
    return b;
}
#endif

/* Waits for one completion (a ring is in use and something is in flight). */
static void reap_one(struct nvme_file *f)
{
#ifndef SHARDLM_NO_URING
    int res;
    const int b = nvme_ring_reap(&f->ring, f->path, &res);
    f->in_flight--;
    const size_t bytes = piece_bytes(f);
    const bool write = f->state[b] == BUF_WRITING;
    if (write && f->stepping)
        res = (int)inject_write(res);
    if (res < 0 || (size_t)res != bytes)
        io_failed(f, write ? "write" : "read", res, bytes);
    if (write)
        f->written_bytes += (double)bytes;
    else
        f->read_bytes += (double)bytes;
    f->state[b] = write ? BUF_FREE : BUF_READY;
#else
    (void)f;
    fail_internal("nvme: nothing in flight without a ring");
#endif
}

static void wait_state(struct nvme_file *f, int b, enum buf_state want)
{
    while (f->state[b] != want)
        reap_one(f);
}

static void drain(struct nvme_file *f)
{
    while (f->in_flight > 0)
        reap_one(f);
}

/* ---- open and close ------------------------------------------------------------ */

static int open_file(const char *path, bool direct)
{
    return open(path, O_RDWR | O_CREAT | O_CLOEXEC | (direct ? O_DIRECT : 0), 0600);
}

void **nvme_pinned_buffers(int n, size_t bytes)
{
    void **bufs = xcalloc((size_t)n, sizeof *bufs);
    for (int b = 0; b < n; b++) {
        bufs[b] = xalloc_aligned(bytes);
        memset(bufs[b], 0, bytes);
        (void)mlock(bufs[b], bytes); /* pinned where the limit allows; correct either way */
    }
    return bufs;
}

void nvme_release(struct io_uring *ring, bool async, void **bufs, int n, size_t bytes, int fd, char *path)
{
#ifndef SHARDLM_NO_URING
    if (async)
        io_uring_queue_exit(ring);
#else
    (void)ring;
    (void)async;
#endif
    for (int b = 0; b < n; b++) {
        munlock(bufs[b], bytes);
        free(bufs[b]);
    }
    free(bufs);
    unlink(path);
    util_keep_file(path); /* the file is gone: nothing to remove should this process fail later */
    close(fd);
    free(path);
}

/* Files of other jobs (optimizer state or parameters) that a kill (-9, a lost
 * node) left behind: not locked, not written for NVME_STALE_SECONDS. A live job holds its lock; a file just
 * made (between its open and its lock) is new. The state is in checkpoints. */
static void sweep_stale(const char *dir, const char *job)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    char own[192];
    snprintf(own, sizeof own, "shardlm-%s-rank", job);
    const time_t now = time(NULL);
    for (struct dirent *e; (e = readdir(d));) {
        const char *n = e->d_name;
        const size_t len = strlen(n);
        if (strncmp(n, "shardlm-", 8) != 0 || len < 15 || (strcmp(n + len - 6, ".optim") != 0 && strcmp(n + len - 6, ".param") != 0) ||
            strncmp(n, own, strlen(own)) == 0)
            continue;
        int fd = openat(dirfd(d), n, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && now - st.st_mtime > NVME_STALE_SECONDS &&
            flock(fd, LOCK_EX | LOCK_NB) == 0 && unlinkat(dirfd(d), n, 0) == 0)
            log_warn("nvme: removed '%s/%s' (%.2f GiB), a file that a job killed without cleaning up left behind "
                     "(not locked, not written for %ld s)",
                     dir, n, (double)st.st_size / 1073741824.0, (long)(now - st.st_mtime));
        if (fd >= 0)
            close(fd);
    }
    closedir(d);
}

int nvme_open_locked(const char *dir, const char *job, int rank, const char *ext, size_t bytes, char **path_out,
                     bool *direct)
{
    struct nvme_dir_info info;
    sweep_stale(dir, job); /* before the room is checked: what it frees counts */
    nvme_check_dir(dir, (double)bytes, &info);
    size_t len = strlen(dir) + strlen(job) + strlen(ext) + 64;
    char *path = *path_out = xmalloc(len);
    snprintf(path, len, "%s/shardlm-%s-rank%d.%s", dir, job, rank, ext);

    signal(SIGXFSZ, SIG_IGN); /* a file-size limit: EFBIG and one line, not a kill */
    *direct = true;
    int fd = open_file(path, true);
    if (fd < 0 && errno == EINVAL) {
        *direct = false;
        fd = open_file(path, false);
        log_warn("nvme_path '%s' does not support O_DIRECT; buffered I/O (the page cache holds copies of the state)",
                 dir);
    }
    if (fd < 0)
        fail_input("nvme: cannot open '%s' (%s)", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0)
        fail_input("nvme: '%s' is in use by another job (locked); give each job its own name or nvme_path", path);
    /* ours from here: removed when the process fails (a full disk now, an I/O error mid-step) */
    util_remove_on_failure(path);
    int r = ftruncate(fd, 0) != 0 ? errno : posix_fallocate(fd, 0, (off_t)bytes);
    if (r == EOPNOTSUPP || r == EINVAL) /* a file system without fallocate: a sparse file */
        r = ftruncate(fd, (off_t)bytes) != 0 ? errno : 0;
    if (r != 0) {
        unlink(path); /* also where the failure is trapped and agreed by the ranks (no util_exit) */
        fail_input("nvme: cannot allocate %zu bytes for '%s' (%s)%s", bytes, path, strerror(r),
                   r == ENOSPC ? ": the disk is full; free space or choose another nvme_path" : "");
    }
    return fd;
}

static void setup_ring(struct nvme_file *f)
{
#ifndef SHARDLM_NO_URING
    int r = io_uring_queue_init((unsigned)f->n_bufs, &f->ring, 0);
    f->async = r == 0;
    if (!f->async)
        log_warn("nvme: io_uring is not available here (%s); '%s' uses synchronous reads and writes", strerror(-r),
                 f->path);
#else
    f->async = false;
    log_warn("nvme: shardlm was built without liburing (a KIT= build whose kit lacks it); '%s' uses synchronous "
             "reads and writes", f->path);
#endif
}

struct nvme_file *nvme_open(const char *dir, const char *job, int rank, size_t n, size_t piece, int buffers)
{
    struct nvme_file *f = xcalloc(1, sizeof *f);
    f->piece = round_up(piece ? piece : NVME_PIECE_DEFAULT, NVME_PIECE_ALIGN);
    f->n = n;
    f->n_pieces = (n + f->piece - 1) / f->piece;
    f->n_bufs = buffers < NVME_BUFFERS_MIN ? NVME_BUFFERS_MIN : buffers;
    const size_t file_bytes = nvme_file_bytes(n, f->piece);
    f->fd = nvme_open_locked(dir, job, rank, "optim", file_bytes, &f->path, &f->direct);

    f->bufs = (float **)nvme_pinned_buffers(f->n_bufs, piece_bytes(f));
    f->state = xcalloc((size_t)f->n_bufs, sizeof *f->state);
    f->buf_piece = xcalloc((size_t)f->n_bufs, sizeof *f->buf_piece);
    setup_ring(f);
    /* zero state: fallocate gives zeros, the ftruncate fallback too */
    return f;
}

void nvme_close(struct nvme_file *f)
{
    if (!f)
        return;
    drain(f);
#ifndef SHARDLM_NO_URING
    struct io_uring *ring = &f->ring;
#else
    struct io_uring *ring = NULL;
#endif
    nvme_release(ring, f->async, (void **)f->bufs, f->n_bufs, piece_bytes(f), f->fd, f->path);
    free(f->state);
    free(f->buf_piece);
    free(f);
}

const char *nvme_path(const struct nvme_file *f) { return f->path; }
bool nvme_direct(const struct nvme_file *f) { return f->direct; }
bool nvme_async(const struct nvme_file *f) { return f->async; }
size_t nvme_host_bytes(const struct nvme_file *f) { return (size_t)f->n_bufs * piece_bytes(f); }

void nvme_traffic(const struct nvme_file *f, double *read_bytes, double *written_bytes)
{
    *read_bytes = f->read_bytes;
    *written_bytes = f->written_bytes;
}

/* ---- ranges (checkpoints, init) ------------------------------------------------- */

static void check_range(const struct nvme_file *f, size_t at, size_t count)
{
    if (at > f->n || count > f->n - at)
        fail_internal("nvme: range [%zu, %zu) outside the %zu elements of '%s'", at, at + count, f->n, f->path);
}

/* Moves elements [at, at+count) between the caller's arrays and the file, a
 * piece at a time through buffer 0: of each part asked for (master, m, v),
 * the 4 KiB blocks that hold the range (O_DIRECT's unit; a piece's parts
 * start on such blocks), read, or written (the end blocks read first where
 * the range covers them partly). */
static void move_range(struct nvme_file *f, size_t at, size_t count, float *const arr[3], bool to_file,
                       enum dtype out_dtype)
{
    const size_t out_size = (size_t)dtype_size(out_dtype);
    check_range(f, at, count);
    drain(f);
    for (size_t i = at / f->piece; count > 0 && i * f->piece < at + count; i++) {
        const size_t lo = at > i * f->piece ? at : i * f->piece;
        const size_t hi = at + count < (i + 1) * f->piece ? at + count : (i + 1) * f->piece;
        f->buf_piece[0] = i;
        for (int g = 0; g < 3; g++) {
            if (!arr[g])
                continue;
            const size_t part = (size_t)g * f->piece * sizeof(float);
            const size_t x0 = (lo - i * f->piece) * sizeof(float), x1 = (hi - i * f->piece) * sizeof(float);
            const size_t b0 = x0 / NVME_BLOCK * NVME_BLOCK, b1 = round_up(x1, NVME_BLOCK);
            if (!to_file) {
                sync_bytes(f, 0, part + b0, b1 - b0, false);
            } else { /* a write keeps what its end blocks hold outside the range: those are read first */
                if (x0 != b0)
                    sync_bytes(f, 0, part + b0, NVME_BLOCK, false);
                if (x1 != b1 && (b1 - NVME_BLOCK != b0 || x0 == b0))
                    sync_bytes(f, 0, part + b1 - NVME_BLOCK, NVME_BLOCK, false);
            }
            float *in_buf = f->bufs[0] + (size_t)g * f->piece + (lo - i * f->piece);
            if (to_file) {
                memcpy(in_buf, arr[g] + (lo - at), (hi - lo) * sizeof(float));
                sync_bytes(f, 0, part + b0, b1 - b0, true);
            } else { /* reads: in out_dtype (fp32: as stored) */
                dtype_convert((char *)arr[g] + (lo - at) * out_size, out_dtype, in_buf, DTYPE_F32, hi - lo);
            }
        }
        f->state[0] = BUF_FREE;
    }
}

void nvme_write_range(struct nvme_file *f, size_t at, size_t count, const float *p, const float *m, const float *v)
{
    float *const arr[3] = {(float *)p, (float *)m, (float *)v};
    move_range(f, at, count, arr, true, DTYPE_F32);
}

void nvme_read_range(struct nvme_file *f, size_t at, size_t count, float *p, float *m, float *v)
{
    float *const arr[3] = {p, m, v};
    move_range(f, at, count, arr, false, DTYPE_F32);
}

void nvme_read_master_as(struct nvme_file *f, size_t at, size_t count, void *out, enum dtype dtype)
{
    float *const arr[3] = {out, NULL, NULL};
    move_range(f, at, count, arr, false, dtype);
}

/* ---- the step ------------------------------------------------------------------ */

/* Updates the part of the segments that piece i holds (in buffer b); *seg is the first segment not yet done. */
static void update_piece(struct nvme_file *f, int b, size_t i, const struct nvme_segment *segs, int n_segs, int *seg,
                         struct adamw_hparams *hp, enum dtype out_dtype)
{
    const size_t p_lo = i * f->piece, p_hi = p_lo + f->piece;
    float *p = f->bufs[b], *m = p + f->piece, *v = m + f->piece;
    const size_t out_size = (size_t)dtype_size(out_dtype);
    for (int s = *seg; s < n_segs && segs[s].at < p_hi; s++) {
        const struct nvme_segment *sg = &segs[s];
        const size_t lo = sg->at > p_lo ? sg->at : p_lo;
        const size_t end = sg->at + sg->n, hi = end < p_hi ? end : p_hi;
        if (hi > lo) {
            hp->weight_decay = sg->weight_decay;
            void *out = sg->param_out ? (char *)sg->param_out + (lo - sg->at) * out_size : NULL;
            adamw_update(p + (lo - p_lo), m + (lo - p_lo), v + (lo - p_lo), sg->grad + (lo - sg->at), hi - lo, hp,
                         out, out_dtype);
        }
        if (end <= p_hi)
            *seg = s + 1; /* done; a segment that runs on into the next piece stays */
    }
}

/* The piece a segment's first element lies in, or n_pieces. */
static size_t piece_of(const struct nvme_file *f, size_t at) { return at / f->piece; }

void nvme_adamw_step(struct nvme_file *f, const struct nvme_segment *segs, int n_segs, const struct adamw_hparams *hp,
                     enum dtype out_dtype)
{
    for (int s = 0; s < n_segs; s++) {
        check_range(f, segs[s].at, segs[s].n);
        if (s > 0 && segs[s].at < segs[s - 1].at + segs[s - 1].n)
            fail_internal("nvme: segments overlap or are out of order at %d", s);
    }
    if (n_segs == 0)
        return;
    drain(f);
    f->stepping = true;
    struct adamw_hparams h = *hp;
    /* only the pieces some segment touches */
    const size_t first = piece_of(f, segs[0].at);
    const size_t last = piece_of(f, segs[n_segs - 1].at + segs[n_segs - 1].n - 1) + 1;
    const int nb = f->n_bufs;
    size_t next_read = first;
    int seg = 0;
    for (size_t i = first; i < last; i++) {
        /* read ahead into the free buffers, up to nb - 1 pieces beyond i */
        while (next_read < last && next_read < i + (size_t)nb) {
            const int b = (int)(next_read % (size_t)nb);
            if (next_read > i && f->state[b] != BUF_FREE)
                break;
            wait_state(f, b, BUF_FREE); /* the piece i's own buffer: its write-behind must end first */
            f->buf_piece[b] = next_read++;
            start_io(f, b, false);
        }
        const int b = (int)(i % (size_t)nb);
        wait_state(f, b, BUF_READY);
        while (seg < n_segs && segs[seg].at + segs[seg].n <= i * f->piece)
            seg++; /* segments wholly before this piece (none, as pieces follow the segments) */
        update_piece(f, b, i, segs, n_segs, &seg, &h, out_dtype);
        start_io(f, b, true);
    }
    drain(f);
    f->stepping = false;
}
