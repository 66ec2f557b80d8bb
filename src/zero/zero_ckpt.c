/*
 * zero_ckpt — the engine's state read out and in (see zero.h,
 * zero_internal.h): the checkpoint groups of the optimizer state (fp32
 * master, Adam m and v), staged through host copies where that state is
 * device memory; the slices of this rank's range a save writes and those an
 * export writes; loading this rank's range from a checkpoint saved at any
 * world size, then rebuilding the parameters from the master; and whole
 * units' parameters or gradients gathered into host memory (dumps).
 */
#include "zero_internal.h"

#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "io/ckpt.h"
#include "core/dtype.h"
#include "core/util.h"
#include "zero/nvme.h"

/* ---- whole units in host memory ------------------------------------------------ */

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
    if (zu->role.q4) { /* the 4-bit shards side by side, dequantized on the host */
        void *shards = xcalloc((size_t)z->world, zu->q4.shard_bytes);
        gather_to_host(z, zu->param_shard, zu->q4.shard_bytes / sizeof(float), sizeof(float), COMM_F32, shards);
        void *values = xcalloc(zu->padded, z->esize); /* the values the kernels see, in the parameter dtype */
        zero_q4_expand(z, u, shards, values, z->dtype, true);
        dtype_convert(out, DTYPE_F32, values, z->dtype, zu->padded);
        free(values);
        free(shards);
        return;
    }
    void *full = z->half ? xcalloc(zu->padded, z->esize) : out;
    if (zu->role.sharded)
        gather_to_host(z, zu->role.param_nvme ? zero_nvme_read(z, u) : zu->param_shard, zu->shard, z->esize,
                       z->comm_dtype, full);
    else
        backend_copy(full, zu->params, zu->padded * z->esize);
    if (z->half) {
        dtype_convert(out, DTYPE_F32, full, z->dtype, zu->padded);
        free(full);
    }
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

static size_t range_offset(const struct zero *z, int u) { return zero_range_offset(z, u); }

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
        free(z->ckpt_src[g]);
        z->ckpt_src[g] = NULL;
    }
}

/* ---- the state in the file (offload_optimizer "nvme") ---------------------- */

/* Where a slice's values are in the file: its group and first element. */
struct zero_ckpt_source {
    struct nvme_file *f;
    enum zero_ckpt_group g;
    size_t at;
};

/* ckpt_slice.read: a part of one group, read from the file a piece at a time. */
static void read_from_file(const void *src, size_t from, size_t n, float *out)
{
    const struct zero_ckpt_source *s = src;
    float *part[ZERO_CKPT_GROUPS] = {NULL, NULL, NULL};
    part[s->g] = out;
    nvme_read_range(s->f, s->at + from, n, part[ZERO_CKPT_MASTER], part[ZERO_CKPT_ADAM_M], part[ZERO_CKPT_ADAM_V]);
}

/* Reads a slice's range of group g from a checkpoint into the file, a piece
 * at a time through buf (CKPT_READ_ELEMS), and the master's also into the
 * parameters in their dtype (the parameters are rebuilt from the master). */
static void load_into_file(struct zero *z, struct ckpt_reader *r, enum zero_ckpt_group g, int u,
                           const struct ckpt_slice *sl, size_t at, float *buf)
{
    struct zero_unit *zu = &z->units[u];
    for (size_t from = 0; from < sl->count; from += CKPT_READ_ELEMS) {
        const size_t n = sl->count - from < CKPT_READ_ELEMS ? sl->count - from : CKPT_READ_ELEMS;
        ckpt_read(r, zero_ckpt_group_names[g], sl->name, sl->ndim, sl->shape, sl->begin + from, n, buf);
        float *part[ZERO_CKPT_GROUPS] = {NULL, NULL, NULL};
        part[g] = buf;
        nvme_write_range(z->nvme, range_offset(z, u) + at + from, n, part[ZERO_CKPT_MASTER], part[ZERO_CKPT_ADAM_M],
                         part[ZERO_CKPT_ADAM_V]);
        if (g == ZERO_CKPT_MASTER && !zu->role.param_nvme) /* param_nvme: zero_nvme_write_back */
            backend_convert(elem(opt_params(z, zu), at + from, z->esize), z->dtype, buf, DTYPE_F32, n);
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
    free(z->ckpt_src[g]);
    z->ckpt_src[g] = z->nvme ? xcalloc((size_t)zero_ckpt_n_slices(z) + 1, sizeof *z->ckpt_src[g]) : NULL;
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
            if (zu->role.state_in_file) { /* read from the file as the writer goes (no copy in memory) */
                z->ckpt_src[g][i] = (struct zero_ckpt_source){z->nvme, g, range_offset(z, u) + at};
                *sl = (struct ckpt_slice){sl->name, sl->ndim, {sl->shape[0], sl->shape[1]}, sl->begin, sl->count,
                                          NULL, read_from_file, &z->ckpt_src[g][i]};
                continue;
            }
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
    /* the file's pieces pass through here; on a device, through the pinned stage the device casts from */
    float *buf = !z->nvme ? NULL : z->nvme_stage ? z->nvme_stage : xmalloc(CKPT_READ_ELEMS * sizeof *buf);
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
                if (zu->role.state_in_file)
                    load_into_file(z, r, g, u, sl, at, buf);
                else
                    ckpt_read_slice(r, zero_ckpt_group_names[g], sl, group_base(z, zu, g) + at);
            }
        }
    }
    free(slices);
    if (buf != z->nvme_stage)
        free(buf);
    if (z->ckpt_host[0]) {
        copy_groups(z, false);
        zero_ckpt_unstage(z);
    }
    /* The parameters in their dtype from the master, then whole where the stage keeps them whole. */
    for (int u = 0; u < z->model->n_units; u++) {
        struct zero_unit *zu = &z->units[u];
        /* from the file: as it was read (load_into_file); into the parameter file: zero_nvme_write_back */
        if (has_master(zu) && !zu->role.state_in_file && !zu->role.param_nvme)
            backend_convert(opt_params(z, zu), z->dtype, zu->master, DTYPE_F32, zu->opt_count);
        if (zu->role.gather_after_step)
            comm_allgather(z->comm, opt_params(z, zu), zu->params, zu->shard, z->comm_dtype, NULL);
    }
    zero_nvme_write_back(z); /* offload_param "nvme": the shards into the parameter file */
}
