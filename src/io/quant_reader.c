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
    free(q->codes);
    free(q->absmax);
    float *absmax = q->absmax = xmalloc(blocks * sizeof(float));
    uint8_t *codes = q->codes = xmalloc(quant4_code_bytes(n));
    inner_read(q, u, td->offset, n, q->cache);
    quant4_quantize(q->type, q->cache, DTYPE_F32, n, codes, absmax);
    if (q->double_quant) {
        const size_t nested = quant4_nested_blocks(blocks);
        uint8_t *qabsmax = xmalloc(blocks);
        float *nested_absmax = xmalloc(nested * sizeof(float));
        const float offset = quant4_nested_offset(absmax, blocks);
        quant4_nested_quantize(absmax, blocks, offset, qabsmax, nested_absmax);
        quant4_nested_dequantize(qabsmax, nested_absmax, offset, blocks, absmax);
        free(qabsmax);
        free(nested_absmax);
    }
    quant4_dequantize(q->type, codes, absmax, n, q->cache, DTYPE_F32);
    q->cached_unit = u;
    q->cached_tensor = t;
}

void quant_reader_read_q4(struct quant_reader *q, int u, int t, size_t first, size_t n, uint8_t *codes,
                          float *absmax)
{
    if (!quantized_tensor(q, u, t) || first % QUANT4_BLOCK || first + n > q->m->units[u].tensors[t].numel)
        fail_internal("quant_reader: unit %d tensor %d elements [%zu, +%zu) are not whole blocks of a quantized weight",
                      u, t, first, n);
    load_tensor(q, u, t);
    memcpy(codes, q->codes + first / 2, quant4_code_bytes(n));
    memcpy(absmax, q->absmax + first / QUANT4_BLOCK, quant4_blocks(n) * sizeof(float));
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
}

void quant_reader_free(struct quant_reader *q)
{
    free(q->cache);
    free(q->codes);
    free(q->absmax);
    q->codes = NULL;
    q->absmax = NULL;
    q->cache = NULL;
    q->cache_cap = 0;
}
