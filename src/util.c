#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static abort_hook_fn g_abort_hook;
static int g_rank = -1, g_world = 1;

void util_set_abort_hook(abort_hook_fn hook) { g_abort_hook = hook; }
abort_hook_fn util_get_abort_hook(void) { return g_abort_hook; }
void util_set_rank(int rank, int world) { g_rank = rank; g_world = world; }

void util_exit(int status)
{
    fflush(stdout);
    fflush(stderr);
    if (g_abort_hook)
        g_abort_hook(status);
    exit(status);
}

static void vmessage(const char *kind, const char *fmt, va_list ap)
{
    char line[2048];
    vsnprintf(line, sizeof line, fmt, ap);
    if (g_world > 1)
        fprintf(stderr, "shardlm: rank %d: %s: %s\n", g_rank, kind, line);
    else
        fprintf(stderr, "shardlm: %s: %s\n", kind, line);
    fflush(stderr);
}

void fail_input(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmessage("error", fmt, ap);
    va_end(ap);
    util_exit(EXIT_BAD_INPUT);
}

void fail_internal(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmessage("internal error", fmt, ap);
    va_end(ap);
    util_exit(EXIT_INTERNAL);
}

void log_warn(const char *fmt, ...)
{
    if (g_rank > 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vmessage("warning", fmt, ap);
    va_end(ap);
}

void log_info(const char *fmt, ...)
{
    if (g_rank > 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        fail_internal("out of host memory allocating %zu x %zu bytes", n, size);
    return p;
}

void *xmalloc(size_t size) { return xcalloc(1, size); }

void *xrealloc(void *p, size_t size)
{
    void *q = realloc(p, size ? size : 1);
    if (!q)
        fail_internal("out of host memory growing a table to %zu bytes", size);
    return q;
}

char *xstrdup(const char *s)
{
    char *d = strdup(s);
    if (!d)
        fail_internal("out of host memory copying a string");
    return d;
}

void *xalloc_aligned(size_t bytes)
{
    void *p = NULL;
    size_t n = round_up(bytes ? bytes : 1, 4096);
    if (posix_memalign(&p, 4096, n) != 0)
        fail_internal("out of host memory allocating %zu bytes", n);
    memset(p, 0, n);
    return p;
}

FILE *xfopen(const char *path, const char *mode, const char *what)
{
    FILE *f = fopen(path, mode);
    if (!f)
        fail_input("cannot open %s '%s': %s", what, path, strerror(errno));
    return f;
}

double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

float rng_normal(uint64_t *state)
{
    /* 1 - u keeps the logarithm's argument in (0, 1]. */
    double u1 = 1.0 - (double)(splitmix64(state) >> 11) * (1.0 / 9007199254740992.0);
    double u2 = (double)(splitmix64(state) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}
