/*
 * lora_merge — the base model with a LoRA checkpoint's adapters folded in
 * (issue 19, `shardlm export --merge`), read range by range as the Hugging
 * Face writer asks for it, so that no rank ever holds a whole base tensor:
 *
 *   adapted linear layer    W + (alpha / r) B A, W read from the base's
 *                           Hugging Face directory (hf.h) and A (r, in),
 *                           B (out, r) from the checkpoint's fp32 masters;
 *                           GPT-2's Conv1D weights are stored (in, out):
 *                           W + (alpha / r) (B A)^T (PEFT's fan_in_fan_out)
 *   lora.modules_to_save    the checkpoint's master (trained in full)
 *   any other base tensor   the base's, unchanged
 *
 * PEFT's merge_and_unload computes the same sum (in the base's dtype).
 * The checkpoint's reader is the caller's; each rank may read any ranges.
 */
#ifndef SHARDLM_LORA_MERGE_H
#define SHARDLM_LORA_MERGE_H

#include <stddef.h>

#include "ckpt.h"
#include "hf.h"
#include "quant_reader.h"
#include "model/model.h"

struct lora_merge {
    const struct model *m;     /* with LoRA (model_add_lora) */
    struct ckpt_reader *r;
    struct hf_source base;
    bool quantize;             /* a QLoRA checkpoint on an unquantized base: read through quant */
    struct quant_reader quant; /* the base's 4-bit values (quant_reader.h) */
    int pair_unit, pair_a;     /* the adapter pair A and B hold: its unit and lora_A's index; -1: none */
    float *A, *B;              /* (r, in), (out, r) */
    float *delta;              /* rows of scale B A covering a range */
    size_t delta_cap;
};

/* Opens the base model directory base_dir for m, whose adapters and trained
 * tensors checkpoint r holds. quant (NULL: none) is the checkpoint's
 * quantization section: with load_in_4bit, the base's block linear weights
 * are bitsandbytes' dequantized 4-bit values (as the run computed with them,
 * and as PEFT's merge of a 4-bit layer dequantizes it before adding B A). fail_input (one line, exit status 2) when the
 * directory is missing or describes another model than the checkpoint's
 * (config.json's shape, or a tensor's shape in its files); what names the
 * option that chose the directory in the hint. */
void lora_merge_open(struct lora_merge *g, const struct model *m, struct ckpt_reader *r, const char *base_dir,
                     const char *what, const struct quant_config *quant);
void lora_merge_close(struct lora_merge *g);
/* Elements [begin, begin + count) of base tensor t of unit u with the
 * adapters folded in, in fp32, into out. */
void lora_merge_read(struct lora_merge *g, int u, int t, size_t begin, size_t count, float *out);

#endif
