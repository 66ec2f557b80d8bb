/*
 * zero_q4 — a frozen block's linear weights stored and gathered in 4 bits
 * (quantization.load_in_4bit, issue 50; see zero.h, struct q4_layout).
 *
 * bitsandbytes quantizes a weight flat, in blocks of 64 from its first
 * element, so each quantized tensor is sharded by whole blocks: of its B
 * blocks rank r holds [r b, min(B, (r + 1) b)), b = ceil(B / N), as packed
 * codes (32 bytes a block) and one fp32 absmax per block, or with double
 * quantization bitsandbytes' nested form: one byte per block, and beside
 * them the fp32 nested absmax of every group of 256 blocks the rank's
 * blocks touch and the tensor's fp32 offset. The ranks' ranges need no
 * alignment to 256 blocks (a group cut by a rank boundary is carried by both
 * ranks, one fp32 more each); the values are bitsandbytes' own either way.
 * Everything else of the unit
 * (norms, alignment gaps) is the "plain" part: the unit's other elements in
 * unit order, padded to N * MODEL_TENSOR_ALIGN and sharded by elements in the
 * parameter dtype, as a whole unit is. A rank's shard is those pieces one
 * after the other; the all-gather puts the N shards side by side, and
 * zero_q4_expand writes the unit's values into the compute slot, in the
 * layout the kernels read, rank by rank.
 */
#include "zero_internal.h"

#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/quant4.h"
#include "core/util.h"

/* A rank's shard is padded to this many bytes (the all-gather moves fp32 words). */
#define Q4_SHARD_ALIGN 16

/* One rank's bytes of quantized tensor i: codes, then the absmax or the nested form (a multiple of 4). */
static size_t q4_tensor_bytes(const struct q4_layout *q, int i)
{
    const size_t codes = q->blocks[i] * (QUANT4_BLOCK / 2);
    if (!q->double_quant)
        return codes + q->blocks[i] * sizeof(float);
    return codes + round_up(q->blocks[i], sizeof(float)) + (q->nested[i] + 1) * sizeof(float);
}

/* Quantized tensor i's pieces in one rank's shard. */
static struct quant4_range q4_range(const struct q4_layout *q, const uint8_t *shard, int i)
{
    uint8_t *codes = (uint8_t *)shard + q->at[i];
    uint8_t *stats = codes + q->blocks[i] * (QUANT4_BLOCK / 2);
    if (!q->double_quant)
        return (struct quant4_range){codes, (float *)stats, NULL, NULL, NULL};
    float *nested = (float *)(stats + round_up(q->blocks[i], sizeof(float)));
    return (struct quant4_range){codes, NULL, stats, nested, nested + q->nested[i]};
}

/* Rank r's elements of quantized tensor i: [*first, *first + return). */
static size_t q4_rank_elems(const struct q4_layout *q, const struct tensor_desc *td, int i, int r, size_t *first)
{
    *first = (size_t)r * q->blocks[i] * QUANT4_BLOCK;
    if (*first >= td->numel)
        return 0;
    return td->numel - *first < q->blocks[i] * QUANT4_BLOCK ? td->numel - *first : q->blocks[i] * QUANT4_BLOCK;
}

bool zero_q4_unit(const struct model *m, const struct config *cfg, int u, bool sharded)
{
    /* from a 4-bit directory too: its codes and statistics are copied (io/hf_bnb hf_bnb_read_q4) */
    return cfg->quant.load_in_4bit && sharded && m->units[u].frozen &&
           m->units[u].kind == UNIT_BLOCK && !model_is_adapter(m, u);
}

void zero_q4_layout(const struct model *m, const struct config *cfg, int u, int world, size_t esize,
                    struct q4_layout *q)
{
    memset(q, 0, sizeof *q);
    q->type = cfg->quant.quant_type;
    struct model_linear linear[MODEL_MAX_LINEAR];
    const int n_linear = model_block_linears(m, linear);
    const struct unit_desc *ud = &m->units[u];
    /* the quantized tensors in unit order (their offsets ascending) */
    for (int t = 0; t < ud->n_tensors; t++)
        for (int i = 0; i < n_linear; i++)
            if (linear[i].tensor == t)
                q->tensor[q->n++] = t;
    q->double_quant = cfg->quant.double_quant;
    size_t at = 0, quantized = 0;
    for (int i = 0; i < q->n; i++) {
        const size_t blocks = quant4_blocks(ud->tensors[q->tensor[i]].numel);
        q->blocks[i] = (blocks + (size_t)world - 1) / (size_t)world;
        q->nested[i] = 0;
        for (int r = 0; q->double_quant && r < world; r++) { /* the most nested blocks one rank's blocks touch */
            const size_t first = (size_t)r * q->blocks[i];
            const size_t own = first >= blocks ? 0 : blocks - first < q->blocks[i] ? blocks - first : q->blocks[i];
            const size_t touched = quant4_nested_touched(first, own);
            q->nested[i] = touched > q->nested[i] ? touched : q->nested[i];
        }
        q->at[i] = at;
        at += q4_tensor_bytes(q, i);
        quantized += ud->tensors[q->tensor[i]].numel;
    }
    q->plain_at = at;
    q->plain_elems = round_up(ud->numel - quantized, (size_t)world * MODEL_TENSOR_ALIGN) / (size_t)world;
    q->shard_bytes = round_up(at + q->plain_elems * esize, Q4_SHARD_ALIGN);
}

/* Calls piece(ctx, unit element, plain element, n) for the unit's plain
 * elements [pbegin, pbegin + count) (unit order, quantized tensors left
 * out); the padding beyond the unit's numel is not visited. */
static void plain_pieces(const struct model *m, int u, const struct q4_layout *q, size_t pbegin, size_t count,
                         void (*piece)(void *ctx, size_t unit_at, size_t plain_at, size_t n), void *ctx)
{
    const struct unit_desc *ud = &m->units[u];
    size_t unit_at = 0, plain_at = 0;
    const size_t pend = pbegin + count;
    for (int i = 0; i <= q->n && plain_at < pend; i++) {
        /* the plain run before quantized tensor i (after the last one: up to numel) */
        const size_t run_end = i < q->n ? ud->tensors[q->tensor[i]].offset : ud->numel;
        const size_t run = run_end - unit_at;
        const size_t lo = pbegin > plain_at ? pbegin : plain_at;
        const size_t hi = pend < plain_at + run ? pend : plain_at + run;
        if (lo < hi)
            piece(ctx, unit_at + (lo - plain_at), lo, hi - lo);
        plain_at += run;
        if (i < q->n)
            unit_at = run_end + ud->tensors[q->tensor[i]].numel;
    }
}

/* ---- reading this rank's shard ------------------------------------------------ */

struct plain_read {
    const struct param_source *src; /* NULL: the seeded init */
    const struct model *m;
    int u;
    size_t pbegin;
    float *out; /* fp32, the rank's plain elements */
};

static void plain_read_piece(void *ctx, size_t unit_at, size_t plain_at, size_t n)
{
    struct plain_read *r = ctx;
    float *out = r->out + (plain_at - r->pbegin);
    if (r->src)
        r->src->read(r->src->ctx, r->u, unit_at, n, out);
    else
        model_init_range(r->m, r->u, unit_at, n, out);
}

void zero_q4_read_shard(struct zero *z, const struct param_source *src, int u, float *scratch, void *host_shard)
{
    const struct model *m = z->model;
    const struct q4_layout *q = &z->units[u].q4;
    const struct unit_desc *ud = &m->units[u];
    uint8_t *shard = host_shard;
    memset(shard, 0, q->shard_bytes);
    for (int i = 0; i < q->n; i++) {
        const struct tensor_desc *td = &ud->tensors[q->tensor[i]];
        size_t first;
        const size_t n = q4_rank_elems(q, td, i, z->rank, &first);
        const struct quant4_range range = q4_range(q, shard, i);
        if (!src || !src->read_q4)
            fail_internal("unit %d: a 4-bit unit needs a source of 4-bit weights (session_base_source)", u);
        /* every rank, even one without blocks of the tensor (collective with double quantization); then the
         * values, for the sources that look at them (the base's checksum: read_q4 keeps them) */
        src->read_q4(src->ctx, u, q->tensor[i], first, n, &range);
        if (n)
            src->read(src->ctx, u, td->offset + first, n, scratch);
    }
    const size_t pbegin = (size_t)z->rank * q->plain_elems;
    memset(scratch, 0, q->plain_elems * sizeof *scratch);
    struct plain_read r = {src, m, u, pbegin, scratch};
    plain_pieces(m, u, q, pbegin, q->plain_elems, plain_read_piece, &r);
    dtype_convert(shard + q->plain_at, z->dtype, scratch, DTYPE_F32, q->plain_elems);
}

/* ---- the gathered unit, expanded --------------------------------------------- */

struct plain_expand {
    void *out;
    enum dtype out_dt;
    const uint8_t *plain; /* one rank's plain slice (parameter dtype) */
    size_t pbegin;
    enum dtype dt;
    bool host;
};

static void plain_expand_piece(void *ctx, size_t unit_at, size_t plain_at, size_t n)
{
    struct plain_expand *e = ctx;
    const size_t osize = (size_t)dtype_size(e->out_dt), isize = (size_t)dtype_size(e->dt);
    void *dst = (char *)e->out + unit_at * osize;
    const void *src = e->plain + (plain_at - e->pbegin) * isize;
    if (e->host)
        dtype_convert(dst, e->out_dt, src, e->dt, n);
    else
        backend_convert(dst, e->out_dt, src, e->dt, n);
}

void zero_q4_expand(const struct zero *z, int u, const void *gathered, void *out, enum dtype out_dt, bool host)
{
    const struct model *m = z->model;
    const struct q4_layout *q = &z->units[u].q4;
    const struct unit_desc *ud = &m->units[u];
    const size_t osize = (size_t)dtype_size(out_dt);
    for (int r = 0; r < z->world; r++) {
        const uint8_t *shard = (const uint8_t *)gathered + (size_t)r * q->shard_bytes;
        for (int i = 0; i < q->n; i++) {
            const struct tensor_desc *td = &ud->tensors[q->tensor[i]];
            size_t first;
            const size_t n = q4_rank_elems(q, td, i, r, &first);
            if (!n)
                continue;
            const struct quant4_range p = q4_range(q, shard, i);
            void *dst = (char *)out + (td->offset + first) * osize;
            if (host) /* a checkpoint's or an export's gather: backend_dequant4's work in host memory */
                quant4_dequantize_stored((enum quant4_type)q->type, p.codes, p.absmax, p.qabsmax, p.nested_absmax,
                                         p.qabsmax ? *p.offset : 0.0f, first / QUANT4_BLOCK, n, dst, out_dt);
            else
                backend_dequant4(dst, out_dt, p.codes, p.absmax, p.qabsmax, p.nested_absmax, p.offset,
                                 first / QUANT4_BLOCK, n, q->type);
        }
        struct plain_expand e = {out, out_dt, shard + q->plain_at, (size_t)r * q->plain_elems, z->dtype, host};
        plain_pieces(m, u, q, e.pbegin, q->plain_elems, plain_expand_piece, &e);
    }
}
