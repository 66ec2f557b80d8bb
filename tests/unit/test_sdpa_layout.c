/*
 * test_sdpa_layout — backend/sdpa_layout (issue 45), on the CPU: the dims, strides and offsets through which
 * cuDNN's SDPA reads backend.h's interleaved qkv, out and log-sum-exp, and the attention kernel a CUDA call runs.
 *   - Llama-3.1-8B's shape (B 2, T 2048, 32 query heads, 8 kv heads, hs 128): every number, as written out by
 *     hand from backend.h's layout;
 *   - a small GQA shape: every element of q, k, v, out and lse reached through the layout is the element
 *     backend.h puts there (the address each way, for every b, h, s, d);
 *   - packed rows (samples of 1, 2, 7, 33 tokens and one-token padding): one sequence per sample in row order,
 *     the batch rounded to a power of two, each sequence's length and ragged offsets in qkv, out and the
 *     token-major statistics (B T, NH), every token of every sample at its address, the empty sequences at
 *     the end; the statistics' extent is what cuDNN's backward sizes its ragged workspace copies by (tokens x
 *     strides), so no offset reaches past it;
 *   - positions that are not samples end to end and bad shapes refused with a message;
 *   - the kernel choice: SHARDLM_ATTENTION's values, cuDNN missing, older than the headers, built without,
 *     fp32 activations, head sizes cuDNN or the tensor-core kernel refuse, SHARDLM_ATTN_TC=0, misalignment.
 */
#include "backend/sdpa_layout.h"
#include "check.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int64_t at(const struct sdpa_tensor *x, int64_t b, int64_t h, int64_t s, int64_t d)
{
    return x->offset + b * x->stride[0] + h * x->stride[1] + s * x->stride[2] + d * x->stride[3];
}

static int dims_are(const struct sdpa_tensor *x, int64_t b, int64_t h, int64_t s, int64_t d)
{
    return x->dim[0] == b && x->dim[1] == h && x->dim[2] == s && x->dim[3] == d;
}

static int strides_are(const struct sdpa_tensor *x, int64_t b, int64_t h, int64_t s, int64_t d)
{
    return x->stride[0] == b && x->stride[1] == h && x->stride[2] == s && x->stride[3] == d;
}

static void test_llama8b(void)
{
    struct sdpa_layout L;
    char why[256] = "";
    const int rc = sdpa_layout_of(&L, NULL, 2, 2048, 32, 8, 128, NULL, why, sizeof why);
    CHECK("sdpa.8b.ok", rc == 0, "%s", why);
    /* a token's qkv row: (32 + 2 8) 128 = 6144 elements; out's 4096 */
    CHECK("sdpa.8b.batch", L.batch == 2 && L.samples == 2 && L.seq == 2048 && !L.ragged, "batch %lld",
          (long long)L.batch);
    CHECK("sdpa.8b.q", dims_are(&L.q, 2, 32, 2048, 128) && strides_are(&L.q, 2048 * 6144, 128, 6144, 1) &&
          L.q.offset == 0, "q stride %lld %lld %lld", (long long)L.q.stride[0], (long long)L.q.stride[1],
          (long long)L.q.stride[2]);
    CHECK("sdpa.8b.k", dims_are(&L.k, 2, 8, 2048, 128) && strides_are(&L.k, 2048 * 6144, 128, 6144, 1) &&
          L.k.offset == 4096, "k offset %lld", (long long)L.k.offset);
    CHECK("sdpa.8b.v", dims_are(&L.v, 2, 8, 2048, 128) && strides_are(&L.v, 2048 * 6144, 128, 6144, 1) &&
          L.v.offset == 5120, "v offset %lld", (long long)L.v.offset);
    CHECK("sdpa.8b.o", dims_are(&L.o, 2, 32, 2048, 128) && strides_are(&L.o, 2048 * 4096, 128, 4096, 1) &&
          L.o.offset == 0, "o stride %lld", (long long)L.o.stride[0]);
    /* the statistics are cuDNN's packed (b, h, s, 1), which is backend.h's lse (B, NH, T) */
    CHECK("sdpa.8b.stats", dims_are(&L.stats, 2, 32, 2048, 1) && strides_are(&L.stats, 32 * 2048, 2048, 1, 1),
          "stats stride %lld %lld", (long long)L.stats.stride[0], (long long)L.stats.stride[1]);
    CHECK_CLOSE("sdpa.8b.scale", L.scale, 0.08838834764831845, 1e-7, 1e-30);
}

/* Every element through the layout against backend.h's address of it. */
static void test_every_element(void)
{
    enum { B = 3, T = 5, NH = 6, NKV = 2, HS = 8 };
    struct sdpa_layout L;
    char why[256] = "";
    CHECK("sdpa.small.ok", sdpa_layout_of(&L, NULL, B, T, NH, NKV, HS, NULL, why, sizeof why) == 0, "%s", why);
    const int64_t W = (NH + 2 * NKV) * HS;
    long bad = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int d = 0; d < HS; d++) {
                for (int h = 0; h < NH; h++) {
                    bad += at(&L.q, b, h, t, d) != ((int64_t)b * T + t) * W + h * HS + d;
                    bad += at(&L.o, b, h, t, d) != ((int64_t)b * T + t) * NH * HS + h * HS + d;
                    bad += d == 0 && at(&L.stats, b, h, t, 0) != ((int64_t)b * NH + h) * T + t;
                }
                for (int g = 0; g < NKV; g++) {
                    bad += at(&L.k, b, g, t, d) != ((int64_t)b * T + t) * W + (NH + g) * HS + d;
                    bad += at(&L.v, b, g, t, d) != ((int64_t)b * T + t) * W + (NH + NKV + g) * HS + d;
                }
            }
    CHECK("sdpa.small.every_element_at_its_address", bad == 0, "%ld elements elsewhere", bad);
}

static void test_packed(void)
{
    enum { B = 2, T = 48, NH = 4, NKV = 2, HS = 16, MAXS = 64 };
    /* row 0: samples of 1, 2, 7, 33 tokens, then 5 of padding (one more sample); row 1: 40 tokens then eight
     * one-token samples: 5 + 9 = 14 samples, a batch of 16 */
    static const int lens[B][12] = {{1, 2, 7, 33, 5}, {40, 1, 1, 1, 1, 1, 1, 1, 1}};
    int32_t pos[B * T];
    struct { int b, t0, len; } want[32];
    int n = 0;
    for (int b = 0; b < B; b++) {
        int t = 0;
        for (int k = 0; lens[b][k]; k++) {
            want[n++] = (typeof(want[0])){b, t, lens[b][k]};
            for (int i = 0; i < lens[b][k]; i++)
                pos[b * T + t++] = i;
        }
    }
    int32_t seq_len[MAXS];
    int64_t qkv_off[MAXS + 1], o_off[MAXS + 1], stats_off[MAXS + 1];
    struct sdpa_ragged r = {seq_len, qkv_off, o_off, stats_off};
    struct sdpa_layout L;
    char why[256] = "";
    CHECK("sdpa.packed.max_batch", sdpa_layout_max_batch(B, T) == 128 && sdpa_layout_max_batch(1, 1) == 1,
          "%lld", (long long)sdpa_layout_max_batch(B, T));
    CHECK("sdpa.packed.ok", sdpa_layout_of(&L, &r, B, T, NH, NKV, HS, pos, why, sizeof why) == 0, "%s", why);
    CHECK("sdpa.packed.batch", L.ragged && L.samples == 14 && L.batch == 16 && L.seq == T,
          "ragged %d samples %lld batch %lld", L.ragged, (long long)L.samples, (long long)L.batch);
    const int64_t W = (NH + 2 * NKV) * HS;
    long bad = 0;
    for (int s = 0; s < n; s++) {
        bad += seq_len[s] != want[s].len;
        for (int j = 0; j < want[s].len; j++) {
            const int64_t tok = (int64_t)want[s].b * T + want[s].t0 + j;
            for (int h = 0; h < NH; h++)
                for (int d = 0; d < HS; d++) {
                    /* ragged: the sequence's offset takes the place of the batch stride */
                    bad += qkv_off[s] + at(&L.q, 0, h, j, d) != tok * W + h * HS + d;
                    bad += o_off[s] + at(&L.o, 0, h, j, d) != tok * NH * HS + h * HS + d;
                    bad += d == 0 && stats_off[s] + at(&L.stats, 0, h, j, 0) != tok * NH + h; /* token-major */
                }
            for (int g = 0; g < NKV; g++)
                bad += qkv_off[s] + at(&L.v, 0, g, j, 3) != tok * W + (NH + NKV + g) * HS + 3;
        }
    }
    CHECK("sdpa.packed.every_token_at_its_address", bad == 0, "%ld mismatches", bad);
    CHECK("sdpa.packed.first_offsets", qkv_off[0] == 0 && qkv_off[1] == W && qkv_off[2] == 3 * W &&
          qkv_off[5] == T * W && o_off[5] == T * NH * HS && stats_off[5] == T * NH && stats_off[4] == 43 * NH,
          "qkv %lld %lld %lld %lld, stats %lld %lld", (long long)qkv_off[0], (long long)qkv_off[1],
          (long long)qkv_off[2], (long long)qkv_off[5], (long long)stats_off[4], (long long)stats_off[5]);
    /* cudnn-frontend 1.32's ragged_workspace_size: ((tokens - 1) stride_s + (h - 1) stride_h + (d - 1) stride_d
     * + 1) elements; every element a sequence reaches must lie below it */
    const int64_t extent = (B * T - 1) * L.stats.stride[2] + (NH - 1) * L.stats.stride[1] + 1;
    int64_t reach = 0;
    for (int s = 0; s < n; s++) {
        const int64_t last = stats_off[s] + at(&L.stats, 0, NH - 1, want[s].len - 1, 0);
        reach = last > reach ? last : reach;
    }
    CHECK("sdpa.packed.stats_within_cudnn_workspace", reach < extent && reach == B * T * NH - 1,
          "the statistics reach element %lld, cuDNN's ragged copy holds %lld", (long long)reach, (long long)extent);
    CHECK("sdpa.packed.empty_tail", seq_len[14] == 0 && seq_len[15] == 0 && qkv_off[14] == B * T * W &&
          qkv_off[16] == B * T * W && o_off[16] == B * T * NH * HS && stats_off[16] == B * T * NH,
          "len %d %d, off %lld %lld", seq_len[14], seq_len[15], (long long)qkv_off[14], (long long)qkv_off[16]);
    /* one sample a row, as packed rows: B sequences of T, no rounding */
    memset(pos, 0, sizeof pos);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            pos[b * T + t] = t;
    CHECK("sdpa.packed.one_per_row", sdpa_layout_of(&L, &r, B, T, NH, NKV, HS, pos, why, sizeof why) == 0 &&
          L.batch == 2 && seq_len[0] == T && seq_len[1] == T && qkv_off[1] == T * W && qkv_off[2] == 2 * T * W,
          "batch %lld", (long long)L.batch);
}

static void test_refused(void)
{
    int32_t pos[8] = {0, 1, 2, 4, 0, 1, 0, 0}; /* 4 after 2 */
    int32_t seq_len[8];
    int64_t a[9], b[9], c[9];
    struct sdpa_ragged r = {seq_len, a, b, c};
    struct sdpa_layout L;
    char why[256] = "";
    CHECK("sdpa.refuse.gap", sdpa_layout_of(&L, &r, 1, 8, 2, 2, 8, pos, why, sizeof why) == -1 &&
          strstr(why, "row 0 token 3 has position 4"), "why '%s'", why);
    pos[3] = 3;
    pos[4] = 7; /* a row whose token is not 0 or one more */
    CHECK("sdpa.refuse.jump", sdpa_layout_of(&L, &r, 1, 8, 2, 2, 8, pos, why, sizeof why) == -1 &&
          strstr(why, "token 4 has position 7"), "why '%s'", why);
    int32_t first[2] = {1, 2};
    CHECK("sdpa.refuse.first_not_0", sdpa_layout_of(&L, &r, 1, 2, 2, 2, 8, first, why, sizeof why) == -1 &&
          strstr(why, "token 0 has position 1"), "why '%s'", why);
    CHECK("sdpa.refuse.nkv", sdpa_layout_of(&L, NULL, 1, 8, 6, 4, 8, NULL, why, sizeof why) == -1 &&
          strstr(why, "NKV divide NH"), "why '%s'", why);
}

/* text NULL: no reason given (the wanted kernel runs); else the reason holds text. */
static int why_is(const char *why, const char *text) { return text ? strstr(why, text) != NULL : why[0] == 0; }

static void test_choice(void)
{
    enum attn_kernel k;
    CHECK("attn.parse", attn_kernel_parse(NULL, &k) == 0 && k == ATTN_KERNEL_CUDNN &&
          attn_kernel_parse("", &k) == 0 && k == ATTN_KERNEL_CUDNN && attn_kernel_parse("tc", &k) == 0 &&
          k == ATTN_KERNEL_TC && attn_kernel_parse("fp32", &k) == 0 && k == ATTN_KERNEL_FP32 &&
          attn_kernel_parse("cudnn", &k) == 0 && k == ATTN_KERNEL_CUDNN && attn_kernel_parse("tiled", &k) == -1 &&
          attn_kernel_parse("CUDNN", &k) == -1, "parse");
    const struct attn_call ok = {DTYPE_BF16, 128, 1, 1, 91900, 91900, NULL};
    struct attn_call c;
    char why[512];
#define CHOOSE(name, want, edit, expect, text)                                                                  \
    do {                                                                                                        \
        c = ok;                                                                                                 \
        edit;                                                                                                   \
        why[0] = 0;                                                                                             \
        const enum attn_kernel got = attn_kernel_choose(want, &c, why, sizeof why);                            \
        CHECK(name, got == (expect) && why_is(why, (text)), "got %s, why '%s'", \
              attn_kernel_name(got), why);                                                                      \
    } while (0)
    CHOOSE("attn.cudnn", ATTN_KERNEL_CUDNN, (void)0, ATTN_KERNEL_CUDNN, NULL);
    CHOOSE("attn.cudnn_newer_library", ATTN_KERNEL_CUDNN, c.cudnn_version = 92000, ATTN_KERNEL_CUDNN, NULL);
    CHOOSE("attn.cudnn_missing", ATTN_KERNEL_CUDNN, (c.cudnn_version = 0, c.cudnn_missing = "libcudnn.so.9: not found"),
           ATTN_KERNEL_TC, "cudnn wanted, but cuDNN is unavailable: libcudnn.so.9: not found; the tc kernel runs");
    CHOOSE("attn.cudnn_older", ATTN_KERNEL_CUDNN, c.cudnn_version = 90100, ATTN_KERNEL_TC,
           "version 90100, older than the headers the build used (91900)");
    CHOOSE("attn.cudnn_no_headers", ATTN_KERNEL_CUDNN, (c.cudnn_headers = 0, c.cudnn_version = 0), ATTN_KERNEL_TC,
           "cuDNN is unavailable: this binary was built without cudnn-frontend's headers");
    CHOOSE("attn.cudnn_emulated", ATTN_KERNEL_CUDNN,
           (c.cudnn_headers = 0, c.cudnn_version = 0, c.cudnn_missing = "tests/cudaemu does not emulate cuDNN"),
           ATTN_KERNEL_TC, "cuDNN is unavailable: tests/cudaemu does not emulate cuDNN; the tc kernel runs");
    CHOOSE("attn.cudnn_fp32", ATTN_KERNEL_CUDNN, c.act = DTYPE_F32, ATTN_KERNEL_FP32,
           "activations are fp32 (cuDNN's fused attention takes fp16 and bf16); the fp32 kernel runs");
    CHOOSE("attn.cudnn_hs_256", ATTN_KERNEL_CUDNN, c.hs = 256, ATTN_KERNEL_CUDNN, NULL);
    /* 256: cuDNN yes, the tensor-core kernel no (so without cuDNN it is the FP32 kernel) */
    CHOOSE("attn.hs_256_without_cudnn", ATTN_KERNEL_CUDNN, (c.hs = 256, c.cudnn_version = 0), ATTN_KERNEL_FP32,
           "the fp32 kernel runs");
    CHOOSE("attn.cudnn_hs_68", ATTN_KERNEL_CUDNN, c.hs = 68, ATTN_KERNEL_FP32, "head size 68");
    CHOOSE("attn.cudnn_hs_72", ATTN_KERNEL_CUDNN, c.hs = 72, ATTN_KERNEL_CUDNN, NULL);
    CHOOSE("attn.cudnn_hs_80", ATTN_KERNEL_CUDNN, c.hs = 80, ATTN_KERNEL_CUDNN, NULL);
    CHOOSE("attn.cudnn_hs_12", ATTN_KERNEL_CUDNN, c.hs = 12, ATTN_KERNEL_FP32,
           "head size 12 (cuDNN's fused attention takes multiples of 8 up to 256)");
    CHOOSE("attn.tc", ATTN_KERNEL_TC, (void)0, ATTN_KERNEL_TC, NULL);
    CHOOSE("attn.tc_off", ATTN_KERNEL_TC, c.tc_enabled = 0, ATTN_KERNEL_FP32, "SHARDLM_ATTN_TC=0");
    CHOOSE("attn.tc_unaligned", ATTN_KERNEL_TC, c.aligned = 0, ATTN_KERNEL_FP32, "16-byte aligned");
    /* cuDNN has no alignment condition here (its graph build refuses what it cannot take) */
    CHOOSE("attn.cudnn_unaligned", ATTN_KERNEL_CUDNN, c.aligned = 0, ATTN_KERNEL_CUDNN, NULL);
    CHOOSE("attn.fp32", ATTN_KERNEL_FP32, c.act = DTYPE_F32, ATTN_KERNEL_FP32, NULL);
    CHOOSE("attn.fp32_wanted_in_bf16", ATTN_KERNEL_FP32, (void)0, ATTN_KERNEL_FP32, NULL);
    CHOOSE("attn.tc_wanted_skips_cudnn", ATTN_KERNEL_TC, c.hs = 256, ATTN_KERNEL_FP32, "tc wanted");
#undef CHOOSE
    CHECK("attn.names", !strcmp(attn_kernel_name(ATTN_KERNEL_CUDNN), "cudnn") &&
          !strcmp(attn_kernel_name(ATTN_KERNEL_TC), "tc") && !strcmp(attn_kernel_name(ATTN_KERNEL_FP32), "fp32"),
          "names");
}

int main(void)
{
    test_llama8b();
    test_every_element();
    test_packed();
    test_refused();
    test_choice();
    return check_status();
}
