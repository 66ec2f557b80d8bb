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

#include "backend/backend.h"
#include "io/ckpt.h"
#include "core/dtype.h"
#include "core/util.h"

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
        if (has_master(zu) && !zu->role.param_nvme)
            backend_convert(opt_params(z, zu), z->dtype, zu->master, DTYPE_F32, zu->opt_count);
        if (zu->role.gather_after_step)
            comm_allgather(z->comm, opt_params(z, zu), zu->params, zu->shard, z->comm_dtype, NULL);
    }
    zero_nvme_write_back(z); /* offload_param "nvme": the shards into the parameter file */
}
