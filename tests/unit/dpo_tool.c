/*
 * dpo_tool — the DPO pair losses (src/engine/dpo.c) from the command line, for
 * tests/t_dpo_torch.py, which checks them against PyTorch autograd over TRL's
 * formulas. Built and run with the unit tests: without arguments it checks
 * itself on what is known in closed form (ln 2 and zero rewards when the policy
 * is the reference, IPO's 1/(4 beta^2) there, the gradients against central
 * differences of the loss, the parameter checks, the metric means).
 *
 *   dpo_tool -    reads lines "beta sigmoid|ipo label_smoothing policy_chosen policy_rejected ref_chosen
 *                 ref_rejected" on stdin, prints "loss d_chosen d_rejected reward_chosen reward_rejected" (%.17g)
 */
#include "check.h"
#include "engine/dpo.h"
#include "core/util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int run_lines(void)
{
    char type[16];
    struct dpo_params p = DPO_DEFAULTS;
    struct dpo_pair x;
    while (scanf("%lf %15s %lf %lf %lf %lf %lf", &p.beta, type, &p.label_smoothing, &x.policy_chosen,
                 &x.policy_rejected, &x.ref_chosen, &x.ref_rejected) == 7) {
        if (!dpo_parse_loss_type(type, &p.loss_type)) {
            fprintf(stderr, "dpo_tool: unknown loss type %s\n", type);
            return 2;
        }
        const struct dpo_result r = dpo_pair_loss(&p, &x);
        printf("%.17g %.17g %.17g %.17g %.17g\n", r.loss, r.d_chosen, r.d_rejected, r.reward_chosen,
               r.reward_rejected);
    }
    return 0;
}

static void check_reference_equals_policy(void)
{
    const double betas[] = {0.1, 0.5, 2.0};
    const double eps[] = {0.0, 0.1, 0.5};
    const struct dpo_pair x = {-37.25, -41.5, -37.25, -41.5};
    for (int b = 0; b < 3; b++)
        for (int e = 0; e < 3; e++) {
            const struct dpo_params p = {.beta = betas[b], .loss_type = DPO_SIGMOID, .label_smoothing = eps[e]};
            const struct dpo_result r = dpo_pair_loss(&p, &x);
            char name[96];
            snprintf(name, sizeof name, "at_reference.sigmoid.beta%g.eps%g.ln2", betas[b], eps[e]);
            CHECK_CLOSE(name, r.loss, log(2.0), 1e-15, 1.0);
            snprintf(name, sizeof name, "at_reference.sigmoid.beta%g.eps%g.rewards_zero", betas[b], eps[e]);
            CHECK(name, r.reward_chosen == 0.0 && r.reward_rejected == 0.0, "rewards %g %g", r.reward_chosen,
                  r.reward_rejected);
            /* d/dz at z = 0: -(1 - e) beta / 2 + e beta / 2 */
            snprintf(name, sizeof name, "at_reference.sigmoid.beta%g.eps%g.grad", betas[b], eps[e]);
            CHECK_CLOSE(name, r.d_chosen, -(1.0 - 2.0 * eps[e]) * betas[b] / 2.0, 1e-15, 1e-3);
        }
    const struct dpo_params ipo = {.beta = 0.1, .loss_type = DPO_IPO};
    const struct dpo_result r = dpo_pair_loss(&ipo, &x);
    CHECK_CLOSE("at_reference.ipo.value", r.loss, 25.0, 1e-15, 1.0);
    CHECK_CLOSE("at_reference.ipo.grad", r.d_chosen, -10.0, 1e-15, 1.0);
}

static void check_finite_differences(void)
{
    const struct dpo_params cases[] = {
        {0.1, DPO_SIGMOID, 0.0}, {0.5, DPO_SIGMOID, 0.2}, {3.0, DPO_SIGMOID, 0.0}, {0.1, DPO_IPO, 0.0}};
    const struct dpo_pair pairs[] = {{-10.0, -12.5, -11.0, -11.0}, {-80.0, -20.0, -81.0, -22.0},
                                     {-5.0, -300.0, -250.0, -5.0}};
    const double h = 1e-5;
    for (int c = 0; c < 4; c++)
        for (int k = 0; k < 3; k++) {
            const struct dpo_result r = dpo_pair_loss(&cases[c], &pairs[k]);
            struct dpo_pair up = pairs[k], down = pairs[k];
            up.policy_chosen += h;
            down.policy_chosen -= h;
            const double fd_c = (dpo_pair_loss(&cases[c], &up).loss - dpo_pair_loss(&cases[c], &down).loss) / (2 * h);
            up = down = pairs[k];
            up.policy_rejected += h;
            down.policy_rejected -= h;
            const double fd_r = (dpo_pair_loss(&cases[c], &up).loss - dpo_pair_loss(&cases[c], &down).loss) / (2 * h);
            char name[96];
            snprintf(name, sizeof name, "fd.%s.%d.%d.chosen", dpo_loss_type_name(cases[c].loss_type), c, k);
            CHECK_CLOSE(name, r.d_chosen, fd_c, 1e-5, 1e-6);
            snprintf(name, sizeof name, "fd.%s.%d.%d.rejected", dpo_loss_type_name(cases[c].loss_type), c, k);
            CHECK_CLOSE(name, r.d_rejected, fd_r, 1e-5, 1e-6);
            snprintf(name, sizeof name, "fd.%s.%d.%d.finite", dpo_loss_type_name(cases[c].loss_type), c, k);
            CHECK(name, isfinite(r.loss) && isfinite(r.d_chosen), "loss %g grad %g", r.loss, r.d_chosen);
        }
}

static void check_params_and_metrics(void)
{
    enum dpo_loss_type t = DPO_IPO;
    CHECK("params.parse_sigmoid", dpo_parse_loss_type("sigmoid", &t) && t == DPO_SIGMOID, "got %d", (int)t);
    CHECK("params.parse_ipo", dpo_parse_loss_type("ipo", &t) && t == DPO_IPO, "got %d", (int)t);
    CHECK("params.parse_unknown", !dpo_parse_loss_type("hinge", &t), "accepted");
    const struct dpo_params good = DPO_DEFAULTS, zero_beta = {0.0, DPO_SIGMOID, 0.0},
                            big_eps = {0.1, DPO_SIGMOID, 0.6}, ipo_eps = {0.1, DPO_IPO, 0.1};
    CHECK("params.defaults_valid", dpo_params_problem(&good) == NULL, "%s", dpo_params_problem(&good));
    CHECK("params.beta_zero", dpo_params_problem(&zero_beta) != NULL, "accepted");
    CHECK("params.eps_too_big", dpo_params_problem(&big_eps) != NULL, "accepted");
    CHECK("params.ipo_with_eps", dpo_params_problem(&ipo_eps) != NULL, "accepted");
    CHECK("params.mean_logps_ipo_only", dpo_mean_logps(&ipo_eps) && !dpo_mean_logps(&good), "wrong");

    struct dpo_metrics m = {0};
    const struct dpo_pair a = {-10.0, -20.0, -12.0, -19.0}, b = {-30.0, -5.0, -29.0, -7.0};
    struct dpo_result ra = dpo_pair_loss(&good, &a), rb = dpo_pair_loss(&good, &b);
    dpo_metrics_add(&m, &a, &ra);
    dpo_metrics_add(&m, &b, &rb);
    double mean[DPO_N_METRICS], loss;
    dpo_metrics_mean(&m, mean, &loss);
    /* a: rewards 0.2, -0.1 (accurate); b: -0.1, 0.2 (not) */
    const double want[DPO_N_METRICS] = {0.05, 0.05, 0.5, 0.0, -20.0, -12.5};
    for (int i = 0; i < DPO_N_METRICS; i++) {
        char name[64];
        snprintf(name, sizeof name, "metrics.%s", dpo_metric_names[i]);
        CHECK_CLOSE(name, mean[i], want[i], 1e-12, 1.0);
    }
    CHECK_CLOSE("metrics.loss", loss, (ra.loss + rb.loss) / 2.0, 1e-15, 1.0);
}

static void check_sequence_logps(void)
{
    /* two rows of 6: padded (one sample a row), then packed (positions restart) */
    const float losses[12] = {9, 1, 2, 9, 9, 9, 0.5f, 0.25f, 9, 4, 8, 9};
    const int32_t targets[12] = {-1, 5, 6, -1, -1, -1, 7, 7, -1, 3, 3, -1};
    double logps[4];
    int64_t counts[4];
    int n = dpo_sequence_logps(losses, targets, NULL, 2, 6, logps, counts, 4);
    CHECK("seq.padded.count", n == 2, "got %d", n);
    CHECK("seq.padded.values", n == 2 && logps[0] == -3.0 && logps[1] == -12.75 && counts[0] == 2 && counts[1] == 4,
          "got %g %g (%lld %lld)", logps[0], logps[1], (long long)counts[0], (long long)counts[1]);
    /* row 0: a sample of 3 then padding (a segment with no target); row 1: samples of 3 and 2, padding of 1 */
    const int32_t positions[12] = {0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 0};
    n = dpo_sequence_logps(losses, targets, positions, 2, 6, logps, counts, 4);
    CHECK("seq.packed.count", n == 3, "got %d", n);
    CHECK("seq.packed.values", n == 3 && logps[0] == -3.0 && logps[1] == -0.75 && logps[2] == -12.0,
          "got %g %g %g", logps[0], logps[1], logps[2]);
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "-") == 0)
        return run_lines();
    check_reference_equals_policy();
    check_finite_differences();
    check_params_and_metrics();
    check_sequence_logps();
    return check_status();
}
