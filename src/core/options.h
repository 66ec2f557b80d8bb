/*
 * options — the typed run options every layer reads: struct config and its
 * sections (model shape, optimizer, scheduler, fp16 loss scaling, ZeRO,
 * activation checkpointing, data, train, checkpoint, LoRA), with the enums
 * they use.
 *
 * Only types live here, so that the layers below the config loader (core,
 * backend, model, io, zero, families, engine) can take a struct config
 * without depending on how it is read: src/config/ fills it from JSON
 * (config_load) and owns the JSON document it came from.
 */
#ifndef SHARDLM_OPTIONS_H
#define SHARDLM_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "dtype.h"

enum sched_type {
    SCHED_CONSTANT = 0,     /* no "scheduler" section: the optimizer's lr */
    SCHED_WARMUP_LR,        /* DeepSpeed WarmupLR */
    SCHED_WARMUP_DECAY_LR,  /* DeepSpeed WarmupDecayLR */
    SCHED_WARMUP_COSINE_LR, /* DeepSpeed WarmupCosineLR */
};

enum warmup_type { WARMUP_LOG = 0, WARMUP_LINEAR = 1 };

/* Architecture variants, fixed by model.type (model_build sets them). */
enum norm_kind { NORM_LAYERNORM = 0, NORM_RMSNORM };
enum mlp_kind { MLP_GELU = 0, MLP_SWIGLU, MLP_GEGLU };
enum rope_scaling_type { ROPE_SCALING_NONE = 0, ROPE_SCALING_LLAMA3, ROPE_SCALING_LINEAR, ROPE_SCALING_LONGROPE };

/* Longrope's per-frequency factors: one per channel pair, head_dim / 2 at most this. */
#define ROPE_MAX_FACTORS 256

/* Hugging Face's rope_scaling (transformers 5: rope_parameters). Type "llama3"
 * (Llama 3.1): wavelengths longer than original_max_positions /
 * low_freq_factor are divided by factor, shorter than original_max_positions /
 * high_freq_factor kept, and blended between the two. Type "linear": every
 * frequency divided by factor (positions interpolated). Type "longrope"
 * (Phi-3's 128k models): pair i's frequency divided by short_factor[i] and
 * cos, sin times attention_factor, for sequences up to
 * original_max_positions (longer ones take long_factor in transformers;
 * shardlm refuses them). */
struct rope_scaling {
    enum rope_scaling_type type;
    double factor, low_freq_factor, high_freq_factor;
    int original_max_positions;
    double attention_factor;                                         /* longrope */
    int n_factors;                                                   /* longrope: head_dim / 2 */
    double short_factor[ROPE_MAX_FACTORS], long_factor[ROPE_MAX_FACTORS]; /* longrope, as config.json gives them */
};

/* model.vocab_size padded to a multiple of this (model_config.padded_vocab), so the logits matmul has
 * tensor-core friendly shapes (llm.c): the config pads it, and a checkpoint's model is rebuilt with it
 * (run/ckpt_run.c). */
#define MODEL_VOCAB_ALIGN 128

/* The attention of each block as the model's config.json describes it (io/hf_config: Mistral's sliding_window,
 * Qwen2's use_sliding_window and max_window_layers, layer_types), decided once: family_acts_init turns it into
 * each block's backend attn_opts, which the kernels read as data. All zero: every block full causal, no
 * soft-cap, scores scaled by 1 / sqrt(head_dim). A model with sliding layers has at most
 * MODEL_MAX_WINDOWED_LAYERS blocks (the largest released, Gemma 3 27B, has 62; Qwen2.5-72B 80). */
#define MODEL_MAX_WINDOWED_LAYERS 1024
struct attention_layers {
    int window;      /* W of the sliding layers, keys per query with itself (sliding_window; 0: none) */
    uint8_t sliding[MODEL_MAX_WINDOWED_LAYERS / 8]; /* bit l: block l attends through the window */
    float softcap;   /* every block's score soft-cap c (attn_logit_softcapping; 0: none) */
    float scale;     /* every block's score scale (query_pre_attn_scalar^-0.5; 0: 1 / sqrt(head_dim)) */
};

struct model_config {
    char type[16];     /* "gpt2", "llama" or "gemma" */
    char preset[24];   /* model.preset that supplied the defaults, "" when none */
    int n_layer;       /* number of transformer blocks */
    int n_head;        /* attention heads */
    int n_kv_head;     /* key/value heads (grouped-query attention); GPT-2: n_head (0: n_head) */
    int ffn_dim;       /* MLP hidden size; GPT-2: 4 n_embd (0: derived) */
    int n_embd;        /* channels C */
    int n_positions;   /* context length (max sequence) */
    int vocab_size;    /* real vocabulary V */
    int padded_vocab;  /* V rounded up to a multiple of 128 (derived) */
    float init_std;    /* std of the normal init of weights (GPT-2: 0.02) */
    double norm_eps;   /* Llama: RMSNorm's rms_norm_eps as config.json gives it (the kernels take it as float;
                        * an export writes it back as it came: GPT-2's LayerNorm: 1e-5, fixed) */
    double rope_theta; /* Llama: the rotary base (Hugging Face rope_theta) */
    struct rope_scaling rope_scaling; /* Llama: rope_scaling (type none: plain rotary) */
    bool tie_embeddings; /* Llama: tie_word_embeddings (lm_head is embed_tokens); GPT-2: always */
    char pretrained[1024]; /* model.from_pretrained: a Hugging Face directory ("": a random init) */
    struct attention_layers attention; /* each block's attention variant, from config.json (io/hf_config) */
    int head_dim;        /* Llama: channels per attention head (Hugging Face head_dim; Qwen3's differs from
                          * n_embd / n_head); model_build sets n_embd / n_head when 0 */
    double partial_rotary; /* Llama: partial_rotary_factor, the share of a head the rotary turns (Phi-4-mini: 0.75;
                            * 0 or 1: all of it) */
    bool qkv_bias;       /* Llama: q_proj, k_proj, v_proj carry biases (Qwen2) */
    bool qk_norm;        /* Llama: an RMSNorm over each head of q and of k before the rotary (Qwen3) */
    bool fused_projections; /* Llama: the Hugging Face files hold q|k|v as qkv_proj and gate|up as gate_up_proj
                             * (Phi-3); shardlm's tensors are their row ranges (io/hf.c) */
    /* Gemma (model.type "gemma", families/gemma.c): */
    double final_softcap;  /* final_logit_softcapping: logits = cap tanh(logits / cap) (0: none; Gemma 2: 30) */
    double attn_softcap;   /* attn_logit_softcapping (0: none); refused until the attention kernels take it */
    double query_scalar;   /* query_pre_attn_scalar: scores scaled by its -1/2 power (0: head_dim) */
    int window_pattern;    /* layer l is local (sliding_window) unless (l + 1) % pattern == 0 (Gemma 2: 2, Gemma 3:
                            * 6; 0: every layer global) */
    double rope_local_theta; /* the local layers' rotary base (Gemma 3's rope_local_base_freq; 0: rope_theta) */
    uint64_t init_seed;
    /* derived from type by model_build: */
    enum norm_kind norm; /* GPT-2: LayerNorm with bias; Llama: RMSNorm, weight only */
    enum mlp_kind mlp;   /* GPT-2: c_fc, GELU, c_proj; Llama: SwiGLU (gate, up, down) */
    bool biases;         /* linear layers carry biases (GPT-2) */
    bool rotary;         /* rotary position embedding, no position table (Llama) */
    int rotary_dim;      /* the channels of a head the rotary turns, the first ones: int(head_dim partial_rotary)
                          * as transformers computes it (head_dim when whole) */
    bool tied_head;      /* LM head tied to the token embedding (GPT-2) */
    float norm_offset;   /* RMSNorm scales by (norm_offset + w): Gemma 1, others 0 */
    bool post_norms;     /* Gemma: norms after attention and the MLP too (pre_feedforward_layernorm, post_feedforward_...) */
};

/* Model presets (model.preset): published shapes. */
struct optimizer_config {
    char type[16];     /* "AdamW" or "Adam" */
    float lr;
    float beta1, beta2;
    float eps;
    float weight_decay; /* applied to 2-D weights only */
    bool adam_w_mode;   /* true: decoupled decay (AdamW); false: L2 added to the gradient */
};

struct scheduler_config {
    enum sched_type type;
    float warmup_min_lr, warmup_max_lr; /* WarmupLR, WarmupDecayLR */
    int warmup_num_steps;
    enum warmup_type warmup_type;
    int total_num_steps;                /* WarmupDecayLR, WarmupCosineLR */
    float warmup_min_ratio, cos_min_ratio; /* WarmupCosineLR */
};

struct fp16_config {
    bool enabled;
    float loss_scale;          /* 0: dynamic */
    int initial_scale_power;   /* 16 */
    int loss_scale_window;     /* 1000 */
    int hysteresis;            /* 2 */
    bool consecutive_hysteresis;
    float min_loss_scale;      /* 1 */
};

struct zero_config {
    int stage;                        /* 0..3 */
    bool offload_optimizer;           /* offload_optimizer.device == "cpu" */
    bool offload_pin_memory;          /* offload_optimizer.pin_memory */
    bool offload_param;               /* offload_param.device == "cpu" (stage 3): parameter shards in host memory */
    bool offload_param_pin_memory;    /* offload_param.pin_memory */
    /* ZeRO-Infinity (issue 36): device "nvme" sets offload_optimizer (or
     * offload_param) as "cpu" does, and these besides: the state lives in
     * per-job, per-rank files under the path, streamed through
     * buffer_count pinned host buffers. */
    bool offload_optimizer_nvme;      /* offload_optimizer.device == "nvme" */
    bool offload_param_nvme;          /* offload_param.device == "nvme" (stage 3) */
    const char *optimizer_nvme_path;  /* offload_optimizer.nvme_path (owned by the config's document); set
                                       * whenever given, whatever the device (`plan --fit` may use it) */
    const char *param_nvme_path;      /* offload_param.nvme_path (the same) */
    int optimizer_buffer_count;       /* offload_optimizer.buffer_count (DeepSpeed's default 4) */
    int param_buffer_count;           /* offload_param.buffer_count (DeepSpeed's default 5) */
    double param_buffer_size;         /* offload_param.buffer_size, elements (DeepSpeed's default 1e8) */
    double reduce_bucket_size;        /* elements */
    double stage3_prefetch_bucket_size; /* elements; 0 disables prefetch */
    double stage3_max_live_parameters;  /* elements */
    double stage3_param_persistence_threshold; /* elements */
    bool overlap_comm;
    bool contiguous_gradients;
};

struct act_ckpt_config {
    bool enabled;
    int interval;           /* keep every k-th block input, recompute k blocks */
    bool cpu_checkpointing;
};

struct data_config {
    char *train_path;   /* file or glob of .bin shards */
    char *val_path;     /* file or glob; NULL: no validation */
    int seq_len;        /* T (alias data.max_seq_length); defaults to model.n_positions */
    bool shuffle;       /* shuffled window order (default); false: file order, epoch after epoch */
    bool samples;       /* data.train is a sample file (.h5, samples.h), not .bin shards */
    int pad_multiple;   /* data.pad_to_multiple_of: a micro-batch's length rounds up to it (default 8) */
    bool group_by_length; /* sort each megabatch by length */
    bool truncate;      /* data.truncation "truncate" (default): longer samples are cut; false: "drop" */
    bool packing;       /* rows of seq_len hold whole samples, attention confined to each */
    bool allow_tokenizer_mismatch; /* a sample file of another tokenizer than the run's: a warning, not an error */
};

struct train_config {
    int steps;               /* optimizer steps */
    uint64_t seed;           /* data order and sampling */
    int eval_every;          /* validation every N steps (0: never) */
    int eval_batches;        /* micro-batches per validation */
    int sample_tokens;       /* tokens generated at the end (0: none) */
    float sample_temperature;
    char *metrics_path;      /* JSONL file (NULL: none) */
    int threads;             /* 0: OMP default */
};

struct checkpoint_config {
    char *dir;
    int every;   /* steps (0: only at the end) */
    int keep;    /* checkpoints kept (0: all) */
    bool on_error_continue; /* checkpoint.on_error: "stop" (false, default: exit 2) or "continue" (warn, train on) */
    bool export_hf;         /* checkpoint.export_hf: a Hugging Face directory (dir/hf) beside every checkpoint */
};

/* lora: low-rank adapters on a frozen base (issue 19), PEFT's LoraConfig
 * meaning: y = W x + (alpha / r) B A dropout(x) on each targeted linear layer,
 * A (r, in) Kaiming-uniform and B (out, r) zero at the start (PEFT's
 * init_lora_weights=True), so training starts from the base model's output.
 * Defaults are PEFT's: r 8, alpha 8, dropout 0, and when target_modules is
 * not given PEFT's per-architecture default (Llama: q_proj, v_proj; GPT-2:
 * c_attn). Names are matched as PEFT matches them (model.h,
 * model_module_matches): "q_proj" adapts every block's q_proj.
 * model_add_lora (model.h) lays the adapters out and freezes the base. */
enum lora_init {
    LORA_INIT_DEFAULT = 0, /* "default": A Kaiming-uniform (a = sqrt(5), as nn.Linear), B zero */
    LORA_INIT_GAUSSIAN,    /* "gaussian": A normal(0, 1 / r), B zero (PEFT's "gaussian") */
    LORA_INIT_RANDOM,      /* false: A and B Kaiming-uniform (PEFT's init_lora_weights=False, for tests) */
};

struct lora_config {
    bool enabled;              /* the config has a lora section */
    int r;                     /* the adapters' rank */
    double alpha;              /* lora_alpha: the adapters' output scaled by alpha / r */
    double dropout;            /* lora_dropout on the adapters' input, in [0, 1) */
    enum lora_init init;
    bool all_linear;           /* target_modules "all-linear": every linear layer of the blocks */
    int n_target_modules;      /* else these names (strings owned by the config's document) */
    const char **target_modules;
    int n_modules_to_save;     /* modules trained in full beside the adapters (e.g. lm_head) */
    const char **modules_to_save;
};

/* quantization: a 4-bit frozen base (QLoRA, issue 50) under the names of
 * transformers' BitsAndBytesConfig: the blocks' linear weights stored in
 * bitsandbytes' NF4 or FP4 (core/quant4.h), optionally with the absmax
 * double-quantized; embeddings, norms and the LM head stay unquantized, as
 * transformers leaves them. Only with a lora section (the base is frozen). */
struct quant_config {
    bool load_in_4bit;      /* false: the section changes nothing */
    int quant_type;         /* enum quant4_type: bnb_4bit_quant_type, "fp4" (transformers' default) or "nf4" */
    bool double_quant;      /* bnb_4bit_use_double_quant */
    enum dtype compute_dtype; /* bnb_4bit_compute_dtype: must be the run's parameter dtype */
    bool prequantized;        /* model.from_pretrained holds bitsandbytes' 4-bit weights (read dequantized,
                               * io/hf_bnb.h): nothing to quantize again */
    bool storage_bytes;       /* bnb_4bit_quant_storage "uint8" (the default); else the dtype below */
    enum dtype storage_dtype; /* the float dtype the packed bytes are labelled with (FSDP's bf16 storage) */
};

/* dpo: preference fine-tuning on a preference file (issue 37), TRL's
 * DPOConfig names and defaults: loss (engine/dpo.h) on the policy's and the
 * reference's summed log-probabilities of each pair's chosen and rejected
 * completion. The reference is the initial model: with LoRA, the base with
 * the adapters switched off, computed in the same step (unless
 * precompute_ref_log_probs); a full fine-tune needs the log-probabilities
 * precomputed before step 1 (one model in memory). */
struct dpo_config {
    bool enabled;                  /* the config has a dpo section */
    double beta;                   /* 0.1 */
    int loss_type;                 /* enum dpo_loss_type (engine/dpo.h): "sigmoid" (default) or "ipo" */
    double label_smoothing;        /* cDPO's e, [0, 0.5]; sigmoid only */
    bool precompute_ref_log_probs; /* TRL's name: a reference pass before step 1 (full fine-tune: required) */
    char *ref_log_probs_path;      /* where the precomputed log-probs are kept (NULL: beside data.train) */
};

struct config {
    struct model_config model;
    struct optimizer_config optimizer;
    struct scheduler_config scheduler;
    struct fp16_config fp16;
    bool bf16;
    enum dtype dtype;          /* derived from fp16/bf16 */
    struct zero_config zero;
    struct act_ckpt_config act_ckpt;
    struct data_config data;
    struct train_config train;
    struct checkpoint_config checkpoint;
    struct lora_config lora;
    struct dpo_config dpo;
    struct quant_config quant;

    /* Batch: any two of the three given; the third derived at resolve time. 0 = not given. */
    int train_batch_size;
    int micro_batch;            /* train_micro_batch_size_per_gpu */
    int grad_accum;             /* gradient_accumulation_steps */
    float gradient_clipping;    /* 0: off */
    int steps_per_print;
    bool wall_clock_breakdown;

    void *json;                 /* the merged json_t document (resolved config) */
};

#endif
