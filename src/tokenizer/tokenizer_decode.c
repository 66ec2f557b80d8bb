/*
 * tokenizer_decode — decoding and the streaming decoder (contracts in
 * tokenizer.h), as tokenizers does it: the ids' tokens (unknown ids skipped,
 * special ones too with skip_special), each decoder turning the list of
 * strings into a new list (decode_chain), then the list joined; without a
 * decoder the tokens joined by spaces.
 */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/util.h"

/* The last ids of a stream's context kept as the start of its window, as
 * text-generation-inference keeps 5: enough for a character of up to four
 * byte tokens to be whole again, and for the first token's own decoding
 * (Llama 2's stripped space, Metaspace's dropped marker) to fall on a token
 * that is not printed. */
#define STREAM_CONTEXT 5

/* Ids a stream holds back at most while their text ends in U+FFFD: a UTF-8
 * character takes at most 4 byte tokens, so more than this is text that is
 * not UTF-8 (a model emitting stray bytes), handed out as U+FFFD rather than
 * decoded again and again in a growing window. */
#define STREAM_MAX_PENDING 8

static const char replacement_char[] = "\xEF\xBF\xBD"; /* U+FFFD */

/* A list of strings, back to back in one buffer. */
struct strs {
    struct tok_bytes buf;
    struct {
        size_t off, len;
    } *v;
    size_t n, cap;
};

/* Ends the string that started at buf offset `from` (appended since). */
static void strs_close(struct strs *l, size_t from)
{
    tok_grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v);
    l->v[l->n].off = from;
    l->v[l->n].len = l->buf.len - from;
    l->n++;
}

static void strs_push(struct strs *l, const char *s, size_t len)
{
    size_t from = l->buf.len;
    tok_bytes_append(&l->buf, s, len);
    strs_close(l, from);
}

static const char *strs_at(const struct strs *l, size_t i) { return l->buf.b + l->v[i].off; }

static void strs_free(struct strs *l)
{
    free(l->buf.b);
    free(l->v);
}

/* GPT-2's character-to-byte map, the inverse of tokenizer.c's byte_char;
 * -1 for a character that stands for no byte. */
static int char_byte(uint32_t cp)
{
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp >= 0x100 && cp <= 0x120)
        return (int)(cp - 0x100);
    if (cp >= 0x121 && cp <= 0x142)
        return (int)(0x7F + cp - 0x121);
    if (cp == 0x143)
        return 0xAD;
    return -1;
}

/* ByteLevel: every token's characters as bytes (a token with a character
 * that is no byte's stays as it is), all joined, then read as UTF-8 with
 * U+FFFD for what is not. */
static void decode_byte_level(const struct strs *in, struct strs *out)
{
    struct tok_bytes bytes = {0};
    for (size_t i = 0; i < in->n; i++) {
        const char *t = strs_at(in, i);
        size_t len = in->v[i].len, mark = bytes.len, k = 0;
        for (; k < len; k += tok_utf8_len((unsigned char)t[k])) {
            int b = char_byte(tok_utf8_decode(t + k));
            if (b < 0)
                break;
            char c = (char)b;
            tok_bytes_append(&bytes, &c, 1);
        }
        if (k < len) {
            bytes.len = mark;
            tok_bytes_append(&bytes, t, len);
        }
    }
    size_t from = out->buf.len;
    tok_utf8_lossy(&out->buf, bytes.b ? bytes.b : "", bytes.len);
    strs_close(out, from);
    free(bytes.b);
}

static int decode_replace(const struct tok_decoder *d, const struct strs *in, struct strs *out)
{
    struct tok_matcher m;
    struct tok_spans spans = {0};
    int rc = 0;
    tok_matcher_init(&m, false);
    for (size_t i = 0; i < in->n && rc == 0; i++) {
        const char *t = strs_at(in, i);
        rc = tok_find_matches(&d->pattern, &m, t, in->v[i].len, &spans, NULL, 0);
        size_t from = out->buf.len;
        for (size_t k = 0; rc == 0 && k < spans.n; k++) {
            if (spans.v[k].match)
                tok_bytes_append(&out->buf, d->content, d->content_len);
            else
                tok_bytes_append(&out->buf, t + spans.v[k].start, spans.v[k].end - spans.v[k].start);
        }
        strs_close(out, from);
    }
    free(spans.v);
    tok_matcher_free(&m);
    return rc;
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                                                                      : -1;
}

/* The byte of a <0xXX> token (Rust's u8::from_str_radix of XX, which also
 * takes a '+' before one digit), -1 for any other token. */
static int fallback_byte(const char *t, size_t len)
{
    if (len != 6 || memcmp(t, "<0x", 3) != 0 || t[5] != '>')
        return -1;
    int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
    if (t[3] == '+' && lo >= 0)
        return lo;
    return hi >= 0 && lo >= 0 ? hi * 16 + lo : -1;
}

/* The bytes of consecutive <0xXX> tokens: one string when they are UTF-8,
 * else one U+FFFD per byte. */
static void flush_bytes(struct tok_bytes *bytes, struct strs *out)
{
    if (!bytes->len)
        return;
    if (tok_utf8_check(bytes->b, bytes->len) == bytes->len)
        strs_push(out, bytes->b, bytes->len);
    else
        for (size_t k = 0; k < bytes->len; k++)
            strs_push(out, replacement_char, 3);
    bytes->len = 0;
}

static void decode_byte_fallback(const struct strs *in, struct strs *out)
{
    struct tok_bytes bytes = {0};
    for (size_t i = 0; i < in->n; i++) {
        int b = fallback_byte(strs_at(in, i), in->v[i].len);
        if (b >= 0) {
            char c = (char)b;
            tok_bytes_append(&bytes, &c, 1);
            continue;
        }
        flush_bytes(&bytes, out);
        strs_push(out, strs_at(in, i), in->v[i].len);
    }
    flush_bytes(&bytes, out);
    free(bytes.b);
}

static void decode_fuse(const struct strs *in, struct strs *out)
{
    size_t from = out->buf.len;
    for (size_t i = 0; i < in->n; i++)
        tok_bytes_append(&out->buf, strs_at(in, i), in->v[i].len);
    strs_close(out, from);
}

/* Strip: up to `start` leading and `stop` trailing characters equal to the
 * content removed from each token. */
static void decode_strip(const struct tok_decoder *d, const struct strs *in, struct strs *out)
{
    const char *c = d->content;
    size_t clen = d->content_len;
    for (size_t i = 0; i < in->n; i++) {
        const char *t = strs_at(in, i);
        size_t begin = 0, end = in->v[i].len;
        for (size_t k = 0; k < d->start && end - begin >= clen && memcmp(t + begin, c, clen) == 0; k++)
            begin += clen;
        for (size_t k = 0; k < d->stop && end - begin >= clen && memcmp(t + end - clen, c, clen) == 0; k++)
            end -= clen;
        strs_push(out, t + begin, end - begin);
    }
}

/* Metaspace: the replacement character back to a space, except in the first
 * token, where it is dropped unless the prepend scheme is never. */
static void decode_metaspace(const struct tok_decoder *d, const struct strs *in, struct strs *out)
{
    for (size_t i = 0; i < in->n; i++) {
        const char *t = strs_at(in, i);
        size_t len = in->v[i].len, from = out->buf.len;
        for (size_t k = 0; k < len;) {
            size_t n = tok_utf8_len((unsigned char)t[k]);
            if (n == d->content_len && memcmp(t + k, d->content, n) == 0) {
                if (i > 0 || d->prepend_scheme == PREPEND_NEVER)
                    tok_bytes_append(&out->buf, " ", 1);
            } else {
                tok_bytes_append(&out->buf, t + k, n);
            }
            k += n;
        }
        strs_close(out, from);
    }
}

static int decode_step(const struct tok_decoder *d, const struct strs *in, struct strs *out)
{
    switch (d->kind) {
    case DEC_BYTE_LEVEL: decode_byte_level(in, out); return 0;
    case DEC_REPLACE: return decode_replace(d, in, out);
    case DEC_BYTE_FALLBACK: decode_byte_fallback(in, out); return 0;
    case DEC_FUSE: decode_fuse(in, out); return 0;
    case DEC_STRIP: decode_strip(d, in, out); return 0;
    case DEC_METASPACE: decode_metaspace(d, in, out); return 0;
    }
    return -1;
}

char *tokenizer_decode(const struct tokenizer *tok, const int32_t *ids, size_t n, int skip_special, size_t *len)
{
    struct strs a = {0}, b = {0};
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (size_t)ids[i] >= tok->n_ids || !tok->ids[ids[i]].has_text)
            continue;
        const struct tok_id *t = &tok->ids[ids[i]];
        if (!(skip_special && (t->flags & TOK_ID_SKIPPED)))
            strs_push(&a, tok->strings.b + t->dec_off, t->dec_len);
    }
    for (size_t k = 0; k < tok->n_decoders; k++) {
        b.buf.len = 0, b.n = 0;
        if (decode_step(&tok->decoders[k], &a, &b) != 0) {
            /* a Replace pattern ran out of PCRE2's limits: leave its tokens as they are */
            continue;
        }
        struct strs t = a;
        a = b;
        b = t;
    }
    struct tok_bytes out = {0};
    for (size_t i = 0; i < a.n; i++) {
        if (i > 0 && !tok->has_decoder)
            tok_bytes_append(&out, " ", 1);
        tok_bytes_append(&out, strs_at(&a, i), a.v[i].len);
    }
    tok_bytes_reserve(&out, 0);
    out.b[out.len] = 0;
    if (len)
        *len = out.len;
    strs_free(&a);
    strs_free(&b);
    return out.b;
}

/* ------------------------------------------------------------------------ */
/* Streaming                                                                  */

void tokenizer_stream_init(struct tokenizer_stream *st, const struct tokenizer *tok, const int32_t *context,
                           size_t n_context, int skip_special)
{
    memset(st, 0, sizeof *st);
    st->tok = tok;
    st->skip_special = skip_special;
    size_t keep = n_context < STREAM_CONTEXT ? n_context : STREAM_CONTEXT;
    tok_grow((void **)&st->ids, &st->cap, keep + 1, sizeof *st->ids);
    if (keep)
        memcpy(st->ids, context + n_context - keep, keep * sizeof *st->ids);
    st->n = st->read = keep;
}

/* Hands out the text the window's unread ids add to its read ones, when
 * `final`, when it does not end in U+FFFD, or when too many ids are held
 * back; then the window starts where the read ids ended. */
static const char *stream_emit(struct tokenizer_stream *st, bool final, size_t *len)
{
    size_t plen, flen;
    char *prefix = tokenizer_decode(st->tok, st->ids, st->read, st->skip_special, &plen);
    char *full = tokenizer_decode(st->tok, st->ids, st->n, st->skip_special, &flen);
    bool pending = flen >= 3 && memcmp(full + flen - 3, replacement_char, 3) == 0 &&
                   st->n - st->read <= STREAM_MAX_PENDING;
    size_t from = plen, n = 0;
    if (flen > plen && (final || !pending)) {
        while (from < flen && ((unsigned char)full[from] & 0xC0) == 0x80)
            from++; /* a cut inside a character (the texts disagree before it): start at the next one */
        n = flen - from;
        memmove(st->ids, st->ids + st->read, (st->n - st->read) * sizeof *st->ids);
        st->n -= st->read;
        st->read = st->n;
    }
    tok_grow((void **)&st->out, &st->out_cap, n + 1, 1);
    memcpy(st->out, full + from, n);
    st->out[n] = 0;
    *len = n;
    free(prefix);
    free(full);
    return st->out;
}

const char *tokenizer_stream_push(struct tokenizer_stream *st, int32_t id, size_t *len)
{
    tok_grow((void **)&st->ids, &st->cap, st->n + 1, sizeof *st->ids);
    st->ids[st->n++] = id;
    return stream_emit(st, false, len);
}

const char *tokenizer_stream_finish(struct tokenizer_stream *st, size_t *len)
{
    return stream_emit(st, true, len);
}

void tokenizer_stream_free(struct tokenizer_stream *st)
{
    free(st->ids);
    free(st->out);
    memset(st, 0, sizeof *st);
}
