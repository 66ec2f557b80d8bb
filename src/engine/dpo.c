/* dpo — DPO / IPO / cDPO pair losses and TRL's metrics: see dpo.h. */
#include "dpo.h"

#include <math.h>
#include <string.h>

#include "core/util.h"

const char *const dpo_metric_names[DPO_N_METRICS] = {
    "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen", "logps/rejected",
};

bool dpo_parse_loss_type(const char *name, enum dpo_loss_type *out)
{
    if (strcmp(name, "sigmoid") == 0)
        *out = DPO_SIGMOID;
    else if (strcmp(name, "ipo") == 0)
        *out = DPO_IPO;
    else
        return false;
    return true;
}

const char *dpo_loss_type_name(enum dpo_loss_type t) { return t == DPO_IPO ? "ipo" : "sigmoid"; }

const char *dpo_params_problem(const struct dpo_params *p)
{
    if (!(p->beta > 0.0) || !isfinite(p->beta))
        return "dpo.beta must be a positive number (TRL's default 0.1)";
    if (!(p->label_smoothing >= 0.0 && p->label_smoothing <= 0.5))
        return "dpo.label_smoothing must be in [0, 0.5] (0: DPO; cDPO's label noise otherwise)";
    if (p->loss_type == DPO_IPO && p->label_smoothing != 0.0)
        return "dpo.label_smoothing is for loss_type \"sigmoid\"; set it to 0 with \"ipo\"";
    return NULL;
}

bool dpo_mean_logps(const struct dpo_params *p) { return p->loss_type == DPO_IPO; }

/* log sigmoid(x) without overflow either way */
static double log_sigmoid(double x) { return x >= 0.0 ? -log1p(exp(-x)) : x - log1p(exp(x)); }

static double sigmoid(double x)
{
    if (x >= 0.0)
        return 1.0 / (1.0 + exp(-x));
    const double e = exp(x);
    return e / (1.0 + e);
}

struct dpo_result dpo_pair_loss(const struct dpo_params *p, const struct dpo_pair *x)
{
    const double beta = p->beta, eps = p->label_smoothing;
    const double z = (x->policy_chosen - x->policy_rejected) - (x->ref_chosen - x->ref_rejected);
    struct dpo_result r = {0};
    double dz; /* d loss / d z */
    if (p->loss_type == DPO_IPO) {
        const double d = z - 1.0 / (2.0 * beta);
        r.loss = d * d;
        dz = 2.0 * d;
    } else {
        r.loss = -(1.0 - eps) * log_sigmoid(beta * z) - eps * log_sigmoid(-beta * z);
        /* d/dx -log sigmoid(x) = -sigmoid(-x) */
        dz = -(1.0 - eps) * beta * sigmoid(-beta * z) + eps * beta * sigmoid(beta * z);
    }
    r.d_chosen = dz;
    r.d_rejected = -dz;
    r.reward_chosen = beta * (x->policy_chosen - x->ref_chosen);
    r.reward_rejected = beta * (x->policy_rejected - x->ref_rejected);
    return r;
}

void dpo_metrics_add(struct dpo_metrics *m, const struct dpo_pair *x, const struct dpo_result *r)
{
    const double v[DPO_N_METRICS] = {r->reward_chosen, r->reward_rejected,
                                     r->reward_chosen > r->reward_rejected ? 1.0 : 0.0,
                                     r->reward_chosen - r->reward_rejected, x->policy_chosen, x->policy_rejected};
    for (int i = 0; i < DPO_N_METRICS; i++)
        m->sum[i] += v[i];
    m->loss_sum += r->loss;
    m->n++;
}

void dpo_metrics_mean(const struct dpo_metrics *m, double out[DPO_N_METRICS], double *loss)
{
    const double n = m->n > 0 ? (double)m->n : 1.0;
    for (int i = 0; i < DPO_N_METRICS; i++)
        out[i] = m->sum[i] / n;
    *loss = m->loss_sum / n;
}

int dpo_sequence_logps(const float *losses, const int32_t *targets, const int32_t *positions, int B, int T,
                       double *logps, int64_t *n_targets, int cap)
{
    int n = 0;
    for (int b = 0; b < B; b++) {
        double sum = 0.0;
        int64_t count = 0;
        for (int t = 0; t <= T; t++) {
            const size_t i = (size_t)b * T + (size_t)t;
            const bool ends = t == T || (positions && t > 0 && positions[i] == 0);
            if (ends && count > 0) {
                if (n >= cap)
                    fail_internal("dpo: more than %d samples in a micro-batch of %d rows", cap, B);
                logps[n] = -sum;
                if (n_targets)
                    n_targets[n] = count;
                n++;
                sum = 0.0;
                count = 0;
            }
            if (t < T && targets[i] >= 0) {
                sum += losses[i];
                count++;
            }
        }
    }
    return n;
}
