/*
 * test_dpo_ref — the reference log-prob file of DPO (run/dpo_ref.h): a round
 * trip keeps every value bit for bit and the attributes as written; a file
 * for another preference file or model, a truncated or garbage file, a file
 * without a dataset or with mismatched ones each end in one line naming the
 * file and what to do, exit status 2 (forked children).
 */
#include "check.h"
#include "run/dpo_ref.h"

#include <hdf5.h>
#include <stdlib.h>
#include <string.h>

static char dir[512];

static void tmp_path(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", dir, name);
}

static struct dpo_ref *make_ref(int64_t n_pairs, const char *samples)
{
    struct dpo_ref *r = dpo_ref_new(n_pairs);
    for (int64_t i = 0; i < 2 * n_pairs; i++) {
        r->logps[i] = -1.0 / 3.0 * (double)(i + 1) - 1e-13 * (double)i;
        r->n_targets[i] = 1 + i % 5;
    }
    snprintf(r->sha256, sizeof r->sha256, "%064d", 7);
    r->sha256[3] = 'a';
    dpo_ref_model_id("/models/tiny", "0123456789abcdef", r->model, sizeof r->model);
    snprintf(r->samples_path, sizeof r->samples_path, "%s", samples);
    r->seq_len = 64;
    snprintf(r->dtype, sizeof r->dtype, "fp32");
    return r;
}

struct load_args {
    const char *path, *sha, *model;
};

static void child_load(const void *arg)
{
    const struct load_args *a = arg;
    dpo_ref_free(dpo_ref_load(a->path, a->sha, a->model));
}

/* Exit 2, one line, naming the file, holding phrase and the advice: to delete it only when the file is known to
 * be a reference file (KNOWN_REF: its format attribute says so), else to name one (issue 46). */
static void check_bad(const char *name, const char *path, const char *sha, const char *model, const char *phrase,
                      bool known_ref)
{
    struct load_args a = {path, sha, model};
    char msg[4096], cn[128];
    int status = check_run_child(child_load, &a, msg, sizeof msg);
    printf("# %s: %s", name, msg[0] ? msg : "(no stderr)\n");
    const char *nl = strchr(msg, '\n');
    snprintf(cn, sizeof cn, "%s_exit_2", name);
    CHECK(cn, status == 2, "exit status %d, want 2", status);
    snprintf(cn, sizeof cn, "%s_one_line", name);
    CHECK(cn, nl && nl[1] == 0, "stderr is not one line: %s", msg);
    snprintf(cn, sizeof cn, "%s_names_file", name);
    CHECK(cn, strstr(msg, path) != NULL, "stderr does not name %s: %s", path, msg);
    snprintf(cn, sizeof cn, "%s_says_why", name);
    CHECK(cn, strstr(msg, phrase) != NULL, "stderr lacks '%s': %s", phrase, msg);
    snprintf(cn, sizeof cn, "%s_says_what_to_do", name);
    if (known_ref)
        CHECK(cn, strstr(msg, "delete it (it is computed again)") != NULL, "stderr gives no advice: %s", msg);
    else
        CHECK(cn, strstr(msg, "name a reference log-prob file") != NULL && strstr(msg, "delete it") == NULL,
              "a file not known as a reference file: want 'name a reference log-prob file', no 'delete it': %s",
              msg);
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, n, f);
    fclose(f);
}

/* Copies src to dst, keeping only the first keep bytes (all when keep is 0). */
static void copy_file(const char *src, const char *dst, long keep)
{
    FILE *f = fopen(src, "rb");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = xmalloc((size_t)n);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n)
        n = 0;
    fclose(f);
    write_bytes(dst, buf, (size_t)(keep > 0 && keep < n ? keep : n));
    free(buf);
}

/* Removes (or renames to a wrong shape) dataset name of a copy of src at dst. */
static void damage_dataset(const char *src, const char *dst, const char *name, bool resize)
{
    copy_file(src, dst, 0);
    hid_t f = H5Fopen(dst, H5F_ACC_RDWR, H5P_DEFAULT);
    H5Ldelete(f, name, H5P_DEFAULT);
    if (resize) {
        hsize_t dim = 3;
        int64_t v[3] = {1, 1, 1};
        hid_t space = H5Screate_simple(1, &dim, NULL);
        hid_t d = H5Dcreate2(f, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
        H5Dclose(d);
        H5Sclose(space);
    }
    H5Fclose(f);
}

/* Rewrites a copy of src at dst: version set to `version`, attribute `drop` removed (NULL: none). */
static void rewrite_header(const char *src, const char *dst, int64_t version, const char *drop)
{
    copy_file(src, dst, 0);
    hid_t f = H5Fopen(dst, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t a = H5Aopen(f, "version", H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, &version);
    H5Aclose(a);
    if (drop)
        H5Adelete(f, drop);
    H5Fclose(f);
}

struct seq_len_args {
    const char *path;
    int seq_len;
};

static void child_seq_len(const void *arg)
{
    const struct seq_len_args *a = arg;
    struct dpo_ref *r = dpo_ref_load(a->path, NULL, NULL);
    dpo_ref_check_seq_len(r, a->path, a->seq_len, "delete it or set data.seq_len");
    dpo_ref_free(r);
}

/* Version 2 (k38pref): seq_len and max_prompt_length recorded and read back; version-1 files still read (seq_len
 * unknown, never refused for it); a run at another seq_len refused in one line naming both lengths. */
static void check_seq_len(const char *samples)
{
    char path[600], old[600], msg[4096];
    struct dpo_ref *w = make_ref(3, samples);
    w->seq_len = 48;
    w->max_prompt_length = 7;
    tmp_path(path, sizeof path, "v2.h5");
    dpo_ref_save(path, w);
    struct dpo_ref *r = dpo_ref_load(path, NULL, NULL);
    CHECK("v2_seq_len_round_trip", r && r->seq_len == 48 && r->max_prompt_length == 7,
          "seq_len %d, max_prompt_length %lld", r ? r->seq_len : -1, r ? (long long)r->max_prompt_length : -9);
    dpo_ref_free(r);
    struct seq_len_args same = {path, 48}, other = {path, 32};
    int status = check_run_child(child_seq_len, &same, msg, sizeof msg);
    CHECK("v2_same_seq_len_passes", status == 0, "exit %d: %s", status, msg);
    status = check_run_child(child_seq_len, &other, msg, sizeof msg);
    printf("# other_seq_len: %s", msg[0] ? msg : "(no stderr)\n");
    const char *nl = strchr(msg, '\n');
    CHECK("other_seq_len_exit_2", status == 2, "exit status %d, want 2", status);
    CHECK("other_seq_len_one_line", nl && nl[1] == 0 && strstr(msg, path) != NULL, "%s", msg);
    CHECK("other_seq_len_names_both", strstr(msg, "data.seq_len 48") && strstr(msg, "is 32") &&
          strstr(msg, "delete it"), "%s", msg);

    /* a preference file without max_prompt_length: none recorded */
    w->max_prompt_length = -1;
    tmp_path(path, sizeof path, "v2_no_prompt.h5");
    dpo_ref_save(path, w);
    r = dpo_ref_load(path, NULL, NULL);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    const htri_t has = H5Aexists(f, "max_prompt_length");
    H5Fclose(f);
    CHECK("v2_no_max_prompt_length", r && r->max_prompt_length == -1 && has == 0, "max_prompt_length %lld, attr %d",
          r ? (long long)r->max_prompt_length : -9, (int)has);
    dpo_ref_free(r);

    /* version 1 (no seq_len): read, seq_len unknown, no length refused */
    tmp_path(old, sizeof old, "v1.h5");
    rewrite_header(path, old, 1, "seq_len");
    r = dpo_ref_load(old, NULL, NULL);
    CHECK("v1_still_read", r && r->n_pairs == 3 && r->seq_len == 0 && r->logps[5] == w->logps[5],
          "a version-1 file did not load as one");
    dpo_ref_free(r);
    struct seq_len_args v1 = {old, 32};
    status = check_run_child(child_seq_len, &v1, msg, sizeof msg);
    CHECK("v1_any_seq_len_passes", status == 0, "exit %d: %s", status, msg);

    /* version 2 without seq_len, an unknown version */
    tmp_path(old, sizeof old, "v2_no_seq_len.h5");
    rewrite_header(path, old, 2, "seq_len");
    check_bad("v2_without_seq_len", old, NULL, NULL, "attribute 'seq_len' is missing", true);
    tmp_path(old, sizeof old, "v4.h5");
    rewrite_header(path, old, 4, NULL);
    check_bad("unknown_version", old, NULL, NULL, "version 4", true);
    dpo_ref_free(w);
}

static void child_dtype(const void *arg)
{
    const char *path = arg;
    struct dpo_ref *r = dpo_ref_load(path, NULL, NULL);
    dpo_ref_check_dtype(r, path, "bf16", "delete it or keep the dtype");
    dpo_ref_free(r);
}

/* Version 3 (issue 46): the dtype of the computation and a CRC-32C of the data, recorded and read back; an
 * edited value refused by the checksum (one line, naming the file); another dtype refused by
 * dpo_ref_check_dtype naming both; a file before version 3 (neither recorded) passes both. */
static void check_integrity(const char *samples)
{
    char path[600], old[600], msg[4096];
    struct dpo_ref *w = make_ref(3, samples);
    tmp_path(path, sizeof path, "v3.h5");
    dpo_ref_save(path, w);
    struct dpo_ref *r = dpo_ref_load(path, NULL, NULL);
    CHECK("v3_round_trip", r && r->version == 3 && strcmp(r->dtype, "fp32") == 0 && r->data_crc32c != 0,
          "version %d, dtype '%s', crc %08x", r ? r->version : -1, r ? r->dtype : "", r ? r->data_crc32c : 0);
    dpo_ref_free(r);
    /* one value changed in place, to another valid log-prob: only the checksum tells */
    tmp_path(old, sizeof old, "edited.h5");
    copy_file(path, old, 0);
    hid_t f = H5Fopen(old, H5F_ACC_RDWR, H5P_DEFAULT), d = H5Dopen2(f, "logps", H5P_DEFAULT);
    double values[6];
    H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values);
    values[2] -= 0.25;
    H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values);
    H5Dclose(d);
    H5Fclose(f);
    check_bad("edited_value", old, NULL, NULL, "does not match its checksum", true);
    int status = check_run_child(child_dtype, path, msg, sizeof msg);
    printf("# other_dtype: %s", msg[0] ? msg : "(no stderr)\n");
    CHECK("other_dtype_refused", status == 2 && strstr(msg, "computed in fp32, this run trains in bf16") &&
          strstr(msg, path), "exit %d: %s", status, msg);
    /* version 2 (no dtype, no checksum): an edited value and any dtype pass, as before */
    tmp_path(path, sizeof path, "v2_edited.h5");
    rewrite_header(old, path, 2, "dtype");
    status = check_run_child(child_dtype, path, msg, sizeof msg);
    CHECK("v2_unchecked", status == 0, "exit %d: %s", status, msg);
    dpo_ref_free(w);
}

int main(void)
{
    const char *base = getenv("SHARDLM_TEST_TMP");
    snprintf(dir, sizeof dir, "%s/test_dpo_ref.XXXXXX", base && base[0] ? base : "/tmp");
    if (!mkdtemp(dir)) {
        printf("FAIL mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    char good[600], samples[600], path[600];
    tmp_path(good, sizeof good, "pairs.h5.ref-logps.h5");
    tmp_path(samples, sizeof samples, "pairs.h5");
    write_bytes(samples, "abc", 3);

    /* the default path and the SHA-256 of a file (hashlib.sha256(b"abc")) */
    char def[700], hex[65];
    dpo_ref_default_path(samples, def, sizeof def);
    CHECK("default_path", strcmp(def, good) == 0, "got %s, want %s", def, good);
    dpo_ref_file_sha256(samples, "preference file", hex);
    CHECK("sha256_of_file", strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0,
          "got %s", hex);

    /* absent: NULL */
    tmp_path(path, sizeof path, "absent.h5");
    CHECK("absent_is_null", dpo_ref_load(path, NULL, NULL) == NULL, "an absent file loaded");

    /* round trip */
    struct dpo_ref *w = make_ref(5, samples);
    dpo_ref_save(good, w);
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s.tmp", good);
    CHECK("no_tmp_left", access(tmp, F_OK) != 0, "%s is left behind", tmp);
    struct dpo_ref *r = dpo_ref_load(good, w->sha256, w->model);
    bool same = r && r->n_pairs == 5;
    for (int i = 0; same && i < 10; i++)
        same = memcmp(&r->logps[i], &w->logps[i], sizeof(double)) == 0 && r->n_targets[i] == w->n_targets[i];
    CHECK("round_trip_values", same, "values differ after a round trip");
    CHECK("round_trip_attrs",
          r && strcmp(r->sha256, w->sha256) == 0 && strcmp(r->model, "/models/tiny (checksum 0123456789abcdef)") == 0 &&
              strcmp(r->samples_path, samples) == 0,
          "attributes differ: sha %s model %s samples %s", r ? r->sha256 : "", r ? r->model : "",
          r ? r->samples_path : "");
    dpo_ref_free(r);
    r = dpo_ref_load(good, NULL, NULL);
    CHECK("load_unchecked", r && r->n_pairs == 5, "NULL wants did not load");
    dpo_ref_free(r);

    /* an empty model string and zero pairs round trip too */
    struct dpo_ref *e = dpo_ref_new(0);
    snprintf(e->sha256, sizeof e->sha256, "%s", w->sha256);
    snprintf(e->samples_path, sizeof e->samples_path, "%s", samples);
    e->seq_len = 8;
    snprintf(e->dtype, sizeof e->dtype, "bf16");
    tmp_path(path, sizeof path, "empty.h5");
    dpo_ref_save(path, e);
    r = dpo_ref_load(path, e->sha256, "");
    CHECK("round_trip_empty", r && r->n_pairs == 0 && r->model[0] == 0, "an empty file did not round trip");
    dpo_ref_free(r);
    dpo_ref_free(e);

    /* another preference file, another model */
    char other_sha[65];
    snprintf(other_sha, sizeof other_sha, "%s", w->sha256);
    other_sha[0] = 'f';
    check_bad("wrong_sha", good, other_sha, w->model, "another preference file", true);
    check_bad("wrong_model", good, w->sha256, "/models/other (checksum 1)", "another model", true);

    /* truncated, garbage, empty, a directory */
    tmp_path(path, sizeof path, "truncated.h5");
    copy_file(good, path, 1000);
    check_bad("truncated", path, NULL, NULL, "truncated", false);
    tmp_path(path, sizeof path, "garbage.h5");
    write_bytes(path, "this is not an HDF5 file at all, just some text\n", 48);
    check_bad("garbage", path, NULL, NULL, "not an HDF5 file", false);
    tmp_path(path, sizeof path, "zero.h5");
    write_bytes(path, "", 0);
    check_bad("empty_file", path, NULL, NULL, "not an HDF5 file", false);
    check_bad("directory", dir, NULL, NULL, "not a file", false);

    /* another HDF5 file: the preference file's format */
    tmp_path(path, sizeof path, "samples_like.h5");
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    H5Fclose(f);
    check_bad("no_format", path, NULL, NULL, "not a reference log-prob file", false);

    /* missing or mismatched datasets */
    tmp_path(path, sizeof path, "no_logps.h5");
    damage_dataset(good, path, "logps", false);
    check_bad("missing_logps", path, NULL, NULL, "dataset '/logps' is missing", true);
    tmp_path(path, sizeof path, "no_targets.h5");
    damage_dataset(good, path, "n_targets", false);
    check_bad("missing_n_targets", path, NULL, NULL, "dataset '/n_targets' is missing", true);
    tmp_path(path, sizeof path, "short_targets.h5");
    damage_dataset(good, path, "n_targets", true);
    check_bad("mismatched_datasets", path, NULL, NULL, "10 log-probs and 3 target counts", true);

    /* a pair left out by the run: NaN over 0 targets */
    w->logps[4] = w->logps[5] = NAN;
    w->n_targets[4] = w->n_targets[5] = 0;
    tmp_path(path, sizeof path, "left_out.h5");
    dpo_ref_save(path, w);
    r = dpo_ref_load(path, NULL, NULL);
    CHECK("left_out_pair", r && !dpo_ref_has(r, 4) && !dpo_ref_has(r, 5) && dpo_ref_has(r, 3) && isnan(r->logps[4]),
          "a left-out pair did not load as one");
    dpo_ref_free(r);
    w->n_targets[5] = 2;
    tmp_path(path, sizeof path, "nan_with_targets.h5");
    dpo_ref_save(path, w);
    check_bad("nan_with_targets", path, NULL, NULL, "sample 5", true);
    w->logps[4] = w->logps[5] = -1.0;

    /* a positive log-prob is no log-prob */
    w->logps[3] = 0.5;
    tmp_path(path, sizeof path, "positive.h5");
    dpo_ref_save(path, w);
    check_bad("positive_logp", path, NULL, NULL, "sample 3", true);
    dpo_ref_free(w);

    check_seq_len(samples);
    check_integrity(samples);

    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        printf("# could not remove %s\n", dir);
    return check_status();
}
