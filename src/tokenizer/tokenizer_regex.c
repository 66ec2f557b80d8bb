/*
 * tokenizer_regex — tokenizers' regexes with PCRE2 (tokenizer_internal.h).
 *
 * tokenizers compiles its patterns with Oniguruma (the onig crate, Ruby
 * syntax). Where Oniguruma and PCRE2 (UTF + UCP) read the same spelling
 * differently, the pattern is rewritten before PCRE2 compiles it:
 *   \s \S  Oniguruma: Unicode White_Space; PCRE2 adds U+180E (in its \h)
 *          -> \p{White_Space} / \P{White_Space}
 *   \w \W  Oniguruma: Unicode's Word property plus Latin-1's superscripts
 *          and fractions (not U+2460 and other numbers outside both); PCRE2
 *          10.42: letters and numbers -> [ONIG_WORD] and its negation
 *   \d \D  both Unicode's Nd -> \p{Nd} / \P{Nd}, so that they widen (below)
 *   \h \H  Oniguruma: a hexadecimal digit; PCRE2: horizontal space
 *          -> [0-9a-fA-F] and its negation
 *   \uHHHH Oniguruma's escape -> \x{HHHH}
 *   ^ $    Ruby semantics: at every line -> PCRE2_MULTILINE
 *   (?m)   Ruby's option for . to match a newline -> (?s) (PCRE2's (?m)
 *          is already on)
 * Property escapes (\p{L}, \P{N}, \p{^So}, \p{Letter}, and those of the
 * rewrites) are spelled by tok_unicode_property: the code points utf8proc
 * assigns and PCRE2 10.42's Unicode 14 leaves unassigned join their category
 * (TOK_PATTERN_REGEX_PCRE2_TABLES: not, for Punctuation's older tables).
 * A negated class escape inside a class ([^\W]) has no PCRE2 spelling and is
 * refused. GPT-2's and Llama 3's patterns need only the \s rewrite; the test
 * (tests/t_tokenizer.py) compares the splits with tokenizers' on text in many
 * scripts and on patterns that use the other rewrites.
 *
 * Matching runs PCRE2's JIT when the library has it; encoding gives it a JIT
 * stack of up to TOK_JIT_STACK_MAX bytes (a backtracking pattern over a long
 * run of spaces needs more than the default 32 KiB), decoding (one token at a
 * time) the default.
 */
#define _GNU_SOURCE /* memmem */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/util.h"

#define TOK_JIT_STACK_MIN (32 * 1024)
#define TOK_JIT_STACK_MAX (8 * 1024 * 1024)

/* Oniguruma's \w as tokenizers runs it: Unicode's Word property (Alphabetic,
 * marks, decimal digits, connector punctuation, Join_Control) and Latin-1's
 * superscripts and fractions (a No such as U+2460 CIRCLED DIGIT ONE is not a
 * word character; U+00B2 SUPERSCRIPT TWO is), as tokenizers 0.19 splits them. */
#define ONIG_WORD "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}"

/* What each rewritten escape becomes outside a class and inside one (NULL:
 * no spelling inside a class). */
struct escape_rewrite {
    char escape;
    const char *outside, *inside;
};
static const struct escape_rewrite rewrites[] = {
    {'s', "\\p{White_Space}", "\\p{White_Space}"},
    {'S', "\\P{White_Space}", "\\P{White_Space}"},
    {'w', "[" ONIG_WORD "]", ONIG_WORD},
    {'W', "[^" ONIG_WORD "]", NULL},
    {'d', "\\p{Nd}", "\\p{Nd}"},
    {'D', "\\P{Nd}", "\\P{Nd}"},
    {'h', "[0-9a-fA-F]", "0-9a-fA-F"},
    {'H', "[^0-9a-fA-F]", NULL},
};

static bool is_option(char c) { return c == 'i' || c == 'm' || c == 'x' || c == '-'; }

static bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* The property escape at p[0, len) (\p{name}, \p{^name}, \P{name}, \pL),
 * appended as tok_unicode_property spells it; *used: the escape's bytes.
 * False (nothing appended) when it is not one that widens. */
static bool widen_property(const char *p, size_t len, bool in_class, struct tok_bytes *out, size_t *used)
{
    bool negated = p[1] == 'P';
    const char *name = p + 2;
    size_t n = 1;
    if (len >= 3 && p[2] == '{') {
        const char *close = memchr(p + 3, '}', len - 3);
        if (!close)
            return false;
        name = p + 3;
        n = (size_t)(close - name);
        *used = n + 4;
    } else if (len >= 3 && ((p[2] >= 'A' && p[2] <= 'Z') || (p[2] >= 'a' && p[2] <= 'z'))) {
        *used = 3;
    } else {
        return false;
    }
    if (n && name[0] == '^') {
        negated = !negated;
        name++, n--;
    }
    return tok_unicode_property(out, name, n, negated, in_class);
}

/* Oniguruma pattern p[0, len) in PCRE2's spelling, appended to out; *in_class:
 * whether p starts (and, on return, ends) inside a character class. widen:
 * property escapes go through tok_unicode_property. Returns 0, or -1 with
 * why filled. */
static int translate(const char *p, size_t len, bool *in_class_io, bool widen, struct tok_bytes *out, char *why,
                     size_t whylen)
{
    bool in_class = *in_class_io;
    for (size_t i = 0; i < len;) {
        char c = p[i];
        if (c == '[' && !in_class) {
            in_class = true;
            tok_bytes_append(out, p + i, 1);
            i++;
            /* A ']' first in the class (after an optional '^') is a literal. */
            if (i < len && p[i] == '^')
                tok_bytes_append(out, p + i++, 1);
            if (i < len && p[i] == ']')
                tok_bytes_append(out, p + i++, 1);
            continue;
        }
        if (c == '[' && in_class && i + 1 < len && p[i + 1] == ':') { /* POSIX class: copied to its ":]" */
            const char *end = memmem(p + i, len - i, ":]", 2);
            size_t n = end ? (size_t)(end - (p + i)) + 2 : len - i;
            tok_bytes_append(out, p + i, n);
            i += n;
            continue;
        }
        if (c == ']' && in_class) {
            in_class = false;
            tok_bytes_append(out, p + i++, 1);
            continue;
        }
        if (c == '(' && !in_class && i + 2 < len && p[i + 1] == '?' && is_option(p[i + 2])) {
            /* an option group (?imx-imx) or (?imx-imx:...): Ruby's m is PCRE2's s */
            tok_bytes_append(out, "(?", 2);
            for (i += 2; i < len && is_option(p[i]); i++)
                tok_bytes_append(out, p[i] == 'm' ? "s" : p + i, 1);
            continue;
        }
        if (c != '\\' || i + 1 >= len) {
            tok_bytes_append(out, p + i++, 1);
            continue;
        }
        char e = p[i + 1];
        size_t used;
        const struct escape_rewrite *r = NULL;
        for (size_t k = 0; k < sizeof rewrites / sizeof *rewrites; k++)
            if (rewrites[k].escape == e)
                r = &rewrites[k];
        if (r) {
            const char *with = in_class ? r->inside : r->outside;
            if (!with) {
                tok_err(why, whylen, "\\%c inside a character class has no PCRE2 equivalent", e);
                return -1;
            }
            /* the rewrite's own property escapes (\w's \p{Alphabetic} ...) widen too */
            if (translate(with, strlen(with), &in_class, widen, out, why, whylen) != 0)
                return -1;
            i += 2;
        } else if ((e == 'p' || e == 'P') && widen && widen_property(p + i, len - i, in_class, out, &used)) {
            i += used;
        } else if (e == 'u' && i + 5 < len && is_hex(p[i + 2]) && is_hex(p[i + 3]) && is_hex(p[i + 4]) &&
                   is_hex(p[i + 5])) {
            tok_bytes_append(out, "\\x{", 3);
            tok_bytes_append(out, p + i + 2, 4);
            tok_bytes_append(out, "}", 1);
            i += 6;
        } else { /* any other escape, with the whole character it escapes */
            size_t n = 1 + tok_utf8_len((unsigned char)e);
            if (i + n > len)
                n = len - i;
            tok_bytes_append(out, p + i, n);
            i += n;
        }
    }
    *in_class_io = in_class;
    return 0;
}

int tok_regex_compile(struct tok_regex *re, const char *pattern, size_t len, enum tok_pattern_kind kind, char *why,
                      size_t whylen)
{
    struct tok_bytes text = {0};
    uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE;
    bool in_class = false;
    if (kind == TOK_PATTERN_STRING) {
        options = PCRE2_UTF | PCRE2_LITERAL; /* the only options PCRE2 takes with a literal */
        tok_bytes_append(&text, pattern, len);
    } else if (translate(pattern, len, &in_class, kind == TOK_PATTERN_REGEX, &text, why, whylen) != 0) {
        free(text.b);
        return -1;
    }
    int code;
    PCRE2_SIZE at;
    tok_bytes_reserve(&text, 0);
    re->code = pcre2_compile((PCRE2_SPTR)(text.b ? text.b : ""), text.len, options, &code, &at, NULL);
    if (!re->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        tok_err(why, whylen, "PCRE2 cannot compile it (as rewritten: %.*s): %s at offset %zu", (int)text.len,
                text.b ? text.b : "", (const char *)msg, (size_t)at);
        free(text.b);
        return -1;
    }
    free(text.b);
    pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE); /* without JIT support, the interpreter runs it */
    return 0;
}

void tok_regex_free(struct tok_regex *re)
{
    pcre2_code_free(re->code);
    re->code = NULL;
}

void tok_matcher_init(struct tok_matcher *m, bool long_texts)
{
    memset(m, 0, sizeof *m);
    m->md = pcre2_match_data_create(1, NULL);
    m->mctx = pcre2_match_context_create(NULL);
    if (!m->md || !m->mctx)
        fail_internal("out of host memory creating PCRE2 match data");
    if (long_texts)
        m->jit_stack = pcre2_jit_stack_create(TOK_JIT_STACK_MIN, TOK_JIT_STACK_MAX, NULL);
    if (m->jit_stack)
        pcre2_jit_stack_assign(m->mctx, NULL, m->jit_stack);
}

void tok_matcher_free(struct tok_matcher *m)
{
    pcre2_match_data_free(m->md);
    pcre2_match_context_free(m->mctx);
    pcre2_jit_stack_free(m->jit_stack);
    memset(m, 0, sizeof *m);
}

void tok_spans_push(struct tok_spans *s, size_t start, size_t end, bool match)
{
    tok_grow((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v);
    s->v[s->n++] = (struct tok_span){.start = start, .end = end, .match = match};
}

int tok_find_matches(const struct tok_regex *re, struct tok_matcher *m, const char *s, size_t len,
                     struct tok_spans *out, char *err, size_t errlen)
{
    out->n = 0;
    if (len == 0) {
        tok_spans_push(out, 0, 0, false);
        return 0;
    }
    /* The onig crate's find_iter: search from last_end; an empty match at the
     * end of the previous match is passed over (the search moves on by one
     * character), any other match is taken. */
    size_t prev = 0, last_end = 0;
    size_t last_match_end = SIZE_MAX;
    while (last_end <= len) {
        int rc = pcre2_match(re->code, (PCRE2_SPTR)s, len, last_end, PCRE2_NO_UTF_CHECK, m->md, m->mctx);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            tok_err(err, errlen, "the regex failed on a text of %zu bytes: %s", len, (const char *)msg);
            return -1;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
        size_t start = ov[0], end = ov[1];
        if (start == end && end == last_match_end) {
            last_end += last_end < len ? tok_utf8_len((unsigned char)s[last_end]) : 1;
            continue;
        }
        last_end = end;
        last_match_end = end;
        if (prev != start)
            tok_spans_push(out, prev, start, false);
        tok_spans_push(out, start, end, true);
        prev = end;
    }
    if (prev != len)
        tok_spans_push(out, prev, len, false);
    return 0;
}
