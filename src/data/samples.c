#define _GNU_SOURCE /* qsort_r */

#include "samples.h"

#include "data.h"
#include "core/hf_json.h"
#include "core/util.h"

#include <errno.h>
#include <hdf5.h>
#include <jansson.h>
#include <nettle/sha2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Elements of /tokens and /trained read at a time while the file is checked. */
#define SAMPLES_SCAN_CHUNK ((size_t)1 << 20)

_Static_assert(sizeof(hid_t) == sizeof(int64_t), "samples.h keeps HDF5 ids as int64_t");

/* ------------------------------------------------------------------------ */
/* HDF5                                                                      */

static herr_t first_error(unsigned n, const H5E_error2_t *err, void *data)
{
    char *why = data;
    if (n == 0 && err->desc)
        snprintf(why, 256, "%s", err->desc);
    return 0;
}

__attribute__((noreturn)) static void h5_fail(const struct sample_set *s, const char *doing)
{
    char why[256] = "unknown HDF5 error";
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, first_error, why);
    H5Eclear2(H5E_DEFAULT);
    fail_input("%s '%s': cannot %s (%s): the file is truncated or damaged; make it again with "
               "tools/prepare_data.py",
               s->what, s->path, doing, why);
}

static bool has_attr(const struct sample_set *s, const char *name)
{
    htri_t e = H5Aexists((hid_t)s->file, name);
    if (e < 0)
        h5_fail(s, "read its attributes");
    return e > 0;
}

static int64_t attr_i64(const struct sample_set *s, const char *name)
{
    if (!has_attr(s, name))
        fail_input("%s '%s': attribute '%s' is missing: not a sample file of tools/prepare_data.py", s->what,
                   s->path, name);
    hid_t a = H5Aopen((hid_t)s->file, name, H5P_DEFAULT);
    int64_t v = 0;
    if (a < 0 || H5Aread(a, H5T_NATIVE_INT64, &v) < 0)
        h5_fail(s, "read an attribute");
    H5Aclose(a);
    return v;
}

/* The existing attribute name of loc, a fixed-length string, into buf (cap bytes; "" unless read): 0 read,
 * 1 not a fixed-length string, -1 an HDF5 error. */
static int read_fixed_str(hid_t loc, const char *name, char *buf, size_t cap)
{
    buf[0] = 0;
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT), type = a < 0 ? -1 : H5Aget_type(a);
    const size_t size = type < 0 ? 0 : H5Tget_size(type);
    int r = type < 0 ? -1 : H5Tget_class(type) != H5T_STRING || H5Tis_variable_str(type) > 0 || size == 0 ? 1 : 0;
    if (r == 0) {
        char *v = xcalloc(size + 1, 1);
        if (H5Aread(a, type, v) < 0)
            r = -1;
        else
            snprintf(buf, cap, "%s", v);
        free(v);
    }
    if (type >= 0)
        H5Tclose(type);
    if (a >= 0)
        H5Aclose(a);
    return r;
}

/* A fixed-length string attribute into buf (cap bytes), "" when missing. */
static void attr_str(const struct sample_set *s, const char *name, char *buf, size_t cap)
{
    buf[0] = 0;
    if (!has_attr(s, name))
        return;
    const int r = read_fixed_str((hid_t)s->file, name, buf, cap);
    if (r < 0)
        h5_fail(s, "read an attribute");
    if (r > 0)
        fail_input("%s '%s': attribute '%s' is not a fixed-length string: not a sample file of "
                   "tools/prepare_data.py", s->what, s->path, name);
}

static hid_t open_dataset(const struct sample_set *s, const char *name, size_t *n)
{
    if (H5Lexists((hid_t)s->file, name, H5P_DEFAULT) <= 0)
        fail_input("%s '%s': dataset '%s' is missing: not a sample file of tools/prepare_data.py", s->what, s->path,
                   name);
    hid_t d = H5Dopen2((hid_t)s->file, name, H5P_DEFAULT), space = d < 0 ? -1 : H5Dget_space(d);
    hsize_t dims[2] = {0, 0};
    if (space < 0)
        h5_fail(s, "open a dataset");
    if (H5Sget_simple_extent_ndims(space) != 1)
        fail_input("%s '%s': dataset '%s' is not one-dimensional: not a sample file of tools/prepare_data.py",
                   s->what, s->path, name);
    H5Sget_simple_extent_dims(space, dims, NULL);
    H5Sclose(space);
    *n = (size_t)dims[0];
    return d;
}

/* Elements [at, at + n) of a 1-D dataset, as mem_type, into buf. */
static void read_range(const struct sample_set *s, hid_t d, hid_t mem_type, size_t at, size_t n, void *buf)
{
    if (n == 0)
        return;
    hid_t fspace = H5Dget_space(d);
    hsize_t start = at, count = n;
    hid_t mspace = H5Screate_simple(1, &count, NULL);
    if (fspace < 0 || mspace < 0 || H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &start, NULL, &count, NULL) < 0 ||
        H5Dread(d, mem_type, mspace, fspace, H5P_DEFAULT, buf) < 0)
        h5_fail(s, "read its samples");
    H5Sclose(mspace);
    H5Sclose(fspace);
}

/* ------------------------------------------------------------------------ */
/* Opening and checking                                                      */

bool samples_is_sample_file(const char *path)
{
    size_t n = strlen(path);
    return (n > 3 && strcmp(path + n - 3, ".h5") == 0) || (n > 5 && strcmp(path + n - 5, ".hdf5") == 0);
}

/* Tokens of a Hugging Face tokenizer.json: one more than its largest id (the
 * model's vocabulary and the added tokens); 0 when it cannot be read. */
static int64_t tokenizer_vocab(const char *path)
{
    json_error_t err;
    json_t *root = hf_json_load_file(path, 0, &err);
    if (!root)
        return 0;
    int64_t top = -1;
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(json_object_get(root, "model"), "vocab"), key, v)
        if (json_is_integer(v) && json_integer_value(v) > top)
            top = json_integer_value(v);
    size_t i;
    json_array_foreach(json_object_get(root, "added_tokens"), i, v) {
        json_t *id = json_object_get(v, "id");
        if (json_is_integer(id) && json_integer_value(id) > top)
            top = json_integer_value(id);
    }
    json_decref(root);
    return top + 1;
}

/* The SHA-256 of the file's bytes as 64 lowercase hex digits into hex (what
 * tools/prepare_data.py records of tokenizer.json: hashlib.sha256 of its
 * bytes); false with errno set when it cannot be read. */
bool samples_file_sha256(const char *path, char hex[65])
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    struct sha256_ctx ctx;
    sha256_init(&ctx);
    uint8_t chunk[1 << 16];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        sha256_update(&ctx, n, chunk);
    bool ok = !ferror(f);
    fclose(f);
    uint8_t digest[SHA256_DIGEST_SIZE];
    sha256_digest(&ctx, sizeof digest, digest);
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++)
        snprintf(hex + 2 * i, 3, "%02x", digest[i]);
    if (!ok)
        errno = EIO;
    return ok;
}

/* The file against the run's tokenizer (model.from_pretrained's
 * tokenizer.json, eval's --tokenizer): by the SHA-256 of tokenizer.json that
 * prepare_data.py recorded when the file has one, else by size.
 * data.allow_tokenizer_mismatch turns a mismatch into a warning. */
static void check_tokenizer(struct sample_set *s, int64_t vocab)
{
    const char *run_tok = s->o.tokenizer_json;
    char want[80], have[2 * SHA256_DIGEST_SIZE + 1];
    attr_str(s, "tokenizer_sha256", want, sizeof want);
    if (want[0]) {
        if (!samples_file_sha256(run_tok, have))
            fail_input("%s '%s': cannot read the run's tokenizer %s to compare it with the data's: %s", s->what,
                       s->path, run_tok, strerror(errno));
        if (strcmp(want, have) == 0)
            return;
        if (!s->o.allow_tokenizer_mismatch)
            fail_input("%s '%s': made with another tokenizer than the run's %s (tokenizer.json SHA-256 %.12s..., "
                       "the run's %.12s...): prepare the data again with --tokenizer pointing at the model's "
                       "directory, or set data.allow_tokenizer_mismatch=true if both encode alike",
                       s->what, s->path, run_tok, want, have);
        log_warn("%s '%s': made with another tokenizer than the run's %s (tokenizer.json SHA-256 %.12s..., the "
                 "run's %.12s...); used as it is (data.allow_tokenizer_mismatch)", s->what, s->path, run_tok, want,
                 have);
        return;
    }
    int64_t run_vocab = tokenizer_vocab(run_tok);
    if (run_vocab > 0 && run_vocab != vocab && !s->o.allow_tokenizer_mismatch)
        fail_input("%s '%s': made with a tokenizer of %lld tokens, but the run's tokenizer %s has %lld: "
                   "another tokenizer; prepare the data with --tokenizer pointing at the model's directory, or set "
                   "data.allow_tokenizer_mismatch=true",
                   s->what, s->path, (long long)vocab, run_tok, (long long)run_vocab);
}

static void check_header(struct sample_set *s)
{
    char format[64];
    attr_str(s, "format", format, sizeof format);
    const bool prefs = strcmp(format, PREFERENCES_FORMAT) == 0;
    if (prefs && !s->o.pairs)
        fail_input("%s '%s': a preference file (DPO pairs, tools/prefdata.py): to train on it add a dpo section to "
                   "the config (DPO), or give an SFT sample file of tools/prepare_data.py", s->what, s->path);
    if (!prefs && s->o.pairs && strcmp(format, SAMPLES_FORMAT) == 0)
        fail_input("%s '%s': an SFT sample file, but the config has a dpo section: DPO trains on a preference file "
                   "(tools/prepare_data.py on {\"prompt\", \"chosen\", \"rejected\"} lines); give one, or remove "
                   "the dpo section", s->what, s->path);
    if (!prefs && strcmp(format, SAMPLES_FORMAT) != 0)
        fail_input("%s '%s': not a sample file (attribute format '%s', want '%s'); make it with tools/prepare_data.py",
                   s->what, s->path, format, SAMPLES_FORMAT);
    int64_t version = attr_i64(s, "version");
    if (version != SAMPLES_VERSION)
        fail_input("%s '%s': sample file version %lld; this shardlm reads version %d: make it again with its "
                   "tools/prepare_data.py", s->what, s->path, (long long)version, SAMPLES_VERSION);
    s->max_prompt_length = prefs && has_attr(s, "max_prompt_length") ? attr_i64(s, "max_prompt_length") : -1;
    int64_t vocab = attr_i64(s, "vocab_size");
    if (vocab > s->o.vocab_size)
        fail_input("%s '%s': made with a tokenizer of %lld tokens, the model has %d (model.vocab_size): another "
                   "tokenizer than the model's; prepare the data with the model's tokenizer",
                   s->what, s->path, (long long)vocab, s->o.vocab_size);
    if (s->o.tokenizer_json)
        check_tokenizer(s, vocab);
    int64_t pad = has_attr(s, "pad_token_id") ? attr_i64(s, "pad_token_id") : -1;
    int64_t eos = has_attr(s, "eos_token_id") ? attr_i64(s, "eos_token_id") : -1;
    /* the input id of padding positions (their outputs are never used) */
    s->pad_id = pad >= 0 && pad < s->o.vocab_size ? (int)pad : eos >= 0 && eos < s->o.vocab_size ? (int)eos : 0;
}

/* Reads /offsets and checks them against the token count. */
static void read_offsets(struct sample_set *s)
{
    size_t n_off, n_tokens, n_trained;
    hid_t d = open_dataset(s, "offsets", &n_off);
    s->tokens = open_dataset(s, "tokens", &n_tokens);
    s->trained = open_dataset(s, "trained", &n_trained);
    if (n_off < 2 || n_trained != n_tokens)
        fail_input("%s '%s': %zu offsets for %zu tokens and %zu trained flags: the file is damaged; make it again "
                   "with tools/prepare_data.py", s->what, s->path, n_off, n_tokens, n_trained);
    if (n_off - 1 > UINT32_MAX)
        fail_input("%s '%s': %zu samples; shardlm reads at most %u per file: split the data", s->what, s->path,
                   n_off - 1, UINT32_MAX);
    s->n_file = n_off - 1;
    if (s->o.pairs && s->n_file % 2)
        fail_input("%s '%s': a preference file of %zu samples, an odd number (two a pair): the file is damaged; "
                   "make it again with tools/prepare_data.py", s->what, s->path, s->n_file);
    s->offsets = xcalloc(n_off, sizeof *s->offsets);
    read_range(s, d, H5T_NATIVE_INT64, 0, n_off, s->offsets);
    H5Dclose(d);
    if (s->offsets[0] != 0 || (size_t)s->offsets[s->n_file] != n_tokens)
        fail_input("%s '%s': offsets run from %lld to %lld over %zu tokens: the file is damaged; make it again",
                   s->what, s->path, (long long)s->offsets[0], (long long)s->offsets[s->n_file], n_tokens);
    for (size_t i = 0; i < s->n_file; i++)
        if (s->offsets[i + 1] - s->offsets[i] < 2)
            fail_input("%s '%s': sample %zu has %lld tokens (at least 2 are needed: one to predict from, one to "
                       "predict): the file is damaged; make it again", s->what, s->path, i,
                       (long long)(s->offsets[i + 1] - s->offsets[i]));
}

/* Streams /tokens and /trained once: token ids against the vocabulary, and
 * each sample's trained targets within what truncation keeps. */
static void scan(struct sample_set *s, uint32_t *trained_of)
{
    const size_t n_tokens = (size_t)s->offsets[s->n_file];
    int32_t *tok = xmalloc(SAMPLES_SCAN_CHUNK * sizeof *tok);
    uint8_t *tr = xmalloc(SAMPLES_SCAN_CHUNK);
    size_t sample = 0;
    for (size_t at = 0; at < n_tokens; at += SAMPLES_SCAN_CHUNK) {
        size_t n = n_tokens - at < SAMPLES_SCAN_CHUNK ? n_tokens - at : SAMPLES_SCAN_CHUNK;
        read_range(s, s->tokens, H5T_NATIVE_INT32, at, n, tok);
        read_range(s, s->trained, H5T_NATIVE_UINT8, at, n, tr);
        for (size_t i = 0; i < n; i++) {
            size_t pos = at + i;
            while ((size_t)s->offsets[sample + 1] <= pos)
                sample++;
            if (tok[i] < 0 || tok[i] >= s->o.vocab_size)
                fail_input("%s '%s': sample %zu (token %zu) has token id %d, outside the model's vocabulary of %d: "
                           "the data was made with another tokenizer; prepare it with the model's", s->what,
                           s->path, sample, pos - (size_t)s->offsets[sample], tok[i], s->o.vocab_size);
            size_t in_sample = pos - (size_t)s->offsets[sample];
            if (tr[i] > 1)
                fail_input("%s '%s': sample %zu (token %zu) has trained flag %u, not 0 or 1: the file is damaged; "
                           "make it again with tools/prepare_data.py",
                           s->what, s->path, sample, in_sample, (unsigned)tr[i]);
            if (tr[i] && in_sample > 0 && in_sample < (size_t)s->o.max_len)
                trained_of[sample]++;
        }
    }
    free(tok);
    free(tr);
}

bool samples_file_format(const char *path, char *format, size_t cap)
{
    format[0] = 0;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    struct stat st;
    hid_t f = stat(path, &st) == 0 && S_ISREG(st.st_mode) && H5Fis_hdf5(path) > 0
                  ? H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT) : -1;
    if (f >= 0) {
        if (H5Aexists(f, "format") > 0)
            (void)read_fixed_str(f, "format", format, cap); /* anything else than a string: "" */
        H5Fclose(f);
    }
    H5Eclear2(H5E_DEFAULT);
    return f >= 0;
}

bool samples_is_preference_file(const char *path)
{
    char format[64];
    return samples_file_format(path, format, sizeof format) && strcmp(format, PREFERENCES_FORMAT) == 0;
}

size_t samples_longest(const char *path, int vocab_size, bool pairs, const char *what)
{
    struct sample_set s = {.path = xstrdup(path), .what = what, .o.vocab_size = vocab_size, .o.pairs = pairs};
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        fail_input("%s '%s': no such file; make it with tools/prepare_data.py", what, path);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    s.file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (s.file < 0)
        h5_fail(&s, "open it as HDF5");
    check_header(&s);
    read_offsets(&s);
    size_t longest = 0;
    for (size_t i = 0; i < s.n_file; i++) {
        size_t L = (size_t)(s.offsets[i + 1] - s.offsets[i]);
        longest = L > longest ? L : longest;
    }
    samples_close(&s);
    return longest;
}

void samples_open(struct sample_set *s, const char *path, const struct sample_opts *o, const char *what)
{
    memset(s, 0, sizeof *s);
    s->path = xstrdup(path);
    s->what = what;
    s->o = *o;
    s->cache[0].epoch = s->cache[1].epoch = -1;
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        fail_input("%s '%s': no such file; make it with tools/prepare_data.py", what, path);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    s->file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (s->file < 0)
        h5_fail(s, "open it as HDF5");
    check_header(s);
    s->o.tokenizer_json = NULL; /* checked: the caller's string need not outlive this call (a reopen skips it) */
    read_offsets(s);
    uint32_t *trained_of = xcalloc(s->n_file, sizeof *trained_of);
    scan(s, trained_of);
    s->index = xcalloc(s->n_file, sizeof *s->index);
    s->len = xcalloc(s->n_file, sizeof *s->len);
    s->n_trained = xcalloc(s->n_file, sizeof *s->n_trained);
    s->item_len = xcalloc(s->n_file, sizeof *s->item_len);
    const size_t lanes = (size_t)samples_lanes(s);
    for (size_t i = 0; i < s->n_file; i += lanes) {
        size_t L[2];
        bool longer = false, untrained = false;
        for (size_t j = 0; j < lanes; j++) {
            L[j] = (size_t)(s->offsets[i + j + 1] - s->offsets[i + j]);
            longer |= L[j] > (size_t)o->max_len;
            untrained |= trained_of[i + j] == 0;
        }
        if (longer && !o->truncate) {
            s->n_dropped_long++;
            continue;
        }
        for (size_t j = 0; j < lanes; j++)
            if (L[j] > (size_t)o->max_len) {
                s->n_truncated++;
                L[j] = (size_t)o->max_len;
            }
        if (untrained) {
            s->n_dropped_untrained++;
            continue;
        }
        uint32_t item = 0;
        for (size_t j = 0; j < lanes; j++) {
            s->index[s->n] = (uint32_t)(i + j);
            s->len[s->n] = (uint32_t)L[j];
            s->n_trained[s->n] = trained_of[i + j];
            s->tokens_kept += L[j];
            s->trained_kept += trained_of[i + j];
            s->n++;
            item = (uint32_t)L[j] > item ? (uint32_t)L[j] : item;
        }
        s->item_len[s->n_items++] = item;
    }
    free(trained_of);
    if (s->n == 0)
        fail_input("%s '%s': none of its %zu %s is left to train on (%zu longer than data.seq_len %d and "
                   "dropped, %zu without a trained token within it); raise data.seq_len or use data.truncation "
                   "\"truncate\"", what, path, s->n_file / lanes, o->pairs ? "pairs" : "samples", s->n_dropped_long,
                   o->max_len, s->n_dropped_untrained);
    s->tok_buf = xcalloc((size_t)o->max_len, sizeof *s->tok_buf);
    s->tr_buf = xcalloc((size_t)o->max_len, 1);
}

void samples_close(struct sample_set *s)
{
    if (s->trained > 0)
        H5Dclose((hid_t)s->trained);
    if (s->tokens > 0)
        H5Dclose((hid_t)s->tokens);
    if (s->file > 0)
        H5Fclose((hid_t)s->file);
    for (int c = 0; c < 2; c++) {
        free(s->cache[c].order);
        free(s->cache[c].row_first);
    }
    free(s->epoch_start);
    free(s->offsets);
    free(s->index);
    free(s->len);
    free(s->n_trained);
    free(s->item_len);
    free(s->tok_buf);
    free(s->tr_buf);
    free(s->path);
    memset(s, 0, sizeof *s);
}

/* ------------------------------------------------------------------------ */
/* Order, packing, units                                                     */

/* qsort_r's order for group_by_length; ctx: the kept samples' lengths. */
static int longer_first(const void *a, const void *b, void *ctx)
{
    const uint32_t *len = ctx;
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    if (len[x] != len[y])
        return len[x] > len[y] ? -1 : 1;
    return x < y ? -1 : x > y; /* ties by sample: a total order, the same on every rank */
}

/* Rows of a unit: 2 with pairs (chosen, rejected), else 1. */
int samples_lanes(const struct sample_set *s) { return s->o.pairs ? 2 : 1; }

/* Kept sample of item `item` in lane `lane`: the sample itself, or the pair's chosen (0) or rejected (1). */
static uint32_t sample_of(const struct sample_set *s, uint32_t item, int lane)
{
    return s->o.pairs ? 2 * item + (uint32_t)lane : item;
}

/* First fit over the order: each item goes to the first open row with room
 * (with pairs: the first open row pair with room for the chosen sample in
 * its first row and the rejected in its second), else opens one; past
 * SAMPLES_OPEN_ROWS open rows the oldest is closed. Rows are numbered by
 * when they open; order is rewritten row by row. */
static void pack(const struct sample_set *s, struct sample_epoch *e)
{
    const uint32_t n = s->n_items;
    const int lanes = samples_lanes(s);
    uint32_t *row_of = xcalloc(n ? n : 1, sizeof *row_of), *fill = NULL, *count = NULL;
    size_t rows = 0, cap = 0, oldest_open = 0;
    for (uint32_t i = 0; i < n; i++) {
        size_t r = oldest_open;
        for (; r < rows; r++) {
            bool fits = true;
            for (int k = 0; k < lanes; k++)
                fits &= fill[r * lanes + k] + s->len[sample_of(s, e->order[i], k)] <= (uint32_t)s->o.max_len;
            if (fits)
                break;
        }
        if (r == rows) {
            if (rows == cap) {
                cap = cap ? 2 * cap : 1024;
                fill = xrealloc(fill, cap * lanes * sizeof *fill);
                count = xrealloc(count, cap * sizeof *count);
            }
            for (int k = 0; k < lanes; k++)
                fill[rows * lanes + k] = 0;
            count[rows] = 0;
            rows++;
            if (rows - oldest_open > SAMPLES_OPEN_ROWS)
                oldest_open++;
        }
        for (int k = 0; k < lanes; k++)
            fill[r * lanes + k] += s->len[sample_of(s, e->order[i], k)];
        count[r]++;
        row_of[i] = (uint32_t)r;
    }
    e->n_rows = rows;
    e->row_first = xcalloc(rows + 1, sizeof *e->row_first);
    for (size_t r = 0; r < rows; r++)
        e->row_first[r + 1] = e->row_first[r] + count[r];
    uint32_t *packed = xcalloc(n ? n : 1, sizeof *packed), *next = xcalloc(rows ? rows : 1, sizeof *next);
    for (uint32_t i = 0; i < n; i++)
        packed[e->row_first[row_of[i]] + next[row_of[i]]++] = e->order[i];
    free(e->order);
    e->order = packed;
    free(next);
    free(row_of);
    free(fill);
    free(count);
}

static void build_epoch(const struct sample_set *s, struct sample_epoch *e, int64_t epoch)
{
    free(e->order);
    free(e->row_first);
    e->row_first = NULL;
    e->n_rows = 0;
    e->epoch = epoch;
    const uint32_t n = s->n_items;
    e->order = xcalloc(n, sizeof *e->order);
    for (uint32_t i = 0; i < n; i++)
        e->order[i] = s->o.shuffle ? (uint32_t)data_shuffle_index(i, n, s->o.seed, (uint64_t)epoch) : i;
    if (s->o.group_by_length) {
        const size_t mega = (size_t)SAMPLES_MEGABATCH_STEPS * (size_t)s->o.step_units;
        for (size_t at = 0; at < n; at += mega)
            qsort_r(e->order + at, n - at < mega ? n - at : mega, sizeof *e->order, longer_first, s->item_len);
    }
    if (s->o.packing)
        pack(s, e);
}

static size_t units_of(const struct sample_set *s, const struct sample_epoch *e)
{
    return s->o.packing ? e->n_rows : s->n_items;
}

/* Epoch e's tables (two kept: a step may straddle an epoch boundary). */
static const struct sample_epoch *epoch_of(struct sample_set *s, int64_t epoch)
{
    for (int c = 0; c < 2; c++)
        if (s->cache[c].epoch == epoch)
            return &s->cache[c];
    struct sample_epoch *e = &s->cache[s->cache[0].epoch < s->cache[1].epoch ? 0 : 1];
    build_epoch(s, e, epoch);
    return e;
}

/* Global unit k: its epoch's tables and its index in them. */
static const struct sample_epoch *locate(struct sample_set *s, uint64_t k, size_t *j)
{
    if (!s->o.packing) { /* every epoch has n_items units */
        *j = (size_t)(k % s->n_items);
        return epoch_of(s, (int64_t)(k / s->n_items));
    }
    if (!s->epoch_start) {
        s->epoch_start = xcalloc(1, sizeof *s->epoch_start);
        s->n_epoch_start = 1;
    }
    int64_t e = 0;
    while (1) {
        if (e + 1 >= s->n_epoch_start) { /* units of epoch e not known yet */
            s->epoch_start = xrealloc(s->epoch_start, (size_t)(e + 2) * sizeof *s->epoch_start);
            s->epoch_start[e + 1] = s->epoch_start[e] + units_of(s, epoch_of(s, e));
            s->n_epoch_start = e + 2;
        }
        if (k < s->epoch_start[e + 1])
            break;
        e++;
    }
    *j = (size_t)(k - s->epoch_start[e]);
    return epoch_of(s, e);
}

/* The items (samples or pairs) of global unit k: *first into order, *count of them. */
static const uint32_t *unit_samples(struct sample_set *s, uint64_t k, uint32_t *count)
{
    size_t j;
    const struct sample_epoch *e = locate(s, k, &j);
    if (!s->o.packing) {
        *count = 1;
        return &e->order[j];
    }
    *count = e->row_first[j + 1] - e->row_first[j];
    return &e->order[e->row_first[j]];
}

uint64_t samples_epoch_units(struct sample_set *s)
{
    return units_of(s, epoch_of(s, 0));
}

struct sample_batch samples_batch(struct sample_set *s, uint64_t first, int B)
{
    struct sample_batch b = {0, 0, 0, 0};
    uint64_t longest = 0;
    for (int i = 0; i < B; i++) {
        uint32_t count;
        const uint32_t *item = unit_samples(s, first + (uint64_t)i, &count);
        for (int lane = 0; lane < samples_lanes(s); lane++) {
            uint64_t fill = 0;
            for (uint32_t c = 0; c < count; c++) {
                const uint32_t k = sample_of(s, item[c], lane);
                fill += s->len[k];
                b.trained += s->n_trained[k];
            }
            b.real += fill;
            longest = fill > longest ? fill : longest;
        }
        if (s->o.pairs)
            b.pairs += count;
    }
    uint64_t m = (uint64_t)(s->o.pad_multiple > 0 ? s->o.pad_multiple : 1);
    uint64_t T = (longest + m - 1) / m * m;
    b.T = (int)(T < (uint64_t)s->o.max_len ? T : (uint64_t)s->o.max_len);
    return b;
}

/* Row `row` of T positions: lane `lane` of unit u's items, then padding. */
static void read_row(struct sample_set *s, uint64_t u, int lane, int T, int32_t *in, int32_t *tg, int32_t *pos)
{
    uint32_t count;
    const uint32_t *item = unit_samples(s, u, &count);
    int t = 0;
    for (uint32_t c = 0; c < count; c++) {
        const uint32_t k = sample_of(s, item[c], lane), L = s->len[k];
        if (t + (int)L > T)
            fail_internal("samples: unit %llu does not fit its micro-batch's %d positions", (unsigned long long)u, T);
        const size_t at = (size_t)s->offsets[s->index[k]];
        read_range(s, (hid_t)s->tokens, H5T_NATIVE_INT32, at, L, s->tok_buf);
        read_range(s, (hid_t)s->trained, H5T_NATIVE_UINT8, at, L, s->tr_buf);
        for (uint32_t p = 0; p < L; p++) {
            in[t + (int)p] = s->tok_buf[p];
            tg[t + (int)p] = p + 1 < L && s->tr_buf[p + 1] ? s->tok_buf[p + 1] : -1;
            if (pos)
                pos[t + (int)p] = (int32_t)p;
        }
        t += (int)L;
    }
    for (int p = t; p < T; p++) { /* padding: a segment of its own, nothing trained */
        in[p] = s->pad_id;
        tg[p] = -1;
        if (pos)
            pos[p] = p - t;
    }
}

void samples_read_batch(struct sample_set *s, uint64_t first, int B, int T, int32_t *inputs, int32_t *targets,
                        int32_t *positions)
{
    for (int lane = 0; lane < samples_lanes(s); lane++)
        for (int b = 0; b < B; b++) {
            const size_t at = ((size_t)lane * B + (size_t)b) * T;
            read_row(s, first + (uint64_t)b, lane, T, inputs + at, targets + at, positions ? positions + at : NULL);
        }
}

int samples_batch_pairs(struct sample_set *s, uint64_t first, int B, int64_t *file_pairs, int cap)
{
    int n = 0;
    for (int b = 0; b < B; b++) {
        uint32_t count;
        const uint32_t *item = unit_samples(s, first + (uint64_t)b, &count);
        for (uint32_t c = 0; c < count; c++) {
            if (n == cap)
                fail_internal("samples: more than %d pairs in a micro-batch", cap);
            file_pairs[n++] = s->index[sample_of(s, item[c], 0)] / 2;
        }
    }
    return n;
}
