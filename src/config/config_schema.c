/*
 * config_schema — every key the config accepts, as a table (struct key_spec,
 * config_internal.h): its JSON type, whether null means "not given", keys
 * DeepSpeed defines that change nothing here (one warning each) and keys
 * refused with a hint; check_keys() walks the document against it (unknown
 * keys with a "did you mean", wrong types, "auto").
 */
#include "config_internal.h"

#include "core/util.h"

#include <ctype.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <string.h>

/* ---- schema ------------------------------------------------------------ */

/* A row: name, JSON kind, flags, children (objects), hint (F_NO_EFFECT: why;
 * F_REJECT: the error), then the reference's default, allowed values and
 * one-line meaning (config_internal.h). Keys DeepSpeed defines that change
 * nothing here are NO_EFFECT rows: the reference prints their warning. */
#define NO_EFFECT(name, kind, hint) {name, kind, F_NO_EFFECT, NULL, hint, NULL, NULL, NULL}
#define REFUSED(name, hint) {name, K_ANY, F_REJECT, NULL, hint, NULL, NULL, NULL}

static const struct key_spec rope_scaling_keys[] = {
    {"type", K_STR, 0, NULL, NULL, NULL, NULL, "the old name of `rope_type` (transformers reads either)"},
    {"rope_type", K_STR, 0, NULL, NULL, "`\"default\"`", "`\"default\"`, `\"llama3\"` (Llama 3.1), `\"linear\"`, `\"longrope\"` (Phi-3)",
     "how the rotary frequencies are rescaled for long contexts; other types are refused"},
    {"factor", K_NUM, 0, NULL, NULL, NULL, ">= 1",
     "the context extension factor (required by `llama3` and `linear`, as transformers requires it)"},
    {"low_freq_factor", K_NUM, 0, NULL, NULL, NULL, "> 0", "`llama3`: the low-frequency wavelength factor (required)"},
    {"high_freq_factor", K_NUM, 0, NULL, NULL, NULL, "> `low_freq_factor`",
     "`llama3`: the high-frequency wavelength factor (required)"},
    {"original_max_position_embeddings", K_INT, 0, NULL, NULL, "8192", "> 0",
     "`llama3`, `longrope`: the context length the model was pre-trained at"},
    {"short_factor", K_ARRAY, 0, NULL, NULL, NULL, "rotated channels / 2 numbers > 0",
     "`longrope`: each channel pair's frequency divisor up to `original_max_position_embeddings` (required)"},
    {"long_factor", K_ARRAY, 0, NULL, NULL, NULL, "rotated channels / 2 numbers > 0",
     "`longrope`: the divisors of a sequence whose largest position + 1 exceeds it (required)"},
    {"attention_factor", K_NUM, 0, NULL, NULL, "1", "> 0", "`longrope`: the scale of cos and sin"},
    {0},
};

static const struct key_spec model_keys[] = {
    {"from_pretrained", K_STR, F_NULLABLE, NULL, NULL, NULL, "a directory",
     "a Hugging Face model directory (config.json + safetensors): the shape from its config.json, the initial "
     "weights from its files; not with `model.preset`"},
    {"preset", K_STR, 0, NULL, NULL, NULL, "@presets", "a published shape that supplies the model keys' defaults"},
    {"type", K_STR, 0, NULL, NULL, "`\"gpt2\"` (the preset's type)", "@types",
     "the model family: `gpt2` (LayerNorm, learned positions, tied head), `llama` (RMSNorm, rotary, SwiGLU, "
     "grouped-query attention; Llama 2/3, Mistral, Qwen2, Qwen3) or `gemma` (Llama's attention with (1 + w) norms "
     "before and after attention and MLP, GeGLU, scaled embeddings; Gemma 2, Gemma 3 text)"},
    {"n_layer", K_INT, 0, NULL, NULL, "12 (the preset's)", "1 to 65536", "transformer blocks"},
    {"n_head", K_INT, 0, NULL, NULL, "12 (the preset's)", "> 0", "attention heads"},
    {"n_kv_head", K_INT, 0, NULL, NULL, "`n_head` (the preset's)", "a divisor of `n_head`",
     "Llama: key/value heads (grouped-query attention); GPT-2 has `n_head`"},
    {"ffn_dim", K_INT, 0, NULL, NULL, "4 × `n_embd` (the preset's)", "> 0",
     "Llama: the SwiGLU hidden size; GPT-2 has 4 × `n_embd`"},
    {"n_embd", K_INT, 0, NULL, NULL, "768 (the preset's)", "a multiple of `n_head`", "the width of the residual stream"},
    {"n_positions", K_INT, 0, NULL, NULL, "1024 (the preset's)", "> 0", "the context length"},
    {"vocab_size", K_INT, 0, NULL, NULL, "50257 (the preset's)", "> 0",
     "the real vocabulary; padded to a multiple of 128 inside"},
    {"init_std", K_NUM, 0, NULL, NULL, "0.02", "> 0",
     "standard deviation of the normal initialisation (residual projections scaled by 1/√(2 `n_layer`))"},
    {"init_seed", K_INT, 0, NULL, NULL, "1337", ">= 0",
     "seed of the initial weights (the same weights at any world size)"},
    {"rms_norm_eps", K_NUM, 0, NULL, NULL, "1e-5", "(0, 1]", "Llama: RMSNorm's epsilon"},
    {"rope_theta", K_NUM, 0, NULL, NULL, "10000", "> 1", "Llama: the rotary base"},
    {"rope_scaling", K_OBJ, F_NULLABLE, rope_scaling_keys, NULL, "null", NULL,
     "Llama: long-context rotary scaling, transformers' `rope_scaling` (keys below)"},
    {"tie_word_embeddings", K_BOOL, 0, NULL, NULL, "`false`", NULL,
     "Llama: `lm_head` is `embed_tokens` (small models); GPT-2 is always tied"},
    {"head_dim", K_INT, 0, NULL, NULL, "`n_embd` / `n_head`", "even, > 0",
     "Llama: the width of one attention head, when the model sets it apart (Qwen3)"},
    {"partial_rotary_factor", K_NUM, 0, NULL, NULL, "1", "(0, 1], `head_dim` x it even",
     "Llama: the rotary turns a head's first int(`head_dim` x it) channels, the others pass (Phi-4-mini: 0.75)"},
    {"qkv_bias", K_BOOL, 0, NULL, NULL, "`false` (the preset's)", NULL, "Llama: biases on q, k and v (Qwen2)"},
    {"qk_norm", K_BOOL, 0, NULL, NULL, "`false` (the preset's)", NULL,
     "Llama: RMSNorm of each head's q and k before the rotary (Qwen3)"},
    {"fused_projections", K_BOOL, 0, NULL, NULL, "`false`", NULL,
     "Llama: the Hugging Face files fuse q, k, v as `qkv_proj` and gate, up as `gate_up_proj` (Phi-3)"},
    {"sliding_window", K_INT, 0, NULL, NULL, "0", ">= 0",
     "Llama: keys a query of a sliding layer sees, itself included (Mistral's, Qwen2's `sliding_window`); 0: "
     "none. Set from `config.json` with `model.from_pretrained`, and kept in checkpoints"},
    {"sliding_layers", K_ARRAY, 0, NULL, NULL, "every layer", "layer numbers from 0, each once",
     "Llama: the layers that attend through `sliding_window` (Qwen2's from `max_window_layers` on)"},
    {"final_logit_softcapping", K_NUM, F_NULLABLE, NULL, NULL, "null", "> 0",
     "Gemma: the logits become cap × tanh(logits / cap) (Gemma 2: 30; null: none)"},
    {"attn_logit_softcapping", K_NUM, F_NULLABLE, NULL, NULL, "null", "null",
     "Gemma: the attention scores' soft-cap; other values than null are refused until the attention kernels take it"},
    {"query_pre_attn_scalar", K_NUM, F_NULLABLE, NULL, NULL, "`head_dim`", "`head_dim`",
     "Gemma: the attention scores are scaled by its -1/2 power; other values than `head_dim` are refused until the "
     "attention kernels take a scale"},
    {"sliding_window_pattern", K_INT, 0, NULL, NULL, "0 (the preset's)", ">= 0",
     "Gemma: layer l is local (sliding window) unless l + 1 is a multiple of it (Gemma 2: 2, Gemma 3: 6; 0: every "
     "layer global)"},
    {"rope_local_theta", K_NUM, F_NULLABLE, NULL, NULL, "`rope_theta`", "> 1",
     "Gemma 3: the local layers' rotary base (`rope_local_base_freq`), without `rope_scaling`"},
    {0},
};

static const struct key_spec data_keys[] = {
    {"train", K_STR, F_NULLABLE, NULL, NULL, NULL, "a path or a glob",
     "training data: `.bin` token shards (pre-training) or a sample / preference file (`.h5`)"},
    {"val", K_STR, F_NULLABLE, NULL, NULL, NULL, "a path or a glob", "validation data, of the same kind as `data.train`"},
    {"seq_len", K_INT, 0, NULL, NULL, "`n_positions`", "1 to `n_positions`", "tokens per sequence (the longest row)"},
    {"max_seq_length", K_INT, 0, NULL, NULL, NULL, "1 to `n_positions`",
     "TRL's name of `data.seq_len` (give one of the two)"},
    {"shuffle", K_BOOL, 0, NULL, NULL, "`true`", NULL, "a seeded order per epoch (false: file order)"},
    {"pad_to_multiple_of", K_INT, 0, NULL, NULL, "8", "> 0",
     "sample files: a micro-batch is padded to its longest sample rounded up to this"},
    {"group_by_length", K_BOOL, 0, NULL, NULL, "`false`", NULL,
     "sample files: each megabatch of 50 steps' samples sorted by length, longest first"},
    {"truncation", K_STR, 0, NULL, NULL, "`\"truncate\"`", "`\"truncate\"`, `\"drop\"`",
     "sample files: a sample longer than `data.seq_len` is cut to it or left out"},
    {"packing", K_BOOL, 0, NULL, NULL, "`false`", NULL,
     "sample files: rows filled with whole samples, attention and positions restarting at each"},
    {"allow_tokenizer_mismatch", K_BOOL, 0, NULL, NULL, "`false`", NULL,
     "a sample file made with another tokenizer than the model's is a warning instead of an error"},
    {0},
};

static const struct key_spec train_keys[] = {
    {"steps", K_INT, 0, NULL, NULL, "100", "> 0", "optimizer steps"},
    {"seed", K_INT, 0, NULL, NULL, "1337", ">= 0", "the seed of the data order and of sampling"},
    {"eval_every", K_INT, 0, NULL, NULL, "0", ">= 0", "validation every N steps (0: never)"},
    {"eval_batches", K_INT, 0, NULL, NULL, "4", "> 0",
     "validation covers the first `eval_batches` × `train_batch_size` sequences of `data.val`"},
    {"sample_tokens", K_INT, 0, NULL, NULL, "0", ">= 0", "tokens of text sampled at the end of the run"},
    {"sample_temperature", K_NUM, 0, NULL, NULL, "1.0", "> 0", "the temperature of that sample"},
    {"metrics", K_STR, F_NULLABLE, NULL, NULL, NULL, "a path", "a JSONL file with one record per step and evaluation"},
    {"threads", K_INT, 0, NULL, NULL, "0", "0 to 4096", "OpenMP/OpenBLAS threads per rank (0: `OMP_NUM_THREADS`)"},
    {0},
};

static const struct key_spec checkpoint_keys[] = {
    {"dir", K_STR, F_NULLABLE, NULL, NULL, NULL, "a directory",
     "where checkpoints go (`step_N.h5` and `latest`); needed to resume"},
    {"every", K_INT, 0, NULL, NULL, "0", ">= 0", "a checkpoint every N steps (0: at the end only)"},
    {"keep", K_INT, 0, NULL, NULL, "2", ">= 0", "how many checkpoints are kept"},
    {"on_error", K_STR, 0, NULL, NULL, "`\"stop\"`", "`\"stop\"`, `\"continue\"`",
     "a save that fails: exit with status 2, or warn and train on (the previous checkpoint is untouched)"},
    {"export_hf", K_BOOL, 0, NULL, NULL, "`false`", NULL,
     "also write a Hugging Face directory (with `lora`: PEFT's adapter directory) at `checkpoint.dir/hf`"},
    {0},
};

static const struct key_spec adam_param_keys[] = {
    {"lr", K_NUM, 0, NULL, NULL, "1e-3", ">= 0", "the learning rate (the peak, under a schedule)"},
    {"betas", K_ARRAY, 0, NULL, NULL, "[0.9, 0.999]", "two numbers in [0, 1)", "Adam's moment decay rates"},
    {"eps", K_NUM, 0, NULL, NULL, "1e-8", ">= 0", "Adam's epsilon"},
    {"weight_decay", K_NUM, 0, NULL, NULL, "0", ">= 0", "decoupled weight decay (AdamW), on 2-D weights only"},
    {"adam_w_mode", K_BOOL, 0, NULL, NULL, "`true`", NULL, "`false`: Adam's L2 decay instead of AdamW's"},
    {"bias_correction", K_BOOL, 0, NULL, NULL, "`true`", "`true`", "Adam's bias correction (false is refused)"},
    {"amsgrad", K_BOOL, 0, NULL, NULL, "`false`", "`false`", "AMSGrad (true is refused)"},
    NO_EFFECT("torch_adam", K_BOOL, " (the AdamW update is shardlm's own, on the host)"),
    REFUSED("max_grad_norm",
            "is not an optimizer parameter (DeepSpeed rejects it too); use the top-level \"gradient_clipping\""),
    {0},
};

static const struct key_spec optimizer_keys[] = {
    {"type", K_STR, 0, NULL, NULL, "`\"AdamW\"`", "`\"AdamW\"`, `\"Adam\"`", "the optimizer (on the host, fp32)"},
    {"params", K_OBJ, 0, adam_param_keys, NULL, NULL, NULL, "its parameters (keys below)"},
    {0},
};

/* The union of the parameters of the three schedules; read_scheduler() then
 * rejects the ones the chosen schedule does not take, as DeepSpeed's
 * constructors would (TypeError). */
static const struct key_spec scheduler_param_keys[] = {
    {"warmup_min_lr", K_NUM, 0, NULL, NULL, "0", ">= 0", "WarmupLR, WarmupDecayLR: the rate at step 1"},
    {"warmup_max_lr", K_NUM, 0, NULL, NULL, "0.001", ">= 0", "WarmupLR, WarmupDecayLR: the rate after warm-up"},
    {"warmup_num_steps", K_INT, 0, NULL, NULL, "1000", "> 0", "steps of warm-up"},
    {"warmup_type", K_STR, 0, NULL, NULL, "`\"log\"`", "`\"log\"`, `\"linear\"`", "the shape of the warm-up"},
    {"total_num_steps", K_INT, 0, NULL, NULL, NULL, ">= `warmup_num_steps`",
     "WarmupDecayLR, WarmupCosineLR: the run's length (required)"},
    {"warmup_min_ratio", K_NUM, 0, NULL, NULL, "0", "[0, 1]", "WarmupCosineLR: the starting fraction of `lr`"},
    {"cos_min_ratio", K_NUM, 0, NULL, NULL, "0.0001", "[0, 1]", "WarmupCosineLR: the final fraction of `lr`"},
    {"last_batch_iteration", K_INT, 0, NULL, NULL, "-1", "-1", "DeepSpeed's; a resumed run takes its step from the checkpoint"},
    {0},
};

static const struct key_spec scheduler_keys[] = {
    {"type", K_STR, 0, NULL, NULL, NULL, "`\"WarmupLR\"`, `\"WarmupDecayLR\"`, `\"WarmupCosineLR\"`",
     "the schedule, with DeepSpeed's formulas and step convention (required in a scheduler section)"},
    {"params", K_OBJ, 0, scheduler_param_keys, NULL, NULL, NULL, "its parameters (keys below)"},
    {0},
};

static const struct key_spec fp16_keys[] = {
    {"enabled", K_BOOL, 0, NULL, NULL, "`false`", NULL,
     "fp16 parameters, activations and communicated gradients, with loss scaling"},
    NO_EFFECT("auto_cast", K_BOOL, " (activations are always in the parameter dtype)"),
    {"loss_scale", K_NUM, 0, NULL, NULL, "0", ">= 0", "a static loss scale (0: dynamic loss scaling)"},
    {"initial_scale_power", K_INT, 0, NULL, NULL, "16", "0 to 127", "dynamic: the first scale is 2^power"},
    {"loss_scale_window", K_INT, 0, NULL, NULL, "1000", "> 0", "dynamic: steps without overflow before the scale doubles"},
    {"hysteresis", K_INT, 0, NULL, NULL, "2", ">= 1", "dynamic: overflows tolerated before the scale halves"},
    {"consecutive_hysteresis", K_BOOL, 0, NULL, NULL, "`false`", NULL,
     "dynamic: refill the hysteresis after a step without overflow"},
    {"min_loss_scale", K_NUM, 0, NULL, NULL, "1", "> 0", "dynamic: the lowest scale; overflowing there stops the run"},
    {"fp16_master_weights_and_grads", K_BOOL, 0, NULL, NULL, "`false`", "`false`",
     "true is refused: master weights and Adam moments are fp32"},
    {0},
};

static const struct key_spec bf16_keys[] = {
    {"enabled", K_BOOL, 0, NULL, NULL, "`false`", NULL, "bf16 parameters, activations and gradients, no loss scaling"},
    NO_EFFECT("immediate_grad_update", K_BOOL, NULL),
    NO_EFFECT("check_grad_overflow", K_BOOL, NULL),
    {"bf16_master_weights_and_grads", K_BOOL, 0, NULL, NULL, "`false`", "`false`",
     "true is refused: master weights are fp32"},
    {"bf16_optimizer_states", K_BOOL, 0, NULL, NULL, "`false`", "`false`", "true is refused: Adam moments are fp32"},
    {0},
};

static const struct key_spec offload_optimizer_keys[] = {
    {"device", K_STR, 0, NULL, NULL, "`\"none\"`", "`\"none\"`, `\"cpu\"`, `\"nvme\"`",
     "where the fp32 master weights and Adam moments live: device memory, pinned host memory, or a file per rank "
     "under `nvme_path`"},
    {"pin_memory", K_BOOL, 0, NULL, NULL, "`true`", NULL, "the host copy in pinned (page-locked) memory"},
    {"ratio", K_NUM, 0, NULL, NULL, "1.0", "1.0", "the offloaded fraction (partial offload is refused)"},
    {"nvme_path", K_STR, F_NULLABLE, NULL, NULL, NULL, "a directory",
     "`\"nvme\"`: a directory on a local disk (required)"},
    {"buffer_count", K_INT, 0, NULL, NULL, "4", "> 0", "`\"nvme\"`: pinned buffers the AdamW step streams through (at least 3 are used)"},
    NO_EFFECT("pipeline_read", K_BOOL, NULL),
    NO_EFFECT("pipeline_write", K_BOOL, NULL),
    NO_EFFECT("fast_init", K_BOOL, NULL),
    NO_EFFECT("super_offload", K_BOOL, NULL),
    NO_EFFECT("cpuadam_cores_perc", K_NUM, NULL),
    {0},
};

/* offload_param (stage 3): the parameter shards live in host memory and each
 * unit is gathered into device memory before use (ZeRO-Infinity's CPU path). */
static const struct key_spec offload_param_keys[] = {
    {"device", K_STR, 0, NULL, NULL, "`\"none\"`", "`\"none\"`, `\"cpu\"`, `\"nvme\"`",
     "stage 3: where the parameter shards live between uses (device memory, pinned host memory, or a file per rank "
     "under `nvme_path`); each unit is gathered into device memory just before use"},
    {"pin_memory", K_BOOL, 0, NULL, NULL, "`true`", NULL, "the host shards in pinned memory"},
    {"nvme_path", K_STR, F_NULLABLE, NULL, NULL, NULL, "a directory", "`\"nvme\"`: a directory on a local disk (required)"},
    {"buffer_count", K_INT, 0, NULL, NULL, "5", "> 0", "`\"nvme\"`: pinned buffers shards are read ahead into"},
    {"buffer_size", K_INT, 0, NULL, NULL, "1e8", ">= the largest unit shard",
     "`\"nvme\"`: elements of one such buffer"},
    NO_EFFECT("max_in_cpu", K_INT, NULL),
    {0},
};

#define CPU_OFFLOAD_HINT "is DeepSpeed's deprecated spelling, not accepted here; use \"offload_optimizer\": {\"device\": \"cpu\"}"
#define WHOLE_UNITS " (the engine reduces whole units)"

static const struct key_spec zero_keys[] = {
    {"stage", K_INT, 0, NULL, NULL, "0", "0, 1, 2, 3",
     "what is sharded over the ranks: nothing, optimizer state, + gradients, + parameters"},
    {"offload_optimizer", K_OBJ, F_NULLABLE, offload_optimizer_keys, NULL, NULL, NULL,
     "optimizer state off the device (keys below)"},
    {"offload_param", K_OBJ, F_NULLABLE, offload_param_keys, NULL, NULL, NULL,
     "stage 3: parameter shards off the device (keys below)"},
    NO_EFFECT("reduce_bucket_size", K_INT, WHOLE_UNITS),
    NO_EFFECT("contiguous_gradients", K_BOOL, WHOLE_UNITS),
    {"overlap_comm", K_BOOL, F_NULLABLE, NULL, NULL, "`true` at stage 3, else `false`", NULL,
     "recorded in the resolved config; collectives always overlap compute (a communication thread per rank)"},
    {"stage3_prefetch_bucket_size", K_INT, 0, NULL, NULL, "5e7", ">= 0", "stage 3: elements gathered ahead of use"},
    {"stage3_max_live_parameters", K_INT, 0, NULL, NULL, "1e9", ">= 0", "stage 3: elements gathered at once at most"},
    {"stage3_param_persistence_threshold", K_INT, 0, NULL, NULL, "1e5", ">= 0",
     "stage 3: units this small stay whole on every rank"},
    NO_EFFECT("allgather_bucket_size", K_INT, " (the engine gathers whole units)"),
    NO_EFFECT("reduce_scatter", K_BOOL, NULL),
    NO_EFFECT("allgather_partitions", K_BOOL, NULL),
    NO_EFFECT("stage3_max_reuse_distance", K_INT, NULL),
    NO_EFFECT("stage3_gather_16bit_weights_on_model_save", K_BOOL, NULL),
    NO_EFFECT("stage3_gather_fp16_weights_on_model_save", K_BOOL, NULL),
    NO_EFFECT("stage3_model_persistence_threshold", K_INT, NULL),
    NO_EFFECT("sub_group_size", K_INT, NULL),
    NO_EFFECT("round_robin_gradients", K_BOOL, NULL),
    NO_EFFECT("load_from_fp32_weights", K_BOOL, NULL),
    NO_EFFECT("elastic_checkpoint", K_BOOL, NULL),
    NO_EFFECT("ignore_unused_parameters", K_BOOL, NULL),
    NO_EFFECT("use_multi_rank_bucket_allreduce", K_BOOL, NULL),
    NO_EFFECT("memory_efficient_linear", K_BOOL, NULL),
    REFUSED("cpu_offload", CPU_OFFLOAD_HINT),
    REFUSED("cpu_offload_param",
            "is DeepSpeed's deprecated spelling, not accepted here; use \"offload_param\": {\"device\": \"cpu\"}"),
    REFUSED("cpu_offload_use_pin_memory",
            "is DeepSpeed's deprecated spelling, not accepted here; use \"offload_optimizer\": {\"pin_memory\": true}"),
    {0},
};

static const struct key_spec act_ckpt_keys[] = {
    {"enabled", K_BOOL, 0, NULL, NULL, "`false`", NULL,
     "keep only the input of every k-th block in the forward, recompute in the backward"},
    {"interval", K_INT, 0, NULL, NULL, "1", "1 to `n_layer`", "k: blocks per checkpointed segment (shardlm's key)"},
    {"cpu_checkpointing", K_BOOL, 0, NULL, NULL, "`false`", NULL, "the kept inputs live in pinned host memory"},
    NO_EFFECT("partition_activations", K_BOOL, NULL),
    NO_EFFECT("contiguous_memory_optimization", K_BOOL, NULL),
    {"number_checkpoints", K_INT, F_NO_EFFECT | F_NULLABLE, NULL, NULL, NULL, NULL, NULL},
    NO_EFFECT("synchronize_checkpoint_boundary", K_BOOL, NULL),
    NO_EFFECT("profile", K_BOOL, NULL),
    {0},
};

static const struct key_spec lora_keys[] = {
    {"r", K_INT, 0, NULL, NULL, "8", "> 0", "the adapters' rank"},
    {"alpha", K_NUM, 0, NULL, NULL, "8", "> 0", "the adapters' output is scaled by alpha / r"},
    {"lora_alpha", K_NUM, 0, NULL, NULL, NULL, "> 0", "PEFT's name of `lora.alpha`"},
    {"dropout", K_NUM, 0, NULL, NULL, "0", "[0, 1)", "dropout on the adapters' input"},
    {"lora_dropout", K_NUM, 0, NULL, NULL, NULL, "[0, 1)", "PEFT's name of `lora.dropout`"},
    {"target_modules", K_ANY, 0, NULL, NULL, "PEFT's: Llama `[\"q_proj\", \"v_proj\"]`, GPT-2 `[\"c_attn\"]`",
     "a list of module names, or `\"all-linear\"`",
     "the blocks' linear layers to adapt, matched as PEFT matches them (Llama: q_proj k_proj v_proj o_proj gate_proj "
     "up_proj down_proj; GPT-2: c_attn c_proj c_fc)"},
    {"modules_to_save", K_ARRAY, F_NULLABLE, NULL, NULL, "none", "module names",
     "modules trained in full beside the adapters (e.g. `[\"lm_head\"]`)"},
    {"init", K_ANY, 0, NULL, NULL, "`\"default\"`", "`\"default\"`, `\"gaussian\"`, `true`, `false`",
     "PEFT's `init_lora_weights`: A Kaiming-uniform and B zero, or Gaussian"},
    {0},
};

/* quantization: transformers' BitsAndBytesConfig names (its to_dict(), as config.json's quantization_config
 * holds it, is accepted whole). */
static const struct key_spec quant_keys[] = {
    {"quant_method", K_STR, 0, NULL, NULL, "`\"bitsandbytes\"`", "`\"bitsandbytes\"`",
     "the quantization library whose formats are used; GPTQ, AWQ and others are refused"},
    {"load_in_4bit", K_BOOL, 0, NULL, NULL, "`false`", NULL,
     "store the frozen base's block linear weights in 4 bits (QLoRA); needs a `lora` section"},
    {"load_in_8bit", K_BOOL, 0, NULL, NULL, "`false`", "`false`", "LLM.int8 bases are not supported (refused when true)"},
    {"bnb_4bit_quant_type", K_STR, 0, NULL, NULL, "`\"fp4\"` (transformers' default)", "`\"nf4\"`, `\"fp4\"`",
     "the 4-bit data type: NormalFloat (QLoRA's) or bitsandbytes' FP4"},
    {"bnb_4bit_use_double_quant", K_BOOL, 0, NULL, NULL, "`false`", NULL,
     "quantize the block maxima again (8 bits in blocks of 256): about 0.37 fewer bits per weight"},
    {"bnb_4bit_compute_dtype", K_STR, 0, NULL, NULL, "the run's dtype", "`\"float32\"`, `\"bfloat16\"`, `\"float16\"`",
     "the dtype the base is dequantized to for compute; must be the run's parameter dtype (`bf16`, `fp16`)"},
    {"bnb_4bit_quant_storage", K_STR, 0, NULL, NULL, "`\"uint8\"`",
     "`\"uint8\"`, `\"bfloat16\"`, `\"float16\"`, `\"float32\"`",
     "only the container dtype of a directory saved 4-bit: bitsandbytes packs the 4-bit codes into a tensor of this "
     "dtype (the same bytes; FSDP setups use the model's dtype), and shardlm reads that `weight` as bytes whatever "
     "its dtype; in memory, in the all-gathers and in checkpoints the codes are bytes either way, so the value "
     "changes nothing shardlm stores or computes"},
    {"llm_int8_skip_modules", K_ANY, F_NULLABLE, NULL, NULL, "null", "null or `[\"lm_head\"]`",
     "modules left unquantized: the LM head always is"},
    NO_EFFECT("_load_in_4bit", K_BOOL, " (transformers' private copy of load_in_4bit)"),
    NO_EFFECT("_load_in_8bit", K_BOOL, " (transformers' private copy of load_in_8bit)"),
    NO_EFFECT("llm_int8_threshold", K_NUM, " (an LLM.int8 setting)"),
    NO_EFFECT("llm_int8_has_fp16_weight", K_BOOL, " (an LLM.int8 setting)"),
    NO_EFFECT("llm_int8_enable_fp32_cpu_offload", K_BOOL, " (an LLM.int8 setting)"),
    {0},
};

/* DeepSpeed's asynchronous I/O section (ZeRO-Infinity's NVMe offload). */
static const struct key_spec aio_keys[] = {
    NO_EFFECT("block_size", K_INT, NULL),
    NO_EFFECT("queue_depth", K_INT, NULL),
    NO_EFFECT("thread_count", K_INT, NULL),
    NO_EFFECT("intra_op_parallelism", K_INT, NULL),
    NO_EFFECT("single_submit", K_BOOL, NULL),
    NO_EFFECT("overlap_events", K_BOOL, NULL),
    NO_EFFECT("use_gds", K_BOOL, NULL),
    {0},
};

/* dpo: TRL's DPOConfig names. */
static const struct key_spec dpo_keys[] = {
    {"beta", K_NUM, 0, NULL, NULL, "0.1", "> 0", "the strength of the pull towards the reference"},
    {"loss_type", K_STR, 0, NULL, NULL, "`\"sigmoid\"`", "`\"sigmoid\"` (DPO), `\"ipo\"`", "the pair loss"},
    {"label_smoothing", K_NUM, 0, NULL, NULL, "0", "[0, 0.5]", "sigmoid: conservative DPO's ε (0 with `ipo`)"},
    {"precompute_ref_log_probs", K_BOOL, 0, NULL, NULL, "`true` without `lora`, `false` with it", NULL,
     "the reference's log-probs computed once before step 1 into a file (required for a full fine-tune)"},
    {"ref_log_probs_path", K_STR, F_NULLABLE, NULL, NULL, "`<data.train>.ref-logps.h5`", "a path",
     "where those log-probs are written and reused"},
    REFUSED("max_length", "is a data preparation setting here: pass --max-seq-length to tools/prepare_data.py"),
    REFUSED("max_prompt_length", "is a data preparation setting here: pass --max-prompt-length to tools/prepare_data.py"),
    {0},
};

const struct key_spec top_keys[] = {
    {"train_batch_size", K_INT, F_NULLABLE, NULL, NULL, NULL, "> 0",
     "sequences (DPO: pairs) per optimizer step over all ranks; give any two of the three batch keys"},
    {"train_micro_batch_size_per_gpu", K_INT, F_NULLABLE, NULL, NULL, NULL, "> 0",
     "sequences per rank per forward and backward"},
    {"gradient_accumulation_steps", K_INT, F_NULLABLE, NULL, NULL, NULL, "> 0",
     "micro-batches per step; derived from the other two when not given"},
    {"gradient_clipping", K_NUM, 0, NULL, NULL, "1.0", ">= 0", "global-norm gradient clipping (0: off)"},
    {"steps_per_print", K_INT, 0, NULL, NULL, "10", "> 0", "steps between log lines"},
    {"wall_clock_breakdown", K_BOOL, 0, NULL, NULL, "`false`", NULL,
     "recorded in the resolved config; the step lines always carry their timings"},
    {"optimizer", K_OBJ, 0, optimizer_keys, NULL, NULL, NULL, "the optimizer (keys below)"},
    {"scheduler", K_OBJ, F_NULLABLE, scheduler_keys, NULL, "a constant rate", NULL,
     "the learning-rate schedule (keys below)"},
    {"fp16", K_OBJ, 0, fp16_keys, NULL, NULL, NULL, "fp16 precision and dynamic loss scaling (keys below)"},
    {"bf16", K_OBJ, 0, bf16_keys, NULL, NULL, NULL, "bf16 precision (keys below)"},
    {"bfloat16", K_OBJ, 0, bf16_keys, NULL, NULL, NULL, "DeepSpeed's old name of `bf16` (the same keys)"},
    {"zero_optimization", K_OBJ, 0, zero_keys, NULL, NULL, NULL, "ZeRO sharding and offload (keys below)"},
    {"activation_checkpointing", K_OBJ, 0, act_ckpt_keys, NULL, NULL, NULL, "recomputation in the backward (keys below)"},
    {"model", K_OBJ, 0, model_keys, NULL, NULL, NULL, "the model: a directory, a preset or a shape (keys below)"},
    {"data", K_OBJ, 0, data_keys, NULL, NULL, NULL, "the data files and how rows are made (keys below)"},
    {"train", K_OBJ, 0, train_keys, NULL, NULL, NULL, "the run (keys below)"},
    {"checkpoint", K_OBJ, 0, checkpoint_keys, NULL, NULL, NULL, "checkpoints and export (keys below)"},
    {"lora", K_OBJ, F_NULLABLE, lora_keys, NULL, "null (full fine-tune)", NULL,
     "LoRA adapters on a frozen base (keys below)"},
    {"dpo", K_OBJ, F_NULLABLE, dpo_keys, NULL, "null (next-token loss)", NULL,
     "DPO on a preference file (keys below)"},
    {"quantization", K_OBJ, F_NULLABLE, quant_keys, NULL, "null (an unquantized base)", NULL,
     "a 4-bit frozen base (QLoRA), transformers' BitsAndBytesConfig names (keys below)"},
    {"aio", K_OBJ, 0, aio_keys, NULL, NULL, NULL, "DeepSpeed's asynchronous I/O settings; none has an effect here"},
    NO_EFFECT("zero_allow_untested_optimizer", K_ANY, NULL),
    NO_EFFECT("zero_force_ds_cpu_optimizer", K_ANY, NULL),
    NO_EFFECT("prescale_gradients", K_ANY, NULL),
    NO_EFFECT("gradient_predivide_factor", K_ANY, NULL),
    NO_EFFECT("communication_data_type", K_ANY, NULL),
    NO_EFFECT("dump_state", K_ANY, NULL),
    NO_EFFECT("flops_profiler", K_ANY, NULL),
    NO_EFFECT("tensorboard", K_ANY, " (convert train.metrics with tools/metrics_to_tensorboard.py)"),
    NO_EFFECT("wandb", K_ANY, " (convert train.metrics with tools/metrics_to_wandb.py)"),
    NO_EFFECT("csv_monitor", K_ANY, NULL),
    NO_EFFECT("comms_logger", K_ANY, NULL),
    NO_EFFECT("memory_breakdown", K_ANY, NULL),
    {0},
};

/* ---- checking keys and types ------------------------------------------- */

/* Edit distance, case-insensitive, for "did you mean" (short names only). */
static int edit_distance(const char *a, const char *b)
{
    enum { MAX_LEN = 64 };
    size_t la = strlen(a), lb = strlen(b);
    if (la >= MAX_LEN || lb >= MAX_LEN)
        return INT_MAX;
    int row[MAX_LEN + 1];
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int cost = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
            int best = diag + cost;
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

static const char *closest_key(const char *key, const struct key_spec *specs)
{
    const char *best = NULL;
    int best_distance = INT_MAX;
    for (const struct key_spec *s = specs; s->name; s++) {
        if (s->flags & F_REJECT)
            continue;
        int d = edit_distance(key, s->name);
        if (d < best_distance) {
            best_distance = d;
            best = s->name;
        }
    }
    /* Close enough to be a typo: at most 2 edits, and under a third of the name. */
    size_t len = strlen(key);
    if (best && best_distance <= 2 && (size_t)best_distance * 3 <= len)
        return best;
    return NULL;
}

static void fail_unknown_key(const char *prefix, const char *key, const struct key_spec *specs)
{
    char path[KEY_PATH_CAP];
    join_path(path, sizeof path, prefix, key);
    const char *guess = closest_key(key, specs);
    if (guess) {
        char suggestion[KEY_PATH_CAP];
        join_path(suggestion, sizeof suggestion, prefix, guess);
        fail_input("config: unknown key '%s' (did you mean '%s'?)", path, suggestion);
    }
    char known[1024];
    size_t used = 0;
    known[0] = '\0';
    for (const struct key_spec *s = specs; s->name && used < sizeof known; s++)
        if (!(s->flags & F_REJECT))
            used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", used ? ", " : "", s->name);
    if (prefix && *prefix)
        fail_input("config: unknown key '%s'; the keys of '%s' are: %s", path, prefix, known);
    fail_input("config: unknown key '%s'; the top-level keys are: %s", path, known);
}

static const char *kind_wanted(enum key_kind kind)
{
    switch (kind) {
    case K_INT: return "an integer";
    case K_NUM: return "a number";
    case K_BOOL: return "true or false";
    case K_STR: return "a string";
    case K_OBJ: return "an object ({...})";
    case K_ARRAY: return "an array";
    case K_ANY: return "any value";
    }
    return "?";
}

/* Largest magnitude at which every integer is exactly representable in a double. */
#define EXACT_INTEGER_LIMIT 9007199254740992.0

static void check_type(const char *path, const struct key_spec *spec, const json_t *v)
{
    if (spec->kind == K_ANY)
        return;
    if (json_is_null(v)) {
        if (spec->flags & F_NULLABLE)
            return;
        fail_input("config: '%s' must be %s, got null", path, kind_wanted(spec->kind));
    }
    if (json_is_string(v) && strcmp(json_string_value(v), "auto") == 0 && spec->kind != K_STR)
        fail_input("config: '%s' is \"auto\": \"auto\" is filled in by the Hugging Face Trainer, which shardlm does "
                   "not use; give %s",
                   path, kind_wanted(spec->kind));
    bool ok = false;
    switch (spec->kind) {
    case K_INT:
        if (json_is_integer(v)) {
            ok = true;
        } else if (json_is_real(v)) {
            /* 5e8 and 8.0 are integers written as reals (common in DeepSpeed files). */
            double d = json_real_value(v);
            if (d != floor(d) || fabs(d) > EXACT_INTEGER_LIMIT)
                fail_input("config: '%s' must be an integer, got %.15g", path, d);
            ok = true;
        }
        break;
    case K_NUM: ok = json_is_number(v); break;
    case K_BOOL: ok = json_is_boolean(v); break;
    case K_STR: ok = json_is_string(v); break;
    case K_OBJ: ok = json_is_object(v); break;
    case K_ARRAY: ok = json_is_array(v); break;
    case K_ANY: ok = true; break;
    }
    if (!ok)
        fail_input("config: '%s' must be %s, got %s", path, kind_wanted(spec->kind), json_kind_name(v));
}

/* Checks every key of `obj` against `specs`, recursively; warns once for each
 * key that is accepted without effect. */
void check_keys(json_t *obj, const char *prefix, const struct key_spec *specs)
{
    const char *key;
    json_t *value;
    json_object_foreach(obj, key, value) {
        const struct key_spec *spec = specs;
        while (spec->name && strcmp(spec->name, key) != 0)
            spec++;
        if (!spec->name)
            fail_unknown_key(prefix, key, specs);
        char path[KEY_PATH_CAP];
        join_path(path, sizeof path, prefix, key);
        if (spec->flags & F_REJECT)
            fail_input("config: '%s' %s", path, spec->hint);
        check_type(path, spec, value);
        if (spec->flags & F_NO_EFFECT)
            log_warn("%s is accepted but has no effect in shardlm%s", path, spec->hint ? spec->hint : "");
        if (spec->kind == K_OBJ && spec->children && json_is_object(value))
            check_keys(value, path, spec->children);
    }
}
