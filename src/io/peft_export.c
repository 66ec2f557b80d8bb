/*
 * peft_export — LoRA adapters in PEFT's directory format (see peft_export.h).
 */
#include "peft_export.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hf.h"
#include "core/util.h"
#include "model/arch.h"

/* PEFT's saved names start with the PeftModel's path to the base model. */
#define PEFT_PREFIX "base_model.model."

bool peft_fan_in_fan_out(const struct model *m) { return arch_is(m->cfg.type, ARCH_GPT2); }

/* The adapters and the tensors of lora.modules_to_save: every tensor LoRA
 * trains (model_add_lora freezes the rest of the base). */
static bool peft_tensor_name(const struct model *m, int u, int t, char *out, size_t cap)
{
    const struct tensor_desc *td = &m->units[u].tensors[t];
    if (td->frozen)
        return false;
    char hf[ST_MAX_NAME];
    hf_tensor_name(m, td, 1, hf, sizeof hf);
    snprintf(out, cap, PEFT_PREFIX "%s", hf);
    return true;
}

static void refuse_model_dir(const struct model *m, const char *dir)
{
    static const char *const model_files[] = {"config.json", "model.safetensors", "model.safetensors.index.json"};
    (void)m;
    for (size_t i = 0; i < sizeof model_files / sizeof model_files[0]; i++) {
        char path[1100];
        snprintf(path, sizeof path, "%s/%s", dir, model_files[i]);
        if (access(path, F_OK) == 0)
            fail_input("export: '%s' holds a Hugging Face model (%s); a LoRA run exports PEFT's adapter files, which "
                       "must not stand beside another model's: export into a new or empty directory",
                       dir, model_files[i]);
    }
}

void peft_export_begin(struct hf_writer *w, const struct model *m, enum dtype dt, const char *dir, struct comm *comm)
{
    if (!m->lora.on)
        fail_internal("peft_export_begin: the model has no LoRA adapters");
    const struct hf_writer_spec spec = {PEFT_ADAPTER_FILE, 0, peft_tensor_name, refuse_model_dir};
    hf_writer_open(w, m, dt, &spec, dir, comm);
}

/* ---- adapter_config.json ---------------------------------------------------- */

/* The module name of a block's linear weight k ("model.layers.3.self_attn.q_proj"). */
static void linear_module(const struct model *m, int block, int k, char *out, size_t cap)
{
    model_linear_module(m, block, &m->lora.linear[k], out, cap);
}

/* Whether the module of tensor t of unit u (its weight's, or its bias's) is adapted. */
static bool module_adapted(const struct model *m, int u, int t)
{
    const struct unit_desc *ud = &m->units[u];
    if (ud->kind != UNIT_BLOCK)
        return false;
    const char *tn = ud->tensors[t].name;
    const size_t len = (size_t)(strrchr(tn, '.') - tn);
    for (int k = 0; k < m->lora.n_linear; k++) {
        const char *wn = ud->tensors[m->lora.linear[k].tensor].name;
        if (m->lora.a_tensor[ud->block][k] >= 0 && strncmp(wn, tn, len) == 0 && strrchr(wn, '.') == wn + len)
            return true;
    }
    return false;
}

/* Whether the configured name would make PEFT adapt a module of the base
 * that is not adapted here. */
static bool matches_unadapted(const struct model *m, const char *name)
{
    for (int u = 0; u < m->n_base_units; u++)
        for (int t = 0; t < m->units[u].n_tensors; t++) {
            const char *tn = m->units[u].tensors[t].name;
            if (model_module_named(tn, (size_t)(strrchr(tn, '.') - tn), name) && !module_adapted(m, u, t))
                return true;
        }
    return false;
}

/* target_modules: for each adapted module the shortest end of its name that
 * matches nothing unadapted (peft_export.h), each name once. */
static json_t *target_modules(const struct model *m)
{
    json_t *list = json_array();
    char module[MODEL_MAX_NAME];
    for (int b = 0; b < m->cfg.n_layer; b++)
        for (int k = 0; k < m->lora.n_linear; k++) {
            if (m->lora.a_tensor[b][k] < 0)
                continue;
            linear_module(m, b, k, module, sizeof module);
            const char *name = module; /* the whole name, when no shorter end will do */
            for (const char *p = module + strlen(module); p > module; p--)
                if (p[-1] == '.' && !matches_unadapted(m, p)) {
                    name = p;
                    break;
                }
            bool seen = false;
            for (size_t i = 0; i < json_array_size(list); i++)
                seen = seen || strcmp(json_string_value(json_array_get(list, i)), name) == 0;
            if (!seen)
                json_array_append_new(list, json_string(name));
        }
    return list;
}

/* PEFT's init_lora_weights for lora.init. */
static json_t *init_lora_weights(enum lora_init init)
{
    switch (init) {
    case LORA_INIT_DEFAULT: return json_true();
    case LORA_INIT_GAUSSIAN: return json_string("gaussian");
    case LORA_INIT_RANDOM: return json_false();
    }
    fail_internal("peft_export: lora.init %d", (int)init);
}

/* The base directory as a path that works from anywhere (PEFT's
 * AutoPeftModel loads the base from it); as given when it does not resolve. */
static json_t *base_model_name(const char *base_dir)
{
    char resolved[PATH_MAX];
    if (base_dir && base_dir[0] && realpath(base_dir, resolved))
        return json_string(resolved);
    return json_string(base_dir ? base_dir : "");
}

static json_t *adapter_config(const struct model *m, const struct lora_config *l, const char *base_dir)
{
    json_t *c = json_object();
    json_object_set_new(c, "peft_type", json_string("LORA"));
    json_object_set_new(c, "task_type", json_string("CAUSAL_LM"));
    json_object_set_new(c, "base_model_name_or_path", base_model_name(base_dir));
    json_object_set_new(c, "revision", json_null());
    json_object_set_new(c, "inference_mode", json_true());
    json_object_set_new(c, "r", json_integer(l->r));
    /* LoraConfig's lora_alpha is an int; a fractional alpha is kept as it is */
    json_object_set_new(c, "lora_alpha",
                        l->alpha == floor(l->alpha) ? json_integer((json_int_t)l->alpha) : json_real(l->alpha));
    json_object_set_new(c, "lora_dropout", json_real(l->dropout));
    json_object_set_new(c, "target_modules", target_modules(m));
    json_object_set_new(c, "fan_in_fan_out", json_boolean(peft_fan_in_fan_out(m)));
    json_object_set_new(c, "bias", json_string("none"));
    json_object_set_new(c, "use_rslora", json_false());
    json_object_set_new(c, "use_dora", json_false());
    json_t *save = json_null();
    if (l->n_modules_to_save > 0) {
        save = json_array();
        for (int i = 0; i < l->n_modules_to_save; i++)
            json_array_append_new(save, json_string(l->modules_to_save[i]));
    }
    json_object_set_new(c, "modules_to_save", save);
    json_object_set_new(c, "init_lora_weights", init_lora_weights(l->init));
    /* the rest at LoraConfig's defaults, as save_pretrained writes them */
    json_object_set_new(c, "layers_to_transform", json_null());
    json_object_set_new(c, "layers_pattern", json_null());
    json_object_set_new(c, "rank_pattern", json_object());
    json_object_set_new(c, "alpha_pattern", json_object());
    json_object_set_new(c, "megatron_config", json_null());
    json_object_set_new(c, "megatron_core", json_string("megatron.core"));
    json_object_set_new(c, "loftq_config", json_object());
    json_object_set_new(c, "layer_replication", json_null());
    json_object_set_new(c, "auto_mapping", json_null());
    return c;
}

struct adapter_files {
    const struct model *m;
    const struct lora_config *l;
    const char *base_dir;
};

static void publish_adapter_config(void *ctx, const char *dir)
{
    const struct adapter_files *f = ctx;
    char path[1100];
    snprintf(path, sizeof path, "%s/" PEFT_CONFIG_FILE, dir);
    json_t *c = adapter_config(f->m, f->l, f->base_dir);
    hf_write_json(path, c);
    json_decref(c);
}

void peft_export_end(struct hf_writer *w, const struct lora_config *l, const char *base_dir, struct comm *comm)
{
    struct adapter_files f = {w->m, l, base_dir};
    hf_writer_close(w, publish_adapter_config, &f, comm);
}
