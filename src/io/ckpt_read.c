/*
 * ckpt_read — loading a checkpoint (see ckpt.h for the layout and
 * contracts): opening it and checking its format, the root attributes, and
 * range reads of datasets after checking their shape, every checksummed piece
 * the range overlaps verified. Contiguous datasets are read straight from the
 * file (rawio.h); format-1 chunked ones through HDF5, which checks their
 * Fletcher32 itself. Every damage ends the process through fail_input.
 */
#include "ckpt_internal.h"
#include "core/crc32c.h"
#include "core/rawio.h"
#include "core/util.h"

#include <errno.h>
#include <hdf5.h>
#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct ckpt_reader {
    hid_t file;
    struct rawio_file raw; /* for the datasets' bytes */
    int saved_world;
    char path[CKPT_MAX_PATH];
};

/* ------------------------------------------------------------------------ */
/* Selections                                                                */

/* The flat range [begin, begin+count) of a dataset of shape dims as up to 3
 * rectangular blocks (2-D: partial first row, whole middle rows, partial last
 * row; 1-D: one block), in order: block b starts at start[b], has n[b]
 * elements per dimension, and takes the next n0*n1 values of the range.
 * Reading or writing each block with a memory space of the block's own shape
 * keeps HDF5 on its fast path (with a 1-D memory space against a 2-D file
 * selection it maps every element to its chunk one by one: 10x slower). */
struct flat_blocks {
    int n;
    hsize_t start[3][2], count[3][2];
};

static void flat_blocks(int ndim, const hsize_t *dims, size_t begin, size_t count, struct flat_blocks *b)
{
    b->n = 0;
    if (count == 0)
        return;
    if (ndim == 1) {
        b->start[0][0] = begin;
        b->count[0][0] = count;
        b->start[0][1] = 0;
        b->count[0][1] = 1;
        b->n = 1;
        return;
    }
    size_t cols = dims[1], end = begin + count;
    size_t r0 = begin / cols, c0 = begin % cols, r1 = (end - 1) / cols, c1 = (end - 1) % cols;
#define ADD_BLOCK(R, C, NR, NC)                                                                    \
    do {                                                                                           \
        b->start[b->n][0] = (R), b->start[b->n][1] = (C), b->count[b->n][0] = (NR), b->count[b->n][1] = (NC); \
        b->n++;                                                                                    \
    } while (0)
    if (r0 == r1) {
        ADD_BLOCK(r0, c0, 1, count);
        return;
    }
    size_t mid_from = r0, mid_to = r1 + 1; /* rows written whole: [mid_from, mid_to) */
    if (c0 != 0) {
        ADD_BLOCK(r0, c0, 1, cols - c0);
        mid_from = r0 + 1;
    }
    if (c1 != cols - 1)
        mid_to = r1;
    if (mid_to > mid_from)
        ADD_BLOCK(mid_from, 0, mid_to - mid_from, cols);
    if (c1 != cols - 1)
        ADD_BLOCK(r1, 0, 1, c1 + 1);
#undef ADD_BLOCK
}

static void format_shape(char *out, size_t cap, int ndim, const hsize_t *dims)
{
    if (ndim == 1)
        snprintf(out, cap, "(%llu,)", (unsigned long long)dims[0]);
    else if (ndim == 2)
        snprintf(out, cap, "(%llu, %llu)", (unsigned long long)dims[0], (unsigned long long)dims[1]);
    else
        snprintf(out, cap, "(rank %d)", ndim);
}

/* ------------------------------------------------------------------------ */
/* Attributes and opening                                                    */

static void read_fail(const struct ckpt_reader *r, const char *what, const char *name)
{
    struct hdf5_why why;
    const char *msg = ckpt_hdf5_error(&why);
    fail_input("checkpoint '%s': cannot %s '%s': %s. Hint: the file is damaged; resume from an older checkpoint",
               r->path, what, name, msg);
}

static hid_t open_attr(struct ckpt_reader *r, const char *name, H5T_class_t want)
{
    htri_t exists = H5Aexists(r->file, name);
    if (exists < 0)
        read_fail(r, "look up attribute", name);
    if (!exists)
        fail_input("checkpoint '%s': attribute '%s' is missing. Hint: was it written by another program or version?",
                   r->path, name);
    hid_t attr = H5Aopen(r->file, name, H5P_DEFAULT);
    if (attr < 0)
        read_fail(r, "open attribute", name);
    hid_t type = H5Aget_type(attr);
    if (type < 0)
        read_fail(r, "read the type of attribute", name);
    H5T_class_t cls = H5Tget_class(type);
    bool vlen = cls == H5T_STRING && H5Tis_variable_str(type) > 0;
    H5Tclose(type);
    if (cls != want || vlen)
        fail_input("checkpoint '%s': attribute '%s' has the wrong type (HDF5 class %d, want %d%s)", r->path, name,
                   (int)cls, (int)want, vlen ? ", fixed-length" : "");
    return attr;
}

bool ckpt_has_attr(struct ckpt_reader *r, const char *name)
{
    htri_t exists = H5Aexists(r->file, name);
    if (exists < 0)
        read_fail(r, "look up attribute", name);
    return exists > 0;
}

int64_t ckpt_attr_i64(struct ckpt_reader *r, const char *name)
{
    hid_t attr = open_attr(r, name, H5T_INTEGER);
    int64_t value = 0;
    if (H5Aread(attr, H5T_NATIVE_INT64, &value) < 0)
        read_fail(r, "read attribute", name);
    H5Aclose(attr);
    return value;
}

double ckpt_attr_f64(struct ckpt_reader *r, const char *name)
{
    hid_t attr = open_attr(r, name, H5T_FLOAT);
    double value = 0;
    if (H5Aread(attr, H5T_NATIVE_DOUBLE, &value) < 0)
        read_fail(r, "read attribute", name);
    H5Aclose(attr);
    return value;
}

char *ckpt_attr_str(struct ckpt_reader *r, const char *name)
{
    hid_t attr = open_attr(r, name, H5T_STRING);
    hid_t type = H5Aget_type(attr);
    size_t size = type < 0 ? 0 : H5Tget_size(type);
    if (size == 0)
        read_fail(r, "read the size of attribute", name);
    char *value = xcalloc(size + 1, 1);
    if (H5Aread(attr, type, value) < 0)
        read_fail(r, "read attribute", name);
    H5Tclose(type);
    H5Aclose(attr);
    return value;
}

struct ckpt_reader *ckpt_open(const char *path)
{
    ckpt_require_mpi("ckpt_open");
    ckpt_quiet_hdf5();
    struct ckpt_reader *r = xcalloc(1, sizeof *r);
    if (snprintf(r->path, sizeof r->path, "%s", path) >= (int)sizeof r->path)
        fail_input("checkpoint path is too long: '%s'", path);
    struct stat st;
    if (stat(path, &st) != 0)
        fail_input("checkpoint '%s': cannot open: %s. Hint: check the path, or use 'auto'", path, strerror(errno));
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0 || H5Pset_fapl_mpio(fapl, MPI_COMM_WORLD, MPI_INFO_NULL) < 0)
        read_fail(r, "set up MPI-IO access for", path);
    r->file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    if (r->file < 0) {
        struct hdf5_why why;
        const char *msg = ckpt_hdf5_error(&why);
        fail_input("checkpoint '%s': cannot open as HDF5 (truncated or not a checkpoint?): %s. Hint: resume from "
                   "an older checkpoint",
                   path, msg);
    }
    H5Pclose(fapl);
    int e = rawio_open(&r->raw, path, false);
    if (e)
        fail_input("checkpoint '%s': cannot open: %s", path, strerror(e));
    char *format = ckpt_attr_str(r, "format");
    if (strcmp(format, CKPT_FORMAT) != 0)
        fail_input("checkpoint '%s': attribute 'format' is '%s', not '%s'", path, format, CKPT_FORMAT);
    free(format);
    int64_t version = ckpt_attr_i64(r, "format_version");
    if (version < 1 || version > CKPT_FORMAT_VERSION)
        fail_input("checkpoint '%s': format_version %lld is not supported (this build reads 1..%d). Hint: use the "
                   "shardlm that wrote it",
                   path, (long long)version, CKPT_FORMAT_VERSION);
    int64_t world = ckpt_attr_i64(r, "world_size");
    if (world < 1 || world > (1 << 24))
        fail_input("checkpoint '%s': attribute 'world_size' is %lld", path, (long long)world);
    r->saved_world = (int)world;
    return r;
}

void ckpt_close(struct ckpt_reader *r)
{
    if (!r)
        return;
    if (H5Fclose(r->file) < 0)
        read_fail(r, "close", r->path);
    rawio_close(&r->raw);
    free(r);
}

int ckpt_saved_world(const struct ckpt_reader *r) { return r->saved_world; }

/* ------------------------------------------------------------------------ */
/* Datasets                                                                  */

/* Opens /<group>/<name> after checking it exists, is checksummed and has
 * exactly the expected shape and element class/size. */
static hid_t open_dataset(struct ckpt_reader *r, const char *full_name, int ndim, const hsize_t *want_dims,
                          H5T_class_t want_class, size_t want_size)
{
    /* H5Lexists on a path needs every intermediate link to exist. */
    const char *slash = strchr(full_name + 1, '/');
    char group[512];
    snprintf(group, sizeof group, "%.*s", slash ? (int)(slash - full_name) : 0, full_name);
    htri_t exists = slash ? H5Lexists(r->file, group, H5P_DEFAULT) : 1;
    if (exists > 0)
        exists = H5Lexists(r->file, full_name, H5P_DEFAULT);
    if (exists < 0)
        read_fail(r, "look up dataset", full_name);
    if (!exists)
        fail_input("checkpoint '%s': dataset '%s' is missing. Hint: the checkpoint is for another model, or damaged",
                   r->path, full_name);
    hid_t dset = H5Dopen2(r->file, full_name, H5P_DEFAULT);
    if (dset < 0)
        read_fail(r, "open dataset", full_name);

    hid_t space = H5Dget_space(dset);
    int have_ndim = space < 0 ? -1 : H5Sget_simple_extent_ndims(space);
    if (have_ndim < 0)
        read_fail(r, "read the shape of dataset", full_name);
    hsize_t have_dims[H5S_MAX_RANK] = {0};
    if (have_ndim > 0 && H5Sget_simple_extent_dims(space, have_dims, NULL) < 0)
        read_fail(r, "read the shape of dataset", full_name);
    H5Sclose(space);
    bool same = have_ndim == ndim;
    for (int d = 0; same && d < ndim; d++)
        same = have_dims[d] == want_dims[d];
    if (!same) {
        char have[64], want[64];
        format_shape(have, sizeof have, have_ndim, have_dims);
        format_shape(want, sizeof want, ndim, want_dims);
        fail_input("checkpoint '%s': dataset '%s' has shape %s, the model needs %s. Hint: the checkpoint is for "
                   "another model configuration",
                   r->path, full_name, have, want);
    }

    hid_t type = H5Dget_type(dset);
    if (type < 0)
        read_fail(r, "read the element type of dataset", full_name);
    H5T_class_t cls = H5Tget_class(type);
    size_t size = H5Tget_size(type);
    H5Tclose(type);
    if (cls != want_class || size != want_size)
        fail_input("checkpoint '%s': dataset '%s' has elements of HDF5 class %d and %zu bytes, want class %d and %zu",
                   r->path, full_name, (int)cls, size, (int)want_class, want_size);

    return dset;
}

/* The checksum table of a dataset: its CRC-32C pieces, or (format 1) none
 * because HDF5 verifies its Fletcher32 chunks itself. */
struct checksums {
    int n;                 /* 0: Fletcher32-checked by HDF5 */
    struct piece *pieces;  /* n, sorted by end, the last ending at numel */
};

/* Reads attribute `name` of dset, n_want values of mem_type; returns its
 * length (n_want 0: only the length). */
static int read_table_attr(struct ckpt_reader *r, hid_t dset, const char *full_name, const char *name,
                           hid_t mem_type, int n_want, void *out)
{
    hid_t attr = H5Aopen(dset, name, H5P_DEFAULT);
    hid_t space = attr < 0 ? -1 : H5Aget_space(attr);
    hsize_t dims[1] = {0};
    if (space < 0 || H5Sget_simple_extent_ndims(space) != 1 || H5Sget_simple_extent_dims(space, dims, NULL) < 0 ||
        dims[0] < 1 || dims[0] > INT32_MAX)
        fail_input("checkpoint '%s': the checksum attribute '%s' of dataset '%s' is damaged. Hint: resume from an "
                   "older checkpoint",
                   r->path, name, full_name);
    if (n_want > 0 && (dims[0] != (hsize_t)n_want || H5Aread(attr, mem_type, out) < 0))
        fail_input("checkpoint '%s': the checksum attribute '%s' of dataset '%s' cannot be read. Hint: resume from "
                   "an older checkpoint",
                   r->path, name, full_name);
    H5Sclose(space);
    H5Aclose(attr);
    return (int)dims[0];
}

static bool has_attr(struct ckpt_reader *r, hid_t obj, const char *full_name, const char *name)
{
    htri_t exists = H5Aexists(obj, name);
    if (exists < 0)
        read_fail(r, "look up the checksums of", full_name);
    return exists > 0;
}

/* Loads the dataset's checksum table; fail_input when it has none or the
 * table does not describe the dataset's numel elements. */
static void load_checksums(struct ckpt_reader *r, hid_t dset, const char *full_name, size_t numel,
                           struct checksums *ck)
{
    ck->n = 0;
    ck->pieces = NULL;
    if (!has_attr(r, dset, full_name, CKPT_ATTR_CRC)) {
        hid_t dcpl = H5Dget_create_plist(dset);
        unsigned flags = 0, config = 0;
        size_t n_values = 0;
        char filter_name[64];
        herr_t fletcher = dcpl < 0 ? -1
                                   : H5Pget_filter_by_id2(dcpl, H5Z_FILTER_FLETCHER32, &flags, &n_values, NULL,
                                                          sizeof filter_name, filter_name, &config);
        if (dcpl >= 0)
            H5Pclose(dcpl);
        if (fletcher >= 0)
            return; /* a format-1 dataset: HDF5 checks every chunk it reads */
        H5Eclear2(H5E_DEFAULT);
        fail_input("checkpoint '%s': dataset '%s' has no checksum (no '%s' attribute), so it cannot be verified. "
                   "Hint: write checkpoints with shardlm",
                   r->path, full_name, CKPT_ATTR_CRC);
    }
    if (!has_attr(r, dset, full_name, CKPT_ATTR_CRC_ENDS))
        fail_input("checkpoint '%s': dataset '%s' has checksums but no '%s' attribute. Hint: the file is damaged; "
                   "resume from an older checkpoint",
                   r->path, full_name, CKPT_ATTR_CRC_ENDS);
    int n = read_table_attr(r, dset, full_name, CKPT_ATTR_CRC, H5T_NATIVE_UINT32, 0, NULL);
    uint32_t *crcs = xmalloc((size_t)n * sizeof *crcs);
    uint64_t *ends = xmalloc((size_t)n * sizeof *ends);
    read_table_attr(r, dset, full_name, CKPT_ATTR_CRC, H5T_NATIVE_UINT32, n, crcs);
    read_table_attr(r, dset, full_name, CKPT_ATTR_CRC_ENDS, H5T_NATIVE_UINT64, n, ends);
    bool valid = ends[n - 1] == numel && (numel > 0 || n == 1);
    for (int i = 0; valid && i < n; i++)
        valid = numel == 0 || ends[i] > (i ? ends[i - 1] : 0);
    if (!valid)
        fail_input("checkpoint '%s': the checksum pieces of dataset '%s' do not cover its %zu elements. Hint: the "
                   "file is damaged; resume from an older checkpoint",
                   r->path, full_name, numel);
    ck->n = n;
    ck->pieces = xmalloc((size_t)n * sizeof *ck->pieces);
    for (int i = 0; i < n; i++)
        ck->pieces[i] = (struct piece){.end = ends[i], .crc = crcs[i]};
    free(crcs);
    free(ends);
}

/* The file offset of a contiguous little-endian dataset whose elements are
 * mem_type's size, whose bytes can be read directly; HADDR_UNDEF otherwise
 * (chunked format-1 datasets, other byte orders: HDF5 reads those). */
static haddr_t raw_offset(hid_t dset, hid_t mem_type)
{
    hid_t dcpl = H5Dget_create_plist(dset), type = H5Dget_type(dset);
    bool raw = dcpl >= 0 && type >= 0 && H5Pget_layout(dcpl) == H5D_CONTIGUOUS &&
               H5Tget_order(type) == H5T_ORDER_LE && H5Tget_size(type) == H5Tget_size(mem_type);
    if (type >= 0)
        H5Tclose(type);
    if (dcpl >= 0)
        H5Pclose(dcpl);
    haddr_t offset = raw ? H5Dget_offset(dset) : HADDR_UNDEF;
    H5Eclear2(H5E_DEFAULT);
    return offset;
}

/* Reads [begin, begin+count) of dset into out: straight from the file when
 * the dataset is contiguous (rawio_read), else through HDF5 with one
 * independent read per block of the range, each with a memory space of the
 * block's own shape (see flat_blocks). */
static void read_blocks(struct ckpt_reader *r, hid_t dset, const char *full_name, int ndim, const hsize_t *dims,
                        hid_t mem_type, size_t begin, size_t count, void *out)
{
    if (count == 0)
        return;
    haddr_t offset = raw_offset(dset, mem_type);
    if (offset != HADDR_UNDEF) {
        size_t elem = H5Tget_size(mem_type);
        int e = rawio_read(&r->raw, out, count * elem, (off_t)(offset + begin * elem));
        if (e)
            fail_input("checkpoint '%s': dataset '%s' cannot be read (elements [%zu, %zu)): %s. Hint: the file is "
                       "truncated or damaged; resume from an older checkpoint",
                       r->path, full_name, begin, begin + count, e == RAWIO_EOF ? "the file ends before it" : strerror(e));
        return;
    }
    hid_t space = H5Dget_space(dset);
    if (space < 0)
        read_fail(r, "select a range of dataset", full_name);
    struct flat_blocks blocks;
    flat_blocks(ndim, dims, begin, count, &blocks);
    size_t elem = H5Tget_size(mem_type), done = 0;
    for (int k = 0; k < blocks.n; k++) {
        hid_t mem = H5Screate_simple(ndim, blocks.count[k], NULL);
        if (mem < 0 || H5Sselect_hyperslab(space, H5S_SELECT_SET, blocks.start[k], NULL, blocks.count[k], NULL) < 0)
            read_fail(r, "select a range of dataset", full_name);
        if (H5Dread(dset, mem_type, mem, space, H5P_DEFAULT, (char *)out + done * elem) < 0) {
            struct hdf5_why why;
            const char *msg = ckpt_hdf5_error(&why);
            fail_input("checkpoint '%s': dataset '%s' cannot be read (elements [%zu, %zu)): %s. Hint: the file "
                       "is corrupted; resume from an older checkpoint",
                       r->path, full_name, begin, begin + count, msg);
        }
        done += (size_t)(blocks.count[k][0] * (ndim == 2 ? blocks.count[k][1] : 1));
        H5Sclose(mem);
    }
    H5Sclose(space);
}

/* Checks every piece that overlaps [begin, begin+count), whose values are in
 * out: the parts of the first and last piece outside the range are read from
 * the file for it (at most two pieces, 2 * CKPT_PIECE_ELEMS elements, when
 * the file was written by shardlm). */
static void verify_range(struct ckpt_reader *r, hid_t dset, const char *full_name, int ndim, const hsize_t *dims,
                         hid_t mem_type, size_t begin, size_t count, const void *out, const struct checksums *ck)
{
    if (ck->n == 0 || count == 0)
        return;
    size_t elem = H5Tget_size(mem_type), end = begin + count;
    int lo = 0, hi = ck->n - 1; /* first piece ending after begin */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (ck->pieces[mid].end > begin)
            hi = mid;
        else
            lo = mid + 1;
    }
    for (int i = lo; i < ck->n; i++) {
        size_t from = i ? ck->pieces[i - 1].end : 0, to = ck->pieces[i].end;
        if (from >= end)
            break;
        uint32_t crc = 0;
        if (from < begin) {
            void *head = xmalloc((begin - from) * elem);
            read_blocks(r, dset, full_name, ndim, dims, mem_type, from, begin - from, head);
            crc = crc32c_extend(crc, head, (begin - from) * elem);
            free(head);
        }
        size_t in_from = from > begin ? from : begin, in_to = to < end ? to : end;
        crc = crc32c_extend(crc, (const char *)out + (in_from - begin) * elem, (in_to - in_from) * elem);
        if (to > end) {
            void *tail = xmalloc((to - end) * elem);
            read_blocks(r, dset, full_name, ndim, dims, mem_type, end, to - end, tail);
            crc = crc32c_extend(crc, tail, (to - end) * elem);
            free(tail);
        }
        if (crc != ck->pieces[i].crc)
            fail_input("checkpoint '%s': dataset '%s' fails its CRC32C check in elements [%zu, %zu) (stored %08x, "
                       "read %08x). Hint: the file is corrupted; resume from an older checkpoint",
                       r->path, full_name, from, to, ck->pieces[i].crc, crc);
    }
}

static void read_range(struct ckpt_reader *r, const char *full_name, int ndim, const hsize_t *dims,
                       H5T_class_t cls, size_t elem_size, hid_t mem_type, size_t begin, size_t count, void *out)
{
    hid_t dset = open_dataset(r, full_name, ndim, dims, cls, elem_size);
    size_t numel = ndim == 1 ? dims[0] : dims[0] * dims[1];
    if (begin > numel || count > numel - begin)
        fail_internal("checkpoint: asked for [%zu, +%zu) of '%s', which has %zu elements", begin, count, full_name,
                      numel);
    struct checksums ck;
    load_checksums(r, dset, full_name, numel, &ck);
    read_blocks(r, dset, full_name, ndim, dims, mem_type, begin, count, out);
    verify_range(r, dset, full_name, ndim, dims, mem_type, begin, count, out, &ck);
    free(ck.pieces);
    H5Dclose(dset);
}

void ckpt_read(struct ckpt_reader *r, const char *group, const char *name, int ndim, const size_t shape[2],
               size_t begin, size_t count, float *out)
{
    if (ndim < 1 || ndim > 2)
        fail_internal("checkpoint: tensor '%s' has %d dimensions (1 or 2 supported)", name, ndim);
    char full_name[512];
    snprintf(full_name, sizeof full_name, "/%s/%s", group, name);
    hsize_t dims[2] = {shape[0], ndim == 2 ? shape[1] : 0};
    read_range(r, full_name, ndim, dims, H5T_FLOAT, sizeof(float), H5T_NATIVE_FLOAT, begin, count, out);
}

void ckpt_read_slice(struct ckpt_reader *r, const char *group, const struct ckpt_slice *s, float *out)
{
    ckpt_read(r, group, s->name, s->ndim, s->shape, s->begin, s->count, out);
}

void ckpt_read_rank_state(struct ckpt_reader *r, const char *name, int n, uint64_t *out)
{
    char full_name[512];
    snprintf(full_name, sizeof full_name, "/rank_state/%s", name);
    hsize_t dims[2] = {(hsize_t)r->saved_world, (hsize_t)n};
    read_range(r, full_name, 2, dims, H5T_INTEGER, sizeof(uint64_t), H5T_NATIVE_UINT64, 0,
               (size_t)r->saved_world * (size_t)n, out);
}

