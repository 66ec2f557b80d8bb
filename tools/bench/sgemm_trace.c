/*
 * sgemm_trace — an LD_PRELOAD shim that times every cblas_sgemm call by shape.
 *
 * perf cannot walk the stack through OpenBLAS (no frame pointers), so it
 * says "77% in sgemm_kernel" but not which matmul. This shim wraps
 * cblas_sgemm, groups calls by (transA, transB, M, N, K, inside an OpenMP
 * parallel region or not), and at exit writes, per group: calls, total
 * seconds, GFLOP/s. Calls made inside a parallel region (shardlm's per-head
 * attention) are timed per thread, so their seconds are thread-seconds.
 *
 * Build and use (train_throughput.sh does not need it; see the report):
 *   gcc -O2 -shared -fPIC -fopenmp tools/bench/sgemm_trace.c -o build/bench/sgemm_trace.so -ldl
 *   SGEMM_TRACE_OUT=build/bench/sgemm_trace.txt SGEMM_TRACE_SKIP_S=10 \
 *     LD_PRELOAD=build/bench/sgemm_trace.so bin/shardlm train ...
 * SGEMM_TRACE_SKIP_S: ignore calls in the first S seconds (start-up, warm-up).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112, CblasConjTrans = 113 };
typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                         float *, int);

#define MAX_KEYS 512
struct entry {
    int order, ta, tb, m, n, k, par;
    long calls;
    double seconds;
};
static struct entry table[MAX_KEYS];
static int n_keys;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static sgemm_fn real_sgemm;
static double t_start, skip_s;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* RTLD_NEXT finds libraries linked at start (shardlm); a library dlopen'ed
 * locally later (PyTorch's libblas.so.3 -> OpenBLAS) is looked up by name. */
static void *resolve(const char *sym)
{
    void *f = dlsym(RTLD_NEXT, sym);
    static const char *libs[] = {"libopenblas.so.0", "libblas.so.3", "libcblas.so.3"};
    for (size_t i = 0; !f && i < sizeof libs / sizeof *libs; i++) {
        void *h = dlopen(libs[i], RTLD_LAZY | RTLD_NOLOAD);
        if (!h)
            h = dlopen(libs[i], RTLD_LAZY);
        if (h)
            f = dlsym(h, sym);
    }
    if (!f) {
        fprintf(stderr, "sgemm_trace: cannot find %s\n", sym);
        abort();
    }
    return f;
}

__attribute__((constructor)) static void init(void)
{
    t_start = now();
    const char *s = getenv("SGEMM_TRACE_SKIP_S");
    skip_s = s ? atof(s) : 0.0;
}

static int cmp(const void *a, const void *b)
{
    double x = ((const struct entry *)a)->seconds, y = ((const struct entry *)b)->seconds;
    return x < y ? 1 : x > y ? -1 : 0;
}

__attribute__((destructor)) static void report(void)
{
    /* Processes that made no calls (helpers the traced program forks or
     * spawns, e.g. Open MPI's singleton daemon) write nothing, so they
     * cannot overwrite the real report. */
    if (n_keys == 0)
        return;
    const char *path = getenv("SGEMM_TRACE_OUT");
    FILE *f = path ? fopen(path, "w") : stderr;
    if (!f)
        f = stderr;
    qsort(table, (size_t)n_keys, sizeof *table, cmp);
    double total = 0.0, flops = 0.0;
    for (int i = 0; i < n_keys; i++) {
        total += table[i].seconds;
        flops += 2.0 * table[i].m * table[i].n * (double)table[i].k * table[i].calls;
    }
    fprintf(f, "sgemm_trace: %d shapes, %.3f s in cblas_sgemm (thread-seconds for 'par' rows), %.1f GFLOP/s overall\n",
            n_keys, total, total > 0 ? flops / total / 1e9 : 0.0);
    fprintf(f, "%-5s %-2s %-2s %7s %7s %7s %4s %8s %10s %6s %9s\n", "order", "tA", "tB", "M", "N", "K", "par",
            "calls", "seconds", "share", "GFLOP/s");
    for (int i = 0; i < n_keys; i++) {
        struct entry *e = &table[i];
        double g = 2.0 * e->m * e->n * (double)e->k * e->calls / (e->seconds > 0 ? e->seconds : 1e-30) / 1e9;
        fprintf(f, "%-5s %-2s %-2s %7d %7d %7d %4s %8ld %10.4f %5.1f%% %9.1f\n",
                e->order == CblasRowMajor ? "row" : "col", e->ta == CblasNoTrans ? "N" : "T",
                e->tb == CblasNoTrans ? "N" : "T", e->m, e->n, e->k, e->par ? "yes" : "no", e->calls, e->seconds,
                total > 0 ? 100.0 * e->seconds / total : 0.0, g);
    }
    if (f != stderr)
        fclose(f);
}

static void record(int order, int ta, int tb, int m, int n, int k, double t0, double dt);

void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc)
{
    if (!real_sgemm)
        real_sgemm = (sgemm_fn)resolve("cblas_sgemm");
    double t0 = now();
    real_sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    record(order, ta, tb, m, n, k, t0, now() - t0);
}

/* The Fortran entry point, which PyTorch (and numpy) call. Column-major. */
typedef void (*fsgemm_fn)(const char *, const char *, const int *, const int *, const int *, const float *,
                          const float *, const int *, const float *, const int *, const float *, float *,
                          const int *);
static fsgemm_fn real_fsgemm;

void sgemm_(const char *ta, const char *tb, const int *m, const int *n, const int *k, const float *alpha,
            const float *a, const int *lda, const float *b, const int *ldb, const float *beta, float *c,
            const int *ldc)
{
    if (!real_fsgemm)
        real_fsgemm = (fsgemm_fn)resolve("sgemm_");
    double t0 = now();
    real_fsgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    record(CblasColMajor, (*ta == 'N' || *ta == 'n') ? CblasNoTrans : CblasTrans,
           (*tb == 'N' || *tb == 'n') ? CblasNoTrans : CblasTrans, *m, *n, *k, t0, now() - t0);
}

static void record(int order, int ta, int tb, int m, int n, int k, double t0, double dt)
{
    if (t0 - t_start < skip_s)
        return;
    int par = omp_in_parallel();
    pthread_mutex_lock(&lock);
    int i;
    for (i = 0; i < n_keys; i++) {
        struct entry *e = &table[i];
        if (e->order == order && e->ta == ta && e->tb == tb && e->m == m && e->n == n && e->k == k && e->par == par)
            break;
    }
    if (i == n_keys && n_keys < MAX_KEYS)
        table[n_keys++] = (struct entry){order, ta, tb, m, n, k, par, 0, 0.0};
    if (i < n_keys) {
        table[i].calls++;
        table[i].seconds += dt;
    }
    pthread_mutex_unlock(&lock);
}
