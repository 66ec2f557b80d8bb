/*
 * sample — the choice of a next token and the trainer's sample after its
 * last step (see sample.h).
 */
#include "sample.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/ckpt.h"
#include "tokenizer/tokenizer.h"
#include "core/util.h"

struct by_logit {
    float v;
    int32_t id;
};
_Static_assert(sizeof(struct by_logit) * 1 == 8, "SAMPLE_WORK_BYTES");

static int by_logit_desc(const void *a, const void *b)
{
    const struct by_logit *x = a, *y = b;
    return x->v < y->v ? 1 : x->v > y->v ? -1 : x->id - y->id;
}

int32_t sample_choose(const float *logits, int V, const struct sampling *sp, uint64_t *rng, void *work)
{
    if (sp->temperature <= 0.0f) {
        int32_t best = 0;
        for (int j = 1; j < V; j++)
            if (logits[j] > logits[best])
                best = j;
        return best;
    }
    struct by_logit *w = work;
    for (int j = 0; j < V; j++)
        w[j] = (struct by_logit){logits[j] / sp->temperature, j};
    qsort(w, (size_t)V, sizeof *w, by_logit_desc);
    int keep = sp->top_k > 0 && sp->top_k < V ? sp->top_k : V;
    double sum = 0.0;
    for (int j = 0; j < keep; j++)
        sum += exp((double)w[j].v - w[0].v);
    if (sp->top_p < 1.0f) {
        double acc = 0.0;
        for (int j = 0; j < keep; j++) {
            acc += exp((double)w[j].v - w[0].v) / sum;
            if (acc >= sp->top_p) {
                keep = j + 1;
                break;
            }
        }
        sum = 0.0;
        for (int j = 0; j < keep; j++)
            sum += exp((double)w[j].v - w[0].v);
    }
    double r = rng_uniform(rng) * sum, acc = 0.0;
    for (int j = 0; j < keep; j++) {
        acc += exp((double)w[j].v - w[0].v);
        if (r < acc)
            return w[j].id;
    }
    return w[keep - 1].id;
}

void sample_text(struct session *s, const struct config *cfg, const char *(*stopped)(struct comm *comm))
{
    const int n = cfg->train.sample_tokens, T = cfg->data.seq_len, V = cfg->model.vocab_size;
    const int Vp = cfg->model.padded_vocab;
    const struct sampling sp = {cfg->train.sample_temperature, 0, 1.0f, cfg->train.seed};
    if (n <= 0)
        return;
    struct tokenizer *tok = NULL;
    char path[CKPT_MAX_PATH + 32], err[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", cfg->model.pretrained);
    if (cfg->model.pretrained[0] && access(path, R_OK) == 0 && !(tok = tokenizer_load(path, err, sizeof err)))
        log_warn("the sample after the last step prints token ids: %s", err);
    int32_t *ctx = xcalloc((size_t)n + 1, sizeof *ctx);
    void *work = xmalloc(SAMPLE_WORK_BYTES(V));
    float *row = xcalloc((size_t)Vp, sizeof *row);
    uint64_t rng = cfg->train.seed ^ 0x5A3F1E5ull;
    int len = 1;
    ctx[0] = tok && tokenizer_eos_id(tok) >= 0 ? tokenizer_eos_id(tok) : V >= 256 ? '\n' : 0;
    /* With the key/value cache of one row (the training activations no longer
     * needed give their memory to it) when it fits what the plan reserved per
     * class: each step then computes only the newest token, at its position.
     * Past seq_len the context slides: the rest re-runs the window through the
     * training activations, as the whole sample does when the cache does not fit. */
    const struct session_shape cached = {1, 1, n < T ? n : T}, trained = {cfg->micro_batch, T, 0};
    bool kv = session_fits(s, &cached);
    if (kv)
        session_reshape(s, &cached);
    for (int i = 0; i < n; i++) {
        if (kv && len > T) {
            session_reshape(s, &trained);
            kv = false;
        }
        if (kv) {
            s->acts.inputs[0] = ctx[len - 1];
            s->acts.positions[0] = s->kv.past[0] = len - 1;
            s->kv.last[0] = 0;
            session_forward(s, 1, 1, 0);
            family_read_logits(&s->acts, 0, row);
        } else {
            int start = len > T ? len - T : 0, t = len - start;
            memcpy(s->acts.inputs, ctx + start, (size_t)t * sizeof *ctx);
            for (int p = 0; s->acts.positions && p < t; p++) /* one sample: positions 0 .. t-1 */
                s->acts.positions[p] = p;
            session_forward(s, 1, t, 0);
            family_read_logits(&s->acts, t - 1, row);
        }
        int32_t next = sample_choose(row, V, &sp, &rng, work);
        /* rank 0's choice, so every rank feeds the same context next */
        comm_broadcast(s->comm, &next, 1, COMM_I32, 0, NULL);
        ctx[len++] = next;
        const char *sig = stopped(s->comm);
        if (sig) {
            log_warn("%s during the sample after the last step: the sample stops at %d tokens", sig, len - 1);
            break;
        }
    }
    if (s->rank == 0) {
        printf("---- sample (%d tokens) ----\n", len - 1);
        size_t bytes = 0;
        char *text = tok ? tokenizer_decode(tok, ctx + 1, (size_t)len - 1, 1, &bytes) : NULL;
        if (text)
            fwrite(text, 1, bytes, stdout);
        for (int i = 1; !tok && i < len; i++) {
            if (V <= 256)
                putchar(ctx[i]);
            else
                printf("%d ", ctx[i]);
        }
        free(text);
        printf("\n---- end of sample ----\n");
        fflush(stdout);
    }
    if (tok)
        tokenizer_free(tok);
    free(ctx);
    free(work);
    free(row);
}

