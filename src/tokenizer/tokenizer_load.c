/*
 * tokenizer_load — tokenizer.json into struct tokenizer (tokenizer_internal.h),
 * with tokenizers' own rules where they decide ids: an added token takes the
 * id its content already has (added tokens first, then the model's vocabulary),
 * else the next free one after the vocabulary (the "id" written in the file
 * is only checked by tokenizers, with a warning: the ids here are the ones
 * tokenizers computes, so both agree when the file disagrees with itself);
 * merges of the same pair: the last one counts.
 *
 * Ids given twice are tokenizers' too: two strings of model.vocab with one id
 * both encode to it (tokenizers decodes it as either, at random; here as the
 * first), and an added token whose "id" is not the one it gets (another token
 * has it, or its content is already a token) gets tokenizers' id; both are
 * one warning naming the id and the file. An id tokenizers refuses (an added
 * token's "id" missing or not a u32) is refused, and so is a vocabulary id
 * above TOK_MAX_ID, which tokenizers would take but whose id table here would
 * take gigabytes.
 *
 * Everything that is not supported is refused here (the model, added tokens,
 * tokenizer_config.json) or in tokenizer_components.c (the normalizer,
 * pre-tokenizer, post-processor and decoder), naming it, so that encoding
 * never meets a component it does not know.
 */
#define _GNU_SOURCE /* qsort_r */
#include "tokenizer_internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/hf_json.h"
#include "core/util.h"

/* Rust regex's \w (Alphabetic, marks, decimal numbers, connector punctuation,
 * Join_Control), which tokenizers' single_word tests on either side. */
static const char rust_word_char[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]";

int tok_load_fail(struct tok_load *L, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tok_err(L->err, L->errlen, "%s: %s", L->path, msg);
    return -1;
}

/* ---- small JSON readers: each fails with a message naming the field ---- */

int tok_json_bool(struct tok_load *L, json_t *obj, const char *key, bool dflt, bool *out, const char *what)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v))
        return tok_load_fail(L, "%s.%s is not true or false: the file is damaged; make it again with tokenizers' "
                             "Tokenizer.save", what, key);
    *out = json_is_true(v);
    return 0;
}

/* A string field (NULL when absent or null and optional). */
int tok_json_string(struct tok_load *L, json_t *obj, const char *key, bool optional, const char **out, size_t *len,
                      const char *what)
{
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (len)
        *len = 0;
    if ((!v || json_is_null(v)) && optional)
        return 0;
    if (!json_is_string(v))
        return tok_load_fail(L, "%s.%s is %s, not a string: the file is damaged; make it again with tokenizers' "
                             "Tokenizer.save", what, key, v ? "of another type" : "missing");
    *out = json_string_value(v);
    if (len)
        *len = json_string_length(v);
    return 0;
}

int tok_json_count(struct tok_load *L, json_t *obj, const char *key, size_t *out, const char *what)
{
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return tok_load_fail(L, "%s.%s is not a non-negative integer: the file is damaged; make it again with "
                             "tokenizers' Tokenizer.save", what, key);
    *out = (size_t)json_integer_value(v);
    return 0;
}

const char *tok_json_type(json_t *obj)
{
    json_t *t = json_object_get(obj, "type");
    return json_is_string(t) ? json_string_value(t) : NULL;
}

/* ---- the model ---- */

/* The largest vocabulary id read: 64 times the largest released vocabularies
 * (Gemma's 256000); the id table (16 bytes an id) then stays under 300 MB. */
#define TOK_MAX_ID ((1 << 24) - 1)

/* Appends s[0, len) to the strings; returns its offset. */
static uint32_t store(struct tokenizer *tok, const char *s, size_t len)
{
    uint32_t off = (uint32_t)tok->strings.len;
    tok_bytes_append(&tok->strings, s, len);
    return off;
}

static int load_vocab(struct tok_load *L, json_t *vocab, int32_t *max_id)
{
    struct tokenizer *tok = L->tok;
    if (!json_is_object(vocab))
        return tok_load_fail(L, "model.vocab is %s, not an object of token -> id: the file is damaged or not a "
                             "tokenizer.json", vocab ? "of another type" : "missing");
    const char *key;
    size_t key_len;
    json_t *v;
    *max_id = -1;
    json_object_keylen_foreach(vocab, key, key_len, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= INT32_MAX)
            return tok_load_fail(L, "model.vocab['%.60s'] is not an id (an integer from 0 to %d): the file is "
                                 "damaged", key, INT32_MAX - 1);
        int32_t id = (int32_t)json_integer_value(v);
        if (id > TOK_MAX_ID)
            return tok_load_fail(L, "model.vocab['%.60s'] has id %d; shardlm reads ids up to %d (the largest "
                                 "vocabularies have about 256000): the file is damaged", key, id, TOK_MAX_ID);
        uint32_t off = store(tok, key, key_len);
        tok_str_map_set(&tok->bpe.vocab, &tok->strings, off, (uint32_t)key_len, id);
        if (id > *max_id)
            *max_id = id;
    }
    tok->bpe.vocab_entries = tok->bpe.vocab.n;
    return 0;
}

/* One merge, "a b" or ["a", "b"]: its two tokens. */
static int merge_parts(struct tok_load *L, json_t *m, size_t rank, const char **a, size_t *alen, const char **b,
                       size_t *blen)
{
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0)), *alen = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1)), *blen = json_string_length(json_array_get(m, 1));
        return 0;
    }
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        size_t n = json_string_length(m);
        const char *space = memchr(s, ' ', n);
        /* tokenizers splits on ' ' and wants exactly two parts */
        if (space && !memchr(space + 1, ' ', n - (size_t)(space + 1 - s))) {
            *a = s, *alen = (size_t)(space - s);
            *b = space + 1, *blen = n - *alen - 1;
            return 0;
        }
    }
    return tok_load_fail(L, "model.merges[%zu] is not \"a b\" nor [\"a\", \"b\"]: the file is damaged; make it "
                         "again with tokenizers' Tokenizer.save", rank);
}

static int load_merges(struct tok_load *L, json_t *merges)
{
    struct tokenizer *tok = L->tok;
    if (!json_is_array(merges))
        return tok_load_fail(L, "model.merges is %s, not an array: the file is damaged or not a BPE tokenizer.json",
                             merges ? "of another type" : "missing");
    tok_merge_map_init(&tok->bpe.merges, json_array_size(merges));
    struct tok_bytes joined = {0};
    size_t rank;
    json_t *m;
    json_array_foreach(merges, rank, m) {
        const char *a = NULL, *b = NULL;
        size_t alen = 0, blen = 0;
        if (merge_parts(L, m, rank, &a, &alen, &b, &blen) != 0)
            goto fail;
        int32_t left = tok_str_map_get(&tok->bpe.vocab, &tok->strings, a, alen);
        int32_t right = tok_str_map_get(&tok->bpe.vocab, &tok->strings, b, blen);
        joined.len = 0;
        tok_bytes_append(&joined, a, alen);
        tok_bytes_append(&joined, b, blen);
        int32_t merged = tok_str_map_get(&tok->bpe.vocab, &tok->strings, joined.b, joined.len);
        if (left < 0 || right < 0 || merged < 0) {
            const char *missing = left < 0 ? a : right < 0 ? b : joined.b;
            size_t missing_len = left < 0 ? alen : right < 0 ? blen : joined.len;
            tok_load_fail(L, "model.merges[%zu] ('%.*s' + '%.*s'): '%.*s' is not in model.vocab (tokenizers "
                          "refuses it too): the file is damaged", rank, (int)alen, a, (int)blen, b, (int)missing_len,
                          missing);
            goto fail;
        }
        tok_merge_map_set(&tok->bpe.merges, left, right, (uint32_t)rank, merged);
    }
    free(joined.b);
    return 0;
fail:
    free(joined.b);
    return -1;
}

/* The tables the merging reads per character: one-character tokens below
 * U+0800 by code point, <0xXX> tokens by byte. */
static void index_characters(struct tokenizer *tok)
{
    struct tok_bpe *bpe = &tok->bpe;
    for (size_t cp = 0; cp < 0x800; cp++) {
        char c[4];
        size_t n = tok_utf8_encode((uint32_t)cp, c);
        bpe->char_ids[cp] = tok_str_map_get(&bpe->vocab, &tok->strings, c, n);
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        bpe->byte_ids[b] = tok_str_map_get(&bpe->vocab, &tok->strings, name, 6);
    }
}

static int load_model(struct tok_load *L, json_t *model, int32_t *max_id)
{
    struct tok_bpe *bpe = &L->tok->bpe;
    if (!json_is_object(model))
        return tok_load_fail(L, "no \"model\" object: the file is not a tokenizer.json");
    const char *type = tok_json_type(model);
    if (type && strcmp(type, "BPE") != 0)
        return tok_load_fail(L, "model type %s is not supported: %s (the model must be BPE)", type, TOK_SUPPORTED);
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0))
        return tok_load_fail(L, "BPE dropout (%g) is not supported: it makes the ids random; set model.dropout to null",
                             json_number_value(dropout));
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        const char *s;
        if (tok_json_string(L, model, affixes[k], true, &s, NULL, "model") != 0)
            return -1;
        if (s && *s)
            return tok_load_fail(L, "BPE %s ('%s') is not supported: %s", affixes[k], s, TOK_SUPPORTED);
    }
    const char *unk;
    if (tok_json_bool(L, model, "byte_fallback", false, &bpe->byte_fallback, "model") != 0 ||
        tok_json_bool(L, model, "fuse_unk", false, &bpe->fuse_unk, "model") != 0 ||
        tok_json_bool(L, model, "ignore_merges", false, &bpe->ignore_merges, "model") != 0 ||
        tok_json_string(L, model, "unk_token", true, &unk, NULL, "model") != 0 ||
        load_vocab(L, json_object_get(model, "vocab"), max_id) != 0 ||
        load_merges(L, json_object_get(model, "merges")) != 0)
        return -1;
    bpe->unk_id = -1;
    if (unk) {
        bpe->unk_token = xstrdup(unk);
        bpe->unk_id = tok_str_map_get(&bpe->vocab, &L->tok->strings, unk, strlen(unk));
        bpe->unk_missing = bpe->unk_id < 0; /* an error only when a text needs it, as in tokenizers */
    }
    index_characters(L->tok);
    return 0;
}

/* ---- added tokens ---- */

struct added_token {
    uint32_t off, len;   /* content, in strings */
    int64_t file_id;     /* its "id" in the file (tokenizers may give it another) */
    bool special, single_word, lstrip, rstrip, normalized;
};

static int parse_added(struct tok_load *L, json_t *list, struct added_token **out, size_t *n)
{
    *out = NULL, *n = 0;
    if (!list || json_is_null(list))
        return 0;
    if (!json_is_array(list))
        return tok_load_fail(L, "added_tokens is not an array: the file is damaged");
    *out = xcalloc(json_array_size(list) + 1, sizeof **out);
    size_t i;
    json_t *item;
    json_array_foreach(list, i, item) {
        struct added_token *t = &(*out)[(*n)++];
        const char *content;
        size_t len;
        if (tok_json_string(L, item, "content", false, &content, &len, "added_tokens[]") != 0 ||
            tok_json_bool(L, item, "special", false, &t->special, "added_tokens[]") != 0 ||
            tok_json_bool(L, item, "single_word", false, &t->single_word, "added_tokens[]") != 0 ||
            tok_json_bool(L, item, "lstrip", false, &t->lstrip, "added_tokens[]") != 0 ||
            tok_json_bool(L, item, "rstrip", false, &t->rstrip, "added_tokens[]") != 0 ||
            tok_json_bool(L, item, "normalized", !t->special, &t->normalized, "added_tokens[]") != 0)
            return -1;
        json_t *id = json_object_get(item, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > UINT32_MAX)
            return tok_load_fail(L, "added_tokens[%zu] ('%.60s'): \"id\" is %s, not an id from 0 to %u (tokenizers "
                                 "refuses it too): the file is damaged", i, content,
                                 !id ? "missing" : json_is_integer(id) ? "out of range" : "not an integer", UINT32_MAX);
        t->file_id = json_integer_value(id);
        t->off = store(L->tok, content, len);
        t->len = (uint32_t)len;
    }
    return 0;
}

static uint32_t added_flags(const struct added_token *t)
{
    return TOK_ID_ADDED | (t->single_word ? TOK_ID_SINGLE_WORD : 0) | (t->lstrip ? TOK_ID_LSTRIP : 0) |
           (t->rstrip ? TOK_ID_RSTRIP : 0);
}

static bool same_added(const struct tokenizer *tok, const struct added_token *a, const struct added_token *b)
{
    return a->len == b->len && memcmp(tok->strings.b + a->off, tok->strings.b + b->off, a->len) == 0 &&
           a->special == b->special && a->single_word == b->single_word && a->lstrip == b->lstrip &&
           a->rstrip == b->rstrip && a->normalized == b->normalized;
}


/* The ids tokenizers gives the added tokens (AddedVocabulary::add_tokens):
 * ids[i] for added[i], -1 for one it passes over (empty, or the same token
 * again). *special: the special tokens' contents; order[0, *n_order): the
 * tokens the splitting looks for, the special ones first, each once. */
static void assign_added_ids(struct tokenizer *tok, int32_t max_vocab_id, const struct added_token *added,
                             size_t n, int32_t *ids, struct tok_str_map *special, size_t *order, size_t *n_order)
{
    size_t n_slots = (size_t)(max_vocab_id + 1) + tok->bpe.vocab_entries + n + 1;
    int32_t *holder = xmalloc(n_slots * sizeof *holder); /* id -> the added token that has it, -1 */
    for (size_t i = 0; i < n_slots; i++)
        holder[i] = -1;
    size_t n_special = 0;
    for (size_t i = 0; i < n; i++)
        if (added[i].special && added[i].len &&
            tok_str_map_set(special, &tok->strings, added[i].off, added[i].len, 1) < 0)
            order[n_special++] = i;
    size_t n_classic = 0;
    size_t *classic = xcalloc(n + 1, sizeof *classic);
    int32_t max_added = -1;
    const size_t vocab_size = tok->bpe.vocab_entries;
    for (size_t i = 0; i < n; i++) {
        const struct added_token *t = &added[i];
        const char *content = tok->strings.b + t->off;
        ids[i] = -1;
        if (t->len == 0)
            continue;
        int32_t id = tok_str_map_get(&tok->added, &tok->strings, content, t->len);
        if (id >= 0 && holder[id] >= 0 && same_added(tok, &added[holder[id]], t))
            continue;
        if (id < 0)
            id = tok_str_map_get(&tok->bpe.vocab, &tok->strings, content, t->len);
        if (id < 0) /* the next id after the vocabulary and the added tokens so far */
            id = max_added < 0 ? (int32_t)vocab_size
                 : ((size_t)max_added >= vocab_size || vocab_size == 0) ? max_added + 1
                                                                        : (int32_t)vocab_size;
        tok_str_map_set(&tok->added, &tok->strings, t->off, t->len, id);
        holder[id] = (int32_t)i;
        if (id > max_added)
            max_added = id;
        ids[i] = id;
        if (tok_str_map_get(special, &tok->strings, content, t->len) < 0)
            classic[n_classic++] = i;
    }
    memcpy(order + n_special, classic, n_classic * sizeof *order);
    *n_order = n_special + n_classic;
    free(classic);
    free(holder);
}

/* The id table: the vocabulary's tokens (the first of two with one id),
 * then the added tokens over them; TOK_ID_SPECIAL on every id whose text is
 * a special token's. */
static void build_ids(struct tok_load *L, int32_t max_id, const struct added_token *added, const int32_t *ids,
                      size_t n_added, const struct tok_str_map *special)
{
    struct tokenizer *tok = L->tok;
    for (size_t i = 0; i < n_added; i++)
        if (ids[i] > max_id)
            max_id = ids[i];
    tok->n_ids = (size_t)(max_id + 1);
    tok->ids = xcalloc(tok->n_ids ? tok->n_ids : 1, sizeof *tok->ids);
    const struct tok_str_map *v = &tok->bpe.vocab;
    size_t n_shared = 0, shared = 0;
    for (size_t e = 0; e < v->n; e++) {
        struct tok_id *t = &tok->ids[v->entries[e].value];
        if (t->has_text) {
            shared = n_shared++ ? shared : e;
            continue;
        }
        t->off = v->entries[e].off, t->len = v->entries[e].len, t->has_text = 1;
    }
    if (n_shared) {
        const struct tok_str_entry *second = &v->entries[shared];
        const struct tok_id *first = &tok->ids[second->value];
        log_warn("%s: model.vocab gives id %d to '%.*s' and to '%.*s'%s: both encode to it, and it decodes as the "
                 "first (tokenizers decodes it as either, at random); give each token its own id", L->path,
                 second->value, (int)(first->len > 60 ? 60 : first->len), tok->strings.b + first->off,
                 (int)(second->len > 60 ? 60 : second->len), tok->strings.b + second->off,
                 n_shared > 1 ? " (and more tokens share ids)" : "");
    }
    for (size_t i = 0; i < n_added; i++) {
        if (ids[i] < 0)
            continue;
        struct tok_id *t = &tok->ids[ids[i]];
        t->off = added[i].off, t->len = added[i].len, t->has_text = 1;
        t->flags = added_flags(&added[i]);
    }
    for (size_t id = 0; id < tok->n_ids; id++) {
        struct tok_id *t = &tok->ids[id];
        t->dec_off = t->off, t->dec_len = t->len; /* build_set changes it for a normalized added token */
        if (t->has_text && tok_str_map_get(special, &tok->strings, tok->strings.b + t->off, t->len) >= 0)
            t->flags |= TOK_ID_SPECIAL;
    }
}

/* TOK_ID_SKIPPED where decode's skip_special drops the id: tokenizers (0.23, Tokenizer::decode) asks whether
 * the text it decodes is a special token's content, so a special token that is also normalized, and that
 * the normalizers change (Llama 2's Prepend "▁"), is kept. */
static void mark_skipped(struct tokenizer *tok, const struct tok_str_map *special)
{
    for (size_t id = 0; id < tok->n_ids; id++) {
        struct tok_id *t = &tok->ids[id];
        if (t->has_text && tok_str_map_get(special, &tok->strings, tok->strings.b + t->dec_off, t->dec_len) >= 0)
            t->flags |= TOK_ID_SKIPPED;
    }
}

/* Orders a set's patterns by first byte, longest first among equal first
 * bytes: leftmost-longest matching takes the first that fits. */
static int pattern_order(const void *a, const void *b, void *ctx)
{
    const struct tok_added_set *set = ctx;
    uint32_t ia = *(const uint32_t *)a, ib = *(const uint32_t *)b;
    return set->v[ia].len != set->v[ib].len ? (set->v[ia].len > set->v[ib].len ? -1 : 1) : (ia > ib) - (ia < ib);
}

/* The patterns of the tokens order[0, n) whose normalized flag is
 * `normalized`, each with its id (the normalizers applied to the content of
 * a normalized one, as tokenizers matches it in normalized text). */
static int build_set(struct tok_load *L, struct tok_added_set *set, bool normalized, const struct added_token *added,
                     const size_t *order, size_t n)
{
    struct tokenizer *tok = L->tok;
    set->v = xcalloc(n + 1, sizeof *set->v);
    struct tok_bytes norm = {0};
    for (size_t k = 0; k < n; k++) {
        const struct added_token *t = &added[order[k]];
        if (t->normalized != normalized)
            continue;
        const char *content = tok->strings.b + t->off;
        int32_t id = tokenizer_token_to_id_n(tok, content, t->len);
        uint32_t off = t->off, len = t->len;
        if (normalized && tok->n_normalizers) {
            norm.len = 0;
            if (tok_normalize(tok, content, t->len, &L->matcher, &norm, NULL, L->err, L->errlen) != 0) {
                free(norm.b);
                return -1;
            }
            off = store(tok, norm.b, norm.len), len = (uint32_t)norm.len;
            if (id >= 0 && (len != t->len || memcmp(norm.b, content, len) != 0))
                tok->ids[id].dec_off = off, tok->ids[id].dec_len = len; /* what tokenizers 0.23 decodes */
        }
        if (len == 0 || id < 0)
            continue;
        set->v[set->n].off = off, set->v[set->n].len = len, set->v[set->n].id = id;
        set->n++;
    }
    free(norm.b);
    /* bucket by first byte, then longest first within a bucket */
    memset(set->first_start, 0, sizeof set->first_start);
    for (size_t i = 0; i < set->n; i++)
        set->first_start[(unsigned char)tok->strings.b[set->v[i].off] + 1]++;
    for (int b = 0; b < 256; b++)
        set->first_start[b + 1] += set->first_start[b];
    set->by_first = xcalloc(set->n + 1, sizeof *set->by_first);
    uint32_t fill[256];
    memcpy(fill, set->first_start, sizeof fill);
    for (size_t i = 0; i < set->n; i++)
        set->by_first[fill[(unsigned char)tok->strings.b[set->v[i].off]]++] = (uint32_t)i;
    for (int b = 0; b < 256; b++)
        qsort_r(set->by_first + set->first_start[b], set->first_start[b + 1] - set->first_start[b],
                sizeof *set->by_first, pattern_order, set);
    return 0;
}

/* tokenizers' warning for added tokens whose id is not the one their "id"
 * says (another token has that id, or the content is a token already), as
 * one line: the first such token, and how many more. */
static void warn_moved_ids(struct tok_load *L, const struct added_token *added, size_t n)
{
    const struct tokenizer *tok = L->tok;
    size_t moved = 0, first = 0;
    int32_t first_id = -1;
    for (size_t i = 0; i < n; i++) {
        int32_t id = added[i].len ? tokenizer_token_to_id_n(tok, tok->strings.b + added[i].off, added[i].len) : -1;
        if (id != added[i].file_id && !moved++)
            first = i, first_id = id;
    }
    if (!moved)
        return;
    const struct added_token *t = &added[first];
    size_t held_len = 0;
    const char *held = t->file_id <= INT32_MAX ? tokenizer_id_to_token(tok, (int32_t)t->file_id, &held_len) : NULL;
    char got[64];
    snprintf(got, sizeof got, first_id >= 0 ? "gets id %d" : "gets no id (its content is empty)", first_id);
    log_warn("%s: added_tokens[%zu] '%.*s' says id %lld but %s, as in tokenizers (id %lld is %s%.*s%s)%s; encoding "
             "follows tokenizers: save the tokenizer again if the model's rows follow the file", L->path, first,
             (int)(t->len > 60 ? 60 : t->len), tok->strings.b + t->off, (long long)t->file_id, got,
             (long long)t->file_id, held ? "'" : "no token", held ? (int)(held_len > 60 ? 60 : held_len) : 0,
             held ? held : "", held ? "'" : "", moved > 1 ? "; and more added tokens like it" : "");
}

static int load_added_tokens(struct tok_load *L, json_t *list, int32_t max_vocab_id)
{
    struct tokenizer *tok = L->tok;
    struct added_token *added;
    size_t n;
    if (parse_added(L, list, &added, &n) != 0) {
        free(added);
        return -1;
    }
    int32_t *ids = xcalloc(n + 1, sizeof *ids);
    size_t *order = xcalloc(n + 1, sizeof *order), n_order;
    struct tok_str_map special = {0};
    assign_added_ids(tok, max_vocab_id, added, n, ids, &special, order, &n_order);
    build_ids(L, max_vocab_id, added, ids, n, &special);
    warn_moved_ids(L, added, n);
    int rc = build_set(L, &tok->added_raw, false, added, order, n_order) == 0 &&
                     build_set(L, &tok->added_normalized, true, added, order, n_order) == 0
                 ? 0
                 : -1;
    mark_skipped(tok, &special);
    bool single_word = false;
    for (size_t i = 0; i < n; i++)
        single_word |= added[i].single_word;
    if (rc == 0 && single_word) {
        /* through tok_regex_compile for the letters and marks newer than PCRE2's tables */
        struct tok_regex word_char;
        char why[256];
        if (tok_regex_compile(&word_char, rust_word_char, strlen(rust_word_char), TOK_PATTERN_REGEX, why,
                              sizeof why) != 0)
            fail_internal("%s: %s", rust_word_char, why);
        tok->word_char = word_char.code;
    }
    tok_str_map_free(&special);
    free(order);
    free(ids);
    free(added);
    return rc;
}

/* ---- tokenizer_config.json ---- */

/* bos_token / eos_token of tokenizer_config.json: a string, or an object
 * whose "content" is one (transformers' AddedToken); -1 when absent, null or
 * not a token of this tokenizer. */
static int32_t config_token(const struct tokenizer *tok, json_t *config, const char *key)
{
    json_t *v = json_object_get(config, key);
    if (json_is_object(v))
        v = json_object_get(v, "content");
    return json_is_string(v) ? tokenizer_token_to_id_n(tok, json_string_value(v), json_string_length(v)) : -1;
}

/* tokenizer_config.json's added_tokens_decoder ({"ID": {"content": ...}},
 * what transformers >= 4.34 writes) against this tokenizer: an id whose
 * token here has other text means that the two files belong to different
 * tokenizers. Ids this tokenizer lacks are left alone (transformers would
 * add them). 0, or -1 with err filled. */
static int check_added_tokens_decoder(struct tok_load *L, json_t *config, const char *config_path)
{
    json_t *decoder = json_object_get(config, "added_tokens_decoder"), *entry;
    const char *key;
    json_object_foreach(decoder, key, entry) {
        char *end;
        long id = strtol(key, &end, 10);
        json_t *content = json_object_get(entry, "content");
        size_t len;
        const char *have = *end == '\0' && id >= 0 && id <= INT32_MAX ? tokenizer_id_to_token(L->tok, (int32_t)id, &len)
                                                                       : NULL;
        if (!have || !json_is_string(content))
            continue;
        if (len != json_string_length(content) || memcmp(have, json_string_value(content), len) != 0) {
            tok_err(L->err, L->errlen, "%s: added_tokens_decoder says token %ld is '%.60s', but %s has '%.*s' "
                    "there: the two files come from different tokenizers; save both from the same one",
                    config_path, id, json_string_value(content), L->path, (int)(len > 60 ? 60 : len), have);
            return -1;
        }
    }
    return 0;
}

/* BOS: what the first template puts before $A. */
static int32_t template_bos(const struct tokenizer *tok)
{
    if (tok->n_templates == 0)
        return -1;
    const struct tok_template *t = &tok->templates[0];
    for (size_t i = 0; i < t->n && !t->pieces[i].sequence; i++)
        if (t->pieces[i].n_ids)
            return t->pieces[i].ids[0];
    return -1;
}

static int load_config(struct tok_load *L)
{
    struct tokenizer *tok = L->tok;
    tok->bos_id = template_bos(tok);
    tok->eos_id = -1;
    const char *slash = strrchr(L->path, '/');
    size_t dir_len = slash ? (size_t)(slash - L->path) + 1 : 0;
    char *config_path = xmalloc(dir_len + sizeof "tokenizer_config.json");
    memcpy(config_path, L->path, dir_len);
    strcpy(config_path + dir_len, "tokenizer_config.json");
    const char *kind = util_irregular(config_path);
    if (kind) {
        tok_err(L->err, L->errlen, "%s (beside %s) is %s, not a file: remove it (shardlm reads bos_token and "
                "eos_token from it)", config_path, L->path, kind);
        free(config_path);
        return -1;
    }
    FILE *f = fopen(config_path, "rb");
    if (!f) {
        free(config_path);
        return 0;
    }
    fclose(f);
    json_error_t jerr;
    char why[300];
    json_t *config = hf_json_load_file(config_path, 0, &jerr);
    int rc = 0;
    if (!json_is_object(config)) {
        tok_err(L->err, L->errlen, "%s (beside %s): %s: fix or remove it (shardlm reads bos_token and eos_token from "
                "it)", config_path, L->path, config ? "not a JSON object" : hf_json_why(&jerr, why, sizeof why));
        rc = -1;
    } else {
        int32_t bos = config_token(tok, config, "bos_token");
        if (bos >= 0)
            tok->bos_id = bos;
        tok->eos_id = config_token(tok, config, "eos_token");
        rc = check_added_tokens_decoder(L, config, config_path);
    }
    json_decref(config);
    free(config_path);
    return rc;
}

/* ---- the whole file ---- */

static int load_json(struct tok_load *L, json_t *root)
{
    if (!json_is_object(root))
        return tok_load_fail(L, "not a JSON object: not a tokenizer.json");
    json_t *version = json_object_get(root, "version");
    if (version && !(json_is_string(version) && strcmp(json_string_value(version), "1.0") == 0))
        return tok_load_fail(L, "tokenizer.json version %s; tokenizers (and shardlm) read version 1.0",
                             json_is_string(version) ? json_string_value(version) : "(not a string)");
    int32_t max_id = -1;
    if (load_model(L, json_object_get(root, "model"), &max_id) != 0 ||
        tok_load_normalizer(L, json_object_get(root, "normalizer")) != 0 ||
        tok_load_pre_tokenizer(L, json_object_get(root, "pre_tokenizer")) != 0 ||
        tok_load_post_processor(L, json_object_get(root, "post_processor")) != 0 ||
        tok_load_decoder(L, json_object_get(root, "decoder")) != 0 ||
        load_added_tokens(L, json_object_get(root, "added_tokens"), max_id) != 0)
        return -1;
    return load_config(L);
}

struct tokenizer *tokenizer_load(const char *path, char *err, size_t errlen)
{
    const char *kind = util_irregular(path);
    if (kind) {
        tok_err(err, errlen, "tokenizer '%s' is %s, not a file; give the tokenizer.json of a Hugging Face model "
                "directory", path, kind);
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        tok_err(err, errlen, "cannot open tokenizer '%s': %s; give the tokenizer.json of a Hugging Face model "
                "directory", path, strerror(errno));
        return NULL;
    }
    fclose(f);
    json_error_t jerr;
    char why[300];
    json_t *root = hf_json_load_file(path, JSON_ALLOW_NUL, &jerr);
    if (!root) {
        tok_err(err, errlen, "%s: %s; download or save the tokenizer again", path, hf_json_why(&jerr, why, sizeof why));
        return NULL;
    }
    struct tokenizer *tok = xcalloc(1, sizeof *tok);
    tok->path = xstrdup(path);
    struct tok_load L = {.tok = tok, .path = path, .err = err, .errlen = errlen};
    tok_matcher_init(&L.matcher, true);
    int rc = load_json(&L, root);
    tok_matcher_free(&L.matcher);
    json_decref(root);
    if (rc != 0) {
        tokenizer_free(tok);
        return NULL;
    }
    return tok;
}

static void free_set(struct tok_added_set *s)
{
    free(s->v);
    free(s->by_first);
}

void tokenizer_free(struct tokenizer *tok)
{
    if (!tok)
        return;
    for (size_t i = 0; i < tok->n_normalizers; i++) {
        free(tok->normalizers[i].text);
        tok_regex_free(&tok->normalizers[i].pattern);
    }
    for (size_t i = 0; i < tok->n_pretoks; i++)
        tok_regex_free(&tok->pretoks[i].pattern);
    for (size_t i = 0; i < tok->n_decoders; i++) {
        free(tok->decoders[i].content);
        tok_regex_free(&tok->decoders[i].pattern);
    }
    for (size_t i = 0; i < tok->n_templates; i++) {
        for (size_t k = 0; k < tok->templates[i].n; k++)
            free(tok->templates[i].pieces[k].ids);
        free(tok->templates[i].pieces);
    }
    free(tok->normalizers);
    free(tok->pretoks);
    free(tok->decoders);
    free(tok->templates);
    free_set(&tok->added_raw);
    free_set(&tok->added_normalized);
    pcre2_code_free(tok->word_char);
    tok_str_map_free(&tok->added);
    tok_str_map_free(&tok->bpe.vocab);
    tok_merge_map_free(&tok->bpe.merges);
    free(tok->bpe.unk_token);
    free(tok->ids);
    free(tok->strings.b);
    free(tok->path);
    free(tok);
}
