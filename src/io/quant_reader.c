/*
 * quant_reader — the 4-bit base as a reader of a model's values (contract in
 * quant_reader.h): the blocks' linear weights after bitsandbytes'
 * quantization and dequantization (core/quant4), everything else as the
 * inner reader gives it.
 *
 * A QLoRA run computes with exactly the weights bitsandbytes' Linear4bit
 * computes with, so its loss and adapter gradients are PEFT's over
 * bitsandbytes; the engine still stores, gathers and offloads those weights
 * in the parameter dtype (the memory of a LoRA run). export --merge reads
 * the base through the same reader. A weight is quantized whole, as bitsandbytes quantizes a tensor (its
 * blocks of 64 and the double quantization's mean run over the whole
 * tensor), so a rank that stores part of it reads all of it, one tensor at a
 * time, and keeps the last one it dequantized for the next range.
 */
#include "quant_reader.h"

#include "core/quant4.h"
#include "core/util.h"

#include <stdlib.h>
#include <string.h>

static void inner_read(const struct quant_reader *q, int u, size_t begin, size_t count, float *out)
{
    if (q->inner)
        q->inner(q->inner_ctx, u, begin, count, out);
    else
        model_init_range(q->m, u, begin, count, out);
}

/* Whether tensor t of unit u is a weight bitsandbytes quantizes: a linear
 * layer's weight in a block of the base (Linear4bit replaces every nn.Linear
 * but the LM head; embeddings, norms and biases are not linear weights). */
static bool quantized_tensor(const struct quant_reader *q, int u, int t)
{
    if (!quant_reader_quantizes(q, u))
        return false;
    for (int i = 0; i < q->n_linear; i++)
        if (q->linear_tensor[i] == t)
            return true;
    return false;
}

/* q->cache := tensor t of unit u, quantized and dequantized to fp32. */
static void load_tensor(struct quant_reader *q, int u, int t)
{
    if (q->cached_unit == u && q->cached_tensor == t)
        return;
    const struct tensor_desc *td = &q->m->units[u].tensors[t];
    const size_t n = td->numel, blocks = quant4_blocks(n);
    if (q->cache_cap < n) {
        free(q->cache);
        q->cache = xmalloc(n * sizeof(float));
        q->cache_cap = n;
    }
    float *absmax = xmalloc(blocks * sizeof(float));
    uint8_t *codes = xmalloc(quant4_code_bytes(n));
    inner_read(q, u, td->offset, n, q->cache);
    quant4_quantize(q->type, q->cache, DTYPE_F32, n, codes, absmax);
    if (q->double_quant) {
        const size_t nested = quant4_nested_blocks(blocks);
        uint8_t *qabsmax = xmalloc(blocks);
        float *nested_absmax = xmalloc(nested * sizeof(float));
        const float offset = quant4_nested_offset(absmax, blocks);
        quant4_nested_quantize(absmax, blocks, offset, qabsmax, nested_absmax);
        quant4_nested_dequantize(qabsmax, nested_absmax, offset, 0, blocks, absmax);
        free(qabsmax);
        free(nested_absmax);
    }
    quant4_dequantize(q->type, codes, absmax, n, q->cache, DTYPE_F32);
    free(codes);
    free(absmax);
    q->cached_unit = u;
    q->cached_tensor = t;
}

void quant_reader_read_q4(struct quant_reader *q, int u, int t, size_t first, size_t n,
                          const struct quant4_range *out)
{
    const size_t numel = q->m->units[u].tensors[t].numel, blocks = quant4_blocks(numel);
    const int rank = q->comm ? q->comm->rank : 0, world = q->comm ? q->comm->world : 1;
    const size_t per_rank = (blocks + (size_t)world - 1) / (size_t)world;
    const size_t want_first = (size_t)rank * per_rank * QUANT4_BLOCK;
    const size_t want_n = want_first >= numel ? 0 : numel - want_first < per_rank * QUANT4_BLOCK
                                                       ? numel - want_first : per_rank * QUANT4_BLOCK;
    if (!quantized_tensor(q, u, t) || n != want_n || (n && first != want_first) || (out->qabsmax && !q->double_quant))
        fail_internal("quant_reader: unit %d tensor %d elements [%zu, +%zu) are not rank %d's blocks of a quantized "
                      "weight", u, t, first, n, rank);
    free(q->range_values);
    q->range_values = xmalloc((n ? n : 1) * sizeof(float));
    const size_t own = quant4_blocks(n);
    float *mine = xcalloc(per_rank ? per_rank : 1, sizeof *mine); /* this rank's absmax, padded to per_rank */
    if (n) {
        inner_read(q, u, q->m->units[u].tensors[t].offset + first, n, q->range_values);
        quant4_quantize(q->type, q->range_values, DTYPE_F32, n, out->codes, mine);
    }
    if (q->double_quant) { /* the offset and nested blocks run over the whole tensor's absmax */
        float *all = xcalloc((size_t)world * per_rank + 1, sizeof *all);
        if (q->comm && world > 1)
            comm_allgather(q->comm, mine, all, per_rank, COMM_F32, NULL);
        else
            memcpy(all, mine, blocks * sizeof *all);
        uint8_t *qabsmax = xmalloc(blocks);
        float *nested_absmax = xmalloc(quant4_nested_blocks(blocks) * sizeof(float));
        const float offset = quant4_nested_offset(all, blocks);
        const size_t b0 = first / QUANT4_BLOCK;
        quant4_nested_quantize(all, blocks, offset, qabsmax, nested_absmax);
        quant4_nested_dequantize(qabsmax, nested_absmax, offset, 0, blocks, all);
        memcpy(mine, all + b0, own * sizeof *mine);
        if (out->qabsmax) { /* bitsandbytes' nested form of this rank's blocks */
            memcpy(out->qabsmax, qabsmax + b0, own);
            memcpy(out->nested_absmax, nested_absmax + b0 / QUANT4_NESTED_BLOCK,
                   quant4_nested_touched(b0, own) * sizeof(float));
            *out->offset = offset;
        }
        free(qabsmax);
        free(nested_absmax);
        free(all);
    }
    if (n) {
        if (out->absmax)
            memcpy(out->absmax, mine, own * sizeof *mine);
        quant4_dequantize(q->type, out->codes, mine, n, q->range_values, DTYPE_F32);
    }
    free(mine);
    q->range_unit = u;
    q->range_tensor = t;
    q->range_first = first;
    q->range_n = n;
}

bool quant_reader_quantizes(const struct quant_reader *q, int u)
{
    return q->m->units[u].kind == UNIT_BLOCK && !model_is_adapter(q->m, u);
}

void quant_reader_read(void *ctx, int u, size_t begin, size_t count, float *out)
{
    struct quant_reader *q = ctx;
    inner_read(q, u, begin, count, out);
    const struct unit_desc *ud = &q->m->units[u];
    const size_t end = begin + count;
    for (int t = 0; t < ud->n_tensors; t++) {
        const struct tensor_desc *td = &ud->tensors[t];
        const size_t lo = begin > td->offset ? begin : td->offset;
        const size_t hi = end < td->offset + td->numel ? end : td->offset + td->numel;
        if (lo >= hi || !quantized_tensor(q, u, t))
            continue;
        const size_t r_lo = td->offset + q->range_first;
        if (q->range_unit == u && q->range_tensor == t && lo >= r_lo && hi <= r_lo + q->range_n) {
            memcpy(out + (lo - begin), q->range_values + (lo - r_lo), (hi - lo) * sizeof(float));
            continue; /* read_q4's range (a 4-bit unit's share): not the whole tensor */
        }
        load_tensor(q, u, t);
        memcpy(out + (lo - begin), q->cache + (lo - td->offset), (hi - lo) * sizeof(float));
    }
}

void quant_reader_init(struct quant_reader *q, const struct model *m, const struct quant_config *qc,
                       void (*inner)(void *ctx, int u, size_t begin, size_t count, float *out), void *inner_ctx)
{
    memset(q, 0, sizeof *q);
    q->inner = inner;
    q->inner_ctx = inner_ctx;
    q->m = m;
    q->type = (enum quant4_type)qc->quant_type;
    q->double_quant = qc->double_quant;
    struct model_linear linear[MODEL_MAX_LINEAR];
    q->n_linear = model_block_linears(m, linear);
    for (int i = 0; i < q->n_linear; i++)
        q->linear_tensor[i] = linear[i].tensor;
    q->cached_unit = q->cached_tensor = -1;
    q->range_unit = q->range_tensor = -1;
}

void quant_reader_free(struct quant_reader *q)
{
    free(q->cache);
    free(q->range_values);
    q->range_values = NULL;
    q->cache = NULL;
    q->cache_cap = 0;
}
