/*
 * test_packing — packed rows on the CPU backend (backend.h "Packed rows"): a
 * row holding several samples laid end to end, with each token's position
 * in its sample (pos), gives every sample what that sample gives alone as a
 * row of its own with pos NULL, in fp32:
 *   - attention (the GPT-2 and the grouped-query calls), with both CPU
 *     kernels (backend_cpu_attention.h): the output, what the forward keeps
 *     (tiled: each row's log-sum-exp; materialized: the probabilities, the
 *     sample's block, every probability outside the samples' blocks exactly
 *     0) and the input gradient dqkv;
 *   - rotary embedding, forward and backward;
 *   - the embedding with a position table: the output, and the gradients of
 *     wte and wpe (the packed row adds into them what the samples add one
 *     after the other);
 * that the half-precision path of an emulated device (backend_cpu_act.c:
 * bf16 activations, pos in device memory) reads pos as the fp32 kernels do,
 * with both attention kernels (the tiled one's log-sum-exp stays fp32);
 * and positions that are not samples laid end to end are refused with an
 * error. The rows have samples of lengths 1, 2, 7, 33 and 140 and trailing
 * padding (a last sample, or one token samples), with T past the attention's
 * blocks and tiles (64 rows; 64 queries x 128 keys) so that samples straddle
 * them.
 */
#include "backend/backend.h"
#include "backend/cpu/backend_cpu_attention.h"
#include "check.h"
#include "core/dtype.h"
#include "core/util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Packed against alone: max |packed - alone| / max |alone| over a tensor. The
 * attention's sums run over other lengths and offsets in the two layouts
 * (the GEMMs' blocking, the softmax's vector lanes), so they round
 * differently, about 1e-7 relative; a key or query leaking across a sample's
 * border is off by 1e-2 .. 1. */
#define PACK_TOL 1e-6

enum { B = 2, T = 300, MAX_SAMPLES = 16, LONGEST = 140 };

/* The samples of each row: lengths, then what is left of T as padding
 * (row 0: one more sample, of 117 tokens; row 1: one token samples, pos 0 each). */
static const int ROW_LENGTHS[B][MAX_SAMPLES] = {{1, 2, 7, 33, LONGEST}, {LONGEST, 33, 7, 2, 1}};

struct sample {
    int b, start, len;
};

/* Fills pos (B, T) from ROW_LENGTHS and lists the samples (padding included); returns their count. */
static int layout(int32_t *pos, struct sample *samples)
{
    int n = 0;
    for (int b = 0; b < B; b++) {
        int t = 0;
        for (int k = 0; k < MAX_SAMPLES && ROW_LENGTHS[b][k]; k++) {
            samples[n++] = (struct sample){b, t, ROW_LENGTHS[b][k]};
            for (int i = 0; i < ROW_LENGTHS[b][k]; i++, t++)
                pos[(size_t)b * T + t] = i;
        }
        if (b == 0 && t < T) {
            samples[n++] = (struct sample){b, t, T - t};
            for (int i = 0; t < T; i++, t++)
                pos[(size_t)b * T + t] = i;
        }
        for (; t < T; t++) {
            samples[n++] = (struct sample){b, t, 1};
            pos[(size_t)b * T + t] = 0;
        }
    }
    return n;
}

/* Rows [start, start + len) of sequence b of x (B, T, width), and back. */
static float *rows_of(const float *x, const struct sample *s, int width)
{
    float *y = xmalloc((size_t)s->len * width * sizeof *y);
    memcpy(y, x + ((size_t)s->b * T + s->start) * width, (size_t)s->len * width * sizeof *y);
    return y;
}

/* The worst relative error of a sample's rows of the packed tensor x (B, T, width) against alone (len, width),
 * folded into *worst as max error and max reference. */
struct error {
    double diff, scale;
};

static void fold(struct error *e, const float *got, const float *want, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        e->diff = !(d <= e->diff) ? d : e->diff; /* NaN sticks */
        e->scale = fmax(e->scale, fabs(want[i]));
    }
}

static void check_error(const char *name, const struct error *e)
{
    double rel = e->diff / (e->scale > 0 ? e->scale : 1e-30);
    printf("# %s: max rel err %.2e\n", name, rel);
    CHECK(name, rel <= PACK_TOL, "max |packed - alone| %.3g relative to max |alone| %.3g: %.3g > %g", e->diff,
          e->scale, rel, PACK_TOL);
}

/* The forward and backward of one attention call over B rows of T tokens; gpt2_call: the GPT-2 calls (NKV = NH). */
static void attention_run(float *out, float *att, float *dqkv, const float *qkv, const float *dout, const int32_t *pos,
                          int B_, int T_, int NH, int NKV, int hs, int gpt2_call)
{
    float *scratch = xmalloc((backend_attention_scratch(T_, NH) + 1) * sizeof *scratch);
    if (gpt2_call) {
        backend_attention_forward(out, att, qkv, scratch, pos, B_, T_, NH * hs, NH);
        backend_attention_backward(dqkv, dout, qkv, att, out, scratch, pos, B_, T_, NH * hs, NH);
    } else {
        backend_attention_gqa_forward(out, att, qkv, scratch, pos, B_, T_, NH, NKV, hs, NULL);
        backend_attention_gqa_backward(dqkv, dout, qkv, att, out, scratch, pos, B_, T_, NH, NKV, hs, NULL);
    }
    free(scratch);
}

/* Materialized: every probability outside the samples' diagonal blocks is exactly 0. */
static void check_outside_zero(const char *kernel, const float *att, const int32_t *pos, int NH)
{
    char name[200];
    size_t outside_nonzero = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++)
                for (int j = 0; j < T; j++) {
                    const int first = i - pos[(size_t)b * T + i];
                    if (j < first || j > i)
                        outside_nonzero += att[(((size_t)b * NH + h) * T + i) * T + j] != 0.0f;
                }
    snprintf(name, sizeof name, "packing %s: probabilities outside each query's sample exactly 0", kernel);
    CHECK(name, outside_nonzero == 0, "%zu nonzero", outside_nonzero);
}

/* Attention of NH query heads over NKV key/value heads of hs channels with the kernel chosen now;
 * gpt2_call: the GPT-2 calls (NKV = NH). */
static void test_attention(int NH, int NKV, int hs, int gpt2_call, uint64_t *rng)
{
    const int tiled = backend_cpu_attention_kernel() == CPU_ATTENTION_TILED;
    char kernel[128], name[200];
    snprintf(kernel, sizeof kernel, "%s %s NH=%d NKV=%d hs=%d", gpt2_call ? "attention" : "attention_gqa",
             tiled ? "tiled" : "materialized", NH, NKV, hs);
    const int width = (NH + 2 * NKV) * hs, C = NH * hs;
    const size_t n_qkv = (size_t)B * T * width, n_out = (size_t)B * T * C;
    int32_t pos[B * T];
    struct sample samples[B * T];
    const int n_samples = layout(pos, samples);
    float *qkv = check_random_floats(n_qkv, 1.5f, rng), *dout = check_random_floats(n_out, 1.0f, rng);
    float *out = xmalloc(n_out * sizeof *out), *att = xmalloc(backend_attention_saved(B, T, NH));
    float *dqkv = xmalloc(n_qkv * sizeof *dqkv);
    attention_run(out, att, dqkv, qkv, dout, pos, B, T, NH, NKV, hs, gpt2_call);
    if (!tiled)
        check_outside_zero(kernel, att, pos, NH);

    struct error e_out = {0, 0}, e_att = {0, 0}, e_dqkv = {0, 0};
    for (int k = 0; k < n_samples; k++) {
        const struct sample *s = &samples[k];
        const int L = s->len;
        float *q1 = rows_of(qkv, s, width), *dy1 = rows_of(dout, s, C);
        float *out1 = xmalloc((size_t)L * C * sizeof *out1), *att1 = xmalloc(backend_attention_saved(1, L, NH));
        float *dqkv1 = xmalloc((size_t)L * width * sizeof *dqkv1);
        attention_run(out1, att1, dqkv1, q1, dy1, NULL, 1, L, NH, NKV, hs, gpt2_call);
        float *packed_out = rows_of(out, s, C), *packed_dqkv = rows_of(dqkv, s, width);
        fold(&e_out, packed_out, out1, (size_t)L * C);
        fold(&e_dqkv, packed_dqkv, dqkv1, (size_t)L * width);
        for (int h = 0; h < NH; h++) {
            if (tiled) /* log-sum-exp (B, NH, T) */
                fold(&e_att, att + ((size_t)s->b * NH + h) * T + s->start, att1 + (size_t)h * L, (size_t)L);
            else /* probabilities (B, NH, T, T): the sample's block */
                for (int i = 0; i < L; i++)
                    fold(&e_att, att + (((size_t)s->b * NH + h) * T + s->start + i) * T + s->start,
                         att1 + ((size_t)h * L + i) * L, (size_t)L);
        }
        free(q1), free(dy1), free(out1), free(att1), free(dqkv1), free(packed_out), free(packed_dqkv);
    }
    snprintf(name, sizeof name, "packing %s: out = each sample alone", kernel);
    check_error(name, &e_out);
    snprintf(name, sizeof name, "packing %s: %s = each sample alone", kernel, tiled ? "log-sum-exp" : "probabilities");
    check_error(name, &e_att);
    snprintf(name, sizeof name, "packing %s: dqkv = each sample alone", kernel);
    check_error(name, &e_dqkv);
    free(qkv), free(dout), free(out), free(att), free(dqkv);
}

/* Rotary tables (T, hs / 2), as Llama's: angle t theta^(-2i / hs). */
#define ROPE_THETA 10000.0

static void rope_tables(float *cos_t, float *sin_t, int hs)
{
    for (int t = 0; t < T; t++)
        for (int i = 0; i < hs / 2; i++) {
            const double angle = t * pow(ROPE_THETA, -2.0 * i / hs);
            cos_t[(size_t)t * (hs / 2) + i] = (float)cos(angle);
            sin_t[(size_t)t * (hs / 2) + i] = (float)sin(angle);
        }
}

static void test_rope(int NH, int NKV, int hs, uint64_t *rng)
{
    char name[160];
    const int width = (NH + 2 * NKV) * hs, half = hs / 2;
    const size_t n_qkv = (size_t)B * T * width;
    int32_t pos[B * T];
    struct sample samples[B * T];
    const int n_samples = layout(pos, samples);
    float *cos_t = xmalloc((size_t)T * half * sizeof *cos_t), *sin_t = xmalloc((size_t)T * half * sizeof *sin_t);
    rope_tables(cos_t, sin_t, hs);
    float *qkv = check_random_floats(n_qkv, 1.0f, rng), *dqkv = check_random_floats(n_qkv, 1.0f, rng);
    float *x = xmalloc(n_qkv * sizeof *x), *dx = xmalloc(n_qkv * sizeof *dx);
    memcpy(x, qkv, n_qkv * sizeof *x);
    memcpy(dx, dqkv, n_qkv * sizeof *dx);
    backend_rope_forward(x, cos_t, sin_t, pos, B, T, NH, NKV, hs, hs);
    backend_rope_backward(dx, cos_t, sin_t, pos, B, T, NH, NKV, hs, hs);
    struct error e_fwd = {0, 0}, e_bwd = {0, 0};
    for (int k = 0; k < n_samples; k++) {
        float *x1 = rows_of(qkv, &samples[k], width), *dx1 = rows_of(dqkv, &samples[k], width);
        backend_rope_forward(x1, cos_t, sin_t, NULL, 1, samples[k].len, NH, NKV, hs, hs);
        backend_rope_backward(dx1, cos_t, sin_t, NULL, 1, samples[k].len, NH, NKV, hs, hs);
        float *px = rows_of(x, &samples[k], width), *pdx = rows_of(dx, &samples[k], width);
        fold(&e_fwd, px, x1, (size_t)samples[k].len * width);
        fold(&e_bwd, pdx, dx1, (size_t)samples[k].len * width);
        free(x1), free(dx1), free(px), free(pdx);
    }
    snprintf(name, sizeof name, "packing rope NH=%d NKV=%d hs=%d: forward = each sample alone", NH, NKV, hs);
    check_error(name, &e_fwd);
    snprintf(name, sizeof name, "packing rope NH=%d NKV=%d hs=%d: backward = each sample alone", NH, NKV, hs);
    check_error(name, &e_bwd);
    free(cos_t), free(sin_t), free(qkv), free(dqkv), free(x), free(dx);
}

/* The embedding with a position table; the gradients accumulate from the same random start. */
static void test_embedding(uint64_t *rng)
{
    enum { C = 12, V = 50 };
    int32_t pos[B * T], tokens[B * T];
    struct sample samples[B * T];
    const int n_samples = layout(pos, samples);
    for (int i = 0; i < B * T; i++)
        tokens[i] = (int32_t)(rng_uniform(rng) * V);
    const size_t n_out = (size_t)B * T * C;
    float *wte = check_random_floats((size_t)V * C, 1, rng), *wpe = check_random_floats((size_t)T * C, 1, rng);
    float *dout = check_random_floats(n_out, 1, rng), *out = xmalloc(n_out * sizeof *out);
    float *dwte0 = check_random_floats((size_t)V * C, 1, rng), *dwpe0 = check_random_floats((size_t)T * C, 1, rng);
    float *dwte = xmalloc((size_t)V * C * sizeof *dwte), *dwpe = xmalloc((size_t)T * C * sizeof *dwpe);
    float *dwte1 = xmalloc((size_t)V * C * sizeof *dwte1), *dwpe1 = xmalloc((size_t)T * C * sizeof *dwpe1);
    memcpy(dwte, dwte0, (size_t)V * C * sizeof *dwte), memcpy(dwte1, dwte0, (size_t)V * C * sizeof *dwte);
    memcpy(dwpe, dwpe0, (size_t)T * C * sizeof *dwpe), memcpy(dwpe1, dwpe0, (size_t)T * C * sizeof *dwpe);
    backend_embedding_forward(out, tokens, wte, wpe, pos, B, T, C);
    backend_embedding_backward(dwte, dwpe, dout, tokens, pos, B, T, C);
    struct error e_out = {0, 0};
    for (int k = 0; k < n_samples; k++) {
        const struct sample *s = &samples[k];
        const int32_t *tok1 = tokens + (size_t)s->b * T + s->start;
        float *out1 = xmalloc((size_t)s->len * C * sizeof *out1), *dy1 = rows_of(dout, s, C);
        backend_embedding_forward(out1, tok1, wte, wpe, NULL, 1, s->len, C);
        backend_embedding_backward(dwte1, dwpe1, dy1, tok1, NULL, 1, s->len, C);
        float *packed = rows_of(out, s, C);
        fold(&e_out, packed, out1, (size_t)s->len * C);
        free(out1), free(dy1), free(packed);
    }
    check_error("packing embedding: out = each sample alone", &e_out);
    /* the packed row adds each position's gradients in the order the samples, alone one after the other, do */
    CHECK("packing embedding: dwte and dwpe = the samples' alone, one after the other (bitwise)",
          memcmp(dwte, dwte1, (size_t)V * C * sizeof *dwte) == 0 &&
              memcmp(dwpe, dwpe1, (size_t)T * C * sizeof *dwpe) == 0,
          "the gradients differ");
    size_t moved = 0; /* positions past the longest sample get nothing */
    for (size_t i = (size_t)LONGEST * C; i < (size_t)T * C; i++)
        moved += dwpe[i] != dwpe0[i];
    CHECK("packing embedding: dwpe rows of positions no sample reaches untouched", moved == 0, "%zu changed", moved);
    free(wte), free(wpe), free(dout), free(out), free(dwte0), free(dwpe0), free(dwte), free(dwpe), free(dwte1);
    free(dwpe1);
}

/* ---- the emulated device's half-precision path ----------------------------------------------------------- */

/* bf16 storage against fp32 storage of the same (bf16-exact) inputs: the outputs differ by bf16's rounding, 2^-8
 * relative at most per element, the attention's a few of those; a kernel reading the wrong position is off by
 * 1e-1 .. 1. */
#define BF16_TOL 2e-2

/* x rounded to bf16 in place (both paths then see the same inputs). */
static float *bf16_round(float *x, size_t n)
{
    uint16_t *tmp = xmalloc(n * sizeof *tmp);
    dtype_convert(tmp, DTYPE_BF16, x, DTYPE_F32, n);
    dtype_convert(x, DTYPE_F32, tmp, DTYPE_BF16, n);
    free(tmp);
    return x;
}

/* Emulated device memory holding a copy of x's bytes. */
static void *on_device(const void *x, size_t bytes)
{
    void *d = backend_mem_alloc(SPACE_DEVICE, bytes, "test_packing");
    backend_copy(d, x, bytes);
    return d;
}

/* Emulated device memory holding x (n floats) in bf16. */
static void *on_device_bf16(const float *x, size_t n)
{
    uint16_t *tmp = xmalloc(n * sizeof *tmp);
    dtype_convert(tmp, DTYPE_BF16, x, DTYPE_F32, n);
    void *d = on_device(tmp, n * sizeof *tmp);
    free(tmp);
    return d;
}

/* The bf16 tensor of n elements at device address d, widened into host fp32 and compared with want. */
static void check_bf16(const char *name, const void *d, const float *want, size_t n)
{
    uint16_t *tmp = xmalloc(n * sizeof *tmp);
    float *got = xmalloc(n * sizeof *got);
    backend_copy(tmp, d, n * sizeof *tmp);
    dtype_convert(got, DTYPE_F32, tmp, DTYPE_BF16, n);
    struct error e = {0, 0};
    fold(&e, got, want, n);
    double rel = e.diff / (e.scale > 0 ? e.scale : 1e-30);
    printf("# %s: max rel err %.2e\n", name, rel);
    CHECK(name, rel <= BF16_TOL, "max error %.3g relative to max |fp32| %.3g: %.3g > %g", e.diff, e.scale, rel,
          BF16_TOL);
    free(tmp), free(got);
}

enum { EMU_NH = 4, EMU_NKV = 2, EMU_HS = 6, EMU_C = EMU_NH * EMU_HS, EMU_WIDTH = (EMU_NH + 2 * EMU_NKV) * EMU_HS };

/* Grouped-query attention with the kernel chosen now over the rotated rows: fp32 on the host (rot, dout, pos)
 * against bf16 on the emulated device (d_qkv, d_dout, d_pos); the tiled kernel's log-sum-exp is fp32 on both. */
static void test_emulated_attention(const float *rot, const float *dout, const int32_t *pos, const void *d_qkv,
                                    const void *d_dout, const int32_t *d_pos)
{
    enum { NH = EMU_NH, NKV = EMU_NKV, hs = EMU_HS };
    const int tiled = backend_cpu_attention_kernel() == CPU_ATTENTION_TILED;
    const size_t n_qkv = (size_t)B * T * EMU_WIDTH, n_out = (size_t)B * T * EMU_C;
    char name[160];
    backend_set_act_dtype(DTYPE_F32);
    const size_t att_bytes = backend_attention_saved(B, T, NH), scratch_bytes = (backend_attention_scratch(T, NH) + 1) * 4;
    float *out = xmalloc(n_out * sizeof *out), *dqkv = xmalloc(n_qkv * sizeof *dqkv), *att = xmalloc(att_bytes);
    float *scratch = xmalloc(scratch_bytes);
    backend_attention_gqa_forward(out, att, rot, scratch, pos, B, T, NH, NKV, hs, NULL);
    backend_attention_gqa_backward(dqkv, dout, rot, att, out, scratch, pos, B, T, NH, NKV, hs, NULL);
    backend_set_act_dtype(DTYPE_BF16);
    const size_t d_att_bytes = backend_attention_saved(B, T, NH);
    float *d_out = backend_mem_alloc(SPACE_DEVICE, n_out * 2, "test_packing");
    float *d_dqkv = backend_mem_alloc(SPACE_DEVICE, n_qkv * 2, "test_packing");
    float *d_att = backend_mem_alloc(SPACE_DEVICE, d_att_bytes, "test_packing");
    float *d_scratch = backend_mem_alloc(SPACE_DEVICE, scratch_bytes, "test_packing");
    backend_attention_gqa_forward(d_out, d_att, d_qkv, d_scratch, d_pos, B, T, NH, NKV, hs, NULL);
    snprintf(name, sizeof name, "packing emulated bf16: attention %s out = fp32", tiled ? "tiled" : "materialized");
    check_bf16(name, d_out, out, n_out);
    if (tiled) { /* fp32 on the device too: what the backward reads */
        const size_t n_lse = (size_t)B * NH * T;
        float *lse = xmalloc(n_lse * sizeof *lse);
        backend_copy(lse, d_att, n_lse * sizeof *lse);
        struct error e = {0, 0};
        fold(&e, lse, att, n_lse);
        check_error("packing emulated bf16: attention tiled log-sum-exp (fp32) = fp32", &e);
        CHECK("packing emulated bf16: attention tiled keeps B NH T fp32", d_att_bytes == n_lse * 4, "%zu bytes",
              d_att_bytes);
        free(lse);
    }
    backend_attention_gqa_backward(d_dqkv, d_dout, d_qkv, d_att, d_out, d_scratch, d_pos, B, T, NH, NKV, hs, NULL);
    snprintf(name, sizeof name, "packing emulated bf16: attention %s dqkv = fp32", tiled ? "tiled" : "materialized");
    check_bf16(name, d_dqkv, dqkv, n_qkv);
    backend_mem_free(SPACE_DEVICE, d_out, n_out * 2);
    backend_mem_free(SPACE_DEVICE, d_dqkv, n_qkv * 2);
    backend_mem_free(SPACE_DEVICE, d_att, d_att_bytes);
    backend_mem_free(SPACE_DEVICE, d_scratch, scratch_bytes);
    backend_set_act_dtype(DTYPE_F32);
    free(out), free(dqkv), free(att), free(scratch);
}

/* Rotary, grouped-query attention (both kernels) and the embedding over packed rows with bf16 activations in
 * emulated device memory, against the fp32 kernels on the host. */
static void test_emulated_bf16(uint64_t *rng)
{
    enum { NH = EMU_NH, NKV = EMU_NKV, hs = EMU_HS, C = EMU_C, width = EMU_WIDTH, V = 40 };
    const size_t n_qkv = (size_t)B * T * width, n_out = (size_t)B * T * C;
    int32_t pos[B * T], tokens[B * T];
    struct sample samples[B * T];
    layout(pos, samples);
    for (int i = 0; i < B * T; i++)
        tokens[i] = (int32_t)(rng_uniform(rng) * V);
    const size_t n_table = (size_t)T * (hs / 2);
    float *cos_t = xmalloc(n_table * sizeof *cos_t), *sin_t = xmalloc(n_table * sizeof *sin_t);
    rope_tables(cos_t, sin_t, hs);
    float *qkv = bf16_round(check_random_floats(n_qkv, 1.5f, rng), n_qkv);
    float *dout = bf16_round(check_random_floats(n_out, 1, rng), n_out);
    float *wte = bf16_round(check_random_floats((size_t)V * C, 1, rng), (size_t)V * C);
    float *wpe = bf16_round(check_random_floats((size_t)T * C, 1, rng), (size_t)T * C);
    /* fp32 on the host */
    float *rot = xmalloc(n_qkv * sizeof *rot), *emb = xmalloc(n_out * sizeof *emb);
    memcpy(rot, qkv, n_qkv * sizeof *rot);
    backend_rope_forward(rot, cos_t, sin_t, pos, B, T, NH, NKV, hs, hs);
    bf16_round(rot, n_qkv);
    backend_embedding_forward(emb, tokens, wte, wpe, pos, B, T, C);
    /* bf16 on the emulated device, pos in device memory */
    backend_set_act_dtype(DTYPE_BF16);
    int32_t *d_pos = on_device(pos, sizeof pos), *d_tokens = on_device(tokens, sizeof tokens);
    float *d_cos = on_device(cos_t, n_table * sizeof *cos_t), *d_sin = on_device(sin_t, n_table * sizeof *sin_t);
    float *d_qkv = on_device_bf16(qkv, n_qkv), *d_dout = on_device_bf16(dout, n_out);
    float *d_wte = on_device_bf16(wte, (size_t)V * C), *d_wpe = on_device_bf16(wpe, (size_t)T * C);
    float *d_emb = backend_mem_alloc(SPACE_DEVICE, n_out * 2, "test_packing");
    backend_rope_forward(d_qkv, d_cos, d_sin, d_pos, B, T, NH, NKV, hs, hs);
    check_bf16("packing emulated bf16: rope forward = fp32", d_qkv, rot, n_qkv);
    for (int kernel = CPU_ATTENTION_TILED; kernel <= CPU_ATTENTION_MATERIALIZED; kernel++) {
        backend_cpu_attention_use((enum cpu_attention)kernel);
        test_emulated_attention(rot, dout, pos, d_qkv, d_dout, d_pos);
    }
    backend_cpu_attention_use(CPU_ATTENTION_TILED);
    backend_set_act_dtype(DTYPE_BF16);
    backend_embedding_forward(d_emb, d_tokens, d_wte, d_wpe, d_pos, B, T, C);
    check_bf16("packing emulated bf16: embedding out = fp32", d_emb, emb, n_out);
    backend_set_act_dtype(DTYPE_F32);
    void *dev[] = {d_pos, d_tokens, d_cos, d_sin, d_qkv, d_dout, d_wte, d_wpe, d_emb};
    const size_t bytes[] = {sizeof pos,  sizeof tokens, n_table * 4,       n_table * 4,      n_qkv * 2,
                            n_out * 2, (size_t)V * C * 2, (size_t)T * C * 2, n_out * 2};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        backend_mem_free(SPACE_DEVICE, dev[i], bytes[i]);
    free(cos_t), free(sin_t), free(qkv), free(dout), free(wte), free(wpe), free(rot), free(emb);
}

/* Positions that are not samples laid end to end (a gap, a row not starting at 0) end the run with an error. */
static void attention_with_bad_positions(const void *arg)
{
    const int32_t *pos = arg;
    enum { NH = 1, hs = 2, TB = 4 };
    float qkv[TB * 3 * NH * hs] = {0}, out[TB * NH * hs], att[NH * TB * TB];
    backend_attention_gqa_forward(out, att, qkv, NULL, pos, 1, TB, NH, NH, hs, NULL);
}

static void test_bad_positions(void)
{
    static const int32_t gap[4] = {0, 1, 3, 4}, late_start[4] = {1, 2, 3, 4};
    const int32_t *bad[2] = {gap, late_start};
    const char *what[2] = {"a gap", "a row not starting at 0"};
    for (int k = 0; k < 2; k++) {
        char msg[512], name[128];
        int rc = check_run_child(attention_with_bad_positions, bad[k], msg, sizeof msg);
        snprintf(name, sizeof name, "packing attention: positions with %s are refused", what[k]);
        CHECK(name, rc != 0 && strstr(msg, "samples laid end to end"), "exit %d, stderr '%s'", rc, msg);
    }
}

int main(void)
{
    /* device memory emulated (before the first backend call reads it): test_emulated_bf16 needs it; the fp32
     * tests use host memory, which the kernels take as it is */
    setenv("SHARDLM_EMULATE_DEVICE", "1", 1);
    uint64_t rng = 0x9acced5a3b1e0001ull;
    for (int kernel = CPU_ATTENTION_TILED; kernel <= CPU_ATTENTION_MATERIALIZED; kernel++) {
        backend_cpu_attention_use((enum cpu_attention)kernel);
        test_attention(2, 2, 4, 1, &rng); /* GPT-2 */
        test_attention(3, 3, 5, 1, &rng); /* GPT-2, odd head size */
        test_attention(4, 2, 6, 0, &rng); /* grouped-query */
        test_attention(4, 1, 3, 0, &rng); /* one kv head, odd head size */
    }
    backend_cpu_attention_use(CPU_ATTENTION_TILED);
    test_rope(4, 2, 8, &rng);
    test_rope(3, 3, 6, &rng);
    test_embedding(&rng);
    test_emulated_bf16(&rng);
    test_bad_positions();
    return check_status();
}
