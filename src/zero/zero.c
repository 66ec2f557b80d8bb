#include "zero.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "io/ckpt.h"
#include "core/dtype.h"
#include "backend/target.h"
#include "core/util.h"

static const char *event_names[] = {"acquire", "release", "grad_open", "grad_done"};
static const enum buf_class pool_class[POOL_SETS] = {
    [POOL_GATHER] = BUF_GATHERED,
    [POOL_COMPUTE] = BUF_COMPUTE_COPIES,
    [POOL_GRAD] = BUF_GRAD_BUFFERS,
    [POOL_SEND] = BUF_GRAD_SEND,
};

static int kind_of(const struct model *m, int u) { return (int)m->units[u].kind; }

static size_t d_bytes(const struct zero *z, size_t n) { return arena_round(n * z->esize); }

static struct zero_pool *pool(struct zero *z, enum zero_pool_set set, int u)
{
    return &z->pools[set][kind_of(z->model, u)];
}

static void *slot_ptr(struct zero_pool *p, int slot) { return p->slots[slot]; }

static void *elem(void *base, size_t i, size_t esize) { return (char *)base + i * esize; }

/* ---- the engine's mode and each unit's role ------------------------------------ */

/* The decisions that hold for every unit: the stage, the precision and where
 * the backend computes. */
static void set_mode(struct zero *z, const struct config *cfg, const struct exec_target *t, int world)
{
    z->stage = cfg->zero.stage;
    z->world = world;
    z->dtype = cfg->dtype;
    z->esize = (size_t)dtype_size(cfg->dtype);
    z->half = cfg->dtype != DTYPE_F32;
    z->compute_copies = z->half && t->act == DTYPE_F32;
    z->half_grad_buffers = z->half && t->device && t->act != DTYPE_F32 && cfg->zero.stage >= 2;
    z->device = t->device;
    z->params_offloaded = target_space(t, cfg, BUF_PARAMS) != SPACE_DEVICE;
    z->optimizer_on_host = z->device && target_space(t, cfg, BUF_MASTER) != SPACE_DEVICE;
    z->master_copy = z->half || cfg->zero.offload_optimizer;
    z->comm_dtype = cfg->dtype == DTYPE_F16 ? COMM_U16_SUM_F16 : cfg->dtype == DTYPE_BF16 ? COMM_U16_SUM_BF16 : COMM_F32;
}

/* The sizes of unit u at this world size, and the range this rank's optimizer updates (none when frozen). */
static void size_unit(const struct zero *z, int u, struct zero_unit *zu)
{
    zu->numel = z->model->units[u].numel;
    zu->padded = round_up(zu->numel, (size_t)z->world * MODEL_TENSOR_ALIGN);
    zu->shard = zu->padded / (size_t)z->world;
    zu->opt_begin = z->stage == 0 ? 0 : (size_t)z->rank * zu->shard;
    zu->opt_count = z->model->units[u].frozen ? 0 : z->stage == 0 ? zu->padded : zu->shard;
}

static void own(struct unit_role *r, enum unit_buf b, size_t elems, size_t elem_size, enum buf_class cls)
{
    r->buf[b] = (struct unit_buffer){elems, elem_size, cls};
}

/* The one place where a unit's buffers, pools and gradient path are decided. */
static void decide_role(const struct zero *z, const struct config *cfg, int u, const struct zero_unit *zu,
                        struct unit_role *r)
{
    memset(r, 0, sizeof *r);
    r->trained = !z->model->units[u].frozen;
    /* With offload_param no unit persists: every unit is gathered from its host shards. */
    r->sharded = z->stage == 3 &&
                 (cfg->zero.offload_param || (double)zu->numel > cfg->zero.stage3_param_persistence_threshold);
    r->pools[POOL_GATHER] = r->sharded;
    r->pools[POOL_COMPUTE] = z->compute_copies;
    own(r, UBUF_PARAMS, r->sharded ? zu->shard : zu->padded, z->esize, BUF_PARAMS);
    if (!r->trained) /* GRAD_NONE: the parameters alone */
        return;
    r->gather_after_step = z->stage >= 1 && !r->sharded;
    r->grad = z->stage <= 1         ? GRAD_ALLREDUCE
              : z->half_grad_buffers ? GRAD_RS_HALF
              : z->master_copy       ? GRAD_RS_CAST
                                     : GRAD_RS_FP32;
    const bool reduce_scatter = r->grad != GRAD_ALLREDUCE;
    r->pools[POOL_GRAD] = reduce_scatter;
    r->pools[POOL_SEND] = r->grad == GRAD_RS_CAST;

    const size_t f32 = sizeof(float), d = z->esize;
    if (z->master_copy)
        own(r, UBUF_MASTER, zu->opt_count, f32, BUF_MASTER);
    own(r, UBUF_ADAM_M, zu->opt_count, f32, BUF_ADAM_M);
    own(r, UBUF_ADAM_V, zu->opt_count, f32, BUF_ADAM_V);
    /* the fp32 gradients the optimizer reads are "fp32 gradients" beside a master, else the gradient shard */
    const enum buf_class fp32_grads = z->master_copy ? BUF_FP32_GRADS : BUF_GRADS;
    if (reduce_scatter) {
        own(r, UBUF_GRAD_SHARD, zu->shard, f32, fp32_grads);
    } else if (z->optimizer_on_host) {
        /* the kernels accumulate on the device; the optimizer reads its range from the host */
        own(r, UBUF_GRADS, zu->padded, f32, BUF_GRADS);
        if (z->half)
            own(r, UBUF_GRADS_COMM, zu->padded, d, BUF_GRADS);
        own(r, UBUF_GRAD_SHARD, zu->opt_count, f32, BUF_FP32_GRADS);
    } else {
        own(r, UBUF_GRADS, zu->padded, f32, fp32_grads);
        if (z->master_copy)
            own(r, UBUF_GRADS_COMM, zu->padded, d, BUF_GRADS);
    }
}

static void layout_units(struct zero *z, const struct config *cfg)
{
    const struct model *m = z->model;
    for (int k = 0; k < ZERO_POOLS; k++) {
        z->pools[POOL_GATHER][k].elem_size = z->esize;
        z->pools[POOL_COMPUTE][k].elem_size = sizeof(float);
        z->pools[POOL_GRAD][k].elem_size = z->half_grad_buffers ? z->esize : sizeof(float);
        z->pools[POOL_SEND][k].elem_size = z->esize;
    }
    for (int u = 0; u < m->n_units; u++) {
        struct zero_unit *zu = &z->units[u];
        size_unit(z, u, zu);
        decide_role(z, cfg, u, zu, &zu->role);
        zu->gather_slot = zu->compute_slot = zu->grad_slot = zu->send_slot = -1;
        for (int set = 0; set < POOL_SETS; set++) {
            struct zero_pool *p = pool(z, set, u);
            if (zu->role.pools[set] && zu->padded > p->slot_elems)
                p->slot_elems = zu->padded;
        }
    }
}

void zero_unit_role(const struct model *m, const struct config *cfg, const struct exec_target *t, int world, int u,
                    struct unit_role *role)
{
    struct zero z = {.model = m};
    set_mode(&z, cfg, t, world);
    struct zero_unit zu;
    size_unit(&z, u, &zu);
    decide_role(&z, cfg, u, &zu, role);
}

int zero_pass_gathers(const struct zero_pass *pass, int u)
{
    int held = 0, gathers = 0;
    for (int e = 0; e < pass->n_events; e++) {
        const struct pass_event *ev = &pass->events[e];
        if (ev->unit == u && ev->kind == PASS_ACQUIRE && held++ == 0)
            gathers++;
        else if (ev->unit == u && ev->kind == PASS_RELEASE)
            held--;
    }
    return gathers;
}

/* ---- pools ------------------------------------------------------------------ */

static void pool_reserve(struct zero_pool *p, int n)
{
    p->slots = realloc(p->slots, (size_t)(n ? n : 1) * sizeof *p->slots);
    p->slot_unit = realloc(p->slot_unit, (size_t)(n ? n : 1) * sizeof *p->slot_unit);
    if (!p->slots || !p->slot_unit)
        fail_internal("out of host memory for a buffer pool");
    for (int i = p->n_slots; i < n; i++) {
        p->slots[i] = NULL;
        p->slot_unit[i] = -1;
    }
    p->n_slots = n;
}

static size_t slot_bytes(const struct zero_pool *p) { return arena_round(p->slot_elems * p->elem_size); }

static int pool_take(struct zero *z, enum zero_pool_set set, int unit)
{
    struct zero_pool *p = pool(z, set, unit);
    int slot = -1;
    for (int i = 0; i < p->n_slots; i++)
        if (p->slot_unit[i] < 0) {
            slot = i;
            break;
        }
    if (slot < 0) {
        if (!z->dry)
            fail_internal("%s pool exhausted at unit %d: the memory plan's dry run and this run differ",
                          arena_class_name(pool_class[set]), unit);
        pool_reserve(p, p->n_slots + 1);
        slot = p->n_slots - 1;
    }
    p->slot_unit[slot] = unit;
    if (++p->live > p->peak)
        p->peak = p->live;
    if (!z->dry)
        arena_mark_live(z->mem, pool_class[set], slot_bytes(p));
    return slot;
}

static void pool_give(struct zero *z, enum zero_pool_set set, int unit, int *slot)
{
    struct zero_pool *p = pool(z, set, unit);
    p->slot_unit[*slot] = -1;
    p->live--;
    if (!z->dry)
        arena_mark_free(z->mem, pool_class[set], slot_bytes(p));
    *slot = -1;
}

static bool pool_has_free(struct zero *z, enum zero_pool_set set, int unit)
{
    const struct zero_pool *p = pool(z, set, unit);
    return z->dry || p->live < p->n_slots;
}

/* ---- init ------------------------------------------------------------------ */

/* Stages 2-3 with a master: one buffer receives every reduce-scatter (at most
 * one is in flight) before its result is added into the fp32 shard; it holds
 * the largest shard of the units that reduce through it (0: none does). */
static size_t receive_elems(const struct zero *z)
{
    size_t largest = 0;
    for (int u = 0; u < z->model->n_units; u++) {
        const struct zero_unit *zu = &z->units[u];
        if ((zu->role.grad == GRAD_RS_CAST || zu->role.grad == GRAD_RS_HALF) && zu->shard > largest)
            largest = zu->shard;
    }
    return largest;
}

static bool has_master(const struct zero_unit *zu) { return zu->role.buf[UBUF_MASTER].elems > 0; }

/* The initial fp32 values of unit u's elements [begin, begin + count) (host
 * memory): from the source, or the seeded init. A unit every rank holds whole
 * is read 1/N per rank and all-gathered. */
static void initial_values(struct zero *z, const struct param_source *src, int u, size_t begin, size_t count,
                           float *out)
{
    struct zero_unit *zu = &z->units[u];
    if (!src) {
        model_init_range(z->model, u, begin, count, out);
        return;
    }
    if (zu->role.sharded || z->world == 1) {
        src->read(src->ctx, u, begin, count, out);
        return;
    }
    float *own = out + (size_t)z->rank * zu->shard;
    src->read(src->ctx, u, (size_t)z->rank * zu->shard, zu->shard, own);
    comm_allgather(z->comm, own, out, zu->shard, COMM_F32, NULL);
}

/* The master's widening from parameters read as stored: the master's
 * elements [lo, hi) of the unit (its range) come from raw, which holds the
 * unit's elements from raw_begin on; [lo, done) are widened so far. */
struct widen {
    struct zero *z;
    struct zero_unit *zu;
    void *raw;
    size_t raw_begin;
    float *master; /* the master, or host scratch standing in for one in device memory */
    size_t done;
};

static void widen_to(struct widen *w, size_t end)
{
    size_t hi = end < w->zu->opt_begin + w->zu->opt_count ? end : w->zu->opt_begin + w->zu->opt_count;
    if (hi <= w->done)
        return;
    dtype_convert(w->master + (w->done - w->zu->opt_begin), DTYPE_F32, elem(w->raw, w->done - w->raw_begin, w->z->esize),
                  w->z->dtype, hi - w->done);
    w->done = hi;
}

/* The read's progress: its first k elements landed (still in cache). */
static void widen_landed(void *ctx, size_t k)
{
    struct widen *w = ctx;
    if (w->done >= w->raw_begin) /* the master's range starts inside what is read */
        widen_to(w, w->raw_begin + k);
}

/* Unit u's parameters straight in their dtype from a source that stores
 * them so (false when it does not): into dst when it is host memory, else
 * through cast; the master is widened from them as they land, while the next
 * bytes are read. No fp32 round trip: a half value widened and narrowed
 * again is itself. */
static bool init_params_as_stored(struct zero *z, const struct param_source *src, int u, size_t begin,
                                  size_t count, void *dst, float *scratch, void *cast)
{
    struct zero_unit *zu = &z->units[u];
    void *raw = z->device ? cast : dst;
    const bool master_on_device = z->device && !z->optimizer_on_host;
    struct widen w = {z, zu, raw, begin, master_on_device ? scratch : zu->master, zu->opt_begin};
    void (*landed)(void *, size_t) = has_master(zu) ? widen_landed : NULL;
    if (zu->role.sharded || z->world == 1) {
        if (!src->read_as(src->ctx, u, begin, count, z->dtype, raw, landed, &w))
            return false;
    } else { /* 1/N each, all-gathered in the parameter dtype */
        const size_t own_begin = (size_t)z->rank * zu->shard;
        void *own = elem(raw, own_begin, z->esize);
        w.raw = own;
        w.raw_begin = own_begin;
        if (!src->read_as(src->ctx, u, own_begin, zu->shard, z->dtype, own, landed, &w))
            return false; /* every rank's answer */
        comm_allgather(z->comm, own, raw, zu->shard, z->esize == 2 ? COMM_U16_SUM_BF16 : COMM_F32, NULL);
        w.raw = raw;
        w.raw_begin = 0;
    }
    if (z->device)
        backend_copy(dst, raw, count * z->esize);
    if (!has_master(zu))
        return true;
    widen_to(&w, zu->opt_begin + zu->opt_count); /* what the read's progress did not reach (beyond this rank's 1/N) */
    if (master_on_device)
        backend_copy(zu->master, scratch, zu->opt_count * sizeof(float));
    return true;
}

/* scratch: fp32, then the parameter dtype, for the largest unit (host memory). */
static void init_params(struct zero *z, const struct param_source *src, int u, float *scratch, void *cast)
{
    struct zero_unit *zu = &z->units[u];
    size_t begin = zu->role.sharded ? zu->opt_begin : 0, count = zu->role.sharded ? zu->shard : zu->padded;
    void *dst = zu->role.sharded ? zu->param_shard : zu->params;
    if (src && src->read_as && init_params_as_stored(z, src, u, begin, count, dst, scratch, cast))
        return;
    const bool master = has_master(zu);
    if (!master && !z->half && !z->device) {
        initial_values(z, src, u, begin, count, dst);
        return;
    }
    initial_values(z, src, u, begin, count, scratch);
    if (!master && !z->half) { /* fp32 on a device: the parameters are the master */
        backend_copy(dst, scratch, count * sizeof(float));
        return;
    }
    dtype_convert(cast, z->dtype, scratch, DTYPE_F32, count);
    backend_copy(dst, cast, count * z->esize);
    if (master) /* the master may be device memory */
        backend_copy(zu->master, scratch + (zu->opt_begin - begin), zu->opt_count * sizeof(float));
}

static float *opt_grads(struct zero_unit *zu);

void zero_load_units(struct zero *z, const struct param_source *src, const bool *which)
{
    size_t largest = 1;
    for (int u = 0; u < z->model->n_units; u++)
        largest = z->units[u].padded > largest ? z->units[u].padded : largest;
    float *scratch = xcalloc(largest, sizeof *scratch);
    void *cast = xcalloc(largest, z->esize);
    for (int u = 0; u < z->model->n_units; u++)
        if (which[u])
            init_params(z, src, u, scratch, cast);
    free(scratch);
    free(cast);
}
static void *opt_params(const struct zero *z, struct zero_unit *zu);

/* The step's fixed tables, made once: one AdamW range per tensor slice of
 * this rank's optimizer range (alignment gaps and padding stay zero), and the
 * gradient ranges whose squares the finite check and the norm sum. */
static void build_optimizer_tables(struct zero *z, const struct config *cfg)
{
    const int units = z->model->n_units;
    int n = 0;
    for (int u = 0; u < units; u++)
        n += z->model->units[u].n_tensors;
    z->adam_ranges = xcalloc((size_t)n, sizeof *z->adam_ranges);
    z->grad_ranges = xcalloc((size_t)units, sizeof *z->grad_ranges);
    z->grad_counts = xcalloc((size_t)units, sizeof *z->grad_counts);
    n = 0;
    for (int u = 0; u < units; u++) {
        struct zero_unit *zu = &z->units[u];
        const struct unit_desc *ud = &z->model->units[u];
        if (!zu->role.trained)
            continue;
        void *p = opt_params(z, zu);
        float *master = has_master(zu) ? zu->master : p, *g = opt_grads(zu);
        z->grad_ranges[z->n_grad_ranges] = g;
        z->grad_counts[z->n_grad_ranges++] = zu->opt_count;
        const size_t r0 = zu->opt_begin, r1 = zu->opt_begin + zu->opt_count;
        for (int t = 0; t < ud->n_tensors; t++) {
            const struct tensor_desc *td = &ud->tensors[t];
            size_t lo = td->offset > r0 ? td->offset : r0;
            size_t hi = td->offset + td->numel < r1 ? td->offset + td->numel : r1;
            if (lo >= hi || td->frozen) /* a frozen tensor of a trained unit (modules_to_save) stays as it is */
                continue;
            size_t off = lo - r0;
            z->adam_ranges[n++] = (struct adamw_range){
                .param = master + off,
                .m = zu->adam_m + off,
                .v = zu->adam_v + off,
                .grad = g + off,
                .param_out = has_master(zu) && !z->optimizer_on_host ? elem(p, off, z->esize) : NULL,
                .n = hi - lo,
                .weight_decay = td->decay ? cfg->optimizer.weight_decay : 0.0f,
            };
        }
    }
    z->n_adam_ranges = n;
}

void zero_init(struct zero *z, const struct model *m, const struct config *cfg, const struct exec_target *t,
               struct comm *comm, int rank, int world, bool dry, const int planned_slots[POOL_SETS][ZERO_POOLS], struct arena arenas[SPACE_COUNT],
               struct mem_tracker *mem, const struct param_source *src)
{
    memset(z, 0, sizeof *z);
    z->model = m;
    z->comm = comm;
    z->rank = rank;
    z->dry = dry;
    set_mode(z, cfg, t, world);
    z->prefetch_elems = cfg->zero.stage3_prefetch_bucket_size;
    z->max_live_elems = cfg->zero.stage3_max_live_parameters;
    z->mem = mem;
    z->rs_unit = -1;
    z->units = xcalloc((size_t)m->n_units, sizeof *z->units);
    layout_units(z, cfg);
    if (dry)
        return;

    struct arena *dev = &arenas[SPACE_DEVICE];
    size_t largest = 0;
    for (int u = 0; u < m->n_units; u++)
        largest = z->units[u].padded > largest ? z->units[u].padded : largest;
    float *scratch = z->master_copy || z->device ? xcalloc(largest, sizeof *scratch) : NULL;
    void *cast = z->master_copy ? xcalloc(largest, z->esize) : NULL;
    const size_t recv = receive_elems(z);
    void *grad_recv = recv ? arena_alloc(dev, mem, BUF_GRADS, recv * z->esize, 1) : NULL;
    for (int u = 0; u < m->n_units; u++) {
        struct zero_unit *zu = &z->units[u];
        void *own[UBUF_COUNT] = {0};
        for (int b = 0; b < UBUF_COUNT; b++) {
            const struct unit_buffer *ub = &zu->role.buf[b];
            if (ub->elems)
                own[b] = arena_alloc(&arenas[target_space(t, cfg, ub->cls)], mem, ub->cls, ub->elems * ub->elem_size, 1);
        }
        if (zu->role.sharded)
            zu->param_shard = own[UBUF_PARAMS];
        else
            zu->params = own[UBUF_PARAMS];
        zu->master = own[UBUF_MASTER];
        zu->grads = own[UBUF_GRADS];
        zu->grads_comm = own[UBUF_GRADS_COMM];
        zu->grad_shard = own[UBUF_GRAD_SHARD];
        zu->adam_m = own[UBUF_ADAM_M];
        zu->adam_v = own[UBUF_ADAM_V];
        if (zu->role.grad == GRAD_RS_CAST || zu->role.grad == GRAD_RS_HALF)
            zu->grad_recv = grad_recv;
        init_params(z, src, u, scratch, cast);
    }
    free(scratch);
    free(cast);
    build_optimizer_tables(z, cfg);
    for (int set = 0; set < POOL_SETS; set++)
        for (int k = 0; k < ZERO_POOLS; k++) {
            struct zero_pool *p = &z->pools[set][k];
            pool_reserve(p, planned_slots[set][k]);
            for (int i = 0; i < p->n_slots; i++)
                p->slots[i] = arena_alloc(dev, mem, pool_class[set], p->slot_elems * p->elem_size, 0);
        }
}

void zero_free(struct zero *z)
{
    for (int set = 0; set < POOL_SETS; set++)
        for (int k = 0; k < ZERO_POOLS; k++) {
            free(z->pools[set][k].slots);
            free(z->pools[set][k].slot_unit);
        }
    free(z->units);
    free(z->adam_ranges);
    free(z->grad_ranges);
    free(z->grad_counts);
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

/* Bytes this rank sends with ring algorithms: elems is one rank's shard for
 * all-gather and reduce-scatter, the whole buffer for all-reduce. */
static void count_traffic(struct zero *z, enum comm_kind kind, size_t elems, size_t esize)
{
    uint64_t n = (uint64_t)z->world, bytes = (uint64_t)elems * esize;
    if (kind == COMM_ALLREDUCE)
        z->traffic[kind] += 2 * (n - 1) * bytes / n;
    else
        z->traffic[kind] += (n - 1) * bytes;
}

static void start_gather(struct zero *z, int u)
{
    struct zero_unit *zu = &z->units[u];
    zu->gather_slot = pool_take(z, POOL_GATHER, u);
    z->live_gathered_elems += zu->padded;
    count_traffic(z, COMM_ALLGATHER, zu->shard, z->esize);
    if (z->dry)
        return;
    void *full = slot_ptr(pool(z, POOL_GATHER, u), zu->gather_slot);
    const void *send = zu->param_shard;
    if (z->device && z->params_offloaded) {
        /* a collective takes buffers of one space: the host shard goes to its
         * slot of the device buffer first, and the gather runs in place */
        void *own = elem(full, (size_t)z->rank * zu->shard, z->esize);
        backend_copy_async(own, zu->param_shard, zu->shard * z->esize);
        send = own;
    }
    comm_allgather(z->comm, send, full, zu->shard, z->comm_dtype, &zu->gather_req);
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
        if (!zu->role.sharded)
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
        if (!pool_has_free(z, POOL_GATHER, ev->unit))
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

/* Waits for the reduce-scatter in flight and frees its buffer; in half
 * precision adds its result into the fp32 gradient shard. */
static void finish_reduce_scatter(struct zero *z)
{
    if (z->rs_unit < 0)
        return;
    int u = z->rs_unit;
    struct zero_unit *zu = &z->units[u];
    if (!z->dry) {
        comm_wait(z->comm, &zu->rs_req);
        if (zu->role.grad != GRAD_RS_FP32 && z->half)
            backend_add_to_f32(zu->grad_shard, zu->grad_recv, z->dtype, zu->shard);
        else if (zu->role.grad != GRAD_RS_FP32) /* fp32 offload: the result already holds the accumulated
                                                 * shard; a device moves it to host memory on its copy stream */
            backend_convert(zu->grad_shard, DTYPE_F32, zu->grad_recv, DTYPE_F32, zu->shard);
    }
    zu->rs_pending = false;
    if (zu->role.grad == GRAD_RS_CAST)
        pool_give(z, POOL_SEND, u, &zu->send_slot);
    else
        pool_give(z, POOL_GRAD, u, &zu->grad_slot);
    z->rs_unit = -1;
}

void zero_end_pass(struct zero *z)
{
    finish_reduce_scatter(z);
    if (z->cursor != z->pass->n_events)
        fail_internal("pass '%s' ended after %d of its %d events", z->pass->name, z->cursor, z->pass->n_events);
    for (int u = 0; u < z->model->n_units; u++) {
        const struct zero_unit *zu = &z->units[u];
        if (zu->refs || zu->gather_slot >= 0 || zu->compute_slot >= 0 || zu->grad_slot >= 0 || zu->send_slot >= 0)
            fail_internal("pass '%s' ended with unit %d still held", z->pass->name, u);
    }
    z->pass = NULL;
}

const float *zero_acquire(struct zero *z, int u)
{
    expect_event(z, PASS_ACQUIRE, u);
    struct zero_unit *zu = &z->units[u];
    if (zu->refs++ > 0 && !zu->role.sharded && !z->compute_copies)
        return zu->params;
    if (zu->role.sharded && zu->gather_slot < 0)
        start_gather(z, u);
    if (zu->role.sharded)
        prefetch(z);
    if (z->compute_copies && zu->compute_slot < 0)
        zu->compute_slot = pool_take(z, POOL_COMPUTE, u);
    if (z->dry)
        return NULL;
    if (zu->gather_pending) {
        comm_wait(z->comm, &zu->gather_req);
        zu->gather_pending = false;
    }
    const void *full = zu->role.sharded ? slot_ptr(pool(z, POOL_GATHER, u), zu->gather_slot) : zu->params;
    if (!z->compute_copies) /* fp32, or half-precision activations: the kernels take the unit as it is */
        return full;
    float *copy = slot_ptr(pool(z, POOL_COMPUTE, u), zu->compute_slot);
    if (zu->refs == 1)
        backend_convert(copy, DTYPE_F32, full, z->dtype, zu->padded);
    return copy;
}

void zero_release(struct zero *z, int u)
{
    expect_event(z, PASS_RELEASE, u);
    struct zero_unit *zu = &z->units[u];
    if (zu->refs <= 0)
        fail_internal("unit %d released more often than acquired", u);
    if (--zu->refs > 0)
        return;
    if (zu->compute_slot >= 0)
        pool_give(z, POOL_COMPUTE, u, &zu->compute_slot);
    if (zu->role.sharded) {
        pool_give(z, POOL_GATHER, u, &zu->gather_slot);
        z->live_gathered_elems -= zu->padded;
    }
}

float *zero_grad_open(struct zero *z, int u)
{
    expect_event(z, PASS_GRAD_OPEN, u);
    struct zero_unit *zu = &z->units[u];
    if (zu->role.grad == GRAD_NONE)
        fail_internal("pass '%s' opens a gradient buffer for unit %d, which is frozen", z->pass->name, u);
    if (zu->role.grad == GRAD_ALLREDUCE)
        return zu->grads;
    zu->grad_slot = pool_take(z, POOL_GRAD, u);
    if (z->dry)
        return NULL;
    float *buf = slot_ptr(pool(z, POOL_GRAD, u), zu->grad_slot);
    /* padded is a multiple of MODEL_TENSOR_ALIGN: whole floats in any dtype */
    backend_zero(buf, zu->padded * pool(z, POOL_GRAD, u)->elem_size / sizeof(float));
    return buf;
}

void zero_grad_done(struct zero *z, int u)
{
    expect_event(z, PASS_GRAD_DONE, u);
    struct zero_unit *zu = &z->units[u];
    if (zu->role.grad == GRAD_NONE)
        fail_internal("pass '%s' hands back a gradient of unit %d, which is frozen", z->pass->name, u);
    if (zu->role.grad == GRAD_ALLREDUCE)
        return;
    /* At most one reduce-scatter in flight: the previous unit's finishes first. */
    finish_reduce_scatter(z);
    count_traffic(z, COMM_REDUCE_SCATTER, zu->shard, z->esize);
    z->rs_unit = u;
    zu->rs_pending = true;
    if (zu->role.grad == GRAD_RS_HALF) {
        /* the kernels wrote the parameter dtype: the buffer goes to the wire as it is, and
         * stays taken until its reduce-scatter is done (finish_reduce_scatter) */
        if (!z->dry)
            comm_reduce_scatter(z->comm, slot_ptr(pool(z, POOL_GRAD, u), zu->grad_slot), zu->grad_recv, zu->shard,
                                z->comm_dtype, &zu->rs_req);
        return;
    }
    if (zu->role.grad == GRAD_RS_CAST) {
        /* Cast to the parameter dtype for the wire; the fp32 buffer is free at once. */
        zu->send_slot = pool_take(z, POOL_SEND, u);
        if (!z->dry) {
            void *send = slot_ptr(pool(z, POOL_SEND, u), zu->send_slot);
            backend_convert(send, z->dtype, slot_ptr(pool(z, POOL_GRAD, u), zu->grad_slot), DTYPE_F32, zu->padded);
            if (!z->half) {
                /* fp32: accumulate as the path without offload does, so both give the same bits */
                float *own = (float *)send + (size_t)z->rank * zu->shard;
                backend_add(own, own, zu->grad_shard, zu->shard);
            }
            comm_reduce_scatter(z->comm, send, zu->grad_recv, zu->shard, z->comm_dtype, &zu->rs_req);
        }
        pool_give(z, POOL_GRAD, u, &zu->grad_slot);
        return;
    }
    if (z->dry)
        return;
    float *buf = slot_ptr(pool(z, POOL_GRAD, u), zu->grad_slot);
    /* Adding the accumulated shard into this rank's slice before the reduction
     * makes the reduce-scatter's result the new accumulated shard. */
    float *own = buf + (size_t)z->rank * zu->shard;
    backend_add(own, own, zu->grad_shard, zu->shard);
    comm_reduce_scatter(z->comm, buf, zu->grad_shard, zu->shard, COMM_F32, &zu->rs_req);
}

/* ---- the optimizer step ------------------------------------------------------ */

/* The fp32 gradients of the optimizer range: the shard (stages 2-3, and the
 * host copy of the range at stages 0-1 on a device), else the range of the
 * whole-unit gradients. */
static float *opt_grads(struct zero_unit *zu) { return zu->grad_shard ? zu->grad_shard : zu->grads + zu->opt_begin; }

/* The parameter-dtype storage of the optimizer range. */
static void *opt_params(const struct zero *z, struct zero_unit *zu)
{
    return zu->role.sharded ? zu->param_shard : elem(zu->params, zu->opt_begin, z->esize);
}

void zero_zero_grads(struct zero *z)
{
    for (int u = 0; u < z->model->n_units; u++) {
        struct zero_unit *zu = &z->units[u];
        if (zu->role.grad == GRAD_ALLREDUCE) /* a device's host range is overwritten at the boundary */
            backend_zero(zu->grads, zu->padded);
        else if (zu->role.grad != GRAD_NONE)
            backend_zero(zu->grad_shard, zu->shard);
    }
}

void zero_reduce_grads(struct zero *z)
{
    for (int u = 0; u < z->model->n_units; u++) {
        struct zero_unit *zu = &z->units[u];
        if (zu->role.grad != GRAD_ALLREDUCE)
            continue;
        count_traffic(z, COMM_ALLREDUCE, zu->padded, z->esize);
        void *buf = zu->grads;
        if (zu->grads_comm) {
            backend_convert(zu->grads_comm, z->dtype, zu->grads, DTYPE_F32, zu->padded);
            buf = zu->grads_comm;
        }
        comm_allreduce(z->comm, buf, zu->padded, z->comm_dtype, COMM_SUM, &zu->rs_req);
    }
    for (int u = 0; u < z->model->n_units; u++) {
        struct zero_unit *zu = &z->units[u];
        if (zu->role.grad != GRAD_ALLREDUCE)
            continue;
        comm_wait(z->comm, &zu->rs_req);
        if (z->optimizer_on_host && zu->grads_comm)
            backend_convert(zu->grad_shard, DTYPE_F32, elem(zu->grads_comm, zu->opt_begin, z->esize), z->dtype,
                            zu->opt_count);
        else if (z->optimizer_on_host)
            backend_copy(zu->grad_shard, zu->grads + zu->opt_begin, zu->opt_count * sizeof(float));
        else if (zu->grads_comm)
            backend_convert(zu->grads, DTYPE_F32, zu->grads_comm, z->dtype, zu->padded);
    }
}

void zero_grad_stats(struct zero *z, bool *overflow, double *norm)
{
    /* squares in double cannot overflow for finite fp32 values: a non-finite
     * sum means a non-finite gradient somewhere, on some rank */
    double sum = backend_sum_squares_multi(z->grad_ranges, z->grad_counts, z->n_grad_ranges);
    if (z->stage > 0) /* at stage 0 every rank holds all of the reduced gradients */
        comm_allreduce(z->comm, &sum, 1, COMM_F64, COMM_SUM, NULL);
    *overflow = !isfinite(sum);
    *norm = sqrt(sum);
}

void zero_inject_inf(struct zero *z)
{
    const float inf = INFINITY;
    /* the first trained unit's first gradient (they may be device memory) */
    backend_copy((float *)z->grad_ranges[0], &inf, sizeof inf);
    backend_synchronize();
}

void zero_optimizer_step(struct zero *z, const struct optimizer_config *oc, float lr, float grad_scale)
{
    /* the host reads gradients the device wrote, and writes masters the device may still read */
    backend_synchronize();
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
    /* Where the optimizer state is in the backend's memory (a device's, unless
     * offload_optimizer), the backend's fused AdamW updates it and writes the
     * new parameters in their dtype in the same pass; in pinned host memory
     * under a device, the host updates it and the device casts the new
     * parameters from the pinned master. */
    const struct adamw_range *ranges = z->adam_ranges;
    const int n = z->n_adam_ranges;
    if (!z->optimizer_on_host) {
        backend_adamw(ranges, n, &hp, z->dtype);
    } else {
        for (int k = 0; k < n; k++) {
            hp.weight_decay = ranges[k].weight_decay;
            adamw_update(ranges[k].param, ranges[k].m, ranges[k].v, ranges[k].grad, ranges[k].n, &hp, NULL,
                         z->dtype);
        }
        /* the device casts the new parameters from the pinned master */
        for (int u = 0; u < z->model->n_units; u++) {
            struct zero_unit *zu = &z->units[u];
            if (has_master(zu))
                backend_convert(opt_params(z, zu), z->dtype, zu->master, DTYPE_F32, zu->opt_count);
        }
    }
    /* Where a stage keeps parameters whole, every rank takes the others' updated slices. */
    for (int u = 0; u < z->model->n_units; u++) {
        struct zero_unit *zu = &z->units[u];
        if (!zu->role.gather_after_step)
            continue;
        count_traffic(z, COMM_ALLGATHER, zu->shard, z->esize);
        comm_allgather(z->comm, opt_params(z, zu), zu->params, zu->shard, z->comm_dtype, &zu->gather_req);
    }
    for (int u = 0; u < z->model->n_units; u++)
        if (z->units[u].role.gather_after_step)
            comm_wait(z->comm, &z->units[u].gather_req);
}

void zero_take_traffic(struct zero *z, uint64_t bytes[COMM_KINDS])
{
    memcpy(bytes, z->traffic, sizeof z->traffic);
    memset(z->traffic, 0, sizeof z->traffic);
}

/* Gathers a shard held anywhere into host memory: collectives take buffers of
 * one space, so a device shard goes to the host first. */
static void gather_to_host(struct zero *z, const void *shard, size_t count, size_t esize, enum comm_dtype dt,
                           void *out)
{
    void *own = (char *)out + (size_t)z->rank * count * esize;
    backend_copy(own, shard, count * esize);
    comm_allgather(z->comm, own, out, count, dt, NULL);
}

void zero_gather_unit(struct zero *z, int u, float *out)
{
    struct zero_unit *zu = &z->units[u];
    void *full = z->half ? xcalloc(zu->padded, z->esize) : out;
    if (zu->role.sharded)
        gather_to_host(z, zu->param_shard, zu->shard, z->esize, z->comm_dtype, full);
    else
        backend_copy(full, zu->params, zu->padded * z->esize);
    if (z->half) {
        dtype_convert(out, DTYPE_F32, full, z->dtype, zu->padded);
        free(full);
    }
}

/* Adds the hashes of unit u's elements [at, at + n) (fp32 values) to *sum,
 * those beyond its numel (padding, which varies with the world size) left out. */
static void hash_values(const struct base_hash *h, uint64_t *sum, int u, size_t at, size_t n, const float *f32)
{
    const size_t numel = h->m->units[u].numel;
    n = at >= numel ? 0 : at + n > numel ? numel - at : n;
    const uint64_t salt = (uint64_t)u << 44;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &f32[i], sizeof bits);
        *sum += lora_mix(((salt + at + i) << 32 | bits) ^ (salt + at + i) * 0x9E3779B97F4A7C15ull);
    }
}

static void hashing_read(void *ctx, int u, size_t begin, size_t count, float *out)
{
    struct base_hash *h = ctx;
    if (h->inner)
        h->inner->read(h->inner->ctx, u, begin, count, out);
    else
        model_init_range(h->m, u, begin, count, out);
    if (u < h->u_end)
        hash_values(h, &h->sum, u, begin, count, out);
}

static bool hashing_read_as(void *ctx, int u, size_t begin, size_t count, enum dtype dt, void *out,
                            void (*landed)(void *landed_ctx, size_t elems), void *landed_ctx)
{
    struct base_hash *h = ctx;
    if (!h->inner || !h->inner->read_as ||
        !h->inner->read_as(h->inner->ctx, u, begin, count, dt, out, landed, landed_ctx))
        return false;
    if (u >= h->u_end)
        return true;
    /* the values as stored, widened exactly (a stored half value is the value read) */
    enum { CHUNK = 1 << 16 };
    float *f32 = xcalloc(CHUNK, sizeof *f32);
    for (size_t at = 0; at < count; at += CHUNK) {
        const size_t n = count - at < CHUNK ? count - at : CHUNK;
        dtype_convert(f32, DTYPE_F32, (const char *)out + at * (dt == DTYPE_F32 ? 4 : 2), dt, n);
        hash_values(h, &h->sum, u, begin + at, n, f32);
    }
    free(f32);
    return true;
}

void zero_hash_source(struct base_hash *h, const struct model *m, int u_end, const struct param_source *inner)
{
    *h = (struct base_hash){{hashing_read, hashing_read_as, h}, inner, m, u_end, 0};
}

uint64_t zero_hash_total(struct base_hash *h, struct comm *comm, int rank, int world)
{
    uint64_t *all = xcalloc((size_t)world, sizeof *all), sum = 0;
    all[rank] = h->sum;
    /* 8-byte values, moved bit for bit */
    comm_allgather(comm, &all[rank], all, 1, COMM_F64, NULL);
    for (int r = 0; r < world; r++)
        sum += all[r];
    free(all);
    return sum;
}

void zero_gather_grads(struct zero *z, int u, float *out)
{
    struct zero_unit *zu = &z->units[u];
    if (!zu->role.trained)
        fail_internal("zero_gather_grads: unit %d is frozen and has no gradients", u);
    if (zu->grads)
        backend_copy(out, zu->grads, zu->padded * sizeof *out);
    else
        gather_to_host(z, zu->grad_shard, zu->shard, sizeof(float), COMM_F32, out);
}

void zero_note_pool_peaks(struct zero *z)
{
    for (int set = 0; set < POOL_SETS; set++) {
        size_t bytes = 0;
        for (int k = 0; k < ZERO_POOLS; k++)
            bytes += (size_t)z->pools[set][k].peak * slot_bytes(&z->pools[set][k]);
        z->mem->peak[pool_class[set]] = bytes;
    }
}

/* ---- checkpoints ------------------------------------------------------------- */

const char *const zero_ckpt_group_names[ZERO_CKPT_GROUPS] = {"master", "adam_m", "adam_v"};

int zero_ckpt_n_slices(const struct zero *z)
{
    int n = 0;
    for (int u = 0; u < z->model->n_units; u++)
        if (z->units[u].role.trained)
            n += z->model->units[u].n_tensors;
    return n;
}

/* Element offset of unit u's range within this rank's whole range. */
static size_t range_offset(const struct zero *z, int u)
{
    size_t at = 0;
    for (int i = 0; i < u; i++)
        at += z->units[i].opt_count;
    return at;
}

static size_t range_total(const struct zero *z) { return range_offset(z, z->model->n_units); }

static float *device_group_base(struct zero *z, struct zero_unit *zu, enum zero_ckpt_group g);

/* Where the optimizer state is device memory, host code reads and writes it
 * only through these copies. */
static bool state_on_device(const struct zero *z) { return z->device && !z->optimizer_on_host; }

static void copy_groups(struct zero *z, bool to_host)
{
    for (int g = 0; g < ZERO_CKPT_GROUPS; g++)
        for (int u = 0; u < z->model->n_units; u++) {
            struct zero_unit *zu = &z->units[u];
            float *host = z->ckpt_host[g] + range_offset(z, u), *dev = device_group_base(z, zu, g);
            size_t bytes = zu->opt_count * sizeof(float);
            if (to_host)
                backend_copy(host, dev, bytes);
            else
                backend_copy(dev, host, bytes);
        }
    backend_synchronize();
}

void zero_ckpt_stage(struct zero *z)
{
    if (!state_on_device(z) || z->ckpt_host[0])
        return;
    for (int g = 0; g < ZERO_CKPT_GROUPS; g++)
        z->ckpt_host[g] = xcalloc(range_total(z) ? range_total(z) : 1, sizeof(float));
    copy_groups(z, true);
}

void zero_ckpt_unstage(struct zero *z)
{
    for (int g = 0; g < ZERO_CKPT_GROUPS; g++) {
        free(z->ckpt_host[g]);
        z->ckpt_host[g] = NULL;
    }
}

static float *group_base(struct zero *z, struct zero_unit *zu, enum zero_ckpt_group g)
{
    if (z->ckpt_host[g])
        return z->ckpt_host[g] + range_offset(z, (int)(zu - z->units));
    return device_group_base(z, zu, g);
}

static float *device_group_base(struct zero *z, struct zero_unit *zu, enum zero_ckpt_group g)
{
    if (g == ZERO_CKPT_ADAM_M)
        return zu->adam_m;
    if (g == ZERO_CKPT_ADAM_V)
        return zu->adam_v;
    return has_master(zu) ? zu->master : (float *)opt_params(z, zu);
}

void zero_ckpt_slices(struct zero *z, enum zero_ckpt_group g, struct ckpt_slice *out)
{
    int i = 0;
    for (int u = 0; u < z->model->n_units; u++) {
        struct zero_unit *zu = &z->units[u];
        const struct unit_desc *ud = &z->model->units[u];
        const bool owner = z->stage > 0 || z->rank == 0;
        for (int t = 0; zu->role.trained && t < ud->n_tensors; t++, i++) {
            const struct tensor_desc *td = &ud->tensors[t];
            struct ckpt_slice *sl = &out[i];
            sl->name = td->name;
            sl->ndim = td->ndim;
            sl->shape[0] = (size_t)td->shape[0];
            sl->shape[1] = (size_t)td->shape[1];
            size_t at = ckpt_intersect(td->offset, td->numel, zu->opt_begin, owner ? zu->opt_count : 0, &sl->begin,
                                       &sl->count);
            sl->data = group_base(z, zu, g) + at;
        }
    }
}

void zero_export_slices(struct zero *z, struct ckpt_slice *out)
{
    zero_ckpt_slices(z, ZERO_CKPT_MASTER, out);
    if (z->stage > 0)
        return;
    /* every rank holds everything: each takes 1/N of every tensor */
    int i = 0;
    for (int u = 0; u < z->model->n_units; u++) {
        struct zero_unit *zu = &z->units[u];
        const struct unit_desc *ud = &z->model->units[u];
        for (int t = 0; zu->role.trained && t < ud->n_tensors; t++, i++) {
            const struct tensor_desc *td = &ud->tensors[t];
            size_t lo = td->numel * (size_t)z->rank / (size_t)z->world;
            size_t hi = td->numel * (size_t)(z->rank + 1) / (size_t)z->world;
            out[i].begin = lo;
            out[i].count = hi - lo;
            out[i].data = group_base(z, zu, ZERO_CKPT_MASTER) + td->offset + lo;
        }
    }
}

void zero_ckpt_load(struct zero *z, struct ckpt_reader *r)
{
    if (state_on_device(z)) /* read into host copies, then to the device */
        for (int g = 0; g < ZERO_CKPT_GROUPS; g++)
            z->ckpt_host[g] = xcalloc(range_total(z) ? range_total(z) : 1, sizeof(float));
    struct ckpt_slice *slices = xcalloc((size_t)zero_ckpt_n_slices(z), sizeof *slices);
    for (int g = 0; g < ZERO_CKPT_GROUPS; g++) {
        /* every rank reads its whole range (stage 0: everything), whoever saved it */
        int i = 0;
        for (int u = 0; u < z->model->n_units; u++) {
            struct zero_unit *zu = &z->units[u];
            const struct unit_desc *ud = &z->model->units[u];
            for (int t = 0; zu->role.trained && t < ud->n_tensors; t++, i++) {
                const struct tensor_desc *td = &ud->tensors[t];
                struct ckpt_slice *sl = &slices[i];
                sl->name = td->name;
                sl->ndim = td->ndim;
                sl->shape[0] = (size_t)td->shape[0];
                sl->shape[1] = (size_t)td->shape[1];
                size_t at = ckpt_intersect(td->offset, td->numel, zu->opt_begin, zu->opt_count, &sl->begin, &sl->count);
                ckpt_read_slice(r, zero_ckpt_group_names[g], sl, group_base(z, zu, g) + at);
            }
        }
    }
    free(slices);
    if (z->ckpt_host[0]) {
        copy_groups(z, false);
        zero_ckpt_unstage(z);
    }
    /* The parameters in their dtype from the master, then whole where the stage keeps them whole. */
    for (int u = 0; u < z->model->n_units; u++) {
        struct zero_unit *zu = &z->units[u];
        if (has_master(zu))
            backend_convert(opt_params(z, zu), z->dtype, zu->master, DTYPE_F32, zu->opt_count);
        if (zu->role.gather_after_step)
            comm_allgather(z->comm, opt_params(z, zu), zu->params, zu->shard, z->comm_dtype, NULL);
    }
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

void zero_plan(const struct model *m, const struct config *cfg, const struct exec_target *t, int world,
               const struct zero_pass *passes, int n_passes, size_t bytes[BUF_COUNT],
               int slots[POOL_SETS][ZERO_POOLS])
{
    struct zero z;
    zero_init(&z, m, cfg, t, NULL, 0, world, true, NULL, NULL, NULL, NULL);
    for (int p = 0; p < n_passes; p++)
        zero_replay_pass(&z, &passes[p]);
    for (int u = 0; u < m->n_units; u++)
        for (int b = 0; b < UBUF_COUNT; b++) {
            const struct unit_buffer *ub = &z.units[u].role.buf[b];
            if (ub->elems)
                bytes[ub->cls] += arena_round(ub->elems * ub->elem_size);
        }
    if (receive_elems(&z))
        bytes[BUF_GRADS] += d_bytes(&z, receive_elems(&z)); /* the one reduce-scatter receive buffer */
    for (int set = 0; set < POOL_SETS; set++)
        for (int k = 0; k < ZERO_POOLS; k++) {
            slots[set][k] = z.pools[set][k].peak;
            bytes[pool_class[set]] += (size_t)slots[set][k] * slot_bytes(&z.pools[set][k]);
        }
    zero_free(&z);
}
