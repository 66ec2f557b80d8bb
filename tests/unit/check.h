/*
 * check — the assertions of the C unit tests.
 *
 * Each check prints "ok NAME" or "FAIL NAME: why" on its own line; tests/run.sh
 * counts those lines. A test program returns check_status(): non-zero when any
 * check failed, so a crash or an early exit is also counted as a failure.
 */
#ifndef SHARDLM_CHECK_H
#define SHARDLM_CHECK_H

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/util.h"

static int check_failures;

#define CHECK(name, cond, ...)                                          \
    do {                                                                \
        if (cond) {                                                     \
            printf("ok %s\n", name);                                    \
        } else {                                                        \
            printf("FAIL %s: ", name);                                  \
            printf(__VA_ARGS__);                                        \
            printf(" (%s:%d)\n", __FILE__, __LINE__);                   \
            check_failures++;                                           \
        }                                                               \
        fflush(stdout);                                                 \
    } while (0)

/* |a - b| <= tol * max(|b|, floor) */
#define CHECK_CLOSE(name, a, b, tol, floor)                              \
    do {                                                                \
        double _a = (a), _b = (b);                                      \
        double _den = fabs(_b) > (floor) ? fabs(_b) : (floor);          \
        CHECK(name, fabs(_a - _b) <= (tol) * _den,                      \
              "got %.9g, want %.9g (tol %g)", _a, _b, (double)(tol));   \
    } while (0)

/* Runs fn(arg) in a forked child with its stderr into a pipe, for the tests
 * of a fail_input path: returns the child's exit status (0 when fn returned,
 * -1 when it did not exit normally) and what it printed on stderr in msg. */
static inline int check_run_child(void (*fn)(const void *), const void *arg, char *msg, size_t cap)
{
    int fds[2];
    msg[0] = 0;
    if (pipe(fds) != 0)
        return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        close(fds[1]);
        fn(arg);
        _exit(0); /* returned: the input was accepted */
    }
    close(fds[1]);
    size_t len = 0;
    for (;;) {
        ssize_t r = read(fds[0], msg + len, cap - 1 - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        len += (size_t)r;
        if (len == cap - 1) { /* drain the rest so the child never blocks */
            char sink[256];
            while (read(fds[0], sink, sizeof sink) > 0) {}
            break;
        }
    }
    msg[len] = 0;
    close(fds[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static inline int check_status(void) { return check_failures ? 1 : 0; }

/* A kernel test's input: n floats uniform in [-scale, scale) from rng (util.h's generator), malloc'ed. */
static inline float *check_random_floats(size_t n, float scale, uint64_t *rng)
{
    float *x = xmalloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = (2.0f * rng_uniform(rng) - 1.0f) * scale;
    return x;
}

#endif
