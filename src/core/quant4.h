/*
 * quant4 — bitsandbytes' 4-bit formats (NF4, FP4) and their double
 * quantization, bit for bit as bitsandbytes 0.50 makes them on the CPU
 * (quantize_4bit with blocksize 64, compress_statistics; dequantize_4bit).
 *
 * A weight tensor is quantized flat, in blocks of QUANT4_BLOCK elements from
 * its first element:
 *   absmax[b]  fp32, max |x| over block b (the last block may be short);
 *   codes      two 4-bit codes per byte, the even element in the HIGH nibble,
 *              (n + 1) / 2 bytes; an odd tensor's last low nibble holds the
 *              code of 0;
 *   code       x * (1 / absmax) (a short last block: x / absmax), clamped to
 *              [-1, 1], then the index of the nearest entry of the 16-value
 *              table, a value on a midpoint going to the lower entry
 *              (torch.bucketize). FP4's table is not sorted; its two zeros
 *              (codes 0 and 8) split at 0: x <= 0 gives 0, 0 < x <= the first
 *              midpoint gives 8, as bitsandbytes' argsort order does.
 * Double quantization ("nested", bnb_4bit_use_double_quant) stores the absmax
 * in 8 bits: offset = mean(absmax) (torch's fp32 sum order, see
 * quant4_nested_offset), then (absmax - offset) quantized with the 256-entry
 * dynamic map in blocks of QUANT4_NESTED_BLOCK: nested_absmax fp32 per block,
 * one byte per absmax. Dequantized absmax = dynamic[q] * nested_absmax + offset.
 * Dequantization is code_value * absmax in fp32, rounded once to the output
 * dtype (nearest even).
 *
 * Sharding: every function takes a range that starts on a block boundary of
 * the whole tensor (a multiple of QUANT4_BLOCK elements; for quantizing the
 * nested statistics a multiple of QUANT4_NESTED_BLOCK blocks; dequantizing
 * them takes any range of blocks, with the nested blocks it touches), so a rank that
 * quantizes only its slice writes exactly the bytes bitsandbytes writes for
 * that slice of the whole tensor. Only a range that ends the tensor may have
 * a length that is not a multiple of the block. The offset alone needs every
 * block's absmax (the caller gathers them; they are 1/64 of the elements).
 *
 * The module owns no state; the tables are constants. Callers: io/ (reading
 * and writing 4-bit weights), zero/ (dequantizing a gathered unit), tests.
 */
#ifndef SHARDLM_QUANT4_H
#define SHARDLM_QUANT4_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

/* bitsandbytes' default and transformers' only 4-bit block size. */
#define QUANT4_BLOCK 64
/* Blocks of absmax per nested block (quantize_4bit's quantize_blockwise(..., blocksize=256)). */
#define QUANT4_NESTED_BLOCK 256

enum quant4_type { QUANT4_NF4 = 0, QUANT4_FP4 = 1 };

/* "nf4" / "fp4" -> type; -1 for anything else. */
int quant4_type_parse(const char *name);
const char *quant4_type_name(enum quant4_type type);

/* The 16 dequantized values of a type's codes, in code order (fp32). */
const float *quant4_table(enum quant4_type type);
/* bitsandbytes' signed 8-bit dynamic map (create_dynamic_map()), 256 sorted values. */
const float *quant4_dynamic_map(void);

/* Blocks of n elements, and packed bytes of n codes. */
static inline size_t quant4_blocks(size_t n) { return (n + QUANT4_BLOCK - 1) / QUANT4_BLOCK; }
static inline size_t quant4_code_bytes(size_t n) { return (n + 1) / 2; }
static inline size_t quant4_nested_blocks(size_t n_absmax)
{
    return (n_absmax + QUANT4_NESTED_BLOCK - 1) / QUANT4_NESTED_BLOCK;
}

/* Quantizes n elements of src (dtype dt), a range starting on a block
 * boundary of its tensor: writes quant4_code_bytes(n) bytes to codes and
 * quant4_blocks(n) floats to absmax. OpenMP over blocks. */
void quant4_quantize(enum quant4_type type, const void *src, enum dtype dt, size_t n, uint8_t *codes, float *absmax);

/* The inverse: n elements into dst (dtype dt) from codes and fp32 absmax. */
void quant4_dequantize(enum quant4_type type, const uint8_t *codes, const float *absmax, size_t n, void *dst,
                       enum dtype dt);

/* mean(absmax[0..n_absmax)) as torch 2.x computes Tensor.mean() of a
 * contiguous fp32 vector on a CPU with AVX2 kernels in one thread: the
 * cascade sum of aten's SumKernel (8-lane vectors, 4 accumulators, 4 levels)
 * divided by n in fp32. torch splits vectors above 32768 elements across
 * threads; shardlm keeps the one-thread order there, so for a tensor of more
 * than 2M weights the offset may differ from a multi-threaded torch's in its
 * last bit (the stored offset is the one shardlm dequantizes with). */
float quant4_nested_offset(const float *absmax, size_t n_absmax);

/* Quantizes absmax - offset (n_absmax values from a range starting on a
 * nested-block boundary) into one byte each and quant4_nested_blocks(n_absmax)
 * fp32 nested_absmax, as bitsandbytes' CPU quantize_blockwise does. */
void quant4_nested_quantize(const float *absmax, size_t n_absmax, float offset, uint8_t *qabsmax,
                            float *nested_absmax);

/* Nested blocks that blocks [first_block, first_block + n_blocks) of a tensor touch (0 when n_blocks is 0). */
static inline size_t quant4_nested_touched(size_t first_block, size_t n_blocks)
{
    return n_blocks ? (first_block + n_blocks - 1) / QUANT4_NESTED_BLOCK - first_block / QUANT4_NESTED_BLOCK + 1 : 0;
}

/* The absmax of a tensor's blocks [first_block, first_block + n_absmax), any
 * range: absmax[i] = dynamic[qabsmax[i]] * nested_absmax[(first_block % 256
 * + i) / 256] + offset in fp32, the product and the sum rounded apart;
 * nested_absmax starts at the nested block of first_block. */
void quant4_nested_dequantize(const uint8_t *qabsmax, const float *nested_absmax, float offset, size_t first_block,
                              size_t n_absmax, float *absmax);

/* n elements from block first_block of a tensor into dst (dtype dt) from a range as stored (struct quant4_range
 * below): codes with the fp32 absmax, or with double quantization (qabsmax non-NULL) with the nested form, whose
 * absmax it computes first. */
void quant4_dequantize_stored(enum quant4_type type, const uint8_t *codes, const float *absmax, const uint8_t *qabsmax,
                              const float *nested_absmax, float offset, size_t first_block, size_t n, void *dst,
                              enum dtype dt);

/* A range of whole blocks of a quantized tensor as stored: a 4-bit unit's
 * share (zero/zero_q4.c), filled by param_source.read_q4 (zero.h). Without
 * double quantization the fp32 absmax; with it bitsandbytes' nested form:
 * the 8-bit qabsmax of each block, the nested_absmax of every nested block
 * the range touches (quant4_nested_touched) and the tensor's offset. */
struct quant4_range {
    uint8_t *codes;       /* (n + 1) / 2 bytes */
    float *absmax;        /* (blocks) fp32; NULL with double quantization */
    uint8_t *qabsmax;     /* (blocks), double quantization; else NULL */
    float *nested_absmax; /* (quant4_nested_touched(first block, blocks)) */
    float *offset;        /* (1) */
};

#endif
