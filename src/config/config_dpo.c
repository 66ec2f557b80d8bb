/*
 * config_dpo — the dpo section (issue 37): TRL's DPOConfig names and
 * defaults, checked with the loss's own rules (engine/dpo.h).
 */
#include "config_internal.h"

#include "core/util.h"
#include "engine/dpo.h"

#include <jansson.h>
#include <string.h>

void read_dpo(struct config *cfg, json_t *root)
{
    struct dpo_config *d = &cfg->dpo;
    json_t *section = doc_get(root, "dpo");
    if (!section || json_is_null(section))
        return;
    d->enabled = true;
    const struct dpo_params defaults = DPO_DEFAULTS;
    struct dpo_params p = defaults;
    p.beta = read_num(root, "dpo.beta", defaults.beta, FILL);
    const char *type = read_str(root, "dpo.loss_type", dpo_loss_type_name(defaults.loss_type), FILL);
    enum dpo_loss_type t;
    if (!dpo_parse_loss_type(type, &t))
        fail_input("config: 'dpo.loss_type' is \"%s\"; known: \"sigmoid\" (DPO), \"ipo\"", type);
    p.loss_type = t;
    p.label_smoothing = read_num(root, "dpo.label_smoothing", defaults.label_smoothing, FILL);
    const char *problem = dpo_params_problem(&p);
    if (problem)
        fail_input("config: dpo: %s", problem);
    d->beta = p.beta;
    d->loss_type = (int)p.loss_type;
    d->label_smoothing = p.label_smoothing;
    /* LoRA: the reference is the base with the adapters off, in the same
     * step; a full fine-tune holds one model, so its reference log-probs are
     * computed before step 1. */
    d->precompute_ref_log_probs = read_bool(root, "dpo.precompute_ref_log_probs", !cfg->lora.enabled, FILL);
    if (!d->precompute_ref_log_probs && !cfg->lora.enabled)
        fail_input("config: 'dpo.precompute_ref_log_probs' is false on a full fine-tune: shardlm keeps one model, "
                   "so the reference log-probs must be computed before step 1; set it to true (or add a lora "
                   "section: the base with the adapters off is then the reference)");
    d->ref_log_probs_path = read_path(root, "dpo.ref_log_probs_path");
}
