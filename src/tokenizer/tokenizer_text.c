/*
 * tokenizer_text — the tokenizer's small tools (tokenizer_internal.h): byte
 * buffers, UTF-8, and the two hash maps (token text -> id, merge pair ->
 * rank), both open addressing with linear probing over a power-of-two table
 * kept at most half full.
 */
#include "tokenizer_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/util.h"

void tok_grow(void **v, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    *v = xrealloc(*v, c * elem);
    *cap = c;
}

char *tok_bytes_reserve(struct tok_bytes *t, size_t more)
{
    tok_grow((void **)&t->b, &t->cap, t->len + more + 1, 1); /* + 1: room for a terminating NUL */
    return t->b + t->len;
}

void tok_bytes_append(struct tok_bytes *t, const void *p, size_t n)
{
    char *dst = tok_bytes_reserve(t, n);
    if (n)
        memcpy(dst, p, n);
    t->len += n;
}

void tok_ids_push(struct tok_ids *a, int32_t id)
{
    tok_grow((void **)&a->v, &a->cap, a->n + 1, sizeof *a->v);
    a->v[a->n++] = id;
}

void tok_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------------ */
/* UTF-8                                                                      */

uint32_t tok_utf8_decode(const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80)
        return u[0];
    if (u[0] < 0xE0)
        return (uint32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F);
    if (u[0] < 0xF0)
        return (uint32_t)(u[0] & 0x0F) << 12 | (uint32_t)(u[1] & 0x3F) << 6 | (u[2] & 0x3F);
    return (uint32_t)(u[0] & 0x07) << 18 | (uint32_t)(u[1] & 0x3F) << 12 | (uint32_t)(u[2] & 0x3F) << 6 |
           (u[3] & 0x3F);
}

size_t tok_utf8_encode(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | cp >> 6);
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* How many bytes of s[0, len) form a valid UTF-8 sequence: the whole
 * character's length when it is valid, else the length of its longest valid
 * prefix (0 when the first byte cannot start a character), as a negative
 * number. The second byte's range depends on the first (Unicode Table 3-7:
 * no overlong forms, no surrogates, nothing above U+10FFFF). */
static int utf8_valid_prefix(const unsigned char *s, size_t len)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    int need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    for (int k = 1; k < need; k++) {
        if ((size_t)k >= len || s[k] < lo || s[k] > hi)
            return -k;
        lo = 0x80, hi = 0xBF;
    }
    return need;
}

size_t tok_utf8_check(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        int k = utf8_valid_prefix(u + i, len - i);
        if (k <= 0)
            return i;
        i += (size_t)k;
    }
    return len;
}

void tok_utf8_lossy(struct tok_bytes *out, const char *s, size_t len)
{
    static const char replacement[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0; /* s[run, i): valid, not yet copied */
    while (i < len) {
        int k = u[i] < 0x80 ? 1 : utf8_valid_prefix(u + i, len - i);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        tok_bytes_append(out, s + run, i - run);
        tok_bytes_append(out, replacement, sizeof replacement);
        i += k < 0 ? (size_t)-k : 1;
        run = i;
    }
    tok_bytes_append(out, s + run, i - run);
}

int tok_unicode_normalize(enum tok_unicode_form form, const char *s, size_t len, struct tok_bytes *out)
{
    static const int options[] = {
        [TOK_NFC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE,
        [TOK_NFD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
        [TOK_NFKC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
        [TOK_NFKD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT,
    };
    utf8proc_uint8_t *result = NULL;
    /* The length is given (no UTF8PROC_NULLTERM): a NUL in the text is a character like any other. */
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &result,
                                      (utf8proc_option_t)options[form]);
    if (n < 0)
        return -1;
    tok_bytes_append(out, result, (size_t)n);
    free(result);
    return 0;
}

void tok_lowercase(const char *s, size_t len, struct tok_bytes *out)
{
    for (size_t i = 0; i < len;) {
        uint32_t cp = tok_utf8_decode(s + i);
        i += tok_utf8_len((unsigned char)s[i]);
        char buf[4];
        if (cp == 0x130) { /* the one unconditional multi-character lowercase (SpecialCasing.txt): i + U+0307 */
            tok_bytes_append(out, "i\xcc\x87", 3);
            continue;
        }
        tok_bytes_append(out, buf, tok_utf8_encode((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), buf));
    }
}

bool tok_is_white_space(uint32_t cp)
{
    /* Unicode's White_Space property (PropList.txt), unchanged since 6.3. */
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

/* ------------------------------------------------------------------------ */
/* Hash maps                                                                  */

uint32_t tok_hash(const char *s, size_t len)
{
    /* 64-bit multiply-xorshift over 8-byte words, folded to 32 bits. */
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (len * 0xC2B2AE3D27D4EB4Full);
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        s += 8, len -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, len);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    h *= 0xFF51AFD7ED558CCDull;
    return (uint32_t)(h ^ h >> 32);
}

static void str_map_rehash(struct tok_str_map *m, size_t slots)
{
    free(m->slots);
    m->slots = xcalloc(slots, sizeof *m->slots);
    m->mask = slots - 1;
    for (size_t e = 0; e < m->n; e++) {
        size_t i = m->entries[e].hash & m->mask;
        while (m->slots[i])
            i = (i + 1) & m->mask;
        m->slots[i] = (uint32_t)e + 1;
    }
}

/* The slot of key, or of the empty slot where it would go. */
static size_t str_map_find(const struct tok_str_map *m, const struct tok_bytes *pool, const char *key, size_t len,
                           uint32_t hash)
{
    size_t i = hash & m->mask;
    while (m->slots[i]) {
        const struct tok_str_entry *e = &m->entries[m->slots[i] - 1];
        if (e->hash == hash && e->len == len && memcmp(pool->b + e->off, key, len) == 0)
            break;
        i = (i + 1) & m->mask;
    }
    return i;
}

int32_t tok_str_map_get(const struct tok_str_map *m, const struct tok_bytes *pool, const char *key, size_t len)
{
    if (!m->slots)
        return -1;
    size_t i = str_map_find(m, pool, key, len, tok_hash(key, len));
    return m->slots[i] ? m->entries[m->slots[i] - 1].value : -1;
}

int32_t tok_str_map_set(struct tok_str_map *m, const struct tok_bytes *pool, uint32_t off, uint32_t len,
                        int32_t value)
{
    if (!m->slots || 2 * (m->n + 1) > m->mask + 1)
        str_map_rehash(m, m->slots ? 2 * (m->mask + 1) : 64);
    uint32_t hash = tok_hash(pool->b + off, len);
    size_t i = str_map_find(m, pool, pool->b + off, len, hash);
    if (m->slots[i]) {
        struct tok_str_entry *e = &m->entries[m->slots[i] - 1];
        int32_t old = e->value;
        e->value = value;
        return old;
    }
    tok_grow((void **)&m->entries, &m->cap, m->n + 1, sizeof *m->entries);
    m->entries[m->n] = (struct tok_str_entry){.off = off, .len = len, .hash = hash, .value = value};
    m->slots[i] = (uint32_t)++m->n;
    return -1;
}

void tok_str_map_free(struct tok_str_map *m)
{
    free(m->slots);
    free(m->entries);
    memset(m, 0, sizeof *m);
}

static size_t merge_slot(uint64_t key, size_t mask)
{
    key *= 0x9E3779B97F4A7C15ull;
    return (size_t)(key >> 32 ^ key) & mask;
}

void tok_merge_map_init(struct tok_merge_map *m, size_t n_merges)
{
    size_t slots = 16;
    while (slots < 2 * n_merges)
        slots *= 2;
    m->slots = xmalloc(slots * sizeof *m->slots);
    for (size_t i = 0; i < slots; i++)
        m->slots[i].key = TOK_NO_PAIR;
    m->mask = slots - 1;
}

void tok_merge_map_set(struct tok_merge_map *m, int32_t left, int32_t right, uint32_t rank, int32_t merged)
{
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    size_t i = merge_slot(key, m->mask);
    while (m->slots[i].key != TOK_NO_PAIR && m->slots[i].key != key)
        i = (i + 1) & m->mask;
    m->slots[i] = (struct tok_merge){.key = key, .rank = rank, .merged = merged};
}

const struct tok_merge *tok_merge_map_get(const struct tok_merge_map *m, int32_t left, int32_t right)
{
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    size_t i = merge_slot(key, m->mask);
    while (m->slots[i].key != key) {
        if (m->slots[i].key == TOK_NO_PAIR)
            return NULL;
        i = (i + 1) & m->mask;
    }
    return &m->slots[i];
}

void tok_merge_map_free(struct tok_merge_map *m)
{
    free(m->slots);
    memset(m, 0, sizeof *m);
}
