/*
 * config_values — what the config's files share for reading values out of
 * the JSON document: dotted key paths (doc_get / doc_put, defaults written
 * back so the document is the resolved config), typed reads with defaults,
 * range checks, and the saturating size arithmetic of the bounds
 * (config_internal.h).
 */
#include "config_internal.h"

#include "core/util.h"

#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* ---- small JSON helpers ------------------------------------------------ */

void join_path(char *out, size_t cap, const char *prefix, const char *key)
{
    if (prefix && *prefix)
        snprintf(out, cap, "%s.%s", prefix, key);
    else
        snprintf(out, cap, "%s", key);
}

const char *json_kind_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "number";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* Compact text of a value for messages, shortened to fit `cap`. */
const char *json_brief(const json_t *v, char *out, size_t cap)
{
    char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(15));
    if (!text)
        fail_internal("config: cannot format a JSON value");
    size_t len = strlen(text);
    if (len < cap)
        memcpy(out, text, len + 1);
    else
        snprintf(out, cap, "%.*s...", (int)(cap > 4 ? cap - 4 : 0), text);
    free(text);
    return out;
}

/* The value at a dotted path; NULL when absent, null, or below a non-object. */
json_t *doc_get(json_t *root, const char *path)
{
    char buf[KEY_PATH_CAP];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *node = root;
    for (char *comp = buf;;) {
        char *dot = strchr(comp, '.');
        if (dot)
            *dot = '\0';
        if (!json_is_object(node))
            return NULL;
        node = json_object_get(node, comp);
        if (!node)
            return NULL;
        if (!dot)
            break;
        comp = dot + 1;
    }
    return json_is_null(node) ? NULL : node;
}

/* Sets the value at a dotted path (the reference to `value` is stolen),
 * creating missing or null objects on the way. When something on the way is
 * neither, returns false and writes its path into `blocker`. */
bool doc_put(json_t *root, const char *path, json_t *value, char *blocker, size_t blocker_cap)
{
    char buf[KEY_PATH_CAP];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *node = root;
    char *comp = buf;
    for (char *dot; (dot = strchr(comp, '.')) != NULL; comp = dot + 1) {
        *dot = '\0';
        json_t *next = json_object_get(node, comp);
        if (!next || json_is_null(next)) {
            next = json_object();
            json_object_set_new(node, comp, next);
        } else if (!json_is_object(next)) {
            snprintf(blocker, blocker_cap, "%.*s", (int)(dot - buf), path);
            json_decref(value);
            return false;
        }
        node = next;
    }
    json_object_set_new(node, comp, value);
    return true;
}

/* Writes a default back so the document shows the resolved value. */
void put_default(json_t *root, const char *path, json_t *value)
{
    char blocker[KEY_PATH_CAP];
    if (!value || !doc_put(root, path, value, blocker, sizeof blocker))
        fail_internal("config: cannot record the default of '%s'", path);
}

/* ---- typed reads with defaults ----------------------------------------- */

bool is_given(json_t *root, const char *path) { return doc_get(root, path) != NULL; }

long long read_int64(json_t *root, const char *path, long long def, enum fill_mode fill)
{
    json_t *v = doc_get(root, path);
    if (!v) {
        if (fill)
            put_default(root, path, json_integer(def));
        return def;
    }
    return json_is_integer(v) ? (long long)json_integer_value(v) : (long long)json_real_value(v);
}

int read_int(json_t *root, const char *path, int def, enum fill_mode fill)
{
    long long v = read_int64(root, path, def, fill);
    if (v < INT_MIN || v > INT_MAX)
        fail_input("config: '%s' is %lld, out of range (at most %d)", path, v, INT_MAX);
    return (int)v;
}

double read_num(json_t *root, const char *path, double def, enum fill_mode fill)
{
    json_t *v = doc_get(root, path);
    if (!v) {
        if (fill)
            put_default(root, path, json_real(def));
        return def;
    }
    return json_number_value(v);
}

bool read_bool(json_t *root, const char *path, bool def, enum fill_mode fill)
{
    json_t *v = doc_get(root, path);
    if (!v) {
        if (fill)
            put_default(root, path, json_boolean(def));
        return def;
    }
    return json_is_true(v);
}

/* The string at path (owned by the document), or def (NULL: not given). */
const char *read_str(json_t *root, const char *path, const char *def, enum fill_mode fill)
{
    json_t *v = doc_get(root, path);
    if (!v) {
        if (fill && def)
            put_default(root, path, json_string(def));
        return def;
    }
    return json_string_value(v);
}

/* An optional non-empty path string, copied (NULL when not given). */
char *read_path(json_t *root, const char *path)
{
    const char *s = read_str(root, path, NULL, NO_FILL);
    if (!s)
        return NULL;
    if (!*s)
        fail_input("config: '%s' is an empty string; give a path or remove the key", path);
    return xstrdup(s);
}

void require_positive(const char *path, long long v)
{
    if (v <= 0)
        fail_input("config: '%s' must be positive, got %lld", path, v);
}

void require_non_negative(const char *path, long long v)
{
    if (v < 0)
        fail_input("config: '%s' must be >= 0, got %lld", path, v);
}

void require_non_negative_num(const char *path, double v)
{
    if (!(v >= 0))
        fail_input("config: '%s' must be >= 0, got %g", path, v);
}

void require_ratio(const char *path, double v)
{
    if (!(v >= 0 && v <= 1))
        fail_input("config: '%s' must be between 0 and 1, got %g", path, v);
}

/* ---- size bounds ------------------------------------------------------- */

long long sat_mul(long long a, long long b)
{
    long long r;
    return __builtin_mul_overflow(a, b, &r) ? LLONG_MAX : r;
}

long long sat_add(long long a, long long b)
{
    long long r;
    return __builtin_add_overflow(a, b, &r) ? LLONG_MAX : r;
}

/* Fails when n elements of what exceed limit; keys names the keys that set it
 * and their values, as the user wrote them. */
void check_bound(const char *what, long long n, long long limit, const char *keys)
{
    if (n <= limit)
        return;
    fail_input("config: %s would hold %s%.3g elements (%s), more than the %.3g shardlm allows; lower one of "
               "these keys",
               what, n == LLONG_MAX ? "over " : "", (double)n, keys, (double)limit);
}
