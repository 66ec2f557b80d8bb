/*
 * sdpa_layout — how backend.h's attention maps onto cuDNN's fused SDPA (issue 45), and which attention kernel
 * a CUDA call runs. Plain C, so that both are unit-tested on a machine without a GPU (tests/unit/test_sdpa_layout.c);
 * the CUDA backend (cuda/cudnn_attention.cu, cuda/cuda_attention.cu) is their only other caller.
 *
 * The layout. cuDNN's SDPA takes Q, K, V, O (and dO, dQ, dK, dV) as 4-D tensors (b, h, s, d) of any strides,
 * and the rows' softmax statistics (b, h, s, 1) fp32. backend.h keeps q, k and v interleaved in one qkv [A]
 * (B, T, (NH + 2 NKV) hs), so each of them is a strided view of it, with no permute copy: a token's row is
 * W = (NH + 2 NKV) hs elements, a head hs, and K and V start NH hs and (NH + NKV) hs elements into it. out and
 * dout are (B, T, NH hs); the log-sum-exp is (B, NH, T), which is cuDNN's packed (b, h, s, 1) statistics tensor,
 * natural log, as the tensor-core and FP32 kernels keep it, so that any backward can follow any forward.
 * Grouped-query attention is cuDNN's h_k = h_v = NKV < h_q = NH (query head h reads kv head h / (NH / NKV), as
 * backend.h says). Causal is the top-left diagonal with right bound 0.
 *
 * Packed rows (backend.h: pos, each sample its own sequence). cuDNN has no block-diagonal mask; instead every
 * sample becomes a sequence of its own: the tensors get ragged offsets (element offsets of each sequence's first
 * token, one array per tensor, batch + 1 entries) and the padding mask gets each sequence's length. The batch
 * is the number of samples rounded up to a power of two (at least B), so that a run of micro-batches with
 * varying sample counts builds a handful of graphs, not one per micro-batch; the sequences past the samples
 * have length 0 and start where the last sample ends. s stays T (a sample is at most T tokens). The statistics
 * of packed rows are token-major, (B T, NH) (token tok's head h at tok NH + h), cuDNN's ragged layout: its
 * backward sizes its own workspace copies of a ragged tensor as tokens x the tensor's strides, so lse's
 * head-major (B, NH, T) under ragged offsets would overrun them. The CUDA backend keeps them in a token-major
 * buffer and transposes to and from lse around cuDNN's calls (cuda_attention.cu), so lse stays backend.h's.
 *
 * The choice. SHARDLM_ATTENTION=cudnn|tc|fp32 (unset: cudnn) names the kernel a test wants; what runs is the
 * first of cuDNN, the tensor-core kernel (attention_tc.h) and the FP32 kernel that applies, with the reason
 * why a preferred one does not, which the backend logs once.
 */
#ifndef SHARDLM_SDPA_LAYOUT_H
#define SHARDLM_SDPA_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

/* One operand as cuDNN sees it: dims and strides in cuDNN's (b, h, s, d) order, in elements, and where its
 * element 0 is, in elements from the tensor's base pointer (qkv for q, k, v; out for o; the statistics). */
struct sdpa_tensor {
    int64_t dim[4], stride[4];
    int64_t offset;
};

struct sdpa_layout {
    int64_t batch;   /* cuDNN's b: B, or the packed samples rounded up to a power of two */
    int64_t samples; /* sequences that hold tokens (B without packing) */
    int64_t seq;     /* s_q = s_kv = T */
    int ragged;      /* 1: packed rows, with the arrays below */
    float scale;     /* 1 / sqrt(hs) */
    struct sdpa_tensor q, k, v; /* views of qkv, and of dqkv for the gradients */
    struct sdpa_tensor o;       /* out, and dout */
    struct sdpa_tensor stats;   /* lse (B, NH, T) fp32; packed: its token-major copy (B T, NH) */
};

/* The packed rows' arrays (ragged only), batch entries of seq_len and batch + 1 of each offset array, in
 * elements: qkv_off (q, k, v and their gradients, each offset further by its tensor's .offset), o_off (out,
 * dout) and stats_off (the token-major statistics). Caller-owned, at least sdpa_layout_max_batch(B, T) (+ 1) entries each. */
struct sdpa_ragged {
    int32_t *seq_len;
    int64_t *qkv_off, *o_off, *stats_off;
};

/* The most sequences a packed micro-batch of B rows of T tokens can have, rounded as the layout rounds. */
int64_t sdpa_layout_max_batch(int B, int T);

/* Fills L for B rows of T tokens, NH query and NKV key/value heads of hs channels. pos: host memory, (B, T)
 * each token's position in its sample (backend.h), or NULL (one sequence a row: no ragged arrays, r unused).
 * Returns 0, or -1 with why (a message naming the problem) when pos is not samples laid end to end or a
 * shape is not positive, NKV does not divide NH. */
int sdpa_layout_of(struct sdpa_layout *L, struct sdpa_ragged *r, int B, int T, int NH, int NKV, int hs,
                   const int32_t *pos, char *why, size_t why_cap);

enum attn_kernel { ATTN_KERNEL_CUDNN = 0, ATTN_KERNEL_TC, ATTN_KERNEL_FP32, ATTN_KERNEL_COUNT };

/* "cudnn", "tc", "fp32". */
const char *attn_kernel_name(enum attn_kernel k);

/* What decides the kernel of one attention call. */
struct attn_call {
    enum dtype act;       /* the activation dtype */
    int hs;               /* head size */
    int aligned;          /* every tensor 16-byte aligned (the tensor-core kernel's staging copies) */
    int tc_enabled;       /* SHARDLM_ATTN_TC is not 0 */
    long cudnn_version;   /* the loaded library's cudnnGetVersion(), 0: none (cuDNN unavailable) */
    long cudnn_headers;   /* CUDNN_VERSION the build was compiled against, 0: built without cuDNN */
    const char *cudnn_missing; /* why cuDNN is unavailable (cudnn_version 0), or NULL */
};

/* The head sizes cuDNN's SDPA takes for fp16/bf16 on sm_80/sm_90: multiples of 8 up to 256 (the cuDNN
 * developer guide's support surface for the fused flash attention). */
#define SDPA_MAX_HS 256
#define SDPA_HS_MULTIPLE 8

/* Parses SHARDLM_ATTENTION's value (NULL or empty: cudnn) into *want; -1 when it names no CUDA kernel. */
int attn_kernel_parse(const char *env, enum attn_kernel *want);

/* The kernel that runs for call c when want is asked for: want if it applies, else the next of cudnn, tc, fp32
 * that does, with why (one line: what was wanted and why it does not apply) filled when the answer is not
 * want. */
enum attn_kernel attn_kernel_choose(enum attn_kernel want, const struct attn_call *c, char *why, size_t why_cap);

#endif
