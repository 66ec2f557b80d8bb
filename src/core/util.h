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

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define SHARDLM_VERSION "0.1.0"

enum {
    EXIT_OK = 0,
    EXIT_INTERNAL = 1,
    EXIT_BAD_INPUT = 2,
    EXIT_PREEMPTED = 3, /* stopped by a signal, all trained work in checkpoint.dir: requeue the job */
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
/* From here on log_info writes to stderr: commands whose stdout is their result (generate, eval). */
void log_info_to_stderr(void);
/* Leaves through the abort hook with the given status (after a message was printed). */
__attribute__((noreturn)) void util_exit(int status);

/* A failure trap: while one is set on a thread, fail_input and fail_internal
 * on that thread record their message and status in it and jump back to
 * FAIL_TRAP instead of printing and leaving. For start-up phases that every
 * rank runs without collectives, so that the ranks can then agree on one
 * report (comm_agree_failure) instead of each printing the same error and
 * aborting the job through MPI:
 *
 *     struct fail_trap trap;
 *     if (FAIL_TRAP(&trap) == 0)
 *         phase();
 *     fail_untrap();
 *     comm_agree_failure(comm, &trap);
 */
struct fail_trap {
    jmp_buf env;
    int status;        /* 0: the phase succeeded */
    const char *kind;  /* "error" or "internal error" */
    char message[2048];
};
struct fail_trap *fail_trap_set(struct fail_trap *t);
#define FAIL_TRAP(t) (setjmp(fail_trap_set(t)->env))
void fail_untrap(void);
/* The trap set on this thread (NULL: none), and putting one back: for a phase
 * inside a trapped one whose failure the ranks must share before going on
 * (zero's nvme file, opened before the collectives of the parameters' init). */
struct fail_trap *fail_trap_current(void);
void fail_trap_restore(struct fail_trap *t);
/* Prints a trapped failure as fail_input/fail_internal would have. */
void fail_report(const struct fail_trap *t);

/* A file being written (a .tmp before its rename): removed if the process
 * leaves through fail_input/fail_internal before util_keep_file(path), so a
 * failed write (a full disk) leaves nothing behind. At most 1024 at a time. */
void util_remove_on_failure(const char *path);
void util_keep_file(const char *path);
/* Removes the files util_remove_on_failure names now: for an exit that agreed a failure across the ranks
 * (comm_agree_failure) rather than leaving through util_exit, on every rank, the failing one or not. */
void util_remove_pending_files(void);

/* 1 when paths a and b name the same existing file (any name or link);
 * b_fd >= 0 stands for b when the file is open (b may then be NULL). */
int util_same_file(const char *a, const char *b, int b_fd);
/* What path is when it is there but not a regular file ("a directory", "a
 * FIFO", ...), which opening to read would misread or wait on for ever;
 * NULL for a regular file or a path stat cannot see (the open then says why). */
const char *util_irregular(const char *path);

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

/* Human-readable bytes ("12.3 MiB", binary units) into buf; returns buf. */
const char *format_bytes(double bytes, char *buf, size_t n);

#endif
