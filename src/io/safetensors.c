/*
 * safetensors — Hugging Face weight files read and written by element ranges
 * (contract in safetensors.h).
 *
 * Reading trusts nothing in a file: every header is parsed and checked in
 * st_open (length, JSON, dtype, shape against data_offsets, offsets inside the
 * data, no overlap) before a byte of data is read, so a truncated download or
 * a quantised checkpoint is refused at start-up with a message naming the file
 * and the tensor, never found out as garbage weights mid-run. Data is read with
 * pread through a staging buffer of at most ST_IO_CHUNK_BYTES, so memory does
 * not grow with the file.
 *
 * Writing: the layout is pure computation from the tensor list, so every rank
 * knows every offset without a message; files are written as NAME.tmp and only
 * take their final names in st_publish, so a reader never sees a half-written
 * model under a name it would load. A failed export leaves NAME.tmp files that
 * the next export overwrites.
 */
#define _GNU_SOURCE /* qsort_r */
#include "safetensors.h"

#include "core/dtype.h"
#include "core/hf_json.h"
#include "core/util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data are little-endian, read and written as is");

/* The header length the Python library accepts at most (safetensors'
 * MAX_HEADER_SIZE, 100 MB): a larger one is corruption, refused before any
 * allocation of that size. */
#define ST_MAX_HEADER_BYTES 100000000ull
/* Bytes per pread/pwrite through the conversion buffer (4 MiB): bounds the
 * memory of a read or write whatever the size of the range. */
#define ST_IO_CHUNK_BYTES ((size_t)4 << 20)

#define ST_SINGLE_NAME "model.safetensors"
#define ST_INDEX_NAME "model.safetensors.index.json"
/* A name longer than this in an index is not a safetensors file of the model. */
#define ST_MAX_FILE_NAME 256

static const char *const st_dtype_names[] = {[DTYPE_F32] = "F32", [DTYPE_F16] = "F16", [DTYPE_BF16] = "BF16"};

static char *path_join(const char *dir, const char *name, const char *suffix)
{
    size_t n = strlen(dir) + strlen(name) + strlen(suffix) + 2;
    char *p = xmalloc(n);
    snprintf(p, n, "%s/%s%s", dir, name, suffix);
    return p;
}

/* pread or pwrite of all n bytes: 0, an errno, or -1 when a read meets the
 * end of the file. */
static int transfer_all(int fd, int write, void *buf, size_t n, uint64_t at)
{
    char *p = buf;
    while (n > 0) {
        ssize_t done = write ? pwrite(fd, p, n, (off_t)at) : pread(fd, p, n, (off_t)at);
        if (done < 0 && errno == EINTR)
            continue;
        if (done <= 0)
            return done < 0 ? errno : write ? EIO : -1;
        p += done, n -= (size_t)done, at += (uint64_t)done;
    }
    return 0;
}

static const char *transfer_error(int e) { return e < 0 ? "hit the end of the file" : strerror(e); }

/* The data path (rawio) of files whose paths are given, opened lazily. */
static void files_init(struct st_files *f, int n, char **paths, int write)
{
    f->n = n;
    f->paths = xmalloc((size_t)n * sizeof *f->paths);
    for (int i = 0; i < n; i++)
        f->paths[i] = xstrdup(paths[i]);
    f->write = write;
    f->current = -1;
    f->raw = RAWIO_FILE_CLOSED;
}

/* Closes the open file (fsynced first when written). */
static void files_leave(struct st_files *f)
{
    if (f->current < 0)
        return;
    const char *path = f->paths[f->current];
    if (f->write && fsync(f->raw.fd_buffered) != 0) /* O_DIRECT bypasses the cache, not the metadata */
        fail_input("%s: fsync: %s; the export did not reach the disk: free space and export again", path,
                   strerror(errno));
    int e = rawio_close(&f->raw);
    if (e)
        fail_input("%s: close: %s; %s again", path, strerror(e), f->write ? "export" : "read it");
    f->current = -1;
}

static struct rawio_file *files_get(struct st_files *f, int i)
{
    if (f->current == i)
        return &f->raw;
    files_leave(f);
    int e = rawio_open(&f->raw, f->paths[i], f->write != 0);
    if (e)
        fail_input("cannot open '%s'%s: %s; %s", f->paths[i], f->write ? " for writing" : "", strerror(e),
                   f->write ? "rank 0 creates it: the export directory must be on a filesystem every rank sees"
                            : "check the model directory");
    f->current = i;
    return &f->raw;
}

static void files_free(struct st_files *f)
{
    files_leave(f);
    for (int i = 0; i < f->n; i++)
        free(f->paths[i]);
    free(f->paths);
    memset(f, 0, sizeof *f);
    f->current = -1;
}

static void open_data(struct st_model *st) { files_init(&st->data, st->n_files, st->paths, 0); }

static void format_shape(char *out, size_t cap, const int64_t *shape, int ndim)
{
    size_t len = (size_t)snprintf(out, cap, "[");
    for (int d = 0; d < ndim && len < cap; d++)
        len += (size_t)snprintf(out + len, cap - len, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (len < cap)
        snprintf(out + len, cap - len, "]");
}

/* ------------------------------------------------------------------------ */
/* Reading: headers                                                          */

size_t st_elem_size(const struct st_tensor *t) { return t->bytes ? 1 : (size_t)dtype_size(t->dtype); }

static size_t tensor_bytes(const struct st_tensor *t) { return t->numel * st_elem_size(t); }

static struct st_tensor *append_tensor(struct st_model *st)
{
    st->tensors = xrealloc(st->tensors, (size_t)(st->n_tensors + 1) * sizeof *st->tensors);
    struct st_tensor *t = &st->tensors[st->n_tensors++];
    memset(t, 0, sizeof *t);
    return t;
}

static int parse_dtype(const char *s, enum dtype *out)
{
    for (int d = DTYPE_F32; d <= DTYPE_BF16; d++)
        if (strcmp(s, st_dtype_names[d]) == 0) {
            *out = (enum dtype)d;
            return 1;
        }
    return 0;
}

/* A non-negative JSON integer, or -1. */
static int64_t json_count(const json_t *v)
{
    return json_is_integer(v) && json_integer_value(v) >= 0 ? (int64_t)json_integer_value(v) : -1;
}

/* One entry of a header: t from NAME: {"dtype", "shape", "data_offsets"}, its
 * bytes inside the data_bytes of data that start at data_start. */
static void parse_entry(const char *path, const char *name, json_t *entry, uint64_t data_start, uint64_t data_bytes,
                        struct st_tensor *t)
{
    if (strlen(name) >= ST_MAX_NAME)
        fail_input("%s: tensor '%.60s...' has a name of %zu bytes; shardlm reads names of up to %d", path, name,
                   strlen(name), ST_MAX_NAME - 1);
    snprintf(t->name, sizeof t->name, "%s", name);
    if (!json_is_object(entry))
        fail_input("%s: tensor '%s': its header entry is not a JSON object: the file is corrupt or not safetensors; "
                   "download it again", path, name);
    static const char *const fields[] = {"dtype", "shape", "data_offsets"};
    for (int k = 0; k < 3; k++)
        if (!json_object_get(entry, fields[k]))
            fail_input("%s: tensor '%s': its header entry has no \"%s\": the file is corrupt or not safetensors; "
                       "download it again", path, name, fields[k]);

    json_t *dtype = json_object_get(entry, "dtype");
    if (!json_is_string(dtype))
        fail_input("%s: tensor '%s': \"dtype\" is not a string: the file is corrupt; download it again", path, name);
    t->bytes = strcmp(json_string_value(dtype), "U8") == 0; /* bitsandbytes' packed weights and statistics */
    if (!t->bytes && !parse_dtype(json_string_value(dtype), &t->dtype))
        fail_input("%s: tensor '%s': dtype %s is not supported: shardlm reads F32, F16 and BF16; convert the model "
                   "(for example, load it in torch and save_pretrained it in bfloat16)", path, name,
                   json_string_value(dtype));

    json_t *shape = json_object_get(entry, "shape");
    if (!json_is_array(shape))
        fail_input("%s: tensor '%s': \"shape\" is not an array: the file is corrupt; download it again", path, name);
    if (json_array_size(shape) > ST_MAX_DIMS)
        fail_input("%s: tensor '%s': shape has %zu dimensions; shardlm reads tensors of up to %d", path, name,
                   json_array_size(shape), ST_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        t->shape[d] = json_count(json_array_get(shape, (size_t)d));
        if (t->shape[d] < 0 || __builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel))
            fail_input("%s: tensor '%s': dimension %d of \"shape\" is not a count of elements: the file is corrupt; "
                       "download it again", path, name, d);
    }
    t->numel = numel;

    json_t *offsets = json_object_get(entry, "data_offsets");
    int64_t begin = json_count(json_array_get(offsets, 0)), end = json_count(json_array_get(offsets, 1));
    if (!json_is_array(offsets) || json_array_size(offsets) != 2 || begin < 0 || end < begin)
        fail_input("%s: tensor '%s': \"data_offsets\" is not [begin, end] with 0 <= begin <= end: the file is corrupt; "
                   "download it again", path, name);
    char dims[128];
    format_shape(dims, sizeof dims, t->shape, t->ndim);
    uint64_t want;
    if (__builtin_mul_overflow(numel, (uint64_t)st_elem_size(t), &want) || (uint64_t)(end - begin) != want)
        fail_input("%s: tensor '%s': data_offsets [%lld, %lld) hold %lld bytes but shape %s of %s needs %llu "
                   "(elements x %d bytes): the file is corrupt; download it again", path, name, (long long)begin,
                   (long long)end, (long long)(end - begin), dims, t->bytes ? "U8" : st_dtype_names[t->dtype],
                   (unsigned long long)want, (int)st_elem_size(t));
    if ((uint64_t)end > data_bytes)
        fail_input("%s: tensor '%s': data_offsets [%lld, %lld) end past the file's data (%llu bytes): the file is "
                   "truncated or corrupt; download it again", path, name, (long long)begin, (long long)end,
                   (unsigned long long)data_bytes);
    t->offset = data_start + (uint64_t)begin;
}

/* qsort_r's order of indices into the tensor array ctx: by offset. */
static int by_offset(const void *a, const void *b, void *ctx)
{
    const struct st_tensor *tensors = ctx;
    const struct st_tensor *x = &tensors[*(const int *)a], *y = &tensors[*(const int *)b];
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Tensors [first, st->n_tensors) are one file's: no two share a byte. */
static void check_overlaps(const struct st_model *st, int first, const char *path)
{
    int n = st->n_tensors - first;
    int *order = xcalloc((size_t)n, sizeof *order);
    int m = 0;
    for (int i = first; i < st->n_tensors; i++)
        if (tensor_bytes(&st->tensors[i]) > 0) /* an empty tensor holds no byte to share */
            order[m++] = i;
    qsort_r(order, (size_t)m, sizeof *order, by_offset, st->tensors);
    for (int k = 1; k < m; k++) {
        const struct st_tensor *prev = &st->tensors[order[k - 1]], *t = &st->tensors[order[k]];
        if (t->offset < prev->offset + tensor_bytes(prev))
            fail_input("%s: tensors '%s' and '%s' overlap in the file's data: the file is corrupt; download it again",
                       path, prev->name, t->name);
    }
    free(order);
}

/* Opens st->paths[fi], checks its header and appends its tensors. */
static void open_file(struct st_model *st, int fi)
{
    const char *path = st->paths[fi];
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* O_NONBLOCK: a FIFO is refused, not waited on */
    if (fd < 0)
        fail_input("cannot open '%s': %s; check the model directory", path, strerror(errno));
    st->fds[fi] = fd;
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        fail_input("cannot stat '%s': %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        fail_input("%s: not a regular file; give a directory of Hugging Face .safetensors files", path);
    uint64_t file_bytes = (uint64_t)sb.st_size, header_bytes = 0;
    if (file_bytes < 8)
        fail_input("%s: %llu bytes, shorter than the 8-byte header length: the file is truncated or not safetensors; "
                   "download it again", path, (unsigned long long)file_bytes);
    int e = transfer_all(fd, 0, &header_bytes, 8, 0);
    if (e)
        fail_input("%s: reading the header length: %s", path, transfer_error(e));
    if (header_bytes > ST_MAX_HEADER_BYTES)
        fail_input("%s: header length %llu is over the %llu-byte limit of safetensors: the file is corrupt or not "
                   "safetensors; download it again", path, (unsigned long long)header_bytes, ST_MAX_HEADER_BYTES);
    if (header_bytes > file_bytes - 8)
        fail_input("%s: header length %llu runs past the end of the file (%llu bytes): the file is truncated or "
                   "corrupt; download it again", path, (unsigned long long)header_bytes,
                   (unsigned long long)file_bytes);
    char *text = xmalloc((size_t)header_bytes + 1);
    if ((e = transfer_all(fd, 0, text, (size_t)header_bytes, 8)))
        fail_input("%s: reading the %llu-byte header: %s", path, (unsigned long long)header_bytes, transfer_error(e));
    json_error_t err;
    json_t *root = hf_json_loadb(text, (size_t)header_bytes, JSON_REJECT_DUPLICATES, &err);
    free(text);
    if (!root)
        fail_input("%s: the header is not valid JSON (%s, at byte %d): the file is corrupt or not safetensors; "
                   "download it again", path, err.text, err.position);
    if (!json_is_object(root))
        fail_input("%s: the header is not a JSON object: the file is corrupt or not safetensors; download it again",
                   path);

    int first = st->n_tensors;
    const char *name;
    json_t *entry;
    json_object_foreach(root, name, entry) {
        if (strcmp(name, "__metadata__") == 0)
            continue;
        struct st_tensor *t = append_tensor(st);
        parse_entry(path, name, entry, 8 + header_bytes, file_bytes - 8 - header_bytes, t);
        t->file = fi;
    }
    json_decref(root);
    check_overlaps(st, first, path);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const struct st_tensor *)a)->name, ((const struct st_tensor *)b)->name);
}

/* Sorts the tensors of every file by name; a name in two files is refused. */
static void sort_tensors(struct st_model *st)
{
    qsort(st->tensors, (size_t)st->n_tensors, sizeof *st->tensors, by_name);
    for (int i = 1; i < st->n_tensors; i++)
        if (strcmp(st->tensors[i - 1].name, st->tensors[i].name) == 0)
            fail_input("tensor '%s' is in both '%s' and '%s': the model's files do not belong together; download "
                       "the model again", st->tensors[i].name, st->paths[st->tensors[i - 1].file],
                       st->paths[st->tensors[i].file]);
}

static int file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Appends path (taken over) to st->paths unless it is there already. */
static void add_path(struct st_model *st, char *path)
{
    for (int f = 0; f < st->n_files; f++)
        if (strcmp(st->paths[f], path) == 0) {
            free(path);
            return;
        }
    st->paths = xrealloc(st->paths, (size_t)(st->n_files + 1) * sizeof *st->paths);
    st->paths[st->n_files++] = path;
}

static json_t *load_index(const char *index_path)
{
    int fd = open(index_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        fail_input("cannot open '%s': %s", index_path, strerror(errno));
    json_error_t err;
    json_t *root = hf_json_loadfd(fd, JSON_REJECT_DUPLICATES, &err);
    close(fd);
    char why[300];
    if (!root)
        fail_input("%s: %s: the download is corrupt; download it again", index_path, hf_json_why(&err, why, sizeof why));
    if (!json_is_object(json_object_get(root, "weight_map")) || json_object_size(json_object_get(root, "weight_map")) == 0)
        fail_input("%s: no \"weight_map\" object naming the file of each tensor: not a safetensors index; download "
                   "it again", index_path);
    return root;
}

/* The files the index names, in index order, each checked to exist before
 * any is read; then every mapped tensor checked to be in the file named. */
static void open_index(struct st_model *st, const char *dir, const char *index_path)
{
    json_t *root = load_index(index_path);
    json_t *map = json_object_get(root, "weight_map");
    const char *name;
    json_t *file;
    json_object_foreach(map, name, file) {
        const char *f = json_string_value(file);
        if (!f || !f[0] || strchr(f, '/') || strcmp(f, "..") == 0 || strlen(f) > ST_MAX_FILE_NAME)
            fail_input("%s: tensor '%s' is mapped to '%.80s', not the name of a file beside the index: the index is "
                       "corrupt; download it again", index_path, name, f ? f : "(not a string)");
        char *path = path_join(dir, f, "");
        if (!file_exists(path))
            fail_input("%s: tensor '%s' is in '%s', which is not in %s: the download is incomplete; download the "
                       "missing file", index_path, name, f, dir);
        add_path(st, path);
    }
    st->fds = xmalloc((size_t)st->n_files * sizeof *st->fds);
    for (int f = 0; f < st->n_files; f++)
        st->fds[f] = -1;
    for (int f = 0; f < st->n_files; f++)
        open_file(st, f);
    open_data(st);
    sort_tensors(st);
    json_object_foreach(map, name, file) {
        const struct st_tensor *t = st_find(st, name);
        const char *f = json_string_value(file);
        const char *base = t ? strrchr(st->paths[t->file], '/') + 1 : NULL;
        if (!t || strcmp(base, f) != 0)
            fail_input("%s: tensor '%s' is mapped to '%s', but that file has no such tensor%s%s: the index and the "
                       "files do not match; download the model again", index_path, name, f, t ? "; it is in " : "",
                       t ? base : "");
    }
    json_decref(root);
}

void st_open(struct st_model *st, const char *dir)
{
    memset(st, 0, sizeof *st);
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        const char *why = stat(dir, &sb) != 0 ? strerror(errno) : "not a directory";
        fail_input("model directory '%s': %s; give the directory of a Hugging Face model (config.json and its "
                   ".safetensors files)", dir, why);
    }
    char *single = path_join(dir, ST_SINGLE_NAME, ""), *index = path_join(dir, ST_INDEX_NAME, "");
    if (file_exists(single)) { /* before the index, as transformers' from_pretrained looks */
        st->n_files = 1;
        st->paths = xmalloc(sizeof *st->paths);
        st->paths[0] = single;
        st->fds = xmalloc(sizeof *st->fds);
        open_file(st, 0);
        open_data(st);
        sort_tensors(st);
    } else if (file_exists(index)) {
        free(single);
        open_index(st, dir, index);
    } else {
        struct stat lsb;
        char *tmp = path_join(dir, ST_SINGLE_NAME, ".tmp");
        if (lstat(single, &lsb) == 0) /* there, but stat cannot follow it */
            fail_input("%s: %s is a link that leads nowhere (%s); point it at the weights file", dir, ST_SINGLE_NAME,
                       stat(single, &sb) != 0 ? strerror(errno) : "not a file");
        if (file_exists(tmp))
            fail_input("%s: %s is there but not %s: a partial export (an export that did not finish); export again",
                       dir, strrchr(tmp, '/') + 1, ST_SINGLE_NAME);
        char *bin = path_join(dir, "pytorch_model.bin", ""), *bin_index = path_join(dir, "pytorch_model.bin.index.json", "");
        if (file_exists(bin) || file_exists(bin_index))
            fail_input("%s holds PyTorch pickles (pytorch_model.bin), which shardlm does not read (they run code when "
                       "loaded); convert them once: python3 -c \"import transformers as t; "
                       "t.AutoModelForCausalLM.from_pretrained('%s').save_pretrained('%s-safetensors', "
                       "safe_serialization=True)\" and copy the tokenizer files beside",
                       dir, dir, dir);
        fail_input("%s: neither %s nor %s: give the directory of a Hugging Face model saved with safetensors "
                   "(save_pretrained(..., safe_serialization=True))", dir, ST_SINGLE_NAME, ST_INDEX_NAME);
    }
    free(index);
}

void st_close(struct st_model *st)
{
    for (int f = 0; f < st->n_files; f++) {
        if (st->fds && st->fds[f] >= 0)
            close(st->fds[f]);
        free(st->paths[f]);
    }
    free(st->fds);
    if (st->data.paths)
        files_free(&st->data);
    free(st->paths);
    free(st->tensors);
    memset(st, 0, sizeof *st);
}

const struct st_tensor *st_find(const struct st_model *st, const char *name)
{
    struct st_tensor key;
    snprintf(key.name, sizeof key.name, "%s", name);
    if (strlen(name) >= sizeof key.name)
        return NULL;
    return bsearch(&key, st->tensors, (size_t)st->n_tensors, sizeof *st->tensors, by_name);
}

/* ------------------------------------------------------------------------ */
/* Reading: data                                                             */

struct landed_elems {
    void (*landed)(void *, size_t);
    void *ctx;
    size_t esize;
};

static void landed_bytes(void *c, size_t k)
{
    struct landed_elems *l = c;
    l->landed(l->ctx, k / l->esize);
}

static void read_bytes(const struct st_model *st, const struct st_tensor *t, void *buf, size_t n, uint64_t at,
                       struct landed_elems *landed)
{
    struct rawio_file *f = files_get((struct st_files *)&st->data, t->file);
    int e = landed->landed ? rawio_read_landed(f, buf, n, (off_t)at, landed_bytes, landed)
                           : rawio_read(f, buf, n, (off_t)at);
    if (e == RAWIO_EOF) /* the header was checked against the file's size when it was opened */
        fail_input("%s: tensor '%s': reading bytes [%llu, %llu): %s: the file changed after it was opened; do not "
                   "modify a model while it is being read", st->paths[t->file], t->name, (unsigned long long)at,
                   (unsigned long long)(at + n), transfer_error(e));
    if (e)
        fail_input("%s: tensor '%s': reading bytes [%llu, %llu): %s; check the disk or file system the model is on "
                   "and run again", st->paths[t->file], t->name, (unsigned long long)at, (unsigned long long)(at + n),
                   transfer_error(e));
}

static void check_range(const struct st_tensor *t, size_t begin, size_t count)
{
    if (begin > t->numel || count > t->numel - begin)
        fail_internal("st_read: elements [%zu, %zu) of '%s', which has %zu", begin, begin + count, t->name, t->numel);
}

void st_read_raw(struct st_model *st, const struct st_tensor *t, size_t begin, size_t count, void *out,
                 void (*landed)(void *ctx, size_t elems), void *ctx)
{
    check_range(t, begin, count);
    const size_t esize = st_elem_size(t);
    struct landed_elems l = {landed, ctx, esize};
    read_bytes(st, t, out, count * esize, t->offset + begin * esize, &l);
    st->bytes_read += count * esize;
}

void st_read(struct st_model *st, const struct st_tensor *t, size_t begin, size_t count, float *out)
{
    check_range(t, begin, count);
    if (t->bytes)
        fail_internal("st_read: '%s' holds bytes (U8), not values; read it with st_read_raw", t->name);
    if (t->dtype == DTYPE_F32) {
        st_read_raw(st, t, begin, count, out, NULL, NULL); /* already fp32: straight into out */
        return;
    }
    /* The half-precision bytes land in the back half of out itself, in one
     * read (rawio pipelines it), and widen in place from the front, in
     * pieces whose outputs end before their inputs begin (out[d .. d+n)
     * ends at byte 4(d + n), element d's source starts at 2(count + d):
     * n <= (count - d) / 2), so a piece's parallel conversion never reads
     * what it writes and never overwrites an element not yet widened. The
     * last few go through a small buffer. */
    enum { TAIL = 64 };
    const size_t esize = (size_t)dtype_size(t->dtype);
    char *src = (char *)out + count * (sizeof(float) - esize);
    st_read_raw(st, t, begin, count, src, NULL, NULL);
    size_t d = 0;
    while (count - d > TAIL) {
        size_t n = (count - d) / 2 < ST_IO_CHUNK_BYTES ? (count - d) / 2 : ST_IO_CHUNK_BYTES;
        dtype_convert(out + d, DTYPE_F32, src + d * esize, t->dtype, n);
        d += n;
    }
    uint16_t last[TAIL];
    memcpy(last, src + d * esize, (count - d) * esize);
    dtype_convert(out + d, DTYPE_F32, last, t->dtype, count - d);
}

/* ------------------------------------------------------------------------ */
/* Writing                                                                   */

static int by_name_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Names come from a model family's table: two alike is a bug, not input. */
static void check_distinct_names(const struct st_out *t, int n)
{
    const char **names = xcalloc((size_t)n, sizeof *names);
    for (int i = 0; i < n; i++)
        names[i] = t[i].name;
    qsort(names, (size_t)n, sizeof *names, by_name_ptr);
    for (int i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            fail_internal("st_layout_plan: tensor '%s' is listed twice", names[i]);
    free(names);
}

/* File f's header: "__metadata__" then its tensors in layout order, with
 * data_offsets relative to the data; padded with spaces to a multiple of 8. */
static void build_header(struct st_layout *L, int f, const uint64_t *data_offset)
{
    json_t *root = json_object(), *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(root, "__metadata__", meta);
    for (int i = 0; i < L->n_tensors; i++) {
        const struct st_tensor *t = &L->tensors[i];
        if (t->file != f)
            continue;
        json_t *entry = json_object(), *shape = json_array();
        json_object_set_new(entry, "dtype", json_string(st_dtype_names[L->dtype]));
        for (int d = 0; d < t->ndim; d++)
            json_array_append_new(shape, json_integer(t->shape[d]));
        json_object_set_new(entry, "shape", shape);
        json_object_set_new(entry, "data_offsets",
                            json_pack("[II]", (json_int_t)data_offset[i], (json_int_t)(data_offset[i] + tensor_bytes(t))));
        json_object_set_new(root, t->name, entry);
    }
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text)
        fail_internal("st_layout_plan: cannot serialise the header of %s", L->file_names[f]);
    size_t len = strlen(text), padded = round_up(len, 8);
    L->headers[f] = xrealloc(text, padded + 1);
    memset(L->headers[f] + len, ' ', padded - len);
    L->headers[f][padded] = 0;
    L->header_lens[f] = padded;
}

void st_layout_plan(struct st_layout *L, const struct st_out *t, int n, enum dtype dt, uint64_t max_file_bytes)
{
    memset(L, 0, sizeof *L);
    check_distinct_names(t, n);
    const uint64_t limit = max_file_bytes ? max_file_bytes : UINT64_MAX;
    L->dtype = dt;
    L->n_tensors = n;
    L->tensors = xcalloc((size_t)n, sizeof *L->tensors);
    uint64_t *data_offset = xcalloc((size_t)n, sizeof *data_offset);
    uint64_t used = 0; /* data bytes of the current file */
    int file = 0;
    for (int i = 0; i < n; i++) {
        struct st_tensor *o = &L->tensors[i];
        if (strlen(t[i].name) >= ST_MAX_NAME || t[i].ndim < 1 || t[i].ndim > 2)
            fail_internal("st_layout_plan: tensor '%s' (ndim %d): names up to %d bytes, 1 or 2 dimensions", t[i].name,
                          t[i].ndim, ST_MAX_NAME - 1);
        snprintf(o->name, sizeof o->name, "%s", t[i].name);
        o->dtype = dt;
        o->ndim = t[i].ndim;
        o->numel = 1;
        for (int d = 0; d < o->ndim; d++) {
            o->shape[d] = t[i].shape[d];
            o->numel *= (size_t)t[i].shape[d];
        }
        uint64_t bytes = tensor_bytes(o);
        if (used > 0 && used + bytes > limit) { /* as transformers shards: the current file is full */
            file++;
            used = 0;
        }
        o->file = file;
        data_offset[i] = used;
        used += bytes;
        L->total_data += bytes;
    }
    L->n_files = file + 1;
    L->file_names = xcalloc((size_t)L->n_files, sizeof *L->file_names);
    L->file_sizes = xcalloc((size_t)L->n_files, sizeof *L->file_sizes);
    L->headers = xcalloc((size_t)L->n_files, sizeof *L->headers);
    L->header_lens = xcalloc((size_t)L->n_files, sizeof *L->header_lens);
    for (int f = 0; f < L->n_files; f++) {
        if (L->n_files == 1)
            snprintf(L->file_names[f], sizeof L->file_names[f], ST_SINGLE_NAME);
        else
            snprintf(L->file_names[f], sizeof L->file_names[f], "model-%05d-of-%05d.safetensors", f + 1, L->n_files);
        build_header(L, f, data_offset);
        L->file_sizes[f] = 8 + L->header_lens[f];
    }
    for (int i = 0; i < n; i++) {
        struct st_tensor *o = &L->tensors[i];
        o->offset = 8 + L->header_lens[o->file] + data_offset[i];
        L->file_sizes[o->file] += tensor_bytes(o);
    }
    free(data_offset);
}

void st_layout_free(struct st_layout *L)
{
    for (int f = 0; f < L->n_files; f++)
        free(L->headers[f]);
    free(L->headers);
    free(L->header_lens);
    free(L->file_sizes);
    free(L->file_names);
    free(L->tensors);
    memset(L, 0, sizeof *L);
}

void st_create(const struct st_layout *L, const char *dir, int create, struct st_files *files)
{
    char **paths = xmalloc((size_t)L->n_files * sizeof *paths);
    for (int f = 0; f < L->n_files; f++) {
        paths[f] = path_join(dir, L->file_names[f], ".tmp");
        if (!create)
            continue;
        const char *path = paths[f];
        util_remove_on_failure(path); /* a failed export leaves no full-size .tmp (st_publish keeps it) */
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0)
            fail_input("cannot create '%s': %s; check that the export directory exists and is writable", path,
                       strerror(errno));
        uint64_t header_len = L->header_lens[f];
        int e = transfer_all(fd, 1, &header_len, 8, 0);
        if (!e)
            e = transfer_all(fd, 1, L->headers[f], L->header_lens[f], 8);
        if (e)
            fail_input("%s: writing the header: %s; free space on the export filesystem", path, strerror(e));
        if (ftruncate(fd, (off_t)L->file_sizes[f]) != 0)
            fail_input("%s: cannot size it to %llu bytes: %s; free space on the export filesystem", path,
                       (unsigned long long)L->file_sizes[f], strerror(errno));
        if (fsync(fd) != 0 || close(fd) != 0)
            fail_input("%s: %s; free space on the export filesystem", path, strerror(errno));
    }
    files_init(files, L->n_files, paths, 1);
    for (int f = 0; f < L->n_files; f++) {
        if (!create && access(paths[f], W_OK) != 0)
            fail_input("cannot open '%s' for writing: %s; rank 0 creates it: the export directory must be on a "
                       "filesystem every rank sees", paths[f], strerror(errno));
        free(paths[f]);
    }
    free(paths);
}

static void write_bytes(const struct st_layout *L, struct st_files *files, const struct st_tensor *t,
                        const void *buf, size_t n, uint64_t at)
{
    int e = rawio_write(files_get(files, t->file), buf, n, (off_t)at);
    if (e)
        fail_input("%s.tmp: tensor '%s': writing bytes [%llu, %llu): %s; free space on the export filesystem",
                   L->file_names[t->file], t->name, (unsigned long long)at, (unsigned long long)(at + n), strerror(e));
}

void st_write(const struct st_layout *L, struct st_files *files, int i, size_t begin, size_t count,
              const float *src)
{
    if (i < 0 || i >= L->n_tensors)
        fail_internal("st_write: tensor %d of %d", i, L->n_tensors);
    const struct st_tensor *t = &L->tensors[i];
    if (begin > t->numel || count > t->numel - begin)
        fail_internal("st_write: elements [%zu, %zu) of '%s', which has %zu", begin, begin + count, t->name, t->numel);
    const size_t esize = (size_t)dtype_size(t->dtype);
    const uint64_t at = t->offset + begin * esize;
    if (t->dtype == DTYPE_F32) {
        write_bytes(L, files, t, src, count * esize, at);
        return;
    }
    const size_t chunk = count < ST_IO_CHUNK_BYTES / esize ? count : ST_IO_CHUNK_BYTES / esize;
    void *staging = xmalloc(chunk * esize);
    for (size_t done = 0; done < count; done += chunk) {
        size_t n = count - done < chunk ? count - done : chunk;
        dtype_convert(staging, t->dtype, src + done, DTYPE_F32, n);
        write_bytes(L, files, t, staging, n * esize, at + done * esize);
    }
    free(staging);
}

void st_close_files(const struct st_layout *L, struct st_files *files)
{
    (void)L;
    files_free(files); /* the open file fsynced and closed; the others were when left */
}

static void fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0)
        fail_input("cannot sync directory '%s': %s; the export may not survive a crash: export again", dir,
                   strerror(errno));
    close(fd);
}

/* DIR/model.safetensors.index.json as transformers writes it (keys sorted,
 * indent 2), through a .tmp renamed into place. */
static void write_index(const struct st_layout *L, const char *dir)
{
    json_t *map = json_object();
    for (int i = 0; i < L->n_tensors; i++)
        json_object_set_new(map, L->tensors[i].name, json_string(L->file_names[L->tensors[i].file]));
    json_t *root = json_pack("{s{sI}so}", "metadata", "total_size", (json_int_t)L->total_data, "weight_map", map);
    char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    if (!text)
        fail_internal("st_publish: cannot serialise the index");
    json_decref(root);
    char *final = path_join(dir, ST_INDEX_NAME, ""), *tmp = path_join(dir, ST_INDEX_NAME, ".tmp");
    util_remove_on_failure(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        fail_input("cannot create '%s': %s; check that the export directory is writable", tmp, strerror(errno));
    size_t len = strlen(text);
    text[len++] = '\n'; /* the NUL's place: json.dump's files end with a newline too */
    int e = transfer_all(fd, 1, text, len, 0);
    if (e || fsync(fd) != 0 || close(fd) != 0)
        fail_input("%s: %s; free space on the export filesystem and export again", tmp, strerror(e ? e : errno));
    if (rename(tmp, final) != 0)
        fail_input("cannot rename '%s' to '%s': %s", tmp, final, strerror(errno));
    util_keep_file(tmp);
    free(text);
    free(tmp);
    free(final);
}

/* Removes DIR/NAME if it is there (ENOENT is fine). */
static void remove_stale(const char *dir, const char *name)
{
    char *path = path_join(dir, name, "");
    if (unlink(path) != 0 && errno != ENOENT)
        fail_input("cannot remove the stale '%s': %s; remove it by hand (it would be loaded instead of the export)",
                   path, strerror(errno));
    free(path);
}

void st_publish(const struct st_layout *L, const char *dir)
{
    for (int f = 0; f < L->n_files; f++) {
        char *final = path_join(dir, L->file_names[f], ""), *tmp = path_join(dir, L->file_names[f], ".tmp");
        if (rename(tmp, final) != 0)
            fail_input("cannot rename '%s' to '%s': %s; export again", tmp, final, strerror(errno));
        util_keep_file(tmp);
        free(tmp);
        free(final);
    }
    /* A loader picks model.safetensors over an index: the other kind, left by an
     * earlier export into this directory, must not stand beside this one. */
    if (L->n_files > 1) {
        write_index(L, dir);
        remove_stale(dir, ST_SINGLE_NAME);
    } else {
        remove_stale(dir, ST_INDEX_NAME);
    }
    fsync_dir(dir);
}
