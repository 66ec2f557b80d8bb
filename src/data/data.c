#include "data.h"

#include "core/util.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Tokens are read into buffers as host integers; the format is little-endian,
 * so a big-endian host would need a byte swap on every read. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "data.c reads little-endian token shards as host integers; add byte swapping for this host"
#endif

/* Token bytes read per pread while a file is validated at open: 1 MiB. */
#define DATA_SCAN_CHUNK_BYTES ((size_t)1 << 20)

#define DATA_HEADER_BYTES ((size_t)DATA_HEADER_INTS * sizeof(int32_t))

/* Tokens converted per fwrite when writing a shard: 256 KiB of uint32. */
#define DATA_WRITE_CHUNK 65536

/* Rounds of the Feistel network behind the shuffle. Four rounds with a
 * strong round function give a pseudo-random permutation (Luby–Rackoff). */
#define DATA_FEISTEL_ROUNDS 4

/* ------------------------------------------------------------------------ */
/* Opening and validating one file                                           */

static const char *token_type_name(int token_bytes) { return token_bytes == 2 ? "uint16" : "uint32"; }

/* Index of the first token >= vocab_size, or n when all are valid. The common
 * case (all valid) is a vectorizable max over the whole file; only a failing
 * file is scanned a second time for the position to report. Serial on
 * purpose: a 100M-token shard takes tens of milliseconds, bounded by page
 * faults, and an OpenMP region here would hang a process forked after it
 * (libgomp's thread pool does not survive fork). */
static size_t first_bad_token(const void *tokens, size_t n, int token_bytes, uint32_t vocab_size)
{
    uint32_t max_id = 0;
    if (token_bytes == 2) {
        const uint16_t *t = tokens;
        if (vocab_size > UINT16_MAX)
            return n; /* every uint16 fits */
        for (size_t i = 0; i < n; i++)
            max_id = t[i] > max_id ? t[i] : max_id;
    } else {
        const uint32_t *t = tokens;
        for (size_t i = 0; i < n; i++)
            max_id = t[i] > max_id ? t[i] : max_id;
    }
    if (max_id < vocab_size)
        return n;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = token_bytes == 2 ? ((const uint16_t *)tokens)[i] : ((const uint32_t *)tokens)[i];
        if (id >= vocab_size)
            return i;
    }
    return n; /* unreachable: max_id >= vocab_size means some token is */
}

/* Token width for a (magic, version) pair, or 0 when the version is unknown. */
static int token_bytes_for(int32_t magic, int32_t version)
{
    if (magic == DATA_MAGIC_LLMC && version == DATA_VERSION_U16)
        return 2;
    if (magic == DATA_MAGIC_LLMC && version == DATA_VERSION_U32)
        return 4;
    if (magic == DATA_MAGIC_LLMC_LLAMA3 && version == DATA_VERSION_LLAMA3_U32)
        return 4;
    return 0;
}

/* Reads COUNT bytes at OFFSET of file F into BUF; a short read means the file
 * shrank (or changed) after it was checked, which is an input error naming
 * it, never a crash: the loader reads with pread, not from a mapping, so a
 * file truncated under a running job cannot raise SIGBUS. */
static void read_exact(const struct data_file *f, const char *what, void *buf, size_t count, size_t offset)
{
    size_t done = 0;
    while (done < count) {
        ssize_t got = pread(f->fd, (char *)buf + done, count - done, (off_t)(offset + done));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            struct stat st;
            long long now = fstat(f->fd, &st) == 0 ? (long long)st.st_size : -1;
            fail_input("%s '%s' changed while in use: reading bytes [%zu, %zu) %s (it had %zu bytes when checked, "
                       "%lld now). Hint: do not rewrite a data file during a run; write a new file and rename it "
                       "over the old one",
                       what, f->path, offset, offset + count, got < 0 ? strerror(errno) : "hit its end",
                       f->file_bytes, now);
        }
        done += (size_t)got;
    }
}

/* Opens f->path and checks the header, the size and every token id. Every
 * problem is a fail_input() that names the file and says what to do. */
static void data_file_open(struct data_file *f, const char *what, int vocab_size)
{
    const char *path = f->path;
    /* O_NONBLOCK: a FIFO given as data must be refused, not block the open */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        fail_input("cannot open %s '%s': %s; check the data path in the config", what, path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0)
        fail_input("cannot stat %s '%s': %s", what, path, strerror(errno));
    if (S_ISDIR(st.st_mode))
        fail_input("%s '%s' is a directory; give a .bin file or a glob such as '%s/*.bin'", what, path, path);
    if (!S_ISREG(st.st_mode))
        fail_input("%s '%s' is not a regular file; give a .bin token shard", what, path);
    size_t file_bytes = (size_t)st.st_size;
    if (file_bytes == 0)
        fail_input("%s '%s' is empty; regenerate it (tools/text_to_bin.py or llm.c's dev/data scripts)", what, path);
    if (file_bytes < DATA_HEADER_BYTES)
        fail_input("%s '%s' has %zu bytes, shorter than the %zu-byte llm.c header; the file is truncated or not a token shard",
                   what, path, file_bytes, DATA_HEADER_BYTES);

    f->fd = fd;
    f->file_bytes = file_bytes;
    int32_t header[DATA_HEADER_INTS];
    read_exact(f, what, header, sizeof header, 0);
    int32_t magic = header[0], version = header[1], count = header[2];
    if (magic != DATA_MAGIC_LLMC && magic != DATA_MAGIC_LLMC_LLAMA3)
        fail_input("%s '%s' is not an llm.c token shard (magic %d, expected %d or %d); "
                   "convert text with tools/text_to_bin.py",
                   what, path, magic, DATA_MAGIC_LLMC, DATA_MAGIC_LLMC_LLAMA3);
    int token_bytes = token_bytes_for(magic, version);
    if (token_bytes == 0)
        fail_input("%s '%s' has unsupported version %d for magic %d (supported: magic %d version %d = uint16 or "
                   "%d = uint32, magic %d version %d = uint32); regenerate the shard",
                   what, path, version, magic, DATA_MAGIC_LLMC, DATA_VERSION_U16, DATA_VERSION_U32,
                   DATA_MAGIC_LLMC_LLAMA3, DATA_VERSION_LLAMA3_U32);
    if (count < 0)
        fail_input("%s '%s' has a negative token count %d in its header; the file is corrupt, regenerate it",
                   what, path, count);

    size_t n_tokens = (size_t)count;
    size_t tokens_in_file = (file_bytes - DATA_HEADER_BYTES) / (size_t)token_bytes;
    if (n_tokens > tokens_in_file)
        fail_input("%s '%s' is truncated: the header says %zu tokens but the file holds %zu (%zu bytes of %s); "
                   "copy or regenerate it",
                   what, path, n_tokens, tokens_in_file, file_bytes - DATA_HEADER_BYTES, token_type_name(token_bytes));
    /* llm.c rejects any size other than header + count tokens too: extra bytes
     * mean the count or the token width is wrong, not harmless padding. */
    if (file_bytes != DATA_HEADER_BYTES + n_tokens * (size_t)token_bytes)
        fail_input("%s '%s' has %zu bytes after the header but the header says %zu %s tokens (%zu bytes); "
                   "the file is corrupt, regenerate it",
                   what, path, file_bytes - DATA_HEADER_BYTES, n_tokens, token_type_name(token_bytes),
                   n_tokens * (size_t)token_bytes);

    void *chunk = xmalloc(DATA_SCAN_CHUNK_BYTES);
    size_t per_chunk = DATA_SCAN_CHUNK_BYTES / (size_t)token_bytes;
    for (size_t first = 0; first < n_tokens; first += per_chunk) {
        size_t n = n_tokens - first < per_chunk ? n_tokens - first : per_chunk;
        read_exact(f, what, chunk, n * (size_t)token_bytes, DATA_HEADER_BYTES + first * (size_t)token_bytes);
        size_t bad = first_bad_token(chunk, n, token_bytes, (uint32_t)vocab_size);
        if (bad < n) {
            uint32_t id = token_bytes == 2 ? ((const uint16_t *)chunk)[bad] : ((const uint32_t *)chunk)[bad];
            fail_input("%s '%s': token %u at position %zu is >= the vocabulary size %d; "
                       "the data was made with a different tokenizer or model.vocab_size is too small",
                       what, path, id, first + bad, vocab_size);
        }
    }
    free(chunk);
    f->n_tokens = n_tokens;
    f->token_bytes = token_bytes;
}

/* ------------------------------------------------------------------------ */
/* The data set                                                              */

static int compare_files_by_path(const void *a, const void *b)
{
    const struct data_file *fa = a, *fb = b;
    return strcmp(fa->path, fb->path);
}

static bool has_glob_chars(const char *s) { return strpbrk(s, "*?[") != NULL; }

void dataset_open(struct dataset *ds, const char *path, int seq_len, int vocab_size,
                  bool shuffle, uint64_t seed, const char *what)
{
    if (seq_len < 1 || vocab_size < 1)
        fail_internal("dataset_open(%s): seq_len %d and vocab_size %d must be positive", what, seq_len, vocab_size);
    memset(ds, 0, sizeof *ds);

    glob_t g;
    int rc = glob(path, 0, NULL, &g);
    if (rc == GLOB_NOMATCH) {
        if (has_glob_chars(path))
            fail_input("no file matches the %s path '%s'; check the data path in the config", what, path);
        fail_input("cannot open %s '%s': %s; check the data path in the config", what, path, strerror(ENOENT));
    }
    if (rc != 0)
        fail_input("cannot expand %s path '%s' (glob error %d)", what, path, rc);
    if (g.gl_pathc > INT_MAX)
        fail_input("%s '%s' matches %zu files, more than %d", what, path, (size_t)g.gl_pathc, INT_MAX);

    /* Sorted by byte value, not by locale, so every rank and every machine
     * sees the same file order and hence the same windows. */
    ds->n_files = (int)g.gl_pathc;
    ds->files = xcalloc((size_t)ds->n_files, sizeof *ds->files);
    for (int i = 0; i < ds->n_files; i++)
        ds->files[i].path = xstrdup(g.gl_pathv[i]);
    globfree(&g);
    qsort(ds->files, (size_t)ds->n_files, sizeof *ds->files, compare_files_by_path);

    ds->seq_len = seq_len;
    ds->shuffle = shuffle;
    ds->seed = seed;
    ds->vocab_size = vocab_size;
    ds->what = what;
    ds->window_buf = xmalloc(((size_t)seq_len + 1) * sizeof(uint32_t));
    size_t T = (size_t)seq_len, most_tokens = 0;
    for (int i = 0; i < ds->n_files; i++) {
        struct data_file *f = &ds->files[i];
        data_file_open(f, what, vocab_size);
        /* Stride T: window j is tokens [j*T, j*T + T + 1), so consecutive
         * windows share one boundary token and every token after the first
         * is a target exactly once (but a tail of fewer than T tokens). */
        f->n_windows = f->n_tokens > T ? (f->n_tokens - 1) / T : 0;
        f->first_window = ds->n_windows;
        ds->n_windows += f->n_windows;
        most_tokens = f->n_tokens > most_tokens ? f->n_tokens : most_tokens;
        if (f->n_windows == 0 && ds->n_files > 1)
            log_warn("%s '%s' has %zu tokens, fewer than seq_len+1 = %zu: it contributes no samples",
                     what, f->path, f->n_tokens, T + 1);
    }
    if (ds->n_windows == 0)
        fail_input("%s '%s' has no sample: need at least T+1 = %zu tokens in one file (seq_len %d), the largest of "
                   "its %d file(s) has %zu; use more data or a shorter model.seq_len",
                   what, path, T + 1, seq_len, ds->n_files, most_tokens);
}

void dataset_close(struct dataset *ds)
{
    for (int i = 0; i < ds->n_files; i++) {
        struct data_file *f = &ds->files[i];
        if (f->fd > 0)
            close(f->fd);
        free(f->path);
    }
    free(ds->files);
    free(ds->window_buf);
    memset(ds, 0, sizeof *ds);
}

/* ------------------------------------------------------------------------ */
/* The shuffle: a keyed bijection of [0, S) with no table                    */

/* Round function of the Feistel network: a 64-bit mix of half and key. */
static inline uint64_t feistel_round(uint64_t half, uint64_t key)
{
    uint64_t state = half ^ key;
    return splitmix64(&state);
}

/* Window of position i in the given epoch. A balanced Feistel network on
 * 2*half_bits bits is a bijection of [0, 4^half_bits) whatever the round
 * function; cycle walking (re-applying it until the value lands below S)
 * restricts it to a bijection of [0, S). The domain is < 4*S, so the walk
 * takes under four steps on average. */
size_t data_shuffle_index(uint64_t i, uint64_t S, uint64_t seed, uint64_t epoch)
{
    if (S <= 1)
        return 0;
    unsigned bits = 0;
    while (bits < 64 && (UINT64_C(1) << bits) < S)
        bits++;
    unsigned half_bits = (bits + 1) / 2;
    uint64_t half_mask = (UINT64_C(1) << half_bits) - 1;

    /* Round keys depend on seed and epoch only; the odd constant spreads
     * consecutive epochs far apart before splitmix64 mixes them. */
    uint64_t key_state = seed ^ (epoch * UINT64_C(0xD1B54A32D192ED03));
    uint64_t keys[DATA_FEISTEL_ROUNDS];
    for (int r = 0; r < DATA_FEISTEL_ROUNDS; r++)
        keys[r] = splitmix64(&key_state);

    uint64_t x = i;
    do {
        uint64_t left = x >> half_bits, right = x & half_mask;
        for (int r = 0; r < DATA_FEISTEL_ROUNDS; r++) {
            uint64_t next = left ^ (feistel_round(right, keys[r]) & half_mask);
            left = right;
            right = next;
        }
        x = (left << half_bits) | right;
    } while (x >= S);
    return (size_t)x;
}

size_t dataset_window(const struct dataset *ds, uint64_t k)
{
    uint64_t S = ds->n_windows;
    if (S == 0)
        fail_internal("dataset_window on a data set with no windows");
    uint64_t epoch = k / S, i = k % S;
    return ds->shuffle ? data_shuffle_index(i, S, ds->seed, epoch) : (size_t)i;
}

/* ------------------------------------------------------------------------ */
/* Reading                                                                   */

/* File holding window w (< n_windows): the last file whose first_window is
 * <= w. The next file starts at first_window + n_windows > w, so that file
 * holds w; files with no windows share first_window with their successor
 * and are never the last such file unless w is out of range. */
static const struct data_file *file_of_window(const struct dataset *ds, size_t w)
{
    int lo = 0, hi = ds->n_files - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (ds->files[mid].first_window <= w)
            lo = mid;
        else
            hi = mid - 1;
    }
    return &ds->files[lo];
}

void dataset_read_window(const struct dataset *ds, size_t w, int32_t *inputs, int32_t *targets)
{
    if (w >= ds->n_windows)
        fail_internal("window %zu out of range (data set has %zu)", w, ds->n_windows);
    const struct data_file *f = file_of_window(ds, w);
    size_t T = (size_t)ds->seq_len;
    size_t start = (w - f->first_window) * T;
    if (w < f->first_window || start + T + 1 > f->n_tokens)
        fail_internal("window %zu maps outside '%s' (%zu tokens)", w, f->path, f->n_tokens);
    size_t tb = (size_t)f->token_bytes;
    read_exact(f, ds->what, ds->window_buf, (T + 1) * tb, DATA_HEADER_BYTES + start * tb);
    /* checked at open, but the file may have been rewritten in place since:
     * an id past the vocabulary would index outside the embedding */
    size_t bad = first_bad_token(ds->window_buf, T + 1, f->token_bytes, (uint32_t)ds->vocab_size);
    if (bad <= T)
        fail_input("%s '%s' changed while in use: token %zu now holds an id >= the vocabulary size %d. Hint: do "
                   "not rewrite a data file during a run; write a new file and rename it over the old one",
                   ds->what, f->path, start + bad, ds->vocab_size);
    if (f->token_bytes == 2) {
        const uint16_t *t = ds->window_buf;
        for (size_t i = 0; i < T; i++) {
            inputs[i] = t[i];
            targets[i] = t[i + 1];
        }
    } else {
        /* ids are < vocab_size (an int), so they fit in int32 */
        const uint32_t *t = ds->window_buf;
        for (size_t i = 0; i < T; i++) {
            inputs[i] = (int32_t)t[i];
            targets[i] = (int32_t)t[i + 1];
        }
    }
}

void dataset_read_batch(const struct dataset *ds, uint64_t first, int B, int32_t *inputs, int32_t *targets)
{
    size_t T = (size_t)ds->seq_len;
    for (int b = 0; b < B; b++)
        dataset_read_window(ds, dataset_window(ds, first + (uint64_t)b), inputs + (size_t)b * T,
                            targets + (size_t)b * T);
}

/* ------------------------------------------------------------------------ */
/* Writing                                                                   */

static void write_checked(FILE *fp, const void *buf, size_t bytes, const char *path)
{
    if (bytes && fwrite(buf, 1, bytes, fp) != bytes)
        fail_input("cannot write token shard '%s': %s; check free disk space and permissions", path,
                   strerror(errno));
}

void data_write_bin(const char *path, const uint32_t *tokens, size_t n, int token_bytes)
{
    if (n > (size_t)INT32_MAX)
        fail_input("cannot write token shard '%s': %zu tokens exceed the header's int32 count; split into shards",
                   path, n);
    bool narrow = token_bytes == 2;
    int32_t header[DATA_HEADER_INTS] = {0};
    header[0] = DATA_MAGIC_LLMC;
    header[1] = narrow ? DATA_VERSION_U16 : DATA_VERSION_U32;
    header[2] = (int32_t)n;

    FILE *fp = xfopen(path, "wb", "token shard");
    write_checked(fp, header, sizeof header, path);
    if (narrow) {
        uint16_t *chunk = xmalloc(DATA_WRITE_CHUNK * sizeof *chunk);
        for (size_t done = 0; done < n; done += DATA_WRITE_CHUNK) {
            size_t m = n - done < DATA_WRITE_CHUNK ? n - done : DATA_WRITE_CHUNK;
            for (size_t i = 0; i < m; i++) {
                if (tokens[done + i] > UINT16_MAX)
                    fail_input("cannot write token shard '%s': token %u at position %zu does not fit in uint16; "
                               "write it with 4-byte tokens",
                               path, tokens[done + i], done + i);
                chunk[i] = (uint16_t)tokens[done + i];
            }
            write_checked(fp, chunk, m * sizeof *chunk, path);
        }
        free(chunk);
    } else {
        write_checked(fp, tokens, n * sizeof *tokens, path);
    }
    if (fclose(fp) != 0)
        fail_input("cannot write token shard '%s' (closing it): %s; check free disk space", path, strerror(errno));
}
