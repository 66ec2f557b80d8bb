/*
 * dpo — the preference losses of DPO (issue 37) on a pair's four sequence
 * log-probabilities, with TRL's names and conventions (trl DPOTrainer.dpo_loss):
 *
 *   z = (policy_chosen - policy_rejected) - (ref_chosen - ref_rejected)
 *   "sigmoid"  loss = -(1 - e) log sigmoid(beta z) - e log sigmoid(-beta z)
 *              (DPO; e = label_smoothing > 0 is cDPO)
 *   "ipo"      loss = (z - 1 / (2 beta))^2
 *   rewards/chosen = beta (policy_chosen - ref_chosen), rewards/rejected
 *   likewise, rewards/margins = their difference, rewards/accuracies = 1 when
 *   rewards/chosen > rewards/rejected, logps/chosen, logps/rejected = the
 *   policy's; a step's figures are means over its pairs, as is its loss.
 *
 * A sequence log-probability is the sum over the sample's trained tokens
 * (completion + EOS) of log p(token), except for "ipo", where TRL takes their
 * mean (get_batch_logps(average_log_prob=True)): dpo_mean_logps says which.
 * The gradient flows through the policy's two log-probs only: d_chosen and
 * d_rejected are d loss / d policy_chosen and / d policy_rejected; the
 * trainer scales each trained token's dlogits by them (-d log p = d CE).
 */
#ifndef SHARDLM_DPO_H
#define SHARDLM_DPO_H

#include <stdbool.h>
#include <stdint.h>

enum dpo_loss_type { DPO_SIGMOID, DPO_IPO };

struct dpo_params {
    double beta;            /* TRL's beta, default 0.1 */
    enum dpo_loss_type loss_type;
    double label_smoothing; /* cDPO's e in [0, 0.5], sigmoid only */
};

#define DPO_DEFAULTS {.beta = 0.1, .loss_type = DPO_SIGMOID, .label_smoothing = 0.0}

/* Summed (or, for "ipo", mean) log-probabilities of a pair's two completions. */
struct dpo_pair {
    double policy_chosen, policy_rejected, ref_chosen, ref_rejected;
};

struct dpo_result {
    double loss;
    double d_chosen, d_rejected; /* d loss / d policy_chosen, d policy_rejected */
    double reward_chosen, reward_rejected;
};

/* TRL's metric names, in the order of struct dpo_metrics' sums. */
enum { DPO_N_METRICS = 6 };
extern const char *const dpo_metric_names[DPO_N_METRICS];

/* Sums over pairs (reduce across ranks with one allreduce of sum[] and n), then dpo_metrics_mean. */
struct dpo_metrics {
    double sum[DPO_N_METRICS]; /* rewards/chosen, rewards/rejected, rewards/accuracies, rewards/margins,
                                  logps/chosen, logps/rejected */
    double loss_sum;
    int64_t n;
};

/* "sigmoid" / "ipo" -> *out; false for any other name. */
bool dpo_parse_loss_type(const char *name, enum dpo_loss_type *out);
const char *dpo_loss_type_name(enum dpo_loss_type t);
/* NULL when the parameters are valid, else what is wrong (for a config error line). */
const char *dpo_params_problem(const struct dpo_params *p);
bool dpo_mean_logps(const struct dpo_params *p);
struct dpo_result dpo_pair_loss(const struct dpo_params *p, const struct dpo_pair *x);
void dpo_metrics_add(struct dpo_metrics *m, const struct dpo_pair *x, const struct dpo_result *r);
/* out[i] = mean of metric i, *loss = the mean loss; zeros when there is no pair. */
void dpo_metrics_mean(const struct dpo_metrics *m, double out[DPO_N_METRICS], double *loss);

/* The log-probability of each sample of a micro-batch of B rows of T positions: minus the sum of the
 * per-position losses (family_forward's cross-entropy) over its trained targets (targets >= 0). positions
 * NULL: one sample a row (the padding after it has no trained target); else a sample starts where positions
 * is 0 (packing, samples.h) and a segment without a trained target (padding) is no sample. Writes the
 * samples' sums in row order into logps (and their trained-target counts into n_targets when not NULL), at
 * most cap of them; returns how many there were. */
int dpo_sequence_logps(const float *losses, const int32_t *targets, const int32_t *positions, int B, int T,
                       double *logps, int64_t *n_targets, int cap);

#endif
