/*
 * eval_pref — `shardlm eval` on a preference file (issue 37): the policy's
 * and the reference's summed log-probs of every pair's chosen and rejected
 * completions (run/pref_eval.h), then DPO's loss and TRL's metrics
 * (engine/dpo.h) with the config's dpo section (defaults without one).
 *
 * The reference, first that applies: --ref-log-probs FILE (run/dpo_ref.h,
 * checked against the preference file's SHA-256); --ref MODEL (another
 * model, run first and closed); a LoRA checkpoint's base with the adapters
 * off (acts.adapters_off; not when modules_to_save trained base tensors);
 * the file a checkpoint records in its attribute "dpo_ref_log_probs" (or
 * "dpo_ref_path", the name the trainer writes).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/util.h"
#include "engine/dpo.h"
#include "eval_cli.h"
#include "io/ckpt.h"
#include "run/dpo_ref.h"
#include "run/pref_eval.h"

struct pref_run {
    struct pref_data pd;
    int64_t n_eval;        /* pairs evaluated: the first n_eval of the file (--max-batches) */
    double *logps[2];      /* policy, reference: [2 n_eval] */
    int64_t *n_targets[2];
    struct dpo_ref *ref;   /* a reference log-prob file, or NULL */
    const char *ref_path;
    char reference[4400];  /* what the reference was, for the output */
};

/* Eval's length: --seq-len, else the longest sample within the model's context, cut further to the data.seq_len
 * of a reference file (so that its samples and eval's are cut alike); a reference file's samples must be cut as
 * eval's are: both at the same length, or at lengths that cut none. */
static int eval_length(const struct infer *s, const struct pref_run *pr, size_t longest, int seq_len)
{
    const int R = pr->ref ? pr->ref->seq_len : 0, ctx = s->cfg.model.n_positions;
    int T = seq_len > 0 ? seq_len : longest < (size_t)ctx ? (int)longest : ctx;
    if (seq_len <= 0 && R > 0 && R < T)
        T = R;
    eval_check_length(&s->cfg, T);
    if (R > 0 && T != R && ((size_t)T < longest || (size_t)R < longest))
        fail_input("reference log-prob file '%s' was computed at data.seq_len %d, eval's length is %d (samples of "
                   "up to %zu tokens are cut otherwise): give --seq-len %d, or --ref MODEL to compute the "
                   "reference at this length", pr->ref_path, R, T, longest, R);
    return T;
}

/* The preference file, its eval length and the model's context; agreed across ranks. */
static void open_pairs(struct infer *s, struct pref_run *pr, const char *path, int seq_len, int64_t max_batches,
                       int P)
{
    struct fail_trap trap;
    if (FAIL_TRAP(&trap) == 0) {
        const size_t longest = pref_data_longest(path, s->cfg.model.vocab_size);
        const int T = eval_length(s, pr, longest, seq_len);
        pref_data_open(&pr->pd, s, path, T);
        if (pr->pd.smp.n_truncated && s->sess.rank == 0)
            log_warn("preference file '%s': %zu of %lld samples are longer than the eval length %d and were cut to "
                     "it; give --seq-len to score them whole", path, pr->pd.smp.n_truncated,
                     (long long)(2 * pr->pd.n_pairs), T);
        pr->n_eval = pref_data_pairs(&pr->pd, P, s->sess.world, max_batches);
    }
    fail_untrap();
    comm_agree_failure(s->sess.comm, &trap);
    for (int k = 0; k < 2; k++)
        if (!pr->logps[k]) {
            pr->logps[k] = xcalloc((size_t)(2 * pr->n_eval) + 1, sizeof *pr->logps[k]);
            pr->n_targets[k] = xcalloc((size_t)(2 * pr->n_eval) + 1, sizeof *pr->n_targets[k]);
        }
}

/* A reference log-prob file, checked against the preference file's bytes; agreed across ranks. */
static void load_ref_file(struct infer *s, struct pref_run *pr, const char *data, const char *path, const char *why)
{
    struct fail_trap trap;
    if (FAIL_TRAP(&trap) == 0) {
        char sha[65];
        dpo_ref_file_sha256(data, "preference file", sha);
        pr->ref = dpo_ref_load(path, sha, NULL);
        if (!pr->ref)
            fail_input("%s '%s' does not exist: give the reference log-prob file the run wrote (beside its "
                       "preference file: <file>.ref-logps.h5), or --ref MODEL", why, path);
        pr->ref_path = path;
        snprintf(pr->reference, sizeof pr->reference, "log-probs %s", path);
    }
    fail_untrap();
    comm_agree_failure(s->sess.comm, &trap);
}

/* The reference file's values of the pairs evaluated into pr's reference arrays. */
static void use_ref_file(struct pref_run *pr)
{
    const struct dpo_ref *r = pr->ref;
    if (r->n_pairs != pr->pd.n_pairs)
        fail_input("reference log-prob file '%s' holds %lld pairs, preference file '%s' %lld: the file is "
                   "damaged: delete it or name another", pr->ref_path, (long long)r->n_pairs, pr->pd.smp.path,
                   (long long)pr->pd.n_pairs);
    memcpy(pr->logps[1], r->logps, (size_t)(2 * pr->n_eval) * sizeof *r->logps);
    memcpy(pr->n_targets[1], r->n_targets, (size_t)(2 * pr->n_eval) * sizeof *r->n_targets);
}

/* The path a checkpoint records in "dpo_ref_log_probs", "" when none. Collective. */
static void recorded_ref(const struct infer *s, char *out, size_t cap)
{
    out[0] = 0;
    if (!s->ckpt_path[0])
        return;
    struct ckpt_reader *r = ckpt_open(s->ckpt_path);
    static const char *const names[] = {"dpo_ref_log_probs", "dpo_ref_path"}; /* the brief's name, the trainer's */
    for (int k = 0; k < 2 && !out[0]; k++)
        if (ckpt_has_attr(r, names[k])) {
            char *v = ckpt_attr_str(r, names[k]);
            snprintf(out, cap, "%s", v);
            free(v);
        }
    ckpt_close(r);
}

/* A LoRA checkpoint whose modules_to_save trained base tensors: its base with the adapters off is not the model
 * its run started from. */
static void refuse_trained_base(const struct infer *s, const char *model)
{
    for (int u = 0; u < s->sess.model.n_base_units; u++)
        if (s->trained[u])
            fail_input("LoRA checkpoint '%s' also trained base tensors (lora.modules_to_save, e.g. %s): the base "
                       "with the adapters off is not its reference; give --ref MODEL (the model it started from) "
                       "or --ref-log-probs FILE", model, s->sess.model.units[u].tensors[0].name);
}

static void print_result(const struct eval_pref_options *e, const struct pref_run *pr, const struct dpo_params *p)
{
    struct dpo_metrics m;
    memset(&m, 0, sizeof m);
    const bool mean = dpo_mean_logps(p);
    for (int64_t i = 0; i < pr->n_eval; i++) {
        double v[4];
        for (int k = 0; k < 4; k++) {
            const int64_t j = 2 * i + (k & 1);
            v[k] = pr->logps[k >> 1][j] / (mean ? (double)pr->n_targets[k >> 1][j] : 1.0);
        }
        const struct dpo_pair x = {v[0], v[1], v[2], v[3]};
        const struct dpo_result r = dpo_pair_loss(p, &x);
        dpo_metrics_add(&m, &x, &r);
    }
    double out[DPO_N_METRICS], loss;
    dpo_metrics_mean(&m, out, &loss);
    if (e->json) {
        json_t *j = json_pack("{ss ss ss sf sI sI ss sf sf}", "model", e->model, "data", e->data, "reference",
                              pr->reference, "loss", loss, "pairs", (json_int_t)pr->n_eval, "pairs_in_file",
                              (json_int_t)pr->pd.n_pairs, "loss_type", dpo_loss_type_name(p->loss_type), "beta",
                              p->beta, "label_smoothing", p->label_smoothing);
        for (int i = 0; i < DPO_N_METRICS; i++)
            json_object_set_new(j, dpo_metric_names[i], json_real(out[i]));
        char *text = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(17));
        printf("%s\n", text);
        free(text);
        json_decref(j);
    } else {
        printf("eval %s on %s against %s: dpo loss %.6f (%s, beta %g) | rewards/accuracies %.4f | rewards/margins "
               "%.6f | rewards/chosen %.6f | rewards/rejected %.6f | logps/chosen %.4f | logps/rejected %.4f | "
               "%lld pairs%s\n",
               e->model, e->data, pr->reference, loss, dpo_loss_type_name(p->loss_type), p->beta, out[2], out[3],
               out[0], out[1], out[4], out[5], (long long)pr->n_eval,
               pr->n_eval < pr->pd.n_pairs ? " (the first: --max-batches)" : "");
    }
    fflush(stdout);
}

int eval_preferences(struct comm *comm, struct infer_options *o, const struct eval_pref_options *e)
{
    struct infer s;
    struct pref_run pr;
    memset(&pr, 0, sizeof pr);
    const int P = e->batch > 1 ? (e->batch + 1) / 2 : 1; /* pairs a forward: 2P rows */
    const double t0 = now_seconds();
    if (e->ref_model) { /* the reference model first, closed before the policy opens */
        struct infer_options ro = *o;
        ro.model = e->ref_model;
        ro.base = NULL;
        infer_open(&s, comm, &ro);
        open_pairs(&s, &pr, o->data, o->seq_len, e->max_batches, P);
        infer_start(&s, &ro, 2 * P, pr.pd.T, 0);
        pref_sample_logps(&s, &pr.pd, P, e->max_batches, false, pr.logps[1], pr.n_targets[1]);
        snprintf(pr.reference, sizeof pr.reference, "model %s", e->ref_model);
        pref_data_free(&pr.pd);
        infer_close(&s);
    }
    infer_open(&s, comm, o);
    char recorded[4200] = "";
    if (!e->ref_model && !e->ref_file && !s.lora_ckpt)
        recorded_ref(&s, recorded, sizeof recorded);
    const char *ref_file = e->ref_file ? e->ref_file : recorded[0] ? recorded : NULL;
    if (ref_file)
        load_ref_file(&s, &pr, o->data, ref_file, e->ref_file ? "--ref-log-probs" : "the reference log-prob file "
                                                                                    "the checkpoint records");
    else if (!e->ref_model && !s.lora_ckpt)
        fail_input("eval on preference pairs needs a reference for MODEL '%s' (%s): give --ref-log-probs FILE "
                   "(a run's <preferences>.ref-logps.h5) or --ref MODEL (the model the policy started from)",
                   o->model, s.ckpt_path[0] ? "a whole-model checkpoint that records no reference log-prob file"
                                            : "a whole model has none of its own");
    open_pairs(&s, &pr, o->data, o->seq_len, e->max_batches, P);
    if (pr.ref) { /* local: every rank read the same file */
        struct fail_trap trap;
        if (FAIL_TRAP(&trap) == 0)
            use_ref_file(&pr);
        fail_untrap();
        comm_agree_failure(comm, &trap);
    }
    infer_start(&s, o, 2 * P, pr.pd.T, 0);
    const bool adapters_off = !ref_file && !e->ref_model;
    if (adapters_off) {
        struct fail_trap trap;
        if (FAIL_TRAP(&trap) == 0)
            refuse_trained_base(&s, o->model);
        fail_untrap();
        comm_agree_failure(comm, &trap);
        pref_sample_logps(&s, &pr.pd, P, e->max_batches, true, pr.logps[1], pr.n_targets[1]);
        snprintf(pr.reference, sizeof pr.reference, "the base (adapters off)");
    }
    pref_sample_logps(&s, &pr.pd, P, e->max_batches, false, pr.logps[0], pr.n_targets[0]);
    for (int64_t i = 0; ref_file && i < 2 * pr.n_eval; i++)
        if (pr.n_targets[1][i] == 0)
            fail_input("reference log-prob file '%s' has no value for pair %lld (its run left the pair out: longer "
                       "than its data.seq_len, or nothing trained); give --ref MODEL to compute the reference here",
                       ref_file, (long long)(i / 2));
        else if (pr.n_targets[0][i] != pr.n_targets[1][i])
            fail_input("reference log-prob file '%s': sample %lld has %lld trained tokens there and %lld at eval "
                       "length %d: computed at another length; give --seq-len %d or recompute it",
                       ref_file, (long long)i, (long long)pr.n_targets[1][i], (long long)pr.n_targets[0][i],
                       pr.pd.T, (int)(pr.pd.smp.offsets[i + 1] - pr.pd.smp.offsets[i]));
    struct dpo_params p = DPO_DEFAULTS;
    if (s.cfg.dpo.enabled) {
        p.beta = s.cfg.dpo.beta;
        p.loss_type = (enum dpo_loss_type)s.cfg.dpo.loss_type;
        p.label_smoothing = s.cfg.dpo.label_smoothing;
    }
    if (s.sess.rank == 0) {
        print_result(e, &pr, &p);
        log_info("eval: %.2f s", now_seconds() - t0);
    }
    for (int k = 0; k < 2; k++) {
        free(pr.logps[k]);
        free(pr.n_targets[k]);
    }
    dpo_ref_free(pr.ref);
    pref_data_free(&pr.pd);
    infer_close(&s);
    return EXIT_OK;
}
