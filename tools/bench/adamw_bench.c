/*
 * adamw_bench — the host AdamW pass (src/core/adamw.c) against this machine's
 * memory bandwidth, measured in the same run, and against PyTorch's
 * torch.optim.AdamW timed just before by adamw_torch.py (adamw.sh passes the
 * times in).
 *
 * Bytes per parameter, counted as DRAM traffic (what has to move):
 *   p, m, v, g read: 16; p, m, v written: 12 (in place: the lines were just
 *   read, so a store's write-allocate hits the cache and adds nothing);
 *   param_out written: 2 (fp16/bf16) or 4 (fp32), plus the same again for the
 *   write-allocate read when the stores are not streaming.
 * The bandwidth probes are STREAM-like kernels over arrays of the same size,
 * same threads: copy and triad with streaming stores (no write-allocate),
 * triad with ordinary stores (write-allocate counted: 16 B/element), an
 * in-place a = a * s + b (12 B), and AdamW's own access pattern without its
 * arithmetic (3 arrays updated in place from a 4th: 28 B), plain and with
 * software prefetch. The best probe's median is "measured bandwidth"; each
 * variant's GB/s is its bytes over its median time, and its % is of that
 * best probe (above 100% means the variant's mix of reads and streamed
 * writes moves more than the best probe's mix).
 *
 * Every variant and probe runs once per round, rounds repeated, medians
 * taken: a noisy shared machine then shifts all of them alike.
 *
 * Build and run: bash tools/bench/adamw.sh (see there for the environment).
 * usage: adamw_bench [--n N] [--rounds R] [--torch-foreach-ms X] [--torch-loop-ms Y]
 */
#include <getopt.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "core/adamw.h"
#include "core/dtype.h"

#define MAX_ROUNDS 64

struct arrays {
    float *p, *m, *v, *g;
    float *out32;    /* fp32 param_out; also the probes' destination */
    uint16_t *out16; /* fp16/bf16 param_out */
    size_t n;
};

static void *alloc_touched(size_t bytes)
{
    void *ptr = NULL;
    if (posix_memalign(&ptr, 4096, bytes) != 0) {
        fprintf(stderr, "adamw_bench: out of memory allocating %zu bytes; try a smaller --n\n", bytes);
        exit(1);
    }
    return ptr;
}

/* First touch in parallel, with the same static schedule as the kernels. */
static void init_arrays(struct arrays *a)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < a->n; i++) {
        uint64_t h = i * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
        const float u = (float)(h >> 40) * (1.0f / 16777216.0f) - 0.5f; /* [-0.5, 0.5) */
        a->p[i] = 0.04f * u;
        a->g[i] = 1e-3f * u;
        a->m[i] = 0.0f;
        a->v[i] = 0.0f;
        a->out32[i] = 0.0f;
        a->out16[i] = 0;
    }
}

/* ---- bandwidth probes -------------------------------------------------- */

/* dst = src, streaming stores: 8 B/element moved. */
static void probe_copy_stream(float *restrict dst, const float *restrict src, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += 16) {
#ifdef __AVX512F__
        if (i + 16 <= n) {
            _mm512_stream_ps(dst + i, _mm512_load_ps(src + i));
            continue;
        }
#endif
        for (size_t j = i; j < i + 16 && j < n; j++)
            dst[j] = src[j];
    }
#ifdef __AVX512F__
    _mm_sfence();
#endif
}

/* dst = a + s b, streaming stores: 12 B/element. */
static void probe_triad_stream(float *restrict dst, const float *restrict a, const float *restrict b, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += 16) {
#ifdef __AVX512F__
        if (i + 16 <= n) {
            const __m512 x = _mm512_fmadd_ps(_mm512_set1_ps(0.5f), _mm512_load_ps(b + i), _mm512_load_ps(a + i));
            _mm512_stream_ps(dst + i, x);
            continue;
        }
#endif
        for (size_t j = i; j < i + 16 && j < n; j++)
            dst[j] = a[j] + 0.5f * b[j];
    }
}

/* dst = a + s b, ordinary stores: 16 B/element with the write-allocate read. */
static void probe_triad_cached(float *restrict dst, const float *restrict a, const float *restrict b, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++)
        dst[i] = a[i] + 0.5f * b[i];
}

/* a = a s + b in place: 12 B/element (two reads, one write, no write-allocate). */
static void probe_inplace(float *restrict a, const float *restrict b, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++)
        a[i] = a[i] * 0.5f + b[i];
}

/* The access pattern of AdamW without its arithmetic: 16 B read, 12 B
 * written in place per element. (Moves p, m, v by tiny amounts.) */
static void probe_adamw_like(float *restrict a, float *restrict b, float *restrict c, const float *restrict d, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        a[i] = a[i] * 0.999f + 1e-3f * d[i];
        b[i] = b[i] * 0.999f + 1e-3f * d[i];
        c[i] = c[i] * 0.999f + 1e-3f * d[i] * d[i];
    }
}

/* The same with software prefetch 1 KiB ahead in each array, as adamw.c
 * does: with it the probe is the best this access pattern gets. */
static void probe_adamw_like_prefetch(float *restrict a, float *restrict b, float *restrict c, const float *restrict d,
                                      size_t n)
{
    const size_t ahead = 256;
#pragma omp parallel for schedule(static)
    for (size_t block = 0; block < n; block += 16) {
        if (block + ahead < n) {
            __builtin_prefetch(a + block + ahead);
            __builtin_prefetch(b + block + ahead);
            __builtin_prefetch(c + block + ahead);
            __builtin_prefetch(d + block + ahead);
        }
        const size_t end = block + 16 < n ? block + 16 : n;
#pragma omp simd
        for (size_t i = block; i < end; i++) {
            a[i] = a[i] * 0.999f + 1e-3f * d[i];
            b[i] = b[i] * 0.999f + 1e-3f * d[i];
            c[i] = c[i] * 0.999f + 1e-3f * d[i] * d[i];
        }
    }
}

/* ---- AdamW variants ---------------------------------------------------- */

/* The previous src/core/adamw.c: one compiler-vectorised OpenMP loop, no param_out. */
static void adamw_previous(float *restrict param, float *restrict m, float *restrict v, const float *restrict grad,
                           size_t n, const struct adamw_hparams *hp)
{
    const float b1 = hp->beta1, b2 = hp->beta2, eps = hp->eps;
    const float step_size = hp->lr / hp->bias_correction1;
    const float inv_sqrt_bc2 = 1.0f / sqrtf(hp->bias_correction2);
    const float scale = hp->grad_scale;
    const float decay = hp->adam_w_mode ? 1.0f - hp->lr * hp->weight_decay : 1.0f;
    const float l2 = hp->adam_w_mode ? 0.0f : hp->weight_decay;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float p = param[i];
        float g = grad[i] * scale + l2 * p;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        p *= decay;
        param[i] = p - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
    }
}

enum variant_kind {
    PROBE_COPY,
    PROBE_TRIAD,
    PROBE_TRIAD_CACHED,
    PROBE_INPLACE,
    PROBE_ADAMW_LIKE,
    PROBE_ADAMW_LIKE_PREFETCH,
    FUSED,
    PREVIOUS,
    PREVIOUS_THEN_CAST,
};
struct variant {
    const char *name;
    enum variant_kind kind;
    int has_out;
    enum dtype out_dtype;
    enum adamw_stores stores;
    double bytes_per_elem;
    double ms[MAX_ROUNDS];
    enum dtype_simd level; /* 0 (scalar) means the best level */
};

static struct adamw_hparams hparams_at(int t)
{
    const float beta1 = 0.9f, beta2 = 0.95f;
    struct adamw_hparams hp = {
        .lr = 1e-3f,
        .beta1 = beta1,
        .beta2 = beta2,
        .eps = 1e-8f,
        .weight_decay = 0.1f,
        .adam_w_mode = true,
        .bias_correction1 = (float)(1.0 - pow(beta1, t)),
        .bias_correction2 = (float)(1.0 - pow(beta2, t)),
        .grad_scale = 1.0f,
    };
    return hp;
}

static void run_variant(const struct variant *var, struct arrays *a, int t)
{
    const struct adamw_hparams hp = hparams_at(t);
    void *out = var->out_dtype == DTYPE_F32 ? (void *)a->out32 : (void *)a->out16;
    switch (var->kind) {
    case PROBE_COPY: probe_copy_stream(a->out32, a->g, a->n); break;
    case PROBE_TRIAD: probe_triad_stream(a->out32, a->p, a->g, a->n); break;
    case PROBE_TRIAD_CACHED: probe_triad_cached(a->out32, a->p, a->g, a->n); break;
    case PROBE_INPLACE: probe_inplace(a->out32, a->g, a->n); break;
    case PROBE_ADAMW_LIKE: probe_adamw_like(a->p, a->m, a->v, a->g, a->n); break;
    case PROBE_ADAMW_LIKE_PREFETCH: probe_adamw_like_prefetch(a->p, a->m, a->v, a->g, a->n); break;
    case FUSED:
        adamw_update_with(a->p, a->m, a->v, a->g, a->n, &hp, var->has_out ? out : NULL, var->out_dtype,
                          var->level ? var->level : dtype_simd_best(), var->stores);
        break;
    case PREVIOUS: adamw_previous(a->p, a->m, a->v, a->g, a->n, &hp); break;
    case PREVIOUS_THEN_CAST:
        adamw_previous(a->p, a->m, a->v, a->g, a->n, &hp);
        dtype_convert(a->out16, var->out_dtype, a->p, DTYPE_F32, a->n);
        break;
    }
}

/* Busy jiffies of the whole machine (user nice system irq softirq steal). */
static double cpu_busy_jiffies(void)
{
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long x[8] = {0};
    if (!f)
        return 0;
    if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &x[0], &x[1], &x[2], &x[3], &x[4], &x[5], &x[6],
               &x[7]) != 8)
        x[0] = x[1] = x[2] = x[5] = x[6] = x[7] = 0;
    fclose(f);
    return (double)(x[0] + x[1] + x[2] + x[5] + x[6] + x[7]);
}

static double own_cpu_seconds(void)
{
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return (double)r.ru_utime.tv_sec + r.ru_utime.tv_usec * 1e-6 + (double)r.ru_stime.tv_sec + r.ru_stime.tv_usec * 1e-6;
}

static int cmp_double(const void *x, const void *y)
{
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double median(const double *x, int n)
{
    double s[MAX_ROUNDS];
    memcpy(s, x, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

static double minimum(const double *x, int n)
{
    double best = x[0];
    for (int i = 1; i < n; i++)
        best = x[i] < best ? x[i] : best;
    return best;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: adamw_bench [--n N] [--rounds R] [--torch-foreach-ms X] [--torch-loop-ms Y]\n"
               "  --n N               parameters (default 100000000)\n"
               "  --rounds R          timed rounds, every variant once per round (default 7, max %d)\n"
               "  --torch-foreach-ms  torch.optim.AdamW(foreach=True) median ms/step, for the ratio column\n"
               "  --torch-loop-ms     torch.optim.AdamW(foreach=False) median ms/step\n",
            MAX_ROUNDS);
}

int main(int argc, char **argv)
{
    size_t n = 100000000;
    int rounds = 7;
    double torch_foreach_ms = 0, torch_loop_ms = 0;
    static const struct option options[] = {
        {"n", required_argument, NULL, 'n'},
        {"rounds", required_argument, NULL, 'r'},
        {"torch-foreach-ms", required_argument, NULL, 'f'},
        {"torch-loop-ms", required_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int opt;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (opt) {
        case 'n': n = strtoull(optarg, NULL, 10); break;
        case 'r': rounds = atoi(optarg); break;
        case 'f': torch_foreach_ms = atof(optarg); break;
        case 'l': torch_loop_ms = atof(optarg); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (n < 16 || rounds < 1 || rounds > MAX_ROUNDS) {
        usage(stderr);
        return 2;
    }

    struct arrays a = {
        alloc_touched(n * 4), alloc_touched(n * 4), alloc_touched(n * 4), alloc_touched(n * 4),
        alloc_touched(n * 4), alloc_touched(n * 2), n,
    };
    init_arrays(&a);

    /* B/elem of a fused variant: 28 + param_out, + its write-allocate unless streamed */
    const int auto_streams_out = n >= ADAMW_STREAM_MIN;
#define PROBE(name_, kind_, bytes_) {.name = name_, .kind = kind_, .bytes_per_elem = bytes_}
#define FUSED_AT(name_, has_out_, dt_, stores_, bytes_, level_)                                                       \
    {.name = name_, .kind = FUSED, .has_out = has_out_, .out_dtype = dt_, .stores = stores_, .bytes_per_elem = bytes_, \
     .level = level_}
    const int out16_bytes = auto_streams_out ? 30 : 32, out32_bytes = auto_streams_out ? 32 : 36;
    struct variant vars[] = {
        PROBE("probe: copy, streaming stores", PROBE_COPY, 8),
        PROBE("probe: triad, streaming stores", PROBE_TRIAD, 12),
        PROBE("probe: triad, cached (+write-allocate)", PROBE_TRIAD_CACHED, 16),
        PROBE("probe: in place a = a*s + b", PROBE_INPLACE, 12),
        PROBE("probe: 3 arrays in place from a 4th", PROBE_ADAMW_LIKE, 28),
        PROBE("probe: same, software prefetch", PROBE_ADAMW_LIKE_PREFETCH, 28),
        FUSED_AT("shardlm fused, no param_out", 0, DTYPE_F32, ADAMW_STORES_AUTO, 28, 0),
        FUSED_AT("shardlm fused, fp32 param_out", 1, DTYPE_F32, ADAMW_STORES_AUTO, out32_bytes, 0),
        FUSED_AT("shardlm fused, bf16 param_out", 1, DTYPE_BF16, ADAMW_STORES_AUTO, out16_bytes, 0),
        FUSED_AT("shardlm fused, fp16 param_out", 1, DTYPE_F16, ADAMW_STORES_AUTO, out16_bytes, 0),
        FUSED_AT("  bf16 out, every store cached", 1, DTYPE_BF16, ADAMW_STORES_CACHED, 32, 0),
        FUSED_AT("  no out, every store streaming", 0, DTYPE_F32, ADAMW_STORES_STREAMING, 28, 0),
        FUSED_AT("  bf16 out, every store streaming", 1, DTYPE_BF16, ADAMW_STORES_STREAMING, 30, 0),
        FUSED_AT("  no out, AVX2 level", 0, DTYPE_F32, ADAMW_STORES_AUTO, 28, DTYPE_SIMD_AVX2),
        FUSED_AT("  bf16 out, AVX2 level", 1, DTYPE_BF16, ADAMW_STORES_AUTO, out16_bytes, DTYPE_SIMD_AVX2),
        PROBE("previous adamw.c loop, no param_out", PREVIOUS, 28),
        {.name = "previous loop + dtype_convert to bf16", .kind = PREVIOUS_THEN_CAST, .has_out = 1,
         .out_dtype = DTYPE_BF16, .bytes_per_elem = 36},
    };
#undef PROBE
#undef FUSED_AT
    const int n_vars = (int)(sizeof vars / sizeof vars[0]);
    const int n_probes = 6;

    /* warm-up: every variant once (page faults, thread pool, frequency) */
    int t = 1;
    for (int k = 0; k < n_vars; k++)
        run_variant(&vars[k], &a, t++);
    const double jiffies0 = cpu_busy_jiffies(), own0 = own_cpu_seconds(), wall0 = omp_get_wtime();
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < n_vars; k++) {
            const double t0 = omp_get_wtime();
            run_variant(&vars[k], &a, t++);
            vars[k].ms[r] = (omp_get_wtime() - t0) * 1e3;
        }
    }
    /* the share of the machine's CPU time other processes took while we timed */
    const double wall = omp_get_wtime() - wall0;
    const double other = ((cpu_busy_jiffies() - jiffies0) / (double)sysconf(_SC_CLK_TCK) - (own_cpu_seconds() - own0)) /
                         (wall * (double)sysconf(_SC_NPROCESSORS_ONLN));

    double bandwidth = 0; /* GB/s, best probe median */
    int best_probe = 0;
    for (int k = 0; k < n_probes; k++) {
        const double gbs = vars[k].bytes_per_elem * (double)n / (median(vars[k].ms, rounds) * 1e-3) / 1e9;
        if (gbs > bandwidth) {
            bandwidth = gbs;
            best_probe = k;
        }
    }

    printf("n = %zu parameters, %d threads, SIMD %s, %d rounds (median; best in brackets)\n", n,
           omp_get_max_threads(), dtype_simd_name(dtype_simd_best()), rounds);
    printf("other processes used %.0f%% of the CPUs while timed\n", 100.0 * (other > 0 ? other : 0));
    printf("measured bandwidth = %.1f GB/s (%s)\n\n", bandwidth, vars[best_probe].name);
    printf("%-40s %18s %6s %7s %7s %9s %9s\n", "variant", "ms/step", "B/elem", "GB/s", "% bw", "x torch", "x torch");
    printf("%-40s %18s %6s %7s %7s %9s %9s\n", "", "", "", "", "", "foreach", "loop");
    for (int k = 0; k < n_vars; k++) {
        const double med = median(vars[k].ms, rounds), best = minimum(vars[k].ms, rounds);
        const double gbs = vars[k].bytes_per_elem * (double)n / (med * 1e-3) / 1e9;
        char ms[32], rf[16] = "", rl[16] = "";
        snprintf(ms, sizeof ms, med < 10 ? "%.3f [%.3f]" : "%.1f [%.1f]", med, best);
        if (k >= n_probes && torch_foreach_ms > 0)
            snprintf(rf, sizeof rf, "%.1fx", torch_foreach_ms / med);
        if (k >= n_probes && torch_loop_ms > 0)
            snprintf(rl, sizeof rl, "%.1fx", torch_loop_ms / med);
        printf("%-40s %18s %6.0f %7.1f %6.0f%% %9s %9s\n", vars[k].name, ms, vars[k].bytes_per_elem, gbs,
               100.0 * gbs / bandwidth, rf, rl);
    }
    /* PyTorch's traffic is several passes; shown at the fused pass's 28 B/param for comparison */
    const double torch_ms[2] = {torch_foreach_ms, torch_loop_ms};
    const char *torch_names[2] = {"torch AdamW foreach=True", "torch AdamW foreach=False"};
    for (int k = 0; k < 2; k++) {
        if (torch_ms[k] <= 0)
            continue;
        const double gbs = 28.0 * (double)n / (torch_ms[k] * 1e-3) / 1e9;
        printf("%-40s %18.1f %6s %7.1f %6.0f%% %9s %9s\n", torch_names[k], torch_ms[k], "(28)", gbs,
               100.0 * gbs / bandwidth, "", "");
    }
    free(a.p);
    free(a.m);
    free(a.v);
    free(a.g);
    free(a.out32);
    free(a.out16);
    return 0;
}
