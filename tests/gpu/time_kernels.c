/*
 * time_kernels — how fast each backend operation runs at one model's shapes
 * (tests/gpu/session.sh stage 5; default: GPT-2 350M, B=8, T=1024, bf16), and
 * the Llama kernels (grouped-query attention, RMSNorm, rotary, SwiGLU) at the
 * same B, T, C and NH with --kv-heads key/value heads and an MLP of --ffn.
 *
 * Uses only src/backend.h, so it links against any backend: the CUDA one
 * (the objects of build/cuda/, as check_kernels does), the CUDA sources under the CPU
 * emulation (build/cudaemu/time_kernels: numbers meaningless there) or the
 * CPU one. Each operation runs once to warm up, then --reps times between
 * two backend_synchronize calls, timed with clock_gettime(CLOCK_MONOTONIC):
 * the mean includes the launch overhead, as training pays it. The attention
 * lines instead time each call on its own and report the median (and min,
 * max), their qkv input rotated through copies that together exceed the
 * H200's 60 MB L2, with model FLOPs (the full square, "tflops") and executed
 * FLOPs (the causal lower triangle, "executed_tflops") apart (issue 35).
 *
 * Work per call: matmuls and attention in FLOPs (attention's GEMMs compute
 * the full T x T square, so that is what is counted; over packed rows, the
 * squares of the samples: the _packed lines show what a row of
 * PACKED_SAMPLES samples costs against one sample of T), the memory-bound
 * operations in bytes read + written once (their minimum traffic). Inputs are
 * random (scale 1; logits 4), targets below V.
 *
 * Prints one line per operation
 *     op NAME ms MEAN tflops X      (or gbps X)
 * and last one machine-readable line
 *     @figure {"kernels": {"NAME": {"ms": .., "tflops"|"gbps": ..}, ..}, "shape": {..}}
 * Exit status 0, or 2 on a bad option.
 */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "core/options.h"
#include "core/dtype.h"

struct shape {
    int B, T, C, NH, V, Vp; /* batch, sequence, channels, heads, vocabulary, padded vocabulary */
    int NKV, F;             /* Llama: key/value heads, the MLP's hidden width */
    enum dtype act;          /* activation storage dtype */
    int reps;
};

/* The padding shardlm applies to the vocabulary (MODEL_VOCAB_ALIGN, src/core/options.h). */
#define VOCAB_ALIGN 128
/* Llama's defaults for the other kernels: NH / LLAMA_GQA_RATIO key/value heads (Llama 3 8B: 32 / 8), and the MLP
 * width of Meta's reference code: 2/3 of 4C rounded up to a multiple of LLAMA_FFN_MULTIPLE (multiple_of). */
#define LLAMA_GQA_RATIO 4
#define LLAMA_FFN_MULTIPLE 256
#define RMSNORM_EPS 1e-5f /* Llama 2's rms_norm_eps */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;

static float uniform(void)
{
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
}

/* Device memory for n elements of up to 4 bytes, holding random values of
 * dtype dt (scale s), written through a host buffer and a device cast. */
static float *device_random(size_t n, enum dtype dt, float s)
{
    float *host = malloc(n * sizeof *host);
    if (!host) {
        fprintf(stderr, "time_kernels: out of host memory for %zu floats\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        host[i] = uniform() * s;
    float *staging = backend_mem_alloc(SPACE_DEVICE, n * 4, "time_kernels staging");
    float *dst = backend_mem_alloc(SPACE_DEVICE, n * 4, "time_kernels input");
    backend_copy(staging, host, n * 4);
    if (dt == DTYPE_F32)
        backend_copy(dst, staging, n * 4);
    else
        backend_convert(dst, dt, staging, DTYPE_F32, n);
    backend_synchronize();
    backend_mem_free(SPACE_DEVICE, staging, n * 4);
    free(host);
    return dst;
}

static float *device_zeros(size_t n)
{
    return backend_mem_alloc(SPACE_DEVICE, n * 4, "time_kernels output"); /* zeroed */
}

/* The machine-readable summary, built as the operations run. */
static char g_json[8192];
static size_t g_json_len;

/* Prints one operation's line; work is FLOPs (is_flops) or bytes. */
static void report(const char *name, double seconds, int reps, double work, int is_flops)
{
    double ms = 1e3 * seconds / reps, rate = work / (seconds / reps);
    printf("op %-26s ms %9.4g %s %9.4g\n", name, ms, is_flops ? "tflops" : "gbps  ", rate / (is_flops ? 1e12 : 1e9));
    g_json_len += (size_t)snprintf(g_json + g_json_len, sizeof g_json - g_json_len,
                                   "%s\"%s\": {\"ms\": %.5g, \"%s\": %.5g}", g_json_len ? ", " : "", name, ms,
                                   is_flops ? "tflops" : "gbps", rate / (is_flops ? 1e12 : 1e9));
    fflush(stdout);
}

/* Times `call` (a statement using the variables in scope): one warm-up, then reps. */
#define TIME_OP(name, work, is_flops, call)                      \
    do {                                                         \
        call;                                                    \
        backend_synchronize();                                   \
        double t0_ = now_s();                                    \
        for (int r_ = 0; r_ < sh->reps; r_++)                    \
            call;                                                \
        backend_synchronize();                                   \
        report(name, now_s() - t0_, sh->reps, work, is_flops);   \
    } while (0)

/* Rotated inputs for the attention lines (issue 35): enough copies of qkv
 * that one pass over them exceeds the H200's 60 MB L2 (at least 2), so a
 * call never finds its inputs in the cache the previous call left. */
#define L2_BYTES (60.0 * 1048576.0)
#define MAX_COPIES 8

static int compare_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Prints an attention line from per-call times (the median, not the mean):
 * model FLOPs (the full T x T square, as MFU counts them) and executed FLOPs
 * (the causal lower triangle the kernels compute) apart. */
static void report_median(const char *name, double *secs, int n, double model_flops, double executed_flops)
{
    qsort(secs, (size_t)n, sizeof *secs, compare_double);
    double med = n % 2 ? secs[n / 2] : 0.5 * (secs[n / 2 - 1] + secs[n / 2]);
    printf("op %-26s ms %9.4g tflops %9.4g executed_tflops %9.4g (median of %d, min %.4g ms, max %.4g ms)\n", name,
           1e3 * med, model_flops / med / 1e12, executed_flops / med / 1e12, n, 1e3 * secs[0], 1e3 * secs[n - 1]);
    g_json_len += (size_t)snprintf(g_json + g_json_len, sizeof g_json - g_json_len,
                                   "%s\"%s\": {\"ms\": %.5g, \"tflops\": %.5g, \"executed_tflops\": %.5g, "
                                   "\"ms_min\": %.5g, \"ms_max\": %.5g, \"calls\": %d, \"stat\": \"median\"}",
                                   g_json_len ? ", " : "", name, 1e3 * med, model_flops / med / 1e12,
                                   executed_flops / med / 1e12, 1e3 * secs[0], 1e3 * secs[n - 1], n);
    fflush(stdout);
}

/* Times `call` per call (synchronized each time) with q_ the rotated input
 * qkvs[r_ % copies]: one warm-up, then reps calls, the median reported. */
#define TIME_ROTATED(name, model_flops, executed_flops, call)                  \
    do {                                                                       \
        const float *q_ = qkvs[0];                                             \
        call;                                                                  \
        backend_synchronize();                                                 \
        double *secs_ = malloc((size_t)sh->reps * sizeof *secs_);              \
        if (!secs_)                                                            \
            exit(1);                                                           \
        for (int r_ = 0; r_ < sh->reps; r_++) {                                \
            q_ = qkvs[r_ % copies];                                            \
            double t0_ = now_s();                                              \
            call;                                                              \
            backend_synchronize();                                             \
            secs_[r_] = now_s() - t0_;                                         \
        }                                                                      \
        report_median(name, secs_, sh->reps, model_flops, executed_flops);     \
        free(secs_);                                                           \
    } while (0)

static void time_matmul(const struct shape *sh, const char *tag, int C, int OC)
{
    const size_t N = (size_t)sh->B * sh->T;
    float *inp = device_random(N * C, sh->act, 1.0f), *w = device_random((size_t)C * OC, sh->act, 0.02f);
    float *bias = device_random(OC, sh->act, 0.02f), *out = device_zeros(N * OC);
    float *dinp = device_zeros(N * C), *dw = device_zeros((size_t)C * OC), *db = device_zeros(OC);
    char name[64];
    double flops = 2.0 * (double)N * C * OC;
    snprintf(name, sizeof name, "matmul_fwd_%s", tag);
    TIME_OP(name, flops, 1, backend_matmul_forward(out, inp, w, bias, (int)N, C, OC));
    snprintf(name, sizeof name, "matmul_bwd_%s", tag);
    TIME_OP(name, 2 * flops, 1, backend_matmul_backward(dinp, dw, db, out, inp, w, (int)N, C, OC));
    float *bufs[] = {inp, w, bias, out, dinp, dw, db};
    size_t sizes[] = {N * C, (size_t)C * OC, OC, N * OC, N * C, (size_t)C * OC, OC};
    for (int i = 0; i < 7; i++)
        backend_mem_free(SPACE_DEVICE, bufs[i], sizes[i] * 4);
}

/* Packed rows (backend.h): each row PACKED_SAMPLES samples of T / PACKED_SAMPLES tokens (the last one takes the
 * remainder), as instruction fine-tuning packs short samples. */
#define PACKED_SAMPLES 4

static int packed_length(int T, int k)
{
    return k < PACKED_SAMPLES - 1 ? T / PACKED_SAMPLES : T - (PACKED_SAMPLES - 1) * (T / PACKED_SAMPLES);
}

/* The positions (B, T) of those rows, in device memory (free: B T 4 bytes). */
static int32_t *packed_positions(int B, int T)
{
    int32_t *host = malloc((size_t)B * T * sizeof *host);
    for (int b = 0; b < B; b++)
        for (int k = 0, t = 0; k < PACKED_SAMPLES; k++)
            for (int i = 0; i < packed_length(T, k); i++)
                host[(size_t)b * T + t++] = i;
    int32_t *pos = backend_mem_alloc(SPACE_DEVICE, (size_t)B * T * 4, "time_kernels positions");
    backend_copy(pos, host, (size_t)B * T * 4);
    free(host);
    return pos;
}

/* The share of the full T x T square (the unpacked work) that those samples' squares are. */
static double packed_fraction(int T)
{
    double squares = 0.0;
    for (int k = 0; k < PACKED_SAMPLES; k++)
        squares += (double)packed_length(T, k) * packed_length(T, k);
    return squares / ((double)T * T);
}

/* The Llama block's own kernels: RMSNorm, rotary, grouped-query attention, SwiGLU. */
static void time_llama(const struct shape *sh)
{
    const int B = sh->B, T = sh->T, C = sh->C, NH = sh->NH, NKV = sh->NKV, F = sh->F, hs = C / NH;
    const size_t N = (size_t)B * T, nqkv = N * (size_t)(NH + 2 * NKV) * hs;
    const double a = (double)dtype_size(sh->act);

    float *x = device_random(N * C, sh->act, 1.0f), *w = device_random(C, sh->act, 1.0f), *y = device_zeros(N * C);
    float *rstd = device_zeros(N), *dx = device_zeros(N * C), *dw = device_zeros(C);
    float *scratch = device_zeros(backend_layernorm_scratch(C) + 1);
    TIME_OP("rmsnorm_fwd", 2.0 * a * (double)N * C, 0, backend_rmsnorm_forward(y, rstd, x, w, RMSNORM_EPS, (int)N, C));
    /* reads dout and inp, reads and writes dinp [A] */
    TIME_OP("rmsnorm_bwd", 4.0 * a * (double)N * C, 0,
            backend_rmsnorm_backward(dx, dw, y, x, w, rstd, scratch, (int)N, C));
    /* the two-kernel backward the fused pass replaced (cuda_norm.cu), beside it */
    setenv("SHARDLM_NORM_UNFUSED", "1", 1);
    TIME_OP("rmsnorm_bwd_unfused", 4.0 * a * (double)N * C, 0,
            backend_rmsnorm_backward(dx, dw, y, x, w, rstd, scratch, (int)N, C));
    unsetenv("SHARDLM_NORM_UNFUSED");

    /* rotary on the query and key heads of qkv, in place; tables (T, hs / 2) fp32 */
    float *qkv = device_random(nqkv, sh->act, 1.0f), *dqkv = device_zeros(nqkv);
    float *cos_t = device_random((size_t)T * (hs / 2), DTYPE_F32, 1.0f);
    float *sin_t = device_random((size_t)T * (hs / 2), DTYPE_F32, 1.0f);
    const double rope_bytes = 2.0 * a * (double)N * (NH + NKV) * hs;
    TIME_OP("rope_fwd", rope_bytes, 0, backend_rope_forward(qkv, cos_t, sin_t, NULL, B, T, NH, NKV, hs, hs));
    TIME_OP("rope_bwd", rope_bytes, 0, backend_rope_backward(dqkv, cos_t, sin_t, NULL, B, T, NH, NKV, hs, hs));

    /* grouped-query attention (NH / NKV query heads a kv head): the FLOPs of NH heads, as the products are */
    size_t scratch_n = backend_attention_scratch(T, NH) + 1, att_n = backend_attention_saved(B, T, NH) / 4 + 1;
    float *att = device_zeros(att_n), *att_scratch = device_zeros(scratch_n);
    double attn = 4.0 * B * (double)T * T * NH * hs;
    TIME_OP("attention_gqa_fwd", attn, 1,
            backend_attention_gqa_forward(y, att, qkv, att_scratch, NULL, B, T, NH, NKV, hs, NULL));
    TIME_OP("attention_gqa_bwd", 2 * attn, 1,
            backend_attention_gqa_backward(dqkv, x, qkv, att, y, att_scratch, NULL, B, T, NH, NKV, hs, NULL));
    /* the same over packed rows of PACKED_SAMPLES samples: the FLOPs of those samples alone */
    int32_t *pos = packed_positions(B, T);
    const double packed_attn = attn * packed_fraction(T);
    TIME_OP("attention_gqa_fwd_packed", packed_attn, 1,
            backend_attention_gqa_forward(y, att, qkv, att_scratch, pos, B, T, NH, NKV, hs, NULL));
    TIME_OP("attention_gqa_bwd_packed", 2 * packed_attn, 1,
            backend_attention_gqa_backward(dqkv, x, qkv, att, y, att_scratch, pos, B, T, NH, NKV, hs, NULL));
    backend_mem_free(SPACE_DEVICE, pos, (size_t)B * T * 4);

    /* SwiGLU over the gate and up projections (N, 2F) */
    const size_t nf = N * F;
    float *gu = device_random(2 * nf, sh->act, 2.0f), *h = device_zeros(nf), *dgu = device_zeros(2 * nf);
    TIME_OP("swiglu_fwd", 3.0 * a * (double)nf, 0, backend_swiglu_forward(h, gu, (int)N, F));
    TIME_OP("swiglu_bwd", 5.0 * a * (double)nf, 0, backend_swiglu_backward(dgu, h, gu, (int)N, F));

    float *bufs[] = {x, w, y, rstd, dx, dw, scratch, qkv, dqkv, cos_t, sin_t, att, att_scratch, gu, h, dgu};
    size_t sizes[] = {N * C, C, N * C, N, N * C, C, backend_layernorm_scratch(C) + 1, nqkv, nqkv,
                      (size_t)T * (hs / 2), (size_t)T * (hs / 2), att_n, scratch_n, 2 * nf, nf, 2 * nf};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        backend_mem_free(SPACE_DEVICE, bufs[i], sizes[i] * 4);
}

static void time_all(const struct shape *sh)
{
    const int B = sh->B, T = sh->T, C = sh->C, NH = sh->NH, Vp = sh->Vp;
    const size_t N = (size_t)B * T;
    const double a = (double)dtype_size(sh->act);

    time_matmul(sh, "qkv", C, 3 * C);
    time_matmul(sh, "attn_proj", C, C);
    time_matmul(sh, "fc", C, 4 * C);
    time_matmul(sh, "fc_proj", 4 * C, C);

    /* the tied LM head */
    float *x = device_random(N * C, sh->act, 1.0f), *wte = device_random((size_t)Vp * C, sh->act, 0.02f);
    float *logits = device_zeros(N * Vp), *dx = device_zeros(N * C), *dwte = device_zeros((size_t)Vp * C);
    double head = 2.0 * (double)N * C * Vp;
    TIME_OP("lm_head_fwd", head, 1, backend_matmul_forward_transposed(logits, x, wte, (int)N, C, Vp));
    TIME_OP("lm_head_bwd", 2 * head, 1, backend_matmul_backward_transposed(dx, dwte, logits, x, wte, (int)N, C, Vp));
    backend_mem_free(SPACE_DEVICE, wte, (size_t)Vp * C * 4);
    backend_mem_free(SPACE_DEVICE, dwte, (size_t)Vp * C * 4);

    /* cross-entropy over the logits: read and write (N, Vp) [A] */
    int32_t *targets_host = malloc(N * sizeof *targets_host);
    for (size_t i = 0; i < N; i++)
        targets_host[i] = (int32_t)((g_rng = g_rng * 6364136223846793005ull + 1) >> 33) % sh->V;
    int32_t *targets = backend_mem_alloc(SPACE_DEVICE, N * 4, "time_kernels targets");
    backend_copy(targets, targets_host, N * 4);
    float *losses = device_zeros(N);
    float *probs = device_random(N * Vp, sh->act, 4.0f);
    double ce_bytes = 2.0 * a * (double)N * Vp;
    TIME_OP("crossentropy_fwd", ce_bytes, 0, backend_crossentropy_forward(losses, probs, targets, (int)N, sh->V, Vp));
    TIME_OP("crossentropy_bwd", ce_bytes, 0,
            backend_crossentropy_backward(probs, targets, 1.0f / (float)N, (int)N, sh->V, Vp));
    backend_mem_free(SPACE_DEVICE, probs, N * Vp * 4);
    backend_mem_free(SPACE_DEVICE, logits, N * Vp * 4);
    backend_mem_free(SPACE_DEVICE, losses, N * 4);
    backend_mem_free(SPACE_DEVICE, targets, N * 4);
    free(targets_host);

    /* attention over qkv (B, T, 3C), rotated through copies that exceed the L2 */
    size_t scratch_n = backend_attention_scratch(T, NH) + 1, att_n = backend_attention_saved(B, T, NH) / 4 + 1;
    double qkv_bytes = (double)N * 3 * C * dtype_size(sh->act);
    int copies = (int)(L2_BYTES / qkv_bytes) + 2;
    if (copies > MAX_COPIES)
        copies = MAX_COPIES;
    float *qkvs[MAX_COPIES];
    for (int i = 0; i < copies; i++)
        qkvs[i] = device_random(N * 3 * C, sh->act, 1.0f);
    float *att = device_zeros(att_n), *scratch = device_zeros(scratch_n), *dqkv = device_zeros(N * 3 * C);
    double attn = 4.0 * B * (double)T * T * C; /* QK^T and PV, 2 FLOPs per multiply-add, the full square */
    double causal = attn * (T + 1.0) / (2.0 * T); /* what a causal kernel executes: the lower triangle */
    TIME_ROTATED("attention_fwd", attn, causal, backend_attention_forward(dx, att, q_, scratch, NULL, B, T, C, NH));
    /* the output of the forward is dx's contents (any values time the same) */
    TIME_ROTATED("attention_bwd", 2 * attn, 2 * causal,
                 backend_attention_backward(dqkv, dx, q_, att, dx, scratch, NULL, B, T, C, NH));
    /* packed rows of PACKED_SAMPLES samples: the FLOPs of those samples alone */
    int32_t *pos = packed_positions(B, T);
    const double packed_attn = attn * packed_fraction(T), packed_causal = causal * packed_fraction(T);
    TIME_ROTATED("attention_fwd_packed", packed_attn, packed_causal,
                 backend_attention_forward(dx, att, q_, scratch, pos, B, T, C, NH));
    TIME_ROTATED("attention_bwd_packed", 2 * packed_attn, 2 * packed_causal,
                 backend_attention_backward(dqkv, dx, q_, att, dx, scratch, pos, B, T, C, NH));
    backend_mem_free(SPACE_DEVICE, pos, (size_t)B * T * 4);
    for (int i = 0; i < copies; i++)
        backend_mem_free(SPACE_DEVICE, qkvs[i], N * 3 * C * 4);
    backend_mem_free(SPACE_DEVICE, att, att_n * 4);
    backend_mem_free(SPACE_DEVICE, scratch, scratch_n * 4);
    backend_mem_free(SPACE_DEVICE, dqkv, N * 3 * C * 4);

    /* layernorm: fp32 input (the residual stream), [A] output */
    float *resid = device_random(N * C, DTYPE_F32, 1.0f), *ln_w = device_random(C, sh->act, 1.0f);
    float *ln_b = device_random(C, sh->act, 0.1f), *mean = device_zeros(N), *rstd = device_zeros(N);
    float *dresid = device_zeros(N * C), *dw = device_zeros(C), *db = device_zeros(C);
    size_t ln_scratch_n = backend_layernorm_scratch(C);
    float *ln_scratch = device_zeros(ln_scratch_n);
    TIME_OP("layernorm_fwd", (4.0 + a) * (double)N * C, 0,
            backend_layernorm_forward(x, mean, rstd, resid, ln_w, ln_b, (int)N, C));
    /* reads dout [A] and inp, reads and writes dinp (fp32) */
    TIME_OP("layernorm_bwd", (a + 12.0) * (double)N * C, 0,
            backend_layernorm_backward(dresid, dw, db, x, resid, ln_w, mean, rstd, ln_scratch, (int)N, C));
    TIME_OP("residual_add", (8.0 + a) * (double)N * C, 0, backend_add_act(dresid, resid, x, N * C));

    /* GELU over the fc activations (N, 4C) */
    const size_t n4 = 4 * N * C;
    float *h = device_random(n4, sh->act, 2.0f), *g = device_zeros(n4), *dh = device_zeros(n4);
    TIME_OP("gelu_fwd", 2.0 * a * (double)n4, 0, backend_gelu_forward(g, h, n4));
    TIME_OP("gelu_bwd", 3.0 * a * (double)n4, 0, backend_gelu_backward(dh, h, g, n4));

    time_llama(sh);
    printf("@figure {\"kernels\": {%s}, \"shape\": {\"B\": %d, \"T\": %d, \"C\": %d, \"NH\": %d, \"NKV\": %d, "
           "\"F\": %d, \"V\": %d, \"Vp\": %d, \"dtype\": \"%s\", \"reps\": %d, \"backend\": \"%s\"}}\n",
           g_json, B, T, C, NH, sh->NKV, sh->F, sh->V, Vp,
           sh->act == DTYPE_BF16 ? "bf16" : sh->act == DTYPE_F16 ? "fp16" : "fp32", sh->reps, backend_name());
}

static void usage(FILE *f)
{
    fprintf(f, "usage: time_kernels [--batch B] [--seq T] [--channels C] [--heads NH] [--vocab V]\n"
               "                    [--kv-heads NKV] [--ffn F] [--dtype fp32|bf16|fp16] [--reps R]\n"
               "  defaults: GPT-2 350M, B 8, T 1024, C 1024, NH 16, V 50257, bf16, 20 reps;\n"
               "  the Llama kernels: NKV = NH / %d (NH when it does not divide), F = 8C/3 rounded up to %d\n",
               LLAMA_GQA_RATIO, LLAMA_FFN_MULTIPLE);
}

int main(int argc, char **argv)
{
    struct shape sh = {.B = 8, .T = 1024, .C = 1024, .NH = 16, .V = 50257, .act = DTYPE_BF16, .reps = 20};
    static const struct option opts[] = {
        {"batch", required_argument, 0, 'b'}, {"seq", required_argument, 0, 't'},
        {"channels", required_argument, 0, 'c'}, {"heads", required_argument, 0, 'n'},
        {"vocab", required_argument, 0, 'v'}, {"dtype", required_argument, 0, 'd'},
        {"reps", required_argument, 0, 'r'}, {"kv-heads", required_argument, 0, 'k'},
        {"ffn", required_argument, 0, 'f'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'b': sh.B = atoi(optarg); break;
        case 't': sh.T = atoi(optarg); break;
        case 'c': sh.C = atoi(optarg); break;
        case 'n': sh.NH = atoi(optarg); break;
        case 'v': sh.V = atoi(optarg); break;
        case 'r': sh.reps = atoi(optarg); break;
        case 'k': sh.NKV = atoi(optarg); break;
        case 'f': sh.F = atoi(optarg); break;
        case 'd':
            if (!strcmp(optarg, "fp32"))
                sh.act = DTYPE_F32;
            else if (!strcmp(optarg, "bf16"))
                sh.act = DTYPE_BF16;
            else if (!strcmp(optarg, "fp16"))
                sh.act = DTYPE_F16;
            else {
                fprintf(stderr, "time_kernels: --dtype %s: expected fp32, bf16 or fp16\n", optarg);
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (sh.B < 1 || sh.T < 1 || sh.C < 1 || sh.NH < 1 || sh.C % sh.NH || sh.V < 1 || sh.reps < 1) {
        fprintf(stderr, "time_kernels: every size must be positive and C a multiple of NH; "
                        "try the defaults (GPT-2 350M)\n");
        return 2;
    }
    if (!sh.NKV)
        sh.NKV = sh.NH % LLAMA_GQA_RATIO ? sh.NH : sh.NH / LLAMA_GQA_RATIO;
    if (!sh.F)
        sh.F = (8 * sh.C / 3 + LLAMA_FFN_MULTIPLE - 1) / LLAMA_FFN_MULTIPLE * LLAMA_FFN_MULTIPLE;
    if (sh.NKV < 1 || sh.NH % sh.NKV || sh.F < 1 || (sh.C / sh.NH) % 2) {
        fprintf(stderr, "time_kernels: --kv-heads must divide --heads, --ffn be positive and the head size "
                        "C / NH even (rotary); try the defaults\n");
        return 2;
    }
    sh.Vp = (sh.V + VOCAB_ALIGN - 1) / VOCAB_ALIGN * VOCAB_ALIGN;
    backend_init(0);
    backend_set_act_dtype(sh.act);
    printf("time_kernels: backend %s, B %d T %d C %d NH %d V %d (Vp %d), %d reps\n", backend_name(), sh.B, sh.T,
           sh.C, sh.NH, sh.V, sh.Vp, sh.reps);
    time_all(&sh);
    return 0;
}
