/*
 * zero_pass — the passes (see zero.h, zero_internal.h): the pools of
 * gathered units, compute copies, gradient and send buffers (slots taken and
 * given back, their high-water marks); a pass's events checked against its
 * declared list; acquire and release, with the all-gathers of sharded units
 * (from host shards under offload_param) and the prefetch of the next ones;
 * gradient buffers handed back and reduce-scattered, at most one in flight;
 * the traffic counters; and the plan, a dry run of the passes that sizes the
 * pools and every buffer class.
 */
#include "zero_internal.h"

#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/util.h"

static const char *event_names[] = {"acquire", "release", "grad_open", "grad_done"};

static size_t d_bytes(const struct zero *z, size_t n) { return arena_round(n * z->esize); }

static void *slot_ptr(struct zero_pool *p, int slot) { return p->slots[slot]; }

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

void zero_pool_reserve(struct zero_pool *p, int n)
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
        zero_pool_reserve(p, p->n_slots + 1);
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
void zero_count_traffic(struct zero *z, enum comm_kind kind, size_t elems, size_t esize)
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
    /* a 4-bit unit's shard moves as bytes, in fp32 words (shard_bytes is a multiple of 16) */
    const size_t shard_bytes = zu->role.q4 ? zu->q4.shard_bytes : zu->shard * z->esize;
    const enum comm_dtype wire = zu->role.q4 ? COMM_F32 : z->comm_dtype;
    const size_t wire_count = zu->role.q4 ? shard_bytes / sizeof(float) : zu->shard;
    zero_count_traffic(z, COMM_ALLGATHER, shard_bytes, 1);
    if (z->dry)
        return;
    void *full = slot_ptr(pool(z, POOL_GATHER, u), zu->gather_slot);
    const void *send = zu->param_shard;
    if (zu->role.param_nvme) { /* from the parameter file (read ahead) into this rank's slot, gathered in place */
        void *own = elem(full, (size_t)z->rank * zu->shard, z->esize);
        zero_nvme_fetch(z, u, own);
        send = own;
    } else if (z->device && z->params_offloaded) {
        /* a collective takes buffers of one space: the host shard goes to its
         * slot of the device buffer first, and the gather runs in place */
        void *own = elem(full, (size_t)z->rank, shard_bytes);
        backend_copy_async(own, zu->param_shard, shard_bytes);
        send = own;
    }
    comm_allgather(z->comm, send, full, wire_count, wire, &zu->gather_req);
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
    zero_nvme_begin_pass(z);
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
    if (zu->role.pools[POOL_COMPUTE] && zu->compute_slot < 0)
        zu->compute_slot = pool_take(z, POOL_COMPUTE, u);
    if (z->dry)
        return NULL;
    if (zu->gather_pending) {
        comm_wait(z->comm, &zu->gather_req);
        zu->gather_pending = false;
    }
    const void *full = zu->role.sharded ? slot_ptr(pool(z, POOL_GATHER, u), zu->gather_slot) : zu->params;
    if (zu->role.q4) { /* dequantized to the parameter dtype: after the fp32 copy when there is one */
        char *slot = slot_ptr(pool(z, POOL_COMPUTE, u), zu->compute_slot);
        void *values = z->compute_copies ? slot + zu->padded * sizeof(float) : slot;
        if (zu->refs == 1)
            zero_q4_expand(z, u, full, values, z->dtype, false);
        full = values;
        if (!z->compute_copies)
            return full;
    }
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
    zero_count_traffic(z, COMM_REDUCE_SCATTER, zu->shard, z->esize);
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

void zero_take_traffic(struct zero *z, uint64_t bytes[COMM_KINDS])
{
    memcpy(bytes, z->traffic, sizeof z->traffic);
    memset(z->traffic, 0, sizeof z->traffic);
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
    if (zero_receive_elems(&z))
        bytes[BUF_GRADS] += d_bytes(&z, zero_receive_elems(&z)); /* the one reduce-scatter receive buffer */
    if (zero_nvme_stage_elems(&z)) /* offload_optimizer nvme on a device: one unit's new master and gradients */
        bytes[BUF_MASTER] += arena_round(2 * zero_nvme_stage_elems(&z) * sizeof(float));
    for (int set = 0; set < POOL_SETS; set++)
        for (int k = 0; k < ZERO_POOLS; k++) {
            slots[set][k] = z.pools[set][k].peak;
            bytes[pool_class[set]] += (size_t)slots[set][k] * slot_bytes(&z.pools[set][k]);
        }
    zero_free(&z);
}
