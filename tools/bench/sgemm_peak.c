/*
 * sgemm_peak — the fp32 matmul roofline of this machine, as OpenBLAS sees it.
 *
 * Times cblas_sgemm (row-major, NoTrans x NoTrans, C = A B) on square
 * matrices with the thread count given, and prints the best GFLOP/s over a
 * few repetitions, with the OpenBLAS kernel (core type) that ran. The
 * training benchmark (train_throughput.sh) divides model FLOP rates by this
 * to get MFU, so both sides are measured against the same library, the same
 * OPENBLAS_CORETYPE and the same thread count, in the same run.
 *
 * Build (what train_throughput.sh does):
 *   gcc -O2 -fopenmp tools/bench/sgemm_peak.c -o build/bench/sgemm_peak \
 *       $(pkg-config --cflags --libs openblas) -Wl,-rpath,<openblas libdir>
 *
 * usage: sgemm_peak [--threads N] [--sizes 1024,2048,...] [--reps R] [--min-seconds S]
 * Output: one "size N gflops G" line per size, then
 *   corename <name>
 *   config <openblas_get_config()>
 *   threads <n>
 *   peak_gflops <best over sizes>
 */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Not in every cblas.h; OpenBLAS exports them all. */
extern char *openblas_get_corename(void);
extern char *openblas_get_config(void);
extern void openblas_set_num_threads(int);
extern int openblas_get_num_threads(void);

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    int threads = 0, reps = 5;
    double min_seconds = 0.3;
    char sizes_arg[256] = "1024,2048,3072";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sizes") && i + 1 < argc)
            snprintf(sizes_arg, sizeof sizes_arg, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--min-seconds") && i + 1 < argc)
            min_seconds = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--threads N] [--sizes 1024,2048] [--reps R] [--min-seconds S]\n", argv[0]);
            return 2;
        }
    }
    if (threads > 0) {
        omp_set_num_threads(threads);
        openblas_set_num_threads(threads);
    }

    double peak = 0.0;
    char *save = NULL;
    for (char *tok = strtok_r(sizes_arg, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int n = atoi(tok);
        if (n <= 0)
            continue;
        size_t nn = (size_t)n * n;
        float *a = aligned_alloc(64, nn * sizeof(float));
        float *b = aligned_alloc(64, nn * sizeof(float));
        float *c = aligned_alloc(64, nn * sizeof(float));
        if (!a || !b || !c) {
            fprintf(stderr, "sgemm_peak: out of memory at n=%d\n", n);
            return 1;
        }
        unsigned s = 12345;
        for (size_t i = 0; i < nn; i++) {
            s = s * 1103515245u + 12345u;
            a[i] = (float)((s >> 8) & 0xffff) / 65536.0f - 0.5f;
            s = s * 1103515245u + 12345u;
            b[i] = (float)((s >> 8) & 0xffff) / 65536.0f - 0.5f;
            c[i] = 0.0f;
        }
        /* warm-up: page faults, OpenBLAS buffers, thread pool */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double flops = 2.0 * n * (double)n * n, best = 0.0;
        for (int r = 0; r < reps; r++) {
            /* each repetition runs at least min_seconds so short timings don't dominate */
            int iters = 0;
            double t0 = now(), dt;
            do {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
                iters++;
                dt = now() - t0;
            } while (dt < min_seconds);
            double g = flops * iters / dt / 1e9;
            if (g > best)
                best = g;
        }
        printf("size %d gflops %.1f\n", n, best);
        if (best > peak)
            peak = best;
        free(a);
        free(b);
        free(c);
    }
    printf("corename %s\n", openblas_get_corename());
    printf("config %s\n", openblas_get_config());
    printf("threads %d\n", openblas_get_num_threads());
    printf("peak_gflops %.1f\n", peak);
    return 0;
}
