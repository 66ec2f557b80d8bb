/*
 * zero_internal — what the ZeRO engine's files share; not for callers of zero.h.
 *
 * The engine (zero.h) is six files:
 *   zero.c        set-up: the engine's mode, each unit's sizes, shard and role
 *                 (the one place its buffers, pools and gradient path are
 *                 decided), carving the buffers out of the arenas, the initial
 *                 parameters (from a source, read as stored or through fp32;
 *                 the hashing source of the base identity), zero_free
 *   zero_pass.c   the passes: the pools of gathered units and gradient
 *                 buffers, acquire/release with the all-gathers and prefetch,
 *                 gradient buffers and their reduce-scatters, the traffic
 *                 counters, and the plan's dry run of the passes
 *   zero_optim.c  the optimizer step: its fixed AdamW and gradient-range
 *                 tables, the gradients at the accumulation boundary
 *                 (all-reduce, the host range under offload_optimizer), the
 *                 finite check and norm, AdamW on the backend or on the host,
 *                 and the all-gather of the updated slices
 *   zero_ckpt.c   the state read out and in: the checkpoint groups (master,
 *                 adam_m, adam_v), their host staging, the slices a save and
 *                 an export write, loading at any world size, and whole units
 *                 or gradients gathered into host memory
 *   zero_nvme.c   offload_param "nvme": the parameter file's layout, the
 *                 read-ahead of shards in pass order, the write-back of
 *                 trained shards after a step or a load
 *   zero_q4.c     4-bit units (a quantized base's frozen blocks): their
 *                 shard layout in whole 64-blocks, this rank's shard read,
 *                 and the gathered shards dequantized into the compute slot
 * Functions here carry the zero_ prefix, or are small static inline helpers.
 */
#ifndef SHARDLM_ZERO_INTERNAL_H
#define SHARDLM_ZERO_INTERNAL_H

#include "zero.h"

#include <stdbool.h>
#include <stddef.h>

#include "backend/arena.h"

static const enum buf_class pool_class[POOL_SETS] = {
    [POOL_GATHER] = BUF_GATHERED,
    [POOL_COMPUTE] = BUF_COMPUTE_COPIES,
    [POOL_GRAD] = BUF_GRAD_BUFFERS,
    [POOL_SEND] = BUF_GRAD_SEND,
};

static inline int kind_of(const struct model *m, int u) { return (int)m->units[u].kind; }

static inline struct zero_pool *pool(struct zero *z, enum zero_pool_set set, int u)
{
    return &z->pools[set][kind_of(z->model, u)];
}

static inline void *elem(void *base, size_t i, size_t esize) { return (char *)base + i * esize; }

/* A separate fp32 master: in memory, or in the optimizer's file (nvme). */
static inline bool has_master(const struct zero_unit *zu)
{
    return zu->role.buf[UBUF_MASTER].elems > 0 || zu->role.state_in_file;
}

/* A device with offload_optimizer "cpu" at stages 0-1: the unit's reduced
 * fp32 gradients of the optimizer range are copied into pinned host memory
 * (grad_shard) for the host's AdamW. Under "nvme" they stay on the device,
 * as without offload, and the step stages them unit by unit. */
static inline bool zero_host_grad_range(const struct zero *z, const struct unit_role *r)
{
    return z->optimizer_on_host && !r->state_in_file;
}

/* Element offset of unit u's optimizer range within this rank's whole range
 * (the units' ranges in order): where its state is in the nvme file and in a
 * staged host copy. */
static inline size_t zero_range_offset(const struct zero *z, int u)
{
    size_t at = 0;
    for (int i = 0; i < u; i++)
        at += z->units[i].opt_count;
    return at;
}

/* The parameter-dtype storage of the optimizer range. */
static inline void *opt_params(const struct zero *z, struct zero_unit *zu)
{
    return zu->role.sharded ? zu->param_shard : elem(zu->params, zu->opt_begin, z->esize);
}

/* ---- zero_pass.c ---- */

/* Makes room for n slots in pool p (the new ones free, no memory yet). */
void zero_pool_reserve(struct zero_pool *p, int n);
/* Adds to the traffic counters the bytes this rank sends in one collective. */
void zero_count_traffic(struct zero *z, enum comm_kind kind, size_t elems, size_t esize);

/* ---- zero_q4.c (4-bit units) ---- */

/* Whether unit u is stored in 4 bits: load_in_4bit, quantized here, a frozen sharded block of the base. */
bool zero_q4_unit(const struct model *m, const struct config *cfg, int u, bool sharded);
/* The 4-bit layout of unit u at world size N (parameter dtype of esize bytes). */
void zero_q4_layout(const struct model *m, const struct config *cfg, int u, int world, size_t esize,
                    struct q4_layout *q);
/* This rank's shard of 4-bit unit u from src into host_shard (shard_bytes); scratch: fp32, host memory,
 * the unit's padded elements. */
void zero_q4_read_shard(struct zero *z, const struct param_source *src, int u, float *scratch, void *host_shard);
/* The unit's values (out_dt, its elements [0, numel), the unit's layout) from its N gathered shards, in
 * backend memory (host: in host memory, on the host's cores). */
void zero_q4_expand(const struct zero *z, int u, const void *gathered, void *out, enum dtype out_dt, bool host);

/* ---- zero.c ---- */

/* Elements of the one reduce-scatter receive buffer (0: none). */
size_t zero_receive_elems(const struct zero *z);

/* ---- zero_nvme.c (offload_param "nvme") ---- */

/* Lays out the parameter file (units whose role is param_nvme), checks
 * offload_param.buffer_size against the largest shard, opens the file; nothing
 * when no unit is param_nvme. */
void zero_nvme_open(struct zero *z, const struct config *cfg, const struct exec_target *t, const char *job);
void zero_nvme_close(struct zero *z);
/* Starts the first reads of the pass just begun. */
void zero_nvme_begin_pass(struct zero *z);
/* Copies unit u's shard from the file (read ahead, or now) to dst (backend memory); reads ahead further. */
void zero_nvme_fetch(struct zero *z, int u, void *dst);
/* Unit u's shard in host memory (a buffer), valid until the next call of this file's functions. */
const void *zero_nvme_read(struct zero *z, int u);
/* A host buffer for one shard; zero_nvme_store(z, u) writes it as unit u's shard. */
void *zero_nvme_staging(struct zero *z);
void zero_nvme_store(struct zero *z, int u);
/* Writes every trained param_nvme unit's shard, narrowed from its master (after a step or a load). */
void zero_nvme_write_back(struct zero *z);

/* ---- zero_optim.c ---- */

/* Makes the optimizer step's fixed tables (after the buffers are carved). */
void zero_build_optimizer_tables(struct zero *z, const struct config *cfg);

/* ---- zero.c: offload_optimizer "nvme" ---- */

/* Elements of the device's staging of one unit's range (nvme on a device; 0: none); the pinned stage holds
 * two such ranges: the unit's new master, and its fp32 gradients fetched from the device before the update. */
size_t zero_nvme_stage_elems(const struct zero *z);

#endif
