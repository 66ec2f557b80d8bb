/*
 * train_dpo — DPO in the trainer (issue 37): the reference log-probs (the
 * base with the adapters off in the same step, or precomputed before step 1
 * and kept in a file), the pair losses of each micro-batch and the per-token
 * scales of the policy's backward, the step's TRL metrics.
 *
 * A micro-batch of B pairs is 2B rows (samples.h: the chosen rows, then the
 * rejected); its samples' summed log-probs come from the forward's
 * per-position losses (dpo_sequence_logps). The step's loss is the mean pair
 * loss over its P pairs (every rank, every micro-batch), so the gradient of
 * position t of sample s is that of its cross-entropy scaled by
 * -d_s / P (d_s = d loss / d logp_s; divided by the sample's trained tokens
 * for ipo's mean log-probs), times the loss scale.
 */
#include "train_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/util.h"
#include "dpo_ref.h"
#include "families/family.h"
#include "zero/zero.h"

#define REF_AGAIN "delete the file to compute them again, or name another with dpo.ref_log_probs_path"

static bool is_mean(const struct trainer *tr) { return dpo_mean_logps(&tr->dpo.p); }

void dpo_setup(struct trainer *tr)
{
    struct trainer_dpo *d = &tr->dpo;
    const struct config *cfg = tr->cfg;
    d->on = cfg->dpo.enabled;
    if (!d->on)
        return;
    d->p = (struct dpo_params){cfg->dpo.beta, (enum dpo_loss_type)cfg->dpo.loss_type, cfg->dpo.label_smoothing};
    d->in_step_ref = !cfg->dpo.precompute_ref_log_probs;
    const int rows = loader_rows(&tr->train_data, cfg->micro_batch), T = cfg->data.seq_len;
    /* a sample has at least 2 tokens: at most T / 2 of them a row */
    d->cap = rows * (cfg->data.packing ? T / 2 + 1 : 1);
    d->pol = xcalloc((size_t)d->cap, sizeof *d->pol);
    d->refl = xcalloc((size_t)d->cap, sizeof *d->refl);
    d->pol_n = xcalloc((size_t)d->cap, sizeof *d->pol_n);
    d->ref_n = xcalloc((size_t)d->cap, sizeof *d->ref_n);
    d->pair_ids = xcalloc((size_t)d->cap, sizeof *d->pair_ids);
    d->weights = xcalloc((size_t)rows * T, sizeof *d->weights);
    if (!samples_file_sha256(tr->train_data.smp.path, d->samples_sha256))
        fail_input("train data '%s': cannot read it to checksum it", tr->train_data.smp.path);
    snprintf(d->model, sizeof d->model, "%s (checksum %s)", tr->base_source, tr->base_checksum);
    const struct sample_set *smp = &tr->train_data.smp;
    if (tr->sess.rank == 0)
        log_info("DPO: %u pairs of %zu (%zu dropped as longer than data.seq_len, %zu with a sample without a "
                 "trained token, %zu samples truncated); loss %s, beta %g, label_smoothing %g; %u pairs a "
                 "micro-batch (%d rows); reference: %s",
                 smp->n_items, smp->n_file / 2, smp->n_dropped_long, smp->n_dropped_untrained, smp->n_truncated,
                 dpo_loss_type_name(d->p.loss_type), d->p.beta, d->p.label_smoothing, (unsigned)cfg->micro_batch,
                 rows, d->in_step_ref ? "the base with the adapters off, in each step" : "precomputed before step 1");
}

void dpo_teardown(struct trainer *tr)
{
    struct trainer_dpo *d = &tr->dpo;
    dpo_ref_free(d->ref);
    free(d->pol), free(d->refl), free(d->pol_n), free(d->ref_n), free(d->pair_ids), free(d->weights);
    memset(d, 0, sizeof *d);
}

/* The sequence log-probs of the micro-batch in acts (losses read back) into logps / counts; the samples. */
static int sequence_logps(struct trainer *tr, const float *losses, int rows, int T, double *logps, int64_t *n)
{
    const struct family_acts *a = &tr->sess.acts;
    return dpo_sequence_logps(losses, a->targets, a->positions, rows, T, logps, n, tr->dpo.cap);
}

/* An evaluation forward of the micro-batch in acts with the adapters off (the initial model: a LoRA run's
 * adapters start at zero); its samples' log-probs. */
static int reference_forward(struct trainer *tr, int rows, int T)
{
    tr->sess.acts.adapters_off = tr->sess.model.lora.on;
    session_forward(&tr->sess, rows, T, 1);
    tr->sess.acts.adapters_off = false;
    return sequence_logps(tr, tr->sess.acts.host_losses, rows, T, tr->dpo.refl, tr->dpo.ref_n);
}

/* ---- the precomputed reference ---------------------------------------------------------- */

/* Every pair's reference log-probs with the current (initial) weights, in file order: micro-batches of B pairs
 * over the ranks in turn, every rank running as many forwards (the gathers are collectives); rank 0 saves. */
static void compute_reference(struct trainer *tr)
{
    struct trainer_dpo *d = &tr->dpo;
    const struct config *cfg = tr->cfg;
    const int B = cfg->micro_batch, world = tr->sess.world;
    struct sample_opts o = tr->train_data.smp.o;
    o.shuffle = o.packing = o.group_by_length = false;
    struct sample_set s;
    samples_open(&s, tr->train_data.smp.path, &o, "train data");
    const uint64_t n_pairs = s.n_file / 2, micro = (s.n_items + (uint64_t)B - 1) / (uint64_t)B;
    struct dpo_ref ref = {.n_pairs = (int64_t)n_pairs, .seq_len = cfg->data.seq_len,
                          .max_prompt_length = s.max_prompt_length};
    ref.logps = xcalloc(4 * n_pairs + 1, sizeof *ref.logps); /* the counts ride behind for the allreduce */
    ref.n_targets = xcalloc(2 * n_pairs, sizeof *ref.n_targets);
    double t0 = now_seconds();
    for (uint64_t round = 0; round * world < micro; round++) {
        uint64_t m = round * world + (uint64_t)tr->sess.rank;
        const bool mine = m < micro;
        m = mine ? m : 0; /* a forward all the same: the others gather with this rank */
        const uint64_t first = m * (uint64_t)B;
        const int b = (int)(s.n_items - first < (uint64_t)B ? s.n_items - first : (uint64_t)B);
        const int T = samples_batch(&s, first, b).T;
        samples_read_batch(&s, first, b, T, tr->sess.acts.inputs, tr->sess.acts.targets, tr->sess.acts.positions);
        const int n = reference_forward(tr, 2 * b, T), P = samples_batch_pairs(&s, first, b, d->pair_ids, d->cap);
        if (n != 2 * P)
            fail_internal("dpo: %d samples for %d pairs", n, P);
        for (int k = 0; mine && k < P; k++)
            for (int lane = 0; lane < 2; lane++) {
                ref.logps[2 * d->pair_ids[k] + lane] = d->refl[lane * P + k];
                ref.n_targets[2 * d->pair_ids[k] + lane] = d->ref_n[lane * P + k];
            }
    }
    /* every pair's values on one rank, zeros on the others */
    for (uint64_t i = 0; i < 2 * n_pairs; i++) /* the counts in doubles (exact below 2^53) */
        ref.logps[2 * n_pairs + i] = (double)ref.n_targets[i];
    comm_allreduce(tr->sess.comm, ref.logps, 4 * n_pairs, COMM_F64, COMM_SUM, NULL);
    for (uint64_t i = 0; i < 2 * n_pairs; i++) {
        ref.n_targets[i] = (int64_t)ref.logps[2 * n_pairs + i];
        if (ref.n_targets[i] == 0) /* a pair left out (too long, nothing trained): no value */
            ref.logps[i] = NAN;
    }
    snprintf(ref.dtype, sizeof ref.dtype, "%s", dtype_name(cfg->dtype));
    snprintf(ref.sha256, sizeof ref.sha256, "%s", d->samples_sha256);
    snprintf(ref.model, sizeof ref.model, "%s", d->model);
    char *abs = realpath(tr->train_data.smp.path, NULL);
    snprintf(ref.samples_path, sizeof ref.samples_path, "%s", abs ? abs : tr->train_data.smp.path);
    free(abs);
    if (tr->sess.rank == 0) {
        dpo_ref_save(d->ref_path, &ref);
        log_info("DPO: reference log-probs of %u pairs computed in %.2f s, saved to %s", s.n_items,
                 now_seconds() - t0, d->ref_path);
    }
    comm_barrier(tr->sess.comm);
    free(ref.logps);
    free(ref.n_targets);
    samples_close(&s);
}

/* A resume's reference: the file the checkpoint names, by its SHA-256, where the checkpoint recorded it or where
 * dpo.ref_log_probs_path names it now (a file moved since, the same bytes). Local. */
static void resumed_reference(struct trainer *tr)
{
    struct trainer_dpo *d = &tr->dpo;
    const struct config *cfg = tr->cfg;
    const char *moved = cfg->dpo.ref_log_probs_path;
    char have[65] = "", have_moved[65] = "";
    const bool saved_readable = samples_file_sha256(d->saved_path, have);
    if (moved && strcmp(moved, d->saved_path) != 0 && samples_file_sha256(moved, have_moved) &&
        strcmp(have_moved, d->saved_sha256) == 0) {
        snprintf(d->ref_path, sizeof d->ref_path, "%s", moved);
        if (tr->sess.rank == 0)
            log_info("DPO: the checkpoint's reference log-probs, recorded at %s, read from %s "
                     "(dpo.ref_log_probs_path: the same SHA-256)", d->saved_path, moved);
    } else if (!saved_readable) {
        fail_input("the checkpoint's reference log-probs '%s' cannot be read%s: put the file back, name where it "
                   "is now with dpo.ref_log_probs_path, or start fresh (--resume none --overwrite)", d->saved_path,
                   have_moved[0] ? " (and dpo.ref_log_probs_path names another file)" : "");
    } else if (strcmp(have, d->saved_sha256) != 0) {
        fail_input("reference log-probs '%s' are not the file the checkpoint was trained with (SHA-256 %.12s..., "
                   "recorded %.12s...): put that file back, name where it is now with dpo.ref_log_probs_path, or "
                   "start fresh (--resume none --overwrite)", d->saved_path, have, d->saved_sha256);
    } else {
        snprintf(d->ref_path, sizeof d->ref_path, "%s", d->saved_path);
    }
    d->ref = dpo_ref_load(d->ref_path, d->samples_sha256, NULL);
    dpo_ref_check_seq_len(d->ref, d->ref_path, cfg->data.seq_len, "resume with the data.seq_len it was "
                          "trained with, or start fresh (--resume none --overwrite)");
    /* the run trained against these values: keeping them keeps its objective, in any dtype */
    if (d->ref->dtype[0] && strcmp(d->ref->dtype, dtype_name(cfg->dtype)) != 0 && tr->sess.rank == 0)
        log_warn("reference log-probs '%s' were computed in %s and this run resumes in %s: kept, as the run "
                 "trained against them (a fresh start would refuse them)", d->ref_path, d->ref->dtype,
                 dtype_name(cfg->dtype));
}

/* The file to use, loaded when it is there (a resume: the one the checkpoint names, as it was). Local. */
static void find_reference(struct trainer *tr)
{
    struct trainer_dpo *d = &tr->dpo;
    const struct config *cfg = tr->cfg;
    if (d->saved_path[0]) {
        resumed_reference(tr);
        return;
    }
    if (tr->step > 0)
        fail_input("the checkpoint resumed at step %ld records no reference log-probs (not a DPO run with "
                   "precomputed ones): export it and give it as model.from_pretrained, or start fresh", tr->step);
    if (cfg->dpo.ref_log_probs_path)
        snprintf(d->ref_path, sizeof d->ref_path, "%s", cfg->dpo.ref_log_probs_path);
    else
        dpo_ref_default_path(tr->train_data.smp.path, d->ref_path, sizeof d->ref_path);
    d->ref = dpo_ref_load(d->ref_path, d->samples_sha256, d->model);
    if (d->ref) {
        dpo_ref_check_seq_len(d->ref, d->ref_path, cfg->data.seq_len, REF_AGAIN);
        dpo_ref_check_dtype(d->ref, d->ref_path, dtype_name(cfg->dtype), REF_AGAIN);
    }
    if (d->ref && tr->sess.rank == 0)
        log_info("DPO: reference log-probs from %s (computed before with this model and data)", d->ref_path);
}

/* Every sample the run trains has a value over as many trained tokens as the run's cut leaves it (a version-1
 * file does not record its seq_len; a pair left out under data.truncation "drop" has no value). Local. */
static void check_reference_counts(const struct trainer *tr)
{
    const struct sample_set *smp = &tr->train_data.smp;
    const struct dpo_ref *r = tr->dpo.ref;
    for (uint32_t k = 0; k < smp->n; k++) {
        const int64_t i = smp->index[k];
        if (!dpo_ref_has(r, i))
            fail_input("reference log-probs '%s' have no value for pair %lld, which this run trains (computed with "
                       "another data.seq_len or data.truncation): " REF_AGAIN, tr->dpo.ref_path, (long long)(i / 2));
        if (r->n_targets[i] != (int64_t)smp->n_trained[k])
            fail_input("reference log-probs '%s': sample %lld has %lld trained tokens there, %u in this run "
                       "(computed at another data.seq_len): " REF_AGAIN, tr->dpo.ref_path, (long long)i,
                       (long long)r->n_targets[i], smp->n_trained[k]);
    }
}

/* After the computation, if any: the file read back and checked. Local. */
static void check_reference(struct trainer *tr)
{
    struct trainer_dpo *d = &tr->dpo;
    if (!d->ref)
        d->ref = dpo_ref_load(d->ref_path, d->samples_sha256, d->model);
    if (!d->ref || (uint64_t)d->ref->n_pairs != tr->train_data.smp.n_file / 2)
        fail_input("reference log-probs '%s' do not cover the %zu pairs of '%s': delete the file to compute them "
                   "again", d->ref_path, tr->train_data.smp.n_file / 2, tr->train_data.smp.path);
    if (!samples_file_sha256(d->ref_path, d->ref_sha256))
        fail_input("cannot read the reference log-probs '%s'", d->ref_path);
    check_reference_counts(tr);
}

/* A local step whose failure, on any rank, is reported once (comm_agree_failure). */
static void agreed(struct trainer *tr, void (*step)(struct trainer *))
{
    struct fail_trap trap;
    if (FAIL_TRAP(&trap) == 0)
        step(tr);
    fail_untrap();
    comm_agree_failure(tr->sess.comm, &trap);
}

void dpo_prepare(struct trainer *tr)
{
    if (!tr->dpo.on || tr->dpo.in_step_ref)
        return;
    agreed(tr, find_reference);
    /* computed together when any rank lacks the file (ranks that see different disks) */
    int32_t missing = tr->dpo.ref == NULL;
    comm_allreduce(tr->sess.comm, &missing, 1, COMM_I32, COMM_MAX, NULL);
    if (missing) {
        dpo_ref_free(tr->dpo.ref);
        tr->dpo.ref = NULL;
        compute_reference(tr);
    }
    agreed(tr, check_reference);
}

/* ---- a step ------------------------------------------------------------------------------- */

void dpo_step_begin(struct trainer *tr, uint64_t pairs, double loss_scale)
{
    tr->dpo.scale = loss_scale / (double)(pairs ? pairs : 1);
    memset(&tr->dpo.m, 0, sizeof tr->dpo.m);
}

void dpo_reference(struct trainer *tr, uint64_t first, int B, int T)
{
    struct trainer_dpo *d = &tr->dpo;
    const int rows = 2 * B;
    if (d->in_step_ref) {
        reference_forward(tr, rows, T);
        return;
    }
    const int P = samples_batch_pairs(&tr->train_data.smp, first, B, d->pair_ids, d->cap);
    for (int k = 0; k < P; k++)
        for (int lane = 0; lane < 2; lane++) {
            const int64_t i = 2 * d->pair_ids[k] + lane;
            d->refl[lane * P + k] = d->ref->logps[i];
            d->ref_n[lane * P + k] = d->ref->n_targets[i];
        }
}

/* family_acts.loss_weights: the pairs' losses from the policy's per-position losses, into the step's figures;
 * each trained position's dloss. */
static const float *pair_weights(void *ctx, const float *losses, int rows, int T)
{
    struct trainer *tr = ctx;
    struct trainer_dpo *d = &tr->dpo;
    const int n = sequence_logps(tr, losses, rows, T, d->pol, d->pol_n), P = n / 2;
    const bool mean = is_mean(tr);
    double *dlogp = d->pol; /* d loss / d logp per sample, in place of the log-probs once read */
    for (int k = 0; k < P; k++) {
        const int c = k, r = P + k;
        struct dpo_pair x = {d->pol[c], d->pol[r], d->refl[c], d->refl[r]};
        if (mean) {
            x.policy_chosen /= (double)d->pol_n[c], x.policy_rejected /= (double)d->pol_n[r];
            x.ref_chosen /= (double)d->ref_n[c], x.ref_rejected /= (double)d->ref_n[r];
        }
        const struct dpo_result res = dpo_pair_loss(&d->p, &x);
        dpo_metrics_add(&d->m, &x, &res);
        dlogp[c] = res.d_chosen / (mean ? (double)d->pol_n[c] : 1.0);
        dlogp[r] = res.d_rejected / (mean ? (double)d->pol_n[r] : 1.0);
    }
    /* the samples as dpo_sequence_logps numbers them: a row, or a packed row's segments with a trained target */
    const int32_t *tg = tr->sess.acts.targets, *pos = tr->sess.acts.positions;
    int s = 0;
    for (int b = 0; b < rows; b++) {
        int start = 0, count = 0;
        for (int t = 0; t <= T; t++) {
            const size_t i = (size_t)b * T + (size_t)t;
            if ((t == T || (pos && t > 0 && pos[i] == 0))) {
                /* logp = -sum of the losses: d loss / d CE_t = -d loss / d logp, over the step's pairs */
                const float w = count > 0 ? (float)(-dlogp[s] * d->scale) : 0.0f;
                for (int u = start; u < t; u++)
                    d->weights[(size_t)b * T + u] = tg[(size_t)b * T + u] >= 0 ? w : 0.0f;
                s += count > 0;
                start = t;
                count = 0;
            }
            count += t < T && tg[i] >= 0;
        }
    }
    return d->weights;
}

void dpo_policy_forward(struct trainer *tr, int rows, int T)
{
    struct family_acts *a = &tr->sess.acts;
    a->loss_weights = pair_weights;
    a->loss_weights_ctx = tr;
    family_forward(&tr->sess.zero, a, rows, T, 1, FAMILY_TRAIN, 0.0f);
    a->loss_weights = NULL;
    a->loss_weights_ctx = NULL;
}

float dpo_step_end(struct trainer *tr)
{
    struct trainer_dpo *d = &tr->dpo;
    double v[DPO_N_METRICS + 2];
    memcpy(v, d->m.sum, sizeof d->m.sum);
    v[DPO_N_METRICS] = d->m.loss_sum;
    v[DPO_N_METRICS + 1] = (double)d->m.n;
    comm_allreduce(tr->sess.comm, v, DPO_N_METRICS + 2, COMM_F64, COMM_SUM, NULL);
    memcpy(d->m.sum, v, sizeof d->m.sum);
    d->m.loss_sum = v[DPO_N_METRICS];
    d->m.n = (int64_t)v[DPO_N_METRICS + 1];
    double loss;
    dpo_metrics_mean(&d->m, d->mean, &loss);
    return (float)loss;
}

void dpo_step_notes(const struct trainer *tr, char *line, size_t line_cap, char *json, size_t json_cap)
{
    line[0] = json[0] = 0;
    if (!tr->dpo.on)
        return;
    const double *m = tr->dpo.mean;
    snprintf(line, line_cap, " | acc %.2f margin %.4f", m[2], m[3]);
    size_t at = 0;
    for (int i = 0; i < DPO_N_METRICS && at < json_cap; i++)
        at += (size_t)snprintf(json + at, json_cap - at, ", \"%s\": %.9g", dpo_metric_names[i], m[i]);
    if (at < json_cap)
        snprintf(json + at, json_cap - at, ", \"pairs\": %lld", (long long)tr->dpo.m.n);
}
