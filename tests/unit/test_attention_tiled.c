/*
 * test_attention_tiled — the CPU backend's tiled attention (FlashAttention-2,
 * src/backend/cpu/backend_cpu_attention.c) against its materialized one, in fp32 on the
 * same random inputs: the forward's output, the backward's dqkv, and the
 * tiled kernel's log-sum-exp against one computed in double from the scores;
 * at T = 1, T past the tiles (128 queries x 512 keys) and not a multiple of
 * them, T = 4096, grouped-query heads, an odd head size, the GPT-2 calls, and
 * packed rows whose samples cross tile borders. Also: what the tiled kernel
 * keeps (B NH T fp32) and its scratch, which stops growing with T; the same
 * bits run to run and at 1 or 3 threads; and SHARDLM_ATTENTION's reading
 * (tiled by default, materialized, anything else refused).
 */
#include "backend/backend.h"
#include "backend/cpu/backend_cpu_attention.h"
#include "check.h"
#include "core/util.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Tiled against materialized, max |tiled - materialized| / max |materialized| over a tensor (and the log-sum-exp
 * against double). Both add the same terms in other orders (tiles, the online softmax's rescaling), which moves
 * the results by about 1e-7 relative; a tile skipped or computed twice, or a mask off by one key, by 1e-3 .. 1. */
#define TILED_TOL 1e-5

#define MAX_SAMPLES 16

struct attention_case {
    const char *what;
    int B, T, NH, NKV, hs;
    int gpt2_call;                    /* through the GPT-2 calls (NKV = NH) */
    const int lengths[MAX_SAMPLES];   /* packed rows: sample lengths (row b starts at entry b), 0-terminated */
};

/* pos (B, T): each row the samples of c->lengths from entry b on, cyclically, the last one cut at T. */
static int32_t *packed_positions(const struct attention_case *c)
{
    int n = 0;
    while (n < MAX_SAMPLES && c->lengths[n])
        n++;
    int32_t *pos = xmalloc((size_t)c->B * c->T * sizeof *pos);
    for (int b = 0; b < c->B; b++)
        for (int t = 0, k = b, at = 0; t < c->T; t++, at++) {
            if (at == c->lengths[k % n])
                k++, at = 0;
            pos[(size_t)b * c->T + t] = at;
        }
    return pos;
}

/* What one kernel gives on a case's inputs. */
struct result {
    float *out, *att, *dqkv;
};

static struct result run(enum cpu_attention kernel, const struct attention_case *c, const float *qkv,
                         const float *dout, const int32_t *pos)
{
    backend_cpu_attention_use(kernel);
    const size_t BT = (size_t)c->B * c->T;
    struct result r = {xmalloc(BT * c->NH * c->hs * sizeof(float)), xmalloc(backend_attention_saved(c->B, c->T, c->NH)),
                       xmalloc(BT * (c->NH + 2 * c->NKV) * c->hs * sizeof(float))};
    float *scratch = xmalloc((backend_attention_scratch(c->T, c->NH) + 1) * sizeof *scratch);
    if (c->gpt2_call) {
        backend_attention_forward(r.out, r.att, qkv, scratch, pos, c->B, c->T, c->NH * c->hs, c->NH);
        backend_attention_backward(r.dqkv, dout, qkv, r.att, r.out, scratch, pos, c->B, c->T, c->NH * c->hs, c->NH);
    } else {
        backend_attention_gqa_forward(r.out, r.att, qkv, scratch, pos, c->B, c->T, c->NH, c->NKV, c->hs, NULL);
        backend_attention_gqa_backward(r.dqkv, dout, qkv, r.att, r.out, scratch, pos, c->B, c->T, c->NH, c->NKV,
                                       c->hs, NULL);
    }
    free(scratch);
    return r;
}

static void result_free(struct result *r) { free(r->out), free(r->att), free(r->dqkv); }

/* Each row's log-sum-exp (B, NH, T) of its scaled causal scores, in double: query head h reads key head
 * h / (NH / NKV), query i the keys of its sample from i - pos[b, i]. */
static double *reference_lse(const struct attention_case *c, const float *qkv, const int32_t *pos)
{
    const int T = c->T, hs = c->hs, group = c->NH / c->NKV;
    const size_t width = (size_t)(c->NH + 2 * c->NKV) * hs;
    double *lse = xmalloc((size_t)c->B * c->NH * T * sizeof *lse), *s = xmalloc((size_t)T * sizeof *s);
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->NH; h++)
            for (int i = 0; i < T; i++) {
                const float *q = qkv + ((size_t)b * T + i) * width + (size_t)h * hs;
                const int first = pos ? i - pos[(size_t)b * T + i] : 0;
                double m = -INFINITY, sum = 0.0;
                for (int j = first; j <= i; j++) {
                    const float *k = qkv + ((size_t)b * T + j) * width + (size_t)(c->NH + h / group) * hs;
                    double d = 0.0;
                    for (int e = 0; e < hs; e++)
                        d += (double)q[e] * k[e];
                    s[j] = d / sqrt((double)hs);
                    m = fmax(m, s[j]);
                }
                for (int j = first; j <= i; j++)
                    sum += exp(s[j] - m);
                lse[((size_t)b * c->NH + h) * T + i] = m + log(sum);
            }
    free(s);
    return lse;
}

/* max |got - want| / max |want| (NaN counts as the worst). */
static double rel_err(const float *got, const double *want_d, const float *want_f, size_t n)
{
    double diff = 0.0, scale = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double want = want_d ? want_d[i] : want_f[i], d = fabs((double)got[i] - want);
        diff = !(d <= diff) ? d : diff;
        scale = fmax(scale, fabs(want));
    }
    return diff / (scale > 0 ? scale : 1e-30);
}

static void check_close(const char *what, const char *tensor, double err)
{
    char name[200];
    snprintf(name, sizeof name, "attention tiled %s: %s", what, tensor);
    printf("# %s: max rel err %.2e\n", name, err);
    CHECK(name, err <= TILED_TOL, "max relative error %.3g > %g", err, TILED_TOL);
}

static void test_case(const struct attention_case *c, uint64_t *rng)
{
    const size_t n_qkv = (size_t)c->B * c->T * (c->NH + 2 * c->NKV) * c->hs;
    const size_t n_out = (size_t)c->B * c->T * c->NH * c->hs, n_lse = (size_t)c->B * c->NH * c->T;
    int32_t *pos = c->lengths[0] ? packed_positions(c) : NULL;
    float *qkv = check_random_floats(n_qkv, 1.5f, rng), *dout = check_random_floats(n_out, 1.0f, rng);
    struct result mat = run(CPU_ATTENTION_MATERIALIZED, c, qkv, dout, pos);
    struct result til = run(CPU_ATTENTION_TILED, c, qkv, dout, pos);
    double *lse = reference_lse(c, qkv, pos);
    check_close(c->what, "out = materialized", rel_err(til.out, NULL, mat.out, n_out));
    check_close(c->what, "log-sum-exp = double from the scores", rel_err(til.att, lse, NULL, n_lse));
    check_close(c->what, "dqkv = materialized", rel_err(til.dqkv, NULL, mat.dqkv, n_qkv));
    result_free(&mat), result_free(&til);
    free(lse), free(qkv), free(dout), free(pos);
}

/* The same bits from the same inputs: run to run, and at 1 or 3 threads (every output owned by one task, its sums
 * in a fixed order). */
static void test_deterministic(const struct attention_case *c, uint64_t *rng)
{
    const size_t n_qkv = (size_t)c->B * c->T * (c->NH + 2 * c->NKV) * c->hs;
    const size_t n_out = (size_t)c->B * c->T * c->NH * c->hs, n_lse = (size_t)c->B * c->NH * c->T;
    const int threads = omp_get_max_threads();
    int32_t *pos = c->lengths[0] ? packed_positions(c) : NULL;
    float *qkv = check_random_floats(n_qkv, 1.5f, rng), *dout = check_random_floats(n_out, 1.0f, rng);
    struct result r[3];
    for (int k = 0; k < 3; k++) {
        omp_set_num_threads(k == 2 ? 1 : 3);
        r[k] = run(CPU_ATTENTION_TILED, c, qkv, dout, pos);
    }
    omp_set_num_threads(threads);
    for (int k = 1; k < 3; k++) {
        char name[200];
        snprintf(name, sizeof name, "attention tiled %s: the same bits %s", c->what,
                 k == 1 ? "run to run (3 threads)" : "at 1 thread as at 3");
        CHECK(name,
              memcmp(r[0].out, r[k].out, n_out * 4) == 0 && memcmp(r[0].att, r[k].att, n_lse * 4) == 0 &&
                  memcmp(r[0].dqkv, r[k].dqkv, n_qkv * 4) == 0,
              "out, log-sum-exp or dqkv differ");
    }
    for (int k = 0; k < 3; k++)
        result_free(&r[k]);
    free(qkv), free(dout), free(pos);
}

/* What the tiled kernel keeps and needs: each row's log-sum-exp in fp32, and a scratch that stops growing with T
 * once T covers a tile (the materialized kernel's grows as T^2). */
static void test_sizes(void)
{
    backend_cpu_attention_use(CPU_ATTENTION_TILED);
    CHECK("attention tiled: keeps B NH T fp32", backend_attention_saved(3, 1000, 5) == (size_t)3 * 5 * 1000 * 4,
          "%zu bytes", backend_attention_saved(3, 1000, 5));
    const size_t at_tile = backend_attention_scratch(512, 8), at_long = backend_attention_scratch(1 << 20, 8);
    CHECK("attention tiled: scratch at T = 2^20 = at T = 512", at_long == at_tile, "%zu floats, %zu at 512", at_long,
          at_tile);
    CHECK("attention tiled: scratch at T = 4 below T = 512", backend_attention_scratch(4, 8) < at_tile,
          "%zu floats", backend_attention_scratch(4, 8));
    backend_cpu_attention_use(CPU_ATTENTION_MATERIALIZED);
    CHECK("attention materialized: scratch T^2 per thread",
          backend_attention_scratch(1000, 8) == (size_t)omp_get_max_threads() * 1000 * 1000, "%zu floats",
          backend_attention_scratch(1000, 8));
}

/* ---- SHARDLM_ATTENTION, read by a child before anything else reads it ---------------------------------------- */

static void expect_kernel(const void *arg)
{
    if (backend_cpu_attention_kernel() != *(const enum cpu_attention *)arg)
        fail_internal("another kernel");
}

static void test_environment(void)
{
    static const struct {
        const char *value; /* NULL: unset */
        enum cpu_attention kernel;
        const char *refusal; /* NULL: accepted */
    } cases[] = {{NULL, CPU_ATTENTION_TILED, NULL},
                 {"tiled", CPU_ATTENTION_TILED, NULL},
                 {"materialized", CPU_ATTENTION_MATERIALIZED, NULL},
                 {"flash", CPU_ATTENTION_TILED, "SHARDLM_ATTENTION='flash' is not a CPU attention kernel"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char msg[512], name[160];
        if (cases[i].value)
            setenv("SHARDLM_ATTENTION", cases[i].value, 1);
        else
            unsetenv("SHARDLM_ATTENTION");
        const int rc = check_run_child(expect_kernel, &cases[i].kernel, msg, sizeof msg);
        snprintf(name, sizeof name, "SHARDLM_ATTENTION %s: %s", cases[i].value ? cases[i].value : "unset",
                 cases[i].refusal ? "refused" : "chooses its kernel");
        if (cases[i].refusal)
            CHECK(name, rc != 0 && strstr(msg, cases[i].refusal), "exit %d, stderr '%s'", rc, msg);
        else
            CHECK(name, rc == 0, "exit %d, stderr '%s'", rc, msg);
    }
    unsetenv("SHARDLM_ATTENTION");
}

int main(void)
{
    test_environment(); /* first: the children must be the first to read the variable */
    uint64_t rng = 0x7a11eda77e000001ull;
    static const struct attention_case cases[] = {
        {"T=1", 2, 1, 4, 2, 8, 0, {0}},
        {"T=700 (past and not a multiple of the tiles) grouped-query", 2, 700, 4, 2, 16, 0, {0}},
        {"T=300 odd head size", 1, 300, 3, 3, 7, 0, {0}},
        {"T=600 GPT-2 calls", 1, 600, 2, 2, 8, 1, {0}},
        {"T=1100 packed (samples across the 128-query and 512-key tiles) one kv head", 2, 1100, 4, 1, 5, 0,
         {1, 126, 2, 600, 45, 1, 5, 300}},
        {"T=520 packed GPT-2 calls", 2, 520, 2, 2, 8, 1, {130, 1, 3, 390}},
        {"T=4096", 1, 4096, 2, 1, 16, 0, {0}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        test_case(&cases[i], &rng);
    test_deterministic(&cases[4], &rng);
    test_sizes();
    return check_status();
}
