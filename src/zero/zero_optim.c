/*
 * zero_optim — the optimizer step (see zero.h, zero_internal.h): the fixed
 * tables made at set-up (one AdamW range per tensor slice of this rank's
 * optimizer range, and the gradient ranges the norm sums); clearing the
 * gradients; making them final at the accumulation boundary (the stages 0-1
 * all-reduce, in half precision through a cast copy; under offload_optimizer
 * the host copy of the optimizer range); the finite check and global norm;
 * AdamW, fused on the backend where the state is in its memory, or on the
 * host over pinned memory with the device casting the new parameters; and the
 * all-gather of the updated slices where a stage keeps parameters whole.
 */
#include "zero_internal.h"

#include <math.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/util.h"
#include "zero/nvme.h"

/* ---- the optimizer step ------------------------------------------------------ */

/* The fp32 gradients of the optimizer range: the shard (stages 2-3, and the
 * host copy of the range at stages 0-1 on a device), else the range of the
 * whole-unit gradients. */
static float *opt_grads(struct zero_unit *zu) { return zu->grad_shard ? zu->grad_shard : zu->grads + zu->opt_begin; }

/* The step's fixed tables, made once: one AdamW range per tensor slice of
 * this rank's optimizer range (alignment gaps and padding stay zero), and the
 * gradient ranges whose squares the finite check and the norm sum. */
void zero_build_optimizer_tables(struct zero *z, const struct config *cfg)
{
    const int units = z->model->n_units;
    int n = 0;
    for (int u = 0; u < units; u++)
        n += z->model->units[u].n_tensors;
    z->adam_ranges = xcalloc((size_t)n, sizeof *z->adam_ranges);
    z->grad_ranges = xcalloc((size_t)units, sizeof *z->grad_ranges);
    z->nvme_segs = z->nvme ? xcalloc((size_t)n, sizeof *z->nvme_segs) : NULL;
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
            if (zu->role.state_in_file) { /* the state is in the file, at the unit's place in the range */
                z->nvme_segs[z->n_nvme_segs++] = (struct nvme_segment){
                    .at = zero_range_offset(z, u) + off,
                    .n = hi - lo,
                    .grad = g + off,
                    .weight_decay = td->decay ? cfg->optimizer.weight_decay : 0.0f,
                    .param_out = z->device || !p ? NULL : elem(p, off, z->esize), /* !p: param_nvme */
                };
                continue;
            }
            z->adam_ranges[n++] = (struct adamw_range){
                .param = master + off,
                .m = zu->adam_m + off,
                .v = zu->adam_v + off,
                .grad = g + off,
                .param_out = has_master(zu) && !z->optimizer_on_host && p ? elem(p, off, z->esize) : NULL,
                .n = hi - lo,
                .weight_decay = td->decay ? cfg->optimizer.weight_decay : 0.0f,
            };
        }
    }
    z->n_adam_ranges = n;
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
        zero_count_traffic(z, COMM_ALLREDUCE, zu->padded, z->esize);
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
        if (zero_host_grad_range(z, &zu->role) && zu->grads_comm)
            backend_convert(zu->grad_shard, DTYPE_F32, elem(zu->grads_comm, zu->opt_begin, z->esize), z->dtype,
                            zu->opt_count);
        else if (zero_host_grad_range(z, &zu->role))
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

/* AdamW over the state in the file (offload_optimizer "nvme"): the segments
 * streamed through its buffers. The host's new parameters are written in
 * their dtype in the same pass, as the backend's fused AdamW writes them; a
 * device's, unit by unit, from the unit's new master staged in pinned memory,
 * cast by the device as under offload "cpu". */
static void nvme_step(struct zero *z, const struct adamw_hparams *hp)
{
    if (!z->device) {
        nvme_adamw_step(z->nvme, z->nvme_segs, z->n_nvme_segs, hp, z->dtype);
        return;
    }
    int s = 0;
    for (int u = 0; u < z->model->n_units; u++) {
        struct zero_unit *zu = &z->units[u];
        if (!zu->role.state_in_file)
            continue;
        const size_t lo = zero_range_offset(z, u), hi = lo + zu->opt_count;
        const int first = s;
        /* the gradients stay on the device (as without offload): the unit's range into the pinned stage */
        backend_copy(z->nvme_grad_stage, opt_grads(zu), zu->opt_count * sizeof(float));
        for (; s < z->n_nvme_segs && z->nvme_segs[s].at < hi; s++) {
            z->nvme_segs[s].param_out = z->nvme_stage + (z->nvme_segs[s].at - lo);
            z->nvme_segs[s].grad = z->nvme_grad_stage + (z->nvme_segs[s].at - lo);
        }
        nvme_adamw_step(z->nvme, z->nvme_segs + first, s - first, hp, DTYPE_F32);
        /* the updated slices only: gaps and frozen tensors keep their values, as a cast of the whole master gives
         * (a shard in the parameter file: zero_nvme_write_back) */
        for (int k = first; k < s && !zu->role.param_nvme; k++) {
            const struct nvme_segment *sg = &z->nvme_segs[k];
            backend_convert(elem(opt_params(z, zu), sg->at - lo, z->esize), z->dtype, sg->param_out, DTYPE_F32,
                            sg->n);
        }
        backend_synchronize(); /* the stage is the next unit's */
    }
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
    if (z->nvme) {
        nvme_step(z, &hp);
    } else if (!z->optimizer_on_host) {
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
            if (has_master(zu) && !zu->role.param_nvme)
                backend_convert(opt_params(z, zu), z->dtype, zu->master, DTYPE_F32, zu->opt_count);
        }
    }
    zero_nvme_write_back(z); /* offload_param "nvme": the new shards into the parameter file */
    /* Where a stage keeps parameters whole, every rank takes the others' updated slices. */
    for (int u = 0; u < z->model->n_units; u++) {
        struct zero_unit *zu = &z->units[u];
        if (!zu->role.gather_after_step)
            continue;
        zero_count_traffic(z, COMM_ALLGATHER, zu->shard, z->esize);
        comm_allgather(z->comm, opt_params(z, zu), zu->params, zu->shard, z->comm_dtype, &zu->gather_req);
    }
    for (int u = 0; u < z->model->n_units; u++)
        if (z->units[u].role.gather_after_step)
            comm_wait(z->comm, &z->units[u].gather_req);
}
