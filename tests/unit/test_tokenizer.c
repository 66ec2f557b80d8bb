/*
 * test_tokenizer — the tokenizer library (src/tokenizer/tokenizer.h) on a small
 * Llama-2-style tokenizer.json written here, with ids worked out by hand from
 * tokenizers' rules (tests/t_tokenizer.py compares with the Python package on
 * real text; this test needs nothing but the library):
 *   BPE merges by rank, then leftmost among equal ranks, stale candidates
 *   dropped; byte fallback; unk with and without fuse_unk; a missing unk;
 *   the template's BOS; decoding (Replace, ByteFallback, Fuse, Strip) with
 *   and without special tokens, incomplete bytes as U+FFFD; the streaming
 *   decoder holding a character back until its last byte; lookups, BOS and
 *   EOS from the template and tokenizer_config.json (as transformers writes it:
 *   int(1e30), NaN, added_tokens_decoder checked against the tokenizer);
 *   invalid UTF-8; load
 *   errors naming the file and the problem; a 200000-character word.
 */
#include "check.h"
#include "tokenizer/tokenizer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char g_dir[512];

/* ids of the hand-made vocabulary */
enum { UNK = 0, BOS = 1, EOS = 2, BYTE0 = 3, MARK = 259, A, B, C, AB, BC, ABC, AA, MARK_A, X, N_VOCAB };

static const char *const pieces[] = {[MARK - MARK] = "\xe2\x96\x81", "a", "b", "c", "ab", "bc", "abc", "aa",
                                     "\xe2\x96\x81" "a", "x"};

/* Writes the tokenizer.json of the test into g_dir/name; model_extra is
 * spliced into the model object (e.g. "\"byte_fallback\": false,"). */
static char *write_tokenizer(const char *name, const char *model_extra, const char *model_type)
{
    static char path[640];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"version\": \"1.0\", \"added_tokens\": [");
    static const char *const specials[] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++)
        fprintf(f, "%s{\"id\": %d, \"content\": \"%s\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false,"
                   " \"normalized\": false, \"special\": true}", i ? ", " : "", i, specials[i]);
    fprintf(f, "], \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": "
               "\"\\u2581\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]},"
               " \"pre_tokenizer\": null,"
               " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": "
               "\"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": [], "
               "\"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1], \"tokens\": [\"<s>\"]}}},"
               " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": "
               "{\"String\": \"\\u2581\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, "
               "{\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},"
               " \"model\": {\"type\": \"%s\", \"dropout\": null, \"unk_token\": \"<unk>\", \"fuse_unk\": true, "
               "\"byte_fallback\": true, %s \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2",
            model_type, model_extra);
    for (int b = 0; b < 256; b++)
        fprintf(f, ", \"<0x%02X>\": %d", b, BYTE0 + b);
    for (int i = MARK; i < N_VOCAB; i++)
        fprintf(f, ", \"%s\": %d", pieces[i - MARK], i);
    /* b c before a b: "abc" merges bc first and is then stuck at a|bc */
    fprintf(f, "}, \"merges\": [\"b c\", \"a b\", \"ab c\", \"a a\", \"\xe2\x96\x81 a\"]}}\n");
    fclose(f);
    return path;
}

static struct tokenizer *load(const char *path)
{
    char err[512];
    struct tokenizer *tok = tokenizer_load(path, err, sizeof err);
    CHECK("load", tok != NULL, "%s", err);
    return tok;
}

/* Encodes text and compares with want[0, n). */
static void check_encode(const char *name, const struct tokenizer *tok, const char *text, size_t len,
                         int add_special, const int32_t *want, size_t n)
{
    char err[512] = "";
    int32_t *ids;
    size_t got;
    int rc = tokenizer_encode(tok, text, len, add_special, &ids, &got, err, sizeof err);
    int same = rc == 0 && got == n && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
    char shown[256] = "";
    for (size_t i = 0, k = 0; rc == 0 && i < got && i < 12; i++)
        k += (size_t)snprintf(shown + k, sizeof shown - k, "%d ", ids[i]);
    CHECK(name, same, "rc %d (%s), %zu ids: %s", rc, err, got, shown);
    free(ids);
}

#define ENCODE(name, tok, text, special, ...)                                                             \
    do {                                                                                                 \
        const int32_t want_[] = {__VA_ARGS__};                                                           \
        check_encode(name, tok, text, sizeof text - 1, special, want_, sizeof want_ / sizeof *want_);     \
    } while (0)

static void check_decode(const char *name, const struct tokenizer *tok, const int32_t *ids, size_t n, int skip,
                         const char *want)
{
    size_t len;
    char *got = tokenizer_decode(tok, ids, n, skip, &len);
    CHECK(name, len == strlen(want) && memcmp(got, want, len) == 0, "got '%s', want '%s'", got, want);
    free(got);
}

static void test_encode(const struct tokenizer *tok)
{
    ENCODE("merge_rank_order", tok, "abc", 0, MARK_A, BC);  /* b+c (rank 0) before a+b (rank 1) */
    ENCODE("merge_leftmost_first", tok, "aaaa", 0, MARK, AA, AA);
    ENCODE("merge_stale_dropped", tok, "aaa", 0, MARK, AA, A);
    ENCODE("template_bos", tok, "ab", 1, BOS, MARK, AB); /* a+b (rank 1) before the marker + a (rank 4) */
    ENCODE("empty_with_bos", tok, "", 1, BOS);
    ENCODE("space_is_marker", tok, "a b", 0, MARK_A, MARK, B);
    ENCODE("byte_fallback", tok, "\xc3\xa9x", 0, MARK, BYTE0 + 0xC3, BYTE0 + 0xA9, X);
    ENCODE("special_token_split", tok, "a</s>b", 0, MARK_A, EOS, MARK, B);
    ENCODE("nul_is_text", tok, "a\0b", 0, MARK_A, BYTE0, B);
    char err[512] = "";
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = tokenizer_encode(tok, "a\xff" "b", 3, 0, &ids, &n, err, sizeof err);
    CHECK("invalid_utf8_refused", rc == -1 && strstr(err, "UTF-8") && strstr(err, "offset 1"), "rc %d: %s", rc, err);
    free(ids);
}

static void test_long_word(const struct tokenizer *tok)
{
    enum { LEN = 200000 };
    char *text = malloc(LEN);
    memset(text, 'a', LEN);
    int32_t *ids;
    size_t n;
    char err[256];
    int ok = tokenizer_encode(tok, text, LEN, 0, &ids, &n, err, sizeof err) == 0 && n == 1 + LEN / 2 &&
             ids[0] == MARK;
    for (size_t i = 1; ok && i < n; i++)
        ok = ids[i] == AA;
    CHECK("long_word_one_piece", ok, "%zu ids", n);
    free(ids);
    free(text);
}

static void test_unk(void)
{
    struct tokenizer *tok = load(write_tokenizer("unk.json", "\"byte_fallback\": false,", "BPE"));
    ENCODE("unk_fused", tok, "\xc3\xa9\xc3\xa9x", 0, MARK, UNK, X);
    tokenizer_free(tok);
    tok = load(write_tokenizer("unk_nofuse.json", "\"byte_fallback\": false, \"fuse_unk\": false,", "BPE"));
    ENCODE("unk_not_fused", tok, "\xc3\xa9\xc3\xa9x", 0, MARK, UNK, UNK, X);
    tokenizer_free(tok);
    tok = load(write_tokenizer("unk_missing.json", "\"byte_fallback\": false, \"unk_token\": \"<nope>\",", "BPE"));
    char err[512] = "";
    int32_t *ids = NULL;
    size_t n;
    int rc = tok ? tokenizer_encode(tok, "\xc3\xa9", 2, 0, &ids, &n, err, sizeof err) : 0;
    CHECK("unk_missing_refused", rc == -1 && strstr(err, "<nope>") && strstr(err, "U+00E9"), "rc %d: %s", rc, err);
    free(ids);
    tokenizer_free(tok);
}

static void test_decode(const struct tokenizer *tok)
{
    const int32_t abc[] = {BOS, MARK_A, BC};
    check_decode("decode_with_special", tok, abc, 3, 0, "<s> abc");
    check_decode("decode_skip_special", tok, abc, 3, 1, "abc");
    const int32_t euro[] = {MARK, BYTE0 + 0xE2, BYTE0 + 0x82, BYTE0 + 0xAC, MARK, X};
    check_decode("decode_byte_fallback", tok, euro, 6, 0, "\xe2\x82\xac x");
    check_decode("decode_incomplete_bytes", tok, euro, 3, 0, "\xef\xbf\xbd\xef\xbf\xbd");
    const int32_t unknown[] = {MARK_A, 999999, -4, B};
    check_decode("decode_skips_unknown_ids", tok, unknown, 4, 0, "ab");

    /* the stream holds the euro sign back until its last byte; the marker
     * alone decodes to nothing (Strip), then to its space once text follows */
    struct tokenizer_stream st;
    tokenizer_stream_init(&st, tok, NULL, 0, 1);
    const char *want[] = {"", "", "", "\xe2\x82\xac", " ", "x"};
    char got[64] = "";
    int ok = 1;
    size_t len;
    for (int i = 0; i < 6; i++) {
        const char *piece = tokenizer_stream_push(&st, euro[i], &len);
        ok &= len == strlen(want[i]) && memcmp(piece, want[i], len) == 0;
        snprintf(got + strlen(got), sizeof got - strlen(got), "[%.*s]", (int)len, piece);
    }
    ok &= tokenizer_stream_finish(&st, &len) != NULL && len == 0;
    tokenizer_stream_free(&st);
    CHECK("stream_waits_for_whole_character", ok, "pieces %s", got);

    /* stray bytes are handed out as U+FFFD once more than a character's worth is held back */
    enum { STRAY = 12 };
    int32_t stray[STRAY];
    for (int i = 0; i < STRAY; i++)
        stray[i] = BYTE0 + 0xFF;
    tokenizer_stream_init(&st, tok, NULL, 0, 1);
    size_t before_finish = 0, total = 0;
    for (int i = 0; i < STRAY; i++) {
        tokenizer_stream_push(&st, stray[i], &len);
        before_finish += len;
    }
    tokenizer_stream_finish(&st, &len);
    total = before_finish + len;
    tokenizer_stream_free(&st);
    CHECK("stream_stray_bytes_not_held_forever", before_finish > 0 && total == 3 * STRAY,
          "%zu bytes out before finish, %zu in all (want %d)", before_finish, total, 3 * STRAY);

    /* with the prompt as context, the first piece keeps its space (Strip applies to the prompt) */
    const int32_t prompt[] = {BOS, MARK_A, B};
    tokenizer_stream_init(&st, tok, prompt, 3, 1);
    const char *piece = tokenizer_stream_push(&st, MARK_A, &len);
    CHECK("stream_context_keeps_space", len == 2 && memcmp(piece, " a", 2) == 0, "got '%.*s'", (int)len, piece);
    tokenizer_stream_free(&st);
}

/* The tokenizer at path loaded with json (one line) as its tokenizer_config.json
 * (written at config); NULL with the reason in err[512]. */
static struct tokenizer *load_with_config(const char *path, const char *config, const char *json, char *err)
{
    FILE *f = fopen(config, "w");
    fprintf(f, "%s\n", json);
    fclose(f);
    err[0] = '\0';
    return tokenizer_load(path, err, 512);
}

static void test_lookups(const struct tokenizer *tok, const char *path)
{
    size_t len;
    const char *t = tokenizer_id_to_token(tok, AB, &len);
    CHECK("lookups", tokenizer_token_to_id(tok, "abc") == ABC && tokenizer_token_to_id(tok, "<s>") == BOS &&
                         tokenizer_token_to_id(tok, "nope") == -1 && t && len == 2 && memcmp(t, "ab", 2) == 0 &&
                         !tokenizer_id_to_token(tok, N_VOCAB, &len) && tokenizer_vocab_size(tok) == N_VOCAB,
          "vocab size %zu", tokenizer_vocab_size(tok));
    CHECK("is_special", tokenizer_is_special(tok, BOS) && tokenizer_is_special(tok, UNK) &&
                            !tokenizer_is_special(tok, AB) && !tokenizer_is_special(tok, -1), "flags");
    CHECK("bos_from_template", tokenizer_bos_id(tok) == BOS && tokenizer_eos_id(tok) == -1, "bos %d eos %d",
          tokenizer_bos_id(tok), tokenizer_eos_id(tok));
    char config[640], err[512] = "";
    snprintf(config, sizeof config, "%s/tokenizer_config.json", g_dir);
    struct tokenizer *with_config = load_with_config(
        path, config, "{\"bos_token\": {\"content\": \"</s>\", \"lstrip\": false}, \"eos_token\": \"</s>\"}", err);
    CHECK("bos_eos_from_config", with_config && tokenizer_bos_id(with_config) == EOS &&
                                     tokenizer_eos_id(with_config) == EOS, "bos %d eos %d",
          with_config ? tokenizer_bos_id(with_config) : -9, with_config ? tokenizer_eos_id(with_config) : -9);
    tokenizer_free(with_config);
    /* as transformers writes it: int(1e30) for "no limit", added_tokens_decoder, unknown keys */
    with_config = load_with_config(path, config,
                                   "{\"model_max_length\": 1000000000000000019884624838656, "
                                   "\"clean_up_tokenization_spaces\": NaN, \"added_tokens_decoder\": {\"2\": "
                                   "{\"content\": \"</s>\", \"special\": true}, \"9999\": {\"content\": \"<extra>\"}}, "
                                   "\"eos_token\": \"</s>\", \"unknown\": [1, {}]}", err);
    CHECK("config_as_transformers_writes", with_config && tokenizer_eos_id(with_config) == EOS, "eos %d: %s",
          with_config ? tokenizer_eos_id(with_config) : -9, err);
    tokenizer_free(with_config);
    struct tokenizer *mismatch =
        load_with_config(path, config, "{\"added_tokens_decoder\": {\"2\": {\"content\": \"<|endoftext|>\"}}}", err);
    CHECK("added_tokens_decoder_of_another_tokenizer", !mismatch && strstr(err, "added_tokens_decoder") &&
          strstr(err, "<|endoftext|>") && strstr(err, "</s>"), "%s", err);
    tokenizer_free(mismatch);
    struct tokenizer *bad = load_with_config(path, config, "{\"eos_token\": ", err);
    CHECK("bad_config_named", !bad && strstr(err, "tokenizer_config.json"), "%s", err);
    tokenizer_free(bad);
    remove(config);
}

static void check_load_error(const char *name, const char *path, const char *needle)
{
    char err[512] = "";
    struct tokenizer *tok = tokenizer_load(path, err, sizeof err);
    CHECK(name, !tok && strstr(err, path) && strstr(err, needle) && !strchr(err, '\n'), "%s", err);
    tokenizer_free(tok);
}

static void test_load_errors(void)
{
    char path[640];
    snprintf(path, sizeof path, "%s/none.json", g_dir);
    check_load_error("error_missing_file", path, "cannot open");
    check_load_error("error_wordpiece", write_tokenizer("wp.json", "", "WordPiece"), "model type WordPiece");
    check_load_error("error_dropout", write_tokenizer("dropout.json", "\"dropout\": 0.5,", "BPE"), "dropout");
    check_load_error("error_prefix",
                     write_tokenizer("prefix.json", "\"continuing_subword_prefix\": \"##\",", "BPE"),
                     "continuing_subword_prefix");
    snprintf(path, sizeof path, "%s/truncated.json", g_dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0");
    fclose(f);
    check_load_error("error_truncated_json", path, "not valid JSON");
}

int main(void)
{
    const char *base = getenv("SHARDLM_TEST_TMP");
    snprintf(g_dir, sizeof g_dir, "%s/test_tokenizer.XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(g_dir)) {
        CHECK("tmpdir", 0, "cannot create %s", g_dir);
        return check_status();
    }
    const char *path = write_tokenizer("tokenizer.json", "", "BPE");
    struct tokenizer *tok = load(path);
    if (tok) {
        test_encode(tok);
        test_long_word(tok);
        test_decode(tok);
        test_lookups(tok, path);
        tokenizer_free(tok);
    }
    test_unk();
    test_load_errors();
    char cmd[640];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        printf("# could not remove %s\n", g_dir);
    return check_status();
}
