#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "core/util.h"

/* packed: right after the previous tensor, with no alignment gap (tensors a
 * kernel reads as one matrix, model.h). */
static void add_tensor_at(struct unit_desc *u, int *id, const char *name, int d0, int d1, bool decay,
                          enum init_kind init, bool packed)
{
    struct tensor_desc *t = &u->tensors[u->n_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = d1 > 0 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1 > 0 ? d1 : 1;
    t->numel = (size_t)d0 * (size_t)t->shape[1];
    t->offset = packed ? u->numel : round_up(u->numel, MODEL_TENSOR_ALIGN);
    t->decay = decay;
    t->init = init;
    t->id = (*id)++;
    t->rows_valid = d0;
    u->numel = t->offset + t->numel;
}

static void add_tensor(struct unit_desc *u, int *id, const char *name, int d0, int d1, bool decay,
                       enum init_kind init)
{
    add_tensor_at(u, id, name, d0, d1, decay, init, false);
}

/* The architecture variant fields of cfg, fixed by the family (config.h). */
static void set_arch(struct model_config *c)
{
    const bool gemma = arch_is(c->type, ARCH_GEMMA), llama = arch_is(c->type, ARCH_LLAMA) || gemma;
    c->norm = llama ? NORM_RMSNORM : NORM_LAYERNORM;
    c->mlp = gemma ? MLP_GEGLU : llama ? MLP_SWIGLU : MLP_GELU;
    c->biases = !llama;
    c->rotary = llama;
    c->tied_head = !llama || c->tie_embeddings;
    c->norm_offset = gemma ? 1.0f : 0.0f; /* Gemma's RMSNorm: x s (1 + w) */
    c->post_norms = gemma;
    if (!gemma)
        c->final_softcap = c->attn_softcap = c->query_scalar = c->rope_local_theta = 0, c->window_pattern = 0;
    if (c->n_kv_head <= 0)
        c->n_kv_head = c->n_head;
    if (c->ffn_dim <= 0)
        c->ffn_dim = 4 * c->n_embd;
    if (c->head_dim <= 0 || !llama)
        c->head_dim = c->n_embd / c->n_head;
    if (!llama || gemma)
        c->qkv_bias = c->fused_projections = false;
    if (!llama || gemma || !(c->partial_rotary > 0 && c->partial_rotary < 1))
        c->partial_rotary = 1.0;
    c->rotary_dim = (int)(c->head_dim * c->partial_rotary);
    if (!llama)
        c->qk_norm = false;
    /* Gemma's attention options, every layer's (the window is the config's, model.sliding_layers): the scores'
     * soft-cap, and their scale query_pre_attn_scalar^-1/2 (0, the kernels' 1 / sqrt(head_dim), when the scalar
     * is head_dim) */
    c->attention.softcap = (float)c->attn_softcap;
    c->attention.scale = c->query_scalar > 0 && c->query_scalar != c->head_dim ? (float)(1.0 / sqrt(c->query_scalar))
                                                                              : 0.0f;
}

static struct unit_desc *start_unit(struct model *m, int u, enum unit_kind kind, int block, const char *name,
                                    int max_tensors)
{
    struct unit_desc *ud = &m->units[u];
    ud->kind = kind;
    ud->block = block;
    snprintf(ud->name, sizeof ud->name, "%s", name);
    ud->tensors = xcalloc((size_t)max_tensors, sizeof *ud->tensors);
    return ud;
}

#define T(u, suffix, d0, d1, decay, init)                       \
    snprintf(name, sizeof name, "%s" suffix, prefix);           \
    add_tensor(u, &id, name, d0, d1, decay, init)
#define T_PACKED(u, suffix, d0, d1, decay, init)                \
    snprintf(name, sizeof name, "%s" suffix, prefix);           \
    add_tensor_at(u, &id, name, d0, d1, decay, init, true)

/* GPT-2 (Hugging Face GPT2Model): Conv1D weights (in, out), learned positions, tied head. */
static void build_gpt2(struct model *m)
{
    const struct model_config *cfg = &m->cfg;
    const int L = cfg->n_layer, C = cfg->n_embd, Vp = cfg->padded_vocab;
    int id = 0;
    char name[MODEL_MAX_NAME], prefix[32], uname[32];
    struct unit_desc *e = start_unit(m, 0, UNIT_EMBED, -1, "embedding", ET_COUNT);
    add_tensor(e, &id, "wte.weight", Vp, C, true, INIT_NORMAL);
    e->tensors[ET_WTE].rows_valid = cfg->vocab_size;
    add_tensor(e, &id, "wpe.weight", cfg->n_positions, C, true, INIT_NORMAL);
    for (int l = 0; l < L; l++) {
        snprintf(uname, sizeof uname, "block %d", l);
        snprintf(prefix, sizeof prefix, "h.%d.", l);
        struct unit_desc *u = start_unit(m, model_block_unit(l), UNIT_BLOCK, l, uname, BT_COUNT);
        T(u, "ln_1.weight", C, 0, false, INIT_ONES);
        T(u, "ln_1.bias", C, 0, false, INIT_ZEROS);
        T(u, "attn.c_attn.weight", C, 3 * C, true, INIT_NORMAL);
        T(u, "attn.c_attn.bias", 3 * C, 0, false, INIT_ZEROS);
        T(u, "attn.c_proj.weight", C, C, true, INIT_NORMAL_RES);
        T(u, "attn.c_proj.bias", C, 0, false, INIT_ZEROS);
        T(u, "ln_2.weight", C, 0, false, INIT_ONES);
        T(u, "ln_2.bias", C, 0, false, INIT_ZEROS);
        T(u, "mlp.c_fc.weight", C, 4 * C, true, INIT_NORMAL);
        T(u, "mlp.c_fc.bias", 4 * C, 0, false, INIT_ZEROS);
        T(u, "mlp.c_proj.weight", 4 * C, C, true, INIT_NORMAL_RES);
        T(u, "mlp.c_proj.bias", C, 0, false, INIT_ZEROS);
    }
    struct unit_desc *h = start_unit(m, model_head_unit(m), UNIT_HEAD, -1, "head", HT_COUNT);
    add_tensor(h, &id, "ln_f.weight", C, 0, false, INIT_ONES);
    add_tensor(h, &id, "ln_f.bias", C, 0, false, INIT_ZEROS);
}

/* Llama (Hugging Face LlamaForCausalLM, and the Llama-like Qwen2 and Qwen3):
 * nn.Linear weights (out, in), RMSNorm weights only, SwiGLU MLP, rotary
 * positions (no table), lm_head in the head unit unless tied to
 * embed_tokens. k_proj and v_proj follow q_proj without a gap, up_proj
 * follows gate_proj: each group is one matrix to the kernels. The attention
 * is NH x head_dim wide (Qwen3: not n_embd). Qwen2's q|k|v biases are one
 * packed vector and Qwen3's q_norm and k_norm (head_dim each) come after
 * down_proj, so that every Llama keeps its tensor numbers (LT_* in llama.c;
 * model_llama_extras gives the others'). Gemma's block is the same with
 * pre_feedforward_layernorm and post_feedforward_layernorm after down_proj
 * (its post_attention_layernorm normalises the attention's output) and its
 * norms initialised to 0 (they scale by 1 + w). */
static void build_llama(struct model *m)
{
    const struct model_config *cfg = &m->cfg;
    const int L = cfg->n_layer, C = cfg->n_embd, Vp = cfg->padded_vocab, F = cfg->ffn_dim;
    const int Q = cfg->n_head * cfg->head_dim, KV = cfg->head_dim * cfg->n_kv_head;
    const enum init_kind norm_init = cfg->norm_offset != 0.0f ? INIT_ZEROS : INIT_ONES;
    int id = 0;
    char name[MODEL_MAX_NAME], prefix[32], uname[32];
    struct unit_desc *e = start_unit(m, 0, UNIT_EMBED, -1, "embedding", 1);
    add_tensor(e, &id, "model.embed_tokens.weight", Vp, C, true, INIT_NORMAL);
    e->tensors[0].rows_valid = cfg->vocab_size;
    for (int l = 0; l < L; l++) {
        snprintf(uname, sizeof uname, "block %d", l);
        snprintf(prefix, sizeof prefix, "model.layers.%d.", l);
        struct unit_desc *u = start_unit(m, model_block_unit(l), UNIT_BLOCK, l, uname, 14);
        T(u, "input_layernorm.weight", C, 0, false, norm_init);
        T(u, "self_attn.q_proj.weight", Q, C, true, INIT_NORMAL);
        T_PACKED(u, "self_attn.k_proj.weight", KV, C, true, INIT_NORMAL);
        T_PACKED(u, "self_attn.v_proj.weight", KV, C, true, INIT_NORMAL);
        T(u, "self_attn.o_proj.weight", C, Q, true, INIT_NORMAL);
        T(u, "post_attention_layernorm.weight", C, 0, false, norm_init);
        T(u, "mlp.gate_proj.weight", F, C, true, INIT_NORMAL);
        T_PACKED(u, "mlp.up_proj.weight", F, C, true, INIT_NORMAL);
        T(u, "mlp.down_proj.weight", C, F, true, INIT_NORMAL);
        if (cfg->post_norms) {
            T(u, "pre_feedforward_layernorm.weight", C, 0, false, norm_init);
            T(u, "post_feedforward_layernorm.weight", C, 0, false, norm_init);
        }
        if (cfg->qkv_bias) { /* nn.Linear's bias: no decay (HF Trainer's rule for biases) */
            T(u, "self_attn.q_proj.bias", Q, 0, false, INIT_ZEROS);
            T_PACKED(u, "self_attn.k_proj.bias", KV, 0, false, INIT_ZEROS);
            T_PACKED(u, "self_attn.v_proj.bias", KV, 0, false, INIT_ZEROS);
        }
        if (cfg->qk_norm) {
            T(u, "self_attn.q_norm.weight", cfg->head_dim, 0, false, norm_init);
            T(u, "self_attn.k_norm.weight", cfg->head_dim, 0, false, norm_init);
        }
    }
    struct unit_desc *h = start_unit(m, model_head_unit(m), UNIT_HEAD, -1, "head", 2);
    add_tensor(h, &id, "model.norm.weight", C, 0, false, norm_init);
    if (cfg->tied_head)
        return;
    add_tensor(h, &id, "lm_head.weight", Vp, C, true, INIT_NORMAL);
    h->tensors[1].rows_valid = cfg->vocab_size;
}
#undef T
#undef T_PACKED

void model_build(struct model *m, const struct model_config *cfg)
{
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    set_arch(&m->cfg);
    m->n_units = m->n_base_units = cfg->n_layer + 2;
    m->units = xcalloc((size_t)m->n_units, sizeof *m->units);
    if (m->cfg.rotary) /* Llama and the Llama-like families, Gemma among them */
        build_llama(m);
    else
        build_gpt2(m);
    for (int u = 0; u < m->n_units; u++) {
        /* Pad each unit to the alignment too, so shards of units start aligned. */
        m->units[u].numel = round_up(m->units[u].numel, MODEL_TENSOR_ALIGN);
        m->n_elements += m->units[u].numel;
        for (int t = 0; t < m->units[u].n_tensors; t++)
            m->n_params += m->units[u].tensors[t].numel;
    }
}

void model_free(struct model *m)
{
    for (int u = 0; u < m->n_units; u++)
        free(m->units[u].tensors);
    free(m->units);
    free(m->lora.unit);
    free(m->lora.a_tensor);
    free(m->lora.b_tensor);
    memset(m, 0, sizeof *m);
}

/* One normal sample from a counter: two splitmix64 draws from a state keyed by
 * (seed, tensor id, element), so no sequential generator has to be replayed. */
static float counter_normal(uint64_t seed, int tensor_id, size_t element)
{
    uint64_t state = seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)tensor_id << 48) ^ (uint64_t)element;
    splitmix64(&state);
    return rng_normal(&state);
}

/* uniform(-bound, bound) from a counter, as counter_normal. */
static float counter_uniform(uint64_t seed, int tensor_id, size_t element, float bound)
{
    uint64_t state = seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)tensor_id << 48) ^ (uint64_t)element;
    splitmix64(&state);
    return (2.0f * rng_uniform(&state) - 1.0f) * bound;
}

void model_init_range(const struct model *m, int u, size_t start, size_t count, float *out)
{
    const struct unit_desc *ud = &m->units[u];
    const float std = m->cfg.init_std;
    const float res_std = std / sqrtf(2.0f * (float)m->cfg.n_layer);
    memset(out, 0, count * sizeof *out);
    size_t end = start + count;
    for (int ti = 0; ti < ud->n_tensors; ti++) {
        const struct tensor_desc *t = &ud->tensors[ti];
        size_t valid_end = t->offset + (size_t)t->rows_valid * (size_t)t->shape[1];
        size_t lo = t->offset > start ? t->offset : start;
        size_t hi = valid_end < end ? valid_end : end;
        for (size_t i = lo; i < hi; i++) {
            size_t e = i - t->offset;
            float v;
            switch (t->init) {
            case INIT_NORMAL: v = std * counter_normal(m->cfg.init_seed, t->id, e); break;
            case INIT_NORMAL_RES: v = res_std * counter_normal(m->cfg.init_seed, t->id, e); break;
            case INIT_ONES: v = 1.0f; break;
            case INIT_KAIMING_UNIFORM: v = counter_uniform(m->cfg.init_seed, t->id, e, 1.0f / sqrtf((float)t->shape[1])); break;
            case INIT_NORMAL_INV_R: v = counter_normal(m->cfg.init_seed, t->id, e) / (float)t->shape[0]; break;
            default: v = 0.0f; break;
            }
            out[i - start] = v;
        }
    }
}

static void freeze_one(struct model *m, const char *item, const char *what)
{
    if (strcmp(item, "embedding") == 0) {
        m->units[0].frozen = true;
    } else if (strcmp(item, "head") == 0) {
        m->units[model_head_unit(m)].frozen = true;
    } else if (strcmp(item, "blocks") == 0) {
        for (int l = 0; l < m->cfg.n_layer; l++)
            m->units[model_block_unit(l)].frozen = true;
    } else {
        char *end;
        long u = strtol(item, &end, 10);
        if (end == item || *end || u < 0 || u >= m->n_units)
            fail_input("%s: \"%s\" names no unit; give \"embedding\", \"head\", \"blocks\" or unit indices 0..%d, "
                       "comma-separated",
                       what, item, m->n_units - 1);
        m->units[u].frozen = true;
    }
}

int model_freeze(struct model *m, const char *spec, const char *what)
{
    char item[32];
    for (const char *p = spec;;) {
        size_t n = strcspn(p, ",");
        snprintf(item, sizeof item, "%.*s", (int)(n < sizeof item ? n : sizeof item - 1), p);
        freeze_one(m, item, what);
        if (!p[n])
            break;
        p += n + 1;
    }
    int frozen = 0;
    for (int u = 0; u < m->n_units; u++) {
        frozen += m->units[u].frozen;
        for (int t = 0; m->units[u].frozen && t < m->units[u].n_tensors; t++)
            m->units[u].tensors[t].frozen = true;
    }
    if (frozen == m->n_units)
        fail_input("%s: \"%s\" freezes every unit, which leaves nothing to train; leave one unit trainable", what,
                   spec);
    return frozen;
}

void model_freeze_all(struct model *m)
{
    for (int u = 0; u < m->n_units; u++) {
        m->units[u].frozen = true;
        for (int t = 0; t < m->units[u].n_tensors; t++)
            m->units[u].tensors[t].frozen = true;
    }
}

size_t model_frozen_params(const struct model *m)
{
    size_t n = 0;
    for (int u = 0; u < m->n_units; u++)
        for (int t = 0; t < m->units[u].n_tensors; t++)
            if (m->units[u].tensors[t].frozen)
                n += m->units[u].tensors[t].numel;
    return n;
}

size_t model_adapter_params(const struct model *m)
{
    size_t n = 0;
    for (int u = m->n_base_units; u < m->n_units; u++)
        for (int t = 0; t < m->units[u].n_tensors; t++)
            n += m->units[u].tensors[t].numel;
    return n;
}

static size_t module_length(const char *tensor_name);

/* ---- LoRA ------------------------------------------------------------------------------ */

int model_block_linears(const struct model *m, struct model_linear out[MODEL_MAX_LINEAR])
{
    const int C = m->cfg.n_embd, F = m->cfg.ffn_dim, KV = m->cfg.head_dim * m->cfg.n_kv_head;
    const int Q = m->cfg.head_dim * m->cfg.n_head;
    if (arch_is(m->cfg.type, ARCH_LLAMA) && m->cfg.fused_projections) {
        /* Phi-3: the modules of the files (and PEFT's) are the fused ones; each adapts the whole q|k|v or gate|up
         * output the kernels compute, from the first part's weight on (the parts follow it with no gap) */
        const struct model_linear l[] = {
            {"self_attn.qkv_proj", 1, C, Q + 2 * KV, 0, 0}, {"self_attn.o_proj", 4, Q, C, 0, 1},
            {"mlp.gate_up_proj", 6, C, 2 * F, 0, 2},        {"mlp.down_proj", 8, F, C, 0, 3},
        };
        memcpy(out, l, sizeof l);
        return 4;
    }
    if (m->cfg.rotary) { /* Llama and the Llama-like families, Gemma among them */
        const struct model_linear l[] = {
            {"self_attn.q_proj", 1, C, Q, 0, 0},  {"self_attn.k_proj", 2, C, KV, Q, 0}, {"self_attn.v_proj", 3, C, KV, Q + KV, 0},
            {"self_attn.o_proj", 4, Q, C, 0, 1},  {"mlp.gate_proj", 6, C, F, 0, 2},     {"mlp.up_proj", 7, C, F, F, 2},
            {"mlp.down_proj", 8, F, C, 0, 3},
        };
        memcpy(out, l, sizeof l);
        return 7;
    }
    const struct model_linear l[] = {
        {"attn.c_attn", BT_QKV_W, C, 3 * C, 0, 0},
        {"attn.c_proj", BT_ATTPROJ_W, C, C, 0, 1},
        {"mlp.c_fc", BT_FC_W, C, 4 * C, 0, 2},
        {"mlp.c_proj", BT_FCPROJ_W, 4 * C, C, 0, 3},
    };
    memcpy(out, l, sizeof l);
    return 4;
}

void model_linear_module(const struct model *m, int block, const struct model_linear *li, char *out, size_t cap)
{
    const char *w = m->units[model_block_unit(block)].tensors[li->tensor].name;
    size_t len = module_length(w), begin = len;
    while (begin > 0 && w[begin - 1] != '.')
        begin--;
    const char *last = strrchr(li->module, '.');
    snprintf(out, cap, "%.*s%s", (int)begin, w, last ? last + 1 : li->module);
}

bool model_module_named(const char *module, size_t len, const char *name)
{
    const size_t n = strlen(name);
    return n && n <= len && memcmp(module + len - n, name, n) == 0 && (n == len || module[len - n - 1] == '.');
}

static bool in_list(const char *module, size_t len, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (model_module_named(module, len, names[i]))
            return true;
    return false;
}

/* Each name of list (the config's key path) matches a module of the set in m;
 * what: the set's name in messages. */
static void check_module_list(const struct model *m, const char *path, const char *const *list, int n,
                              enum model_modules set, const char *what)
{
    char names[1024];
    for (int i = 0; i < n; i++) {
        if (model_module_matches(m, list[i], set))
            continue;
        model_module_names(m, set, names, sizeof names);
        const bool lm_head = strcmp(list[i], "lm_head") == 0;
        fail_input("config: '%s' has \"%s\", which matches no %s of this %s model%s; its %ss are: %s", path, list[i],
                   what, m->cfg.type,
                   lm_head && set == MODEL_MODULES_BLOCK_LINEAR ? " (to train the LM head, list it in "
                                                                  "lora.modules_to_save)"
                   : lm_head && m->cfg.tied_head ? " (its LM head is the token embedding, tied)"
                                                 : "",
                   what, names);
    }
}

/* Whether name matches a part of a fused linear layer (Phi-3's q_proj ... up_proj): a block tensor inside the
 * span of a layer whose output is wider than its first tensor. */
static bool module_is_part(const struct model *m, const char *name)
{
    const struct unit_desc *ud = &m->units[model_block_unit(0)];
    struct model_linear li[MODEL_MAX_LINEAR];
    const int n = model_block_linears(m, li);
    for (int k = 0; k < n; k++) {
        const struct tensor_desc *first = &ud->tensors[li[k].tensor];
        const size_t end = first->offset + (size_t)li[k].out * (size_t)li[k].in;
        for (int t = 0; li[k].out != first->shape[0] && t < ud->n_tensors; t++) {
            const struct tensor_desc *td = &ud->tensors[t];
            if (td->offset >= first->offset && td->offset < end &&
                model_module_named(td->name, module_length(td->name), name))
                return true;
        }
    }
    return false;
}

/* lora.target_modules and lora.modules_to_save against the model they adapt:
 * every name matches a module, and no module is both adapted and saved. */
static void check_lora_names(const struct model *m, const struct lora_config *l)
{
    check_module_list(m, "lora.target_modules", l->target_modules, l->n_target_modules,
                      MODEL_MODULES_BLOCK_LINEAR, "linear layer");
    check_module_list(m, "lora.modules_to_save", l->modules_to_save, l->n_modules_to_save, MODEL_MODULES_ALL,
                      "module");
    for (int i = 0; m->cfg.fused_projections && i < l->n_modules_to_save; i++)
        if (module_is_part(m, l->modules_to_save[i]))
            fail_input("config: lora.modules_to_save has \"%s\", a part of a fused projection (Phi-3's qkv_proj, "
                       "gate_up_proj), which PEFT could not load; adapt it with lora.target_modules instead",
                       l->modules_to_save[i]);
    for (int i = 0; i < l->n_modules_to_save; i++) {
        const char *name = l->modules_to_save[i];
        bool adapted = l->all_linear && model_module_matches(m, name, MODEL_MODULES_BLOCK_LINEAR);
        for (int j = 0; j < l->n_target_modules; j++)
            adapted = adapted || strcmp(name, l->target_modules[j]) == 0;
        if (adapted)
            fail_input("config: \"%s\" is in lora.modules_to_save and adapted by lora.target_modules; a module is "
                       "either adapted or trained in full: remove it from one of them",
                       name);
    }
}

void model_add_lora(struct model *m, const struct lora_config *l)
{
    if (!l->enabled)
        return;
    check_lora_names(m, l);
    struct model_lora *lo = &m->lora;
    const int L = m->cfg.n_layer;
    lo->on = true;
    lo->r = l->r;
    lo->scale = (float)(l->alpha / l->r);
    lo->dropout = (float)l->dropout;
    lo->n_linear = model_block_linears(m, lo->linear);
    lo->unit = xcalloc((size_t)L, sizeof *lo->unit);
    lo->a_tensor = xcalloc((size_t)L, sizeof *lo->a_tensor);
    lo->b_tensor = xcalloc((size_t)L, sizeof *lo->b_tensor);
    lo->n_groups = lo->linear[lo->n_linear - 1].group + 1;
    /* every base tensor frozen, but those of modules_to_save */
    for (int u = 0; u < m->n_units; u++) {
        struct unit_desc *ud = &m->units[u];
        bool any = false;
        for (int t = 0; t < ud->n_tensors; t++) {
            struct tensor_desc *td = &ud->tensors[t];
            td->frozen = !in_list(td->name, module_length(td->name), l->modules_to_save, l->n_modules_to_save);
            any = any || !td->frozen;
        }
        ud->frozen = !any;
    }
    int id = 0;
    for (int u = 0; u < m->n_units; u++)
        id += m->units[u].n_tensors;
    char name[MODEL_MAX_NAME], uname[32];
    for (int b = 0; b < L; b++) {
        lo->unit[b] = -1;
        int adapted[MODEL_MAX_LINEAR], n = 0;
        for (int k = 0; k < lo->n_linear; k++) {
            char module[MODEL_MAX_NAME];
            model_linear_module(m, b, &lo->linear[k], module, sizeof module);
            lo->a_tensor[b][k] = -1;
            if (l->all_linear || in_list(module, strlen(module), l->target_modules, l->n_target_modules))
                adapted[n++] = k;
        }
        if (!n)
            continue;
        m->units = xrealloc(m->units, (size_t)(m->n_units + 1) * sizeof *m->units);
        memset(&m->units[m->n_units], 0, sizeof m->units[m->n_units]);
        snprintf(uname, sizeof uname, "adapters %d", b);
        lo->unit[b] = m->n_units;
        struct unit_desc *ad = start_unit(m, m->n_units++, UNIT_ADAPTER, b, uname, 2 * n);
        /* per group: the lora_A of its adapted layers one after the other (one matrix), then their lora_B */
        for (int g = 0, i0 = 0; g < lo->n_groups; g++) {
            int i1 = i0;
            while (i1 < n && lo->linear[adapted[i1]].group == g)
                i1++;
            for (int pass = 0; pass < 2; pass++)
                for (int i = i0; i < i1; i++) {
                    const struct model_linear *li = &lo->linear[adapted[i]];
                    char module[MODEL_MAX_NAME - 16]; /* room for ".lora_A.weight" */
                    model_linear_module(m, b, li, module, sizeof module);
                    if (pass == 0) {
                        lo->a_tensor[b][adapted[i]] = ad->n_tensors;
                        snprintf(name, sizeof name, "%s.lora_A.weight", module);
                        add_tensor_at(ad, &id, name, l->r, li->in, true,
                                      l->init == LORA_INIT_GAUSSIAN ? INIT_NORMAL_INV_R : INIT_KAIMING_UNIFORM, i > i0);
                    } else {
                        lo->b_tensor[b][adapted[i]] = ad->n_tensors;
                        snprintf(name, sizeof name, "%s.lora_B.weight", module);
                        add_tensor(ad, &id, name, li->out, l->r, true,
                                   l->init == LORA_INIT_RANDOM ? INIT_KAIMING_UNIFORM : INIT_ZEROS);
                        lo->n_adapted++;
                    }
                }
            i0 = i1;
        }
        ad->numel = round_up(ad->numel, MODEL_TENSOR_ALIGN);
        m->n_elements += ad->numel;
        for (int t = 0; t < ad->n_tensors; t++)
            m->n_params += ad->tensors[t].numel;
    }
}

bool model_find_tensor(const struct model *m, const char *name, int *unit, int *tensor)
{
    for (int u = 0; u < m->n_units; u++)
        for (int t = 0; t < m->units[u].n_tensors; t++)
            if (strcmp(m->units[u].tensors[t].name, name) == 0) {
                *unit = u;
                *tensor = t;
                return true;
            }
    return false;
}

/* Length of the module part of a tensor name (up to its last dot). */
static size_t module_length(const char *tensor_name)
{
    const char *dot = strrchr(tensor_name, '.');
    return dot ? (size_t)(dot - tensor_name) : strlen(tensor_name);
}

/* The modules of the set, one at a time: *k counts from 0; false when there are no more. A block's linear layers
 * are model_block_linears' (on a fused model the fused modules, not the tensors' parts); the others, every module
 * with a tensor. */
static bool next_module(const struct model *m, enum model_modules set, int *k, char *out, size_t cap)
{
    if (set == MODEL_MODULES_BLOCK_LINEAR) {
        struct model_linear li[MODEL_MAX_LINEAR];
        const int n = model_block_linears(m, li);
        if (*k >= n * m->cfg.n_layer)
            return false;
        model_linear_module(m, *k / n, &li[*k % n], out, cap);
        ++*k;
        return true;
    }
    for (int u = 0, i = 0; u < m->n_units; u++) {
        if (*k >= i + m->units[u].n_tensors) {
            i += m->units[u].n_tensors;
            continue;
        }
        const char *name = m->units[u].tensors[*k - i].name;
        snprintf(out, cap, "%.*s", (int)module_length(name), name);
        ++*k;
        return true;
    }
    return false;
}

bool model_module_matches(const struct model *m, const char *name, enum model_modules set)
{
    char module[MODEL_MAX_NAME];
    for (int k = 0; next_module(m, set, &k, module, sizeof module);)
        if (model_module_named(module, strlen(module), name))
            return true;
    return false;
}

/* Whether the ", "-separated list holds word. */
static bool listed(const char *list, const char *word)
{
    const size_t n = strlen(word);
    for (const char *p = list; (p = strstr(p, word)) != NULL; p++)
        if ((p == list || p[-1] == ' ') && (p[n] == ',' || p[n] == '\0'))
            return true;
    return false;
}

void model_module_names(const struct model *m, enum model_modules set, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = '\0';
    char module[MODEL_MAX_NAME];
    for (int k = 0; next_module(m, set, &k, module, sizeof module);) {
        const char *dot = strrchr(module, '.'), *word = dot ? dot + 1 : module;
        if (!listed(out, word) && used < cap)
            used += (size_t)snprintf(out + used, cap - used, "%s%s", used ? ", " : "", word);
    }
}

double model_flops_per_token(const struct model *m, int seq_len)
{
    /* 6 flops per parameter per token (2 forward, 4 backward) over the matmul
     * parameters (position tables and the token embedding are lookups, norms
     * and biases negligible), the LM head counted once as a matmul (tied or
     * not), plus attention's QK^T and PV: 12 * L * C * T, with C = heads x head
     * size also under grouped-query attention (causal half not subtracted), as
     * in the PaLM paper's appendix B: 6N + 12 L H Q T. */
    const double L = m->cfg.n_layer, C = m->cfg.n_embd, V = m->cfg.padded_vocab, F = m->cfg.ffn_dim;
    const double KV = (double)m->cfg.head_dim * m->cfg.n_kv_head, Q = (double)m->cfg.head_dim * m->cfg.n_head;
    const double attn = 2.0 * C * Q + 2.0 * C * KV; /* q, o; k, v */
    const double mlp = (m->cfg.mlp == MLP_SWIGLU ? 3.0 : 2.0) * C * F;
    double matmul_params = L * (attn + mlp) + V * C;
    return 6.0 * matmul_params + 12.0 * L * Q * (double)seq_len;
}

bool model_attention_sliding(const struct attention_layers *a, int l)
{
    return a->window > 0 && l >= 0 && l < MODEL_MAX_WINDOWED_LAYERS && (a->sliding[l / 8] >> (l % 8) & 1);
}

void model_attention_set_sliding(struct attention_layers *a, int l)
{
    if (l < 0 || l >= MODEL_MAX_WINDOWED_LAYERS)
        fail_internal("block %d is beyond the %d that may slide", l, MODEL_MAX_WINDOWED_LAYERS);
    a->sliding[l / 8] |= (uint8_t)(1u << (l % 8));
}

int model_attention_cache_len(const struct model_config *c, int l, int Tmax)
{
    const int W = c->attention.window;
    return model_attention_sliding(&c->attention, l) && W < Tmax ? W : Tmax;
}

int model_rope_switch(const struct model_config *c, int max_pos)
{
    const int original = c->rope_scaling.original_max_positions;
    return c->rope_scaling.type == ROPE_SCALING_LONGROPE && max_pos > original ? original : 0;
}
