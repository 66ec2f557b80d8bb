#include "zero.h"

#include <math.h>
#include <string.h>

#include "backend.h"
#include "util.h"

static void unit_layout(const struct model *m, int world, int u, struct zero_unit *zu)
{
    zu->numel = m->units[u].numel;
    zu->padded = round_up(zu->numel, (size_t)world * MODEL_TENSOR_ALIGN);
    zu->shard = zu->padded / (size_t)world;
}

void zero_plan(const struct model *m, const struct config *cfg, int world, size_t bytes[BUF_COUNT])
{
    (void)cfg;
    for (int u = 0; u < m->n_units; u++) {
        struct zero_unit zu;
        unit_layout(m, world, u, &zu);
        bytes[BUF_PARAMS] += arena_round(zu.padded * sizeof(float));
        bytes[BUF_GRADS] += arena_round(zu.padded * sizeof(float));
        bytes[BUF_ADAM_M] += arena_round(zu.shard * sizeof(float));
        bytes[BUF_ADAM_V] += arena_round(zu.shard * sizeof(float));
    }
}

void zero_init(struct zero *z, const struct model *m, const struct config *cfg, int rank, int world,
               struct arena arenas[SPACE_COUNT], struct mem_tracker *mem)
{
    memset(z, 0, sizeof *z);
    z->model = m;
    z->stage = cfg->zero.stage;
    z->rank = rank;
    z->world = world;
    z->mem = mem;
    if (world != 1)
        fail_input("this build runs one rank only; got %d", world);
    z->units = xcalloc((size_t)m->n_units, sizeof *z->units);
    struct arena *dev = &arenas[SPACE_DEVICE];
    for (int u = 0; u < m->n_units; u++) {
        struct zero_unit *zu = &z->units[u];
        unit_layout(m, world, u, zu);
        zu->shard_begin = (size_t)rank * zu->shard;
        zu->params = arena_alloc(dev, mem, BUF_PARAMS, zu->padded * sizeof(float), 1);
        zu->grads = arena_alloc(dev, mem, BUF_GRADS, zu->padded * sizeof(float), 1);
        zu->adam_m = arena_alloc(dev, mem, BUF_ADAM_M, zu->shard * sizeof(float), 1);
        zu->adam_v = arena_alloc(dev, mem, BUF_ADAM_V, zu->shard * sizeof(float), 1);
        model_init_range(m, u, 0, zu->numel, zu->params);
    }
}

const float *zero_params(struct zero *z, int unit) { return z->units[unit].params; }
void zero_release(struct zero *z, int unit) { (void)z; (void)unit; }
float *zero_grads(struct zero *z, int unit) { return z->units[unit].grads; }
void zero_grads_done(struct zero *z, int unit) { (void)z; (void)unit; }

void zero_zero_grads(struct zero *z)
{
    for (int u = 0; u < z->model->n_units; u++)
        backend_zero(z->units[u].grads, z->units[u].padded);
}

double zero_grad_norm(struct zero *z)
{
    double sum = 0.0;
    for (int u = 0; u < z->model->n_units; u++)
        sum += backend_sum_squares(z->units[u].grads, z->units[u].padded);
    return sqrt(sum);
}

void zero_optimizer_step(struct zero *z, const struct optimizer_config *oc, float lr, float grad_scale)
{
    z->adam_steps++;
    struct adamw_hparams hp = {
        .lr = lr,
        .beta1 = oc->beta1,
        .beta2 = oc->beta2,
        .eps = oc->eps,
        .adam_w_mode = oc->adam_w_mode,
        .bias_correction1 = 1.0f - powf(oc->beta1, (float)z->adam_steps),
        .bias_correction2 = 1.0f - powf(oc->beta2, (float)z->adam_steps),
        .grad_scale = grad_scale,
    };
    for (int u = 0; u < z->model->n_units; u++) {
        struct zero_unit *zu = &z->units[u];
        const struct unit_desc *ud = &z->model->units[u];
        /* Only the tensors' own ranges: alignment gaps stay zero. */
        for (int t = 0; t < ud->n_tensors; t++) {
            const struct tensor_desc *td = &ud->tensors[t];
            size_t lo = td->offset, hi = td->offset + td->numel;
            size_t s0 = zu->shard_begin, s1 = zu->shard_begin + zu->shard;
            lo = lo > s0 ? lo : s0;
            hi = hi < s1 ? hi : s1;
            if (lo >= hi)
                continue;
            hp.weight_decay = td->decay ? oc->weight_decay : 0.0f;
            adamw_update(zu->params + lo, zu->adam_m + (lo - s0), zu->adam_v + (lo - s0),
                         zu->grads + lo, hi - lo, &hp);
        }
    }
}
