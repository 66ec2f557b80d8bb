/*
 * ckpt — parallel HDF5 checkpoints (see ckpt.h for the layout and contracts).
 *
 * Every HDF5 call is checked; HDF5's own stack printing is turned off and its
 * innermost messages are folded into our one-line errors instead (so a
 * corrupted chunk reads "... data error detected by Fletcher32 checksum").
 */
#define _GNU_SOURCE /* fallocate */
#include "ckpt.h"
#include "crc32c.h"
#include "rawio.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ckpt writes values in host order into little-endian datasets: the host must be little-endian"
#endif

enum { CRASH_NONE = -1, CRASH_BEFORE_DATA, CRASH_MID_DATA, CRASH_BEFORE_RENAME, CRASH_BEFORE_LATEST };

struct ckpt_reader {
    hid_t file;
    struct rawio_file raw; /* for the datasets' bytes */
    int saved_world;
    char path[CKPT_MAX_PATH];
};

/* ------------------------------------------------------------------------ */
/* HDF5 errors                                                               */

struct hdf5_why {
    char text[512];
    int taken;
};

/* Keeps the two innermost distinct descriptions of the error stack. */
static herr_t collect_error(unsigned n, const H5E_error2_t *err, void *data)
{
    struct hdf5_why *why = data;
    if (why->taken >= 2 || !err->desc || !err->desc[0] || strstr(why->text, err->desc))
        return 0;
    size_t len = strlen(why->text);
    snprintf(why->text + len, sizeof why->text - len, "%s%s", why->taken ? "; " : "", err->desc);
    why->taken++;
    return 0;
}

/* What HDF5 said about the call that just failed (call before any other H5 call). */
static const char *hdf5_error(struct hdf5_why *why)
{
    why->text[0] = 0;
    why->taken = 0;
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_error, why);
    H5Eclear2(H5E_DEFAULT);
    if (!why->text[0])
        snprintf(why->text, sizeof why->text, "unknown HDF5 error");
    return why->text;
}

static void quiet_hdf5(void)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

static void require_mpi(const char *what)
{
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (!initialised)
        fail_internal("%s: MPI is not initialised (the checkpoint layer writes through MPI-IO)", what);
}

#define MPI_CHECK(call, what)                                                          \
    do {                                                                               \
        int _rc = (call);                                                              \
        if (_rc != MPI_SUCCESS)                                                        \
            fail_internal("checkpoint: MPI error %d while %s (%s:%d)", _rc, what, __FILE__, __LINE__); \
    } while (0)

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

static size_t shape_numel(int ndim, const size_t shape[2])
{
    return ndim == 1 ? shape[0] : shape[0] * shape[1];
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
/* Saving                                                                    */

struct writer {
    hid_t file;
    struct rawio_file raw; /* the .tmp file, for the datasets' bytes */
    const char *path; /* the temporary file */
    int rank, world;
    bool failed;      /* this rank hit an error since the last agreement */
    bool all_failed;  /* some rank failed (agreed): every later step is skipped */
    char err[1024];   /* this rank's first error; after agreement, the agreed one */
    int crash_point;  /* test hook: CRASH_* on this rank, or CRASH_NONE */
    int datasets_done, datasets_total;
};

/* Records this rank's first failure (no exit: the ranks agree on failure at
 * the next agreement point, see agree()). */
__attribute__((format(printf, 2, 3))) static void writer_error(struct writer *w, const char *fmt, ...)
{
    if (w->failed || w->all_failed)
        return;
    w->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err, sizeof w->err, fmt, ap);
    va_end(ap);
}

static void write_fail(struct writer *w, const char *what, const char *name)
{
    struct hdf5_why why;
    const char *msg = hdf5_error(&why);
    /* errno is only trusted for the reasons a write can really fail with
     * (HDF5 leaves it from whatever system call failed last). */
    int e = errno;
    bool io = e == ENOSPC || e == EFBIG || e == EDQUOT || e == EIO || e == EROFS || e == EACCES || e == EPERM ||
              e == ENOTDIR || e == EISDIR || e == ENOENT;
    writer_error(w, "cannot %s '%s': %s%s%s", what, name, msg, io ? "; " : "", io ? strerror(e) : "");
}

/* Collective: true when every rank is fine so far. Otherwise every rank gets
 * the error of the lowest failing rank and all_failed is set, so all ranks
 * skip the same remaining steps (no rank is left waiting in a collective). */
static bool agree(struct writer *w)
{
    if (w->all_failed)
        return false;
    int first = w->failed ? w->rank : w->world;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD),
              "agreeing on the checkpoint's status");
    if (first == w->world)
        return true;
    MPI_CHECK(MPI_Bcast(w->err, (int)sizeof w->err, MPI_CHAR, first, MPI_COMM_WORLD),
              "sharing the checkpoint's error");
    w->err[sizeof w->err - 1] = 0;
    w->all_failed = true;
    return false;
}

static void write_attr(struct writer *w, const struct ckpt_attr *a)
{
    if (w->failed || w->all_failed)
        return;
    hid_t space = H5Screate(H5S_SCALAR), type = -1, attr = -1;
    const void *value = NULL;
    switch (a->kind) {
    case CKPT_ATTR_I64:
        type = H5Tcopy(H5T_STD_I64LE);
        value = &a->i64;
        break;
    case CKPT_ATTR_F64:
        type = H5Tcopy(H5T_IEEE_F64LE);
        value = &a->f64;
        break;
    case CKPT_ATTR_STR: {
        const char *s = a->str ? a->str : "";
        type = H5Tcopy(H5T_C_S1);
        if (type >= 0 && (H5Tset_size(type, strlen(s) + 1) < 0 || H5Tset_strpad(type, H5T_STR_NULLTERM) < 0))
            write_fail(w, "make the string type of attribute", a->name);
        value = s;
        break;
    }
    }
    if (space < 0 || type < 0)
        write_fail(w, "make the type of attribute", a->name);
    attr = H5Acreate2(w->file, a->name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    if (attr < 0)
        write_fail(w, "create attribute", a->name);
    if (H5Awrite(attr, type, value) < 0)
        write_fail(w, "write attribute", a->name);
    H5Aclose(attr);
    H5Tclose(type);
    H5Sclose(space);
}

/* One checksummed piece of a dataset: flat elements [previous end, end).
 * 16 bytes, no padding: sent between ranks as bytes. */
struct piece {
    uint64_t end;
    uint32_t crc;
    uint32_t set; /* writing: index of the dataset in the save's list */
};

static int compare_pieces(const void *a, const void *b)
{
    const struct piece *x = a, *y = b;
    if (x->set != y->set)
        return x->set < y->set ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Appends the CRC-32C pieces of this rank's range [begin, begin+count) of
 * dataset `set`, cut at the multiples of CKPT_PIECE_ELEMS, to *list. */
static void add_pieces(struct piece **list, int *n, int *cap, uint32_t set, size_t begin, size_t count,
                       const void *data, size_t elem)
{
    for (size_t from = begin; from < begin + count;) {
        size_t to = (from / CKPT_PIECE_ELEMS + 1) * CKPT_PIECE_ELEMS;
        to = to < begin + count ? to : begin + count;
        if (*n == *cap) {
            *cap = *cap ? 2 * *cap : 1024;
            *list = xrealloc(*list, (size_t)*cap * sizeof **list);
        }
        (*list)[(*n)++] = (struct piece){
            .end = to, .crc = crc32c_extend(0, (const char *)data + (from - begin) * elem, (to - from) * elem),
            .set = set};
        from = to;
    }
}

/* Every rank's pieces (collective): the whole file's table, the same on
 * every rank, sorted by dataset and end. Returns the count; *out malloc'd. */
static int gather_pieces(const struct piece *local, int n_local, struct piece **out)
{
    int world = 1;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world), "asking the world size");
    int *counts = xmalloc((size_t)world * sizeof *counts), *displs = xmalloc((size_t)world * sizeof *displs);
    if ((size_t)n_local > INT32_MAX / sizeof *local)
        fail_internal("checkpoint: %d checksum pieces on one rank", n_local);
    int bytes = n_local * (int)sizeof *local;
    MPI_CHECK(MPI_Allgather(&bytes, 1, MPI_INT, counts, 1, MPI_INT, MPI_COMM_WORLD), "gathering the checksum counts");
    long long total = 0;
    for (int r = 0; r < world; r++) {
        displs[r] = (int)total;
        total += counts[r];
    }
    if (total > INT32_MAX)
        fail_internal("checkpoint: %lld bytes of checksums in one gather", total);
    struct piece *all = xmalloc((size_t)total + sizeof *all);
    MPI_CHECK(MPI_Allgatherv(local, bytes, MPI_BYTE, all, counts, displs, MPI_BYTE, MPI_COMM_WORLD),
              "gathering the checksums");
    int n = (int)(total / (long long)sizeof *all);
    qsort(all, (size_t)n, sizeof *all, compare_pieces);
    free(counts);
    free(displs);
    *out = all;
    return n;
}

/* Writes the piece table as the dataset's attributes crc32c (uint32) and
 * crc32c_ends (uint64), both of n values (collective, same values on every
 * rank). An empty dataset gets the single piece {end 0, crc 0}. */
static void write_piece_attrs(struct writer *w, hid_t dset, const char *full_name, const struct piece *pieces, int n)
{
    struct piece empty = {0, 0, 0};
    if (n == 0) {
        pieces = &empty;
        n = 1;
    }
    uint32_t *crcs = xmalloc((size_t)n * sizeof *crcs);
    uint64_t *ends = xmalloc((size_t)n * sizeof *ends);
    for (int i = 0; i < n; i++) {
        crcs[i] = pieces[i].crc;
        ends[i] = pieces[i].end;
    }
    hsize_t dims[1] = {(hsize_t)n};
    hid_t space = H5Screate_simple(1, dims, NULL);
    hid_t crc_attr = space < 0 ? -1 : H5Acreate2(dset, CKPT_ATTR_CRC, H5T_STD_U32LE, space, H5P_DEFAULT, H5P_DEFAULT);
    if (crc_attr < 0 || H5Awrite(crc_attr, H5T_NATIVE_UINT32, crcs) < 0)
        write_fail(w, "write the checksums of", full_name);
    hid_t end_attr = crc_attr < 0 ? -1 : H5Acreate2(dset, CKPT_ATTR_CRC_ENDS, H5T_STD_U64LE, space, H5P_DEFAULT,
                                                     H5P_DEFAULT);
    if (crc_attr >= 0 && (end_attr < 0 || H5Awrite(end_attr, H5T_NATIVE_UINT64, ends) < 0))
        write_fail(w, "write the checksum pieces of", full_name);
    if (end_attr >= 0)
        H5Aclose(end_attr);
    if (crc_attr >= 0)
        H5Aclose(crc_attr);
    if (space >= 0)
        H5Sclose(space);
    free(crcs);
    free(ends);
}

/* A dataset being saved: created in the first phase, its raw data written
 * in the second, its checksums in the third. */
struct pending_set {
    hid_t dset;
    char full_name[512];
    size_t begin, count, elem; /* this rank's flat range */
    const void *data;
    haddr_t offset;            /* of the data in the file */
};

/* Creates dataset `name` in `loc` (collective): contiguous, allocated at
 * creation (so its flat range [begin, begin+count) is one byte range of the
 * file, at offset + begin * elem) and never filled (every element is written
 * by one rank). */
static void create_dataset(struct writer *w, hid_t loc, struct pending_set *p, const char *name, int ndim,
                           const hsize_t *dims, hid_t file_type)
{
    p->dset = -1;
    p->offset = HADDR_UNDEF;
    if (w->all_failed)
        return;
    hid_t space = H5Screate_simple(ndim, dims, NULL);
    if (space < 0)
        write_fail(w, "make the dataspace of", p->full_name);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (dcpl < 0 || H5Pset_layout(dcpl, H5D_CONTIGUOUS) < 0 || H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY) < 0 ||
        H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) < 0)
        write_fail(w, "set the creation properties of", p->full_name);
    p->dset = H5Dcreate2(loc, name, file_type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (p->dset < 0)
        write_fail(w, "create dataset", p->full_name);
    else if (p->count > 0 && (p->offset = H5Dget_offset(p->dset)) == HADDR_UNDEF)
        write_fail(w, "find the file offset of", p->full_name);
    if (dcpl >= 0)
        H5Pclose(dcpl);
    if (space >= 0)
        H5Sclose(space);
}

static void crash_point_reached(struct writer *w, int point);

/* This rank's CRC-32C pieces of every dataset (add_pieces), computed on a
 * thread of its own while the raw data are written: the writes mostly wait
 * for the device, so the checksums cost no time. */
struct checksum_job {
    const struct pending_set *sets;
    int n_sets;
    struct piece *pieces;
    int n_pieces;
};

static void *checksum_thread(void *arg)
{
    struct checksum_job *job = arg;
    int cap = 0;
    for (int k = 0; k < job->n_sets; k++) {
        const struct pending_set *p = &job->sets[k];
        add_pieces(&job->pieces, &job->n_pieces, &cap, (uint32_t)k, p->begin, p->count, p->data, p->elem);
    }
    return NULL;
}

/* Phase 2 (independent, no rank waits for another): this rank's raw data
 * of every dataset (rawio_write; the values are already in the file's byte
 * order: little-endian host, same element size) and, meanwhile, their CRC-32C
 * pieces (checksum_thread). */
static void write_raw_data(struct writer *w, struct pending_set *sets, int n_sets, struct piece **pieces,
                           int *n_pieces)
{
    struct checksum_job job = {sets, n_sets, NULL, 0};
    pthread_t thread;
    bool threaded = pthread_create(&thread, NULL, checksum_thread, &job) == 0;
    for (int k = 0; k < n_sets && !w->all_failed; k++) {
        struct pending_set *p = &sets[k];
        if (p->count > 0 && !w->failed) {
            int e = rawio_write(&w->raw, p->data, p->count * p->elem, (off_t)(p->offset + p->begin * p->elem));
            if (e)
                writer_error(w, "cannot write dataset '%s': %s", p->full_name, strerror(e));
        }
        if (k + 1 == n_sets / 2)
            crash_point_reached(w, CRASH_MID_DATA);
    }
    if (threaded)
        pthread_join(thread, NULL);
    else
        checksum_thread(&job);
    *pieces = job.pieces;
    *n_pieces = job.n_pieces;
}

/* Phase 3 (collective): the checksum tables of every dataset, then closes them. */
static void write_checksums(struct writer *w, struct pending_set *sets, int n_sets, const struct piece *local,
                            int n_local)
{
    struct piece *all = NULL;
    int n_all = gather_pieces(local, n_local, &all);
    if (agree(w)) {
        int at = 0;
        for (int k = 0; k < n_sets && !w->failed; k++) {
            int first = at;
            while (at < n_all && all[at].set == (uint32_t)k)
                at++;
            write_piece_attrs(w, sets[k].dset, sets[k].full_name, all + first, at - first);
        }
    }
    free(all);
    agree(w);
}

static hid_t create_group(struct writer *w, const char *name)
{
    if (w->all_failed)
        return -1;
    hid_t group = H5Gcreate2(w->file, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (group < 0)
        write_fail(w, "create group", name);
    return group;
}

/* Every element must be written by exactly one rank: the counts of all ranks
 * add up to each tensor's size (catches stage 0 callers passing the whole
 * tensor on every rank, and missing ranges). */
static void check_coverage(const struct ckpt_group *g)
{
    unsigned long long *counts = xcalloc((size_t)g->n_slices + 1, sizeof *counts);
    for (int i = 0; i < g->n_slices; i++) {
        const struct ckpt_slice *s = &g->slices[i];
        if (s->ndim < 1 || s->ndim > 2 || s->begin + s->count > shape_numel(s->ndim, s->shape) ||
            (s->count && !s->data))
            fail_internal("checkpoint: slice '%s/%s' (ndim %d) range [%zu, +%zu) is outside its shape or has no data",
                          g->name, s->name, s->ndim, s->begin, s->count);
        counts[i] = s->count;
    }
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, counts, g->n_slices, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD),
              "adding up the slice sizes of the ranks");
    for (int i = 0; i < g->n_slices; i++) {
        const struct ckpt_slice *s = &g->slices[i];
        if (counts[i] != shape_numel(s->ndim, s->shape))
            fail_internal("checkpoint: the ranks' slices of '%s/%s' hold %llu elements, the tensor has %zu "
                          "(each element must be saved by exactly one rank)",
                          g->name, s->name, counts[i], shape_numel(s->ndim, s->shape));
    }
    free(counts);
}

static uint64_t hash_bytes(uint64_t h, const void *bytes, size_t n)
{
    const unsigned char *p = bytes;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001B3ull; /* FNV-1a */
    return h;
}

static uint64_t hash_str(uint64_t h, const char *s)
{
    return hash_bytes(h, s ? s : "", (s ? strlen(s) : 0) + 1);
}

/* Dataset and attribute creation are collective in parallel HDF5: every rank
 * must create the same objects in the same order, or the file is corrupted
 * (or the ranks hang). Compares a hash of the layout over all ranks. */
static void check_same_layout(const struct ckpt_contents *c)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (int g = 0; g < c->n_groups; g++) {
        h = hash_str(h, c->groups[g].name);
        for (int i = 0; i < c->groups[g].n_slices; i++) {
            const struct ckpt_slice *s = &c->groups[g].slices[i];
            size_t shape[3] = {(size_t)s->ndim, s->shape[0], s->ndim == 2 ? s->shape[1] : 0};
            h = hash_bytes(hash_str(h, s->name), shape, sizeof shape);
        }
    }
    for (int i = 0; i < c->n_rank_state; i++)
        h = hash_bytes(hash_str(h, c->rank_state[i].name), &c->rank_state[i].n, sizeof c->rank_state[i].n);
    for (int i = 0; i < c->n_attrs; i++) {
        const struct ckpt_attr *a = &c->attrs[i];
        h = hash_bytes(hash_str(h, a->name), &a->kind, sizeof a->kind);
        if (a->kind == CKPT_ATTR_STR)
            h = hash_str(h, a->str); /* its length is part of the attribute's type */
    }
    unsigned long long lo = h, hi = h;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD),
              "comparing the checkpoint layout of the ranks");
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD),
              "comparing the checkpoint layout of the ranks");
    if (lo != hi)
        fail_internal("checkpoint: the ranks passed different tensors, shapes or attributes to ckpt_save (every "
                      "rank must list the same ones, in the same order)");
}

/* 0, or -1 with the reason in w. */
static int fsync_path(struct writer *w, const char *path, bool directory)
{
    char why[sizeof w->err];
    if (rawio_fsync(path, directory, why, sizeof why) == 0)
        return 0;
    writer_error(w, "%s", why);
    return -1;
}

static void make_dir(struct writer *w, const char *dir)
{
    char buf[CKPT_MAX_PATH];
    if (!dir[0]) {
        writer_error(w, "the checkpoint directory is empty");
        return;
    }
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char saved = *p;
            *p = 0;
            if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
                writer_error(w, "cannot create directory '%s': %s", buf, strerror(errno));
                return;
            }
            *p = saved;
            if (saved == 0)
                break;
        }
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        writer_error(w, "'%s' is not a directory: %s", dir, strerror(errno ? errno : ENOTDIR));
}

int ckpt_check_dir(const char *dir, char *why, size_t why_cap)
{
    struct writer w = {.rank = 0, .world = 1};
    make_dir(&w, dir);
    if (w.failed) {
        snprintf(why, why_cap, "checkpoint.dir: %s", w.err);
        return -1;
    }
    /* access(W_OK) would trust the mode bits; a read-only mount only shows in
     * a real creation */
    char probe[CKPT_MAX_PATH];
    if (snprintf(probe, sizeof probe, "%s/.shardlm-write-test.%ld", dir, (long)getpid()) >= (int)sizeof probe) {
        snprintf(why, why_cap, "checkpoint.dir '%s' is too long", dir);
        return -1;
    }
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) {
        snprintf(why, why_cap, "checkpoint.dir '%s' is not writable: cannot create a file there (%s)", dir,
                 strerror(errno));
        return -1;
    }
    close(fd);
    unlink(probe);
    return 0;
}

/* Parses "step_<digits>.h5" exactly; returns the step or -1. */
static long parse_ckpt_name(const char *name)
{
    long step = -1;
    int end = 0;
    if (sscanf(name, "step_%ld.h5%n", &step, &end) == 1 && end > 0 && name[end] == 0 && step >= 0)
        return step;
    return -1;
}

int ckpt_managed_name(const char *name)
{
    if (strcmp(name, "latest") == 0 || strcmp(name, "latest.tmp") == 0)
        return 1;
    char base[256];
    size_t n = strlen(name);
    if (n >= sizeof base)
        return 0;
    memcpy(base, name, n + 1);
    if (n > 4 && strcmp(base + n - 4, ".tmp") == 0)
        base[n - 4] = 0;
    return parse_ckpt_name(base) >= 0;
}

static int compare_desc(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Rank 0: deletes all but the newest `keep` checkpoints (never `current`). */
static void prune(const char *dir, int keep, long current)
{
    if (keep <= 0)
        return;
    DIR *d = opendir(dir);
    if (!d) {
        log_warn("checkpoint: cannot list '%s' to prune old checkpoints: %s", dir, strerror(errno));
        return;
    }
    size_t n = 0, cap = 16;
    long *steps = xmalloc(cap * sizeof *steps);
    for (struct dirent *e; (e = readdir(d));) {
        long step = parse_ckpt_name(e->d_name);
        if (step < 0)
            continue;
        if (n == cap) {
            cap *= 2;
            long *grown = realloc(steps, cap * sizeof *steps);
            if (!grown)
                fail_internal("out of host memory listing checkpoints");
            steps = grown;
        }
        steps[n++] = step;
    }
    closedir(d);
    qsort(steps, n, sizeof *steps, compare_desc);
    for (size_t i = (size_t)keep; i < n; i++) {
        if (steps[i] == current)
            continue;
        char path[CKPT_MAX_PATH];
        snprintf(path, sizeof path, "%s/step_%06ld.h5", dir, steps[i]);
        if (unlink(path) != 0)
            log_warn("checkpoint: cannot delete old checkpoint '%s': %s", path, strerror(errno));
    }
    free(steps);
}

/* Test hook (see ckpt.h): SHARDLM_CKPT_CRASH=POINT[:RANK] kills that rank
 * (default 0) with SIGKILL at POINT of the next save of this process. */
static const char *const crash_names[] = {"before_data", "mid_data", "before_rename", "before_latest"};

static int crash_point_armed(int rank)
{
    static bool used;
    const char *spec = getenv("SHARDLM_CKPT_CRASH");
    if (used || !spec || !spec[0])
        return CRASH_NONE;
    used = true;
    int point = CRASH_NONE;
    for (int i = 0; i < (int)(sizeof crash_names / sizeof crash_names[0]); i++) {
        size_t n = strlen(crash_names[i]);
        if (strncmp(spec, crash_names[i], n) == 0 && (spec[n] == 0 || spec[n] == ':'))
            point = i;
    }
    if (point == CRASH_NONE)
        fail_input("SHARDLM_CKPT_CRASH='%s': want before_data, mid_data, before_rename or before_latest, "
                   "optionally :RANK",
                   spec);
    const char *colon = strchr(spec, ':');
    int target = colon ? atoi(colon + 1) : 0;
    return target == rank ? point : CRASH_NONE;
}

static void crash_point_reached(struct writer *w, int point)
{
    if (w->crash_point != point)
        return;
    fprintf(stderr, "shardlm: rank %d: SHARDLM_CKPT_CRASH: killing myself at %s of '%s'\n", w->rank,
            crash_names[point], w->path);
    fflush(stderr);
    raise(SIGKILL);
}

/* Rank 0: temp -> final name, then latest -> final name, each made durable.
 * 0, or -1 with the reason in w. */
static int publish(struct writer *w, const char *dir, const char *tmp_path, const char *final_path,
                   const char *final_name)
{
    if (rename(tmp_path, final_path) != 0) {
        writer_error(w, "cannot rename '%s' to '%s': %s", tmp_path, final_path, strerror(errno));
        return -1;
    }
    if (fsync_path(w, dir, true) != 0)
        return -1;
    crash_point_reached(w, CRASH_BEFORE_LATEST);
    char latest[CKPT_MAX_PATH], latest_tmp[CKPT_MAX_PATH];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    snprintf(latest_tmp, sizeof latest_tmp, "%s/latest.tmp", dir);
    FILE *fp = fopen(latest_tmp, "w");
    if (!fp || fprintf(fp, "%s\n", final_name) < 0 || fflush(fp) != 0 || fsync(fileno(fp)) != 0) {
        writer_error(w, "cannot write '%s': %s", latest_tmp, strerror(errno));
        if (fp)
            fclose(fp);
        unlink(latest_tmp);
        return -1;
    }
    if (fclose(fp) != 0) {
        writer_error(w, "cannot close '%s': %s", latest_tmp, strerror(errno));
        unlink(latest_tmp);
        return -1;
    }
    if (rename(latest_tmp, latest) != 0) {
        writer_error(w, "cannot rename '%s' to '%s': %s", latest_tmp, latest, strerror(errno));
        unlink(latest_tmp);
        return -1;
    }
    return fsync_path(w, dir, true);
}

/* Rank 0, before HDF5 touches the file: makes sure the file can grow to
 * about `bytes` (the file-size limit, then fallocate of the .tmp file, which
 * HDF5's create truncates again). A full disk or a file-size limit is then
 * found here, where all ranks can agree on it, instead of inside a collective
 * HDF5 call where one failing rank leaves the others waiting. A write that
 * still fails later (the space taken meanwhile) is reported the same way when
 * HDF5 fails on every rank alike. */
static void check_space(struct writer *w, const char *tmp_path, unsigned long long bytes)
{
    struct rlimit lim;
    if (getrlimit(RLIMIT_FSIZE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY && bytes > lim.rlim_cur) {
        writer_error(w, "cannot write '%s': %s (it needs about %llu bytes, the file-size limit, ulimit -f, is %llu)",
                     tmp_path, strerror(EFBIG), bytes, (unsigned long long)lim.rlim_cur);
        return;
    }
    int fd = open(tmp_path, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    if (fd < 0) {
        writer_error(w, "cannot create '%s': %s", tmp_path, strerror(errno));
        return;
    }
    int rc = fallocate(fd, 0, 0, (off_t)bytes);
    int e = errno;
    if (rc != 0 && e != EOPNOTSUPP && e != ENOSYS && e != EINVAL)
        writer_error(w, "cannot reserve %llu bytes for '%s': %s", bytes, tmp_path, strerror(e));
    close(fd);
    if (w->failed)
        unlink(tmp_path);
}

static char g_save_error[1024];

const char *ckpt_save_error(void) { return g_save_error; }

int ckpt_try_save(const char *dir, long step, int keep, const struct ckpt_contents *c, char *path_out,
                  size_t path_cap)
{
    require_mpi("ckpt_save");
    quiet_hdf5();
    /* A file-size limit (ulimit -f) must fail the write with EFBIG, not kill us. */
    signal(SIGXFSZ, SIG_IGN);
    g_save_error[0] = 0;
    struct writer w = {0};
    w.file = -1;
    w.raw = RAWIO_FILE_CLOSED;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &w.rank), "asking this rank's number");
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &w.world), "asking the world size");
    w.crash_point = crash_point_armed(w.rank);

    char final_name[64], final_path[CKPT_MAX_PATH], tmp_path[CKPT_MAX_PATH];
    snprintf(final_name, sizeof final_name, "step_%06ld.h5", step);
    if (snprintf(final_path, sizeof final_path, "%s/%s", dir, final_name) >= (int)sizeof final_path ||
        snprintf(tmp_path, sizeof tmp_path, "%s.tmp", final_path) >= (int)sizeof tmp_path)
        fail_input("checkpoint directory name is too long: '%s'", dir);
    w.path = tmp_path;
    for (int g = 0; g < c->n_groups; g++)
        w.datasets_total += c->groups[g].n_slices;
    w.datasets_total += c->n_rank_state;

    check_same_layout(c);
    for (int g = 0; g < c->n_groups; g++)
        check_coverage(&c->groups[g]);
    unsigned long long bytes = 1ull << 20; /* metadata and attributes, generously */
    for (int g = 0; g < c->n_groups; g++)
        for (int i = 0; i < c->groups[g].n_slices; i++)
            bytes += shape_numel(c->groups[g].slices[i].ndim, c->groups[g].slices[i].shape) * sizeof(float);
    for (int i = 0; i < c->n_rank_state; i++)
        bytes += (unsigned long long)w.world * (unsigned long long)c->rank_state[i].n * sizeof(uint64_t);
    if (w.rank == 0) {
        make_dir(&w, dir);
        if (!w.failed)
            check_space(&w, tmp_path, bytes);
    }
    bool created = false;
    if (agree(&w)) {
        hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
        if (fapl < 0 || H5Pset_fapl_mpio(fapl, MPI_COMM_WORLD, MPI_INFO_NULL) < 0 ||
            H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST) < 0 ||
            H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG) < 0)
            write_fail(&w, "set up MPI-IO access for", tmp_path);
        else if ((w.file = H5Fcreate(tmp_path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl)) < 0)
            write_fail(&w, "create file", tmp_path);
        if (fapl >= 0)
            H5Pclose(fapl);
        created = w.file >= 0;
        /* Raw data bypass HDF5's MPI-IO path (see rawio.h): two plain
         * descriptors of the file HDF5 just created. */
        int e = created ? rawio_open(&w.raw, tmp_path, true) : 0;
        if (e)
            writer_error(&w, "cannot open '%s' for writing: %s", tmp_path, strerror(e));
        /* Every rank knows whether every rank opened the file. */
        int all_created = created;
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &all_created, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD),
                  "agreeing on the checkpoint file");
        if (!all_created && !w.failed)
            writer_error(&w, "another rank could not create '%s'", tmp_path);
        agree(&w);
    }
    crash_point_reached(&w, CRASH_BEFORE_DATA);

    struct ckpt_attr builtin[] = {
        {.name = "format", .kind = CKPT_ATTR_STR, .str = CKPT_FORMAT},
        {.name = "format_version", .kind = CKPT_ATTR_I64, .i64 = CKPT_FORMAT_VERSION},
        {.name = "shardlm_version", .kind = CKPT_ATTR_STR, .str = SHARDLM_VERSION},
        {.name = "step", .kind = CKPT_ATTR_I64, .i64 = step},
        {.name = "world_size", .kind = CKPT_ATTR_I64, .i64 = w.world},
    };
    if (!w.all_failed) {
        for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++)
            write_attr(&w, &builtin[i]);
        for (int i = 0; i < c->n_attrs; i++)
            write_attr(&w, &c->attrs[i]);
        agree(&w);
    }

    /* Phase 1 (collective): every group and dataset. */
    struct pending_set *sets = xcalloc((size_t)w.datasets_total + 1, sizeof *sets);
    int n_sets = 0;
    for (int g = 0; g < c->n_groups && !w.all_failed; g++) {
        const struct ckpt_group *group = &c->groups[g];
        hid_t loc = create_group(&w, group->name);
        for (int i = 0; i < group->n_slices; i++) {
            const struct ckpt_slice *s = &group->slices[i];
            struct pending_set *p = &sets[n_sets++];
            snprintf(p->full_name, sizeof p->full_name, "/%s/%s", group->name, s->name);
            *p = (struct pending_set){.begin = s->begin, .count = s->count, .elem = sizeof(float), .data = s->data};
            snprintf(p->full_name, sizeof p->full_name, "/%s/%s", group->name, s->name);
            hsize_t dims[2] = {s->shape[0], s->shape[1]};
            create_dataset(&w, loc, p, s->name, s->ndim, dims, H5T_IEEE_F32LE);
        }
        if (loc >= 0)
            H5Gclose(loc);
    }
    if (c->n_rank_state > 0 && !w.all_failed) {
        hid_t loc = create_group(&w, "rank_state");
        for (int i = 0; i < c->n_rank_state; i++) {
            const struct ckpt_rank_state *rs = &c->rank_state[i];
            struct pending_set *p = &sets[n_sets++];
            *p = (struct pending_set){.begin = (size_t)w.rank * (size_t)rs->n, .count = (size_t)rs->n,
                                      .elem = sizeof(uint64_t), .data = rs->values};
            snprintf(p->full_name, sizeof p->full_name, "/rank_state/%s", rs->name);
            hsize_t dims[2] = {(hsize_t)w.world, (hsize_t)rs->n};
            create_dataset(&w, loc, p, rs->name, 2, dims, H5T_STD_U64LE);
        }
        if (loc >= 0)
            H5Gclose(loc);
    }
    agree(&w);
    /* Phases 2 and 3. */
    struct piece *pieces = NULL;
    int n_pieces = 0;
    write_raw_data(&w, sets, n_sets, &pieces, &n_pieces);
    if (!w.all_failed)
        write_checksums(&w, sets, n_sets, pieces, n_pieces);
    free(pieces);
    for (int k = 0; k < n_sets; k++)
        if (sets[k].dset >= 0)
            H5Dclose(sets[k].dset);
    free(sets);

    int close_error = rawio_close(&w.raw);
    if (close_error)
        writer_error(&w, "cannot write '%s': %s", tmp_path, strerror(close_error));
    if (!w.all_failed) {
        /* Under MPI-IO an explicit flush ends in MPI_File_sync on every rank. */
        if (H5Fflush(w.file, H5F_SCOPE_GLOBAL) < 0)
            write_fail(&w, "flush", tmp_path);
        agree(&w);
    }
    if (created) {
        /* Collective on every rank that has the file open, which after the
         * agreement on creation is all of them or none. */
        if (H5Fclose(w.file) < 0)
            write_fail(&w, "close", tmp_path);
        H5Eclear2(H5E_DEFAULT);
        agree(&w);
    }
    /* The file is closed by every rank (collective close): its bytes are in
     * the file system; make them durable before the name is published. */
    if (!w.all_failed) {
        if (w.rank == 0)
            fsync_path(&w, tmp_path, false);
        agree(&w); /* also the barrier: every rank has finished writing */
    }
    if (!w.all_failed) {
        crash_point_reached(&w, CRASH_BEFORE_RENAME);
        if (w.rank == 0 && publish(&w, dir, tmp_path, final_path, final_name) == 0)
            prune(dir, keep, step);
        agree(&w);
    }
    if (w.all_failed) {
        /* The previous checkpoint and latest are untouched; drop the partial file. */
        if (w.rank == 0 && created)
            unlink(tmp_path);
        snprintf(g_save_error, sizeof g_save_error, "%s", w.err);
        MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD), "waiting for the failed checkpoint to be cleaned up");
        return -1;
    }
    if (path_out && path_cap)
        snprintf(path_out, path_cap, "%s", final_path);
    return 0;
}

void ckpt_fail_agreed(const char *dir, const char *why)
{
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0)
        fail_input("cannot save a checkpoint in '%s': %s. Hint: check the disk has space and the directory is "
                   "writable, or set checkpoint.on_error=\"continue\"",
                   dir, why);
    /* Rank 0 ends the job (MPI_Abort through fail_input); the others wait for it
     * so the error is printed once. */
    MPI_Barrier(MPI_COMM_WORLD);
    util_exit(EXIT_BAD_INPUT);
}

void ckpt_save(const char *dir, long step, int keep, const struct ckpt_contents *c, char *path_out,
               size_t path_cap)
{
    if (ckpt_try_save(dir, step, keep, c, path_out, path_cap) != 0)
        ckpt_fail_agreed(dir, ckpt_save_error());
}

/* ------------------------------------------------------------------------ */
/* Resolving                                                                 */

/* The checkpoints DIR holds (step_N.h5, published ones only), for the message
 * of a refused --resume auto: "step_000020.h5, step_000010.h5 (2 in all)",
 * newest first, at most CKPT_LIST_SHOWN named. Empty when there are none. */
#define CKPT_LIST_SHOWN 3
static void list_checkpoints(const char *dir, char *out, size_t cap, char *newest, size_t newest_cap)
{
    out[0] = newest[0] = 0;
    DIR *d = opendir(dir);
    if (!d)
        return;
    long steps[CKPT_LIST_SHOWN];
    int count = 0, shown = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long step = parse_ckpt_name(e->d_name);
        if (step < 0)
            continue;
        count++;
        /* keep the CKPT_LIST_SHOWN largest steps, in descending order */
        if (shown < CKPT_LIST_SHOWN)
            steps[shown++] = step;
        else if (step > steps[shown - 1])
            steps[shown - 1] = step;
        else
            continue;
        for (int i = shown - 1; i > 0 && steps[i] > steps[i - 1]; i--) {
            long t = steps[i];
            steps[i] = steps[i - 1];
            steps[i - 1] = t;
        }
    }
    closedir(d);
    size_t used = 0;
    for (int i = 0; i < shown && used < cap; i++)
        used += (size_t)snprintf(out + used, cap - used, "%sstep_%06ld.h5", i ? ", " : "", steps[i]);
    if (count > 0 && used < cap)
        snprintf(out + used, cap - used, " (%d in all)", count);
    if (count > 0)
        snprintf(newest, newest_cap, "%s/step_%06ld.h5", dir, steps[0]);
}

/* Refuses --resume auto in DIR, whose latest is unusable for WHY, when DIR
 * holds checkpoints: starting over would overwrite them (a requeued job would
 * throw its training away). Returns when DIR holds none. */
static void refuse_if_checkpoints(const char *dir, const char *why)
{
    char found[512], newest[CKPT_MAX_PATH];
    list_checkpoints(dir, found, sizeof found, newest, sizeof newest);
    if (!found[0])
        return;
    fail_input("--resume auto: '%s' holds checkpoints (%s) but %s. Hint: resume from one with --resume %s, or "
               "start over with --resume none (or an empty checkpoint.dir)",
               dir, found, why, newest);
}

/* The checkpoint DIR/latest names: its file name in DIR (as the trainer
 * writes it) or an absolute path, trailing white space ignored. NULL when
 * latest is absent, unreadable, malformed or names no checkpoint file: then
 * REQUIRED fails, and otherwise (--resume auto) the run refuses when DIR holds
 * checkpoints and starts fresh when it holds none. */
static char *latest_target(const char *dir, bool required)
{
    char latest[CKPT_MAX_PATH], why[3 * CKPT_MAX_PATH + 256];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    char name[CKPT_MAX_PATH + 2] = {0};
    char path[CKPT_MAX_PATH];
    path[0] = 0;
    FILE *fp = fopen(latest, "r");
    if (!fp) {
        snprintf(why, sizeof why, "no 'latest' (%s)", strerror(errno));
    } else {
        size_t n = fread(name, 1, sizeof name - 1, fp);
        int more = fgetc(fp) != EOF;
        fclose(fp);
        name[n] = 0;
        while (n > 0 && (name[n - 1] == '\n' || name[n - 1] == '\r' || name[n - 1] == ' ' || name[n - 1] == '\t'))
            name[--n] = 0;
        if (more || n >= CKPT_MAX_PATH)
            snprintf(why, sizeof why, "'%s' is too long to name a checkpoint", latest);
        else if (n == 0 || strlen(name) != n || strchr(name, '\n'))
            snprintf(why, sizeof why, "'%s' is empty or holds more than one line", latest);
        else if (name[0] != '/' && (strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, "..")))
            snprintf(why, sizeof why, "'%s' names '%s', not a file in that directory", latest, name);
        else if ((name[0] == '/' ? snprintf(path, sizeof path, "%s", name)
                                 : snprintf(path, sizeof path, "%s/%s", dir, name)) >= (int)sizeof path)
            snprintf(why, sizeof why, "'%s' names a path too long", latest);
        else {
            struct stat st;
            if (stat(path, &st) != 0)
                snprintf(why, sizeof why, "'%s' names '%s', which is missing (%s)", latest, path, strerror(errno));
            else if (!S_ISREG(st.st_mode))
                snprintf(why, sizeof why, "'%s' names '%s', which is not a checkpoint file", latest, path);
            else
                return xstrdup(path);
        }
    }
    if (required)
        fail_input("%s: %s. Hint: name a step_*.h5 file instead", dir, why);
    refuse_if_checkpoints(dir, why);
    if (fp)
        log_warn("%s, and '%s' holds no checkpoint: starting fresh", why, dir);
    return NULL;
}

/* The directory part of PATH ("." when it has none), into out. */
static void dir_of(const char *path, char *out, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(out, cap, ".");
    else if (slash == path)
        snprintf(out, cap, "/");
    else
        snprintf(out, cap, "%.*s", (int)(slash - path), path);
}

char *ckpt_resolve(const char *dir, const char *spec)
{
    if (!spec || !spec[0])
        fail_input("--resume '': want auto, none, a checkpoint file or its directory");
    if (strcmp(spec, "none") == 0)
        return NULL;
    if (strcmp(spec, "auto") == 0)
        return dir && dir[0] ? latest_target(dir, false) : NULL;
    struct stat st;
    if (stat(spec, &st) == 0 && S_ISDIR(st.st_mode))
        return latest_target(spec, true);
    const char *base = strrchr(spec, '/');
    if (strcmp(base ? base + 1 : spec, "latest") == 0) {
        /* DIR/latest, the pointer file itself: what it names */
        char parent[CKPT_MAX_PATH];
        dir_of(spec, parent, sizeof parent);
        return latest_target(parent, true);
    }
    return xstrdup(spec);
}

/* ------------------------------------------------------------------------ */
/* Reading                                                                   */

static void read_fail(const struct ckpt_reader *r, const char *what, const char *name)
{
    struct hdf5_why why;
    const char *msg = hdf5_error(&why);
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
    require_mpi("ckpt_open");
    quiet_hdf5();
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
        const char *msg = hdf5_error(&why);
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
            const char *msg = hdf5_error(&why);
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

size_t ckpt_intersect(size_t tensor_offset, size_t numel, size_t range_begin, size_t range_count, size_t *begin,
                      size_t *count)
{
    size_t lo = tensor_offset > range_begin ? tensor_offset : range_begin;
    size_t tensor_end = tensor_offset + numel, range_end = range_begin + range_count;
    size_t hi = tensor_end < range_end ? tensor_end : range_end;
    if (hi <= lo) {
        *begin = 0;
        *count = 0;
        return 0;
    }
    *begin = lo - tensor_offset;
    *count = hi - lo;
    return lo - range_begin;
}
