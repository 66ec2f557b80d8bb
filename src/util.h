/*
 * util — error reporting, checked libc wrappers, small helpers shared by all
 * modules.
 *
 * Two kinds of failure, two exit statuses:
 *   fail_input()  bad input from the user (config, data, checkpoint, flags):
 *                 one line "shardlm: error: ...", exit status 2 (EXIT_BAD_INPUT).
 *   fail_internal() a broken invariant or a failed system call: exit status 1.
 * With more than one rank, both go through the abort hook that comm installs,
 * so one rank's failure ends every rank (DESIGN §9) instead of leaving the
 * others blocked in a collective.
 *
 * This module owns no global state other than the abort hook and the rank
 * prefix used in messages.
 */
#ifndef SHARDLM_UTIL_H
#define SHARDLM_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define SHARDLM_VERSION "0.1.0"

enum {
    EXIT_OK = 0,
    EXIT_INTERNAL = 1,
    EXIT_BAD_INPUT = 2,
    EXIT_PREEMPTED = 3, /* SIGUSR1/SIGTERM: checkpoint saved, requeue the job */
};

/* Called instead of exit() when set: comm sets it to MPI_Abort with the code. */
typedef void (*abort_hook_fn)(int status);
void util_set_abort_hook(abort_hook_fn hook);
abort_hook_fn util_get_abort_hook(void);
/* Rank shown in messages when the world has more than one rank (-1: none). */
void util_set_rank(int rank, int world);

__attribute__((format(printf, 1, 2), noreturn)) void fail_input(const char *fmt, ...);
__attribute__((format(printf, 1, 2), noreturn)) void fail_internal(const char *fmt, ...);
__attribute__((format(printf, 1, 2))) void log_warn(const char *fmt, ...);
/* Rank-0-only informational line on stdout (every rank when rank not set). */
__attribute__((format(printf, 1, 2))) void log_info(const char *fmt, ...);
/* Leaves through the abort hook with the given status (after a message was printed). */
__attribute__((noreturn)) void util_exit(int status);

/* Checked allocation for small, start-up-time structures (never in the step loop). */
void *xcalloc(size_t n, size_t size);
void *xmalloc(size_t size);
void *xrealloc(void *p, size_t size);
char *xstrdup(const char *s);
/* Page-aligned, zeroed allocation for large buffers (arenas). */
void *xalloc_aligned(size_t bytes);

FILE *xfopen(const char *path, const char *mode, const char *what);

double now_seconds(void);

/* Rounds n up to a multiple of m (m > 0). */
static inline size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

/* splitmix64: the one random generator of the project (init, data order, sampling). */
static inline uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* Uniform float in [0, 1) from 24 random bits. */
static inline float rng_uniform(uint64_t *state) { return (float)(splitmix64(state) >> 40) * (1.0f / 16777216.0f); }
/* Standard normal (Box–Muller; the second value is discarded for simplicity). */
float rng_normal(uint64_t *state);

#endif
