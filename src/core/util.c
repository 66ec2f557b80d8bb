#include "util.h"

#include <errno.h>
#include <stdbool.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <time.h>

static abort_hook_fn g_abort_hook;
static int g_rank = -1, g_world = 1;

void util_set_abort_hook(abort_hook_fn hook) { g_abort_hook = hook; }
abort_hook_fn util_get_abort_hook(void) { return g_abort_hook; }
void util_set_rank(int rank, int world) { g_rank = rank; g_world = world; }

#define MAX_PENDING_FILES 1024 /* a directory export's weight files, and a few more */
static char *g_pending[MAX_PENDING_FILES];

void util_remove_on_failure(const char *path)
{
    for (int i = 0; i < MAX_PENDING_FILES; i++)
        if (!g_pending[i]) {
            g_pending[i] = xstrdup(path);
            return;
        }
    fail_internal("util_remove_on_failure: more than %d files pending", MAX_PENDING_FILES);
}

void util_keep_file(const char *path)
{
    for (int i = 0; i < MAX_PENDING_FILES; i++)
        if (g_pending[i] && strcmp(g_pending[i], path) == 0) {
            free(g_pending[i]);
            g_pending[i] = NULL;
        }
}

void util_remove_pending_files(void)
{
    for (int i = 0; i < MAX_PENDING_FILES; i++)
        if (g_pending[i]) {
            unlink(g_pending[i]);
            free(g_pending[i]);
            g_pending[i] = NULL;
        }
}

void util_exit(int status)
{
    util_remove_pending_files();
    fflush(stdout);
    fflush(stderr);
    if (g_abort_hook)
        g_abort_hook(status);
    exit(status);
}

static _Thread_local struct fail_trap *g_trap;

struct fail_trap *fail_trap_set(struct fail_trap *t)
{
    t->status = 0;
    t->kind = "";
    t->message[0] = '\0';
    g_trap = t;
    return t;
}

void fail_untrap(void) { g_trap = NULL; }

struct fail_trap *fail_trap_current(void) { return g_trap; }

void fail_trap_restore(struct fail_trap *t) { g_trap = t; }

static void print_message(const char *kind, const char *line)
{
    if (g_world > 1)
        fprintf(stderr, "shardlm: rank %d: %s: %s\n", g_rank, kind, line);
    else
        fprintf(stderr, "shardlm: %s: %s\n", kind, line);
    fflush(stderr);
}

void fail_report(const struct fail_trap *t) { print_message(t->kind, t->message); }

__attribute__((noreturn)) static void vfail(const char *kind, int status, const char *fmt, va_list ap)
{
    struct fail_trap *t = g_trap;
    if (t) {
        g_trap = NULL; /* a failure while unwinding is not trapped twice */
        vsnprintf(t->message, sizeof t->message, fmt, ap);
        t->kind = kind;
        t->status = status;
        longjmp(t->env, 1);
    }
    char line[2048];
    vsnprintf(line, sizeof line, fmt, ap);
    print_message(kind, line);
    util_exit(status);
}

void fail_input(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail("error", EXIT_BAD_INPUT, fmt, ap);
}

void fail_internal(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail("internal error", EXIT_INTERNAL, fmt, ap);
}

void log_warn(const char *fmt, ...)
{
    if (g_rank > 0)
        return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    print_message("warning", line);
}

static bool g_info_stderr;

void log_info_to_stderr(void) { g_info_stderr = true; }

void log_info(const char *fmt, ...)
{
    if (g_rank > 0)
        return;
    FILE *out = g_info_stderr ? stderr : stdout;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(out, fmt, ap);
    va_end(ap);
    fputc('\n', out);
    fflush(out);
}

const char *util_irregular(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0 || S_ISREG(st.st_mode))
        return NULL;
    return S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISSOCK(st.st_mode) ? "a socket"
           : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "not a regular file";
}

int util_same_file(const char *a, const char *b, int b_fd)
{
    struct stat sa, sb;
    if (stat(a, &sa) != 0 || (b_fd >= 0 ? fstat(b_fd, &sb) : stat(b, &sb)) != 0)
        return 0;
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
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

const char *format_bytes(double bytes, char *buf, size_t n)
{
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (bytes >= 1024.0 && i < 4) {
        bytes /= 1024.0;
        i++;
    }
    snprintf(buf, n, i == 0 ? "%.0f %s" : "%.2f %s", bytes, units[i]);
    return buf;
}
