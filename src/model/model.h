/*
 * model — what a model is made of: units of flat parameter buffers and the
 * named tensors inside them (DESIGN §3). Shapes only; no buffers, no kernels.
 *
 * A GPT-2 model is n_layer + 2 units:
 *   unit 0            embedding: wte.weight (Vp, C), wpe.weight (n_positions, C)
 *   unit 1 .. L       block l-1: h.{l}.ln_1.weight (C) ... h.{l}.mlp.c_proj.bias (C)
 *   unit L + 1        head: ln_f.weight (C), ln_f.bias (C); the LM head is tied to wte
 * Tensor names and shapes are those of Hugging Face's GPT2Model; Conv1D weights
 * are (in, out), input-major, so y = x @ W + b with row-major W.
 *
 * A Llama model (model.type "llama") has the same units with Hugging Face
 * LlamaForCausalLM's names and (out, in) nn.Linear shapes:
 *   unit 0            model.embed_tokens.weight (Vp, C)
 *   unit 1 .. L       model.layers.{l}.input_layernorm.weight (C), self_attn.q_proj (C, C),
 *                     k_proj, v_proj (KV, C) with KV = C / n_head * n_kv_head, o_proj (C, C),
 *                     post_attention_layernorm.weight (C), mlp.gate_proj, up_proj (F, C),
 *                     down_proj (C, F)
 *   unit L + 1        model.norm.weight (C), lm_head.weight (Vp, C) unless tie_word_embeddings
 * A Gemma model (model.type "gemma") is a Llama model with
 * pre_feedforward_layernorm.weight and post_feedforward_layernorm.weight (C)
 * after down_proj, Gemma 3's self_attn.q_norm and k_norm (head_dim) after
 * them, every norm weight w of a (1 + w) norm (model_config.norm_offset).
 * k_proj and v_proj follow q_proj with no alignment gap, and up_proj follows
 * gate_proj, so that the kernels read q|k|v and gate|up as one matrix each.
 * model_build sets the architecture fields of cfg (norm, mlp, biases, rotary,
 * tied_head) from the type.
 *
 * Each tensor starts at an offset aligned to MODEL_TENSOR_ALIGN elements inside
 * its unit, so kernels and the optimizer see aligned rows; the unit's numel
 * includes those gaps (they hold zeros and get zero gradients).
 *
 * The planner (plan.c), the engine (zero.c), checkpoints and import/export all
 * use this description; nothing else decides where a tensor lives.
 */
#ifndef SHARDLM_MODEL_H
#define SHARDLM_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/options.h"

#define MODEL_TENSOR_ALIGN 16 /* elements: 64 bytes in fp32, one cache line */
#define MODEL_MAX_NAME 80

enum unit_kind { UNIT_EMBED, UNIT_BLOCK, UNIT_HEAD, UNIT_ADAPTER };
#define MODEL_UNIT_KINDS 4

enum init_kind {
    INIT_NORMAL,     /* normal(0, init_std) */
    INIT_NORMAL_RES, /* normal(0, init_std / sqrt(2 n_layer)): projections into the residual stream */
    INIT_ONES,
    INIT_ZEROS,
    INIT_KAIMING_UNIFORM, /* uniform(-1 / sqrt(fan_in), 1 / sqrt(fan_in)): nn.Linear's kaiming_uniform_(a = sqrt(5)) */
    INIT_NORMAL_INV_R,    /* normal(0, 1 / r): PEFT's "gaussian" lora_A */
};

struct tensor_desc {
    char name[MODEL_MAX_NAME]; /* Hugging Face name, e.g. "h.3.attn.c_attn.weight" */
    int ndim;
    int shape[2];
    size_t offset;             /* elements from the start of the unit */
    size_t numel;
    bool decay;                /* weight decay applies (2-D weights only) */
    enum init_kind init;
    int id;                    /* index over the whole model (seeds the init) */
    int rows_valid;            /* rows holding real values (wte: vocab_size of Vp); others stay zero */
    bool frozen;               /* not trained (model_add_lora): no gradient is computed for it and the optimizer
                                * leaves it alone, also inside a trained unit (modules_to_save) */
};

/* Offsets of one block's tensors in its unit, in canonical order. */
enum block_tensor {
    BT_LN1_W, BT_LN1_B, BT_QKV_W, BT_QKV_B, BT_ATTPROJ_W, BT_ATTPROJ_B,
    BT_LN2_W, BT_LN2_B, BT_FC_W, BT_FC_B, BT_FCPROJ_W, BT_FCPROJ_B,
    BT_COUNT
};
enum embed_tensor { ET_WTE, ET_WPE, ET_COUNT };
enum head_tensor { HT_LNF_W, HT_LNF_B, HT_COUNT };

struct unit_desc {
    enum unit_kind kind;
    int block;                 /* block index for UNIT_BLOCK, -1 otherwise */
    char name[32];             /* "embedding", "block 3", "head" */
    int n_tensors;
    struct tensor_desc *tensors;
    size_t numel;              /* elements including alignment gaps */
    bool frozen;               /* not trained: no gradient, master or optimizer state (zero.h) */
};

/* LoRA (issue 19, config.h struct lora_config): y = W x + scale B A drop(x)
 * on each adapted linear layer of a block. The adapters of block l are one
 * unit of kind UNIT_ADAPTER, after the base units (unit L + 2 + k for the
 * k-th adapted block), holding for each group of adapted layers that read
 * one input (q|k|v, o, gate|up, down), in the block's linear order
 * (model_block_linears), their lora_A (r, in) one after the other (one
 * (k r, in) matrix to the kernels), then their lora_B (out, r), named as
 * PEFT names them without its "base_model.model." prefix:
 * "model.layers.3.self_attn.q_proj.lora_A.weight". On a model whose files
 * fuse q|k|v and gate|up (Phi-3) the layers are the fused modules, as PEFT
 * adapts them: one lora_A (r, C) and one lora_B (Q + 2 KV, r) over the q|k|v
 * output the kernels compute ("self_attn.qkv_proj"), gate|up the same way.
 * Every base tensor is frozen except those of lora.modules_to_save; a base
 * unit none of whose tensors trains is frozen as a whole. */
#define MODEL_MAX_LINEAR 7
struct model_linear {
    const char *module;        /* the module's name inside a block: "self_attn.q_proj", "attn.c_attn" */
    int tensor;                /* its weight's index in the block unit (a fused layer's: the first part's; the
                                * other parts follow it with no gap, out rows in all) */
    int in, out;               /* features */
    int col;                   /* where its output starts in the fused output the kernels compute (q|k|v, gate|up) */
    int group;                 /* layers of a group read the same input (q|k|v, gate|up); groups number 0, 1, ... */
};
struct model_lora {
    bool on;
    int r;
    float scale;               /* alpha / r */
    float dropout;
    int n_linear;              /* linear layers per block (Llama 7, GPT-2 4) */
    struct model_linear linear[MODEL_MAX_LINEAR];
    int *unit;                 /* [n_layer] the block's adapter unit, -1: none */
    int n_groups;
    int (*a_tensor)[MODEL_MAX_LINEAR]; /* [n_layer][linear] lora_A's index in that unit, -1: not adapted */
    int (*b_tensor)[MODEL_MAX_LINEAR]; /* [n_layer][linear] lora_B's */
    int n_adapted;             /* adapted layers in all */
};

struct model {
    struct model_config cfg;
    int n_units;
    struct unit_desc *units;
    size_t n_params;           /* sum of tensor numel (real parameters, no gaps) */
    size_t n_elements;         /* sum of unit numel */
    int n_base_units;          /* n_layer + 2: the units model_build makes; adapters follow */
    struct model_lora lora;
};

void model_build(struct model *m, const struct model_config *cfg);
void model_free(struct model *m);

static inline int model_block_unit(int layer) { return 1 + layer; }
static inline int model_head_unit(const struct model *m) { return m->cfg.n_layer + 1; }

/* Writes elements [start, start + count) of unit u's initial values into out.
 * Counter-based: the value of each element depends only on the seed, the
 * tensor and the element, so any rank can initialise just its shard and every
 * world size starts from the same weights. */
void model_init_range(const struct model *m, int u, size_t start, size_t count, float *out);

/* The linear layers of one block, in order (the same for every block). */
int model_block_linears(const struct model *m, struct model_linear out[MODEL_MAX_LINEAR]);

/* Adds LoRA's adapter units for the config's target_modules, freezes the
 * base except lora.modules_to_save, and seeds the adapters' init from
 * init_seed (A as lora.init says, B zero). Nothing when l is not enabled.
 * First checks the config's module names against this model (fail_input
 * naming the key: a name that matches no module, a module both adapted and
 * in modules_to_save). */
void model_add_lora(struct model *m, const struct lora_config *l);
/* The parameters of the adapter units. */
size_t model_adapter_params(const struct model *m);
/* Whether unit u holds adapters. */
static inline bool model_is_adapter(const struct model *m, int u) { return u >= m->n_base_units; }

/* Frozen units (DESIGN §11): a frozen unit is sharded and gathered like any
 * other, but has no gradient, master or optimizer state, and the backward
 * computes only the input gradients of its layers. model_build trains every
 * unit; LoRA will freeze the base units beside trainable adapter units.
 *
 * model_freeze marks the units that spec names: a comma-separated list of
 * "embedding", "head", "blocks" (every block) or unit indices. For now its
 * only caller is the test hook SHARDLM_TEST_FREEZE (train and plan), which
 * `what` names in errors; a bad spec, or one that leaves nothing to train,
 * fails with exit status 2. Returns the number of frozen units. */
int model_freeze(struct model *m, const char *spec, const char *what);
#define MODEL_TEST_FREEZE_ENV "SHARDLM_TEST_FREEZE"
/* The parameters (tensor elements) of the frozen units. */
size_t model_frozen_params(const struct model *m);
/* Freezes every unit and tensor: a model only run forward (generation, evaluation). */
void model_freeze_all(struct model *m);

/* Finds a tensor by name; returns false when absent. */
bool model_find_tensor(const struct model *m, const char *name, int *unit, int *tensor);

/* Modules, as PEFT names them: a tensor's module is its name without the
 * last component ("model.layers.3.self_attn.q_proj" holds q_proj.weight). */
enum model_modules {
    MODEL_MODULES_ALL,          /* every module with parameters */
    MODEL_MODULES_BLOCK_LINEAR, /* the linear layers of the blocks (LoRA's targets) */
};
/* Whether name matches some module of the set as PEFT matches target_modules
 * and modules_to_save (peft/tuners/tuners_utils.py check_target_module_exists):
 * the module's whole name, or its end after a dot ("q_proj", "self_attn.q_proj"). */
bool model_module_matches(const struct model *m, const char *name, enum model_modules set);
/* PEFT's match of one module name (its first len characters) against one
 * configured name: the whole name, or its end after a dot. */
bool model_module_named(const char *module, size_t len, const char *name);
/* The module name of block's linear layer li as PEFT names it: its weight's
 * module with li's last component ("model.layers.3.self_attn.qkv_proj" for
 * Phi-3's fused layer, whose weight here is the part q_proj). */
void model_linear_module(const struct model *m, int block, const struct model_linear *li, char *out, size_t cap);
/* The distinct last components of the set's module names, ", "-separated, for messages. */
void model_module_names(const struct model *m, enum model_modules set, char *out, size_t cap);

/* Whether block l attends through the sliding window (struct attention_layers, core/options.h), and marking it
 * so (l < MODEL_MAX_WINDOWED_LAYERS). */
bool model_attention_sliding(const struct attention_layers *a, int l);
void model_attention_set_sliding(struct attention_layers *a, int l);
/* Positions of block l's key/value cache for sequences of up to Tmax tokens: the window on a sliding block
 * (a ring of the last W positions), Tmax on the others. */
int model_attention_cache_len(const struct model_config *c, int l, int Tmax);
/* Phi-3's longrope over positions up to max_pos beyond original_max_position_embeddings: that length, else 0. A
 * sequence whose largest position + 1 exceeds it takes the long factors (as transformers switches a forward by its
 * largest position): the rotary then has two tables (families/llama.c). */
int model_rope_switch(const struct model_config *c, int max_pos);

/* Model FLOPs per token for forward+backward (6N + attention), as in the PaLM MFU definition. */
double model_flops_per_token(const struct model *m, int seq_len);

#endif
