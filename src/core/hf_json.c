#include "hf_json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

/* The most digits a json_int_t (64-bit) literal can have, and the largest
 * magnitudes; jansson refuses a literal beyond them ("too big integer"). */
#define INT64_DIGITS 19
static const char int64_max_digits[] = "9223372036854775807";
static const char int64_min_digits[] = "9223372036854775808";

/* Python's bare non-finite literals and what the loader makes of them. */
static const struct {
    const char *bare, *quoted;
} non_finite[] = {{"NaN", "\"NaN\""}, {"Infinity", "\"Infinity\""}, {"-Infinity", "\"-Infinity\""}};

struct text {
    char *b;
    size_t len, cap;
};

static void text_put(struct text *t, const char *s, size_t n)
{
    if (t->len + n + 1 > t->cap) {
        t->cap = (t->len + n + 1) * 2;
        t->b = xrealloc(t->b, t->cap);
    }
    memcpy(t->b + t->len, s, n);
    t->len += n;
    t->b[t->len] = '\0';
}

static bool starts_with(const char *s, size_t len, const char *word)
{
    size_t n = strlen(word);
    return len >= n && memcmp(s, word, n) == 0;
}

/* Whether the integer literal s[0, len) (an optional '-', then digits) is
 * beyond a 64-bit integer. */
static bool beyond_int64(const char *s, size_t len)
{
    bool negative = s[0] == '-';
    const char *digits = s + negative;
    size_t n = len - negative;
    if (n != INT64_DIGITS)
        return n > INT64_DIGITS;
    return memcmp(digits, negative ? int64_min_digits : int64_max_digits, INT64_DIGITS) > 0;
}

/* The length of the number literal at s (digits, sign, '.', exponent) and
 * whether it is an integer (digits only after an optional '-'). */
static size_t number_length(const char *s, size_t len, bool *integer)
{
    size_t j = s[0] == '-';
    *integer = true;
    for (; j < len; j++) {
        char c = s[j];
        if (c >= '0' && c <= '9')
            continue;
        if (c != '.' && c != 'e' && c != 'E' && c != '+' && c != '-')
            break;
        *integer = false;
    }
    return j;
}

/* s[0, len) with the rewrites of hf_json.h into out; false (out untouched)
 * when nothing needs rewriting. Inside strings nothing is touched. */
static bool rewrite(const char *s, size_t len, struct text *out)
{
    size_t i = 0, copied = 0;
    bool in_string = false;
    while (i < len) {
        char c = s[i];
        if (in_string) {
            i += c == '\\' ? 2 : 1;
            in_string = c != '"';
            continue;
        }
        if (c == '"') {
            in_string = true;
            i++;
            continue;
        }
        const char *replacement = NULL;
        size_t span = 1;
        for (size_t k = 0; k < sizeof non_finite / sizeof *non_finite && !replacement; k++)
            if (starts_with(s + i, len - i, non_finite[k].bare)) {
                replacement = non_finite[k].quoted;
                span = strlen(non_finite[k].bare);
            }
        bool integer = false;
        if (!replacement && (c == '-' || (c >= '0' && c <= '9'))) {
            span = number_length(s + i, len - i, &integer);
            if (integer && span > (size_t)(c == '-') && beyond_int64(s + i, span)) {
                text_put(out, s + copied, i + span - copied);
                text_put(out, ".0", 2); /* the same digits, read as a real */
                copied = i + span;
            }
        }
        if (replacement) {
            text_put(out, s + copied, i - copied);
            text_put(out, replacement, strlen(replacement));
            copied = i + span;
        }
        i += span;
    }
    if (copied == 0)
        return false;
    text_put(out, s + copied, len - copied);
    return true;
}

json_t *hf_json_loadb(const char *text, size_t len, size_t flags, json_error_t *err)
{
    struct text t = {0};
    if (!rewrite(text, len, &t))
        return json_loadb(text, len, flags, err);
    json_t *root = json_loadb(t.b, t.len, flags, err);
    free(t.b);
    return root;
}

/* Everything fd holds from where it is; false with errno set on a read error. */
static bool read_all(int fd, struct text *t)
{
    char chunk[65536];
    for (;;) {
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return false;
        if (n == 0)
            return true;
        text_put(t, chunk, (size_t)n);
    }
}

/* Fills err as jansson does for a file it cannot read (line -1). */
static void read_failed(json_error_t *err, const char *what, const char *path)
{
    if (!err)
        return;
    memset(err, 0, sizeof *err);
    err->line = err->column = -1;
    err->position = 0;
    snprintf(err->source, sizeof err->source, "%s", path);
    snprintf(err->text, sizeof err->text, "unable to %s %s: %s", what, path, strerror(errno));
}

json_t *hf_json_loadfd(int fd, size_t flags, json_error_t *err)
{
    struct text t = {0};
    if (!read_all(fd, &t)) {
        free(t.b);
        read_failed(err, "read", "<stream>");
        return NULL;
    }
    json_t *root = hf_json_loadb(t.b ? t.b : "", t.len, flags, err);
    free(t.b);
    return root;
}

json_t *hf_json_load_file(const char *path, size_t flags, json_error_t *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        read_failed(err, "open", path);
        return NULL;
    }
    struct text t = {0};
    bool ok = read_all(fileno(f), &t);
    fclose(f);
    if (!ok) {
        free(t.b);
        read_failed(err, "read", path);
        return NULL;
    }
    json_t *root = hf_json_loadb(t.b ? t.b : "", t.len, flags, err);
    free(t.b);
    if (!root && err)
        snprintf(err->source, sizeof err->source, "%s", path);
    return root;
}

const char *hf_json_why(const json_error_t *err, char *buf, size_t cap)
{
    if (err->line >= 1)
        snprintf(buf, cap, "not valid JSON (%s at line %d, column %d)", err->text, err->line, err->column);
    else
        snprintf(buf, cap, "%s", err->text);
    return buf;
}

bool hf_json_number(const json_t *v, double *out)
{
    if (json_is_number(v)) {
        *out = json_number_value(v);
        return true;
    }
    const char *s = json_string_value(v);
    if (!s)
        return false;
    if (strcmp(s, "NaN") == 0)
        *out = NAN;
    else if (strcmp(s, "Infinity") == 0)
        *out = INFINITY;
    else if (strcmp(s, "-Infinity") == 0)
        *out = -INFINITY;
    else
        return false;
    return true;
}

const char *hf_chat_template(const json_t *config, const char *name)
{
    json_t *t = json_object_get(config, "chat_template"), *entry;
    if (!name)
        name = "default";
    if (json_is_string(t))
        return strcmp(name, "default") == 0 ? json_string_value(t) : NULL;
    size_t i;
    json_array_foreach(t, i, entry) {
        const char *n = json_string_value(json_object_get(entry, "name"));
        const char *body = json_string_value(json_object_get(entry, "template"));
        if (n && body && strcmp(n, name) == 0)
            return body;
    }
    return NULL;
}

size_t hf_chat_template_names(const json_t *config, const char **names, size_t cap)
{
    json_t *t = json_object_get(config, "chat_template"), *entry;
    size_t i, n = 0;
    json_array_foreach(t, i, entry) {
        const char *name = json_string_value(json_object_get(entry, "name"));
        if (!name || !json_is_string(json_object_get(entry, "template")))
            continue;
        if (n < cap)
            names[n] = name;
        n++;
    }
    return n;
}
