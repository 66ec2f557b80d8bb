/*
 * pref_eval — a preference file's sample log-probs under a model (see
 * pref_eval.h).
 */
#include "pref_eval.h"

#include "core/util.h"
#include "data/samples.h"
#include "dpo_ref.h"
#include "engine/dpo.h"

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PREF_MAKE "make it with tools/prepare_data.py from preference JSONL ({\"prompt\", \"chosen\", \"rejected\"})"

static void read_format(hid_t f, char *buf, size_t cap)
{
    buf[0] = 0;
    if (H5Aexists(f, "format") <= 0)
        return;
    hid_t a = H5Aopen(f, "format", H5P_DEFAULT), type = a < 0 ? -1 : H5Aget_type(a);
    if (type >= 0 && H5Tget_class(type) == H5T_STRING && H5Tis_variable_str(type) <= 0) {
        char *v = xcalloc(H5Tget_size(type) + 1, 1);
        if (H5Aread(a, type, v) >= 0)
            snprintf(buf, cap, "%s", v);
        free(v);
    }
    if (type >= 0)
        H5Tclose(type);
    if (a >= 0)
        H5Aclose(a);
}

bool pref_data_is_preferences(const char *path)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (util_irregular(path) || H5Fis_hdf5(path) <= 0) {
        H5Eclear2(H5E_DEFAULT);
        return false;
    }
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    char format[64] = "";
    if (f >= 0) {
        read_format(f, format, sizeof format);
        H5Fclose(f);
    }
    H5Eclear2(H5E_DEFAULT);
    return strcmp(format, PREFERENCES_FORMAT) == 0;
}

/* A whole 1-D dataset as mem_type (elem bytes an element); returns its length. */
static size_t read_all(hid_t f, const char *path, const char *name, hid_t mem_type, size_t elem, void **out)
{
    hid_t d = H5Lexists(f, name, H5P_DEFAULT) > 0 ? H5Dopen2(f, name, H5P_DEFAULT) : -1;
    hid_t space = d < 0 ? -1 : H5Dget_space(d);
    if (space < 0 || H5Sget_simple_extent_ndims(space) != 1)
        fail_input("preference file '%s': dataset '/%s' is missing or not one-dimensional: the file is damaged; "
                   PREF_MAKE, path, name);
    hsize_t n = 0;
    H5Sget_simple_extent_dims(space, &n, NULL);
    H5Sclose(space);
    *out = xcalloc((size_t)n + 1, elem);
    if (n && H5Dread(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, *out) < 0)
        fail_input("preference file '%s': cannot read dataset '/%s': the file is truncated or damaged; " PREF_MAKE,
                   path, name);
    H5Dclose(d);
    return (size_t)n;
}

void pref_data_open(struct pref_data *p, const char *path, int vocab_size)
{
    memset(p, 0, sizeof *p);
    snprintf(p->path, sizeof p->path, "%s", path);
    if (!pref_data_is_preferences(path)) {
        const bool sft = samples_is_sample_file(path) && H5Fis_hdf5(path) > 0;
        H5Eclear2(H5E_DEFAULT);
        fail_input("eval --preferences: '%s' is not a preference file (%s): the reward accuracy and margins need "
                   "pairs; %s, or drop --preferences for the loss",
                   path, sft ? "an SFT sample file or another HDF5 file" : "not a sample file", PREF_MAKE);
    }
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0)
        fail_input("preference file '%s': cannot open it: the file is truncated or damaged; " PREF_MAKE, path);
    const size_t n_off = read_all(f, path, "offsets", H5T_NATIVE_INT64, sizeof *p->offsets, (void **)&p->offsets);
    const size_t n_tok = read_all(f, path, "tokens", H5T_NATIVE_INT32, sizeof *p->tokens, (void **)&p->tokens);
    const size_t n_tr = read_all(f, path, "trained", H5T_NATIVE_UINT8, 1, (void **)&p->trained);
    H5Fclose(f);
    if (n_off < 3 || (n_off - 1) % 2 != 0 || n_tr != n_tok || p->offsets[0] != 0 ||
        (size_t)p->offsets[n_off - 1] != n_tok)
        fail_input("preference file '%s': %zu offsets over %zu tokens and %zu trained flags (want an even number of "
                   "samples, two a pair, covering the tokens): the file is damaged; " PREF_MAKE,
                   path, n_off, n_tok, n_tr);
    p->n_pairs = (int64_t)(n_off - 1) / 2;
    for (size_t i = 0; i + 1 < n_off; i++) {
        const int64_t L = p->offsets[i + 1] - p->offsets[i];
        if (L < 2)
            fail_input("preference file '%s': sample %zu has %lld tokens: the file is damaged; " PREF_MAKE, path, i,
                       (long long)L);
        p->longest = (size_t)L > p->longest ? (size_t)L : p->longest;
    }
    for (size_t i = 0; i < n_tok; i++)
        if (p->tokens[i] < 0 || p->tokens[i] >= vocab_size)
            fail_input("preference file '%s': token %zu has id %d, outside the model's vocabulary of %d: made with "
                       "another tokenizer; prepare it with the model's", path, i, p->tokens[i], vocab_size);
    dpo_ref_file_sha256(path, "preference file", p->sha256);
}

size_t pref_data_cut(struct pref_data *p, int T)
{
    p->T = T;
    size_t cut = 0;
    for (int64_t i = 0; i < 2 * p->n_pairs; i++) {
        const int64_t at = p->offsets[i], L = p->offsets[i + 1] - at;
        int64_t trained = 0;
        for (int64_t k = 1; k < (L < T ? L : T); k++)
            trained += p->trained[at + k] != 0;
        if (!trained)
            fail_input("preference file '%s': the %s sample of pair %lld has no trained token within the eval "
                       "length %d: give a longer --seq-len (at most the model's context)",
                       p->path, i % 2 ? "rejected" : "chosen", (long long)(i / 2), T);
        cut += L > T;
    }
    return cut;
}

void pref_data_free(struct pref_data *p)
{
    free(p->offsets);
    free(p->tokens);
    free(p->trained);
    memset(p, 0, sizeof *p);
}

/* Row r of T: sample i's first T tokens, its trained targets, padding (token 0, no target) after. */
static void fill_row(const struct pref_data *p, int64_t i, int T, int32_t *in, int32_t *tg)
{
    const int64_t at = p->offsets[i], L = p->offsets[i + 1] - at < T ? p->offsets[i + 1] - at : T;
    for (int t = 0; t < T; t++) {
        in[t] = t < L ? p->tokens[at + t] : 0;
        tg[t] = t + 1 < L && p->trained[at + t + 1] ? p->tokens[at + t + 1] : -1;
    }
}

void pref_sample_logps(struct infer *s, const struct pref_data *p, int P, bool adapters_off, double *logps,
                       int64_t *n_targets)
{
    const int T = p->T, rows_max = 2 * P;
    const int64_t group = (int64_t)P * s->sess.world, groups = (p->n_pairs + group - 1) / group;
    double *sum = xcalloc((size_t)(4 * p->n_pairs) + 1, sizeof *sum); /* logps, then counts */
    double *lp = xcalloc((size_t)rows_max, sizeof *lp);
    int64_t *nt = xcalloc((size_t)rows_max, sizeof *nt);
    struct family_acts *a = &s->sess.acts;
    a->adapters_off = adapters_off;
    for (int64_t g = 0; g < groups; g++) {
        const int64_t first = g * group + (int64_t)s->sess.rank * P;
        const int pairs = first < p->n_pairs ? (int)(p->n_pairs - first < P ? p->n_pairs - first : P) : 0;
        int rows = 2 * pairs, t = T;
        for (int r = 0; r < rows; r++)
            fill_row(p, 2 * first + r, T, a->inputs + (size_t)r * T, a->targets + (size_t)r * T);
        if (!rows) { /* past the end: one untrained token, so that this rank's gathers still match */
            rows = t = 1;
            a->inputs[0] = 0;
            a->targets[0] = -1;
        }
        if (a->positions)
            for (int k = 0; k < rows * t; k++)
                a->positions[k] = k % t;
        session_forward(&s->sess, rows, t, 1);
        if (!pairs)
            continue;
        const int n = dpo_sequence_logps(a->host_losses, a->targets, NULL, rows, t, lp, nt, rows_max);
        if (n != rows)
            fail_internal("eval: %d sample log-probs from %d rows", n, rows);
        for (int r = 0; r < rows; r++) {
            sum[2 * first + r] = lp[r];
            sum[2 * p->n_pairs + 2 * first + r] = (double)nt[r];
        }
    }
    a->adapters_off = false;
    comm_allreduce(s->sess.comm, sum, (size_t)(4 * p->n_pairs), COMM_F64, COMM_SUM, NULL);
    for (int64_t i = 0; i < 2 * p->n_pairs; i++) {
        logps[i] = sum[i];
        n_targets[i] = (int64_t)sum[2 * p->n_pairs + i];
    }
    free(sum);
    free(lp);
    free(nt);
}
