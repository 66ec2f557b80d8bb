/*
 * pref_eval — a preference file's sample log-probs under a model (see
 * pref_eval.h).
 */
#include "pref_eval.h"

#include "core/util.h"
#include "engine/dpo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PREF_WHAT "preference file"

size_t pref_data_longest(const char *path, int vocab_size)
{
    char format[64], what[96];
    const bool h5 = samples_file_format(path, format, sizeof format);
    snprintf(what, sizeof what, h5 ? "format '%s'" : "not a sample file", format);
    if (h5 ? strcmp(format, PREFERENCES_FORMAT) != 0 : !samples_is_sample_file(path))
        fail_input("eval --preferences: '%s' is not a preference file (%s): the reward accuracy and margins need "
                   "pairs; make it with tools/prepare_data.py from preference JSONL ({\"prompt\", \"chosen\", "
                   "\"rejected\"}), or drop --preferences for the loss", path, what);
    return samples_longest(path, vocab_size, true, PREF_WHAT); /* a .h5 HDF5 cannot open: one line there */
}

void pref_data_open(struct pref_data *p, const struct infer *s, const char *path, int T)
{
    memset(p, 0, sizeof *p);
    const struct config *cfg = &s->cfg;
    const struct sample_opts o = {
        .max_len = T,
        .pad_multiple = cfg->data.pad_multiple,
        .truncate = true,
        .step_units = 1,
        .vocab_size = cfg->model.vocab_size,
        .tokenizer_json = s->tokenizer_path[0] ? s->tokenizer_path : NULL,
        .allow_tokenizer_mismatch = cfg->data.allow_tokenizer_mismatch,
        .pairs = true,
    };
    samples_open(&p->smp, path, &o, PREF_WHAT);
    p->T = T;
    p->n_pairs = (int64_t)p->smp.n_file / 2;
    if (p->smp.n_dropped_untrained) { /* the first pair left out: the first kept one out of place */
        int64_t i = 0;
        while (i < (int64_t)p->smp.n_items && p->smp.index[2 * i] == 2 * i)
            i++;
        fail_input(PREF_WHAT " '%s': pair %lld has a sample with no trained token within the eval length %d: give "
                   "a longer --seq-len (at most the model's context)", path, (long long)i, T);
    }
}

void pref_data_free(struct pref_data *p)
{
    samples_close(&p->smp);
    memset(p, 0, sizeof *p);
}

int64_t pref_data_pairs(const struct pref_data *p, int P, int world, int64_t max_batches)
{
    const int64_t most = max_batches * P * world;
    return max_batches > 0 && most < p->n_pairs ? most : p->n_pairs;
}

void pref_sample_logps(struct infer *s, struct pref_data *p, int P, int64_t max_batches, bool adapters_off,
                       double *logps, int64_t *n_targets)
{
    const int world = s->sess.world;
    const int64_t n = pref_data_pairs(p, P, world, max_batches), group = (int64_t)P * world;
    double *sum = xcalloc((size_t)(4 * n) + 1, sizeof *sum); /* logps, then counts */
    double *lp = xcalloc((size_t)(2 * P), sizeof *lp);
    int64_t *nt = xcalloc((size_t)(2 * P), sizeof *nt), *pairs = xcalloc((size_t)P, sizeof *pairs);
    struct family_acts *a = &s->sess.acts;
    a->adapters_off = adapters_off;
    for (int64_t g = 0; g * group < n; g++) {
        const int64_t first = (g * world + s->sess.rank) * P;
        const int b = first < n ? (int)(n - first < P ? n - first : P) : 0;
        int rows = 2 * b, t = 1;
        if (b) {
            t = samples_batch(&p->smp, (uint64_t)first, b).T;
            samples_read_batch(&p->smp, (uint64_t)first, b, t, a->inputs, a->targets, a->positions);
        } else { /* past the end: one untrained token, so that this rank's gathers still match */
            rows = 1;
            a->inputs[0] = 0;
            a->targets[0] = -1;
            if (a->positions)
                a->positions[0] = 0;
        }
        session_forward(&s->sess, rows, t, 1);
        if (!b)
            continue;
        /* a row is one sample (no packing): rows b + k and k are pair k's rejected and chosen */
        const int got = dpo_sequence_logps(a->host_losses, a->targets, NULL, rows, t, lp, nt, 2 * P);
        const int k = samples_batch_pairs(&p->smp, (uint64_t)first, b, pairs, P);
        if (got != rows || k != b)
            fail_internal("eval: %d sample log-probs and %d pairs from %d rows", got, k, rows);
        for (int j = 0; j < b; j++)
            for (int lane = 0; lane < 2; lane++) {
                const int64_t i = 2 * pairs[j] + lane;
                if (pairs[j] >= n)
                    fail_internal("eval: pair %lld past the %lld read", (long long)pairs[j], (long long)n);
                sum[i] = lp[lane * b + j];
                sum[2 * n + i] = (double)nt[lane * b + j];
            }
    }
    a->adapters_off = false;
    comm_allreduce(s->sess.comm, sum, (size_t)(4 * n), COMM_F64, COMM_SUM, NULL);
    for (int64_t i = 0; i < 2 * n; i++) {
        logps[i] = sum[i];
        n_targets[i] = (int64_t)sum[2 * n + i];
    }
    free(sum);
    free(lp);
    free(nt);
    free(pairs);
}
