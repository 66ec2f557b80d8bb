/*
 * peft_export — LoRA adapters as PEFT saves them (issue 19): a directory that
 * peft.PeftModel.from_pretrained(base, DIR) loads onto the base model. The
 * names and keys are those PEFT 0.10.0's save_pretrained writes
 * (get_peft_model_state_dict; checked by tests/t_lora_export.py):
 *
 *   adapter_model.safetensors
 *     each adapter tensor as "base_model.model." + its module's Hugging Face
 *     name + ".lora_A.weight" (r, in) / ".lora_B.weight" (out, r):
 *     "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight",
 *     "base_model.model.transformer.h.3.attn.c_attn.lora_A.weight" (GPT-2's
 *     Hugging Face names carry "transformer."; lora_A is (r, in) there too);
 *     each tensor of lora.modules_to_save as "base_model.model." + its
 *     Hugging Face name: "base_model.model.lm_head.weight" (PEFT drops its
 *     wrapper's "modules_to_save.default." from the saved name).
 *     In the run's dtype, converted from the fp32 masters.
 *   adapter_config.json
 *     LoraConfig's fields as PEFT 0.10.0 writes them: peft_type "LORA",
 *     task_type "CAUSAL_LM", r, lora_alpha, lora_dropout, init_lora_weights,
 *     target_modules, fan_in_fan_out (true for GPT-2's Conv1D), bias "none",
 *     modules_to_save (or null), base_model_name_or_path (the base
 *     directory, absolute when it resolves), inference_mode true, use_rslora
 *     and use_dora false, and the other fields at PEFT's defaults.
 *     target_modules names exactly the adapted layers: each adapted module by
 *     the shortest end of its name (after a dot) that matches no module left
 *     unadapted, which is its last component ("q_proj") unless that would
 *     adapt more than was trained ("mlp.c_proj" when GPT-2's attn.c_proj is
 *     not adapted; "layers.0.self_attn.q_proj" for one layer).
 *
 * Collective, with hf_export.h's writer: every rank writes the ranges of the
 * adapter (and modules_to_save) tensors it holds at their offsets; rank 0
 * publishes the weights under their final name, then adapter_config.json.
 * A directory holding a Hugging Face model (config.json, model.safetensors or
 * its index) is refused: adapters and a full model in one directory would
 * load as either.
 */
#ifndef SHARDLM_PEFT_EXPORT_H
#define SHARDLM_PEFT_EXPORT_H

#include <stdbool.h>

#include "comm/comm.h"
#include "core/options.h"
#include "hf_export.h"
#include "model/model.h"

#define PEFT_ADAPTER_FILE "adapter_model.safetensors"
#define PEFT_CONFIG_FILE "adapter_config.json"

/* Whether the model's linear weights are stored (in, out) (GPT-2's Conv1D),
 * PEFT's fan_in_fan_out: its adapters' product B A is (out, in) and adds to
 * the weight transposed. */
bool peft_fan_in_fan_out(const struct model *m);

/* Collective: creates DIR (refusing one that holds a Hugging Face model) and
 * opens the adapter file for model m, which has LoRA (model_add_lora), in
 * dtype dt. Write with hf_export_write / hf_export_write_named: the tensors
 * not in PEFT's file (the frozen base) are skipped. */
void peft_export_begin(struct hf_writer *w, const struct model *m, enum dtype dt, const char *dir, struct comm *comm);
/* Collective: publishes the adapter file, then adapter_config.json for the
 * lora config l (the one m was built with) and the base model directory
 * base_dir (base_model_name_or_path; "" when not known). */
void peft_export_end(struct hf_writer *w, const struct lora_config *l, const char *base_dir, struct comm *comm);

#endif
