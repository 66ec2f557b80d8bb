/*
 * zero_nvme — parameter shards on NVMe (offload_param "device": "nvme",
 * stage 3; see zero.h, zero_internal.h, nvme.h). Each unit whose role says
 * param_nvme keeps its shard in the rank's parameter file instead of pinned
 * host memory (zero_unit_role: every sharded unit that is frozen or has an
 * fp32 master in memory; a trained unit without one keeps its shard in
 * memory, where it is the optimizer's master; one whose master is in
 * offload_optimizer nvme's file is narrowed from there).
 *
 * Reading ahead: the file's buffers cache unit shards. After each gather
 * (and at the start of a pass) the engine walks the declared pass from its
 * cursor, following exactly the rule that decides a gather (an acquire that
 * finds the unit neither held nor prefetched, zero_pass.c), and starts the
 * reads of the next such units into the buffers whose units are not among
 * them: the read of unit k+1 runs while unit k is gathered and used. A
 * gather copies its unit's shard out of its buffer (waiting for the read if
 * it is still running, reading it at once if it was not read ahead) into its
 * slot of the gathered unit; the buffer is free again.
 *
 * Writing: a frozen shard is written once, at set-up (from the source or the
 * seeded init, staged through a buffer). A trained unit's new shard is
 * written after each optimizer step and after a checkpoint's load: its fp32
 * master narrowed into a buffer, the write started while the next unit is
 * narrowed (zero_nvme_write_back). Writing drops the cached shards.
 */
#include "zero_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/util.h"
#include "nvme.h"

/* Bytes a shard of `shard` elements takes in the file and in a buffer. */
static size_t span_of(size_t shard, size_t esize) { return round_up(shard * esize, NVME_BLOCK); }

static size_t file_span(const struct zero *z, const struct zero_unit *zu) { return span_of(zu->shard, z->esize); }

void zero_nvme_layout(const struct model *m, const struct config *cfg, const struct exec_target *t, int world,
                      size_t *off, struct zero_nvme_sizes *out)
{
    memset(out, 0, sizeof *out);
    out->widest = -1;
    if (!cfg->zero.offload_param_nvme)
        return;
    const size_t esize = (size_t)dtype_size(cfg->dtype);
    for (int u = 0; u < m->n_units; u++) {
        struct unit_role role;
        zero_unit_role(m, cfg, t, world, u, &role);
        /* LoRA's adapters are meant to stay: small, and trained */
        out->kept += role.sharded && !role.param_nvme && m->units[u].kind != UNIT_ADAPTER;
        if (!role.param_nvme)
            continue;
        const size_t shard = round_up(m->units[u].numel, (size_t)world * MODEL_TENSOR_ALIGN) / (size_t)world;
        if (off)
            off[u] = out->file_bytes;
        out->file_bytes += span_of(shard, esize);
        if (shard > out->largest_shard) {
            out->largest_shard = shard;
            out->widest = u;
        }
    }
    out->buffers = cfg->zero.param_buffer_count > 0 ? cfg->zero.param_buffer_count : 1;
    out->host_bytes = out->widest < 0 ? 0 : (size_t)out->buffers * span_of(out->largest_shard, esize);
}

void zero_nvme_open(struct zero *z, const struct config *cfg, const struct exec_target *t, const char *job)
{
    const struct model *m = z->model;
    if (!cfg->zero.offload_param_nvme)
        return;
    z->pfile_off = xcalloc((size_t)m->n_units, sizeof *z->pfile_off);
    struct zero_nvme_sizes sz;
    zero_nvme_layout(m, cfg, t, z->world, z->pfile_off, &sz);
    for (int u = 0; u < m->n_units; u++)
        if (z->units[u].role.param_nvme && z->pfile_off[u] + file_span(z, &z->units[u]) > sz.file_bytes)
            fail_internal("offload_param nvme: the layout and the engine's roles differ at unit %d", u);
    const size_t file_bytes = sz.file_bytes, largest = sz.largest_shard;
    const int widest = sz.widest, in_memory = sz.kept, buffers = sz.buffers;
    if (in_memory && z->rank == 0)
        log_warn("offload_param nvme: %d trained units keep their shards in host memory (fp32 without "
                 "offload_optimizer: the shard is the optimizer's master); set offload_optimizer.device \"cpu\" or "
                 "\"nvme\", or bf16, to put them in nvme_path too", in_memory);
    if (widest < 0) {
        struct nvme_dir_info info;
        nvme_check_dir(cfg->zero.param_nvme_path, 0.0, &info);
        return;
    }
    if ((double)largest > cfg->zero.param_buffer_size)
        fail_input("config: zero_optimization.offload_param.buffer_size %.0f is smaller than the shard of unit '%s' "
                   "(%zu elements at %d ranks); set buffer_size to at least %zu",
                   cfg->zero.param_buffer_size, m->units[widest].name, largest, z->world, largest);
    z->pfile = nvme_params_open(cfg->zero.param_nvme_path, job, z->rank, file_bytes, sz.host_bytes / (size_t)buffers,
                                buffers);
    z->pbuf_unit = xcalloc((size_t)buffers, sizeof *z->pbuf_unit);
    for (int b = 0; b < buffers; b++)
        z->pbuf_unit[b] = -1;
    z->psim = xcalloc((size_t)m->n_units, sizeof *z->psim);
    if (z->rank == 0)
        log_info("offload_param nvme: '%s' (%zu bytes, %s), %d buffers of %zu bytes", nvme_params_path(z->pfile),
                 file_bytes, nvme_params_direct(z->pfile) ? "O_DIRECT" : "buffered", buffers,
                 nvme_params_host_bytes(z->pfile) / (size_t)buffers);
}

void zero_nvme_close(struct zero *z)
{
    if (z->pfile && z->rank == 0) {
        double rd, wr;
        nvme_params_traffic(z->pfile, &rd, &wr);
        log_info("offload_param nvme: %.2f MiB read, %.2f MiB written; %ld of %ld gathers found their shard read "
                 "ahead", rd / 1048576.0, wr / 1048576.0, z->pahead, z->pgathers);
    }
    nvme_params_close(z->pfile);
    free(z->pfile_off);
    free(z->pbuf_unit);
    free(z->psim);
    z->pfile = NULL;
    z->pfile_off = NULL;
    z->pbuf_unit = NULL;
    z->psim = NULL;
}

/* ---- the cache of shards and the read-ahead ------------------------------------ */

static int buffer_of(const struct zero *z, int u)
{
    for (int b = 0; b < nvme_params_buffers(z->pfile); b++)
        if (z->pbuf_unit[b] == u)
            return b;
    return -1;
}

/* The units the pass gathers next from the file, from its cursor on, in
 * order and each once, at most `max` of them (into out); their number. A
 * unit is gathered by an acquire that finds it neither held nor gathered
 * ahead (zero_acquire); it is let go when its last hold is released. */
static int next_gathers(struct zero *z, int *out, int max)
{
    const struct zero_pass *pass = z->pass;
    int n = 0;
    if (!pass)
        return 0;
    /* psim[u]: the unit's simulated holds, -1 when it is not gathered; a unit gathered ahead holds 0 */
    for (int u = 0; u < z->model->n_units; u++)
        z->psim[u] = z->units[u].gather_slot >= 0 ? z->units[u].refs : -1;
    for (int e = z->cursor; e < pass->n_events && n < max; e++) {
        const struct pass_event *ev = &pass->events[e];
        const int u = ev->unit;
        if (!z->units[u].role.param_nvme)
            continue;
        if (ev->kind == PASS_ACQUIRE) {
            if (z->psim[u] < 0) {
                bool seen = false;
                for (int i = 0; i < n; i++)
                    seen = seen || out[i] == u;
                if (!seen)
                    out[n++] = u;
                z->psim[u] = 0;
            }
            z->psim[u]++;
        } else if (ev->kind == PASS_RELEASE && z->psim[u] > 0 && --z->psim[u] == 0) {
            z->psim[u] = -1;
        }
    }
    return n;
}

static void start_read(struct zero *z, int b, int u)
{
    nvme_params_wait(z->pfile, b);
    z->pbuf_unit[b] = u;
    nvme_params_start(z->pfile, b, z->pfile_off[u], file_span(z, &z->units[u]), false);
}

/* Starts the reads of the units the pass gathers next that no buffer holds,
 * into the buffers holding none of them. */
static void read_ahead(struct zero *z)
{
    const int nb = nvme_params_buffers(z->pfile);
    int want[64];
    const int n = next_gathers(z, want, nb < 64 ? nb : 64);
    for (int i = 0; i < n; i++) {
        if (buffer_of(z, want[i]) >= 0)
            continue;
        for (int b = 0; b < nb; b++) {
            bool wanted = false;
            for (int j = 0; j < n; j++)
                wanted = wanted || z->pbuf_unit[b] == want[j];
            if (!wanted) {
                start_read(z, b, want[i]);
                break;
            }
        }
    }
}

/* The buffer holding unit u's shard, read now when no read-ahead did (into
 * the buffer whose unit the pass needs last, or none). */
static int hold(struct zero *z, int u)
{
    int b = buffer_of(z, u);
    z->pahead += b >= 0;
    if (b < 0) {
        const int nb = nvme_params_buffers(z->pfile);
        int want[64];
        const int n = next_gathers(z, want, nb < 64 ? nb : 64);
        int rank_of_best = -1;
        for (int c = 0; c < nb && rank_of_best < n; c++) {
            int r = 0; /* how soon the pass needs buffer c's unit: n when never */
            while (r < n && want[r] != z->pbuf_unit[c])
                r++;
            if (r > rank_of_best) {
                rank_of_best = r;
                b = c;
            }
        }
        start_read(z, b, u);
    }
    nvme_params_wait(z->pfile, b);
    return b;
}

void zero_nvme_fetch(struct zero *z, int u, void *dst)
{
    z->pgathers++;
    const int b = hold(z, u);
    backend_copy(dst, nvme_params_buffer(z->pfile, b), z->units[u].shard * z->esize);
    z->pbuf_unit[b] = -1;
    read_ahead(z);
}

void zero_nvme_begin_pass(struct zero *z)
{
    if (z->pfile)
        read_ahead(z);
}

const void *zero_nvme_read(struct zero *z, int u)
{
    const int b = hold(z, u);
    return nvme_params_buffer(z->pfile, b);
}

/* ---- writing ----------------------------------------------------------------- */

/* Waits for every buffer and forgets the shards they hold (the file changes). */
static void drop_cache(struct zero *z)
{
    for (int b = 0; b < nvme_params_buffers(z->pfile); b++) {
        nvme_params_wait(z->pfile, b);
        z->pbuf_unit[b] = -1;
    }
}

void *zero_nvme_staging(struct zero *z)
{
    drop_cache(z);
    return nvme_params_buffer(z->pfile, 0);
}

void zero_nvme_store(struct zero *z, int u)
{
    nvme_params_start(z->pfile, 0, z->pfile_off[u], file_span(z, &z->units[u]), true);
    nvme_params_wait(z->pfile, 0);
}

/* The parameter dtype of count fp32 values at src (host or backend memory) into host memory at dst. A master
 * in device memory comes over in chunks through a bounce on the stack (fp32: straight into dst): no scratch on
 * the heap, nothing the plan would have to count. */
static void narrow_to_host(struct zero *z, void *dst, const float *src, size_t count)
{
    if (!z->device || z->optimizer_on_host) {
        dtype_convert(dst, z->dtype, src, DTYPE_F32, count);
        return;
    }
    if (z->dtype == DTYPE_F32) {
        backend_copy(dst, src, count * sizeof *src);
        return;
    }
    enum { CHUNK = 1 << 14 };
    float tmp[CHUNK];
    for (size_t at = 0; at < count; at += CHUNK) {
        const size_t n = count - at < CHUNK ? count - at : CHUNK;
        backend_copy(tmp, src + at, n * sizeof *tmp);
        dtype_convert(elem(dst, at, z->esize), z->dtype, tmp, DTYPE_F32, n);
    }
}

void zero_nvme_write_back(struct zero *z)
{
    if (!z->pfile)
        return;
    drop_cache(z);
    backend_synchronize(); /* the master may have been written by the device */
    const int nb = nvme_params_buffers(z->pfile);
    int k = 0;
    for (int u = 0; u < z->model->n_units; u++) {
        struct zero_unit *zu = &z->units[u];
        if (!zu->role.param_nvme || !has_master(zu))
            continue;
        const int b = k++ % nb;
        nvme_params_wait(z->pfile, b);
        if (zu->role.state_in_file) /* the new master, from offload_optimizer nvme's file */
            nvme_read_master_as(z->nvme, zero_range_offset(z, u), zu->opt_count, nvme_params_buffer(z->pfile, b),
                                z->dtype);
        else
            narrow_to_host(z, nvme_params_buffer(z->pfile, b), zu->master, zu->opt_count);
        nvme_params_start(z->pfile, b, z->pfile_off[u], file_span(z, zu), true);
    }
    drop_cache(z);
}

void zero_nvme_traffic(const struct zero *z, double *read_bytes, double *written_bytes)
{
    *read_bytes = *written_bytes = 0.0;
    if (z->pfile)
        nvme_params_traffic(z->pfile, read_bytes, written_bytes);
}
