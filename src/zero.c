#include "zero.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "plan.h"
#include "util.h"

static const char *event_names[] = {"acquire", "release", "grad_open", "grad_done"};

static int pool_of(const struct model *m, int u) { return (int)m->units[u].kind; }

static size_t f32_bytes(size_t n) { return arena_round(n * sizeof(float)); }

/* ---- layout ---------------------------------------------------------------- */

static void layout_units(struct zero *z, const struct config *cfg)
{
    const struct model *m = z->model;
    for (int u = 0; u < m->n_units; u++) {
        struct zero_unit *zu = &z->units[u];
        zu->numel = m->units[u].numel;
        zu->padded = round_up(zu->numel, (size_t)z->world * MODEL_TENSOR_ALIGN);
        zu->shard = zu->padded / (size_t)z->world;
        zu->sharded = z->stage == 3 && (double)zu->numel > cfg->zero.stage3_param_persistence_threshold;
        if (z->stage == 0) {
            zu->opt_begin = 0;
            zu->opt_count = zu->padded;
        } else {
            zu->opt_begin = (size_t)z->rank * zu->shard;
            zu->opt_count = zu->shard;
        }
        zu->gather_slot = zu->grad_slot = -1;
        struct zero_pool *gp = &z->gather_pools[pool_of(m, u)], *rp = &z->grad_pools[pool_of(m, u)];
        if (zu->sharded && zu->padded > gp->slot_elems)
            gp->slot_elems = zu->padded;
        if (z->stage >= 2 && zu->padded > rp->slot_elems)
            rp->slot_elems = zu->padded;
    }
}

/* ---- pools ------------------------------------------------------------------ */

static void pool_reserve(struct zero_pool *p, int n)
{
    p->slots = realloc(p->slots, (size_t)n * sizeof *p->slots);
    p->slot_unit = realloc(p->slot_unit, (size_t)n * sizeof *p->slot_unit);
    if (!p->slots || !p->slot_unit)
        fail_internal("out of host memory for a buffer pool");
    for (int i = p->n_slots; i < n; i++) {
        p->slots[i] = NULL;
        p->slot_unit[i] = -1;
    }
    p->n_slots = n;
}

static int pool_take(struct zero *z, struct zero_pool *p, enum buf_class cls, int unit)
{
    int slot = -1;
    for (int i = 0; i < p->n_slots; i++)
        if (p->slot_unit[i] < 0) {
            slot = i;
            break;
        }
    if (slot < 0) {
        if (!z->dry)
            fail_internal("%s pool exhausted at unit %d: the memory plan's dry run and this run differ",
                          arena_class_name(cls), unit);
        pool_reserve(p, p->n_slots + 1);
        slot = p->n_slots - 1;
    }
    p->slot_unit[slot] = unit;
    if (++p->live > p->peak)
        p->peak = p->live;
    if (!z->dry)
        arena_mark_live(z->mem, cls, f32_bytes(p->slot_elems));
    return slot;
}

static void pool_give(struct zero *z, struct zero_pool *p, enum buf_class cls, int slot)
{
    p->slot_unit[slot] = -1;
    p->live--;
    if (!z->dry)
        arena_mark_free(z->mem, cls, f32_bytes(p->slot_elems));
}

static bool pool_has_free(const struct zero *z, const struct zero_pool *p)
{
    return z->dry || p->live < p->n_slots;
}

/* ---- init ------------------------------------------------------------------ */

void zero_init(struct zero *z, const struct model *m, const struct config *cfg, struct comm *comm, int rank,
               int world, bool dry, const int planned_slots[2][ZERO_POOLS], struct arena arenas[SPACE_COUNT],
               struct mem_tracker *mem)
{
    memset(z, 0, sizeof *z);
    z->model = m;
    z->comm = comm;
    z->stage = cfg->zero.stage;
    z->rank = rank;
    z->world = world;
    z->dry = dry;
    z->prefetch_elems = cfg->zero.stage3_prefetch_bucket_size;
    z->max_live_elems = cfg->zero.stage3_max_live_parameters;
    z->mem = mem;
    z->rs_unit = -1;
    z->units = xcalloc((size_t)m->n_units, sizeof *z->units);
    layout_units(z, cfg);
    if (dry)
        return;

    struct arena *dev = &arenas[SPACE_DEVICE];
    for (int u = 0; u < m->n_units; u++) {
        struct zero_unit *zu = &z->units[u];
        if (zu->sharded) {
            zu->param_shard = arena_alloc(dev, mem, BUF_PARAMS, zu->shard * sizeof(float), 1);
            model_init_range(m, u, (size_t)rank * zu->shard, zu->shard, zu->param_shard);
        } else {
            zu->params = arena_alloc(dev, mem, BUF_PARAMS, zu->padded * sizeof(float), 1);
            model_init_range(m, u, 0, zu->padded, zu->params);
        }
        if (z->stage <= 1)
            zu->grads = arena_alloc(dev, mem, BUF_GRADS, zu->padded * sizeof(float), 1);
        else
            zu->grad_shard = arena_alloc(dev, mem, BUF_GRADS, zu->shard * sizeof(float), 1);
        zu->adam_m = arena_alloc(&arenas[plan_space(cfg, BUF_ADAM_M)], mem, BUF_ADAM_M, zu->opt_count * sizeof(float), 1);
        zu->adam_v = arena_alloc(&arenas[plan_space(cfg, BUF_ADAM_V)], mem, BUF_ADAM_V, zu->opt_count * sizeof(float), 1);
    }
    for (int k = 0; k < ZERO_POOLS; k++) {
        struct zero_pool *pools[2] = {&z->gather_pools[k], &z->grad_pools[k]};
        enum buf_class cls[2] = {BUF_GATHERED, BUF_GRAD_BUFFERS};
        for (int j = 0; j < 2; j++) {
            pool_reserve(pools[j], planned_slots[j][k]);
            for (int i = 0; i < pools[j]->n_slots; i++)
                pools[j]->slots[i] = arena_alloc(dev, mem, cls[j], pools[j]->slot_elems * sizeof(float), 0);
        }
    }
}

void zero_free(struct zero *z)
{
    for (int k = 0; k < ZERO_POOLS; k++) {
        free(z->gather_pools[k].slots);
        free(z->gather_pools[k].slot_unit);
        free(z->grad_pools[k].slots);
        free(z->grad_pools[k].slot_unit);
    }
    free(z->units);
    memset(z, 0, sizeof *z);
}

/* ---- passes, gathers, prefetch ---------------------------------------------- */

static void expect_event(struct zero *z, enum pass_event_kind kind, int unit)
{
    if (!z->pass)
        fail_internal("%s of unit %d outside a pass", event_names[kind], unit);
    if (z->cursor >= z->pass->n_events || z->pass->events[z->cursor].kind != kind ||
        z->pass->events[z->cursor].unit != unit)
        fail_internal("pass '%s', event %d: the model did %s(%d) where the pass declares %s(%d)", z->pass->name,
                      z->cursor, event_names[kind], unit,
                      z->cursor < z->pass->n_events ? event_names[z->pass->events[z->cursor].kind] : "end",
                      z->cursor < z->pass->n_events ? z->pass->events[z->cursor].unit : -1);
    z->cursor++;
}

static void count_traffic(struct zero *z, enum comm_kind kind, size_t elems)
{
    uint64_t n = (uint64_t)z->world, bytes = (uint64_t)elems * sizeof(float);
    if (kind == COMM_ALLREDUCE)
        z->traffic[kind] += 2 * (n - 1) * bytes / n; /* elems: the whole buffer */
    else
        z->traffic[kind] += (n - 1) * bytes;         /* elems: one rank's shard */
}

static float *slot_ptr(struct zero_pool *p, int slot) { return p->slots[slot]; }

static void start_gather(struct zero *z, int u)
{
    struct zero_unit *zu = &z->units[u];
    struct zero_pool *p = &z->gather_pools[pool_of(z->model, u)];
    zu->gather_slot = pool_take(z, p, BUF_GATHERED, u);
    z->live_gathered_elems += zu->padded;
    count_traffic(z, COMM_ALLGATHER, zu->shard);
    if (z->dry)
        return;
    float *full = slot_ptr(p, zu->gather_slot);
    comm_allgather(z->comm, zu->param_shard, full, zu->shard, COMM_F32, &zu->gather_req);
    zu->gather_pending = true;
}

/* Starts the all-gathers of the units the pass acquires next, within the
 * prefetch bucket and the live-parameter bound. */
static void prefetch(struct zero *z)
{
    double ahead = 0.0;
    for (int e = z->cursor; e < z->pass->n_events; e++) {
        const struct pass_event *ev = &z->pass->events[e];
        if (ev->kind != PASS_ACQUIRE)
            continue;
        struct zero_unit *zu = &z->units[ev->unit];
        if (!zu->sharded)
            continue;
        if (zu->gather_slot >= 0) {
            if (zu->refs == 0)
                ahead += (double)zu->padded; /* already prefetched */
            continue;
        }
        if (ahead + (double)zu->padded > z->prefetch_elems)
            break;
        if ((double)(z->live_gathered_elems + zu->padded) > z->max_live_elems)
            break;
        if (!pool_has_free(z, &z->gather_pools[pool_of(z->model, ev->unit)]))
            break;
        start_gather(z, ev->unit);
        ahead += (double)zu->padded;
    }
}

void zero_begin_pass(struct zero *z, const struct zero_pass *pass)
{
    if (z->pass)
        fail_internal("pass '%s' begun inside pass '%s'", pass->name, z->pass->name);
    z->pass = pass;
    z->cursor = 0;
}

static void finish_reduce_scatter(struct zero *z)
{
    if (z->rs_unit < 0)
        return;
    struct zero_unit *zu = &z->units[z->rs_unit];
    if (!z->dry)
        comm_wait(z->comm, &zu->rs_req);
    zu->rs_pending = false;
    pool_give(z, &z->grad_pools[pool_of(z->model, z->rs_unit)], BUF_GRAD_BUFFERS, zu->grad_slot);
    zu->grad_slot = -1;
    z->rs_unit = -1;
}

void zero_end_pass(struct zero *z)
{
    finish_reduce_scatter(z);
    if (z->cursor != z->pass->n_events)
        fail_internal("pass '%s' ended after %d of its %d events", z->pass->name, z->cursor, z->pass->n_events);
    for (int u = 0; u < z->model->n_units; u++)
        if (z->units[u].refs || z->units[u].gather_slot >= 0 || z->units[u].grad_slot >= 0)
            fail_internal("pass '%s' ended with unit %d still held", z->pass->name, u);
    z->pass = NULL;
}

const float *zero_acquire(struct zero *z, int u)
{
    expect_event(z, PASS_ACQUIRE, u);
    struct zero_unit *zu = &z->units[u];
    zu->refs++;
    if (!zu->sharded)
        return zu->params;
    if (zu->gather_slot < 0)
        start_gather(z, u);
    prefetch(z);
    if (z->dry)
        return NULL;
    if (zu->gather_pending) {
        comm_wait(z->comm, &zu->gather_req);
        zu->gather_pending = false;
    }
    return slot_ptr(&z->gather_pools[pool_of(z->model, u)], zu->gather_slot);
}

void zero_release(struct zero *z, int u)
{
    expect_event(z, PASS_RELEASE, u);
    struct zero_unit *zu = &z->units[u];
    if (zu->refs <= 0)
        fail_internal("unit %d released more often than acquired", u);
    if (--zu->refs > 0 || !zu->sharded)
        return;
    pool_give(z, &z->gather_pools[pool_of(z->model, u)], BUF_GATHERED, zu->gather_slot);
    zu->gather_slot = -1;
    z->live_gathered_elems -= zu->padded;
}

float *zero_grad_open(struct zero *z, int u)
{
    expect_event(z, PASS_GRAD_OPEN, u);
    struct zero_unit *zu = &z->units[u];
    if (z->stage <= 1)
        return zu->grads;
    struct zero_pool *p = &z->grad_pools[pool_of(z->model, u)];
    zu->grad_slot = pool_take(z, p, BUF_GRAD_BUFFERS, u);
    if (z->dry)
        return NULL;
    float *buf = slot_ptr(p, zu->grad_slot);
    backend_zero(buf, zu->padded);
    return buf;
}

void zero_grad_done(struct zero *z, int u)
{
    expect_event(z, PASS_GRAD_DONE, u);
    if (z->stage <= 1)
        return;
    struct zero_unit *zu = &z->units[u];
    /* At most one reduce-scatter in flight: the previous unit's finishes first. */
    finish_reduce_scatter(z);
    count_traffic(z, COMM_REDUCE_SCATTER, zu->shard);
    z->rs_unit = u;
    zu->rs_pending = true;
    if (z->dry)
        return;
    float *buf = slot_ptr(&z->grad_pools[pool_of(z->model, u)], zu->grad_slot);
    /* Adding the accumulated shard into this rank's slice before the reduction
     * makes the reduce-scatter's result the new accumulated shard. */
    float *own = buf + (size_t)z->rank * zu->shard;
    backend_add(own, own, zu->grad_shard, zu->shard);
    comm_reduce_scatter(z->comm, buf, zu->grad_shard, zu->shard, COMM_F32, &zu->rs_req);
}

/* ---- the optimizer step ------------------------------------------------------ */

static float *opt_grads(struct zero_unit *zu) { return zu->grads ? zu->grads + zu->opt_begin : zu->grad_shard; }
static float *opt_params(struct zero_unit *zu) { return zu->sharded ? zu->param_shard : zu->params + zu->opt_begin; }

void zero_zero_grads(struct zero *z)
{
    for (int u = 0; u < z->model->n_units; u++) {
        struct zero_unit *zu = &z->units[u];
        if (zu->grads)
            backend_zero(zu->grads, zu->padded);
        else
            backend_zero(zu->grad_shard, zu->shard);
    }
}

void zero_reduce_grads(struct zero *z)
{
    if (z->stage >= 2)
        return;
    for (int u = 0; u < z->model->n_units; u++) {
        struct zero_unit *zu = &z->units[u];
        count_traffic(z, COMM_ALLREDUCE, zu->padded);
        comm_allreduce(z->comm, zu->grads, zu->padded, COMM_F32, COMM_SUM, &zu->rs_req);
    }
    for (int u = 0; u < z->model->n_units; u++)
        comm_wait(z->comm, &z->units[u].rs_req);
}

bool zero_grads_overflow(struct zero *z)
{
    int32_t bad = 0;
    for (int u = 0; u < z->model->n_units && !bad; u++)
        bad = !backend_all_finite(opt_grads(&z->units[u]), z->units[u].opt_count);
    comm_allreduce(z->comm, &bad, 1, COMM_I32, COMM_MAX, NULL);
    return bad != 0;
}

double zero_grad_norm(struct zero *z)
{
    double sum = 0.0;
    for (int u = 0; u < z->model->n_units; u++)
        sum += backend_sum_squares(opt_grads(&z->units[u]), z->units[u].opt_count);
    if (z->stage > 0) /* at stage 0 every rank holds all of the reduced gradients */
        comm_allreduce(z->comm, &sum, 1, COMM_F64, COMM_SUM, NULL);
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
        .bias_correction1 = (float)(1.0 - pow(oc->beta1, (double)z->adam_steps)),
        .bias_correction2 = (float)(1.0 - pow(oc->beta2, (double)z->adam_steps)),
        .grad_scale = grad_scale,
    };
    for (int u = 0; u < z->model->n_units; u++) {
        struct zero_unit *zu = &z->units[u];
        const struct unit_desc *ud = &z->model->units[u];
        float *p = opt_params(zu), *g = opt_grads(zu);
        const size_t r0 = zu->opt_begin, r1 = zu->opt_begin + zu->opt_count;
        /* Only the tensors' own elements: alignment gaps and padding stay zero. */
        for (int t = 0; t < ud->n_tensors; t++) {
            const struct tensor_desc *td = &ud->tensors[t];
            size_t lo = td->offset > r0 ? td->offset : r0;
            size_t hi = td->offset + td->numel < r1 ? td->offset + td->numel : r1;
            if (lo >= hi)
                continue;
            hp.weight_decay = td->decay ? oc->weight_decay : 0.0f;
            adamw_update(p + (lo - r0), zu->adam_m + (lo - r0), zu->adam_v + (lo - r0), g + (lo - r0), hi - lo, &hp);
        }
    }
    /* Where a stage keeps parameters whole, every rank takes the others' updated slices. */
    if (z->stage == 0)
        return;
    for (int u = 0; u < z->model->n_units; u++) {
        struct zero_unit *zu = &z->units[u];
        if (zu->sharded)
            continue;
        count_traffic(z, COMM_ALLGATHER, zu->shard);
        comm_allgather(z->comm, zu->params + zu->opt_begin, zu->params, zu->shard, COMM_F32, &zu->gather_req);
    }
    for (int u = 0; u < z->model->n_units; u++)
        if (!z->units[u].sharded)
            comm_wait(z->comm, &z->units[u].gather_req);
}

void zero_take_traffic(struct zero *z, uint64_t bytes[COMM_KINDS])
{
    memcpy(bytes, z->traffic, sizeof z->traffic);
    memset(z->traffic, 0, sizeof z->traffic);
}

void zero_gather_unit(struct zero *z, int u, float *out)
{
    struct zero_unit *zu = &z->units[u];
    if (zu->sharded)
        comm_allgather(z->comm, zu->param_shard, out, zu->shard, COMM_F32, NULL);
    else
        memcpy(out, zu->params, zu->padded * sizeof *out);
}

void zero_gather_grads(struct zero *z, int u, float *out)
{
    struct zero_unit *zu = &z->units[u];
    if (zu->grads)
        memcpy(out, zu->grads, zu->padded * sizeof *out);
    else
        comm_allgather(z->comm, zu->grad_shard, out, zu->shard, COMM_F32, NULL);
}

void zero_note_pool_peaks(struct zero *z)
{
    size_t gathered = 0, grad_buffers = 0;
    for (int k = 0; k < ZERO_POOLS; k++) {
        gathered += (size_t)z->gather_pools[k].peak * f32_bytes(z->gather_pools[k].slot_elems);
        grad_buffers += (size_t)z->grad_pools[k].peak * f32_bytes(z->grad_pools[k].slot_elems);
    }
    z->mem->peak[BUF_GATHERED] = gathered;
    z->mem->peak[BUF_GRAD_BUFFERS] = grad_buffers;
}

/* ---- the plan ------------------------------------------------------------------ */

void zero_replay_pass(struct zero *z, const struct zero_pass *pass)
{
    zero_begin_pass(z, pass);
    for (int e = 0; e < pass->n_events; e++) {
        int u = pass->events[e].unit;
        switch (pass->events[e].kind) {
        case PASS_ACQUIRE: zero_acquire(z, u); break;
        case PASS_RELEASE: zero_release(z, u); break;
        case PASS_GRAD_OPEN: zero_grad_open(z, u); break;
        case PASS_GRAD_DONE: zero_grad_done(z, u); break;
        }
    }
    zero_end_pass(z);
}

void zero_plan(const struct model *m, const struct config *cfg, int world, const struct zero_pass *passes,
               int n_passes, size_t bytes[BUF_COUNT], int slots[2][ZERO_POOLS])
{
    /* Rank 0 has the largest shards when sizes differ (none do: shards are equal). */
    struct zero z;
    zero_init(&z, m, cfg, NULL, 0, world, true, NULL, NULL, NULL);
    for (int p = 0; p < n_passes; p++)
        zero_replay_pass(&z, &passes[p]);
    for (int u = 0; u < m->n_units; u++) {
        struct zero_unit *zu = &z.units[u];
        bytes[BUF_PARAMS] += f32_bytes(zu->sharded ? zu->shard : zu->padded);
        bytes[BUF_GRADS] += f32_bytes(z.stage <= 1 ? zu->padded : zu->shard);
        bytes[BUF_ADAM_M] += f32_bytes(zu->opt_count);
        bytes[BUF_ADAM_V] += f32_bytes(zu->opt_count);
    }
    for (int k = 0; k < ZERO_POOLS; k++) {
        slots[0][k] = z.gather_pools[k].peak;
        slots[1][k] = z.grad_pools[k].peak;
        bytes[BUF_GATHERED] += (size_t)slots[0][k] * f32_bytes(z.gather_pools[k].slot_elems);
        bytes[BUF_GRAD_BUFFERS] += (size_t)slots[1][k] * f32_bytes(z.grad_pools[k].slot_elems);
    }
    zero_free(&z);
}
