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

#include "comm/comm.h"
#include "core/quant4.h"
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
    struct comm *comm;                     /* quant_reader_read_q4's ranks (NULL: one) */
    int range_unit, range_tensor;          /* quant_reader_read_q4's last range, -1: none */
    size_t range_first, range_n;
    float *range_values;                   /* (range_n) its values dequantized */
    size_t cache_cap;
};

void quant_reader_init(struct quant_reader *q, const struct model *m, const struct quant_config *qc,
                       void (*inner)(void *ctx, int u, size_t begin, size_t count, float *out), void *inner_ctx);
void quant_reader_free(struct quant_reader *q);
/* fp32 values of unit u's elements [begin, begin + count) (ctx: the reader). */
void quant_reader_read(void *ctx, int u, size_t begin, size_t count, float *out);
/* This rank's share of tensor t of unit u (a weight the reader quantizes),
 * for a 4-bit unit (zero/zero_q4.c): of the tensor's B blocks this rank
 * (comm's rank r of N) has [r b, min(B, (r + 1) b)), b = ceil(B / N), its
 * elements [first, first + n) (n may be 0). Only that range is read from
 * the inner reader and quantized: into out (core/quant4.h) the packed codes
 * ((n + 1) / 2 bytes) and the fp32 absmax, or with double quantization its
 * nested form (out->qabsmax not NULL: the blocks' bytes, the nested blocks
 * they touch, the offset); the ranks all-gather their blocks' absmax (1/64
 * of the elements) for the tensor's offset and nested blocks, so every rank
 * must call it for every tensor, in the same order (collective; without
 * comm the range is the whole tensor). Bit for bit the whole tensor's bytes
 * for that range. The
 * range's dequantized values are kept: a quant_reader_read of them (the
 * base's checksum) after it reads nothing again. */
void quant_reader_read_q4(struct quant_reader *q, int u, int t, size_t first, size_t n,
                          const struct quant4_range *out);
/* Whether unit u holds weights the reader quantizes (a block of the base). */
bool quant_reader_quantizes(const struct quant_reader *q, int u);

#endif
