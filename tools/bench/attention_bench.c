/*
 * attention_bench — the CPU backend's two attention kernels
 * (src/backend/cpu/backend_cpu_attention.h: tiled and materialized) timed in one run:
 * forward + backward of grouped-query attention at several sequence lengths,
 * and what each keeps and needs as scratch.
 *
 * Each round runs every kernel once per length, alternating which goes first,
 * after one untimed warm-up call; the table gives the best and the worst
 * round (a shared machine slows some rounds; the best is the kernel's speed,
 * and the speed-up is the ratio of the bests).
 * The inputs are the same random tensors for both kernels, and the two
 * results are compared (max relative difference of out and dqkv).
 *
 * Build and run: bash tools/bench/attention.sh (see there).
 * usage: attention_bench [--B B] [--NH NH] [--NKV NKV] [--hs HS] [--rounds R] [T ...]
 */
#include <getopt.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cpu/backend_cpu_attention.h"
#include "core/util.h"

#define MAX_LENGTHS 32

struct shape {
    int B, NH, NKV, hs, T;
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The buffers of one kernel at one shape. */
struct run {
    float *out, *att, *dqkv, *scratch;
    size_t saved_bytes, scratch_bytes;
};

static struct run run_alloc(enum cpu_attention kernel, const struct shape *s)
{
    backend_cpu_attention_use(kernel);
    struct run r;
    const size_t BT = (size_t)s->B * s->T;
    r.saved_bytes = backend_attention_saved(s->B, s->T, s->NH);
    r.scratch_bytes = backend_attention_scratch(s->T, s->NH) * sizeof(float);
    r.out = xcalloc(BT * s->NH * s->hs, sizeof(float));
    r.dqkv = xcalloc(BT * (s->NH + 2 * s->NKV) * s->hs, sizeof(float));
    r.att = xcalloc(r.saved_bytes / sizeof(float) + 1, sizeof(float));
    r.scratch = xcalloc(r.scratch_bytes / sizeof(float) + 1, sizeof(float));
    return r;
}

static void run_free(struct run *r) { free(r->out), free(r->att), free(r->dqkv), free(r->scratch); }

/* Seconds of one forward + backward. */
static double run_once(enum cpu_attention kernel, struct run *r, const float *qkv, const float *dout,
                       const struct shape *s)
{
    backend_cpu_attention_use(kernel);
    const double t0 = now();
    backend_attention_gqa_forward(r->out, r->att, qkv, r->scratch, NULL, s->B, s->T, s->NH, s->NKV, s->hs, NULL);
    backend_attention_gqa_backward(r->dqkv, dout, qkv, r->att, r->out, r->scratch, NULL, s->B, s->T, s->NH, s->NKV,
                                   s->hs, NULL);
    return now() - t0;
}

static double max_rel_diff(const float *a, const float *b, size_t n)
{
    double diff = 0.0, scale = 0.0;
    for (size_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    return diff / (scale > 0 ? scale : 1.0);
}

static void bench_length(const struct shape *s, int rounds, uint64_t *rng)
{
    const size_t n_qkv = (size_t)s->B * s->T * (s->NH + 2 * s->NKV) * s->hs;
    const size_t n_out = (size_t)s->B * s->T * s->NH * s->hs;
    float *qkv = xmalloc(n_qkv * sizeof *qkv), *dout = xmalloc(n_out * sizeof *dout);
    for (size_t i = 0; i < n_qkv + n_out; i++) /* uniform in [-1, 1) */
        *(i < n_qkv ? &qkv[i] : &dout[i - n_qkv]) = 2.0f * rng_uniform(rng) - 1.0f;
    const enum cpu_attention kernels[2] = {CPU_ATTENTION_MATERIALIZED, CPU_ATTENTION_TILED};
    struct run r[2] = {run_alloc(kernels[0], s), run_alloc(kernels[1], s)};
    double best[2] = {INFINITY, INFINITY}, worst[2] = {0.0, 0.0};
    for (int k = 0; k < 2; k++)
        run_once(kernels[k], &r[k], qkv, dout, s); /* warm-up: pages touched, OpenBLAS buffers */
    for (int i = 0; i < rounds; i++)
        for (int j = 0; j < 2; j++) {
            const int k = (i + j) % 2;
            const double t = run_once(kernels[k], &r[k], qkv, dout, s);
            best[k] = fmin(best[k], t);
            worst[k] = fmax(worst[k], t);
        }
    const double d_out = max_rel_diff(r[1].out, r[0].out, n_out), d_dqkv = max_rel_diff(r[1].dqkv, r[0].dqkv, n_qkv);
    printf("%6d | %10.2f %10.2f | %10.2f %10.2f | %8.2fx | %10.1f %10.3f | %9.2f %9.3f | %.1e %.1e\n", s->T,
           1e3 * best[0], 1e3 * worst[0], 1e3 * best[1], 1e3 * worst[1], best[0] / best[1],
           (double)r[0].saved_bytes / (1 << 20), (double)r[1].saved_bytes / (1 << 20),
           (double)r[0].scratch_bytes / (1 << 20), (double)r[1].scratch_bytes / (1 << 20), d_out, d_dqkv);
    fflush(stdout);
    run_free(&r[0]), run_free(&r[1]);
    free(qkv), free(dout);
}

int main(int argc, char **argv)
{
    struct shape s = {1, 12, 4, 64, 0};
    int rounds = 5, lengths[MAX_LENGTHS], n_lengths = 0;
    static const struct option options[] = {{"B", required_argument, NULL, 'b'},
                                            {"NH", required_argument, NULL, 'n'},
                                            {"NKV", required_argument, NULL, 'k'},
                                            {"hs", required_argument, NULL, 'h'},
                                            {"rounds", required_argument, NULL, 'r'},
                                            {NULL, 0, NULL, 0}};
    for (int c; (c = getopt_long(argc, argv, "", options, NULL)) != -1;) {
        switch (c) {
        case 'b': s.B = atoi(optarg); break;
        case 'n': s.NH = atoi(optarg); break;
        case 'k': s.NKV = atoi(optarg); break;
        case 'h': s.hs = atoi(optarg); break;
        case 'r': rounds = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: attention_bench [--B B] [--NH NH] [--NKV NKV] [--hs HS] [--rounds R] [T ...]\n");
            return 2;
        }
    }
    for (int i = optind; i < argc && n_lengths < MAX_LENGTHS; i++)
        lengths[n_lengths++] = atoi(argv[i]);
    if (!n_lengths) {
        const int defaults[] = {256, 512, 1024, 2048, 4096};
        for (; n_lengths < 5; n_lengths++)
            lengths[n_lengths] = defaults[n_lengths];
    }
    if (s.B < 1 || s.NH < 1 || s.NKV < 1 || s.NH % s.NKV || s.hs < 1 || rounds < 1) {
        fprintf(stderr, "attention_bench: B, NH, NKV, hs and rounds >= 1, NKV dividing NH\n");
        return 2;
    }
    printf("attention fwd+bwd, B=%d NH=%d NKV=%d hs=%d, %d threads, %d rounds (ms: best, worst)\n", s.B, s.NH, s.NKV,
           s.hs, omp_get_max_threads(), rounds);
    printf("%6s | %21s | %21s | %9s | %21s | %19s | %s\n", "T", "materialized ms", "tiled ms", "speed-up",
           "saved MiB (mat, tiled)", "scratch MiB", "tiled vs mat: out, dqkv");
    uint64_t rng = 0x5eedA77e0000001ull;
    for (int i = 0; i < n_lengths; i++) {
        s.T = lengths[i];
        bench_length(&s, rounds, &rng);
    }
    return 0;
}
