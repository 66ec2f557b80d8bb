/*
 * check — the assertions of the C unit tests.
 *
 * Each check prints "ok NAME" or "FAIL NAME: why" on its own line; tests/run.sh
 * counts those lines. A test program returns check_status(): non-zero when any
 * check failed, so a crash or an early exit is also counted as a failure.
 */
#ifndef SHARDLM_CHECK_H
#define SHARDLM_CHECK_H

#include <math.h>
#include <stdio.h>

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

static inline int check_status(void) { return check_failures ? 1 : 0; }

#endif
