/*
 * zero_quant — the 4-bit base as a parameter source (zero.h,
 * zero_quant4_source): the values of the blocks' linear weights after
 * bitsandbytes' quantization and dequantization (core/quant4), everything else
 * as the inner source gives it.
 *
 * This is the first step of issue 50: a QLoRA run computes with exactly the
 * weights bitsandbytes' Linear4bit computes with, so its loss and adapter
 * gradients are PEFT's over bitsandbytes; the engine still stores, gathers
 * and offloads those weights in the parameter dtype (the memory of a LoRA
 * run). A weight is quantized whole, as bitsandbytes quantizes a tensor (its
 * blocks of 64 and the double quantization's mean run over the whole
 * tensor), so a rank that stores part of it reads all of it, one tensor at a
 * time, and keeps the last one it dequantized for the next range.
 */
#include "zero.h"

#include "core/quant4.h"
#include "core/util.h"

#include <stdlib.h>
#include <string.h>

static void inner_read(const struct quant4_source *q, int u, size_t begin, size_t count, float *out)
{
    if (q->inner)
        q->inner->read(q->inner->ctx, u, begin, count, out);
    else
        model_init_range(q->m, u, begin, count, out);
}

/* Whether tensor t of unit u is a weight bitsandbytes quantizes: a linear
 * layer's weight in a block of the base (Linear4bit replaces every nn.Linear
 * but the LM head; embeddings, norms and biases are not linear weights). */
static bool quantized_tensor(const struct quant4_source *q, int u, int t)
{
    if (q->m->units[u].kind != UNIT_BLOCK || model_is_adapter(q->m, u))
        return false;
    for (int i = 0; i < q->n_linear; i++)
        if (q->linear_tensor[i] == t)
            return true;
    return false;
}

/* q->cache := tensor t of unit u, quantized and dequantized to fp32. */
static void load_tensor(struct quant4_source *q, int u, int t)
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
        quant4_nested_dequantize(qabsmax, nested_absmax, offset, blocks, absmax);
        free(qabsmax);
        free(nested_absmax);
    }
    quant4_dequantize(q->type, codes, absmax, n, q->cache, DTYPE_F32);
    free(codes);
    free(absmax);
    q->cached_unit = u;
    q->cached_tensor = t;
}

static void quant_read(void *ctx, int u, size_t begin, size_t count, float *out)
{
    struct quant4_source *q = ctx;
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

static bool quant_read_as(void *ctx, int u, size_t begin, size_t count, enum dtype dt, void *out,
                          void (*landed)(void *landed_ctx, size_t elems), void *landed_ctx)
{
    struct quant4_source *q = ctx;
    if (q->m->units[u].kind == UNIT_BLOCK && !model_is_adapter(q->m, u))
        return false; /* its weights are not the file's: through quant_read */
    if (!q->inner || !q->inner->read_as)
        return false;
    return q->inner->read_as(q->inner->ctx, u, begin, count, dt, out, landed, landed_ctx);
}

void zero_quant4_source(struct quant4_source *q, const struct model *m, const struct quant_config *qc,
                        const struct param_source *inner)
{
    memset(q, 0, sizeof *q);
    q->src = (struct param_source){quant_read, quant_read_as, q};
    q->inner = inner;
    q->m = m;
    q->type = (enum quant4_type)qc->quant_type;
    q->double_quant = qc->double_quant;
    struct model_linear linear[MODEL_MAX_LINEAR];
    q->n_linear = model_block_linears(m, linear);
    for (int i = 0; i < q->n_linear; i++)
        q->linear_tensor[i] = linear[i].tensor;
    q->cached_unit = q->cached_tensor = -1;
}

void zero_quant4_source_free(struct quant4_source *q)
{
    free(q->cache);
    q->cache = NULL;
    q->cache_cap = 0;
}
