#include "dpo_ref.h"

#include <hdf5.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/util.h"

static void str_attr(hid_t loc, const char *name, const char *value, const char *path)
{
    hid_t type = H5Tcopy(H5T_C_S1), space = H5Screate(H5S_SCALAR), attr = -1;
    if (type < 0 || space < 0 || H5Tset_size(type, strlen(value) + 1) < 0 ||
        (attr = H5Acreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT)) < 0 || H5Awrite(attr, type, value) < 0)
        fail_input("cannot write the reference log-probs '%s' (attribute %s): check its directory's space", path, name);
    H5Aclose(attr), H5Sclose(space), H5Tclose(type);
}

static void data_1d(hid_t file, const char *name, hid_t ftype, hid_t mtype, size_t n, const void *v, const char *path)
{
    hsize_t dim = n;
    hid_t space = H5Screate_simple(1, &dim, NULL), d = -1;
    if (space < 0 || (d = H5Dcreate2(file, name, ftype, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)) < 0 ||
        (n && H5Dwrite(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0))
        fail_input("cannot write the reference log-probs '%s' (%s): check its directory's space", path, name);
    H5Dclose(d), H5Sclose(space);
}

void dpo_ref_save(const char *path, const struct dpo_ref *r)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    util_remove_on_failure(tmp);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0)
        fail_input("cannot create the reference log-probs '%s': check dpo.ref_log_probs_path's directory", tmp);
    str_attr(f, "format", DPO_REF_FORMAT, path);
    int64_t version = DPO_REF_VERSION;
    hid_t space = H5Screate(H5S_SCALAR), a = H5Acreate2(f, "version", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0 || H5Awrite(a, H5T_NATIVE_INT64, &version) < 0)
        fail_input("cannot write the reference log-probs '%s'", path);
    H5Aclose(a), H5Sclose(space);
    str_attr(f, "samples_path", r->samples_path, path);
    str_attr(f, "samples_sha256", r->sha256, path);
    str_attr(f, "model", r->model, path);
    data_1d(f, "logps", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 2 * (size_t)r->n_pairs, r->logps, path);
    data_1d(f, "n_targets", H5T_STD_I64LE, H5T_NATIVE_INT64, 2 * (size_t)r->n_pairs, r->n_targets, path);
    if (H5Fclose(f) < 0 || rename(tmp, path) != 0)
        fail_input("cannot write the reference log-probs '%s': check its directory's space", path);
    util_keep_file(tmp);
}

static char *read_str(hid_t f, const char *name)
{
    if (H5Aexists(f, name) <= 0)
        return NULL;
    hid_t a = H5Aopen(f, name, H5P_DEFAULT), t = a < 0 ? -1 : H5Aget_type(a);
    if (t < 0 || H5Tget_class(t) != H5T_STRING || H5Tis_variable_str(t) > 0)
        return NULL;
    char *v = xcalloc(H5Tget_size(t) + 1, 1);
    if (H5Aread(a, t, v) < 0) {
        free(v);
        v = NULL;
    }
    H5Tclose(t), H5Aclose(a);
    return v;
}

static bool read_1d(hid_t f, const char *name, hid_t mtype, size_t n, void *out)
{
    if (H5Lexists(f, name, H5P_DEFAULT) <= 0)
        return false;
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT), space = d < 0 ? -1 : H5Dget_space(d);
    hsize_t dim = 0;
    bool ok = space >= 0 && H5Sget_simple_extent_ndims(space) == 1 && H5Sget_simple_extent_dims(space, &dim, NULL) == 1 &&
              dim == n && (n == 0 || H5Dread(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) >= 0);
    H5Sclose(space), H5Dclose(d);
    return ok;
}

struct dpo_ref *dpo_ref_load(const char *path, const char *want_sha256, const char *want_model)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return NULL;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    char *format = f < 0 ? NULL : read_str(f, "format"), *sha = f < 0 ? NULL : read_str(f, "samples_sha256");
    char *model = f < 0 ? NULL : read_str(f, "model"), *samples = f < 0 ? NULL : read_str(f, "samples_path");
    if (!format || strcmp(format, DPO_REF_FORMAT) != 0 || !sha || !model)
        fail_input("'%s' is not a reference log-prob file of shardlm (format %s): delete it or name another "
                   "dpo.ref_log_probs_path", path, DPO_REF_FORMAT);
    if (want_sha256 && strcmp(sha, want_sha256) != 0)
        fail_input("reference log-probs '%s' belong to another preference file (SHA-256 %.12s..., the data's "
                   "%.12s...): delete it to compute them again, or name another dpo.ref_log_probs_path",
                   path, sha, want_sha256);
    if (want_model && strcmp(model, want_model) != 0)
        fail_input("reference log-probs '%s' were computed with another model (%s, this run's %s): delete it to "
                   "compute them again, or name another dpo.ref_log_probs_path", path, model, want_model);
    struct dpo_ref *r = xcalloc(1, sizeof *r);
    hid_t d = H5Dopen2(f, "logps", H5P_DEFAULT), space = d < 0 ? -1 : H5Dget_space(d);
    hsize_t dim = 0;
    if (space < 0 || H5Sget_simple_extent_dims(space, &dim, NULL) != 1 || dim % 2)
        fail_input("reference log-probs '%s': /logps is missing or damaged; delete the file to compute it again", path);
    H5Sclose(space), H5Dclose(d);
    r->n_pairs = (int64_t)dim / 2;
    r->logps = xcalloc(dim ? dim : 1, sizeof *r->logps);
    r->n_targets = xcalloc(dim ? dim : 1, sizeof *r->n_targets);
    if (!read_1d(f, "logps", H5T_NATIVE_DOUBLE, dim, r->logps) ||
        !read_1d(f, "n_targets", H5T_NATIVE_INT64, dim, r->n_targets))
        fail_input("reference log-probs '%s': /logps or /n_targets is missing or damaged; delete the file to compute "
                   "it again", path);
    snprintf(r->sha256, sizeof r->sha256, "%s", sha);
    snprintf(r->model, sizeof r->model, "%s", model);
    snprintf(r->samples_path, sizeof r->samples_path, "%s", samples ? samples : "");
    free(format), free(sha), free(model), free(samples);
    H5Fclose(f);
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

void dpo_ref_default_path(const char *samples_path, char *out, size_t cap)
{
    snprintf(out, cap, "%s.ref-logps.h5", samples_path);
}
