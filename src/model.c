#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static void add_tensor(struct unit_desc *u, int *id, const char *name, int d0, int d1,
                       bool decay, enum init_kind init)
{
    struct tensor_desc *t = &u->tensors[u->n_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = d1 > 0 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1 > 0 ? d1 : 1;
    t->numel = (size_t)d0 * (size_t)t->shape[1];
    t->offset = round_up(u->numel, MODEL_TENSOR_ALIGN);
    t->decay = decay;
    t->init = init;
    t->id = (*id)++;
    t->rows_valid = d0;
    u->numel = t->offset + t->numel;
}

void model_build(struct model *m, const struct model_config *cfg)
{
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    const int L = cfg->n_layer, C = cfg->n_embd, Vp = cfg->padded_vocab;
    m->n_units = L + 2;
    m->units = xcalloc((size_t)m->n_units, sizeof *m->units);
    int id = 0;
    char name[MODEL_MAX_NAME];

    struct unit_desc *e = &m->units[0];
    e->kind = UNIT_EMBED;
    e->block = -1;
    snprintf(e->name, sizeof e->name, "embedding");
    e->tensors = xcalloc(ET_COUNT, sizeof *e->tensors);
    add_tensor(e, &id, "wte.weight", Vp, C, true, INIT_NORMAL);
    e->tensors[ET_WTE].rows_valid = cfg->vocab_size;
    add_tensor(e, &id, "wpe.weight", cfg->n_positions, C, true, INIT_NORMAL);

    for (int l = 0; l < L; l++) {
        struct unit_desc *u = &m->units[model_block_unit(l)];
        u->kind = UNIT_BLOCK;
        u->block = l;
        snprintf(u->name, sizeof u->name, "block %d", l);
        u->tensors = xcalloc(BT_COUNT, sizeof *u->tensors);
#define T(suffix, d0, d1, decay, init)                          \
    snprintf(name, sizeof name, "h.%d." suffix, l);             \
    add_tensor(u, &id, name, d0, d1, decay, init)
        T("ln_1.weight", C, 0, false, INIT_ONES);
        T("ln_1.bias", C, 0, false, INIT_ZEROS);
        T("attn.c_attn.weight", C, 3 * C, true, INIT_NORMAL);
        T("attn.c_attn.bias", 3 * C, 0, false, INIT_ZEROS);
        T("attn.c_proj.weight", C, C, true, INIT_NORMAL_RES);
        T("attn.c_proj.bias", C, 0, false, INIT_ZEROS);
        T("ln_2.weight", C, 0, false, INIT_ONES);
        T("ln_2.bias", C, 0, false, INIT_ZEROS);
        T("mlp.c_fc.weight", C, 4 * C, true, INIT_NORMAL);
        T("mlp.c_fc.bias", 4 * C, 0, false, INIT_ZEROS);
        T("mlp.c_proj.weight", 4 * C, C, true, INIT_NORMAL_RES);
        T("mlp.c_proj.bias", C, 0, false, INIT_ZEROS);
#undef T
    }

    struct unit_desc *h = &m->units[model_head_unit(m)];
    h->kind = UNIT_HEAD;
    h->block = -1;
    snprintf(h->name, sizeof h->name, "head");
    h->tensors = xcalloc(HT_COUNT, sizeof *h->tensors);
    add_tensor(h, &id, "ln_f.weight", C, 0, false, INIT_ONES);
    add_tensor(h, &id, "ln_f.bias", C, 0, false, INIT_ZEROS);

    for (int u = 0; u < m->n_units; u++) {
        /* Pad each unit to the alignment too, so shards of units start aligned. */
        m->units[u].numel = round_up(m->units[u].numel, MODEL_TENSOR_ALIGN);
        m->n_elements += m->units[u].numel;
        for (int t = 0; t < m->units[u].n_tensors; t++)
            m->n_params += m->units[u].tensors[t].numel;
    }
}

void model_free(struct model *m)
{
    for (int u = 0; u < m->n_units; u++)
        free(m->units[u].tensors);
    free(m->units);
    memset(m, 0, sizeof *m);
}

/* One normal sample from a counter: two splitmix64 draws from a state keyed by
 * (seed, tensor id, element), so no sequential generator has to be replayed. */
static float counter_normal(uint64_t seed, int tensor_id, size_t element)
{
    uint64_t state = seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)tensor_id << 48) ^ (uint64_t)element;
    splitmix64(&state);
    return rng_normal(&state);
}

void model_init_range(const struct model *m, int u, size_t start, size_t count, float *out)
{
    const struct unit_desc *ud = &m->units[u];
    const float std = m->cfg.init_std;
    const float res_std = std / sqrtf(2.0f * (float)m->cfg.n_layer);
    memset(out, 0, count * sizeof *out);
    size_t end = start + count;
    for (int ti = 0; ti < ud->n_tensors; ti++) {
        const struct tensor_desc *t = &ud->tensors[ti];
        size_t valid_end = t->offset + (size_t)t->rows_valid * (size_t)t->shape[1];
        size_t lo = t->offset > start ? t->offset : start;
        size_t hi = valid_end < end ? valid_end : end;
        for (size_t i = lo; i < hi; i++) {
            size_t e = i - t->offset;
            float v;
            switch (t->init) {
            case INIT_NORMAL: v = std * counter_normal(m->cfg.init_seed, t->id, e); break;
            case INIT_NORMAL_RES: v = res_std * counter_normal(m->cfg.init_seed, t->id, e); break;
            case INIT_ONES: v = 1.0f; break;
            default: v = 0.0f; break;
            }
            out[i - start] = v;
        }
    }
}

bool model_find_tensor(const struct model *m, const char *name, int *unit, int *tensor)
{
    for (int u = 0; u < m->n_units; u++)
        for (int t = 0; t < m->units[u].n_tensors; t++)
            if (strcmp(m->units[u].tensors[t].name, name) == 0) {
                *unit = u;
                *tensor = t;
                return true;
            }
    return false;
}

double model_flops_per_token(const struct model *m, int seq_len)
{
    /* 6 flops per parameter per token (2 forward, 4 backward) over the matmul
     * parameters (wpe is a lookup, layernorms are negligible), the tied LM head
     * counted once as a matmul, plus attention's QK^T and PV: 12 * L * C * T
     * (causal half not subtracted, as in the PaLM paper's appendix B). */
    const double L = m->cfg.n_layer, C = m->cfg.n_embd, V = m->cfg.padded_vocab;
    double matmul_params = L * 12.0 * C * C + V * C;
    return 6.0 * matmul_params + 12.0 * L * C * (double)seq_len;
}
