/*
 * zero — setting the engine up (see zero.h; the files' split is in
 * zero_internal.h): the mode that holds for every unit (stage, precision,
 * where the backend computes and where the state lives), each unit's sizes at
 * this world size, its shard and optimizer range, and its role (decide_role:
 * the one place its buffers, pools and gradient path are decided); carving
 * every buffer and pool slot out of the arenas; the initial parameters and
 * masters, from a source (read as stored in the parameter dtype, or through
 * fp32; 1/N per rank and all-gathered where every rank holds a unit whole) or
 * the seeded init; the hashing source of the base identity; zero_free.
 */
#include "zero_internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "backend/target.h"
#include "core/util.h"
#include "zero/nvme.h"

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
    r->q4 = zero_q4_unit(z->model, cfg, u, r->sharded);
    r->pools[POOL_GATHER] = r->sharded;
    r->pools[POOL_COMPUTE] = z->compute_copies || r->q4;
    /* on NVMe: frozen, or trained with an fp32 master the shard is narrowed from after each step (in memory, or
     * in offload_optimizer nvme's file); a 4-bit shard stays in (pinned) memory */
    r->param_nvme = r->sharded && !r->q4 && cfg->zero.offload_param_nvme && (!r->trained || z->master_copy);
    if (r->q4) {
        struct q4_layout q;
        zero_q4_layout(z->model, cfg, u, z->world, z->esize, &q);
        own(r, UBUF_PARAMS, q.shard_bytes, 1, BUF_PARAMS);
    } else {
        own(r, UBUF_PARAMS, r->param_nvme ? 0 : r->sharded ? zu->shard : zu->padded, z->esize, BUF_PARAMS);
    }
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
    r->state_in_file = cfg->zero.offload_optimizer_nvme; /* the master, m and v: in the rank's file (nvme.h) */
    if (z->master_copy && !r->state_in_file)
        own(r, UBUF_MASTER, zu->opt_count, f32, BUF_MASTER);
    if (!r->state_in_file) {
        own(r, UBUF_ADAM_M, zu->opt_count, f32, BUF_ADAM_M);
        own(r, UBUF_ADAM_V, zu->opt_count, f32, BUF_ADAM_V);
    }
    /* the fp32 gradients the optimizer reads are "fp32 gradients" beside a master, else the gradient shard */
    const enum buf_class fp32_grads = z->master_copy ? BUF_FP32_GRADS : BUF_GRADS;
    if (reduce_scatter) {
        own(r, UBUF_GRAD_SHARD, zu->shard, f32, fp32_grads);
    } else if (zero_host_grad_range(z, r)) {
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

/* Bytes of unit u's slot in a pool of gathered units or of compute copies:
 * the N shards side by side; the fp32 copy, or a 4-bit unit's values in the
 * parameter dtype (both when the CPU computes in fp32 from half precision:
 * dequantized to the parameter dtype after the fp32 copy, then widened into
 * it, as a stored half-precision unit is). */
static size_t slot_need(const struct zero *z, enum zero_pool_set set, const struct zero_unit *zu)
{
    if (set == POOL_GATHER)
        return zu->role.q4 ? (size_t)z->world * zu->q4.shard_bytes : zu->padded * z->esize;
    return (z->compute_copies ? zu->padded * sizeof(float) : 0) + (zu->role.q4 ? zu->padded * z->esize : 0);
}

static void layout_units(struct zero *z, const struct config *cfg)
{
    const struct model *m = z->model;
    for (int k = 0; k < ZERO_POOLS; k++) {
        z->pools[POOL_GATHER][k].elem_size = 1; /* these two pools count bytes (slot_need) */
        z->pools[POOL_COMPUTE][k].elem_size = 1;
        z->pools[POOL_GRAD][k].elem_size = z->half_grad_buffers ? z->esize : sizeof(float);
        z->pools[POOL_SEND][k].elem_size = z->esize;
    }
    for (int u = 0; u < m->n_units; u++) {
        struct zero_unit *zu = &z->units[u];
        size_unit(z, u, zu);
        decide_role(z, cfg, u, zu, &zu->role);
        if (zu->role.q4)
            zero_q4_layout(m, cfg, u, z->world, z->esize, &zu->q4);
        zu->gather_slot = zu->compute_slot = zu->grad_slot = zu->send_slot = -1;
        for (int set = 0; set < POOL_SETS; set++) {
            struct zero_pool *p = pool(z, set, u);
            const size_t need = set == POOL_GATHER || set == POOL_COMPUTE ? slot_need(z, set, zu) : zu->padded;
            if (zu->role.pools[set] && need > p->slot_elems)
                p->slot_elems = need;
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

size_t zero_gather_shard_bytes(const struct model *m, const struct config *cfg, const struct exec_target *t,
                               int world, int u)
{
    struct zero z = {.model = m};
    set_mode(&z, cfg, t, world);
    struct zero_unit zu;
    size_unit(&z, u, &zu);
    decide_role(&z, cfg, u, &zu, &zu.role);
    if (!zu.role.sharded)
        return 0;
    return zu.role.q4 ? zu.role.buf[UBUF_PARAMS].elems : zu.shard * z.esize;
}

/* ---- init ------------------------------------------------------------------ */

/* Stages 2-3 with a master: one buffer receives every reduce-scatter (at most
 * one is in flight) before its result is added into the fp32 shard; it holds
 * the largest shard of the units that reduce through it (0: none does). */
size_t zero_receive_elems(const struct zero *z)
{
    size_t largest = 0;
    for (int u = 0; u < z->model->n_units; u++) {
        const struct zero_unit *zu = &z->units[u];
        if ((zu->role.grad == GRAD_RS_CAST || zu->role.grad == GRAD_RS_HALF) && zu->shard > largest)
            largest = zu->shard;
    }
    return largest;
}

/* ---- offload_optimizer "nvme" ----------------------------------------------- */

size_t zero_nvme_stage_elems(const struct zero *z)
{
    size_t largest = 0;
    for (int u = 0; u < z->model->n_units && z->device; u++)
        if (z->units[u].role.state_in_file && z->units[u].opt_count > largest)
            largest = z->units[u].opt_count;
    return largest;
}

/* The job's part of the files' names: $SLURM_JOB_ID (a requeued job finds
 * its own name again), else rank 0's pid (a second engine in the process, a reference model, adds "-1", ...: its own
 * files, not the first one's locks). Collective. */
static void nvme_job_name(struct zero *z, char *out, size_t cap)
{
    static int engines;
    char base[96];
    const char *slurm = getenv("SLURM_JOB_ID");
    if (slurm && *slurm && strlen(slurm) < sizeof base &&
        strspn(slurm, "0123456789_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-.") == strlen(slurm)) {
        snprintf(base, sizeof base, "%s", slurm);
    } else {
        double pid = z->rank == 0 ? (double)getpid() : 0.0;
        comm_allreduce(z->comm, &pid, 1, COMM_F64, COMM_MAX, NULL);
        snprintf(base, sizeof base, "pid%.0f", pid);
    }
    if (engines++)
        snprintf(out, cap, "%s-%d", base, engines - 1);
    else
        snprintf(out, cap, "%s", base);
}

/* Opens this rank's files: the optimizer's for its whole optimizer range of
 * n elements (zero state), the parameters' (zero_nvme.c). */
static void open_files(struct zero *z, const struct config *cfg, const struct exec_target *t, const char *job,
                       size_t n)
{
    if (cfg->zero.offload_optimizer_nvme && n > 0) {
        size_t file_bytes, host_bytes, piece;
        nvme_sizes(n, cfg->zero.optimizer_buffer_count, &file_bytes, &host_bytes, &piece);
        z->nvme = nvme_open(cfg->zero.optimizer_nvme_path, job, z->rank, n, piece, cfg->zero.optimizer_buffer_count);
        if (z->rank == 0)
            log_info("offload_optimizer nvme: %s, %.1f MiB of state per rank, %.1f MiB of buffers, %s, %s",
                     nvme_path(z->nvme), (double)file_bytes / 1048576.0, (double)host_bytes / 1048576.0,
                     nvme_direct(z->nvme) ? "O_DIRECT" : "buffered", nvme_async(z->nvme) ? "io_uring" : "synchronous");
    }
    zero_nvme_open(z, cfg, t, job);
}

/* Opens the files before any parameter is read: nvme_path checked (room,
 * tmpfs, O_DIRECT), names of their own and locks. */
static void nvme_setup(struct zero *z, const struct config *cfg, const struct exec_target *t)
{
    if (!cfg->zero.offload_optimizer_nvme && !cfg->zero.offload_param_nvme)
        return;
    char job[128];
    nvme_job_name(z, job, sizeof job);
    /* A rank whose disk is full or whose file is locked: every rank stops with its line here, before the
     * collectives of the parameters' init could leave the others waiting (inside the trainer's trap, nested). */
    struct fail_trap *outer = fail_trap_current(), trap;
    if (FAIL_TRAP(&trap) == 0)
        open_files(z, cfg, t, job, zero_range_offset(z, z->model->n_units));
    fail_trap_restore(outer);
    int32_t failed = trap.status ? (int32_t)(z->world - z->rank) : 0; /* the max: the lowest failing rank */
    comm_allreduce(z->comm, &failed, 1, COMM_I32, COMM_MAX, NULL);
    if (failed) {
        comm_broadcast(z->comm, trap.message, sizeof trap.message / sizeof(int32_t), COMM_I32, z->world - failed,
                       NULL);
        trap.message[sizeof trap.message - 1] = 0;
        fail_input("%s", trap.message);
    }
}

/* The initial master of unit u's optimizer range, from host memory: into its
 * buffer (which may be device memory) or the file. */
static void store_master(struct zero *z, int u, const float *values)
{
    struct zero_unit *zu = &z->units[u];
    if (zu->role.state_in_file)
        nvme_write_range(z->nvme, zero_range_offset(z, u), zu->opt_count, values, NULL, NULL);
    else
        backend_copy(zu->master, values, zu->opt_count * sizeof(float));
}

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
    /* the master in device memory or the file: widened into scratch, then stored */
    const bool master_elsewhere = (z->device && !z->optimizer_on_host) || zu->role.state_in_file;
    struct widen w = {z, zu, raw, begin, master_elsewhere ? scratch : zu->master, zu->opt_begin};
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
    if (master_elsewhere)
        store_master(z, (int)(zu - z->units), scratch);
    return true;
}

/* scratch: fp32, then the parameter dtype, for the largest unit (host memory). */
static void init_params_to(struct zero *z, const struct param_source *src, int u, void *dst, float *scratch,
                           void *cast)
{
    struct zero_unit *zu = &z->units[u];
    size_t begin = zu->role.sharded ? zu->opt_begin : 0, count = zu->role.sharded ? zu->shard : zu->padded;
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
    if (master) /* the master may be device memory, or in the file */
        store_master(z, u, scratch + (zu->opt_begin - begin));
}

static void init_params(struct zero *z, const struct param_source *src, int u, float *scratch, void *cast)
{
    struct zero_unit *zu = &z->units[u];
    if (zu->role.q4) { /* this rank's blocks, read in 4 bits (the cast buffer holds the shard's bytes) */
        zero_q4_read_shard(z, src, u, scratch, cast);
        backend_copy(zu->param_shard, cast, zu->q4.shard_bytes);
        return;
    }
    if (zu->role.param_nvme) { /* staged in a buffer of the parameter file, then written to it */
        init_params_to(z, src, u, zero_nvme_staging(z), scratch, cast);
        zero_nvme_store(z, u);
        return;
    }
    init_params_to(z, src, u, zu->role.sharded ? zu->param_shard : zu->params, scratch, cast);
}

void zero_load_units(struct zero *z, const struct param_source *src, const bool *which)
{
    size_t largest = 1;
    for (int u = 0; u < z->model->n_units; u++)
        largest = z->units[u].padded > largest ? z->units[u].padded : largest;
    for (int u = 0; u < z->model->n_units; u++)
        if (z->units[u].role.q4 && z->units[u].q4.shard_bytes > largest * z->esize)
            largest = z->units[u].q4.shard_bytes;
    float *scratch = xcalloc(largest, sizeof *scratch);
    void *cast = xcalloc(largest, z->esize);
    for (int u = 0; u < z->model->n_units; u++)
        if (which[u])
            init_params(z, src, u, scratch, cast);
    free(scratch);
    free(cast);
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
    nvme_setup(z, cfg, t);

    struct arena *dev = &arenas[SPACE_DEVICE];
    size_t largest = 0;
    for (int u = 0; u < m->n_units; u++)
        largest = z->units[u].padded > largest ? z->units[u].padded : largest;
    bool any_q4 = false;
    size_t cast_bytes = largest * z->esize;
    for (int u = 0; u < m->n_units; u++)
        if (z->units[u].role.q4) {
            any_q4 = true;
            cast_bytes = z->units[u].q4.shard_bytes > cast_bytes ? z->units[u].q4.shard_bytes : cast_bytes;
        }
    if (any_q4 && rank == 0) {
        int n_q4 = 0;
        size_t q4_bytes = 0, plain_bytes = 0;
        for (int u = 0; u < m->n_units; u++)
            if (z->units[u].role.q4) {
                n_q4++;
                q4_bytes += z->units[u].q4.shard_bytes;
                plain_bytes += z->units[u].shard * z->esize;
            }
        log_info("quantization: %d units stored and gathered in 4 bits, %.3f MiB per rank (%.1f%% of %s)", n_q4,
                 (double)q4_bytes / 1048576.0, 100.0 * (double)q4_bytes / (double)plain_bytes, dtype_name(z->dtype));
    }
    float *scratch = z->master_copy || z->device || any_q4 ? xcalloc(largest, sizeof *scratch) : NULL;
    /* a device's parameters are read into cast first (init_params_as_stored), also where fp32 ones are the master */
    void *cast = z->master_copy || z->device || any_q4 ? xcalloc(cast_bytes, 1) : NULL;
    const size_t recv = zero_receive_elems(z);
    void *grad_recv = recv ? arena_alloc(dev, mem, BUF_GRADS, recv * z->esize, 1) : NULL;
    const size_t stage = zero_nvme_stage_elems(z);
    if (stage) { /* pinned: the new master the device casts from, then the gradients the host reads */
        z->nvme_stage =
            arena_alloc(&arenas[target_space(t, cfg, BUF_MASTER)], mem, BUF_MASTER, 2 * stage * sizeof(float), 1);
        z->nvme_grad_stage = z->nvme_stage + stage;
    }
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
    zero_build_optimizer_tables(z, cfg);
    for (int set = 0; set < POOL_SETS; set++)
        for (int k = 0; k < ZERO_POOLS; k++) {
            struct zero_pool *p = &z->pools[set][k];
            zero_pool_reserve(p, planned_slots[set][k]);
            for (int i = 0; i < p->n_slots; i++)
                p->slots[i] = arena_alloc(dev, mem, pool_class[set], p->slot_elems * p->elem_size, 0);
        }
}

void zero_free(struct zero *z)
{
    zero_nvme_close(z);
    for (int set = 0; set < POOL_SETS; set++)
        for (int k = 0; k < ZERO_POOLS; k++) {
            free(z->pools[set][k].slots);
            free(z->pools[set][k].slot_unit);
        }
    nvme_close(z->nvme);
    free(z->nvme_segs);
    free(z->units);
    free(z->adam_ranges);
    free(z->grad_ranges);
    free(z->grad_counts);
    memset(z, 0, sizeof *z);
}

/* ---- the base identity: a hashing source --------------------------------------- */

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

static void hashing_read_q4(void *ctx, int u, int t, size_t first, size_t n, const struct quant4_range *out)
{
    struct base_hash *h = ctx; /* the values are hashed as read (zero_q4_read_shard reads them after) */
    h->inner->read_q4(h->inner->ctx, u, t, first, n, out);
}

void zero_hash_source(struct base_hash *h, const struct model *m, int u_end, const struct param_source *inner)
{
    *h = (struct base_hash){{hashing_read, hashing_read_as, h, inner && inner->read_q4 ? hashing_read_q4 : NULL},
                            inner, m, u_end, 0};
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
