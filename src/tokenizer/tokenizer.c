/*
 * tokenizer — encoding (contract in tokenizer.h), in tokenizers' order:
 * added tokens on the raw text, then per remaining piece the normalizers and
 * the normalized added tokens, the pre-tokenizers, BPE, the template.
 *
 * The text lives in one growing buffer (the input copied in, then every
 * transformed piece appended); a piece is an offset and a length into it, so
 * that splitting costs nothing and a transformation appends its result.
 * Each stage reads the current list of pieces and writes the next one; empty
 * pieces are dropped after every split, as tokenizers drops them.
 *
 * Offsets into the original text matter in one place: Metaspace with
 * prepend_scheme "first" marks only a piece that starts at offset 0 of the
 * input. A piece keeps that as at_origin, and `lead`, the bytes that a
 * prepend put at its start (tokenizers aligns them with the first character
 * after them): a piece cut from another starts at offset 0 when its parent
 * did and the cut is within that lead. That is exact for what the supported
 * components insert (Prepend, ByteLevel's prefix space, Metaspace's marker);
 * a Replace that rewrites the lead itself is not followed.
 */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/util.h"

struct piece {
    size_t off, len;    /* in run.text */
    int32_t token;      /* >= 0: an added token, final; -1: text still to tokenize */
    size_t lead;        /* leading bytes inserted by a prepend */
    bool at_origin;     /* starts at offset 0 of the input */
};

struct piece_list {
    struct piece *v;
    size_t n, cap;
};

/* The state of one tokenizer_encode call. */
struct run {
    const struct tokenizer *tok;
    struct tok_bytes text;
    struct piece_list cur, next;  /* this stage's pieces and the next stage's */
    struct tok_spans spans, kept;
    struct tok_matcher matcher;
    struct tok_bpe_work bpe;
    struct tok_ids ids;
    char *err;
    size_t errlen;
};

static void push_piece(struct piece_list *l, struct piece p)
{
    tok_grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v);
    l->v[l->n++] = p;
}

/* parent's bytes [start, end) as a piece of the next stage (none if empty). */
static void push_sub(struct run *r, const struct piece *parent, size_t start, size_t end)
{
    if (end <= start)
        return;
    struct piece p = {
        .off = parent->off + start,
        .len = end - start,
        .token = -1,
        .lead = start < parent->lead ? parent->lead - start : 0,
        .at_origin = parent->at_origin && start <= parent->lead,
    };
    if (p.lead > p.len)
        p.lead = p.len;
    push_piece(&r->next, p);
}

static void next_stage(struct run *r)
{
    struct piece_list t = r->cur;
    r->cur = r->next;
    r->next = t;
    r->next.n = 0;
}

/* ------------------------------------------------------------------------ */
/* Added tokens                                                               */

/* 1 if the character that starts at s[pos] (word_char_before: that ends at
 * pos) is a Rust regex \w character, what single_word looks at. */
static bool word_char_at(struct run *r, const char *s, size_t len, size_t pos)
{
    return pcre2_match(r->tok->word_char, (PCRE2_SPTR)s, len, pos, PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK,
                       r->matcher.md, NULL) >= 0;
}

static bool word_char_before(struct run *r, const char *s, size_t len, size_t pos)
{
    size_t at = pos - 1;
    while (at > 0 && ((unsigned char)s[at] & 0xC0) == 0x80)
        at--;
    return word_char_at(r, s, len, at);
}

/* Bytes of the Unicode white space that starts s[0, len) / ends s[0, len). */
static size_t white_space_at_start(const char *s, size_t len)
{
    size_t i = 0;
    while (i < len && tok_is_white_space(tok_utf8_decode(s + i)))
        i += tok_utf8_len((unsigned char)s[i]);
    return i;
}

static size_t white_space_at_end(const char *s, size_t len)
{
    size_t end = len;
    while (end > 0) {
        size_t at = end - 1;
        while (at > 0 && ((unsigned char)s[at] & 0xC0) == 0x80)
            at--;
        if (!tok_is_white_space(tok_utf8_decode(s + at)))
            break;
        end = at;
    }
    return len - end;
}

/* The leftmost-longest occurrence of a pattern of set in s[from, len): its id,
 * start and length; -1 when there is none. */
static int32_t find_added(const struct tokenizer *tok, const struct tok_added_set *set, const char *s, size_t len,
                          size_t from, size_t *at, size_t *mlen)
{
    for (size_t i = from; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        for (uint32_t k = set->first_start[c]; k < set->first_start[c + 1]; k++) {
            const uint32_t e = set->by_first[k];
            if (set->v[e].len <= len - i && memcmp(tok->strings.b + set->v[e].off, s + i, set->v[e].len) == 0) {
                *at = i, *mlen = set->v[e].len;
                return set->v[e].id;
            }
        }
    }
    return -1;
}

/* tokenizers' AddedVocabulary::find_matches on piece p: the added tokens of
 * set become final pieces, the text between them pieces of the next stage. */
static void split_added(struct run *r, const struct tok_added_set *set, const struct piece *p)
{
    const struct tokenizer *tok = r->tok;
    const char *s = r->text.b + p->off;
    size_t len = p->len, start_offset = 0, from = 0, at, mlen;
    int32_t id;
    while (set->n && (id = find_added(tok, set, s, len, from, &at, &mlen)) >= 0) {
        size_t start = at, stop = at + mlen;
        from = stop; /* the search goes on after the match, whatever the stripping below takes */
        uint32_t flags = tok->ids[id].flags;
        if ((flags & TOK_ID_SINGLE_WORD) &&
            ((start > 0 && word_char_before(r, s, len, start)) || (stop < len && word_char_at(r, s, len, stop))))
            continue;
        if (flags & TOK_ID_LSTRIP) {
            size_t new_start = start - white_space_at_end(s, start);
            start = new_start > start_offset ? new_start : start_offset;
        }
        if (flags & TOK_ID_RSTRIP)
            stop += white_space_at_start(s + stop, len - stop);
        if (start_offset < start)
            push_sub(r, p, start_offset, start);
        push_piece(&r->next, (struct piece){.off = p->off + start, .len = stop - start, .token = id});
        start_offset = stop;
    }
    if (start_offset < len)
        push_sub(r, p, start_offset, len);
}

/* ------------------------------------------------------------------------ */
/* Normalizers                                                                */

int tok_normalize(const struct tokenizer *tok, const char *text, size_t len, struct tok_matcher *m,
                  struct tok_bytes *out, size_t *inserted, char *err, size_t errlen)
{
    struct tok_bytes a = {0}, b = {0};
    struct tok_spans spans = {0};
    int rc = 0;
    size_t added = 0;
    tok_bytes_append(&a, text, len); /* text may lie in out, which grows below */
    for (size_t i = 0; i < tok->n_normalizers && rc == 0; i++) {
        const struct tok_normalizer *nm = &tok->normalizers[i];
        b.len = 0;
        if (nm->kind == NORM_PREPEND) {
            if (a.len == 0)
                continue; /* tokenizers prepends to non-empty text only */
            tok_bytes_append(&b, nm->text, nm->text_len);
            tok_bytes_append(&b, a.b, a.len);
            added += nm->text_len;
        } else if (nm->kind != NORM_REPLACE && a.len == 0) {
            continue; /* the empty text stays empty */
        } else if (nm->kind >= NORM_NFC && nm->kind <= NORM_NFKD) {
            if (tok_unicode_normalize((enum tok_unicode_form)(nm->kind - NORM_NFC), a.b, a.len, &b) != 0) {
                tok_err(err, errlen, "utf8proc cannot normalize the text (%zu bytes)", a.len);
                rc = -1;
            }
        } else if (nm->kind == NORM_LOWERCASE) {
            tok_lowercase(a.b, a.len, &b);
        } else if (nm->kind == NORM_STRIP) {
            size_t left = nm->strip_left ? white_space_at_start(a.b, a.len) : 0;
            size_t right = nm->strip_right ? white_space_at_end(a.b + left, a.len - left) : 0;
            tok_bytes_append(&b, a.b + left, a.len - left - right);
        } else {
            rc = tok_find_matches(&nm->pattern, m, a.b ? a.b : "", a.len, &spans, err, errlen);
            for (size_t k = 0; rc == 0 && k < spans.n; k++) {
                const struct tok_span *sp = &spans.v[k];
                if (sp->match)
                    tok_bytes_append(&b, nm->text, nm->text_len);
                else
                    tok_bytes_append(&b, a.b + sp->start, sp->end - sp->start);
            }
        }
        struct tok_bytes t = a;
        a = b;
        b = t;
    }
    if (rc == 0)
        tok_bytes_append(out, a.b, a.len);
    if (inserted)
        *inserted = added;
    free(a.b);
    free(b.b);
    free(spans.v);
    return rc;
}

/* Normalizes piece p (its text appended to the buffer) and splits it on the
 * normalized added tokens. */
static int normalize_piece(struct run *r, const struct piece *p)
{
    struct piece q = *p;
    if (r->tok->n_normalizers) {
        size_t inserted, before = r->text.len;
        if (tok_normalize(r->tok, r->text.b + p->off, p->len, &r->matcher, &r->text, &inserted, r->err,
                          r->errlen) != 0)
            return -1;
        q.off = before, q.len = r->text.len - before, q.lead = p->lead + inserted;
    }
    if (q.len)
        split_added(r, &r->tok->added_normalized, &q);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Pre-tokenizers                                                             */

/* tokenizers' SplitDelimiterBehavior applied to the spans of a piece (as
 * NormalizedString::split does): the spans to keep, into kept. */
static void apply_behavior(const struct tok_spans *in, enum tok_split_behavior behavior, struct tok_spans *kept)
{
    kept->n = 0;
    bool previous_match = false;
    if (behavior == SPLIT_MERGED_WITH_NEXT) { /* folded from the end, then put back in order */
        for (size_t k = in->n; k-- > 0;) {
            const struct tok_span *s = &in->v[k];
            if (s->match && !previous_match && kept->n)
                kept->v[kept->n - 1].start = s->start;
            else
                tok_spans_push(kept, s->start, s->end, false);
            previous_match = s->match;
        }
        for (size_t i = 0, j = kept->n; i + 1 < j; i++, j--) {
            struct tok_span t = kept->v[i];
            kept->v[i] = kept->v[j - 1];
            kept->v[j - 1] = t;
        }
        return;
    }
    for (size_t k = 0; k < in->n; k++) {
        const struct tok_span *s = &in->v[k];
        if (behavior == SPLIT_REMOVED && s->match)
            continue;
        bool extend = (behavior == SPLIT_CONTIGUOUS && s->match == previous_match) ||
                      (behavior == SPLIT_MERGED_WITH_PREVIOUS && s->match && !previous_match);
        if (extend && kept->n)
            kept->v[kept->n - 1].end = s->end;
        else
            tok_spans_push(kept, s->start, s->end, false);
        previous_match = s->match;
    }
}

static void push_kept(struct run *r, const struct piece *p)
{
    for (size_t k = 0; k < r->kept.n; k++)
        push_sub(r, p, r->kept.v[k].start, r->kept.v[k].end);
}

static int pretok_split(struct run *r, const struct tok_pretok *pt, const struct piece *p)
{
    if (tok_find_matches(&pt->pattern, &r->matcher, r->text.b + p->off, p->len, &r->spans, r->err, r->errlen) != 0)
        return -1;
    if (pt->invert)
        for (size_t k = 0; k < r->spans.n; k++)
            r->spans.v[k].match = !r->spans.v[k].match;
    apply_behavior(&r->spans, pt->behavior, &r->kept);
    push_kept(r, p);
    return 0;
}

/* GPT-2's byte-to-character map (tokenizers' bytes_char): the printable bytes
 * stand for themselves, the others for U+0100 onwards in byte order. */
static uint32_t byte_char(unsigned char b)
{
    if (b <= 0x20)
        return 0x100 + b;
    if (b >= 0x7F && b <= 0xA0)
        return 0x100 + 33 + (b - 0x7F);
    if (b == 0xAD)
        return 0x100 + 33 + 34;
    return b;
}

/* Rewrites the pieces next[first, next.n) with each byte as its character. */
static void byte_level_map(struct run *r, size_t first)
{
    for (size_t i = first; i < r->next.n; i++) {
        struct piece *q = &r->next.v[i];
        size_t off = r->text.len, lead = 0;
        char *dst = tok_bytes_reserve(&r->text, 2 * q->len);
        const unsigned char *src = (const unsigned char *)r->text.b + q->off;
        size_t n = 0;
        for (size_t k = 0; k < q->len; k++) {
            n += tok_utf8_encode(byte_char(src[k]), dst + n);
            if (k + 1 == q->lead)
                lead = n;
        }
        r->text.len += n;
        q->off = off, q->len = n, q->lead = lead;
    }
}

static int pretok_byte_level(struct run *r, const struct tok_pretok *pt, const struct piece *p)
{
    struct piece q = *p;
    if (pt->add_prefix_space && r->text.b[p->off] != ' ') {
        size_t off = r->text.len;
        char *dst = tok_bytes_reserve(&r->text, p->len + 1); /* before reading: it may move the text */
        dst[0] = ' ';
        memcpy(dst + 1, r->text.b + p->off, p->len);
        r->text.len += p->len + 1;
        q.off = off, q.len = p->len + 1, q.lead = p->lead + 1;
    }
    size_t first = r->next.n;
    if (!pt->use_regex)
        push_sub(r, &q, 0, q.len);
    else if (tok_find_matches(&pt->pattern, &r->matcher, r->text.b + q.off, q.len, &r->spans, r->err, r->errlen) != 0)
        return -1;
    else {
        apply_behavior(&r->spans, SPLIT_ISOLATED, &r->kept);
        push_kept(r, &q);
    }
    byte_level_map(r, first);
    return 0;
}

/* Metaspace: every ' ' as the replacement character, the replacement put in
 * front as the prepend scheme says, then (split) a piece starting at each
 * replacement character. */
static void pretok_metaspace(struct run *r, const struct tok_pretok *pt, const struct piece *p)
{
    const char *rep = pt->replacement;
    const size_t rep_len = pt->replacement_len;
    const char *src = r->text.b + p->off;
    bool starts = src[0] == ' ' || (p->len >= rep_len && memcmp(src, rep, rep_len) == 0);
    bool prepend = !starts && (pt->prepend_scheme == PREPEND_ALWAYS ||
                               (pt->prepend_scheme == PREPEND_FIRST && p->at_origin));
    struct piece q = {.off = r->text.len, .token = -1, .at_origin = p->at_origin};
    char *dst = tok_bytes_reserve(&r->text, rep_len + p->len * rep_len);
    src = r->text.b + p->off;
    size_t n = 0;
    if (prepend) {
        memcpy(dst, rep, rep_len);
        n = rep_len;
    }
    for (size_t k = 0; k < p->len; k++) {
        if (src[k] == ' ') {
            memcpy(dst + n, rep, rep_len);
            n += rep_len;
        } else {
            dst[n++] = src[k];
        }
        if (k + 1 == p->lead)
            q.lead = n;
    }
    if (prepend && p->lead == 0)
        q.lead = rep_len;
    r->text.len += n;
    q.len = n;
    if (!pt->split) {
        push_sub(r, &q, 0, q.len);
        return;
    }
    /* tokenizers' char pattern: each replacement character a match */
    const char *t = r->text.b + q.off;
    size_t last = 0;
    r->spans.n = 0;
    for (size_t k = 0; k < n; k += tok_utf8_len((unsigned char)t[k])) {
        if (k + rep_len <= n && memcmp(t + k, rep, rep_len) == 0) {
            if (last < k)
                tok_spans_push(&r->spans, last, k, false);
            tok_spans_push(&r->spans, k, k + rep_len, true);
            last = k + rep_len;
        }
    }
    if (last < n)
        tok_spans_push(&r->spans, last, n, false);
    apply_behavior(&r->spans, SPLIT_MERGED_WITH_NEXT, &r->kept);
    push_kept(r, &q);
}

static int pre_tokenize(struct run *r)
{
    const struct tokenizer *tok = r->tok;
    for (size_t s = 0; s < tok->n_pretoks; s++) {
        const struct tok_pretok *pt = &tok->pretoks[s];
        for (size_t i = 0; i < r->cur.n; i++) {
            const struct piece *p = &r->cur.v[i];
            int rc = 0;
            if (p->token >= 0)
                push_piece(&r->next, *p);
            else if (pt->kind == PRETOK_BYTE_LEVEL)
                rc = pretok_byte_level(r, pt, p);
            else if (pt->kind == PRETOK_SPLIT)
                rc = pretok_split(r, pt, p);
            else
                pretok_metaspace(r, pt, p);
            if (rc != 0)
                return -1;
        }
        next_stage(r);
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Encoding                                                                   */

static void apply_templates(struct run *r)
{
    for (size_t t = 0; t < r->tok->n_templates; t++) {
        const struct tok_template *tp = &r->tok->templates[t];
        struct tok_ids out = {0};
        for (size_t i = 0; i < tp->n; i++) {
            const struct tok_template_piece *piece = &tp->pieces[i];
            if (piece->sequence)
                for (size_t k = 0; k < r->ids.n; k++)
                    tok_ids_push(&out, r->ids.v[k]);
            else
                for (size_t k = 0; k < piece->n_ids; k++)
                    tok_ids_push(&out, piece->ids[k]);
        }
        free(r->ids.v);
        r->ids = out;
    }
}

static int encode_run(struct run *r, const char *text, size_t len, int add_special)
{
    const struct tokenizer *tok = r->tok;
    size_t bad = tok_utf8_check(text, len);
    if (bad < len) {
        tok_err(r->err, r->errlen, "the text is not valid UTF-8 (byte 0x%02X at offset %zu); tokenizers reads "
                "Unicode text only: convert the file to UTF-8", (unsigned char)text[bad], bad);
        return -1;
    }
    tok_bytes_append(&r->text, text, len);
    if (len) {
        struct piece whole = {.off = 0, .len = len, .token = -1, .at_origin = true};
        split_added(r, &tok->added_raw, &whole);
        next_stage(r);
    }
    for (size_t i = 0; i < r->cur.n; i++) {
        const struct piece *p = &r->cur.v[i];
        if (p->token >= 0)
            push_piece(&r->next, *p);
        else if (normalize_piece(r, p) != 0)
            return -1;
    }
    next_stage(r);
    if (pre_tokenize(r) != 0)
        return -1;
    for (size_t i = 0; i < r->cur.n; i++) {
        const struct piece *p = &r->cur.v[i];
        if (p->token >= 0)
            tok_ids_push(&r->ids, p->token);
        else if (tok_bpe_tokenize(tok, r->text.b + p->off, p->len, &r->bpe, &r->ids, r->err, r->errlen) != 0)
            return -1;
    }
    if (add_special)
        apply_templates(r);
    return 0;
}

int tokenizer_encode(const struct tokenizer *tok, const char *text, size_t len, int add_special, int32_t **ids,
                     size_t *n, char *err, size_t errlen)
{
    struct run r = {.tok = tok, .err = err, .errlen = errlen};
    tok_matcher_init(&r.matcher, true);
    int rc = encode_run(&r, text, len, add_special);
    *ids = NULL, *n = 0;
    if (rc == 0 && r.ids.n) {
        *ids = r.ids.v, *n = r.ids.n;
        r.ids.v = NULL;
    }
    free(r.ids.v);
    free(r.text.b);
    free(r.cur.v);
    free(r.next.v);
    free(r.spans.v);
    free(r.kept.v);
    tok_matcher_free(&r.matcher);
    tok_bpe_work_free(&r.bpe);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Lookups                                                                    */

int32_t tokenizer_token_to_id_n(const struct tokenizer *tok, const char *token, size_t len)
{
    int32_t id = tok_str_map_get(&tok->added, &tok->strings, token, len);
    return id >= 0 ? id : tok_str_map_get(&tok->bpe.vocab, &tok->strings, token, len);
}

int32_t tokenizer_token_to_id(const struct tokenizer *tok, const char *token)
{
    return tokenizer_token_to_id_n(tok, token, strlen(token));
}

const char *tokenizer_id_to_token(const struct tokenizer *tok, int32_t id, size_t *len)
{
    if (id < 0 || (size_t)id >= tok->n_ids || !tok->ids[id].has_text)
        return NULL;
    *len = tok->ids[id].len;
    return tok->strings.b + tok->ids[id].off;
}

int tokenizer_is_special(const struct tokenizer *tok, int32_t id)
{
    return id >= 0 && (size_t)id < tok->n_ids && (tok->ids[id].flags & TOK_ID_SPECIAL);
}

size_t tokenizer_vocab_size(const struct tokenizer *tok) { return tok->n_ids; }
int32_t tokenizer_bos_id(const struct tokenizer *tok) { return tok->bos_id; }
int32_t tokenizer_eos_id(const struct tokenizer *tok) { return tok->eos_id; }
