/*
 * test_nvme — the optimizer state in a file (src/zero/nvme.c): the streamed AdamW
 * step against adamw_update on the same state in memory, bit for bit (master,
 * m, v and the new parameters in fp32, bf16 and fp16), over several steps,
 * segments that straddle pieces and a gap no segment covers; the traffic per
 * step; ranges written and read back; and the checks of nvme_path: made when
 * missing, not a directory, no room, locked by another job, tmpfs warning, a
 * full disk (RLIMIT_FSIZE) and a truncated file mid-step (one line naming the
 * file, exit 2).
 */
#define _GNU_SOURCE
#include "core/adamw.h"
#include "check.h"
#include "core/dtype.h"
#include "zero/nvme.h"
#include "core/util.h"

#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

enum { N = 7000, PIECE = 1024, N_SEGS = 3, STEPS = 3 };
static const struct { size_t at, n; float wd; } seg_spec[N_SEGS] = {{0, 1500, 0.1f}, {1500, 1600, 0.0f}, {3200, 3800, 0.1f}};

static char base[512];

static void fill(float *x, size_t n, uint64_t seed, float scale, bool positive)
{
    for (size_t i = 0; i < n; i++) {
        float r = rng_uniform(&seed) * 2.0f - 1.0f;
        x[i] = (positive ? r * r : r) * scale;
    }
}

static bool same_bits(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

static void check_step_equal(enum dtype out, const char *name)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/eq-%s", base, name);
    struct nvme_file *f = nvme_open(dir, name, 0, N, PIECE, 3);
    float *p = xcalloc(N, 4), *m = xcalloc(N, 4), *v = xcalloc(N, 4), *g = xcalloc(N, 4);
    float *rp = xcalloc(N, 4), *rm = xcalloc(N, 4), *rv = xcalloc(N, 4);
    const size_t os = (size_t)dtype_size(out);
    char *out_ref = xcalloc(N, os), *out_nv = xcalloc(N, os);
    fill(p, N, 1, 1.0f, false);
    fill(m, N, 2, 0.01f, false);
    fill(v, N, 3, 1e-4f, true);
    nvme_write_range(f, 0, N, p, m, v);
    struct adamw_hparams hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .adam_w_mode = true};
    struct nvme_segment segs[N_SEGS];
    bool ok = true;
    for (int step = 1; step <= STEPS; step++) {
        fill(g, N, 100 + (uint64_t)step, 0.5f, false);
        hp.bias_correction1 = 1.0f - powf(0.9f, (float)step);
        hp.bias_correction2 = 1.0f - powf(0.999f, (float)step);
        hp.grad_scale = step == 2 ? 0.25f : 1.0f;
        for (int s = 0; s < N_SEGS; s++) {
            hp.weight_decay = seg_spec[s].wd;
            const size_t at = seg_spec[s].at;
            adamw_update(p + at, m + at, v + at, g + at, seg_spec[s].n, &hp, out_ref + at * os, out);
            segs[s] = (struct nvme_segment){at, seg_spec[s].n, g + at, seg_spec[s].wd, out_nv + at * os};
        }
        nvme_adamw_step(f, segs, N_SEGS, &hp, out);
        nvme_read_range(f, 0, N, rp, rm, rv);
        ok = ok && same_bits(p, rp, N * 4) && same_bits(m, rm, N * 4) && same_bits(v, rv, N * 4) &&
             same_bits(out_ref, out_nv, N * os);
    }
    char label[128];
    snprintf(label, sizeof label, "nvme_step_bitwise_%s", name);
    CHECK(label, ok, "state or param_out differ from adamw_update in memory");
    /* 7000 elements in pieces of 1024: 7 pieces, every one touched; per step one read and one write of each,
     * plus the range reads (7 pieces each) and the first write_range (7 writes; of its reads only the block
     * its end covers partly, in each of the 3 parts: the last piece holds 856 elements, 3424 bytes) */
    double rd, wr;
    nvme_traffic(f, &rd, &wr);
    const double pb = 3.0 * PIECE * 4, pieces = 7, edge = 3 * 4096;
    snprintf(label, sizeof label, "nvme_traffic_%s", name);
    CHECK(label, rd == pb * pieces * 2 * STEPS + edge && wr == pb * pieces * (1 + STEPS),
          "read %.0f written %.0f bytes, want %.0f and %.0f", rd, wr, pb * pieces * 2 * STEPS + edge,
          pb * pieces * (1 + STEPS));
    struct stat st;
    snprintf(label, sizeof label, "nvme_file_size_%s", name);
    CHECK(label, stat(nvme_path(f), &st) == 0 && (size_t)st.st_size == nvme_file_bytes(N, PIECE) &&
                     nvme_file_bytes(N, PIECE) == 7 * 3 * PIECE * 4,
          "file %s is %lld bytes, want %zu", nvme_path(f), (long long)st.st_size, nvme_file_bytes(N, PIECE));
    char path[700];
    snprintf(path, sizeof path, "%s", nvme_path(f));
    nvme_close(f);
    snprintf(label, sizeof label, "nvme_close_removes_%s", name);
    CHECK(label, stat(path, &st) != 0, "%s still there after nvme_close", path);
    free(p), free(m), free(v), free(g), free(rp), free(rm), free(rv), free(out_ref), free(out_nv);
}

static void check_partial_ranges(void)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/ranges", base);
    struct nvme_file *f = nvme_open(dir, "ranges", 1, 3000, PIECE, 4);
    float a[3000], b[3000], z[3000];
    fill(a, 3000, 7, 1.0f, false);
    memset(z, 0, sizeof z);
    nvme_write_range(f, 1000, 1500, a, NULL, a); /* m left zero */
    nvme_read_range(f, 0, 3000, b, NULL, NULL);
    bool ok = same_bits(b, z, 1000 * 4) && same_bits(b + 1000, a, 1500 * 4) && same_bits(b + 2500, z, 500 * 4);
    nvme_read_range(f, 1000, 1500, NULL, b, NULL);
    ok = ok && same_bits(b, z, 1500 * 4);
    nvme_read_range(f, 900, 1700, NULL, NULL, b);
    ok = ok && same_bits(b, z, 100 * 4) && same_bits(b + 100, a, 1500 * 4) && same_bits(b + 1600, z, 100 * 4);
    CHECK("nvme_ranges_roundtrip", ok, "a range written across pieces did not read back as written");
    /* small writes inside one 4 KiB block, and ending on a block's end: their neighbours keep their values */
    float c[40];
    fill(c, 40, 8, 1.0f, false);
    nvme_write_range(f, 1030, 20, c, NULL, NULL);
    nvme_write_range(f, 2038, 10, c + 20, NULL, NULL); /* elements 2038..2047 end block 1 of piece 1 */
    nvme_read_range(f, 1000, 1500, b, NULL, NULL);
    ok = same_bits(b, a, 30 * 4) && same_bits(b + 30, c, 20 * 4) && same_bits(b + 50, a + 50, 988 * 4) &&
         same_bits(b + 1038, c + 20, 10 * 4) && same_bits(b + 1048, a + 1048, 452 * 4);
    CHECK("nvme_ranges_small_writes", ok, "a write inside a block changed its neighbours");
    CHECK("nvme_host_bytes", nvme_host_bytes(f) == 4 * 3 * PIECE * 4, "buffers take %zu bytes, want %d",
          nvme_host_bytes(f), 4 * 3 * PIECE * 4);
    CHECK("nvme_name_per_job_rank", strstr(nvme_path(f), "/shardlm-ranges-rank1.optim") != NULL, "file is %s",
          nvme_path(f));
    CHECK("nvme_async_direct_on_disk", nvme_async(f) && nvme_direct(f),
          "io_uring %d, O_DIRECT %d on the test directory (ext4/xfs disks support both)", nvme_async(f),
          nvme_direct(f));
    nvme_close(f);
}

/* ---- bad input (each in a child) ---- */

struct open_args {
    const char *dir;
    const char *job;
    size_t n;
    double need;
};

static void open_child(const void *arg)
{
    const struct open_args *a = arg;
    struct nvme_file *f = nvme_open(a->dir, a->job, 0, a->n, PIECE, 3);
    nvme_close(f);
}

static void check_dir_child(const void *arg)
{
    const struct open_args *a = arg;
    struct nvme_dir_info info;
    nvme_check_dir(a->dir, a->need, &info);
}

static void full_disk_child(const void *arg)
{
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {64 * 1024, 64 * 1024};
    setrlimit(RLIMIT_FSIZE, &rl);
    open_child(arg);
}

static void truncated_child(const void *arg)
{
    const struct open_args *a = arg;
    struct nvme_file *f = nvme_open(a->dir, a->job, 0, 4000, PIECE, 3);
    if (truncate(nvme_path(f), 2 * 3 * PIECE * 4) != 0) /* another hand cuts the file to 2 of its 4 pieces */
        _exit(9);
    float g[4000] = {0};
    struct nvme_segment s = {0, 4000, g, 0.0f, NULL};
    struct adamw_hparams hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .adam_w_mode = true,
                               .bias_correction1 = 0.1f, .bias_correction2 = 0.001f, .grad_scale = 1.0f};
    nvme_adamw_step(f, &s, 1, &hp, DTYPE_F32);
}

static void expect_error(const char *name, void (*fn)(const void *), const struct open_args *a, const char *want1,
                         const char *want2)
{
    char msg[4096];
    int st = check_run_child(fn, a, msg, sizeof msg);
    const char *nl = strchr(msg, '\n');
    bool one_line = nl && nl[1] == 0;
    CHECK(name, st == 2 && one_line && strstr(msg, want1) && strstr(msg, want2),
          "exit %d, stderr '%s' (want exit 2, one line with '%s' and '%s')", st, msg, want1, want2);
}

static void check_bad_input(void)
{
    char file[600], deep[600], dir[600], path[700];
    snprintf(file, sizeof file, "%s/plain-file", base);
    FILE *fp = fopen(file, "w");
    if (fp)
        fclose(fp);
    struct open_args a = {file, "j", 100, 0};
    expect_error("nvme_path_not_dir", check_dir_child, &a, file, "is not a directory");

    snprintf(deep, sizeof deep, "%s/a/b/c", base);
    a = (struct open_args){deep, "j", 100, 1000};
    char msg[4096];
    int st = check_run_child(check_dir_child, &a, msg, sizeof msg);
    struct stat sb;
    CHECK("nvme_path_made", st == 0 && stat(deep, &sb) == 0 && S_ISDIR(sb.st_mode), "exit %d, '%s'", st, msg);

    a = (struct open_args){deep, "j", 100, 1e18};
    expect_error("nvme_path_no_room", check_dir_child, &a, deep, "GiB) free; the offloaded state needs");

    snprintf(path, sizeof path, "%s/plain-file/sub", base);
    a = (struct open_args){path, "j", 100, 0};
    expect_error("nvme_path_cannot_make", check_dir_child, &a, path, "cannot");

    /* a second job on the same file */
    snprintf(dir, sizeof dir, "%s/lock", base);
    struct nvme_file *held = nvme_open(dir, "same", 0, 100, PIECE, 3);
    a = (struct open_args){dir, "same", 100, 0};
    expect_error("nvme_lock_second_job", open_child, &a, nvme_path(held), "in use by another job");
    a = (struct open_args){dir, "other", 100, 0};
    st = check_run_child(open_child, &a, msg, sizeof msg);
    CHECK("nvme_lock_other_job_ok", st == 0, "another job's file: exit %d, '%s'", st, msg);
    nvme_close(held);

    /* the disk fills up: the file cannot take its size */
    snprintf(dir, sizeof dir, "%s/full", base);
    a = (struct open_args){dir, "full", 100000, 0};
    expect_error("nvme_disk_full", full_disk_child, &a, "shardlm-full-rank0.optim", "cannot allocate");

    /* an I/O error mid-step: a short read */
    snprintf(dir, sizeof dir, "%s/trunc", base);
    a = (struct open_args){dir, "trunc", 4000, 0};
    expect_error("nvme_short_read_mid_step", truncated_child, &a, "shardlm-trunc-rank0.optim", "short read");

    /* tmpfs: a warning that it is memory */
    a = (struct open_args){"/dev/shm", "j", 100, 0};
    st = check_run_child(check_dir_child, &a, msg, sizeof msg);
    CHECK("nvme_tmpfs_warning", st == 0 && strstr(msg, "tmpfs: memory, not disk"),
          "/dev/shm (tmpfs on Linux): exit %d, stderr '%s'", st, msg);
}

/* nvme_sizes: the numbers the engine opens its file with and the plan counts. */
static void check_sizes(void)
{
    size_t file, host, piece;
    nvme_sizes(5000, 4, &file, &host, &piece); /* a small range: one piece, the range rounded up */
    CHECK("nvme_sizes_small", piece == 5120 && file == 12 * 5120 && host == 4 * 12 * 5120 &&
                                  file == nvme_file_bytes(5000, piece),
          "piece %zu file %zu host %zu", piece, file, host);
    const size_t n = 3 * NVME_PIECE_DEFAULT + 7; /* a large one: default pieces, the last padded; 3 buffers at least */
    nvme_sizes(n, 1, &file, &host, &piece);
    CHECK("nvme_sizes_large", piece == NVME_PIECE_DEFAULT && file == 4 * 12 * NVME_PIECE_DEFAULT &&
                                  host == (size_t)NVME_BUFFERS_MIN * 12 * NVME_PIECE_DEFAULT,
          "piece %zu file %zu host %zu", piece, file, host);
}

int main(void)
{
    const char *tmp = getenv("SHARDLM_TEST_TMP");
    snprintf(base, sizeof base, "%s/nvme-%d", tmp ? tmp : "/tmp", (int)getpid());
    check_step_equal(DTYPE_F32, "f32");
    check_step_equal(DTYPE_BF16, "bf16");
    check_step_equal(DTYPE_F16, "f16");
    check_partial_ranges();
    check_sizes();
    check_bad_input();
    return check_status();
}
