/*
 * safetensors_tool — src/io/safetensors.c from the command line, for
 * tests/t_safetensors.py (which checks it against the `safetensors` Python
 * package and transformers). Built and run with the unit tests: without
 * arguments it checks its own two commands on each other.
 *
 *   safetensors_tool read DIR
 *       one JSON line per tensor, in name order: {"name", "dtype", "shape",
 *       "file" (its file's name), "bits" (the fp32 bits of each element as
 *       read)}, read in ranges of READ_PIECE elements; then a last line
 *       {"bytes_read": N, "n_files": F}.
 *   safetensors_tool write DIR DTYPE MAX_FILE_BYTES VALUES NAME=D0[xD1] ...
 *       the tensors, in the order given, from the fp32 file VALUES (their
 *       elements one after the other), as DTYPE (F32, F16, BF16) in files of
 *       at most MAX_FILE_BYTES of data (0: one file); each tensor written in
 *       ranges, last range first, as ranks would.
 */
#include "check.h"
#include "core/dtype.h"
#include "io/safetensors.h"
#include "core/util.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* Elements per st_read / st_write call: small and odd, so that ranges start
 * and end inside rows. */
#define READ_PIECE 7

static void tool_read(const char *dir)
{
    struct st_model st;
    st_open(&st, dir);
    static const char *const dtypes[] = {[DTYPE_F32] = "F32", [DTYPE_F16] = "F16", [DTYPE_BF16] = "BF16"};
    for (int i = 0; i < st.n_tensors; i++) {
        const struct st_tensor *t = &st.tensors[i];
        json_t *shape = json_array(), *bits = json_array();
        for (int d = 0; d < t->ndim; d++)
            json_array_append_new(shape, json_integer(t->shape[d]));
        float piece[READ_PIECE];
        for (size_t at = 0; at < t->numel; at += READ_PIECE) {
            size_t n = t->numel - at < READ_PIECE ? t->numel - at : READ_PIECE;
            st_read(&st, t, at, n, piece);
            for (size_t k = 0; k < n; k++)
                json_array_append_new(bits, json_integer(f32_bits(piece[k])));
        }
        json_t *line = json_pack("{sssssoss so}", "name", t->name, "dtype", dtypes[t->dtype], "shape", shape, "file",
                                 strrchr(st.paths[t->file], '/') + 1, "bits", bits);
        char *text = json_dumps(line, JSON_COMPACT);
        printf("%s\n", text);
        free(text);
        json_decref(line);
    }
    printf("{\"bytes_read\": %llu, \"n_files\": %d}\n", (unsigned long long)st.bytes_read, st.n_files);
    st_close(&st);
}

static enum dtype parse_dtype_arg(const char *s)
{
    if (strcmp(s, "F32") == 0)
        return DTYPE_F32;
    if (strcmp(s, "F16") == 0)
        return DTYPE_F16;
    if (strcmp(s, "BF16") == 0)
        return DTYPE_BF16;
    fail_input("safetensors_tool: dtype '%s': give F32, F16 or BF16", s);
}

/* NAME=D0 or NAME=D0xD1; spec is cut at the '=' (out->name points into it). */
static size_t parse_tensor_arg(char *spec, struct st_out *out)
{
    char *eq = strrchr(spec, '='), *end;
    if (!eq)
        fail_input("safetensors_tool: '%s' is not NAME=D0[xD1]", spec);
    *eq = 0;
    out->name = spec;
    out->ndim = 1;
    out->shape[0] = strtoll(eq + 1, &end, 10);
    if (*end == 'x') {
        out->ndim = 2;
        out->shape[1] = strtoll(end + 1, &end, 10);
    }
    if (*end || out->shape[0] < 0 || (out->ndim == 2 && out->shape[1] < 0))
        fail_input("safetensors_tool: shape '%s' of '%s' is not D0 or D0xD1", eq + 1, spec);
    return (size_t)out->shape[0] * (size_t)(out->ndim == 2 ? out->shape[1] : 1);
}

static void tool_write(const char *dir, enum dtype dt, uint64_t max_file_bytes, const char *values_path, int n,
                       char **specs)
{
    struct st_out *outs = xcalloc((size_t)n, sizeof *outs);
    size_t *first = xcalloc((size_t)n + 1, sizeof *first); /* element offset of each tensor in VALUES */
    for (int i = 0; i < n; i++)
        first[i + 1] = first[i] + parse_tensor_arg(specs[i], &outs[i]);
    float *values = xcalloc(first[n] + 1, sizeof *values);
    FILE *fp = xfopen(values_path, "rb", "values");
    if (fread(values, sizeof *values, first[n] + 1, fp) != first[n])
        fail_input("safetensors_tool: '%s' does not hold exactly the %zu fp32 values of the tensors", values_path,
                   first[n]);
    fclose(fp);

    struct st_layout L;
    st_layout_plan(&L, outs, n, dt, max_file_bytes);
    struct st_files fds;
    st_create(&L, dir, 1, &fds);
    for (int i = 0; i < n; i++) {
        size_t numel = first[i + 1] - first[i];
        for (size_t end = numel; end > 0;) { /* last range first */
            size_t begin = end > READ_PIECE ? end - READ_PIECE : 0;
            st_write(&L, &fds, i, begin, end - begin, values + first[i] + begin);
            end = begin;
        }
    }
    st_close_files(&L, &fds);
    st_publish(&L, dir);
    for (int f = 0; f < L.n_files; f++)
        printf("%s\n", L.file_names[f]);
    st_layout_free(&L);
    free(values);
    free(first);
    free(outs);
}

/* Without arguments: write with the write command, read it back. */
static int self_test(void)
{
    const char *base = getenv("SHARDLM_TEST_TMP");
    char dir[1024], values_path[1100];
    snprintf(dir, sizeof dir, "%s/safetensors_tool.XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "safetensors_tool: cannot create a directory from '%s': %s\n", dir, strerror(errno));
        return 1;
    }
    snprintf(values_path, sizeof values_path, "%s/values.f32", dir);
    float values[3 * 5 + 4];
    for (int i = 0; i < 19; i++)
        values[i] = (float)i - 0.375f;
    FILE *fp = xfopen(values_path, "wb", "values");
    fwrite(values, sizeof values, 1, fp);
    fclose(fp);
    char spec_a[] = "a.weight=3x5", spec_b[] = "b.bias=4";
    char *specs[] = {spec_a, spec_b};
    tool_write(dir, DTYPE_F32, 60, values_path, 2, specs); /* 60 bytes of data: two files */
    tool_read(dir);

    struct st_model st;
    st_open(&st, dir);
    const struct st_tensor *a = st_find(&st, "a.weight"), *b = st_find(&st, "b.bias");
    CHECK("tool_write_files", st.n_files == 2 && a && b && a->file == 0 && b->file == 1 && a->numel == 15 &&
                                  b->numel == 4,
          "%d files", st.n_files);
    float back[19];
    st_read(&st, a, 0, 15, back);
    st_read(&st, b, 0, 4, back + 15);
    CHECK("tool_write_values", memcmp(back, values, sizeof values) == 0, "values differ");
    st_close(&st);
    return check_status();
}

int main(int argc, char **argv)
{
    if (argc == 1)
        return self_test();
    if (argc == 3 && strcmp(argv[1], "read") == 0) {
        tool_read(argv[2]);
        return 0;
    }
    if (argc >= 6 && strcmp(argv[1], "write") == 0) {
        tool_write(argv[2], parse_dtype_arg(argv[3]), strtoull(argv[4], NULL, 10), argv[5], argc - 6, argv + 6);
        return 0;
    }
    fprintf(stderr, "usage: safetensors_tool [read DIR | write DIR DTYPE MAX_FILE_BYTES VALUES NAME=D0[xD1] ...]\n");
    return 2;
}
