/*
 * dpo_ref — the reference log-prob file (see dpo_ref.h). Serial HDF5 on one
 * rank: the file is small (16 bytes a sample) and written once.
 */
#include "dpo_ref.h"

#include "core/crc32c.h"
#include "core/dtype.h"
#include "core/util.h"
#include "data/samples.h"

#include <errno.h>
#include <hdf5.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define REF_WHAT "reference log-prob file"
#define REF_TODO "delete it (it is computed again) or name another with dpo.ref_log_probs_path / --ref-log-probs"
/* for a file that is not a reference file at all (the preference data, a checkpoint, a directory): never delete */
#define NOT_REF_TODO "name a reference log-prob file, or a path where none exists yet (one is computed there), " \
                     "with dpo.ref_log_probs_path / --ref-log-probs"

/* A file being read: once its format attribute says it is a reference file, its errors may say to delete it. */
struct ref_read {
    const char *path;
    bool is_ref;
};

/* The innermost HDF5 message, for the one-line errors. */
static herr_t innermost(unsigned n, const H5E_error2_t *err, void *data)
{
    char *why = data;
    if (n == 0 && err->desc)
        snprintf(why, 256, "%s", err->desc);
    return 0;
}

static const char *h5_why(char why[256])
{
    snprintf(why, 256, "unknown HDF5 error");
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost, why);
    H5Eclear2(H5E_DEFAULT);
    return why;
}

__attribute__((format(printf, 2, 3), noreturn)) static void bad_file(const struct ref_read *rd, const char *fmt,
                                                                      ...)
{
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    fail_input(REF_WHAT " '%s': %s: %s", rd->path, what, rd->is_ref ? REF_TODO : NOT_REF_TODO);
}

void dpo_ref_default_path(const char *samples_path, char *out, size_t cap)
{
    if ((size_t)snprintf(out, cap, "%s.ref-logps.h5", samples_path) >= cap)
        fail_input("preference file path '%s' is too long for its reference log-prob file beside it; name one "
                   "with dpo.ref_log_probs_path", samples_path);
}

void dpo_ref_model_id(const char *pretrained, const char *checksum, char *out, size_t cap)
{
    snprintf(out, cap, "%s (checksum %s)", pretrained ? pretrained : "", checksum ? checksum : "");
}

void dpo_ref_file_sha256(const char *path, const char *what, char hex[65])
{
    if (!samples_file_sha256(path, hex))
        fail_input("%s '%s': cannot read it: %s", what, path, strerror(errno));
}

struct dpo_ref *dpo_ref_new(int64_t n_pairs)
{
    struct dpo_ref *r = xcalloc(1, sizeof *r);
    r->n_pairs = n_pairs;
    r->logps = xcalloc((size_t)(2 * n_pairs) + 1, sizeof *r->logps);
    r->n_targets = xcalloc((size_t)(2 * n_pairs) + 1, sizeof *r->n_targets);
    r->max_prompt_length = -1;
    return r;
}

void dpo_ref_free(struct dpo_ref *r)
{
    if (!r)
        return;
    free(r->logps);
    free(r->n_targets);
    free(r);
}

/* ------------------------------------------------------------------------ */
/* Reading                                                                   */

/* A string attribute (fixed or variable length) into buf; false when missing. */
static bool read_str_attr(hid_t f, const struct ref_read *rd, const char *name, char *buf, size_t cap)
{
    char why[256];
    buf[0] = 0;
    htri_t e = H5Aexists(f, name);
    if (e < 0)
        bad_file(rd, "cannot read its attributes (%s): the file is damaged", h5_why(why));
    if (e == 0)
        return false;
    hid_t a = H5Aopen(f, name, H5P_DEFAULT), type = a < 0 ? -1 : H5Aget_type(a);
    if (type < 0)
        bad_file(rd, "cannot read attribute '%s' (%s)", name, h5_why(why));
    if (H5Tget_class(type) != H5T_STRING)
        bad_file(rd, "attribute '%s' is not a string: not a reference log-prob file of shardlm", name);
    if (H5Tis_variable_str(type) > 0) {
        char *v = NULL;
        hid_t mem = H5Tcopy(H5T_C_S1);
        H5Tset_size(mem, H5T_VARIABLE);
        if (H5Aread(a, mem, &v) < 0)
            bad_file(rd, "cannot read attribute '%s' (%s)", name, h5_why(why));
        snprintf(buf, cap, "%s", v ? v : "");
        H5free_memory(v);
        H5Tclose(mem);
    } else {
        size_t size = H5Tget_size(type);
        char *v = xcalloc(size + 1, 1);
        if (H5Aread(a, type, v) < 0)
            bad_file(rd, "cannot read attribute '%s' (%s)", name, h5_why(why));
        snprintf(buf, cap, "%s", v);
        free(v);
    }
    H5Tclose(type);
    H5Aclose(a);
    return true;
}

static int64_t read_i64_attr(hid_t f, const struct ref_read *rd, const char *name)
{
    char why[256];
    int64_t v = 0;
    if (H5Aexists(f, name) <= 0)
        bad_file(rd, "attribute '%s' is missing: not a reference log-prob file of shardlm", name);
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    if (a < 0 || H5Aread(a, H5T_NATIVE_INT64, &v) < 0)
        bad_file(rd, "cannot read attribute '%s' (%s)", name, h5_why(why));
    H5Aclose(a);
    return v;
}

/* A 1-D dataset of n elements as mem_type into out (n elements); returns n. */
static size_t read_dataset(hid_t f, const struct ref_read *rd, const char *name, hid_t mem_type, void **out,
                           size_t elem)
{
    char why[256];
    if (H5Lexists(f, name, H5P_DEFAULT) <= 0)
        bad_file(rd, "dataset '/%s' is missing: not a complete reference log-prob file", name);
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT), space = d < 0 ? -1 : H5Dget_space(d);
    if (space < 0)
        bad_file(rd, "cannot open dataset '/%s' (%s): the file is damaged", name, h5_why(why));
    hsize_t dims[2] = {0, 0};
    if (H5Sget_simple_extent_ndims(space) != 1)
        bad_file(rd, "dataset '/%s' is not one-dimensional: not a reference log-prob file of shardlm", name);
    H5Sget_simple_extent_dims(space, dims, NULL);
    H5Sclose(space);
    *out = xcalloc((size_t)dims[0] + 1, elem);
    if (dims[0] > 0 && H5Dread(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, *out) < 0)
        bad_file(rd, "cannot read dataset '/%s' (%s): the file is truncated or damaged", name, h5_why(why));
    H5Dclose(d);
    return (size_t)dims[0];
}

static bool known_dtype(const char *name)
{
    for (enum dtype dt = DTYPE_F32; dt <= DTYPE_BF16; dt++)
        if (strcmp(name, dtype_name(dt)) == 0)
            return true;
    return false;
}

/* CRC-32C over the data as written: the n log-probs as little-endian float64, then the n target counts as
 * little-endian int64 (x86 and ARM64 hold them so in memory; a big-endian host would swap first). */
static uint32_t data_crc32c(const double *logps, const int64_t *n_targets, size_t n)
{
    uint32_t crc = crc32c_extend(0, logps, n * sizeof *logps);
    return crc32c_extend(crc, n_targets, n * sizeof *n_targets);
}

static void check_header(hid_t f, struct ref_read *rd, struct dpo_ref *r, const char *want_sha256,
                         const char *want_model)
{
    char format[64];
    if (!read_str_attr(f, rd, "format", format, sizeof format) || strcmp(format, DPO_REF_FORMAT) != 0)
        bad_file(rd, "not a reference log-prob file (attribute format '%s', want '" DPO_REF_FORMAT "')", format);
    rd->is_ref = true;
    int64_t version = read_i64_attr(f, rd, "version");
    r->version = (int)version;
    if (version < DPO_REF_OLDEST_VERSION || version > DPO_REF_VERSION)
        bad_file(rd, "version %lld; this shardlm reads versions %d to %d", (long long)version,
                 DPO_REF_OLDEST_VERSION, DPO_REF_VERSION);
    r->max_prompt_length = -1;
    if (version >= 2) {
        const int64_t seq_len = read_i64_attr(f, rd, "seq_len");
        if (seq_len < 1 || seq_len > INT_MAX)
            bad_file(rd, "attribute 'seq_len' is %lld: the file is damaged", (long long)seq_len);
        r->seq_len = (int)seq_len;
        if (H5Aexists(f, "max_prompt_length") > 0)
            r->max_prompt_length = read_i64_attr(f, rd, "max_prompt_length");
    }
    if (version >= 3) {
        if (!read_str_attr(f, rd, "dtype", r->dtype, sizeof r->dtype) || !known_dtype(r->dtype))
            bad_file(rd, "attribute 'dtype' is '%s', not fp32, fp16 or bf16: the file is damaged", r->dtype);
        const int64_t crc = read_i64_attr(f, rd, "data_crc32c");
        if (crc < 0 || crc > UINT32_MAX)
            bad_file(rd, "attribute 'data_crc32c' is %lld: the file is damaged", (long long)crc);
        r->data_crc32c = (uint32_t)crc;
    }
    if (!read_str_attr(f, rd, "samples_sha256", r->sha256, sizeof r->sha256))
        bad_file(rd, "attribute 'samples_sha256' is missing: not a reference log-prob file of shardlm");
    if (!read_str_attr(f, rd, "model", r->model, sizeof r->model))
        bad_file(rd, "attribute 'model' is missing: not a reference log-prob file of shardlm");
    read_str_attr(f, rd, "samples_path", r->samples_path, sizeof r->samples_path);
    if (want_sha256 && strcmp(want_sha256, r->sha256) != 0)
        bad_file(rd, "computed for another preference file (%s, SHA-256 %.12s...; this one's is %.12s...)",
                 r->samples_path, r->sha256, want_sha256);
    if (want_model && strcmp(want_model, r->model) != 0)
        bad_file(rd, "computed with another model (%s; this run's reference is %s)", r->model, want_model);
}

struct dpo_ref *dpo_ref_load(const char *path, const char *want_sha256, const char *want_model)
{
    struct ref_read rd = {path, false};
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT)
            return NULL;
        bad_file(&rd, "cannot read it (%s)", strerror(errno));
    }
    const char *irregular = util_irregular(path);
    if (irregular)
        bad_file(&rd, "is %s, not a file", irregular);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    char why[256];
    if (H5Fis_hdf5(path) <= 0) {
        H5Eclear2(H5E_DEFAULT);
        bad_file(&rd, "not an HDF5 file (empty, truncated or another kind of file)");
    }
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0)
        bad_file(&rd, "cannot open it (%s): the file is truncated or damaged", h5_why(why));
    struct dpo_ref *r = xcalloc(1, sizeof *r);
    check_header(f, &rd, r, want_sha256, want_model);
    size_t n = read_dataset(f, &rd, "logps", H5T_NATIVE_DOUBLE, (void **)&r->logps, sizeof *r->logps);
    size_t nt = read_dataset(f, &rd, "n_targets", H5T_NATIVE_INT64, (void **)&r->n_targets, sizeof *r->n_targets);
    H5Fclose(f);
    if (n == nt && r->version >= 3 && data_crc32c(r->logps, r->n_targets, n) != r->data_crc32c)
        bad_file(&rd, "its data does not match its checksum (CRC-32C %08x, recorded %08x): a value was changed "
                 "after it was written, or the file is damaged", data_crc32c(r->logps, r->n_targets, n),
                 r->data_crc32c);
    if (n != nt || n % 2 != 0)
        bad_file(&rd, "%zu log-probs and %zu target counts (want the same even number: two a pair): the file is "
                 "damaged", n, nt);
    r->n_pairs = (int64_t)(n / 2);
    for (size_t i = 0; i < n; i++)
        if (r->n_targets[i] == 0 ? !isnan(r->logps[i])
                                 : !isfinite(r->logps[i]) || r->logps[i] > 0 || r->n_targets[i] < 1)
            bad_file(&rd, "sample %zu has log-prob %g over %lld targets (want a finite value <= 0 over at least "
                     "one target, or NaN over none for a pair left out): the file is damaged", i, r->logps[i],
                     (long long)r->n_targets[i]);
    return r;
}

void dpo_ref_check_seq_len(const struct dpo_ref *r, const char *path, int seq_len, const char *todo)
{
    if (r->seq_len > 0 && r->seq_len != seq_len)
        fail_input(REF_WHAT " '%s' was computed at data.seq_len %d, this run's is %d (samples are cut at another "
                   "length): %s", path, r->seq_len, seq_len, todo);
}

void dpo_ref_check_dtype(const struct dpo_ref *r, const char *path, const char *dtype, const char *todo)
{
    if (r->dtype[0] && strcmp(r->dtype, dtype) != 0)
        fail_input(REF_WHAT " '%s' was computed in %s, this run trains in %s (the parameters round otherwise, so "
                   "its log-probs at step 0 would not equal the reference's): %s", path, r->dtype, dtype, todo);
}

/* ------------------------------------------------------------------------ */
/* Writing                                                                   */

static void write_str_attr(hid_t f, const char *tmp, const char *name, const char *value)
{
    char why[256];
    hid_t type = H5Tcopy(H5T_C_S1), space = H5Screate(H5S_SCALAR);
    H5Tset_size(type, strlen(value) + 1);
    H5Tset_strpad(type, H5T_STR_NULLTERM);
    hid_t a = H5Acreate2(f, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0 || H5Awrite(a, type, value) < 0)
        fail_input("cannot write " REF_WHAT " '%s' (%s): check the disk", tmp, h5_why(why));
    H5Aclose(a);
    H5Sclose(space);
    H5Tclose(type);
}

static void write_i64_attr(hid_t f, const char *tmp, const char *name, int64_t value)
{
    char why[256];
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0 || H5Awrite(a, H5T_NATIVE_INT64, &value) < 0)
        fail_input("cannot write " REF_WHAT " '%s' (%s): check the disk", tmp, h5_why(why));
    H5Aclose(a);
    H5Sclose(space);
}

static void write_dataset(hid_t f, const char *tmp, const char *name, hid_t file_type, hid_t mem_type, size_t n,
                          const void *data)
{
    char why[256];
    hsize_t dim = n;
    hid_t space = H5Screate_simple(1, &dim, NULL);
    hid_t d = H5Dcreate2(f, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (d < 0 || (n > 0 && H5Dwrite(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0))
        fail_input("cannot write " REF_WHAT " '%s' (%s): check the disk", tmp, h5_why(why));
    H5Dclose(d);
    H5Sclose(space);
}

void dpo_ref_save(const char *path, const struct dpo_ref *r)
{
    char tmp[PATH_MAX + 32], abs_samples[PATH_MAX], why[256];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
        fail_input(REF_WHAT " path '%s' is too long: name a shorter one with dpo.ref_log_probs_path", path);
    if (!realpath(r->samples_path, abs_samples))
        snprintf(abs_samples, sizeof abs_samples, "%s", r->samples_path);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    util_remove_on_failure(tmp);
    hid_t f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0)
        fail_input("cannot create " REF_WHAT " '%s' (%s): check that its directory exists and is writable, or "
                   "name another with dpo.ref_log_probs_path", tmp, h5_why(why));
    write_str_attr(f, tmp, "format", DPO_REF_FORMAT);
    write_i64_attr(f, tmp, "version", DPO_REF_VERSION);
    write_str_attr(f, tmp, "samples_path", abs_samples);
    write_str_attr(f, tmp, "samples_sha256", r->sha256);
    write_str_attr(f, tmp, "model", r->model);
    if (r->seq_len < 1)
        fail_internal("dpo_ref_save: no seq_len for '%s'", path);
    write_i64_attr(f, tmp, "seq_len", r->seq_len);
    if (r->max_prompt_length >= 0)
        write_i64_attr(f, tmp, "max_prompt_length", r->max_prompt_length);
    if (!known_dtype(r->dtype))
        fail_internal("dpo_ref_save: no dtype for '%s'", path);
    write_str_attr(f, tmp, "dtype", r->dtype);
    const size_t n = (size_t)(2 * r->n_pairs);
    write_i64_attr(f, tmp, "data_crc32c", data_crc32c(r->logps, r->n_targets, n));
    write_dataset(f, tmp, "logps", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, n, r->logps);
    write_dataset(f, tmp, "n_targets", H5T_STD_I64LE, H5T_NATIVE_INT64, n, r->n_targets);
    if (H5Fflush(f, H5F_SCOPE_GLOBAL) < 0 || H5Fclose(f) < 0)
        fail_input("cannot write " REF_WHAT " '%s' (%s): check the disk", tmp, h5_why(why));
    if (rename(tmp, path) != 0)
        fail_input("cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
    util_keep_file(tmp);
}
