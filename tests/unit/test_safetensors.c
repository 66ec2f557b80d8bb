/*
 * test_safetensors — Hugging Face weight files (src/io/safetensors.c).
 *
 * Writes models with st_layout_plan / st_create / st_write / st_publish into
 * fresh directories under $SHARDLM_TEST_TMP (or /tmp) and reads them back
 * bitwise for F32, F16 and BF16, with the stored bits checked against known
 * roundings (ties to even, overflow to inf); checks the multi-file layout
 * (split points, a tensor too big for a file alone in its own, names, index);
 * reads sub-ranges, across the 4 MiB staging chunk too, and the bytes_read
 * count; reads a file written by hand (not by the writer) with an unpadded
 * header, a scalar and an empty tensor; checks the progress a read reports
 * (rawio_read_landed: every reported prefix already holds the file's bytes,
 * over several bounce buffers and unaligned ends); and refuses, in a forked child with
 * exit status 2 and one line naming the file and the tensor, every bad input
 * st_open must catch before reading data.
 */
#include "check.h"
#include "core/dtype.h"
#include "core/rawio.h"
#include "io/safetensors.h"
#include "core/util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[1024];

static void make_test_dir(void)
{
    const char *base = getenv("SHARDLM_TEST_TMP");
    snprintf(g_dir, sizeof g_dir, "%s/test_safetensors.XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(g_dir)) {
        fprintf(stderr, "test_safetensors: cannot create a directory from '%s': %s\n", g_dir, strerror(errno));
        exit(1);
    }
}

/* A fresh directory g_dir/NAME for one case. */
static const char *case_dir(const char *name)
{
    static char path[2048];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    if (mkdir(path, 0755) != 0) {
        fprintf(stderr, "test_safetensors: cannot create '%s': %s\n", path, strerror(errno));
        exit(1);
    }
    return path;
}

static void write_bytes(const char *path, const void *bytes, size_t n)
{
    FILE *fp = fopen(path, "wb");
    if (!fp || (n && fwrite(bytes, n, 1, fp) != 1) || fclose(fp) != 0) {
        fprintf(stderr, "test_safetensors: cannot write '%s': %s\n", path, strerror(errno));
        exit(1);
    }
}

static void write_text(const char *dir, const char *name, const char *text)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    write_bytes(path, text, strlen(text));
}

/* DIR/NAME: the 8-byte length field, the header text, then data_len bytes of
 * data (0x11, 0x22, ... unless data is given). */
static void write_st_raw(const char *dir, const char *name, uint64_t length_field, const char *header,
                         const void *data, size_t data_len)
{
    size_t hlen = strlen(header);
    char *buf = xmalloc(8 + hlen + data_len);
    memcpy(buf, &length_field, 8);
    memcpy(buf + 8, header, hlen);
    for (size_t i = 0; i < data_len; i++)
        buf[8 + hlen + i] = data ? ((const char *)data)[i] : (char)(0x11 * (i % 15 + 1));
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    write_bytes(path, buf, 8 + hlen + data_len);
    free(buf);
}

static void write_st(const char *dir, const char *name, const char *header, size_t data_len)
{
    write_st_raw(dir, name, strlen(header), header, NULL, data_len);
}

static bool exists(const char *dir, const char *name)
{
    char path[4096];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &sb) == 0;
}

static long file_size(const char *dir, const char *name)
{
    char path[4096];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

static void read_file_at(const char *path, void *buf, size_t n, uint64_t at)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? pread(fd, buf, n, (off_t)at) : -1;
    if (fd >= 0)
        close(fd);
    if (got != (ssize_t)n) {
        fprintf(stderr, "test_safetensors: cannot read %zu bytes of '%s'\n", n, path);
        exit(1);
    }
}

/* The whole model through the writer, as ranks would: rank 0 creates, then
 * each tensor is written in two ranges, the second first. */
static void export_model(const struct st_layout *L, const char *dir, float *const *values)
{
    struct st_files fds;
    st_create(L, dir, 1, &fds);
    for (int i = 0; i < L->n_tensors; i++) {
        size_t half = L->tensors[i].numel / 2;
        st_write(L, &fds, i, half, L->tensors[i].numel - half, values[i] + half);
        st_write(L, &fds, i, 0, half, values[i]);
    }
    st_close_files(L, &fds);
    st_publish(L, dir);
}

/* fp32 -> dt -> fp32 through the scalar conversions (the expected read-back). */
static float through(float x, enum dtype dt)
{
    switch (dt) {
    case DTYPE_F16: return f16_to_f32(f32_to_f16(x));
    case DTYPE_BF16: return bf16_to_f32(f32_to_bf16(x));
    case DTYPE_F32: break;
    }
    return x;
}

/* ------------------------------------------------------------------------ */
/* Round trip                                                               */

/* Values whose rounding is known: an exact value, ties that go to even, one
 * above a tie, the largest finite values and what overflows, subnormals, -0,
 * inf, a NaN with a payload. */
static const float SPECIAL[] = {
    1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, -2.5f, 65504.0f, 65520.0f,
    0x1p-24f, 0x1p-133f, -0.0f, INFINITY, 3.0e38f, 0.1f, -1.0e-3f,
};
#define N_SPECIAL (sizeof SPECIAL / sizeof *SPECIAL)

/* The stored bits of SPECIAL in F16 and BF16, worked out by hand (and equal
 * to numpy's float16 and torch's bfloat16 conversions). */
static const uint16_t SPECIAL_F16[N_SPECIAL] = {
    0x3c00, 0x3c04, 0x3c0c, 0x3c00 /* tie to even, down */, 0x3c02 /* tie to even, up */, 0xc100, 0x7bff,
    0x7c00 /* 65520 rounds past 65504 */, 0x0001, 0x0000 /* below half the smallest subnormal */, 0x8000, 0x7c00,
    0x7c00, 0x2e66, 0x9419,
};
static const uint16_t SPECIAL_BF16[N_SPECIAL] = {
    0x3f80, 0x3f80 /* tie to even, down */, 0x3f82 /* tie to even, up */, 0x3f80, 0x3f80, 0xc020,
    0x4780 /* 65504 -> 65536 */, 0x4780, 0x3380, 0x0001 /* a subnormal, kept */, 0x8000, 0x7f80, 0x7f62, 0x3dcd, 0xba83,
};

static void test_round_trip(enum dtype dt)
{
    char name[64], dir_name[32];
    snprintf(dir_name, sizeof dir_name, "round_trip_%s", dtype_name(dt));
    const char *dir = case_dir(dir_name);
    enum { ROWS = 5, COLS = 31 };
    float *matrix = xcalloc(ROWS * COLS, sizeof *matrix), *vector = xcalloc(N_SPECIAL + 1, sizeof *vector);
    uint64_t rng = 7;
    for (size_t i = 0; i < ROWS * COLS; i++)
        matrix[i] = rng_normal(&rng) * 3.0f;
    memcpy(vector, SPECIAL, sizeof SPECIAL);
    vector[N_SPECIAL] = f32_from_bits(0x7fa12345u); /* a signalling NaN with a payload */
    const struct st_out outs[] = {
        {"model.layers.0.mlp.up_proj.weight", 2, {ROWS, COLS}},
        {"model.embed_tokens.weight", 1, {N_SPECIAL + 1, 0}},
    };
    float *values[] = {matrix, vector};
    struct st_layout L;
    st_layout_plan(&L, outs, 2, dt, 0);
    snprintf(name, sizeof name, "%s_one_file", dir_name);
    CHECK(name, L.n_files == 1 && strcmp(L.file_names[0], "model.safetensors") == 0 && L.tensors[1].file == 0,
          "%d files, first '%s'", L.n_files, L.file_names[0]);
    export_model(&L, dir, values);

    snprintf(name, sizeof name, "%s_published", dir_name);
    CHECK(name, exists(dir, "model.safetensors") && !exists(dir, "model.safetensors.tmp") &&
                    !exists(dir, "model.safetensors.index.json"),
          "want model.safetensors only");
    snprintf(name, sizeof name, "%s_file_size", dir_name);
    size_t esize = (size_t)dtype_size(dt);
    long want_size = 8 + (long)L.header_lens[0] + (long)((ROWS * COLS + N_SPECIAL + 1) * esize);
    CHECK(name, file_size(dir, "model.safetensors") == want_size && (uint64_t)want_size == L.file_sizes[0],
          "%ld bytes, want %ld (layout %llu)", file_size(dir, "model.safetensors"), want_size,
          (unsigned long long)L.file_sizes[0]);

    /* The header as the Python library writes it: length, JSON, space padding. */
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    uint64_t hlen;
    read_file_at(path, &hlen, 8, 0);
    char *header = xcalloc(hlen + 1, 1);
    read_file_at(path, header, hlen, 8);
    json_error_t err;
    json_t *root = json_loadb(header, hlen, 0, &err);
    json_t *up = json_object_get(root, "model.layers.0.mlp.up_proj.weight");
    snprintf(name, sizeof name, "%s_header", dir_name);
    CHECK(name, hlen % 8 == 0 && hlen == L.header_lens[0] && root &&
                    strcmp(json_string_value(json_object_get(json_object_get(root, "__metadata__"), "format")), "pt") == 0 &&
                    strcmp(json_string_value(json_object_get(up, "dtype")),
                           dt == DTYPE_F32 ? "F32" : dt == DTYPE_F16 ? "F16" : "BF16") == 0 &&
                    json_integer_value(json_array_get(json_object_get(up, "shape"), 1)) == COLS &&
                    json_integer_value(json_array_get(json_object_get(up, "data_offsets"), 1)) ==
                        (json_int_t)(ROWS * COLS * esize),
          "header %llu bytes: %s", (unsigned long long)hlen, header);
    snprintf(name, sizeof name, "%s_header_padding", dir_name);
    size_t text_end = hlen;
    while (text_end > 0 && header[text_end - 1] == ' ')
        text_end--;
    CHECK(name, header[0] == '{' && header[text_end - 1] == '}' && hlen - text_end < 8, "header: '%s'", header);
    json_decref(root);
    free(header);

    /* The stored bits of the special values. */
    if (dt != DTYPE_F32) {
        uint16_t stored[N_SPECIAL];
        read_file_at(path, stored, sizeof stored, L.tensors[1].offset);
        const uint16_t *want = dt == DTYPE_F16 ? SPECIAL_F16 : SPECIAL_BF16;
        for (size_t i = 0; i < N_SPECIAL; i++) {
            snprintf(name, sizeof name, "%s_stored_bits_%zu", dir_name, i);
            CHECK(name, stored[i] == want[i], "%a stored as 0x%04x, want 0x%04x", (double)SPECIAL[i], stored[i],
                  want[i]);
        }
    }

    struct st_model st;
    st_open(&st, dir);
    const struct st_tensor *t_up = st_find(&st, "model.layers.0.mlp.up_proj.weight");
    const struct st_tensor *t_emb = st_find(&st, "model.embed_tokens.weight");
    snprintf(name, sizeof name, "%s_read_tensors", dir_name);
    CHECK(name, st.n_files == 1 && st.n_tensors == 2 && t_up && t_emb && t_up->dtype == dt && t_up->ndim == 2 &&
                    t_up->shape[0] == ROWS && t_up->shape[1] == COLS && t_up->numel == ROWS * COLS &&
                    t_emb->ndim == 1 && t_emb->numel == N_SPECIAL + 1 && t_up->offset == L.tensors[0].offset,
          "%d files %d tensors", st.n_files, st.n_tensors);
    snprintf(name, sizeof name, "%s_sorted_by_name", dir_name);
    CHECK(name, strcmp(st.tensors[0].name, "model.embed_tokens.weight") == 0, "first '%s'", st.tensors[0].name);
    float *back = xcalloc(ROWS * COLS, sizeof *back);
    st_read(&st, t_up, 0, ROWS * COLS, back);
    size_t bad = 0;
    for (size_t i = 0; i < ROWS * COLS; i++)
        bad += f32_bits(back[i]) != f32_bits(through(matrix[i], dt));
    snprintf(name, sizeof name, "%s_values_bitwise", dir_name);
    CHECK(name, bad == 0, "%zu of %d elements differ from the rounding of the source", bad, ROWS * COLS);
    st_read(&st, t_emb, 0, N_SPECIAL + 1, back);
    bad = 0;
    for (size_t i = 0; i < N_SPECIAL + 1; i++)
        bad += f32_bits(back[i]) != f32_bits(through(vector[i], dt));
    snprintf(name, sizeof name, "%s_special_bitwise", dir_name);
    CHECK(name, bad == 0, "%zu special values differ", bad);
    snprintf(name, sizeof name, "%s_nan_stays_nan", dir_name);
    CHECK(name, back[N_SPECIAL] != back[N_SPECIAL], "NaN read back as %g", (double)back[N_SPECIAL]);
    snprintf(name, sizeof name, "%s_bytes_read", dir_name);
    CHECK(name, st.bytes_read == (ROWS * COLS + N_SPECIAL + 1) * esize, "%llu",
          (unsigned long long)st.bytes_read);
    st_close(&st);
    CHECK(dt == DTYPE_F32 ? "close_zeroes" : dt == DTYPE_F16 ? "close_zeroes_f16" : "close_zeroes_bf16",
          st.n_tensors == 0 && st.tensors == NULL && st.fds == NULL && st.data.paths == NULL, "not reset");
    free(back);
    st_layout_free(&L);
    free(matrix);
    free(vector);
}

/* ------------------------------------------------------------------------ */
/* Several files                                                            */

static void test_multi_file(void)
{
    const char *dir = case_dir("multi");
    /* F16, 400 bytes a file: t0 + t1 fill the first exactly; t2 (600 bytes)
     * is too big for any file and gets its own; t3 + t4 share the third. */
    const struct st_out outs[] = {
        {"t0", 1, {100, 0}}, {"t1", 2, {10, 10}}, {"t2", 2, {20, 15}}, {"t3", 1, {50, 0}}, {"t4", 2, {4, 25}},
    };
    const int want_file[] = {0, 0, 1, 2, 2};
    float *values[5];
    for (int i = 0; i < 5; i++) {
        size_t n = (size_t)outs[i].shape[0] * (size_t)(outs[i].ndim == 2 ? outs[i].shape[1] : 1);
        values[i] = xcalloc(n, sizeof *values[i]);
        for (size_t k = 0; k < n; k++)
            values[i][k] = (float)(i * 1000 + (int)k) * 0.25f;
    }
    struct st_layout L;
    st_layout_plan(&L, outs, 5, DTYPE_F16, 400);
    bool files_ok = L.n_files == 3;
    for (int i = 0; i < 5 && files_ok; i++)
        files_ok = L.tensors[i].file == want_file[i];
    CHECK("multi_split", files_ok, "%d files; want t0 t1 | t2 | t3 t4", L.n_files);
    CHECK("multi_names", L.n_files == 3 && strcmp(L.file_names[0], "model-00001-of-00003.safetensors") == 0 &&
                             strcmp(L.file_names[2], "model-00003-of-00003.safetensors") == 0,
          "'%s'", L.file_names[0]);
    CHECK("multi_total_data", L.total_data == 2 * (100 + 100 + 300 + 50 + 100), "%llu",
          (unsigned long long)L.total_data);
    CHECK("multi_offsets", L.tensors[1].offset == 8 + L.header_lens[0] + 200 &&
                               L.tensors[2].offset == 8 + L.header_lens[1] && L.tensors[4].offset == 8 + L.header_lens[2] + 100,
          "offsets %llu %llu %llu", (unsigned long long)L.tensors[1].offset, (unsigned long long)L.tensors[2].offset,
          (unsigned long long)L.tensors[4].offset);

    /* A model.safetensors left by an earlier export would be loaded first. */
    write_text(dir, "model.safetensors", "stale");
    export_model(&L, dir, values);
    CHECK("multi_stale_single_removed", !exists(dir, "model.safetensors"), "model.safetensors still there");
    CHECK("multi_files_published", exists(dir, "model-00002-of-00003.safetensors") &&
                                       !exists(dir, "model-00002-of-00003.safetensors.tmp") &&
                                       file_size(dir, "model-00002-of-00003.safetensors") == (long)L.file_sizes[1],
          "size %ld, want %llu", file_size(dir, "model-00002-of-00003.safetensors"),
          (unsigned long long)L.file_sizes[1]);

    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    json_error_t err;
    json_t *index = json_load_file(path, 0, &err);
    json_t *map = json_object_get(index, "weight_map");
    CHECK("multi_index_total_size",
          index && json_integer_value(json_object_get(json_object_get(index, "metadata"), "total_size")) == 1300,
          "index: %s", index ? "total_size wrong" : err.text);
    CHECK("multi_index_weight_map", json_object_size(map) == 5 &&
                                        strcmp(json_string_value(json_object_get(map, "t2")),
                                               "model-00002-of-00003.safetensors") == 0 &&
                                        strcmp(json_string_value(json_object_get(map, "t4")),
                                               "model-00003-of-00003.safetensors") == 0,
          "%zu entries", json_object_size(map));
    json_decref(index);

    struct st_model st;
    st_open(&st, dir);
    CHECK("multi_open", st.n_files == 3 && st.n_tensors == 5 && strstr(st.paths[1], "model-00002-of-00003"),
          "%d files, %d tensors", st.n_files, st.n_tensors);
    bool same = true;
    for (int i = 0; i < 5; i++) {
        const struct st_tensor *t = st_find(&st, outs[i].name);
        if (!t || t->file != want_file[i] || t->offset != L.tensors[i].offset) {
            same = false;
            break;
        }
        float *back = xcalloc(t->numel, sizeof *back);
        st_read(&st, t, 0, t->numel, back);
        for (size_t k = 0; k < t->numel; k++)
            same &= f32_bits(back[k]) == f32_bits(through(values[i][k], DTYPE_F16));
        free(back);
    }
    CHECK("multi_read_back", same, "a tensor is in another file or reads back different values");
    CHECK("multi_bytes_read", st.bytes_read == 1300, "%llu", (unsigned long long)st.bytes_read);
    st_close(&st);

    /* Exporting one file into the same directory removes the stale index. */
    struct st_layout one;
    st_layout_plan(&one, outs, 5, DTYPE_F16, 0);
    export_model(&one, dir, values);
    CHECK("single_stale_index_removed", one.n_files == 1 && !exists(dir, "model.safetensors.index.json"),
          "index still there");
    st_open(&st, dir);
    CHECK("single_over_old_shards", st.n_files == 1 && st.n_tensors == 5, "%d files", st.n_files);
    st_close(&st);
    st_layout_free(&one);
    st_layout_free(&L);
    for (int i = 0; i < 5; i++)
        free(values[i]);
}

/* ------------------------------------------------------------------------ */
/* Ranges                                                                   */

static void test_ranges(void)
{
    const char *dir = case_dir("ranges");
    /* 2.5 M elements: 5 MB of BF16, more than one 4 MiB staging chunk. */
    enum { BIG = 2500000, SMALL = 1000 };
    const struct st_out outs[] = {{"big", 2, {2500, 1000}}, {"small", 1, {SMALL, 0}}};
    float *big = xcalloc(BIG, sizeof *big), *small = xcalloc(SMALL, sizeof *small);
    for (size_t i = 0; i < BIG; i++)
        big[i] = (float)i * 1.0e-3f - 7.0f;
    for (size_t i = 0; i < SMALL; i++)
        small[i] = 1.0f / (float)(i + 1);
    float *values[] = {big, small};
    struct st_layout L;
    st_layout_plan(&L, outs, 2, DTYPE_BF16, 0);
    export_model(&L, dir, values);

    struct st_model st;
    st_open(&st, dir);
    const struct st_tensor *t_big = st_find(&st, "big"), *t_small = st_find(&st, "small");
    float *back = xcalloc(BIG, sizeof *back);
    uint64_t want_read = 0;

    st_read(&st, t_small, 137, 500, back);
    want_read += 500 * 2;
    bool ok = true;
    for (size_t i = 0; i < 500; i++)
        ok &= f32_bits(back[i]) == f32_bits(through(small[137 + i], DTYPE_BF16));
    CHECK("range_middle", ok, "elements [137, 637) differ");
    back[0] = 42.0f;
    st_read(&st, t_small, SMALL, 0, back);
    CHECK("range_empty", back[0] == 42.0f && st.bytes_read == want_read, "an empty read changed something");
    st_read(&st, t_small, SMALL - 1, 1, back);
    want_read += 2;
    CHECK("range_last", f32_bits(back[0]) == f32_bits(through(small[SMALL - 1], DTYPE_BF16)), "got %g",
          (double)back[0]);

    /* Whole, then a range across the staging chunk boundary (2 Mi elements). */
    st_read(&st, t_big, 0, BIG, back);
    want_read += BIG * 2;
    size_t bad = 0;
    for (size_t i = 0; i < BIG; i++)
        bad += f32_bits(back[i]) != f32_bits(through(big[i], DTYPE_BF16));
    CHECK("range_whole_big", bad == 0, "%zu elements differ", bad);
    const size_t from = ((size_t)2 << 20) - 1001;
    st_read(&st, t_big, from, 4503, back);
    want_read += 4503 * 2;
    bad = 0;
    for (size_t i = 0; i < 4503; i++)
        bad += f32_bits(back[i]) != f32_bits(through(big[from + i], DTYPE_BF16));
    CHECK("range_across_chunk", bad == 0, "%zu elements differ", bad);
    CHECK("bytes_read_sum", st.bytes_read == want_read, "%llu, want %llu", (unsigned long long)st.bytes_read,
          (unsigned long long)want_read);
    st_close(&st);
    st_layout_free(&L);
    free(back);
    free(big);
    free(small);
}

/* A file written by hand, not by the writer: header not a multiple of 8, data
 * not in name order, a scalar, an empty tensor, extra metadata, an F32 whose
 * bytes are read as stored. */
static void test_foreign_file(void)
{
    const char *dir = case_dir("foreign");
    const char *header = "{\"z\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                         "\"__metadata__\":{\"format\":\"pt\",\"note\":\"x\"},"
                         "\"a\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[8,10]},"
                         "\"e\":{\"dtype\":\"F16\",\"shape\":[0,3],\"data_offsets\":[10,10]},"
                         "\"h\":{\"dtype\":\"F16\",\"shape\":[1,1,1,2],\"data_offsets\":[10,14]}}";
    unsigned char data[14];
    float z[2] = {-1.5f, 1.0e-40f};
    memcpy(data, z, 8);
    data[8] = 0xc0, data[9] = 0x40;   /* bf16 0x40c0 = 6.0 */
    data[10] = 0x00, data[11] = 0x3c; /* f16 0x3c00 = 1.0 */
    data[12] = 0x01, data[13] = 0x80; /* f16 0x8001 = -2^-24 */
    write_st_raw(dir, "model.safetensors", strlen(header), header, data, sizeof data);
    struct st_model st;
    st_open(&st, dir);
    const struct st_tensor *a = st_find(&st, "a"), *e = st_find(&st, "e"), *h = st_find(&st, "h");
    const struct st_tensor *zt = st_find(&st, "z");
    CHECK("foreign_tensors", st.n_tensors == 4 && a && e && h && zt && !st_find(&st, "__metadata__"),
          "%d tensors", st.n_tensors);
    CHECK("foreign_scalar", a && a->ndim == 0 && a->numel == 1, "ndim %d numel %zu", a ? a->ndim : -1,
          a ? a->numel : 0);
    CHECK("foreign_empty", e && e->ndim == 2 && e->numel == 0, "numel %zu", e ? e->numel : 99);
    CHECK("foreign_4d", h && h->ndim == 4 && h->numel == 2 && h->shape[3] == 2, "ndim %d", h ? h->ndim : -1);
    CHECK("find_missing", !st_find(&st, "b") && !st_find(&st, "zz") && !st_find(&st, ""), "found a missing name");
    float out[2] = {0};
    st_read(&st, a, 0, 1, out);
    CHECK("foreign_scalar_value", out[0] == 6.0f, "%g", (double)out[0]);
    st_read(&st, h, 0, 2, out);
    CHECK("foreign_f16_values", out[0] == 1.0f && out[1] == -0x1p-24f, "%g %g", (double)out[0], (double)out[1]);
    st_read(&st, zt, 0, 2, out);
    CHECK("foreign_f32_values", f32_bits(out[0]) == f32_bits(z[0]) && f32_bits(out[1]) == f32_bits(z[1]),
          "%g %g", (double)out[0], (double)out[1]);
    CHECK("foreign_bytes_read", st.bytes_read == 2 + 4 + 8, "%llu", (unsigned long long)st.bytes_read);
    st_close(&st);

    /* Both kinds in one directory: model.safetensors is the one read. */
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"q\": \"other.safetensors\"}}");
    st_open(&st, dir);
    CHECK("single_before_index", st.n_files == 1 && st.n_tensors == 4, "%d files", st.n_files);
    st_close(&st);
}

/* ------------------------------------------------------------------------ */
/* Bad input: a forked child, stderr captured                                */

static void child_open(const void *dir)
{
    struct st_model st;
    st_open(&st, dir);
    st_close(&st);
}

/* Exit status 2 and one line "shardlm: error: ..." that names file and
 * contains phrase1 and, when not NULL, phrase2 (the tensor, the dtype). */
static void check_error(const char *name, int status, const char *msg, const char *file, const char *phrase1,
                        const char *phrase2)
{
    char check_name[128];
    printf("# %s: %s", name, msg[0] ? msg : "(no stderr)\n"); /* for the log */
    const char *line = strstr(msg, "shardlm: error: ");
    snprintf(check_name, sizeof check_name, "%s_exit_status", name);
    CHECK(check_name, status == EXIT_BAD_INPUT, "exit status %d, want 2; stderr: %s", status, msg);
    snprintf(check_name, sizeof check_name, "%s_one_line", name);
    CHECK(check_name, line == msg && strchr(line, '\n') && strchr(line, '\n')[1] == 0,
          "want one 'shardlm: error:' line; stderr: %s", msg);
    snprintf(check_name, sizeof check_name, "%s_says_why", name);
    CHECK(check_name, line && strstr(line, file) && strstr(line, phrase1) && (!phrase2 || strstr(line, phrase2)),
          "want '%s', '%s'%s%s in: %s", file, phrase1, phrase2 ? " and " : "", phrase2 ? phrase2 : "", msg);
}

static void expect_open_error(const char *name, const char *dir, const char *file, const char *phrase1,
                              const char *phrase2)
{
    char msg[8192];
    int status = check_run_child(child_open, dir, msg, sizeof msg);
    check_error(name, status, msg, file, phrase1, phrase2);
}

/* One directory with one model.safetensors whose header is HEADER and whose
 * data are data_len bytes; st_open must refuse it. */
static void expect_header_error(const char *name, const char *header, size_t data_len, const char *phrase1,
                                const char *phrase2)
{
    const char *dir = case_dir(name);
    write_st(dir, "model.safetensors", header, data_len);
    expect_open_error(name, dir, "model.safetensors", phrase1, phrase2);
}

#define ENTRY(name, dtype, shape, offsets) \
    "\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":" offsets "}"

static void test_bad_headers(void)
{
    const char *dir = case_dir("no_model");
    write_text(dir, "config.json", "{}");
    expect_open_error("no_model_files", dir, "no_model", "neither model.safetensors nor", NULL);
    char missing[2048];
    snprintf(missing, sizeof missing, "%s/absent", g_dir);
    expect_open_error("no_directory", missing, "absent", "model directory", NULL);

    dir = case_dir("short_file");
    write_text(dir, "model.safetensors", "{}");
    expect_open_error("short_file", dir, "model.safetensors", "shorter than the 8-byte", NULL);

    dir = case_dir("length_past_end");
    write_st_raw(dir, "model.safetensors", 4096, "{\"__metadata__\":{}}    ", NULL, 16);
    expect_open_error("length_past_end", dir, "model.safetensors", "header length 4096 runs past the end",
                      "truncated");
    dir = case_dir("length_absurd");
    write_st_raw(dir, "model.safetensors", (uint64_t)1 << 40, "{}      ", NULL, 0);
    expect_open_error("length_absurd", dir, "model.safetensors", "over the 100000000-byte limit", NULL);

    expect_header_error("invalid_json", "{\"w\":{\"dtype\":\"F32\",", 0, "not valid JSON", NULL);
    expect_header_error("empty_header", "", 0, "not valid JSON", NULL);
    expect_header_error("header_not_object", "[1, 2]  ", 0, "not a JSON object", NULL);
    expect_header_error("duplicate_tensor", "{" ENTRY("w", "F32", "[1]", "[0,4]") "," ENTRY("w", "F32", "[1]", "[4,8]") "}",
                        8, "not valid JSON", "duplicate");
    expect_header_error("entry_not_object", "{\"w\": [1]}", 0, "'w'", "not a JSON object");
    expect_header_error("missing_dtype", "{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "'w'", "no \"dtype\"");
    expect_header_error("missing_shape", "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "'w'",
                        "no \"shape\"");
    expect_header_error("missing_offsets", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "'w'",
                        "no \"data_offsets\"");
    /* U8 is read as bytes (bitsandbytes' 4-bit weights; io/hf_bnb.h refuses a U8 weight without its quant state) */
    static const char *const unsupported[] = {"I8", "F8_E4M3", "F64", "I64", "BOOL"};
    for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++) {
        char name[64], header[256], why[64];
        snprintf(name, sizeof name, "dtype_%s", unsupported[i]);
        snprintf(header, sizeof header, "{\"model.norm.weight\":{\"dtype\":\"%s\",\"shape\":[8],\"data_offsets\":[0,8]}}",
                 unsupported[i]);
        snprintf(why, sizeof why, "dtype %s is not supported", unsupported[i]);
        expect_header_error(name, header, 8, why, "shardlm reads F32, F16 and BF16");
    }
    expect_header_error("dtype_not_string", "{" ENTRY("w", "F32", "[2]", "[0,8]") ",\"v\":{\"dtype\":5,\"shape\":[2],\"data_offsets\":[0,8]}}",
                        8, "'v'", "not a string");
    expect_header_error("size_mismatch", "{" ENTRY("model.layers.3.mlp.up_proj.weight", "F32", "[2,3]", "[0,20]") "}", 24,
                        "'model.layers.3.mlp.up_proj.weight'", "hold 20 bytes but shape [2, 3] of F32 needs 24");
    expect_header_error("size_mismatch_f16", "{" ENTRY("w", "BF16", "[4]", "[0,4]") "}", 8, "'w'", "needs 8");
    expect_header_error("negative_dim", "{" ENTRY("w", "F32", "[-1,2]", "[0,8]") "}", 8, "'w'", "dimension 0");
    expect_header_error("fractional_dim", "{" ENTRY("w", "F32", "[2.0]", "[0,8]") "}", 8, "'w'", "dimension 0");
    expect_header_error("too_many_dims", "{" ENTRY("w", "F32", "[1,1,1,1,2]", "[0,8]") "}", 8, "'w'", "5 dimensions");
    expect_header_error("numel_overflow", "{" ENTRY("w", "F32", "[4294967296,4294967296]", "[0,8]") "}", 8, "'w'",
                        "dimension 1");
    expect_header_error("offsets_reversed", "{" ENTRY("w", "F32", "[0]", "[8,4]") "}", 8, "'w'", "0 <= begin <= end");
    expect_header_error("offsets_one_number", "{" ENTRY("w", "F32", "[2]", "[8]") "}", 8, "'w'", "0 <= begin <= end");
    expect_header_error("truncated",
                        "{" ENTRY("model.layers.0.weight", "F32", "[4]", "[0,16]") "," ENTRY("model.layers.3.mlp.up_proj.weight", "F16", "[4]", "[16,24]") "}",
                        20, "'model.layers.3.mlp.up_proj.weight'", "data_offsets [16, 24) end past the file's data (20 bytes)");
    expect_header_error("overlap", "{" ENTRY("a", "F32", "[4]", "[0,16]") "," ENTRY("b", "F32", "[4]", "[8,24]") "}", 24,
                        "'a' and 'b' overlap", NULL);
    expect_header_error("overlap_same_start", "{" ENTRY("a", "F16", "[2]", "[4,8]") "," ENTRY("b", "F32", "[1]", "[4,8]") "}",
                        8, "overlap", NULL);
    char long_name[ST_MAX_NAME + 20], header[512];
    memset(long_name, 'n', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = 0;
    snprintf(header, sizeof header, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", long_name);
    expect_header_error("name_too_long", header, 4, "has a name of", NULL);
}

#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"
static const char *const shard1_header = "{" ENTRY("a", "F32", "[2]", "[0,8]") "," ENTRY("b", "F32", "[1]", "[8,12]") "}";
static const char *const shard2_header = "{" ENTRY("c", "BF16", "[2]", "[0,4]") "}";

/* A directory g_dir/NAME with SHARD1 (a, b), SHARD2 (its header and bytes
 * given; none when header is NULL) and an index of the given weight_map. */
static const char *two_shards(const char *name, const char *header2, size_t bytes2, const char *weight_map)
{
    const char *dir = case_dir(name);
    write_st(dir, SHARD1, shard1_header, 12);
    if (header2)
        write_st(dir, SHARD2, header2, bytes2);
    char index[1024];
    snprintf(index, sizeof index, "{\"metadata\":{\"total_size\":16},\"weight_map\":%s}", weight_map);
    write_text(dir, "model.safetensors.index.json", index);
    return dir;
}

static void test_bad_index(void)
{
    static const char *const full_map = "{\"a\":\"" SHARD1 "\",\"b\":\"" SHARD1 "\",\"c\":\"" SHARD2 "\"}";
    const char *dir = two_shards("index_missing_file", NULL, 0, full_map);
    expect_open_error("index_missing_file", dir, "model.safetensors.index.json", "'" SHARD2 "', which is not in",
                      "'c'");

    /* The same files complete: accepted, in index order. */
    write_st(dir, SHARD2, shard2_header, 4);
    struct st_model st;
    st_open(&st, dir);
    const struct st_tensor *c = st_find(&st, "c");
    CHECK("index_complete_opens", st.n_files == 2 && st.n_tensors == 3 && c && c->file == 1 &&
                                      strstr(st.paths[1], SHARD2),
          "%d files, %d tensors", st.n_files, st.n_tensors);
    st_close(&st);

    dir = two_shards("index_wrong_file", shard2_header, 4,
                     "{\"a\":\"" SHARD1 "\",\"b\":\"" SHARD2 "\",\"c\":\"" SHARD2 "\"}");
    expect_open_error("index_tensor_in_other_file", dir, "model.safetensors.index.json",
                      "'b' is mapped to '" SHARD2 "', but that file has no such tensor", "it is in " SHARD1);
    dir = two_shards("index_absent_tensor", shard2_header, 4, "{\"a\":\"" SHARD1 "\",\"d\":\"" SHARD2 "\"}");
    expect_open_error("index_tensor_absent", dir, "model.safetensors.index.json", "'d'", "has no such tensor");
    dir = two_shards("index_tensor_twice", "{" ENTRY("a", "BF16", "[2]", "[0,4]") "}", 4,
                     "{\"a\":\"" SHARD1 "\",\"b\":\"" SHARD2 "\"}");
    expect_open_error("tensor_in_two_files", dir, SHARD2, "'a' is in both", NULL);
    dir = two_shards("index_bad_shard", shard2_header, 3, "{\"a\":\"" SHARD1 "\",\"c\":\"" SHARD2 "\"}");
    expect_open_error("index_truncated_shard", dir, SHARD2, "'c'", "end past the file's data");

    dir = case_dir("index_invalid");
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {");
    expect_open_error("index_invalid_json", dir, "model.safetensors.index.json", "not valid JSON", NULL);
    dir = case_dir("index_no_map");
    write_text(dir, "model.safetensors.index.json", "{\"metadata\": {\"total_size\": 0}}");
    expect_open_error("index_no_weight_map", dir, "model.safetensors.index.json", "no \"weight_map\"", NULL);
    dir = case_dir("index_escape");
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"a\": \"../model.safetensors\"}}");
    expect_open_error("index_path_outside", dir, "model.safetensors.index.json", "'a' is mapped to '../model.safetensors'",
                      "not the name of a file");
}

/* A file cut short after st_open checked it: the read names file and tensor. */
static void child_read_truncated(const void *dir)
{
    struct st_model st;
    st_open(&st, dir);
    const struct st_tensor *t = st_find(&st, "w");
    if (truncate(st.paths[0], (off_t)(t->offset + 4)) != 0)
        _exit(9);
    float out[4];
    st_read(&st, t, 0, 4, out);
}

struct write_args {
    const char *dir;
    int create;
};

static void child_create(const void *arg)
{
    const struct write_args *a = arg;
    const struct st_out outs[] = {{"w", 1, {4, 0}}};
    struct st_layout L;
    st_layout_plan(&L, outs, 1, DTYPE_F32, 0);
    struct st_files fds;
    st_create(&L, a->dir, a->create, &fds);
}

static void test_bad_io(void)
{
    const char *dir = case_dir("read_truncated");
    write_st(dir, "model.safetensors", "{" ENTRY("w", "F32", "[4]", "[0,16]") "}", 16);
    char msg[8192];
    int status = check_run_child(child_read_truncated, dir, msg, sizeof msg);
    check_error("read_truncated", status, msg, "model.safetensors", "tensor 'w'", "changed after it was opened");

    char missing[2048];
    snprintf(missing, sizeof missing, "%s/absent_export", g_dir);
    struct write_args create = {missing, 1};
    status = check_run_child(child_create, &create, msg, sizeof msg);
    check_error("create_no_directory", status, msg, "model.safetensors.tmp", "cannot create", "writable");
    struct write_args open_only = {case_dir("open_before_create"), 0};
    status = check_run_child(child_create, &open_only, msg, sizeof msg);
    check_error("open_before_create", status, msg, "model.safetensors.tmp", "rank 0 creates it", NULL);
}

static uint8_t pattern_byte(size_t i) { return (uint8_t)((i * 2654435761u) >> 13); }

struct landed_check {
    const uint8_t *buf;
    size_t at, last, calls, bad;
};

static void on_landed(void *ctx, size_t k)
{
    struct landed_check *c = ctx;
    if (k <= c->last && !(k == 0 && c->calls == 0))
        c->bad++;
    for (size_t i = c->last; i < k; i++)
        c->bad += c->buf[i] != pattern_byte(c->at + i);
    c->last = k > c->last ? k : c->last;
    c->calls++;
}

static void test_read_landed(void)
{
    const char *dir = case_dir("landed");
    char path[2100];
    snprintf(path, sizeof path, "%s/bytes", dir);
    const size_t size = ((size_t)20 << 20) + 4321, at = 777, n = size - at - 1000;
    uint8_t *bytes = xmalloc(size), *buf = xcalloc(n, 1);
    for (size_t i = 0; i < size; i++)
        bytes[i] = pattern_byte(i);
    write_bytes(path, bytes, size);
    struct rawio_file f;
    int e = rawio_open(&f, path, false);
    struct landed_check c = {buf, at, 0, 0, 0};
    e = e ? e : rawio_read_landed(&f, buf, n, (off_t)at, on_landed, &c);
    rawio_close(&f);
    CHECK("read_landed", e == 0 && c.bad == 0 && c.last == n && c.calls >= 4,
          "error %d, %zu bad (not final when reported, or not growing), last %zu of %zu, %zu calls", e, c.bad, c.last,
          n, c.calls);
    free(bytes);
    free(buf);
}

int main(void)
{
    make_test_dir();
    test_round_trip(DTYPE_F32);
    test_round_trip(DTYPE_F16);
    test_round_trip(DTYPE_BF16);
    test_multi_file();
    test_ranges();
    test_foreign_file();
    test_bad_headers();
    test_bad_index();
    test_bad_io();
    test_read_landed();
    return check_status();
}
