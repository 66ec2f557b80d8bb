/*
 * tokenizer_internal — the pieces of the tokenizer module (tokenizer.h) that
 * its files share: the loaded form of a tokenizer.json (tokenizer_load.c and
 * tokenizer_components.c fill it, tokenizer.c encodes with it,
 * tokenizer_decode.c decodes), the buffers, UTF-8 and hash maps
 * (tokenizer_text.c), BPE merging (tokenizer_bpe.c) and the regexes
 * (tokenizer_regex.c). Nothing outside the tokenizer_*.c files includes it.
 *
 * Every token text (the vocabulary, added tokens, their normalized forms) is
 * stored once, back to back, in tokenizer.strings and referred to by offset
 * and length, so that the maps and the id table stay valid while it grows.
 */
#ifndef SHARDLM_TOKENIZER_INTERNAL_H
#define SHARDLM_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

/* ---- growable arrays and byte buffers ---- */

struct tok_bytes {
    char *b;
    size_t len, cap;
};
/* Room for `more` bytes past len; returns b + len. */
char *tok_bytes_reserve(struct tok_bytes *t, size_t more);
void tok_bytes_append(struct tok_bytes *t, const void *p, size_t n);

struct tok_ids {
    int32_t *v;
    size_t n, cap;
};
void tok_ids_push(struct tok_ids *a, int32_t id);

/* Grows *v (elements of size elem) to hold at least need; *cap updated. */
void tok_grow(void **v, size_t *cap, size_t need, size_t elem);

/* ---- UTF-8 ---- */

/* Bytes of the UTF-8 character that starts with byte c (1 for a stray byte). */
static inline size_t tok_utf8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }
/* The code point at s (valid UTF-8 of at least one character). */
uint32_t tok_utf8_decode(const char *s);
/* Writes cp as UTF-8 into out (4 bytes of room); returns its length. */
size_t tok_utf8_encode(uint32_t cp, char *out);
/* The offset of the first byte of s[0, len) that is not valid UTF-8, or len. */
size_t tok_utf8_check(const char *s, size_t len);
/* Appends s[0, len) to out with every ill-formed subsequence replaced by
 * U+FFFD as Rust's String::from_utf8_lossy (and Python's errors="replace")
 * do: one U+FFFD per maximal prefix of a valid sequence. */
void tok_utf8_lossy(struct tok_bytes *out, const char *s, size_t len);
/* 1 for Unicode's White_Space (Rust regex \s, Oniguruma \s). */
bool tok_is_white_space(uint32_t cp);
/* s[0, len) (valid UTF-8) in Unicode normalization form NFC, NFD, NFKC or
 * NFKD (utf8proc), appended to out; 0, or -1 (utf8proc refused it). */
enum tok_unicode_form { TOK_NFC, TOK_NFD, TOK_NFKC, TOK_NFKD };
int tok_unicode_normalize(enum tok_unicode_form form, const char *s, size_t len, struct tok_bytes *out);
/* s[0, len) (valid UTF-8) lowercased as Rust's char::to_lowercase does, a
 * character at a time (tokenizers' Lowercase), appended to out. */
void tok_lowercase(const char *s, size_t len, struct tok_bytes *out);

/* ---- hash maps ---- */

/* Token text -> id, open addressing; the keys live in a tok_bytes pool. */
struct tok_str_entry {
    uint32_t off, len; /* in the pool */
    uint32_t hash;
    int32_t value;
};
struct tok_str_map {
    uint32_t *slots;   /* index into entries + 1; 0: empty */
    size_t mask;
    struct tok_str_entry *entries;
    size_t n, cap;
};
uint32_t tok_hash(const char *s, size_t len);
/* The value of key, or -1. */
int32_t tok_str_map_get(const struct tok_str_map *m, const struct tok_bytes *pool, const char *key, size_t len);
/* Sets key (already at pool->b + off, len bytes) to value; returns the
 * previous value or -1 if new. */
int32_t tok_str_map_set(struct tok_str_map *m, const struct tok_bytes *pool, uint32_t off, uint32_t len,
                        int32_t value);
void tok_str_map_free(struct tok_str_map *m);

/* A BPE merge: the pair (left id, right id) -> its rank and the merged id. */
struct tok_merge {
    uint64_t key;      /* left << 32 | right; TOK_NO_PAIR: empty slot */
    uint32_t rank;
    int32_t merged;
};
#define TOK_NO_PAIR UINT64_MAX
struct tok_merge_map {
    struct tok_merge *slots;
    size_t mask;
};
void tok_merge_map_init(struct tok_merge_map *m, size_t n_merges);
/* Later merges of the same pair replace earlier ones, as in tokenizers
 * (its merges are collected into a HashMap). */
void tok_merge_map_set(struct tok_merge_map *m, int32_t left, int32_t right, uint32_t rank, int32_t merged);
const struct tok_merge *tok_merge_map_get(const struct tok_merge_map *m, int32_t left, int32_t right);
void tok_merge_map_free(struct tok_merge_map *m);

/* ---- regexes (tokenizer_regex.c) ---- */

/* An Oniguruma pattern (or a literal string) compiled with PCRE2. */
struct tok_regex {
    pcre2_code *code;
};
enum tok_pattern_kind {
    TOK_PATTERN_REGEX,   /* Oniguruma's dialect, Unicode classes as new as utf8proc knows (tokenizer_unicode.c) */
    TOK_PATTERN_STRING,  /* a string to find as it is (tokenizers' {"String": ...}) */
    TOK_PATTERN_REGEX_PCRE2_TABLES, /* Oniguruma's dialect, Unicode classes from PCRE2's own tables only (for a
                                     * tokenizers component whose tables are older than PCRE2's) */
};
/* A pattern is matched with the options tokenizers' Oniguruma uses (Ruby
 * syntax: ^ and $ at line ends); \s \S \w \W \d \D \h \H \uHHHH (?m) are
 * rewritten to PCRE2's spelling of Oniguruma's meaning, and Unicode property
 * escapes widened by tok_unicode_property (TOK_PATTERN_REGEX).
 * Returns 0, or -1 with the reason in why. */
int tok_regex_compile(struct tok_regex *re, const char *pattern, size_t len, enum tok_pattern_kind kind, char *why,
                      size_t whylen);

/* ---- Unicode newer than PCRE2's tables (tokenizer_unicode.c) ---- */

/* Appends PCRE2's spelling of the property escape \p{name} (\P{name} when
 * negated; name[0, len) without the braces or a '^'), written inside a class
 * or not, with the code points that utf8proc assigns and PCRE2's tables leave
 * unassigned moved to where their general category puts them. The first call
 * asks both libraries for those code points (a few milliseconds, once per
 * process; thread-safe). Returns false, appending nothing, for a property it
 * does not widen (scripts, most binary properties): the caller copies it. */
bool tok_unicode_property(struct tok_bytes *out, const char *name, size_t len, bool negated, bool in_class);
void tok_regex_free(struct tok_regex *re);

/* What a search needs besides the pattern (one per encode or decode call). */
struct tok_matcher {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
};
/* long_texts: with a JIT stack for texts of any length (encoding); else
 * PCRE2's default 32 KiB (decoding, a token at a time). */
void tok_matcher_init(struct tok_matcher *m, bool long_texts);
void tok_matcher_free(struct tok_matcher *m);

/* A part of a string: a match of a pattern or the text between two. */
struct tok_span {
    size_t start, end;
    bool match;
};
struct tok_spans {
    struct tok_span *v;
    size_t n, cap;
};
void tok_spans_push(struct tok_spans *s, size_t start, size_t end, bool match);
/* tokenizers' Pattern::find_matches: s[0, len) cut into spans that cover it
 * in order, matches (possibly empty) and the gaps between them; an empty s
 * gives one empty non-match. The matches are Oniguruma's find_iter through
 * the onig crate, whose rule for empty matches this follows. Returns 0, or -1
 * with err filled (PCRE2 ran out of its limits). */
int tok_find_matches(const struct tok_regex *re, struct tok_matcher *m, const char *s, size_t len,
                     struct tok_spans *out, char *err, size_t errlen);

/* ---- the loaded tokenizer ---- */

enum tok_split_behavior { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_WITH_PREVIOUS, SPLIT_MERGED_WITH_NEXT,
                          SPLIT_CONTIGUOUS };
enum tok_prepend_scheme { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };

/* The four Unicode forms in the order of enum tok_unicode_form. */
enum tok_normalizer_kind { NORM_PREPEND, NORM_REPLACE, NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_LOWERCASE,
                           NORM_STRIP };
struct tok_normalizer {
    enum tok_normalizer_kind kind;
    char *text;              /* Prepend: what is prepended; Replace: the replacement */
    size_t text_len;
    struct tok_regex pattern; /* Replace */
    bool strip_left, strip_right; /* Strip */
};

enum tok_pretok_kind { PRETOK_BYTE_LEVEL, PRETOK_SPLIT, PRETOK_METASPACE };
struct tok_pretok {
    enum tok_pretok_kind kind;
    bool add_prefix_space, use_regex;  /* ByteLevel */
    struct tok_regex pattern;          /* Split; ByteLevel with use_regex: GPT-2's */
    enum tok_split_behavior behavior;  /* Split */
    bool invert;                       /* Split */
    char replacement[4];               /* Metaspace: one character */
    size_t replacement_len;
    enum tok_prepend_scheme prepend_scheme; /* Metaspace */
    bool split;                        /* Metaspace */
};

enum tok_decoder_kind { DEC_BYTE_LEVEL, DEC_REPLACE, DEC_BYTE_FALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE };
struct tok_decoder {
    enum tok_decoder_kind kind;
    struct tok_regex pattern;   /* Replace */
    char *content;              /* Replace: replacement; Strip, Metaspace: one character */
    size_t content_len;
    size_t start, stop;         /* Strip: characters removed at most at each end */
    enum tok_prepend_scheme prepend_scheme; /* Metaspace */
};

/* One step of a TemplateProcessing "single" template. */
struct tok_template_piece {
    bool sequence;       /* $A; else the special token's ids */
    int32_t *ids;
    size_t n_ids;
};
struct tok_template {
    struct tok_template_piece *pieces;
    size_t n;
};

/* What tokenizers' AddedToken says, per id that has one. */
enum {
    TOK_ID_ADDED = 1,        /* an added token (its text from added_tokens) */
    TOK_ID_SPECIAL = 2,      /* its content is a special token's: skipped by skip_special */
    TOK_ID_SINGLE_WORD = 4,
    TOK_ID_LSTRIP = 8,
    TOK_ID_RSTRIP = 16,
    TOK_ID_SKIPPED = 32,     /* decode's skip_special leaves it out: its decode text is a special token's */
};
struct tok_id {
    uint32_t off, len;       /* the token's text in strings */
    uint32_t dec_off, dec_len; /* the text decoding starts from: off/len, but for a normalized added token the
                                * normalizers' output on its content, as tokenizers >= 0.20 decodes it
                                * (AddedVocabulary's normalized_cache; 0.19 decoded the content) */
    int32_t has_text;        /* 0: no token has this id */
    uint32_t flags;          /* TOK_ID_* */
};

/* Added tokens matched against one kind of text (raw or normalized). */
struct tok_added_set {
    struct {
        uint32_t off, len;   /* the pattern in strings (normalized content for normalized tokens) */
        int32_t id;
    } *v;
    size_t n;
    uint32_t *by_first;      /* indices into v grouped by the pattern's first byte, longest first */
    uint32_t first_start[257];
};

struct tok_bpe {
    struct tok_str_map vocab;
    size_t vocab_entries;         /* tokenizers' vocab size: the map's entries */
    struct tok_merge_map merges;
    int32_t char_ids[0x800];      /* id of the one-character token of each code point < 0x800, -1: none */
    int32_t byte_ids[256];        /* id of "<0xXX>", -1: none */
    bool byte_fallback, fuse_unk, ignore_merges;
    int32_t unk_id;               /* -1: no unk_token */
    bool unk_missing;             /* unk_token is set but not in the vocabulary */
    char *unk_token;
};

struct tokenizer {
    char *path;
    struct tok_bytes strings;     /* every token text */
    struct tok_bpe bpe;
    struct tok_str_map added;     /* added token content -> id */
    struct tok_id *ids;           /* [n_ids] */
    size_t n_ids;
    struct tok_added_set added_raw, added_normalized;
    pcre2_code *word_char;        /* Rust regex \w, for single_word; NULL when no token needs it */

    struct tok_normalizer *normalizers;
    size_t n_normalizers;
    struct tok_pretok *pretoks;
    size_t n_pretoks;
    struct tok_template *templates;   /* applied in order when add_special */
    size_t n_templates;
    bool has_decoder;
    struct tok_decoder *decoders;
    size_t n_decoders;

    int32_t bos_id, eos_id;
};

/* ---- loading (tokenizer_load.c, tokenizer_components.c) ---- */

/* What the supported components are, for the messages that refuse others. */
#define TOK_SUPPORTED "shardlm reads BPE tokenizers of the GPT-2, Llama 2 and Llama 3 kinds"

struct tok_load {
    struct tokenizer *tok;
    const char *path;
    char *err;
    size_t errlen;
    struct tok_matcher matcher;
};
/* Writes "PATH: message" into the load's err; returns -1. */
__attribute__((format(printf, 2, 3))) int tok_load_fail(struct tok_load *L, const char *fmt, ...);
/* Fields of obj, each failing with a message naming what.key: a boolean
 * (dflt when absent or null), a string (NULL when optional and absent or
 * null; *len its bytes when len is given), a non-negative integer. */
int tok_json_bool(struct tok_load *L, json_t *obj, const char *key, bool dflt, bool *out, const char *what);
int tok_json_string(struct tok_load *L, json_t *obj, const char *key, bool optional, const char **out, size_t *len,
                    const char *what);
int tok_json_count(struct tok_load *L, json_t *obj, const char *key, size_t *out, const char *what);
/* obj's "type", or NULL. */
const char *tok_json_type(json_t *obj);
/* Each of the four appends what the tokenizer.json object (null: nothing)
 * describes to the tokenizer's lists; 0, or -1 with the load's err filled. */
int tok_load_normalizer(struct tok_load *L, json_t *n);
int tok_load_pre_tokenizer(struct tok_load *L, json_t *p);
int tok_load_post_processor(struct tok_load *L, json_t *p);
int tok_load_decoder(struct tok_load *L, json_t *d);

/* ---- BPE (tokenizer_bpe.c) ---- */

/* Per-call scratch of the merging. */
struct tok_bpe_work {
    struct tok_bpe_symbol *symbols;
    size_t n_symbols, cap_symbols;
    struct tok_bpe_candidate *heap;
    size_t n_heap, cap_heap;
};
void tok_bpe_work_free(struct tok_bpe_work *w);
/* tokenizers' BPE::tokenize of one pre-token word[0, len) (valid UTF-8):
 * appends its ids to out. Returns 0, or -1 with err filled (an unk_token that
 * is not in the vocabulary). */
int tok_bpe_tokenize(const struct tokenizer *tok, const char *word, size_t len, struct tok_bpe_work *w,
                     struct tok_ids *out, char *err, size_t errlen);

/* ---- shared by loading and encoding ---- */

/* Applies the tokenizer's normalizers to text[0, len), appending the result
 * to out; *inserted: the bytes Prepend put at its start (NULL: not wanted).
 * Returns 0, or -1 with err filled. */
int tok_normalize(const struct tokenizer *tok, const char *text, size_t len, struct tok_matcher *m,
                  struct tok_bytes *out, size_t *inserted, char *err, size_t errlen);

/* tokenizer_token_to_id of token[0, len). */
int32_t tokenizer_token_to_id_n(const struct tokenizer *tok, const char *token, size_t len);

/* printf into err (truncating), for the one-line errors. */
__attribute__((format(printf, 3, 4))) void tok_err(char *err, size_t errlen, const char *fmt, ...);

#endif
