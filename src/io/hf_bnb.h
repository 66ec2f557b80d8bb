/*
 * hf_bnb — the 4-bit weights of a Hugging Face directory that transformers
 * saved from a BitsAndBytesConfig(load_in_4bit=True) model: for a linear
 * layer's NAME.weight, the files hold (names as transformers 5.25 and
 * bitsandbytes 0.50 write them, tests/t_qlora_dir.py)
 *   NAME.weight                          U8 (ceil(n / 2), 1): the packed codes; with
 *                                        bnb_4bit_quant_storage bfloat16, float16 or float32
 *                                        the same bytes as BF16 / F16 / F32 (ceil(n / 2) / 2 or / 4, 1)
 *   NAME.weight.absmax                   F32 (blocks), or U8 with double quantization
 *   NAME.weight.quant_map                F32 (16): the 4-bit table
 *   NAME.weight.nested_absmax            F32 (nested blocks)   } double
 *   NAME.weight.nested_quant_map         F32 (256): dynamic map } quantization
 *   NAME.weight.quant_state.bitsandbytes__nf4 (or __fp4)  U8: JSON {"quant_type",
 *       "blocksize", "dtype", "shape", ["nested_blocksize", "nested_dtype",
 *       "nested_offset"]}
 * Each rank reads the codes and statistics of the blocks its range covers and
 * dequantizes them as bitsandbytes' dequantize_4bit does (core/quant4), so a
 * run from such a directory computes with transformers' weights.
 *
 * Refused (fail_input, one line naming the file and the tensor): a quant state
 * whose shape is not the model's tensor, a block size other than 64, an
 * unknown quant_type, statistics whose sizes do not match the shape, tables
 * other than bitsandbytes' own.
 */
#ifndef SHARDLM_HF_BNB_H
#define SHARDLM_HF_BNB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/quant4.h"
#include "model/model.h"
#include "safetensors.h"

struct hf_bnb_weight {
    const struct st_tensor *codes, *absmax, *nested_absmax; /* nested_absmax NULL: no double quantization */
    int type;      /* enum quant4_type */
    float offset;  /* nested_offset */
    size_t numel;  /* elements of the weight */
};

/* Whether NAME (a weight's name in the files) is stored 4-bit: its quant
 * state is checked against the model's tensor t (shape) and *w filled; every
 * companion tensor of NAME is marked in used[] (indexed like st->tensors). */
bool hf_bnb_find(struct st_model *st, const char *name, const struct tensor_desc *t, struct hf_bnb_weight *w,
                 bool *used);

/* Elements [first, first + n) of the weight, dequantized to fp32 into out. */
void hf_bnb_read(struct st_model *st, const struct hf_bnb_weight *w, size_t first, size_t n, float *out);

/* Elements [first, first + n) of the weight (first a multiple of 64) as
 * stored, into out (core/quant4.h): the packed codes copied ((n + 1) / 2
 * bytes), and with out->qabsmax (the weight double-quantized) the 8-bit
 * maxima, the nested blocks they touch and the offset copied; else the fp32
 * absmax dequantization uses, one per block (dequantized from the nested
 * form where the files hold it): a 4-bit unit's share (zero/zero_q4.c),
 * never dequantized. */
void hf_bnb_read_q4(struct st_model *st, const struct hf_bnb_weight *w, size_t first, size_t n,
                    const struct quant4_range *out);

#endif
