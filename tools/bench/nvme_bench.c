/*
 * nvme_bench — the streamed AdamW step of src/zero/nvme.c against a plain
 * sequential read and write of the same bytes on the same disk, in one run.
 *
 *   nvme_bench --dir DIR [--n N] [--piece P] [--buffers B] [--rounds R]
 *
 * Per round, in this order: (1) plain: the step's own file read front to back
 * with O_DIRECT in pieces of 12 * P bytes, then written front to back the
 * same way (pread/pwrite, one request at a time: what a disk gives to a
 * simple sequential reader and writer); (2) the nvme step: nvme_adamw_step
 * over all N elements (read-ahead, AdamW, write-behind through B buffers);
 * (3) AdamW alone on the same N in memory (the compute the step hides).
 * The page cache is dropped before each (/proc/sys/vm/drop_caches, when this
 * process may write it; O_DIRECT bypasses it anyway where the disk allows).
 * Prints the medians and the ratio plain / step (1.0: the step runs as fast
 * as the disk moves its bytes; the target is >= 0.8).
 */
#define _GNU_SOURCE
#include "core/adamw.h"
#include "zero/nvme.h"
#include "core/util.h"

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *x, int n)
{
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static bool drop_caches(void)
{
    sync();
    int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
    if (fd < 0)
        return false;
    bool ok = write(fd, "3\n", 2) == 2;
    close(fd);
    return ok;
}

/* Reads then writes `bytes` of path (the step's own file: the same blocks of
 * the same disk) front to back in blocks of `block`; seconds. What it writes
 * is the last block read, one whole piece (p, m, v of the same elements), so
 * the state stays finite for the next step. */
static double plain_pass(const char *path, size_t bytes, size_t block, void *buf, bool *direct)
{
    int fd = open(path, O_RDWR | O_DIRECT);
    *direct = fd >= 0;
    if (fd < 0)
        fd = open(path, O_RDWR);
    if (fd < 0)
        fail_input("nvme_bench: cannot open '%s'", path);
    double t0 = now_seconds();
    for (size_t at = 0; at < bytes; at += block)
        if (pread(fd, buf, block, (off_t)at) != (ssize_t)block)
            fail_input("nvme_bench: read of '%s' failed", path);
    for (size_t at = 0; at < bytes; at += block)
        if (pwrite(fd, buf, block, (off_t)at) != (ssize_t)block)
            fail_input("nvme_bench: write of '%s' failed", path);
    if (!*direct)
        fdatasync(fd);
    double t = now_seconds() - t0;
    close(fd);
    return t;
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    size_t n = (size_t)16 << 20, piece = NVME_PIECE_DEFAULT;
    int buffers = 4, rounds = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--dir"))
            dir = argv[i + 1];
        else if (!strcmp(argv[i], "--n"))
            n = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--piece"))
            piece = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--buffers"))
            buffers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
        else
            fail_input("nvme_bench: unknown argument '%s'", argv[i]);
    }
    if (!dir || rounds < 1 || n == 0)
        fail_input("nvme_bench: usage: nvme_bench --dir DIR [--n N] [--piece P] [--buffers B] [--rounds R]");
    piece = round_up(piece, NVME_PIECE_ALIGN);
    n = round_up(n, piece);
    struct nvme_file *f = nvme_open(dir, "bench", 0, n, piece, buffers);
    const size_t bytes = nvme_file_bytes(n, piece), block = 3 * piece * sizeof(float);
    float *g = xalloc_aligned(n * sizeof(float)), *p = xalloc_aligned(n * sizeof(float));
    float *m = xalloc_aligned(n * sizeof(float)), *v = xalloc_aligned(n * sizeof(float));
    uint64_t seed = 1;
    for (size_t i = 0; i < n; i++)
        g[i] = rng_uniform(&seed) - 0.5f;
    void *buf = xalloc_aligned(block);
    struct adamw_hparams hp = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .adam_w_mode = true,
                               .weight_decay = 0.01f, .grad_scale = 1.0f};
    struct nvme_segment seg = {0, n, g, 0.01f, NULL};
    double *tp = xcalloc((size_t)rounds, sizeof *tp), *ts = xcalloc((size_t)rounds, sizeof *ts);
    double *tm = xcalloc((size_t)rounds, sizeof *tm);
    bool dropped = true, plain_direct = false;
    /* once, untimed: the file's blocks written (fallocate leaves them unwritten, and reading those costs no I/O) */
    plain_pass(nvme_path(f), bytes, block, buf, &plain_direct);
    for (int r = 0; r < rounds; r++) {
        hp.bias_correction1 = 1.0f - powf(0.9f, (float)(r + 1));
        hp.bias_correction2 = 1.0f - powf(0.999f, (float)(r + 1));
        dropped &= drop_caches();
        tp[r] = plain_pass(nvme_path(f), bytes, block, buf, &plain_direct);
        dropped &= drop_caches();
        double t0 = now_seconds();
        nvme_adamw_step(f, &seg, 1, &hp, DTYPE_F32);
        ts[r] = now_seconds() - t0;
        t0 = now_seconds();
        adamw_update(p, m, v, g, n, &hp, NULL, DTYPE_F32);
        tm[r] = now_seconds() - t0;
    }
    const double mp = median(tp, rounds), ms = median(ts, rounds), mm = median(tm, rounds);
    const double moved = 2.0 * (double)bytes;
    printf("state: %zu elements, %.1f MiB on disk; pieces of %zu elements (%.1f MiB), %d buffers (%.1f MiB host)\n",
           n, (double)bytes / 1048576.0, piece, (double)block / 1048576.0, buffers,
           (double)nvme_host_bytes(f) / 1048576.0);
    printf("io: %s, %s; plain: %s; page cache %s\n", nvme_async(f) ? "io_uring" : "synchronous (no io_uring)",
           nvme_direct(f) ? "O_DIRECT" : "buffered", plain_direct ? "O_DIRECT" : "buffered + fdatasync",
           dropped ? "dropped before each pass" : "not dropped (no permission; O_DIRECT bypasses it)");
    printf("median of %d rounds:\n", rounds);
    printf("  plain read + write   %8.1f ms  %6.2f GB/s\n", mp * 1e3, moved / mp / 1e9);
    printf("  nvme AdamW step      %8.1f ms  %6.2f GB/s\n", ms * 1e3, moved / ms / 1e9);
    printf("  AdamW in memory      %8.1f ms\n", mm * 1e3);
    printf("ratio plain / step: %.2f (target >= 0.8)\n", mp / ms);
    nvme_close(f);
    return 0;
}
