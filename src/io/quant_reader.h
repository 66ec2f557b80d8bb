/*
 * quant_reader — a model's values with the blocks' linear weights as
 * bitsandbytes' 4-bit makes them (quantization.load_in_4bit, issue 50): each
 * such weight read whole from the inner reader, quantize_4bit'd and
 * dequantize_4bit'd (core/quant4: the type and double quantization of the
 * config) to fp32, then the asked range copied out; every other value as the
 * inner reader gives it. bitsandbytes quantizes a tensor whole (its blocks
 * and its double quantization's mean run over all of it), so a reader of a
 * range reads its whole tensor, one tensor at a time; the last one is kept
 * for the next range.
 *
 * Callers: engine/session (the run's parameter source) and io/lora_merge
 * (export --merge of a QLoRA checkpoint).
 */
#ifndef SHARDLM_QUANT_READER_H
#define SHARDLM_QUANT_READER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/options.h"
#include "model/model.h"

struct quant_reader {
    void (*inner)(void *ctx, int u, size_t begin, size_t count, float *out); /* NULL: the seeded init */
    void *inner_ctx;
    const struct model *m;
    int type;                              /* enum quant4_type */
    bool double_quant;
    int n_linear;                          /* the block's linear weights (model_block_linears) */
    int linear_tensor[MODEL_MAX_LINEAR];   /* their tensor indices in a block unit */
    int cached_unit, cached_tensor;        /* the tensor in cache, -1: none */
    float *cache;                          /* (numel) that tensor dequantized */
    uint8_t *codes;                        /* its packed codes ((numel + 1) / 2 bytes) */
    float *absmax;                         /* its absmax as dequantization uses it (after double quantization) */
    size_t cache_cap;
};

void quant_reader_init(struct quant_reader *q, const struct model *m, const struct quant_config *qc,
                       void (*inner)(void *ctx, int u, size_t begin, size_t count, float *out), void *inner_ctx);
void quant_reader_free(struct quant_reader *q);
/* fp32 values of unit u's elements [begin, begin + count) (ctx: the reader). */
void quant_reader_read(void *ctx, int u, size_t begin, size_t count, float *out);
/* Tensor t of unit u (a weight the reader quantizes), its elements
 * [first, first + n) (first a multiple of QUANT4_BLOCK): packed codes
 * ((n + 1) / 2 bytes) and the fp32 absmax its dequantization uses (one per
 * block; with double quantization the dequantized absmax), bit for bit what
 * quant_reader_read's values are made of. */
void quant_reader_read_q4(struct quant_reader *q, int u, int t, size_t first, size_t n, uint8_t *codes,
                          float *absmax);
/* Whether unit u holds weights the reader quantizes (a block of the base). */
bool quant_reader_quantizes(const struct quant_reader *q, int u);

#endif
