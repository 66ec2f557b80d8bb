/*
 * tokenizer_components — the normalizer, pre-tokenizer, post-processor and
 * decoder of a tokenizer.json (loaded by tokenizer_load.c, run by
 * tokenizer.c and tokenizer_decode.c). A Sequence is flattened into the list
 * of its members, which tokenizers applies one after the other; a component
 * that is not supported is refused, naming its type.
 */
#include "tokenizer_internal.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

/* GPT-2's pre-tokenization regex, which ByteLevel(use_regex=true) applies
 * (tokenizers pre_tokenizers/byte_level.rs). */
static const char gpt2_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* A {"String": s} or {"Regex": r} pattern, compiled. */
static int get_pattern(struct tok_load *L, json_t *obj, struct tok_regex *re, const char *what)
{
    json_t *p = json_object_get(obj, "pattern");
    json_t *s = json_object_get(p, "String"), *r = json_object_get(p, "Regex");
    json_t *v = json_is_string(s) ? s : r;
    if (!json_is_object(p) || !json_is_string(v))
        return tok_load_fail(L, "%s.pattern is not {\"String\": ...} or {\"Regex\": ...}: the file is damaged; make it "
                             "again with tokenizers' Tokenizer.save", what);
    char why[512];
    if (tok_regex_compile(re, json_string_value(v), json_string_length(v),
                          v == s ? TOK_PATTERN_STRING : TOK_PATTERN_REGEX, why, sizeof why) != 0)
        return tok_load_fail(L, "%s.pattern %.200s: %s; shardlm runs tokenizers' Oniguruma patterns with PCRE2, "
                             "and this one has no PCRE2 equivalent", what, json_string_value(v), why);
    return 0;
}

/* A field that holds exactly one character (Metaspace's replacement,
 * Strip's content). */
static int get_char(struct tok_load *L, json_t *obj, const char *key, char out[4], size_t *len, const char *what)
{
    const char *s;
    size_t n;
    if (tok_json_string(L, obj, key, false, &s, &n, what) != 0)
        return -1;
    if (n == 0 || n > 4 || tok_utf8_check(s, n) != n || tok_utf8_len((unsigned char)s[0]) != n)
        return tok_load_fail(L, "%s.%s is '%s', not one character: the file is damaged", what, key, s);
    memcpy(out, s, n);
    *len = n;
    return 0;
}

static int get_prepend_scheme(struct tok_load *L, json_t *obj, enum tok_prepend_scheme *out, const char *what)
{
    const char *s;
    if (tok_json_string(L, obj, "prepend_scheme", true, &s, NULL, what) != 0)
        return -1;
    *out = PREPEND_ALWAYS; /* tokenizers' default when the field is absent */
    if (s && strcmp(s, "first") == 0)
        *out = PREPEND_FIRST;
    else if (s && strcmp(s, "never") == 0)
        *out = PREPEND_NEVER;
    else if (s && strcmp(s, "always") != 0)
        return tok_load_fail(L, "%s.prepend_scheme is '%s'; tokenizers knows always, first and never", what, s);
    /* Files from before prepend_scheme: add_prefix_space false means never. */
    json_t *legacy = json_object_get(obj, "add_prefix_space");
    if (json_is_false(legacy)) {
        if (s && *out != PREPEND_NEVER)
            return tok_load_fail(L, "%s: add_prefix_space false contradicts prepend_scheme '%s' (tokenizers "
                                 "refuses it too)", what, s);
        *out = PREPEND_NEVER;
    }
    return 0;
}

/* ---- normalizer, pre-tokenizer, post-processor, decoder ---- */

typedef int (*component_loader)(struct tok_load *L, json_t *obj);

/* A zeroed element appended to the array *v of *n elements of elem bytes. */
static void *append_zeroed(void **v, size_t *n, size_t elem)
{
    *v = xrealloc(*v, (*n + 1) * elem);
    void *e = (char *)*v + *n * elem;
    memset(e, 0, elem);
    ++*n;
    return e;
}

/* The index of name in names[0, n), -1 if absent (or name is NULL). */
static int name_index(const char *name, const char *const *names, int n)
{
    for (int k = 0; name && k < n; k++)
        if (strcmp(name, names[k]) == 0)
            return k;
    return -1;
}

/* Starts loading the component obj: null is nothing (0); a Sequence has each
 * member of its `key` array loaded in order by load (0 or -1); any other is
 * one of names[0, n), whose index goes to *kind for the caller to load (1),
 * or is refused, naming it (-1). */
static int begin_component(struct tok_load *L, json_t *obj, const char *what, const char *key, component_loader load,
                           const char *const *names, int n, int *kind)
{
    if (!obj || json_is_null(obj))
        return 0;
    const char *type = tok_json_type(obj);
    if (type && strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(obj, key), *item;
        if (!json_is_array(list))
            return tok_load_fail(L, "%s Sequence has no \"%s\" array: the file is damaged", what, key);
        size_t i;
        json_array_foreach(list, i, item)
            if (load(L, item) != 0)
                return -1;
        return 0;
    }
    *kind = name_index(type, names, n);
    if (*kind >= 0)
        return 1;
    char known[256] = "";
    for (int k = 0; k < n; k++)
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s, ", names[k]);
    return tok_load_fail(L, "%s %s is not supported: %s (%ss: %sSequence)", what, type ? type : "without a type",
                         TOK_SUPPORTED, what, known);
}

int tok_load_normalizer(struct tok_load *L, json_t *n)
{
    static const char *const kinds[] = {[NORM_PREPEND] = "Prepend", [NORM_REPLACE] = "Replace", [NORM_NFC] = "NFC",
                                        [NORM_NFD] = "NFD", [NORM_NFKC] = "NFKC", [NORM_NFKD] = "NFKD",
                                        [NORM_LOWERCASE] = "Lowercase", [NORM_STRIP] = "Strip"};
    struct tokenizer *tok = L->tok;
    int kind, rc = begin_component(L, n, "normalizer", "normalizers", tok_load_normalizer, kinds,
                                   (int)(sizeof kinds / sizeof *kinds), &kind);
    if (rc <= 0)
        return rc;
    struct tok_normalizer *nm = append_zeroed((void **)&tok->normalizers, &tok->n_normalizers, sizeof *nm);
    const char *s;
    size_t len;
    nm->kind = (enum tok_normalizer_kind)kind;
    if (nm->kind == NORM_STRIP)
        return tok_json_bool(L, n, "strip_left", false, &nm->strip_left, "normalizer Strip") ||
                       tok_json_bool(L, n, "strip_right", false, &nm->strip_right, "normalizer Strip")
                   ? -1
                   : 0;
    if (nm->kind != NORM_PREPEND && nm->kind != NORM_REPLACE)
        return 0; /* the Unicode forms and Lowercase have no settings */
    if (nm->kind == NORM_PREPEND) {
        if (tok_json_string(L, n, "prepend", false, &s, &len, "normalizer Prepend") != 0)
            return -1;
    } else {
        if (tok_json_string(L, n, "content", false, &s, &len, "normalizer Replace") != 0 ||
            get_pattern(L, n, &nm->pattern, "normalizer Replace") != 0)
            return -1;
    }
    nm->text = xmalloc(len + 1);
    memcpy(nm->text, s, len);
    nm->text_len = len;
    return 0;
}

static const char *const behavior_names[] = {
    [SPLIT_REMOVED] = "Removed", [SPLIT_ISOLATED] = "Isolated", [SPLIT_MERGED_WITH_PREVIOUS] = "MergedWithPrevious",
    [SPLIT_MERGED_WITH_NEXT] = "MergedWithNext", [SPLIT_CONTIGUOUS] = "Contiguous",
};

static int load_split(struct tok_load *L, json_t *p, struct tok_pretok *pt)
{
    const char *behavior;
    if (tok_json_string(L, p, "behavior", false, &behavior, NULL, "pre_tokenizer Split") != 0 ||
        tok_json_bool(L, p, "invert", false, &pt->invert, "pre_tokenizer Split") != 0)
        return -1;
    int found = name_index(behavior, behavior_names, sizeof behavior_names / sizeof *behavior_names);
    if (found < 0)
        return tok_load_fail(L, "pre_tokenizer Split: behavior '%s' is not one of tokenizers' (Removed, Isolated, "
                             "MergedWithPrevious, MergedWithNext, Contiguous)", behavior);
    pt->behavior = (enum tok_split_behavior)found;
    return get_pattern(L, p, &pt->pattern, "pre_tokenizer Split");
}

/* Rust regex's \w and \s (tokenizers' Whitespace pre-tokenizer runs the regex
 * crate, not Oniguruma), spelled for PCRE2 inside a class. */
#define RUST_WORD "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}"
#define RUST_SPACE "\\p{White_Space}"

/* The pre-tokenizers that are a Split with a fixed pattern in tokenizers
 * (pre_tokenizers/{digits,punctuation,whitespace}.rs), indexed from
 * PRETOK_FIXED_FIRST. A character predicate there is a one-character class
 * here: tokenizers makes each matching character a match of its own, as a
 * class without a repeat does. */
enum { PRETOK_FIXED_FIRST = PRETOK_METASPACE + 1 };
static const struct fixed_split {
    const char *name;
    const char *pattern;
    enum tok_split_behavior behavior; /* when the file names none */
    bool invert;
    enum tok_pattern_kind kind; /* whose Unicode tables: Rust's (16: as new as utf8proc knows) or older */
} fixed_splits[] = {
    /* char::is_numeric (Unicode's Nd, Nl and No: "३", "①" as well as ASCII
     * digits); individual_digits picks Isolated, else Contiguous */
    {"Digits", "\\p{N}", SPLIT_CONTIGUOUS, false, TOK_PATTERN_REGEX},
    /* char::is_ascii_punctuation or Unicode's P* categories; behavior from the
     * file. is_punctuation is the unicode_categories crate's, whose tables are
     * Unicode 8's (tokenizers 0.23 splits U+2E42, not U+2E43 of Unicode 9 nor
     * Kawi's U+11F43 of Unicode 15): PCRE2's Unicode 14 is the nearest here */
    {"Punctuation", "[\\p{P}\\x{21}-\\x{2F}\\x{3A}-\\x{40}\\x{5B}-\\x{60}\\x{7B}-\\x{7E}]", SPLIT_ISOLATED, false,
     TOK_PATTERN_REGEX_PCRE2_TABLES},
    /* \w+|[^\w\s]+ kept, the rest (white space) removed */
    {"Whitespace", "[" RUST_WORD "]+|[^" RUST_WORD RUST_SPACE "]+", SPLIT_REMOVED, true, TOK_PATTERN_REGEX},
    /* char::is_whitespace, each removed */
    {"WhitespaceSplit", "[" RUST_SPACE "]", SPLIT_REMOVED, false, TOK_PATTERN_REGEX},
};
#define N_FIXED_SPLITS (sizeof fixed_splits / sizeof *fixed_splits)

static int load_fixed_split(struct tok_load *L, json_t *p, struct tok_pretok *pt, const struct fixed_split *fs)
{
    char what[64], why[256];
    snprintf(what, sizeof what, "pre_tokenizer %s", fs->name);
    pt->kind = PRETOK_SPLIT;
    pt->behavior = fs->behavior;
    pt->invert = fs->invert;
    if (strcmp(fs->name, "Digits") == 0) {
        bool individual;
        if (tok_json_bool(L, p, "individual_digits", false, &individual, what) != 0)
            return -1;
        if (individual)
            pt->behavior = SPLIT_ISOLATED;
    } else if (strcmp(fs->name, "Punctuation") == 0) {
        const char *behavior;
        if (tok_json_string(L, p, "behavior", true, &behavior, NULL, what) != 0)
            return -1;
        int found = name_index(behavior, behavior_names, sizeof behavior_names / sizeof *behavior_names);
        if (behavior && found < 0)
            return tok_load_fail(L, "%s: behavior '%s' is not one of tokenizers' (Removed, Isolated, "
                                 "MergedWithPrevious, MergedWithNext, Contiguous)", what, behavior);
        if (found >= 0)
            pt->behavior = (enum tok_split_behavior)found;
    }
    if (tok_regex_compile(&pt->pattern, fs->pattern, strlen(fs->pattern), fs->kind, why, sizeof why) != 0)
        return tok_load_fail(L, "%s's pattern: %s", what, why);
    return 0;
}

int tok_load_pre_tokenizer(struct tok_load *L, json_t *p)
{
    const char *kinds[PRETOK_FIXED_FIRST + N_FIXED_SPLITS] = {
        [PRETOK_BYTE_LEVEL] = "ByteLevel", [PRETOK_SPLIT] = "Split", [PRETOK_METASPACE] = "Metaspace"};
    for (size_t k = 0; k < N_FIXED_SPLITS; k++)
        kinds[PRETOK_FIXED_FIRST + k] = fixed_splits[k].name;
    struct tokenizer *tok = L->tok;
    int kind, rc = begin_component(L, p, "pre_tokenizer", "pretokenizers", tok_load_pre_tokenizer, kinds,
                                   (int)(sizeof kinds / sizeof *kinds), &kind);
    if (rc <= 0)
        return rc;
    struct tok_pretok *pt = append_zeroed((void **)&tok->pretoks, &tok->n_pretoks, sizeof *pt);
    if (kind >= PRETOK_FIXED_FIRST)
        return load_fixed_split(L, p, pt, &fixed_splits[kind - PRETOK_FIXED_FIRST]);
    pt->kind = (enum tok_pretok_kind)kind;
    if (pt->kind == PRETOK_BYTE_LEVEL) {
        if (tok_json_bool(L, p, "add_prefix_space", true, &pt->add_prefix_space, "pre_tokenizer ByteLevel") != 0 ||
            tok_json_bool(L, p, "use_regex", true, &pt->use_regex, "pre_tokenizer ByteLevel") != 0)
            return -1;
        char why[256];
        if (pt->use_regex &&
            tok_regex_compile(&pt->pattern, gpt2_pattern, strlen(gpt2_pattern), TOK_PATTERN_REGEX, why, sizeof why) != 0)
            return tok_load_fail(L, "GPT-2's pre-tokenization regex: %s", why);
        return 0;
    }
    if (pt->kind == PRETOK_SPLIT)
        return load_split(L, p, pt);
    return get_char(L, p, "replacement", pt->replacement, &pt->replacement_len, "pre_tokenizer Metaspace") ||
                   get_prepend_scheme(L, p, &pt->prepend_scheme, "pre_tokenizer Metaspace") ||
                   tok_json_bool(L, p, "split", true, &pt->split, "pre_tokenizer Metaspace")
               ? -1
               : 0;
}

/* TemplateProcessing's "single" template and its special tokens' ids. */
static int load_template(struct tok_load *L, json_t *p)
{
    struct tokenizer *tok = L->tok;
    json_t *single = json_object_get(p, "single"), *specials = json_object_get(p, "special_tokens"), *item;
    if (!json_is_array(single) || !json_is_object(specials))
        return tok_load_fail(L, "post_processor TemplateProcessing has no \"single\" array or no "
                             "\"special_tokens\" object: the file is damaged");
    struct tok_template *t = append_zeroed((void **)&tok->templates, &tok->n_templates, sizeof *t);
    t->n = json_array_size(single);
    t->pieces = xcalloc(t->n ? t->n : 1, sizeof *t->pieces);
    size_t i;
    json_array_foreach(single, i, item) {
        json_t *seq = json_object_get(item, "Sequence"), *special = json_object_get(item, "SpecialToken");
        const char *id;
        if (seq) {
            if (tok_json_string(L, seq, "id", false, &id, NULL, "post_processor TemplateProcessing.single") != 0)
                return -1;
            if (strcmp(id, "A") != 0)
                return tok_load_fail(L, "post_processor TemplateProcessing: the single-sequence template uses "
                                     "$%s; only $A is there (tokenizers fails on it too)", id);
            t->pieces[i].sequence = true;
            continue;
        }
        if (!special || tok_json_string(L, special, "id", false, &id, NULL, "post_processor TemplateProcessing") != 0)
            return tok_load_fail(L, "post_processor TemplateProcessing.single[%zu] is neither a Sequence nor a "
                                 "SpecialToken: the file is damaged", i);
        json_t *ids = json_object_get(json_object_get(specials, id), "ids"), *v;
        if (!json_is_array(ids))
            return tok_load_fail(L, "post_processor TemplateProcessing: special token '%s' of the template has no "
                                 "ids in special_tokens (tokenizers refuses it too)", id);
        t->pieces[i].n_ids = json_array_size(ids);
        t->pieces[i].ids = xcalloc(t->pieces[i].n_ids ? t->pieces[i].n_ids : 1, sizeof(int32_t));
        size_t k;
        json_array_foreach(ids, k, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= INT32_MAX)
                return tok_load_fail(L, "post_processor TemplateProcessing: special token '%s' has an id that is "
                                     "not one", id);
            t->pieces[i].ids[k] = (int32_t)json_integer_value(v);
        }
    }
    return 0;
}

int tok_load_post_processor(struct tok_load *L, json_t *p)
{
    static const char *const kinds[] = {"ByteLevel", "TemplateProcessing"};
    int kind, rc = begin_component(L, p, "post_processor", "processors", tok_load_post_processor, kinds, 2, &kind);
    if (rc <= 0)
        return rc;
    return kind == 0 ? 0 /* ByteLevel trims offsets only */ : load_template(L, p);
}

int tok_load_decoder(struct tok_load *L, json_t *d)
{
    static const char *const kinds[] = {[DEC_BYTE_LEVEL] = "ByteLevel", [DEC_REPLACE] = "Replace",
                                        [DEC_BYTE_FALLBACK] = "ByteFallback", [DEC_FUSE] = "Fuse",
                                        [DEC_STRIP] = "Strip", [DEC_METASPACE] = "Metaspace"};
    struct tokenizer *tok = L->tok;
    tok->has_decoder |= d && !json_is_null(d);
    int kind, rc = begin_component(L, d, "decoder", "decoders", tok_load_decoder, kinds, 6, &kind);
    if (rc <= 0)
        return rc;
    struct tok_decoder *dec = append_zeroed((void **)&tok->decoders, &tok->n_decoders, sizeof *dec);
    dec->kind = (enum tok_decoder_kind)kind;
    const char *s;
    size_t len;
    char c[4];
    switch (dec->kind) {
    case DEC_REPLACE:
        if (tok_json_string(L, d, "content", false, &s, &len, "decoder Replace") != 0 ||
            get_pattern(L, d, &dec->pattern, "decoder Replace") != 0)
            return -1;
        break;
    case DEC_STRIP:
        if (get_char(L, d, "content", c, &len, "decoder Strip") != 0 ||
            tok_json_count(L, d, "start", &dec->start, "decoder Strip") != 0 ||
            tok_json_count(L, d, "stop", &dec->stop, "decoder Strip") != 0)
            return -1;
        s = c;
        break;
    case DEC_METASPACE:
        if (get_char(L, d, "replacement", c, &len, "decoder Metaspace") != 0 ||
            get_prepend_scheme(L, d, &dec->prepend_scheme, "decoder Metaspace") != 0)
            return -1;
        s = c;
        break;
    default:
        return 0;
    }
    dec->content = xmalloc(len + 1);
    memcpy(dec->content, s, len);
    dec->content_len = len;
    return 0;
}

