/*
 * test_ckpt — parallel HDF5 checkpoints (src/io/ckpt_*.c).
 *
 * Runs as one process (tests/run.sh) or under mpirun (tests/t_ckpt.sh). Four
 * synthetic tensors (one of several checksummed pieces) are laid out in one ZeRO unit
 * (16-element alignment, padded to world * 16, one contiguous shard per rank),
 * their master, Adam m and v values saved by every rank from its shard, then
 * read back: at the saving world size (bitwise), as virtual world sizes 1..4
 * would read them, and for every flat range of the small tensors.
 * Attributes, per-rank state, pruning to `keep`, `latest` and resolution are
 * checked. Damaged files
 * (a flipped byte, a truncated file, a deleted dataset, a changed shape, no
 * checksum) must end a fresh process with exit status 2 and one line naming
 * the file and the dataset: rank 0 runs this binary again in "--read" mode,
 * as a single-process MPI job of its own, with stderr into a pipe.
 *
 * The modes --read and --save-mismatch are also run under mpirun by
 * tests/t_ckpt.sh, to check that several ranks fail the same way.
 *
 * Only rank 0 prints; a check passes when it passed on every rank.
 * SHARDLM_CKPT_KEEP=1 leaves the files (tests/t_ckpt.sh inspects them).
 */
#define _GNU_SOURCE /* nftw */
#include "check.h"
#include "io/ckpt.h"
#include "core/util.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <hdf5.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define N_TENSORS 4
#define N_GROUPS 3
#define ALIGN 16 /* MODEL_TENSOR_ALIGN */

struct tensor {
    const char *name;
    int ndim;
    size_t shape[2];
    size_t offset, numel; /* in the unit */
};

static struct tensor g_tensors[N_TENSORS] = {
    {"wte.weight", 2, {7, 5}, 0, 0},
    {"h.0.ln_1.weight", 1, {13, 0}, 0, 0},
    {"h.0.attn.c_attn.weight", 2, {5, 15}, 0, 0},
    /* Several checksummed pieces (CKPT_PIECE_ELEMS = 128 rows), split between ranks. */
    {"h.0.mlp.c_fc.weight", 2, {1100, 2048}, 0, 0},
};
static const char *g_groups[N_GROUPS] = {"master", "adam_m", "adam_v"};
static size_t g_unit_numel;
static int g_rank, g_world;
static char g_dir[1024];

/* A check that passes only when it passed on every rank; rank 0 prints it. */
#define CHECK_ALL(name, cond, ...)                                                         \
    do {                                                                                   \
        int _local = (cond) ? 1 : 0, _all = 0;                                             \
        MPI_Allreduce(&_local, &_all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);                \
        if (g_rank == 0) {                                                                 \
            CHECK(name, _all, __VA_ARGS__);                                                \
        } else if (!_all) {                                                                \
            check_failures++;                                                              \
        }                                                                                  \
    } while (0)

static void layout_unit(void)
{
    size_t offset = 0;
    for (int t = 0; t < N_TENSORS; t++) {
        struct tensor *x = &g_tensors[t];
        x->numel = x->ndim == 1 ? x->shape[0] : x->shape[0] * x->shape[1];
        x->offset = offset;
        offset = round_up(offset + x->numel, ALIGN);
    }
    g_unit_numel = g_tensors[N_TENSORS - 1].offset + g_tensors[N_TENSORS - 1].numel;
}

/* Finite fp32 values with random sign and mantissa, distinct per step, group,
 * tensor and element, so any misplaced element changes bits. */
static float value_at(long step, int group, int tensor, size_t i)
{
    uint64_t state = (uint64_t)step * 1000003u + (uint64_t)group * 10007u + (uint64_t)tensor * 101u + i;
    uint64_t r = splitmix64(&state);
    uint32_t bits = (uint32_t)(r & 0x807FFFFFu) | (uint32_t)(100 + (r >> 40) % 50) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* The unit's flat buffer (gaps zero) for a group at a step. */
static float *unit_values(long step, int group)
{
    float *unit = xcalloc(g_unit_numel, sizeof *unit);
    for (int t = 0; t < N_TENSORS; t++)
        for (size_t i = 0; i < g_tensors[t].numel; i++)
            unit[g_tensors[t].offset + i] = value_at(step, group, t, i);
    return unit;
}

/* ZeRO shard of rank r of `world`: [*begin, *begin + *count) of the padded unit. */
static void shard_range(int r, int world, size_t *begin, size_t *count)
{
    size_t padded = round_up(g_unit_numel, (size_t)world * ALIGN);
    *count = padded / (size_t)world;
    *begin = (size_t)r * *count;
}

/* This rank's slices of every tensor (count 0 where it holds nothing), data
 * pointing into shard (the shard's values, starting at unit element shard_begin). */
static void make_slices(struct ckpt_slice *slices, size_t shard_begin, size_t shard_count, const float *shard)
{
    for (int t = 0; t < N_TENSORS; t++) {
        const struct tensor *x = &g_tensors[t];
        struct ckpt_slice *s = &slices[t];
        size_t at = ckpt_intersect(x->offset, x->numel, shard_begin, shard_count, &s->begin, &s->count);
        s->name = x->name;
        s->ndim = x->ndim;
        s->shape[0] = x->shape[0];
        s->shape[1] = x->shape[1];
        s->data = s->count ? shard + at : NULL;
    }
}

static const char *k_config_json = "{\"model\":\"d12\",\"zero_optimization\":{\"stage\":3},\"lr\":0.0006}";
static char *g_model_json; /* large: > 64 KiB, beyond HDF5's compact attribute limit */

/* Saves the state of `step` from this rank's shard. */
static void save_step(const char *dir, long step, int keep, char *path, size_t cap)
{
    size_t shard_begin, shard_count;
    shard_range(g_rank, g_world, &shard_begin, &shard_count);
    float *shards[N_GROUPS];
    struct ckpt_slice slices[N_GROUPS][N_TENSORS];
    struct ckpt_group groups[N_GROUPS];
    for (int g = 0; g < N_GROUPS; g++) {
        float *unit = unit_values(step, g);
        shards[g] = xcalloc(shard_count, sizeof(float));
        for (size_t i = 0; i < shard_count && shard_begin + i < g_unit_numel; i++)
            shards[g][i] = unit[shard_begin + i];
        free(unit);
        make_slices(slices[g], shard_begin, shard_count, shards[g]);
        groups[g] = (struct ckpt_group){g_groups[g], slices[g], N_TENSORS};
    }
    uint64_t data_pos[2] = {1000u + (uint64_t)g_rank * 7u + (uint64_t)step, 3u};
    uint64_t rng = 0xABCDEF0123456789ull ^ (uint64_t)g_rank;
    struct ckpt_rank_state rank_state[] = {{"data_position", 2, data_pos}, {"rng", 1, &rng}};
    struct ckpt_attr attrs[] = {
        {.name = "skipped_steps", .kind = CKPT_ATTR_I64, .i64 = 3},
        {.name = "loss_scale", .kind = CKPT_ATTR_F64, .f64 = 32768.0},
        {.name = "hysteresis_left", .kind = CKPT_ATTR_I64, .i64 = 2},
        {.name = "last_overflow_iter", .kind = CKPT_ATTR_I64, .i64 = -1},
        {.name = "scaler_iter", .kind = CKPT_ATTR_I64, .i64 = step * 2},
        {.name = "config_json", .kind = CKPT_ATTR_STR, .str = k_config_json},
        {.name = "model_json", .kind = CKPT_ATTR_STR, .str = g_model_json},
    };
    struct ckpt_contents contents = {groups, N_GROUPS, rank_state, 2, attrs, (int)(sizeof attrs / sizeof attrs[0])};
    ckpt_save(dir, step, keep, &contents, path, cap);
    for (int g = 0; g < N_GROUPS; g++)
        free(shards[g]);
}

static bool file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static void read_latest_name(const char *dir, char *out, size_t cap)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/latest", dir);
    out[0] = 0;
    FILE *fp = fopen(path, "r");
    if (fp) {
        if (!fgets(out, (int)cap, fp))
            out[0] = 0;
        fclose(fp);
    }
    out[strcspn(out, "\n")] = 0;
}

/* ------------------------------------------------------------------------ */

static void test_save_prune_latest(void)
{
    char path[2048], want[2048], latest[256];
    for (long step = 10; step <= 30; step += 10)
        save_step(g_dir, step, 2, path, sizeof path);
    snprintf(want, sizeof want, "%s/step_000030.h5", g_dir);
    CHECK_ALL("save_returns_published_path", strcmp(path, want) == 0, "got '%s', want '%s'", path, want);
    char p10[2048], p20[2048], tmp[2048];
    snprintf(p10, sizeof p10, "%s/step_000010.h5", g_dir);
    snprintf(p20, sizeof p20, "%s/step_000020.h5", g_dir);
    snprintf(tmp, sizeof tmp, "%s/step_000030.h5.tmp", g_dir);
    CHECK_ALL("keep_2_pruned_oldest", !file_exists(p10) && file_exists(p20) && file_exists(want),
              "step 10 %d, step 20 %d, step 30 %d", file_exists(p10), file_exists(p20), file_exists(want));
    CHECK_ALL("no_temporary_left", !file_exists(tmp), "'%s' still exists", tmp);
    read_latest_name(g_dir, latest, sizeof latest);
    CHECK_ALL("latest_names_newest", strcmp(latest, "step_000030.h5") == 0, "latest holds '%s'", latest);

    char keep_all[1100];
    snprintf(keep_all, sizeof keep_all, "%s/keep_all", g_dir);
    for (long step = 1; step <= 3; step++)
        save_step(keep_all, step, 0, path, sizeof path);
    int present = 0;
    for (long step = 1; step <= 3; step++) {
        snprintf(path, sizeof path, "%s/step_%06ld.h5", keep_all, step);
        present += file_exists(path);
    }
    CHECK_ALL("keep_0_keeps_all", present == 3, "%d of 3 checkpoints present", present);
}

static void test_resolve(void)
{
    char empty[1100], want[2048];
    snprintf(empty, sizeof empty, "%s/empty", g_dir);
    if (g_rank == 0)
        mkdir(empty, 0777);
    MPI_Barrier(MPI_COMM_WORLD);
    char *none = ckpt_resolve(empty, "auto");
    CHECK_ALL("resolve_auto_fresh_is_null", none == NULL, "got '%s'", none ? none : "");
    free(none);
    snprintf(want, sizeof want, "%s/step_000030.h5", g_dir);
    /* A crash during a later save leaves a temporary that must be ignored. */
    if (g_rank == 0) {
        char junk[2048];
        snprintf(junk, sizeof junk, "%s/step_000040.h5.tmp", g_dir);
        FILE *fp = fopen(junk, "w");
        if (fp) {
            fputs("half-written", fp);
            fclose(fp);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    char *aut = ckpt_resolve(g_dir, "auto");
    CHECK_ALL("resolve_auto_is_latest", aut && strcmp(aut, want) == 0, "got '%s'", aut ? aut : "(null)");
    char *by_dir = ckpt_resolve("/nonexistent-ignored", g_dir);
    CHECK_ALL("resolve_dir_is_latest", by_dir && strcmp(by_dir, want) == 0, "got '%s'", by_dir ? by_dir : "(null)");
    char *by_file = ckpt_resolve(g_dir, want);
    CHECK_ALL("resolve_file_is_itself", by_file && strcmp(by_file, want) == 0, "got '%s'", by_file ? by_file : "");
    free(aut);
    free(by_dir);
    free(by_file);
}

/* Reads every tensor's range of a layout at `world` (all its ranks) and
 * compares bitwise with the values of step 30. */
static bool read_as_world(struct ckpt_reader *r, int world, char *why, size_t cap)
{
    float *units[N_GROUPS];
    for (int g = 0; g < N_GROUPS; g++)
        units[g] = unit_values(30, g);
    bool same = true;
    for (int v = 0; v < world && same; v++) {
        size_t shard_begin, shard_count;
        shard_range(v, world, &shard_begin, &shard_count);
        float *shard = xcalloc(shard_count, sizeof(float));
        struct ckpt_slice slices[N_TENSORS];
        make_slices(slices, shard_begin, shard_count, shard);
        for (int g = 0; g < N_GROUPS && same; g++) {
            memset(shard, 0xFF, shard_count * sizeof(float));
            for (int t = 0; t < N_TENSORS; t++)
                if (slices[t].count)
                    ckpt_read_slice(r, g_groups[g], &slices[t], (float *)slices[t].data);
            for (int t = 0; t < N_TENSORS && same; t++) {
                const float *want = units[g] + g_tensors[t].offset + slices[t].begin;
                if (slices[t].count && memcmp(slices[t].data, want, slices[t].count * sizeof(float)) != 0) {
                    snprintf(why, cap, "virtual rank %d of %d, %s/%s [%zu, +%zu) differs", v, world, g_groups[g],
                             g_tensors[t].name, slices[t].begin, slices[t].count);
                    same = false;
                }
            }
        }
        free(shard);
    }
    for (int g = 0; g < N_GROUPS; g++)
        free(units[g]);
    return same;
}

static void test_load(void)
{
    char *path = ckpt_resolve(g_dir, "auto");
    struct ckpt_reader *r = ckpt_open(path);
    CHECK_ALL("saved_world", ckpt_saved_world(r) == g_world, "saved world %d, want %d", ckpt_saved_world(r), g_world);

    /* This rank's own shard at the saving world size, bitwise. */
    char why[512] = "";
    bool same = true;
    size_t shard_begin, shard_count;
    shard_range(g_rank, g_world, &shard_begin, &shard_count);
    for (int g = 0; g < N_GROUPS; g++) {
        float *unit = unit_values(30, g);
        float *want = xcalloc(shard_count, sizeof(float));
        float *got = xcalloc(shard_count, sizeof(float));
        for (size_t i = 0; i < shard_count && shard_begin + i < g_unit_numel; i++)
            want[i] = unit[shard_begin + i];
        struct ckpt_slice slices[N_TENSORS];
        make_slices(slices, shard_begin, shard_count, got);
        for (int t = 0; t < N_TENSORS; t++)
            if (slices[t].count)
                ckpt_read_slice(r, g_groups[g], &slices[t], (float *)slices[t].data);
        if (memcmp(got, want, shard_count * sizeof(float)) != 0) {
            snprintf(why, sizeof why, "group %s of rank %d differs", g_groups[g], g_rank);
            same = false;
        }
        free(unit);
        free(want);
        free(got);
    }
    CHECK_ALL("same_world_bitwise", same, "%s", why);

    for (int world = 1; world <= 4; world++) {
        char name[64];
        snprintf(name, sizeof name, "virtual_world_%d_bitwise", world);
        why[0] = 0;
        same = read_as_world(r, world, why, sizeof why);
        CHECK_ALL(name, same, "%s", why);
    }

    /* Every flat range of every tensor: exercises the 1- to 3-block hyperslabs. */
    same = true;
    float *got = xcalloc(128, sizeof(float));
    for (int t = 0; t < N_TENSORS && same; t++) {
        const struct tensor *x = &g_tensors[t];
        if (x->numel > 128)
            continue; /* quadratic: the small tensors cover every block shape */
        for (size_t begin = 0; begin <= x->numel && same; begin++)
            for (size_t count = 0; begin + count <= x->numel && same; count++) {
                ckpt_read(r, "adam_v", x->name, x->ndim, x->shape, begin, count, got);
                for (size_t i = 0; i < count && same; i++)
                    if (got[i] != value_at(30, 2, t, begin + i)) {
                        snprintf(why, sizeof why, "%s [%zu, +%zu) element %zu", x->name, begin, count, i);
                        same = false;
                    }
            }
    }
    free(got);
    CHECK_ALL("every_flat_range", same, "%s", why);

    int64_t step = ckpt_attr_i64(r, "step"), skipped = ckpt_attr_i64(r, "skipped_steps");
    int64_t last = ckpt_attr_i64(r, "last_overflow_iter"), iter = ckpt_attr_i64(r, "scaler_iter");
    double scale = ckpt_attr_f64(r, "loss_scale");
    CHECK_ALL("attr_step", step == 30, "step %lld", (long long)step);
    CHECK_ALL("attr_scaler", skipped == 3 && last == -1 && iter == 60 && scale == 32768.0,
              "skipped %lld last %lld iter %lld scale %g", (long long)skipped, (long long)last, (long long)iter, scale);
    char *config = ckpt_attr_str(r, "config_json"), *model = ckpt_attr_str(r, "model_json");
    char *version = ckpt_attr_str(r, "shardlm_version");
    CHECK_ALL("attr_config_json", strcmp(config, k_config_json) == 0, "got '%s'", config);
    CHECK_ALL("attr_large_string", strcmp(model, g_model_json) == 0, "model_json of %zu bytes differs",
              strlen(model));
    CHECK_ALL("attr_version", strcmp(version, SHARDLM_VERSION) == 0, "got '%s'", version);
    CHECK_ALL("has_attr", ckpt_has_attr(r, "loss_scale") && !ckpt_has_attr(r, "no_such_attr"), "wrong answers");
    free(config);
    free(model);
    free(version);

    uint64_t *data_pos = xcalloc((size_t)g_world * 2, sizeof *data_pos);
    uint64_t *rng = xcalloc((size_t)g_world, sizeof *rng);
    ckpt_read_rank_state(r, "data_position", 2, data_pos);
    ckpt_read_rank_state(r, "rng", 1, rng);
    same = true;
    for (int i = 0; i < g_world; i++)
        same = same && data_pos[2 * i] == 1000u + (uint64_t)i * 7u + 30u && data_pos[2 * i + 1] == 3u &&
               rng[i] == (0xABCDEF0123456789ull ^ (uint64_t)i);
    CHECK_ALL("rank_state_rows", same, "a row of data_position or rng differs");
    free(data_pos);
    free(rng);
    ckpt_close(r);
    free(path);
}

/* ------------------------------------------------------------------------ */
/* Damaged files: a fresh single-process MPI job reads them                  */

/* Removes the variables through which mpirun tells a process it belongs to a
 * job, so that the child's MPI_Init starts a singleton world of its own. */
static void leave_mpi_job(void)
{
    extern char **environ;
    char names[256][128];
    int n = 0;
    for (char **e = environ; *e && n < 256; e++) {
        bool job = (strncmp(*e, "OMPI_", 5) == 0 && strncmp(*e, "OMPI_ALLOW_RUN_AS_ROOT", 22) != 0) ||
                   strncmp(*e, "PMIX_", 5) == 0 || strncmp(*e, "OPAL_", 5) == 0;
        if (job) {
            size_t len = strcspn(*e, "=");
            snprintf(names[n++], sizeof names[0], "%.*s", (int)len, *e);
        }
    }
    for (int i = 0; i < n; i++)
        unsetenv(names[i]);
}

/* Runs this binary with args; returns its exit status (-1: no normal exit)
 * and its stderr in msg. */
static int run_child(char *const args[], char *msg, size_t cap)
{
    int fds[2];
    msg[0] = 0;
    if (pipe(fds) != 0)
        return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        close(fds[1]);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0)
            dup2(devnull, 1);
        leave_mpi_job();
        execv("/proc/self/exe", args);
        _exit(127);
    }
    close(fds[1]);
    size_t len = 0;
    for (;;) {
        ssize_t got = read(fds[0], msg + len, cap - 1 - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        len += (size_t)got;
        if (len == cap - 1) {
            char sink[256];
            while (read(fds[0], sink, sizeof sink) > 0) {}
            break;
        }
    }
    msg[len] = 0;
    close(fds[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Child mode: --read PATH GROUP TENSOR_INDEX [BEGIN COUNT]; reads the whole
 * tensor, or that flat range of it. */
static int child_read(int argc, char **argv)
{
    struct ckpt_reader *r = ckpt_open(argv[2]);
    const struct tensor *x = &g_tensors[atoi(argv[4])];
    size_t begin = argc == 7 ? strtoull(argv[5], NULL, 10) : 0;
    size_t count = argc == 7 ? strtoull(argv[6], NULL, 10) : x->numel;
    float *out = xcalloc(count + 1, sizeof *out);
    ckpt_read(r, argv[3], x->name, x->ndim, x->shape, begin, count, out);
    ckpt_close(r);
    free(out);
    return 0;
}

/* Child mode: --save-overlap DIR; the ranks (here: the only one) leave an
 * element of a tensor unsaved, which ckpt_save must refuse. */
static int child_save_overlap(char **argv)
{
    float values[35] = {0};
    struct ckpt_slice short_one = {"wte.weight", 2, {7, 5}, 0, 34, values, NULL, NULL};
    struct ckpt_group group = {"master", &short_one, 1};
    struct ckpt_contents contents = {&group, 1, NULL, 0, NULL, 0};
    ckpt_save(argv[2], 1, 0, &contents, NULL, 0);
    return 0;
}

/* Child mode: --save-mismatch DIR; under mpirun the ranks name different
 * tensors, which ckpt_save must refuse before any collective HDF5 call. */
static int child_save_mismatch(char **argv)
{
    float values[35] = {0};
    struct ckpt_slice s = {g_rank == 0 ? "wte.weight" : "wpe.weight", 2, {7, 5}, 0, g_rank == 0 ? 35 : 0, values,
                          NULL, NULL};
    struct ckpt_group group = {"master", &s, 1};
    struct ckpt_contents contents = {&group, 1, NULL, 0, NULL, 0};
    ckpt_save(argv[2], 1, 0, &contents, NULL, 0);
    return 0;
}

static void expect_failure(const char *name, char *const args[], int want_status, const char *file,
                           const char *phrase1, const char *phrase2)
{
    char msg[8192], check_name[128];
    int status = run_child(args, msg, sizeof msg);
    printf("# %s: %s", name, msg[0] ? msg : "(no stderr)\n");
    snprintf(check_name, sizeof check_name, "%s_exit_status", name);
    CHECK(check_name, status == want_status, "exit status %d, want %d; stderr: %s", status, want_status, msg);
    const char *line = strstr(msg, "shardlm: ");
    bool one_line = line && strchr(line, '\n') && strchr(line, '\n')[1] == 0;
    snprintf(check_name, sizeof check_name, "%s_one_line", name);
    CHECK(check_name, one_line, "want one 'shardlm:' line at the end; stderr: %s", msg);
    snprintf(check_name, sizeof check_name, "%s_names_file", name);
    CHECK(check_name, line && strstr(line, file), "'%s' not in: %s", file, msg);
    snprintf(check_name, sizeof check_name, "%s_says_why", name);
    CHECK(check_name, line && strstr(line, phrase1) && (!phrase2 || strstr(line, phrase2)), "want '%s'%s%s in: %s",
          phrase1, phrase2 ? " and " : "", phrase2 ? phrase2 : "", msg);
}

static bool copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    bool ok = in && out;
    char buf[65536];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0)
        ok = fwrite(buf, 1, n, out) == n;
    if (in)
        fclose(in);
    if (out && fclose(out) != 0)
        ok = false;
    return ok;
}

/* File offset of a contiguous dataset's data (serial HDF5, file closed by all). */
static bool dataset_offset(const char *path, const char *dataset, haddr_t *addr)
{
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t dset = file < 0 ? -1 : H5Dopen2(file, dataset, H5P_DEFAULT);
    *addr = dset < 0 ? HADDR_UNDEF : H5Dget_offset(dset);
    if (dset >= 0)
        H5Dclose(dset);
    if (file >= 0)
        H5Fclose(file);
    return *addr != HADDR_UNDEF;
}

/* Copies good to path and flips bit 4 of byte `byte` of dataset's data. */
static bool copy_and_flip(const char *good, const char *path, const char *dataset, size_t byte)
{
    haddr_t addr = 0;
    if (!copy_file(good, path) || !dataset_offset(path, dataset, &addr))
        return false;
    int fd = open(path, O_RDWR);
    unsigned char value = 0;
    off_t at = (off_t)(addr + byte);
    bool ok = fd >= 0 && pread(fd, &value, 1, at) == 1;
    value ^= 0x10;
    ok = ok && pwrite(fd, &value, 1, at) == 1;
    return fd >= 0 && close(fd) == 0 && ok;
}

/* Rewrites attribute crc32c_ends of a dataset with its last end one short, or
 * deletes it. */
static bool damage_piece_table(const char *path, const char *dataset, bool delete_it)
{
    hid_t file = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t dset = file < 0 ? -1 : H5Dopen2(file, dataset, H5P_DEFAULT);
    bool ok = dset >= 0;
    if (ok && delete_it) {
        ok = H5Adelete(dset, CKPT_ATTR_CRC_ENDS) >= 0;
    } else if (ok) {
        hid_t attr = H5Aopen(dset, CKPT_ATTR_CRC_ENDS, H5P_DEFAULT);
        hid_t space = attr < 0 ? -1 : H5Aget_space(attr);
        hssize_t n = space < 0 ? -1 : H5Sget_simple_extent_npoints(space);
        uint64_t ends[64];
        ok = n > 0 && n <= 64 && H5Aread(attr, H5T_NATIVE_UINT64, ends) >= 0;
        if (ok) {
            ends[n - 1] -= 1;
            ok = H5Awrite(attr, H5T_NATIVE_UINT64, ends) >= 0;
        }
        if (space >= 0)
            H5Sclose(space);
        if (attr >= 0)
            H5Aclose(attr);
    }
    if (dset >= 0)
        H5Dclose(dset);
    return file >= 0 && H5Fclose(file) >= 0 && ok;
}

/* Replaces a dataset by a chunked one of the given shape, of zeros, with
 * HDF5's Fletcher32 filter (checkpoint format 1) or without any checksum;
 * dims NULL: deletes it. */
static bool replace_dataset(const char *path, const char *dataset, int ndim, const hsize_t *dims, bool checksum)
{
    hid_t file = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    if (file < 0 || H5Ldelete(file, dataset, H5P_DEFAULT) < 0)
        return false;
    bool ok = true;
    if (dims) {
        hid_t space = H5Screate_simple(ndim, dims, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
        ok = H5Pset_chunk(dcpl, ndim, dims) >= 0 && (!checksum || H5Pset_fletcher32(dcpl) >= 0);
        hid_t dset = H5Dcreate2(file, dataset, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
        float zeros[256] = {0};
        ok = ok && dset >= 0 && H5Dwrite(dset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, zeros) >= 0;
        if (dset >= 0)
            H5Dclose(dset);
        H5Pclose(dcpl);
        H5Sclose(space);
    }
    return H5Fclose(file) >= 0 && ok;
}

static void test_damaged(void)
{
    if (g_rank != 0)
        return;
    char good[2048], path[2048];
    snprintf(good, sizeof good, "%s/step_000030.h5", g_dir);

    /* The intact file reads fine in a child too (the harness itself works). */
    char *read_good[] = {"test_ckpt", "--read", good, "master", "0", NULL};
    char msg[8192];
    int status = run_child(read_good, msg, sizeof msg);
    CHECK("child_reads_intact_file", status == 0, "exit status %d; stderr: %s", status, msg);

    /* One flipped byte in the middle of /master/wte.weight. */
    snprintf(path, sizeof path, "%s/flipped.h5", g_dir);
    bool prepared = copy_and_flip(good, path, "/master/wte.weight", 7 * 5 * sizeof(float) / 2);
    CHECK("flip_prepared", prepared, "could not copy '%s' and flip a byte of /master/wte.weight", good);
    char *read_flipped[] = {"test_ckpt", "--read", path, "master", "0", NULL};
    expect_failure("flipped_byte", read_flipped, EXIT_BAD_INPUT, "flipped.h5", "/master/wte.weight", "CRC32C");
    /* The other tensors of the same file are intact and still read. */
    char *read_other[] = {"test_ckpt", "--read", path, "adam_m", "2", NULL};
    status = run_child(read_other, msg, sizeof msg);
    CHECK("flipped_file_other_tensor_reads", status == 0, "exit status %d; stderr: %s", status, msg);

    /* A flipped byte in element 600000 of /master/h.0.mlp.c_fc.weight, inside
     * the piece [524288, 786432) (or a part of it, cut where a rank's range
     * ends). Reading a range of the same piece that does not contain the
     * element still fails (the rest of the piece is read to verify it); a
     * range in another piece reads fine. */
    snprintf(path, sizeof path, "%s/flipped_big.h5", g_dir);
    prepared = copy_and_flip(good, path, "/master/h.0.mlp.c_fc.weight", 600000 * sizeof(float) + 1);
    CHECK("flip_big_prepared", prepared, "could not copy '%s' and flip a byte of /master/h.0.mlp.c_fc.weight", good);
    char *read_same_piece[] = {"test_ckpt", "--read", path, "master", "3", "599000", "900", NULL};
    expect_failure("flipped_byte_same_piece", read_same_piece, EXIT_BAD_INPUT, "flipped_big.h5",
                   "/master/h.0.mlp.c_fc.weight", "fails its CRC32C check");
    char *read_after[] = {"test_ckpt", "--read", path, "master", "3", "600001", "3", NULL};
    expect_failure("flipped_byte_same_piece_after", read_after, EXIT_BAD_INPUT, "flipped_big.h5",
                   "/master/h.0.mlp.c_fc.weight", "CRC32C");
    char *read_other_piece[] = {"test_ckpt", "--read", path, "master", "3", "100", "400000", NULL};
    status = run_child(read_other_piece, msg, sizeof msg);
    CHECK("flipped_big_other_piece_reads", status == 0, "exit status %d; stderr: %s", status, msg);

    /* A damaged checksum table: the pieces stop one element short, or the
     * table of piece ends is gone. */
    snprintf(path, sizeof path, "%s/short_table.h5", g_dir);
    prepared = copy_file(good, path) && damage_piece_table(path, "/adam_v/h.0.mlp.c_fc.weight", false);
    CHECK("short_table_prepared", prepared, "could not damage the checksum table of a copy of '%s'", good);
    char *read_short[] = {"test_ckpt", "--read", path, "adam_v", "3", "0", "10", NULL};
    expect_failure("short_checksum_table", read_short, EXIT_BAD_INPUT, "short_table.h5",
                   "/adam_v/h.0.mlp.c_fc.weight", "do not cover its 2252800 elements");
    snprintf(path, sizeof path, "%s/no_ends.h5", g_dir);
    prepared = copy_file(good, path) && damage_piece_table(path, "/adam_v/wte.weight", true);
    CHECK("no_ends_prepared", prepared, "could not delete crc32c_ends of a copy of '%s'", good);
    char *read_no_ends[] = {"test_ckpt", "--read", path, "adam_v", "0", NULL};
    expect_failure("missing_checksum_ends", read_no_ends, EXIT_BAD_INPUT, "no_ends.h5", "/adam_v/wte.weight",
                   "no 'crc32c_ends' attribute");

    /* A dataset of checkpoint format 1 (chunked, Fletcher32) still reads. */
    snprintf(path, sizeof path, "%s/format1.h5", g_dir);
    hsize_t wte_shape[2] = {7, 5};
    prepared = copy_file(good, path) && replace_dataset(path, "/adam_v/wte.weight", 2, wte_shape, true);
    CHECK("format1_prepared", prepared, "could not replace a dataset of a copy of '%s'", good);
    char *read_format1[] = {"test_ckpt", "--read", path, "adam_v", "0", NULL};
    status = run_child(read_format1, msg, sizeof msg);
    CHECK("format1_fletcher32_dataset_reads", status == 0, "exit status %d; stderr: %s", status, msg);

    /* Truncated to half its size. */
    snprintf(path, sizeof path, "%s/truncated.h5", g_dir);
    struct stat st;
    prepared = copy_file(good, path) && stat(path, &st) == 0 && truncate(path, st.st_size / 2) == 0;
    CHECK("truncate_prepared", prepared, "could not copy and truncate '%s'", good);
    char *read_truncated[] = {"test_ckpt", "--read", path, "master", "2", NULL};
    expect_failure("truncated_file", read_truncated, EXIT_BAD_INPUT, "truncated.h5", "truncated", NULL);

    /* A deleted dataset. */
    snprintf(path, sizeof path, "%s/deleted.h5", g_dir);
    prepared = copy_file(good, path) && replace_dataset(path, "/master/h.0.ln_1.weight", 1, NULL, true);
    CHECK("delete_prepared", prepared, "could not delete a dataset of a copy of '%s'", good);
    char *read_deleted[] = {"test_ckpt", "--read", path, "master", "1", NULL};
    expect_failure("deleted_dataset", read_deleted, EXIT_BAD_INPUT, "deleted.h5", "/master/h.0.ln_1.weight",
                   "missing");

    /* A changed shape: (5, 7) where the model has (7, 5). */
    snprintf(path, sizeof path, "%s/reshaped.h5", g_dir);
    hsize_t transposed[2] = {5, 7};
    prepared = copy_file(good, path) && replace_dataset(path, "/adam_m/wte.weight", 2, transposed, true);
    CHECK("reshape_prepared", prepared, "could not replace a dataset of a copy of '%s'", good);
    char *read_reshaped[] = {"test_ckpt", "--read", path, "adam_m", "0", NULL};
    expect_failure("changed_shape", read_reshaped, EXIT_BAD_INPUT, "reshaped.h5", "/adam_m/wte.weight",
                   "shape (5, 7), the model needs (7, 5)");

    /* A dataset without a checksum cannot be verified: refused. */
    snprintf(path, sizeof path, "%s/unchecked.h5", g_dir);
    hsize_t same_shape[2] = {7, 5};
    prepared = copy_file(good, path) && replace_dataset(path, "/adam_v/wte.weight", 2, same_shape, false);
    CHECK("unchecked_prepared", prepared, "could not replace a dataset of a copy of '%s'", good);
    char *read_unchecked[] = {"test_ckpt", "--read", path, "adam_v", "0", NULL};
    expect_failure("no_checksum", read_unchecked, EXIT_BAD_INPUT, "unchecked.h5", "/adam_v/wte.weight",
                   "has no checksum");

    /* A file that does not exist. */
    snprintf(path, sizeof path, "%s/missing.h5", g_dir);
    char *read_missing[] = {"test_ckpt", "--read", path, "master", "0", NULL};
    expect_failure("missing_file", read_missing, EXIT_BAD_INPUT, "missing.h5", "No such file", NULL);

    /* Not an HDF5 file at all. */
    snprintf(path, sizeof path, "%s/garbage.h5", g_dir);
    FILE *fp = fopen(path, "w");
    if (fp) {
        for (int i = 0; i < 4096; i++)
            fputc(i * 7, fp);
        fclose(fp);
    }
    char *read_garbage[] = {"test_ckpt", "--read", path, "master", "0", NULL};
    expect_failure("not_hdf5", read_garbage, EXIT_BAD_INPUT, "garbage.h5", "cannot open as HDF5", NULL);

    /* Ranks whose slices do not cover a tensor exactly once: a caller bug. */
    snprintf(path, sizeof path, "%s/overlap", g_dir);
    char *save_overlap[] = {"test_ckpt", "--save-overlap", path, NULL};
    expect_failure("coverage_checked", save_overlap, EXIT_INTERNAL, "wte.weight", "hold 34 elements",
                   "the tensor has 35");
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_world);
    layout_unit();
    if ((argc == 5 || argc == 7) && strcmp(argv[1], "--read") == 0) {
        int rc = child_read(argc, argv);
        MPI_Finalize();
        return rc;
    }
    if (argc == 3 && (strcmp(argv[1], "--save-overlap") == 0 || strcmp(argv[1], "--save-mismatch") == 0)) {
        int rc = strcmp(argv[1], "--save-overlap") == 0 ? child_save_overlap(argv) : child_save_mismatch(argv);
        MPI_Finalize();
        return rc;
    }

    size_t model_len = 100000;
    g_model_json = xmalloc(model_len + 1);
    for (size_t i = 0; i < model_len; i++)
        g_model_json[i] = (char)('a' + i % 26);
    g_model_json[model_len] = 0;

    if (g_rank == 0) {
        const char *base = getenv("SHARDLM_TEST_TMP");
        snprintf(g_dir, sizeof g_dir, "%s/test_ckpt.XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(g_dir)) {
            fprintf(stderr, "test_ckpt: cannot create a directory from '%s': %s\n", g_dir, strerror(errno));
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        printf("# world %d, checkpoints in %s\n", g_world, g_dir);
    }
    MPI_Bcast(g_dir, sizeof g_dir, MPI_CHAR, 0, MPI_COMM_WORLD);

    test_save_prune_latest();
    test_resolve();
    test_load();
    MPI_Barrier(MPI_COMM_WORLD);
    test_damaged();
    MPI_Barrier(MPI_COMM_WORLD);

    const char *keep = getenv("SHARDLM_CKPT_KEEP");
    if (g_rank == 0 && !(keep && strcmp(keep, "1") == 0))
        nftw(g_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    int local = check_status(), any = 0;
    MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    free(g_model_json);
    MPI_Finalize();
    return any;
}
