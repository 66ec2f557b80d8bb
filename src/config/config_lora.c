/*
 * config_lora — the lora section (PEFT's LoraConfig vocabulary): rank, alpha,
 * dropout, init, target_modules (PEFT's per-architecture default when not
 * given) and modules_to_save. The config checks the lists' form; whether each
 * name matches a module of the model is checked where the adapters are laid
 * out (model_add_lora, model/model.h), so the config builds no model.
 */
#include "config_internal.h"
#include "model/arch.h"

#include "core/util.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* PEFT's LoraConfig defaults (peft/tuners/lora/config.py); its default
 * target_modules per architecture are in the architecture table (model/arch.h). */
#define LORA_R_DEFAULT 8
#define LORA_ALPHA_DEFAULT 8.0
#define LORA_DROPOUT_DEFAULT 0.0

/* A setting with two names (PEFT's beside ours): the value of the one given
 * (written back under path), or def; *named: the key the user wrote. */
static double read_num_aliased(json_t *root, const char *path, const char *alias, double def, const char **named)
{
    const bool ours = is_given(root, path), theirs = is_given(root, alias);
    *named = theirs && !ours ? alias : path;
    if (ours && theirs && read_num(root, path, 0, NO_FILL) != read_num(root, alias, 0, NO_FILL))
        fail_input("config: '%s' and '%s' name the same setting with different values; give one", path, alias);
    return read_num(root, path, theirs ? read_num(root, alias, def, NO_FILL) : def, FILL);
}

/* A list of module names at path (strings owned by the document). */
static const char **read_module_list(json_t *root, const char *path, int *n)
{
    json_t *list = doc_get(root, path);
    char text[128];
    *n = (int)json_array_size(list);
    if (*n == 0)
        fail_input("config: '%s' is empty; list module names (e.g. [\"q_proj\", \"v_proj\"]) or remove the key",
                   path);
    const char **out = xcalloc((size_t)*n, sizeof *out);
    for (int i = 0; i < *n; i++) {
        json_t *v = json_array_get(list, (size_t)i);
        if (!json_is_string(v))
            fail_input("config: '%s[%d]' must be a string (a module name), got %s", path, i,
                       json_brief(v, text, sizeof text));
        out[i] = json_string_value(v);
    }
    return out;
}

/* lora.target_modules: PEFT's default for the architecture when not given. */
static void read_lora_targets(struct lora_config *l, json_t *root, const struct model_config *m)
{
    const char *path = "lora.target_modules";
    json_t *v = doc_get(root, path);
    char text[128];
    if (!v || json_is_null(v)) {
        json_t *def = json_array();
        const char *const *names = arch_find(m->type)->lora_targets;
        for (; *names; names++)
            json_array_append_new(def, json_string(*names));
        json_object_set_new(doc_get(root, "lora"), "target_modules", def);
    } else if (json_is_string(v)) {
        if (strcmp(json_string_value(v), "all-linear") != 0)
            fail_input("config: '%s' is \"%s\"; give a list of module names (e.g. [\"q_proj\", \"v_proj\"]) or "
                       "\"all-linear\" (regular expressions are not supported)",
                       path, json_string_value(v));
        l->all_linear = true;
        return;
    } else if (!json_is_array(v)) {
        fail_input("config: '%s' must be a list of module names or \"all-linear\", got %s", path,
                   json_brief(v, text, sizeof text));
    }
    l->target_modules = read_module_list(root, path, &l->n_target_modules);
}

void read_lora(struct config *cfg, json_t *root)
{
    struct lora_config *l = &cfg->lora;
    json_t *section = doc_get(root, "lora");
    if (!section || json_is_null(section))
        return;
    l->enabled = true;
    const struct model_config *mc = &cfg->model;
    const char *named;
    char text[128];
    l->r = read_int(root, "lora.r", LORA_R_DEFAULT, FILL);
    if (l->r <= 0)
        fail_input("config: 'lora.r' must be a positive integer (the adapters' rank; PEFT's default is %d), got %d",
                   LORA_R_DEFAULT, l->r);
    const long long C = mc->n_embd, widest = mc->ffn_dim > 3 * C ? mc->ffn_dim : 3 * C;
    char keys[128];
    snprintf(keys, sizeof keys, "lora.r %d x (model.n_embd + the widest layer's outputs)", l->r);
    check_bound("the adapters of one linear layer", sat_mul(l->r, C + widest), CONFIG_MAX_TENSOR, keys);
    l->alpha = read_num_aliased(root, "lora.alpha", "lora.lora_alpha", LORA_ALPHA_DEFAULT, &named);
    if (!(l->alpha > 0) || !isfinite(l->alpha))
        fail_input("config: '%s' must be positive (the adapters' output is scaled by alpha / r; PEFT's default is "
                   "%g), got %g",
                   named, LORA_ALPHA_DEFAULT, l->alpha);
    l->dropout = read_num_aliased(root, "lora.dropout", "lora.lora_dropout", LORA_DROPOUT_DEFAULT, &named);
    if (!(l->dropout >= 0 && l->dropout < 1))
        fail_input("config: '%s' must be in [0, 1) (the probability that an adapter input is zeroed; 0: no "
                   "dropout), got %g",
                   named, l->dropout);
    json_t *init = doc_get(root, "lora.init");
    if (!init) { /* the resolved config shows the default */
        json_object_set_new(section, "init", json_string("default"));
        init = doc_get(root, "lora.init");
    }
    const char *init_name = json_is_string(init) ? json_string_value(init) : NULL;
    if (!init || json_is_true(init) || (init_name && strcmp(init_name, "default") == 0))
        l->init = LORA_INIT_DEFAULT;
    else if (json_is_false(init))
        l->init = LORA_INIT_RANDOM;
    else if (init_name && strcmp(init_name, "gaussian") == 0)
        l->init = LORA_INIT_GAUSSIAN;
    else
        fail_input("config: 'lora.init' is %s; known: \"default\" or true (PEFT's: A Kaiming-uniform, B zero), "
                   "\"gaussian\" (A normal with std 1 / r, B zero), false (A and B both as nn.Linear's default, "
                   "PEFT's init_lora_weights=False: the adapters change the output from the first step)",
                   json_brief(init, text, sizeof text));
    read_lora_targets(l, root, mc);
    json_t *save = doc_get(root, "lora.modules_to_save");
    if (save && !json_is_null(save))
        l->modules_to_save = read_module_list(root, "lora.modules_to_save", &l->n_modules_to_save);
}
