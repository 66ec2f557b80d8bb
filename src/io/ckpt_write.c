/*
 * ckpt_write — saving a checkpoint (see ckpt.h for the layout and
 * contracts): the layout and coverage checks, the collective creation of the
 * file, attributes and datasets, each rank's raw data written straight to
 * the datasets' offsets (rawio.h) while a thread computes its CRC-32C
 * pieces, the gathered checksum tables, and the agreement of the ranks on
 * failure after every collective phase. Naming, publishing and pruning are
 * ckpt_dir.c's.
 */
#define _GNU_SOURCE /* fallocate */
#include "ckpt_internal.h"
#include "core/crc32c.h"
#include "core/rawio.h"
#include "core/util.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define MPI_CHECK(call, what)                                                          \
    do {                                                                               \
        int _rc = (call);                                                              \
        if (_rc != MPI_SUCCESS)                                                        \
            fail_internal("checkpoint: MPI error %d while %s (%s:%d)", _rc, what, __FILE__, __LINE__); \
    } while (0)

static size_t shape_numel(int ndim, const size_t shape[2])
{
    return ndim == 1 ? shape[0] : shape[0] * shape[1];
}

struct writer {
    hid_t file;
    struct rawio_file raw; /* the .tmp file, for the datasets' bytes */
    int rank, world;
    bool failed;      /* this rank hit an error since the last agreement */
    bool all_failed;  /* some rank failed (agreed): every later step is skipped */
    char err[CKPT_ERROR_CAP]; /* this rank's first error; after agreement, the agreed one */
    struct ckpt_crash crash;  /* test hook: the crash point armed on this rank */
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

/* Records WHY, filled by a ckpt_dir or rawio call that returned RC, as this
 * rank's failure when RC is not 0. Returns RC. */
static int writer_check(struct writer *w, int rc, const char *why)
{
    if (rc != 0)
        writer_error(w, "%s", why);
    return rc;
}

static void crash_point_reached(struct writer *w, int point)
{
    ckpt_crash_reached(&w->crash, point);
}

static void write_fail(struct writer *w, const char *what, const char *name)
{
    struct hdf5_why why;
    const char *msg = ckpt_hdf5_error(&why);
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
    const struct ckpt_slice *slice; /* data NULL: the slice whose read gives the values */
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
        if (!p->data) /* read a piece at a time: write_read_set checksums what it writes */
            continue;
        add_pieces(&job->pieces, &job->n_pieces, &cap, (uint32_t)k, p->begin, p->count, p->data, p->elem);
    }
    return NULL;
}

const float *ckpt_slice_values(const struct ckpt_slice *s, size_t from, size_t n, float *buf)
{
    if (s->data)
        return s->data + from;
    s->read(s->src, from, n, buf);
    return buf;
}

/* A set whose values come from its slice's read: CKPT_READ_ELEMS at a time
 * through buf, each piece written and checksummed (the pieces end at the same
 * multiples of CKPT_PIECE_ELEMS as add_pieces cuts a whole range at). */
static void write_read_set(struct writer *w, const struct pending_set *p, uint32_t set, float *buf,
                           struct piece **list, int *n, int *cap)
{
    for (size_t from = 0; from < p->count && !w->failed;) {
        size_t to = ((p->begin + from) / CKPT_READ_ELEMS + 1) * CKPT_READ_ELEMS - p->begin;
        to = to < p->count ? to : p->count;
        const float *v = ckpt_slice_values(p->slice, from, to - from, buf);
        int e = rawio_write(&w->raw, v, (to - from) * p->elem, (off_t)(p->offset + (p->begin + from) * p->elem));
        if (e)
            writer_error(w, "cannot write dataset '%s': %s", p->full_name, strerror(e));
        add_pieces(list, n, cap, set, p->begin + from, to - from, v, p->elem);
        from = to;
    }
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
    struct piece *read_pieces = NULL;
    int n_read_pieces = 0, read_cap = 0;
    float *buf = NULL;
    for (int k = 0; k < n_sets && !w->all_failed; k++) {
        struct pending_set *p = &sets[k];
        if (p->count > 0 && !w->failed && !p->data) {
            buf = buf ? buf : xmalloc(CKPT_READ_ELEMS * sizeof *buf);
            write_read_set(w, p, (uint32_t)k, buf, &read_pieces, &n_read_pieces, &read_cap);
        } else if (p->count > 0 && !w->failed) {
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
    free(buf);
    if (n_read_pieces) { /* appended: gather_pieces sorts them */
        job.pieces = xrealloc(job.pieces, (size_t)(job.n_pieces + n_read_pieces) * sizeof *job.pieces);
        memcpy(job.pieces + job.n_pieces, read_pieces, (size_t)n_read_pieces * sizeof *read_pieces);
        job.n_pieces += n_read_pieces;
    }
    free(read_pieces);
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
            (s->count && !s->data && !s->read))
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

static char g_save_error[CKPT_ERROR_CAP];

const char *ckpt_save_error(void) { return g_save_error; }

int ckpt_try_save(const char *dir, long step, int keep, const struct ckpt_contents *c, char *path_out,
                  size_t path_cap)
{
    ckpt_require_mpi("ckpt_save");
    ckpt_quiet_hdf5();
    /* A file-size limit (ulimit -f) must fail the write with EFBIG, not kill us. */
    signal(SIGXFSZ, SIG_IGN);
    g_save_error[0] = 0;
    struct writer w = {0};
    w.file = -1;
    w.raw = RAWIO_FILE_CLOSED;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &w.rank), "asking this rank's number");
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &w.world), "asking the world size");
    w.crash = (struct ckpt_crash){.armed = ckpt_crash_armed(w.rank), .rank = w.rank};

    struct ckpt_step_names names;
    ckpt_step_names(dir, step, &names);
    const char *tmp_path = names.tmp_path;
    w.crash.path = tmp_path;
    char why[CKPT_ERROR_CAP]; /* of a ckpt_dir or rawio call (writer_check) */
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
        writer_check(&w, ckpt_make_dir(dir, why, sizeof why), why);
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
            *p = (struct pending_set){.begin = s->begin, .count = s->count, .elem = sizeof(float), .data = s->data,
                                      .slice = s};
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
            writer_check(&w, rawio_fsync(tmp_path, false, why, sizeof why), why);
        agree(&w); /* also the barrier: every rank has finished writing */
    }
    if (!w.all_failed) {
        crash_point_reached(&w, CRASH_BEFORE_RENAME);
        if (w.rank == 0 && writer_check(&w, ckpt_publish(&w.crash, dir, &names, why, sizeof why), why) == 0)
            ckpt_prune(dir, keep, step);
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
        snprintf(path_out, path_cap, "%s", names.path);
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
