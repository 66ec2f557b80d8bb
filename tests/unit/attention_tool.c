/*
 * attention_tool — the CPU backend's attention (src/backend/cpu/backend_cpu_attention.c)
 * from the command line, for tests/t_attention_torch.py, which checks it
 * against PyTorch. Built and run with the unit tests: without arguments it
 * checks itself on cases whose answers are known in closed form.
 *
 *   attention_tool DIR B T NH NKV HS
 *       reads DIR/qkv.f32 (B, T, (NH + 2 NKV) HS), DIR/dout.f32 (B, T, NH HS)
 *       and, if present, DIR/pos.i32 (B, T: packed rows, backend.h), all
 *       little-endian; runs the grouped-query forward and backward with the
 *       kernel SHARDLM_ATTENTION names (tiled by default) and writes
 *       DIR/out.f32, DIR/lse.f32 (B, NH, T: the tiled kernel's log-sum-exp;
 *       not written by the materialized one, which keeps probabilities) and
 *       DIR/dqkv.f32.
 */
#include "backend/backend.h"
#include "backend/cpu/backend_cpu_attention.h"
#include "check.h"
#include "core/util.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct shape {
    int B, T, NH, NKV, hs;
};

static size_t qkv_floats(const struct shape *s) { return (size_t)s->B * s->T * (s->NH + 2 * s->NKV) * s->hs; }
static size_t out_floats(const struct shape *s) { return (size_t)s->B * s->T * s->NH * s->hs; }

struct outputs {
    float *out, *att, *dqkv;
};

/* The forward and backward of the kernel in use. */
static struct outputs attend(const struct shape *s, const float *qkv, const float *dout, const int32_t *pos)
{
    struct outputs o = {xmalloc(out_floats(s) * sizeof(float)), xmalloc(backend_attention_saved(s->B, s->T, s->NH)),
                        xmalloc(qkv_floats(s) * sizeof(float))};
    float *scratch = xmalloc((backend_attention_scratch(s->T, s->NH) + 1) * sizeof *scratch);
    backend_attention_gqa_forward(o.out, o.att, qkv, scratch, pos, s->B, s->T, s->NH, s->NKV, s->hs, NULL);
    backend_attention_gqa_backward(o.dqkv, dout, qkv, o.att, o.out, scratch, pos, s->B, s->T, s->NH, s->NKV, s->hs,
                                   NULL);
    free(scratch);
    return o;
}

static void outputs_free(struct outputs *o) { free(o->out), free(o->att), free(o->dqkv); }

/* DIR/NAME, exactly n elements of size es; absent: NULL when optional, else an error. */
static void *read_array(const char *dir, const char *name, size_t n, size_t es, int optional)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (optional && errno == ENOENT)
            return NULL;
        fail_input("attention_tool: cannot open %s: %s", path, strerror(errno));
    }
    void *p = xmalloc(n * es + 1);
    const size_t got = fread(p, es, n + 1, f);
    fclose(f);
    if (got != n)
        fail_input("attention_tool: %s holds %zu elements of %zu bytes, not the %zu the shape needs", path, got, es, n);
    return p;
}

static void write_array(const char *dir, const char *name, const void *p, size_t bytes)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, bytes, f) != bytes || fclose(f) != 0)
        fail_input("attention_tool: cannot write %s: %s", path, strerror(errno));
}

static int run_files(char **argv)
{
    const char *dir = argv[1];
    struct shape s;
    int *dims[] = {&s.B, &s.T, &s.NH, &s.NKV, &s.hs};
    for (int i = 0; i < 5; i++) {
        char *end;
        const long v = strtol(argv[2 + i], &end, 10);
        if (*end || v < 1 || v > 1 << 20)
            fail_input("attention_tool: '%s' is not a dimension (B T NH NKV HS, positive integers)", argv[2 + i]);
        *dims[i] = (int)v;
    }
    if (s.NH % s.NKV)
        fail_input("attention_tool: NKV %d does not divide NH %d", s.NKV, s.NH);
    float *qkv = read_array(dir, "qkv.f32", qkv_floats(&s), sizeof(float), 0);
    float *dout = read_array(dir, "dout.f32", out_floats(&s), sizeof(float), 0);
    int32_t *pos = read_array(dir, "pos.i32", (size_t)s.B * s.T, sizeof(int32_t), 1);
    struct outputs o = attend(&s, qkv, dout, pos);
    write_array(dir, "out.f32", o.out, out_floats(&s) * sizeof(float));
    if (backend_cpu_attention_kernel() == CPU_ATTENTION_TILED)
        write_array(dir, "lse.f32", o.att, backend_attention_saved(s.B, s.T, s.NH));
    write_array(dir, "dqkv.f32", o.dqkv, qkv_floats(&s) * sizeof(float));
    outputs_free(&o);
    free(qkv), free(dout), free(pos);
    return 0;
}

/* Without arguments: keys all equal, so every query spreads evenly over the keys it sees, and its output is the
 * mean of their values (value row t: t in every channel, so row i's output is (first + i) / 2) and its
 * log-sum-exp log(count) + the common score; with packed rows the means restart at each sample. */
static void self_check(void)
{
    const struct shape s = {2, 37, 4, 2, 3};
    const int width = (s.NH + 2 * s.NKV) * s.hs;
    float *qkv = xmalloc(qkv_floats(&s) * sizeof(float)), *dout = xmalloc(out_floats(&s) * sizeof(float));
    int32_t *pos = xmalloc((size_t)s.B * s.T * sizeof *pos);
    for (int b = 0; b < s.B; b++)
        for (int t = 0; t < s.T; t++) {
            float *row = qkv + ((size_t)b * s.T + t) * width;
            for (int c = 0; c < width; c++)
                row[c] = c < (s.NH + s.NKV) * s.hs ? 0.5f : (float)t; /* q and k 0.5, v = t */
            pos[(size_t)b * s.T + t] = b == 0 ? t : t % 10;       /* row 1: samples of 10 tokens */
        }
    for (size_t i = 0; i < out_floats(&s); i++)
        dout[i] = 0.0f;
    struct outputs o = attend(&s, qkv, dout, pos);
    const double score = 0.25 * s.hs / sqrt((double)s.hs);
    double worst_out = 0.0, worst_lse = 0.0, worst_grad = 0.0;
    for (int b = 0; b < s.B; b++)
        for (int t = 0; t < s.T; t++) {
            const int first = t - pos[(size_t)b * s.T + t];
            for (int h = 0; h < s.NH; h++) {
                const float *y = o.out + ((size_t)b * s.T + t) * s.NH * s.hs + (size_t)h * s.hs;
                for (int c = 0; c < s.hs; c++)
                    worst_out = fmax(worst_out, fabs(y[c] - (first + t) / 2.0));
                if (backend_cpu_attention_kernel() == CPU_ATTENTION_TILED)
                    worst_lse = fmax(worst_lse, fabs(o.att[((size_t)b * s.NH + h) * s.T + t] -
                                                     (log(t - first + 1.0) + score)));
            }
        }
    for (size_t i = 0; i < qkv_floats(&s); i++)
        worst_grad = fmax(worst_grad, fabs(o.dqkv[i]));
    CHECK("attention_tool: equal keys give the mean of the values seen", worst_out < 1e-4, "off by %g", worst_out);
    if (backend_cpu_attention_kernel() == CPU_ATTENTION_TILED) /* the materialized kernel keeps probabilities */
        CHECK("attention_tool: equal keys give log(count) + score", worst_lse < 1e-5, "off by %g", worst_lse);
    CHECK("attention_tool: a zero output gradient gives zero gradients", worst_grad == 0.0, "largest %g", worst_grad);
    outputs_free(&o);
    free(qkv), free(dout), free(pos);
}

int main(int argc, char **argv)
{
    if (argc == 7)
        return run_files(argv);
    if (argc != 1) {
        fprintf(stderr, "usage: attention_tool [DIR B T NH NKV HS]\n");
        return 2;
    }
    self_check();
    return check_status();
}
