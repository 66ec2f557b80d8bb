/*
 * test_data — token shards and the loader (src/data/data.c).
 *
 * Writes shards into a fresh directory under $SHARDLM_TEST_TMP (or /tmp),
 * reads them back, checks window counts and contents for every token width,
 * that windows never cross files, that the shuffle is a deterministic
 * bijection per epoch, and that every kind of bad input ends the process with
 * exit status 2 and a one-line message naming the file (checked in a forked
 * child whose stderr goes to a pipe).
 */
#include "check.h"
#include "data/data.h"
#include "core/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_dir[1024];

static void make_test_dir(void)
{
    const char *base = getenv("SHARDLM_TEST_TMP");
    snprintf(g_dir, sizeof g_dir, "%s/test_data.XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(g_dir)) {
        fprintf(stderr, "test_data: cannot create a directory from '%s': %s\n", g_dir, strerror(errno));
        exit(1);
    }
}

static void path_in_dir(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", g_dir, name);
}

/* Writes a file with an arbitrary header and payload, for malformed shards. */
static void write_raw(const char *path, int32_t magic, int32_t version, int32_t count, const void *payload,
                      size_t payload_bytes)
{
    int32_t header[DATA_HEADER_INTS] = {0};
    header[0] = magic;
    header[1] = version;
    header[2] = count;
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(header, sizeof header, 1, fp) != 1 ||
        (payload_bytes && fwrite(payload, payload_bytes, 1, fp) != 1) || fclose(fp) != 0) {
        fprintf(stderr, "test_data: cannot write '%s': %s\n", path, strerror(errno));
        exit(1);
    }
}

static void write_bytes(const char *path, const void *bytes, size_t n)
{
    FILE *fp = fopen(path, "wb");
    if (!fp || (n && fwrite(bytes, n, 1, fp) != 1) || fclose(fp) != 0) {
        fprintf(stderr, "test_data: cannot write '%s': %s\n", path, strerror(errno));
        exit(1);
    }
}

/* Writes n tokens first, first+step, ... with data_write_bin. */
static void write_ramp(const char *path, size_t n, uint32_t first, uint32_t step, int token_bytes)
{
    uint32_t *tokens = xcalloc(n, sizeof *tokens);
    for (size_t i = 0; i < n; i++)
        tokens[i] = first + (uint32_t)i * step;
    data_write_bin(path, tokens, n, token_bytes);
    free(tokens);
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* ------------------------------------------------------------------------ */
/* Reading back                                                              */

/* Every window w of a ramp file is first + step*(w*T + i) for input i. */
static bool windows_match_ramp(const struct dataset *ds, uint32_t first, uint32_t step)
{
    size_t T = (size_t)ds->seq_len;
    int32_t *in = xcalloc(T, sizeof *in), *tg = xcalloc(T, sizeof *tg);
    bool ok = true;
    for (size_t w = 0; w < ds->n_windows && ok; w++) {
        dataset_read_window(ds, w, in, tg);
        for (size_t i = 0; i < T; i++) {
            int32_t want = (int32_t)(first + step * (uint32_t)(w * T + i));
            if (in[i] != want || tg[i] != (int32_t)(want + (int32_t)step)) {
                printf("# window %zu position %zu: input %d target %d, want %d %d\n", w, i, in[i], tg[i], want,
                       want + (int32_t)step);
                ok = false;
                break;
            }
        }
    }
    free(in);
    free(tg);
    return ok;
}

static void test_read_u16(void)
{
    char path[4200];
    path_in_dir(path, sizeof path, "u16.bin");
    write_ramp(path, 14, 1000, 1, 2);
    CHECK("write_u16_size", file_size(path) == 1024 + 14 * 2, "size %ld", file_size(path));

    struct dataset ds;
    dataset_open(&ds, path, 4, 5000, false, 0, "train data");
    CHECK("u16_token_bytes", ds.n_files == 1 && ds.files[0].token_bytes == 2, "files %d bytes %d", ds.n_files,
          ds.files[0].token_bytes);
    CHECK("u16_n_tokens", ds.files[0].n_tokens == 14, "%zu", ds.files[0].n_tokens);
    /* 14 tokens, stride 4, windows of 5: [0,5) [4,9) [8,13) */
    CHECK("u16_n_windows", ds.n_windows == 3, "got %zu, want (14-1)/4 = 3", ds.n_windows);
    CHECK("u16_contents", windows_match_ramp(&ds, 1000, 1), "see above");
    dataset_close(&ds);
    CHECK("close_zeroes", ds.files == NULL && ds.n_files == 0 && ds.n_windows == 0, "not reset");

    /* n = k*T leaves the last token without a window: 12 tokens, T = 4 -> 2. */
    const size_t counts[][2] = {{12, 2}, {13, 3}, {5, 1}, {6, 1}, {9, 2}, {4001, 1000}};
    for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
        write_ramp(path, counts[c][0], 1, 1, 2);
        dataset_open(&ds, path, 4, 5000, false, 0, "train data");
        char name[64];
        snprintf(name, sizeof name, "n_windows_%zu_tokens_T4", counts[c][0]);
        CHECK(name, ds.n_windows == counts[c][1], "got %zu, want %zu", ds.n_windows, counts[c][1]);
        dataset_close(&ds);
    }

    /* Largest uint16 id with a vocabulary of exactly 65536. */
    uint32_t top[3] = {65535, 0, 65534};
    data_write_bin(path, top, 3, 2);
    dataset_open(&ds, path, 2, 65536, false, 0, "train data");
    int32_t in[2], tg[2];
    dataset_read_window(&ds, 0, in, tg);
    CHECK("u16_top_ids", in[0] == 65535 && in[1] == 0 && tg[0] == 0 && tg[1] == 65534, "%d %d %d %d", in[0], in[1],
          tg[0], tg[1]);
    dataset_close(&ds);
}

static void test_read_u32(void)
{
    char path[4200];
    path_in_dir(path, sizeof path, "u32.bin");
    write_ramp(path, 31, 70000, 3, 4);
    CHECK("write_u32_size", file_size(path) == 1024 + 31 * 4, "size %ld", file_size(path));

    struct dataset ds;
    dataset_open(&ds, path, 6, 200000, false, 0, "train data");
    CHECK("u32_token_bytes", ds.files[0].token_bytes == 4, "%d", ds.files[0].token_bytes);
    CHECK("u32_n_windows", ds.n_windows == 5, "got %zu, want (31-1)/6 = 5", ds.n_windows);
    CHECK("u32_contents", windows_match_ramp(&ds, 70000, 3), "see above");
    dataset_close(&ds);

    /* Exactly T+1 tokens is one window. */
    write_ramp(path, 7, 5, 1, 4);
    dataset_open(&ds, path, 6, 100, false, 0, "train data");
    CHECK("exactly_T_plus_1", ds.n_windows == 1, "got %zu", ds.n_windows);
    dataset_close(&ds);
}

static void test_read_llama3(void)
{
    char path[4200];
    path_in_dir(path, sizeof path, "llama3.bin");
    uint32_t tokens[9];
    for (int i = 0; i < 9; i++)
        tokens[i] = 128000 + (uint32_t)i * 7;
    write_raw(path, DATA_MAGIC_LLMC_LLAMA3, DATA_VERSION_LLAMA3_U32, 9, tokens, sizeof tokens);
    struct dataset ds;
    dataset_open(&ds, path, 4, 128256, false, 0, "train data");
    CHECK("llama3_windows", ds.n_windows == 2 && ds.files[0].token_bytes == 4, "windows %zu bytes %d", ds.n_windows,
          ds.files[0].token_bytes);
    CHECK("llama3_contents", windows_match_ramp(&ds, 128000, 7), "see above");
    dataset_close(&ds);
}

/* Several files: sorted by name, windows never cross a file boundary, files
 * too short for a window contribute none. */
static void test_glob(void)
{
    char dir[4200], path[4300], pattern[4300];
    path_in_dir(dir, sizeof dir, "glob");
    if (mkdir(dir, 0700) != 0) {
        CHECK("glob_mkdir", false, "%s", strerror(errno));
        return;
    }
    /* Written out of order so the test sees the sort. Ids encode the file in
     * the hundreds digit: a=1xx, b=2xx, c=3xx, d=4xx. */
    snprintf(path, sizeof path, "%s/shard_c.bin", dir);
    write_ramp(path, 9, 300, 1, 2);
    snprintf(path, sizeof path, "%s/shard_a.bin", dir);
    write_ramp(path, 10, 100, 1, 2);
    snprintf(path, sizeof path, "%s/shard_b.bin", dir);
    write_ramp(path, 3, 200, 1, 2);
    snprintf(path, sizeof path, "%s/shard_d.bin", dir);
    write_ramp(path, 2, 400, 1, 2);
    snprintf(path, sizeof path, "%s/other.txt", dir);
    write_bytes(path, "not matched", 11);

    snprintf(pattern, sizeof pattern, "%s/shard_*.bin", dir);
    struct dataset ds;
    dataset_open(&ds, pattern, 4, 1000, false, 0, "train data");
    CHECK("glob_n_files", ds.n_files == 4, "got %d", ds.n_files);
    bool sorted = ds.n_files == 4 && strstr(ds.files[0].path, "shard_a") && strstr(ds.files[1].path, "shard_b") &&
                  strstr(ds.files[2].path, "shard_c") && strstr(ds.files[3].path, "shard_d");
    CHECK("glob_sorted", sorted, "files not in name order");
    /* a: (10-1)/4 = 2, b: 3 < 5 -> 0, c: (9-1)/4 = 2, d: 0 */
    CHECK("glob_n_windows", ds.n_windows == 4, "got %zu", ds.n_windows);
    CHECK("glob_first_window", ds.files[0].first_window == 0 && ds.files[2].first_window == 2 &&
                                   ds.files[2].n_windows == 2 && ds.files[1].n_windows == 0,
          "a %zu+%zu b %zu+%zu c %zu+%zu", ds.files[0].first_window, ds.files[0].n_windows, ds.files[1].first_window,
          ds.files[1].n_windows, ds.files[2].first_window, ds.files[2].n_windows);

    const int32_t want_first[4] = {100, 104, 300, 304};
    bool within = true, starts = true;
    for (size_t w = 0; w < ds.n_windows && w < 4; w++) {
        int32_t in[4], tg[4];
        dataset_read_window(&ds, w, in, tg);
        starts &= in[0] == want_first[w];
        for (int i = 0; i < 4; i++) {
            within &= in[i] / 100 == want_first[w] / 100 && tg[i] / 100 == want_first[w] / 100;
            within &= tg[i] == in[i] + 1;
        }
    }
    CHECK("glob_window_starts", starts, "a window starts at the wrong token");
    CHECK("glob_no_cross_file", within, "a window mixes tokens of two files");

    /* A batch in shuffled order equals the windows it names, across an epoch edge. */
    dataset_close(&ds);
    dataset_open(&ds, pattern, 4, 1000, true, 42, "train data");
    enum { B = 6 };
    int32_t in[B * 4], tg[B * 4], in1[4], tg1[4];
    dataset_read_batch(&ds, 2, B, in, tg);
    bool same = true;
    for (int b = 0; b < B; b++) {
        dataset_read_window(&ds, dataset_window(&ds, 2 + (uint64_t)b), in1, tg1);
        same &= memcmp(in + b * 4, in1, sizeof in1) == 0 && memcmp(tg + b * 4, tg1, sizeof tg1) == 0;
    }
    CHECK("batch_matches_windows", same, "dataset_read_batch row differs from dataset_read_window");
    dataset_close(&ds);
}

/* ------------------------------------------------------------------------ */
/* The permutation                                                           */

static struct dataset order_only(size_t S, bool shuffle, uint64_t seed)
{
    /* dataset_window reads only these fields. */
    struct dataset ds = {0};
    ds.n_windows = S;
    ds.shuffle = shuffle;
    ds.seed = seed;
    return ds;
}

static void test_permutation(void)
{
    const size_t sizes[] = {1, 2, 3, 7, 64, 1000, 1025};
    char name[64];
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        size_t S = sizes[si];
        struct dataset ds = order_only(S, true, 1234);
        unsigned char *seen = xcalloc(S, 1);
        bool bijection = true, in_range = true;
        for (uint64_t e = 0; e < 3; e++) {
            memset(seen, 0, S);
            for (uint64_t i = 0; i < S; i++) {
                size_t w = dataset_window(&ds, e * S + i);
                if (w >= S) {
                    in_range = false;
                    continue;
                }
                seen[w]++;
            }
            for (size_t w = 0; w < S; w++)
                bijection &= seen[w] == 1;
        }
        free(seen);
        snprintf(name, sizeof name, "perm_in_range_S%zu", S);
        CHECK(name, in_range, "a window index >= S");
        snprintf(name, sizeof name, "perm_bijection_S%zu", S);
        CHECK(name, bijection, "some window not visited exactly once per epoch");
    }

    /* S = 1000: differs between epochs and seeds, is not the identity, and is
     * a pure function of (seed, k). Chance agreement at a position is 1/1000,
     * so 50 agreements out of 1000 would mean the keys are not mixing. */
    size_t S = 1000;
    struct dataset a = order_only(S, true, 1), a2 = order_only(S, true, 1), b = order_only(S, true, 2);
    int same_epoch = 0, same_seed = 0, fixed = 0, deterministic = 1;
    for (uint64_t i = 0; i < S; i++) {
        size_t w0 = dataset_window(&a, i);
        same_epoch += w0 == dataset_window(&a, S + i);
        same_seed += w0 == dataset_window(&b, i);
        fixed += w0 == i;
        deterministic &= w0 == dataset_window(&a2, i) && w0 == dataset_window(&a, i);
    }
    CHECK("perm_differs_between_epochs", same_epoch < 50, "%d of 1000 positions equal", same_epoch);
    CHECK("perm_differs_between_seeds", same_seed < 50, "%d of 1000 positions equal", same_seed);
    CHECK("perm_not_identity", fixed < 50, "%d fixed points", fixed);
    CHECK("perm_deterministic", deterministic, "same seed and k gave different windows");

    /* Far into training and on a huge data set: still in range. */
    struct dataset huge = order_only((size_t)1 << 40 | 3, true, 7);
    bool huge_ok = true;
    for (uint64_t k = 0; k < 1000; k++)
        huge_ok &= dataset_window(&huge, k * 0x9E3779B97ull) < huge.n_windows;
    CHECK("perm_large_S_in_range", huge_ok, "index out of range");

    struct dataset plain = order_only(7, false, 99);
    bool in_order = true;
    for (uint64_t k = 0; k < 30; k++)
        in_order &= dataset_window(&plain, k) == k % 7;
    CHECK("no_shuffle_in_order", in_order, "unshuffled order is not k mod S");
}

/* ------------------------------------------------------------------------ */
/* Bad input: a forked child, stderr captured                                */

struct open_args {
    const char *path;
    int seq_len, vocab_size;
};

static void child_open(const void *arg)
{
    const struct open_args *a = arg;
    struct dataset ds;
    dataset_open(&ds, a->path, a->seq_len, a->vocab_size, true, 1, "train data");
    dataset_close(&ds);
}

struct write_args {
    const char *path;
    const uint32_t *tokens;
    size_t n;
    int token_bytes;
};

static void child_write(const void *arg)
{
    const struct write_args *a = arg;
    data_write_bin(a->path, a->tokens, a->n, a->token_bytes);
}

/* Exit status 2, one line "shardlm: error: ...", naming the file and
 * containing phrase1 and, when not NULL, phrase2. */
static void check_error(const char *name, int status, const char *msg, const char *file, const char *phrase1,
                        const char *phrase2)
{
    char check_name[128];
    printf("# %s: %s", name, msg[0] ? msg : "(no stderr)\n"); /* for the log */
    snprintf(check_name, sizeof check_name, "%s_exit_status", name);
    CHECK(check_name, status == EXIT_BAD_INPUT, "exit status %d, want 2; stderr: %s", status, msg);
    const char *line = strstr(msg, "shardlm: error: ");
    /* At most a warning line may come before it (a file with no windows). */
    bool one_line = line && strchr(line, '\n') && strchr(line, '\n')[1] == 0;
    snprintf(check_name, sizeof check_name, "%s_one_line", name);
    CHECK(check_name, one_line, "want one 'shardlm: error:' line at the end; stderr: %s", msg);
    snprintf(check_name, sizeof check_name, "%s_names_file", name);
    CHECK(check_name, line && strstr(line, file), "'%s' not in: %s", file, msg);
    snprintf(check_name, sizeof check_name, "%s_says_why", name);
    CHECK(check_name, line && strstr(line, phrase1) && (!phrase2 || strstr(line, phrase2)),
          "want '%s'%s%s in: %s", phrase1, phrase2 ? " and " : "", phrase2 ? phrase2 : "", msg);
}

static void expect_open_error(const char *name, const char *path, int seq_len, int vocab_size, const char *file,
                              const char *phrase1, const char *phrase2)
{
    char msg[8192];
    struct open_args a = {path, seq_len, vocab_size};
    int status = check_run_child(child_open, &a, msg, sizeof msg);
    check_error(name, status, msg, file, phrase1, phrase2);
}

static void test_bad_input(void)
{
    char path[4200], pattern[4200];
    uint16_t ok_tokens[40];
    for (int i = 0; i < 40; i++)
        ok_tokens[i] = (uint16_t)i;

    path_in_dir(path, sizeof path, "missing.bin");
    expect_open_error("missing_file", path, 4, 100, "missing.bin", "No such file", NULL);

    path_in_dir(pattern, sizeof pattern, "nomatch_*.bin");
    expect_open_error("no_glob_match", pattern, 4, 100, "nomatch_*.bin", "no file matches", NULL);

    path_in_dir(path, sizeof path, "empty.bin");
    write_bytes(path, "", 0);
    expect_open_error("empty_file", path, 4, 100, "empty.bin", "is empty", NULL);

    path_in_dir(path, sizeof path, "short.bin");
    char junk[100];
    memset(junk, 'x', sizeof junk);
    write_bytes(path, junk, sizeof junk);
    expect_open_error("short_file", path, 4, 100, "short.bin", "shorter than the 1024-byte", NULL);

    path_in_dir(path, sizeof path, "magic.bin");
    write_raw(path, 12345, 1, 40, ok_tokens, sizeof ok_tokens);
    expect_open_error("bad_magic", path, 4, 100, "magic.bin", "not an llm.c token shard (magic 12345",
                      "expected 20240520");

    path_in_dir(path, sizeof path, "version.bin");
    write_raw(path, DATA_MAGIC_LLMC, 3, 40, ok_tokens, sizeof ok_tokens);
    expect_open_error("bad_version", path, 4, 100, "version.bin", "unsupported version 3", NULL);

    path_in_dir(path, sizeof path, "llama_v1.bin");
    write_raw(path, DATA_MAGIC_LLMC_LLAMA3, 1, 20, ok_tokens, sizeof ok_tokens);
    expect_open_error("bad_version_llama3", path, 4, 100, "llama_v1.bin", "unsupported version 1", NULL);

    path_in_dir(path, sizeof path, "truncated.bin");
    write_raw(path, DATA_MAGIC_LLMC, DATA_VERSION_U16, 100, ok_tokens, sizeof ok_tokens);
    expect_open_error("truncated", path, 4, 100, "truncated.bin", "header says 100 tokens",
                      "file holds 40");

    path_in_dir(path, sizeof path, "trailing.bin");
    write_raw(path, DATA_MAGIC_LLMC, DATA_VERSION_U16, 30, ok_tokens, sizeof ok_tokens);
    expect_open_error("trailing_bytes", path, 4, 100, "trailing.bin", "corrupt", NULL);

    path_in_dir(path, sizeof path, "negative.bin");
    write_raw(path, DATA_MAGIC_LLMC, DATA_VERSION_U16, -5, ok_tokens, sizeof ok_tokens);
    expect_open_error("negative_count", path, 4, 100, "negative.bin", "negative token count", NULL);

    path_in_dir(path, sizeof path, "vocab.bin");
    uint16_t bad_tokens[40];
    memcpy(bad_tokens, ok_tokens, sizeof bad_tokens);
    bad_tokens[5] = 77;
    bad_tokens[9] = 99;
    write_raw(path, DATA_MAGIC_LLMC, DATA_VERSION_U16, 40, bad_tokens, sizeof bad_tokens);
    expect_open_error("token_over_vocab", path, 4, 50, "vocab.bin", "token 77 at position 5",
                      "vocabulary size 50");

    path_in_dir(path, sizeof path, "vocab32.bin");
    uint32_t bad32[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 70000};
    data_write_bin(path, bad32, 12, 4);
    expect_open_error("token_over_vocab_u32", path, 4, 65536, "vocab32.bin", "token 70000 at position 11",
                      "tokenizer");

    path_in_dir(path, sizeof path, "few.bin");
    write_raw(path, DATA_MAGIC_LLMC, DATA_VERSION_U16, 5, ok_tokens, 5 * sizeof *ok_tokens);
    expect_open_error("too_few_tokens", path, 8, 100, "few.bin", "need at least T+1", "9 tokens");

    /* seq_len T tokens exactly is still one short. */
    path_in_dir(path, sizeof path, "few_T.bin");
    write_raw(path, DATA_MAGIC_LLMC, DATA_VERSION_U16, 8, ok_tokens, 8 * sizeof *ok_tokens);
    expect_open_error("exactly_T_tokens", path, 8, 100, "few_T.bin", "need at least T+1", NULL);

    expect_open_error("directory", g_dir, 4, 100, g_dir, "is a directory", NULL);

    /* A bad file among good ones: the message names the bad one. */
    char dir[2048];
    path_in_dir(dir, sizeof dir, "mixed");
    if (mkdir(dir, 0700) == 0) {
        snprintf(path, sizeof path, "%s/part_0.bin", dir);
        write_raw(path, DATA_MAGIC_LLMC, DATA_VERSION_U16, 40, ok_tokens, sizeof ok_tokens);
        snprintf(path, sizeof path, "%s/part_1.bin", dir);
        write_raw(path, 999, DATA_VERSION_U16, 40, ok_tokens, sizeof ok_tokens);
        snprintf(pattern, sizeof pattern, "%s/part_*.bin", dir);
        expect_open_error("glob_bad_member", pattern, 4, 100, "part_1.bin", "not an llm.c token shard", NULL);
    }

    /* Writing: checked fwrite/fclose and a token too wide for uint16. */
    char msg[8192];
    uint32_t tokens[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    path_in_dir(path, sizeof path, "no_such_dir/out.bin");
    struct write_args w1 = {path, tokens, 8, 2};
    int status = check_run_child(child_write, &w1, msg, sizeof msg);
    check_error("write_bad_dir", status, msg, "no_such_dir/out.bin", "cannot open token shard", NULL);

    struct write_args w2 = {"/dev/full", tokens, 8, 4};
    if (access("/dev/full", W_OK) == 0) {
        status = check_run_child(child_write, &w2, msg, sizeof msg);
        check_error("write_disk_full", status, msg, "/dev/full", "cannot write token shard", "No space left");
    }

    tokens[3] = 70000;
    path_in_dir(path, sizeof path, "wide.bin");
    struct write_args w3 = {path, tokens, 8, 2};
    status = check_run_child(child_write, &w3, msg, sizeof msg);
    check_error("write_u16_overflow", status, msg, "wide.bin", "token 70000 at position 3", "uint16");

    /* The harness itself: an accepted input exits 0, so the checks above can fail. */
    path_in_dir(path, sizeof path, "good.bin");
    write_raw(path, DATA_MAGIC_LLMC, DATA_VERSION_U16, 40, ok_tokens, sizeof ok_tokens);
    struct open_args good = {path, 4, 100};
    status = check_run_child(child_open, &good, msg, sizeof msg);
    CHECK("child_good_input_exits_0", status == 0 && msg[0] == 0, "status %d stderr: %s", status, msg);
}

int main(void)
{
    make_test_dir();
    test_read_u16();
    test_read_u32();
    test_read_llama3();
    test_glob();
    test_permutation();
    test_bad_input();
    return check_status();
}
