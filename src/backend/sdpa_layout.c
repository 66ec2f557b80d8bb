/*
 * sdpa_layout — backend.h's attention as cuDNN's SDPA sees it, and the kernel choice (sdpa_layout.h).
 */
#include "sdpa_layout.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static void tensor_set(struct sdpa_tensor *x, int64_t b, int64_t h, int64_t s, int64_t d, int64_t sb, int64_t sh,
                       int64_t ss, int64_t sd, int64_t offset)
{
    const int64_t dim[4] = {b, h, s, d}, stride[4] = {sb, sh, ss, sd};
    memcpy(x->dim, dim, sizeof dim);
    memcpy(x->stride, stride, sizeof stride);
    x->offset = offset;
}

/* The smallest power of two >= n (n >= 1). */
static int64_t pow2_at_least(int64_t n)
{
    int64_t p = 1;
    while (p < n)
        p *= 2;
    return p;
}

int64_t sdpa_layout_max_batch(int B, int T) { return pow2_at_least((int64_t)B * T); }

/* Counts the samples of the packed rows, checking that pos is samples laid end to end (backend.h); -1 if not. */
static int64_t count_samples(const int32_t *pos, int B, int T, char *why, size_t why_cap)
{
    int64_t n = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const int32_t p = pos[(size_t)b * T + t];
            if (p == 0) {
                n++;
                continue;
            }
            if (t == 0 || p != pos[(size_t)b * T + t - 1] + 1) {
                snprintf(why, why_cap,
                         "packed positions: row %d token %d has position %d, where a sample's first token has 0 and "
                         "the next ones count up by 1; fix the data loader's pos",
                         b, t, (int)p);
                return -1;
            }
        }
    return n;
}

int sdpa_layout_of(struct sdpa_layout *L, struct sdpa_ragged *r, int B, int T, int NH, int NKV, int hs,
                   const int32_t *pos, char *why, size_t why_cap)
{
    if (B < 1 || T < 1 || NH < 1 || NKV < 1 || hs < 1 || NH % NKV != 0) {
        snprintf(why, why_cap,
                 "attention shape B %d T %d NH %d NKV %d hs %d: every one must be positive and NKV divide NH", B, T,
                 NH, NKV, hs);
        return -1;
    }
    memset(L, 0, sizeof *L);
    const int64_t W = (int64_t)(NH + 2 * NKV) * hs, OW = (int64_t)NH * hs;
    L->seq = T;
    L->scale = 1.0f / sqrtf((float)hs);
    L->batch = L->samples = B;
    if (pos) {
        const int64_t n = count_samples(pos, B, T, why, why_cap);
        if (n < 0)
            return -1;
        L->ragged = 1;
        L->samples = n;
        L->batch = pow2_at_least(n);
    }
    /* The batch strides are those of a whole row; with ragged offsets cuDNN takes each sequence's start from
     * the offsets instead. */
    tensor_set(&L->q, L->batch, NH, T, hs, T * W, hs, W, 1, 0);
    tensor_set(&L->k, L->batch, NKV, T, hs, T * W, hs, W, 1, (int64_t)NH * hs);
    tensor_set(&L->v, L->batch, NKV, T, hs, T * W, hs, W, 1, (int64_t)(NH + NKV) * hs);
    tensor_set(&L->o, L->batch, NH, T, hs, T * OW, hs, OW, 1, 0);
    if (!pos) {
        tensor_set(&L->stats, L->batch, NH, T, 1, (int64_t)NH * T, T, 1, 1, 0);
        return 0;
    }
    /* packed: token-major (B T, NH), cuDNN's ragged statistics (sdpa_layout.h) */
    tensor_set(&L->stats, L->batch, NH, T, 1, (int64_t)T * NH, 1, NH, 1, 0);
    /* One sequence per sample, in row order; row b's sample starting at token t0 = its token tok = b T + t0 has
     * its tokens at tok W in qkv, tok NH hs in out, and its statistics at tok NH in the token-major copy. */
    int64_t s = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            if (pos[(size_t)b * T + t] != 0)
                continue;
            int len = 1;
            while (t + len < T && pos[(size_t)b * T + t + len] != 0)
                len++;
            const int64_t tok = (int64_t)b * T + t;
            r->seq_len[s] = len;
            r->qkv_off[s] = tok * W;
            r->o_off[s] = tok * OW;
            r->stats_off[s] = tok * NH;
            s++;
        }
    /* The rounding's empty sequences, and the end: where the last sample ends. */
    const int64_t tokens = (int64_t)B * T;
    for (; s <= L->batch; s++) {
        if (s < L->batch)
            r->seq_len[s] = 0;
        r->qkv_off[s] = tokens * W;
        r->o_off[s] = tokens * OW;
        r->stats_off[s] = tokens * NH;
    }
    return 0;
}

const char *attn_kernel_name(enum attn_kernel k)
{
    static const char *const names[ATTN_KERNEL_COUNT] = {"cudnn", "tc", "fp32"};
    return k >= 0 && k < ATTN_KERNEL_COUNT ? names[k] : "?";
}

int attn_kernel_parse(const char *env, enum attn_kernel *want)
{
    if (!env || !*env) {
        *want = ATTN_KERNEL_CUDNN;
        return 0;
    }
    for (int k = 0; k < ATTN_KERNEL_COUNT; k++)
        if (strcmp(env, attn_kernel_name((enum attn_kernel)k)) == 0) {
            *want = (enum attn_kernel)k;
            return 0;
        }
    return -1;
}

/* Why kernel k cannot take call c, or NULL when it can; the message goes into buf. */
static const char *refusal(enum attn_kernel k, const struct attn_call *c, char *buf, size_t cap)
{
    const int half = c->act == DTYPE_F16 || c->act == DTYPE_BF16;
    switch (k) {
    case ATTN_KERNEL_CUDNN:
        if (!c->cudnn_version)
            snprintf(buf, cap, "cuDNN is unavailable: %s",
                     c->cudnn_missing ? c->cudnn_missing
                     : c->cudnn_headers ? "its library is not loaded"
                                        : "this binary was built without cudnn-frontend's headers");
        else if (c->cudnn_version < c->cudnn_headers)
            snprintf(buf, cap, "the cuDNN library is version %ld, older than the headers the build used (%ld)",
                     c->cudnn_version, c->cudnn_headers);
        else if (!half)
            snprintf(buf, cap, "activations are %s (cuDNN's fused attention takes fp16 and bf16)",
                     dtype_name(c->act));
        else if (c->hs % SDPA_HS_MULTIPLE != 0 || c->hs > SDPA_MAX_HS)
            snprintf(buf, cap, "head size %d (cuDNN's fused attention takes multiples of %d up to %d)", c->hs,
                     SDPA_HS_MULTIPLE, SDPA_MAX_HS);
        else
            return NULL;
        return buf;
    case ATTN_KERNEL_TC:
        if (!c->tc_enabled)
            snprintf(buf, cap, "SHARDLM_ATTN_TC=0 turns the tensor-core kernel off");
        else if (!half)
            snprintf(buf, cap, "activations are %s (the tensor-core kernel takes fp16 and bf16)", dtype_name(c->act));
        else if (c->hs % 16 != 0 || c->hs > 128)
            snprintf(buf, cap, "head size %d (the tensor-core kernel takes multiples of 16 up to 128)", c->hs);
        else if (!c->aligned)
            snprintf(buf, cap, "a tensor is not 16-byte aligned (the tensor-core kernel's staging copies)");
        else
            return NULL;
        return buf;
    default:
        return NULL; /* the FP32 kernel takes every call */
    }
}

enum attn_kernel attn_kernel_choose(enum attn_kernel want, const struct attn_call *c, char *why, size_t why_cap)
{
    char first[256], reason[256];
    const char *wanted_no = refusal(want, c, first, sizeof first);
    if (!wanted_no)
        return want;
    enum attn_kernel run = ATTN_KERNEL_FP32;
    for (int k = want + 1; k < ATTN_KERNEL_COUNT; k++)
        if (!refusal((enum attn_kernel)k, c, reason, sizeof reason)) {
            run = (enum attn_kernel)k;
            break;
        }
    if (why && why_cap)
        snprintf(why, why_cap, "attention: %s wanted, but %s; the %s kernel runs", attn_kernel_name(want), wanted_no,
                 attn_kernel_name(run));
    return run;
}
