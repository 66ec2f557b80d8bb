/*
 * zero — the ZeRO engine: where each unit's parameters, gradients and
 * optimizer state live on this rank, and the collectives that move them
 * (DESIGN §3-4).
 *
 * The model code walks a pass, a fixed list of events it declared up front
 * (struct zero_pass): acquire a unit's full parameters, release them, open a
 * full-unit gradient buffer, hand it back. The engine follows the same list to
 * prefetch: when a unit is acquired it starts the all-gathers of the next units
 * of the pass, up to stage3_prefetch_bucket_size elements ahead and
 * stage3_max_live_parameters gathered at once. A gradient handed back is
 * reduce-scattered asynchronously while the next unit's backward runs; at most
 * one reduce-scatter is in flight.
 *
 * Stages (zero_optimization.stage), for N ranks:
 *   0  full parameters, gradients, Adam state on every rank; gradients
 *      all-reduced at the accumulation boundary.
 *   1  Adam state sharded; gradients all-reduced at the boundary; each rank
 *      updates its slice; updated parameters all-gathered.
 *   2  also gradients sharded: reduce-scattered after each micro-batch's
 *      backward into the accumulated gradient shard.
 *   3  also parameters sharded: each unit all-gathered before use in forward
 *      and again in backward.
 * At stage 3 a unit of at most stage3_param_persistence_threshold elements is
 * persistent: kept whole on every rank like at stage 2. With offload_param
 * (stage 3) no unit is persistent and the shards live in the pinned host
 * arena: every unit is gathered from host shards into a gathered slot.
 *
 * Precision: parameters, gathered units and communicated gradients are in the
 * parameter dtype (a 4-bit unit's linear weights excepted: struct q4_layout); with fp16/bf16 an fp32 master of this rank's optimizer
 * range is updated by the host AdamW, which writes the new half-precision
 * parameters in the same pass. Gradients accumulate in fp32 (the reduce-
 * scatter's half-precision result is added into the fp32 shard; at stages 0-1
 * the fp32 sums are cast for the all-reduce and back). The CPU backend
 * computes in fp32, from an fp32 copy of each acquired unit; a GPU with
 * half-precision activations (backend.h [A]) computes from the unit itself.
 *
 * Each unit's part in all this is decided once, at set-up (struct
 * unit_role, zero_unit_role): whether it trains or is frozen (model.h),
 * whether it is sharded, which buffers it owns
 * (which exist, how large, in which dtype and memory class), which pools it
 * draws from and which way its gradients travel (enum grad_path). The
 * allocation, the memory plan and every step read that decision; none of
 * them re-derives it from the stage and precision.
 *
 * Gathered units and gradient buffers come from pools, one per unit kind
 * (embedding, block, head, adapters) and buffer kind (enum zero_pool_set), each with as
 * many slots as a dry run of the passes needs (zero_plan); the memory plan
 * reserves exactly those slots.
 *
 * Owns: every parameter, gradient and Adam buffer (carved from the arenas),
 * the pools, the traffic counters. Does not own activations or data.
 */
#ifndef SHARDLM_ZERO_H
#define SHARDLM_ZERO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/adamw.h"
#include "backend/backend.h"
#include "backend/arena.h"
#include "comm/comm.h"
#include "core/options.h"
#include "core/quant4.h"
#include "model/model.h"
#include "backend/target.h"

struct nvme_file;
struct nvme_segment;
struct zero_ckpt_source;

enum pass_event_kind { PASS_ACQUIRE, PASS_RELEASE, PASS_GRAD_OPEN, PASS_GRAD_DONE };

struct pass_event {
    enum pass_event_kind kind;
    int unit;
};

struct nvme_params;

struct zero_pass {
    const char *name;
    int n_events;
    struct pass_event *events;
};

#define ZERO_POOLS MODEL_UNIT_KINDS /* one per unit kind */

/* The kinds of pooled buffer; each has one pool per unit kind. */
enum zero_pool_set {
    POOL_GATHER = 0, /* gathered units, parameter dtype (stage 3 sharded units) */
    POOL_COMPUTE,    /* fp32 copies of acquired units (half precision on the CPU backend) */
    POOL_GRAD,       /* full-unit gradient buffers (stages 2-3): fp32, or the parameter dtype on a
                      * device with half-precision activations (half_grad_buffers) */
    POOL_SEND,       /* fp32 gradients cast to the parameter dtype for the reduce-scatter */
    POOL_SETS
};

/* Which way a unit's gradients travel, from the kernels to the optimizer. */
enum grad_path {
    GRAD_NONE = 0,      /* frozen (model.h): no gradient at all; the pass opens no gradient buffer for the unit,
                         * the backward computes its layers' input gradients only (backend.h) */
    GRAD_ALLREDUCE,     /* stages 0-1: whole-unit fp32 gradients accumulated in place over the micro-batches,
                         * all-reduced at the boundary (through a half-precision copy in half precision) */
    GRAD_RS_FP32,       /* stages 2-3, fp32 without a master: a pooled fp32 buffer per micro-batch; this rank's
                         * accumulated shard is added into its slice, and the reduce-scatter writes the new shard */
    GRAD_RS_CAST,       /* stages 2-3 with a master: the pooled fp32 buffer cast into a send slot (parameter dtype),
                         * reduce-scattered into the shared receive buffer, then added into the fp32 shard */
    GRAD_RS_HALF,       /* stages 2-3, half-precision gradient buffers (a device, backend.h [G]): the buffer goes to
                         * the reduce-scatter as the kernels wrote it, the result is added into the fp32 shard */
};

/* The buffers a unit owns (its pooled ones aside). */
enum unit_buf {
    UBUF_PARAMS = 0,  /* params, or param_shard when sharded: parameter dtype */
    UBUF_MASTER,      /* fp32 master of the optimizer range */
    UBUF_GRADS,       /* fp32 whole-unit gradients (GRAD_ALLREDUCE) */
    UBUF_GRADS_COMM,  /* those gradients cast for the all-reduce */
    UBUF_GRAD_SHARD,  /* fp32 gradient shard, or the host copy of the optimizer range's reduced gradients */
    UBUF_ADAM_M,
    UBUF_ADAM_V,
    UBUF_COUNT
};

struct unit_buffer {
    size_t elems;       /* 0: the unit has no such buffer */
    size_t elem_size;   /* bytes per element */
    enum buf_class cls; /* its class in the memory plan; its space is target_space() of the class */
};

/* What the engine does with one unit, decided once at set-up. A frozen unit
 * (model.h) owns its parameters and nothing else: no master, no Adam state,
 * no gradient buffer, shard or reduction, no part in the gradient norm or the
 * optimizer step; at stage 3 it is gathered like any unit (from pinned host
 * memory with offload_param): for forward, and for backward where the
 * backward needs its input gradients (family.h). */
struct unit_role {
    bool trained;            /* false: frozen */
    bool sharded;            /* stage 3 and not persistent: only this rank's shard is stored */
    bool q4;                 /* a 4-bit unit (struct q4_layout): its shard holds packed codes, block maxima and the
                              * plain part; it always takes a compute slot, which acquire dequantizes into */
    bool gather_after_step;  /* stored whole at stages 1-3: the updated slices are all-gathered after each step */
    bool param_nvme;         /* offload_param "nvme": the shard lives in the parameter file (zero_nvme.c), not
                              * in memory (UBUF_PARAMS has no elements); a sharded unit that is frozen or has a
                              * master in memory (a trained one without keeps its shard: it is the optimizer's
                              * master; so does one whose master is in offload_optimizer nvme's file, for now) */
    enum grad_path grad;
    bool pools[POOL_SETS];   /* the pooled buffers it takes (gathered unit, compute copy, gradient, send) */
    struct unit_buffer buf[UBUF_COUNT];
    bool state_in_file;      /* offload_optimizer "nvme": its master, Adam m and v are in the rank's file
                              * (zero.nvme), not in buf[] */
};

struct zero_pool {
    size_t slot_elems;  /* the largest unit of this kind (padded) */
    size_t elem_size;   /* bytes per element */
    int n_slots;        /* reserved (live run) or grown on demand (dry run) */
    int live;           /* slots in use */
    int peak;           /* most slots in use at once */
    void **slots;
    int *slot_unit;     /* unit using each slot, -1 when free */
};

/* A frozen block of a 4-bit base (quantization.load_in_4bit; zero_q4.c): its
 * linear weights stored and gathered as bitsandbytes stores them, each
 * quantized tensor sharded by whole 64-element blocks of the whole tensor;
 * the rest of the unit (norms, gaps: the "plain" part) in the parameter
 * dtype, sharded by elements. A rank's shard of shard_bytes: for each
 * quantized tensor i at byte at[i], codes (blocks[i] * 32 bytes), then
 * without double quantization the fp32 absmax (blocks[i] fp32); with it
 * bitsandbytes' nested form: qabsmax (blocks[i] bytes, padded to 4), the
 * nested_absmax of the nested blocks the rank's blocks touch (nested[i]
 * fp32 reserved: the most any rank touches) and the tensor's offset (one
 * fp32); then plain_elems elements at plain_at. Acquiring the unit
 * dequantizes the N gathered shards into its compute slot
 * (backend_dequant4). n == 0: the unit is stored in the parameter dtype. */
struct q4_layout {
    int n;                               /* quantized tensors */
    int type;                            /* enum quant4_type */
    bool double_quant;                   /* the nested form (bnb_4bit_use_double_quant) */
    int tensor[MODEL_MAX_LINEAR];        /* their indices in the unit, in unit order */
    size_t blocks[MODEL_MAX_LINEAR];     /* blocks per rank: ceil(blocks of the tensor / N) (the last rank's
                                          * may be fewer, even none; the bytes are reserved alike) */
    size_t nested[MODEL_MAX_LINEAR];     /* nested_absmax per rank (double quantization) */
    size_t at[MODEL_MAX_LINEAR];         /* byte offset of the tensor's codes in a shard */
    size_t plain_at, plain_elems;        /* the plain part's byte offset and elements per rank */
    size_t shard_bytes;                  /* one rank's shard, a multiple of 16 */
};

struct zero_unit {
    struct q4_layout q4; /* q4.n > 0: a 4-bit unit (its param_shard holds shard_bytes bytes) */
    size_t numel;       /* elements of the unit (model.c, with alignment gaps) */
    size_t padded;      /* numel rounded up to a multiple of world * MODEL_TENSOR_ALIGN */
    size_t shard;       /* padded / world */
    struct unit_role role;
    size_t opt_begin;   /* the range of the unit this rank's optimizer updates (count 0: frozen) */
    size_t opt_count;
    void *params;       /* whole unit (replicated) in the parameter dtype, or NULL when sharded */
    void *param_shard;  /* this rank's shard when sharded, parameter dtype */
    float *master;      /* fp32 master of the optimizer range (half precision; fp32 uses params) */
    float *grads;       /* fp32 whole-unit gradients accumulated over micro-batches, stages 0-1 */
    void *grads_comm;   /* half precision, stages 0-1: the gradients cast for the all-reduce */
    float *grad_shard;  /* fp32 accumulated gradient shard, stages 2-3; on a device at stages 0-1,
                         * the host copy of the reduced gradients of the optimizer range */
    void *grad_recv;    /* stages 2-3 with a master copy: the reduce-scatter's result in the parameter dtype;
                         * one buffer (the largest shard) shared by every unit, at most one is in flight */
    float *adam_m, *adam_v; /* opt_count elements */
    /* runtime state of the current pass */
    int refs;           /* acquires not yet released */
    int gather_slot;    /* POOL_GATHER slot holding the gathered unit, -1 when none */
    int compute_slot;   /* POOL_COMPUTE slot with the fp32 copy, -1 when none */
    bool gather_pending;
    struct comm_request gather_req;
    int grad_slot;      /* POOL_GRAD slot of the open (fp32 only: or reducing) gradient buffer */
    int send_slot;      /* POOL_SEND slot of the reducing gradients (half precision) */
    bool rs_pending;
    struct comm_request rs_req;
};

struct zero {
    const struct model *model;
    struct comm *comm;
    int stage, rank, world;
    bool dry;                     /* planning: no memory, no communication */
    double prefetch_elems;        /* stage3_prefetch_bucket_size */
    double max_live_elems;        /* stage3_max_live_parameters */
    enum dtype dtype;             /* parameters, gathered units, communicated gradients */
    size_t esize;                 /* bytes per parameter-dtype element */
    enum comm_dtype comm_dtype;
    bool half;                    /* dtype is fp16 or bf16 */
    bool compute_copies;          /* half, with fp32 activations (the CPU backend): acquire returns an
                                   * fp32 copy of the unit; with half activations, the unit itself */
    bool device;                  /* the backend's memory is a device: host code never touches device
                                   * memory (the optimizer state is on the device too, unless offloaded) */
    bool optimizer_on_host;       /* a device with offload_optimizer: the fp32 master, Adam state and an
                                   * fp32 gradient range in pinned host memory, AdamW on the host */
    bool half_grad_buffers;       /* a device with half-precision activations at stages 2-3: the unit
                                   * gradient buffers hold the parameter dtype (backend.h [G]) and go
                                   * to the reduce-scatter as they are (no send buffers) */
    bool params_offloaded;        /* offload_param: the parameter shards live in host memory */
    bool master_copy;             /* half precision or optimizer offload: a separate fp32 master and
                                   * fp32 gradient shard, where the optimizer state lives */
    struct zero_unit *units;
    float *ckpt_host[3];          /* zero_ckpt_stage: host copies of the groups, NULL: none */
    /* offload_optimizer "nvme" (nvme.h): the master, Adam m and v of this rank's range (every unit's
     * optimizer range in unit order, zero_range_offset) live in this file; NULL: none */
    struct nvme_file *nvme;
    struct nvme_segment *nvme_segs;  /* the step's segments, one per tensor slice (made at init) */
    int n_nvme_segs;
    float *nvme_stage;            /* a device: one unit's new fp32 master, pinned, for the device's cast */
    float *nvme_grad_stage;       /* a device: one unit's fp32 gradients, fetched from the device (pinned,
                                   * after nvme_stage in the same allocation) for the host's AdamW */
    struct zero_ckpt_source *ckpt_src[3]; /* zero_ckpt_slices of the file: where each slice's values are */
    struct adamw_range *adam_ranges; /* the step's AdamW ranges, one per tensor slice (made at init) */
    int n_adam_ranges;
    const float **grad_ranges;    /* each unit's fp32 gradient range and its length (made at init) */
    size_t *grad_counts;
    int n_grad_ranges;
    struct zero_pool pools[POOL_SETS][ZERO_POOLS];
    size_t live_gathered_elems;   /* gathered or being gathered */
    const struct zero_pass *pass;
    int cursor;
    int rs_unit;                  /* unit whose reduce-scatter is in flight, -1 none */
    struct mem_tracker *mem;
    long adam_steps;              /* optimizer steps taken (bias correction) */
    uint64_t traffic[COMM_KINDS]; /* bytes sent since zero_take_traffic */
    /* offload_param "nvme" (zero_nvme.c) */
    struct nvme_params *pfile;    /* the rank's parameter file, NULL: no unit's shard is on NVMe */
    size_t *pfile_off;            /* each unit's shard's byte offset in it */
    int *pbuf_unit;               /* the unit whose shard each of its buffers holds or reads, -1 none */
    int *psim;                    /* scratch of the read-ahead's walk, one per unit */
    long pgathers, pahead;        /* gathers from the file, and those whose shard was read (or being read) ahead */
};

/* Where the initial parameters come from: read(ctx, unit, begin, count, out)
 * writes the fp32 values of the unit's elements [begin, begin + count) (alignment
 * gaps and padding zero). NULL: model_init_range, the seeded random init. */
struct param_source {
    /* fp32 values of unit's elements [begin, begin + count), zero where the unit has no value */
    void (*read)(void *ctx, int unit, size_t begin, size_t count, float *out);
    /* The same in dtype dt when the source stores the whole unit in dt
     * (true), so that the parameters need no conversion; false, reading
     * nothing, when it does not (the same answer for every range of a unit).
     * landed(landed_ctx, k), when given, each time out's first k elements
     * are final, so the caller can work on them while the rest is read.
     * NULL: never. */
    bool (*read_as)(void *ctx, int unit, size_t begin, size_t count, enum dtype dt, void *out,
                    void (*landed)(void *landed_ctx, size_t elems), void *landed_ctx);
    void *ctx;
    /* A 4-bit unit's weights (zero_q4.c): tensor t of unit u, its elements [first, first + n) (first a
     * multiple of 64 of the tensor), as bitsandbytes stores them: the packed codes and, as out asks (its
     * absmax or its qabsmax not NULL), the fp32 absmax or the double quantization's nested form
     * (core/quant4.h struct quant4_range). NULL: the source has none. */
    void (*read_q4)(void *ctx, int unit, int tensor, size_t first, size_t n, const struct quant4_range *out);
};

/* Lays out the units and, unless dry, carves every buffer out of the arenas
 * (pool slots as planned) and initialises the parameters, from src when
 * given: each rank reads the range it stores of a sharded unit, and 1/N of a
 * unit every rank holds whole, which the ranks then all-gather (collective). */
void zero_init(struct zero *z, const struct model *m, const struct config *cfg, const struct exec_target *t,
               struct comm *comm, int rank, int world, bool dry, const int planned_slots[POOL_SETS][ZERO_POOLS], struct arena arenas[SPACE_COUNT],
               struct mem_tracker *mem, const struct param_source *src);
void zero_free(struct zero *z);
/* Reads the parameters (and masters) of the units `which` marks again from
 * src, as zero_init read them (collective where a unit is read 1/N per rank):
 * generation puts a LoRA checkpoint's adapters over the base read first. */
void zero_load_units(struct zero *z, const struct param_source *src, const bool *which);

/* The role of unit u of m under cfg on target t at world size N: what
 * zero_init decides for it (every rank decides the same). */
void zero_unit_role(const struct model *m, const struct config *cfg, const struct exec_target *t, int world, int u,
                    struct unit_role *role);
/* Bytes of one rank's shard of unit u as an all-gather moves it (a 4-bit unit's shard_bytes, else the shard
 * in the parameter dtype); 0 when the unit is not sharded. The engine's traffic counters and plan_traffic. */
size_t zero_gather_shard_bytes(const struct model *m, const struct config *cfg, const struct exec_target *t,
                               int world, int u);
/* How many times the pass gathers unit u when the unit is sharded: once per
 * acquire that finds it not held (prefetching moves a gather, never adds one). */
int zero_pass_gathers(const struct zero_pass *pass, int u);

/* Bytes of each buffer class on this rank, and the pool slots they contain,
 * from a dry run of the passes. */
void zero_plan(const struct model *m, const struct config *cfg, const struct exec_target *t, int world,
               const struct zero_pass *passes, int n_passes, size_t bytes[BUF_COUNT],
               int slots[POOL_SETS][ZERO_POOLS]);

void zero_begin_pass(struct zero *z, const struct zero_pass *pass);
/* Waits for outstanding reduce-scatters; checks the pass was walked to its end. */
void zero_end_pass(struct zero *z);

const float *zero_acquire(struct zero *z, int unit);
void zero_release(struct zero *z, int unit);
float *zero_grad_open(struct zero *z, int unit);
void zero_grad_done(struct zero *z, int unit);

/* Clears the gradients at the start of an optimizer step. */
void zero_zero_grads(struct zero *z);
/* At the accumulation boundary: makes every rank's gradients final (stages 0-1 all-reduce). */
void zero_reduce_grads(struct zero *z);
/* Whether any rank's gradients hold an inf or a NaN, and their global L2 norm
 * (all ranks agree): one pass over this rank's range, one all-reduce. */
void zero_grad_stats(struct zero *z, bool *overflow, double *norm);
/* AdamW on this rank's range; grad_scale multiplies every gradient first
 * (unscale and clip); then the updated parameters are all-gathered where the
 * stage keeps them whole. */
void zero_optimizer_step(struct zero *z, const struct optimizer_config *oc, float lr, float grad_scale);

/* Records each pool's high-water mark as its class's peak in the tracker. */
void zero_note_pool_peaks(struct zero *z);
/* Copies the full gradients of trained unit u into out (all ranks must call; after zero_reduce_grads). */
void zero_gather_grads(struct zero *z, int u, float *out);

/* Walks a whole pass without computing: every gather, reduce-scatter and
 * buffer of a real pass, none of the kernels (the plan's dry run, and the
 * "communication alone" measurement of the overlap benchmark). */
void zero_replay_pass(struct zero *z, const struct zero_pass *pass);

/* offload_param "nvme": the parameter file of a rank at world size N, as the
 * engine lays it out (zero_nvme.c) and as the planner counts it. */
struct zero_nvme_sizes {
    size_t file_bytes;    /* the file: each param_nvme unit's shard, rounded up to 4 KiB */
    size_t host_bytes;    /* the pinned buffers: buffers x the largest shard rounded up to 4 KiB (0: no file) */
    int buffers;          /* offload_param.buffer_count */
    size_t largest_shard; /* elements; offload_param.buffer_size must be at least this */
    int widest;           /* the unit with the largest shard, -1: no unit is on NVMe */
    int kept;             /* sharded non-adapter units kept in host memory (trained, no master in memory) */
};
/* off (n_units entries, or NULL): each param_nvme unit's byte offset in the file. */
void zero_nvme_layout(const struct model *m, const struct config *cfg, const struct exec_target *t, int world,
                      size_t *off, struct zero_nvme_sizes *out);
/* Bytes read from and written to the parameter file of offload_param "nvme" since set-up (0: none). */
void zero_nvme_traffic(const struct zero *z, double *read_bytes, double *written_bytes);
/* Reads and clears the bytes sent per collective kind. */
void zero_take_traffic(struct zero *z, uint64_t bytes[COMM_KINDS]);
/* Copies the full value of unit u's parameters into out, in fp32 (all ranks must call). */
void zero_gather_unit(struct zero *z, int u, float *out);
/* A checksum of the initial values of units 0 .. u_end - 1 as the source
 * gives them in fp32, before any rounding to the run's dtype (LoRA: the base
 * model's identity, the same at every world size, stage and precision): the
 * sum over elements of a hash of (unit, element, value), each rank hashing
 * what it reads. zero_hash_source makes h->src, which reads through inner
 * (NULL: the seeded init) and hashes; give it to zero_init, then
 * zero_hash_total (collective) sums the ranks' parts. */
struct base_hash {
    struct param_source src; /* the hashing source */
    const struct param_source *inner;
    const struct model *m;
    int u_end;
    uint64_t sum;
};
void zero_hash_source(struct base_hash *h, const struct model *m, int u_end, const struct param_source *inner);
uint64_t zero_hash_total(struct base_hash *h, struct comm *comm, int rank, int world);
struct ckpt_slice;
struct ckpt_reader;
/* The checkpoint groups of the optimizer state: fp32 master weights, Adam m and v. */
enum zero_ckpt_group { ZERO_CKPT_MASTER = 0, ZERO_CKPT_ADAM_M, ZERO_CKPT_ADAM_V, ZERO_CKPT_GROUPS };
extern const char *const zero_ckpt_group_names[ZERO_CKPT_GROUPS];
/* Number of tensors in the model: the length of every group's slice list. */
int zero_ckpt_n_slices(const struct zero *z);
/* This rank's slices of one group, one per tensor in model order (count 0 for
 * tensors outside its range; at stage 0, where every rank holds everything,
 * rank 0 saves all and the others nothing). Their data is host memory: where
 * the optimizer state is on a device, call zero_ckpt_stage() first, which
 * copies this rank's range of every group into a host copy (12 bytes per
 * element of the range, for the save), and zero_ckpt_unstage() after. */
void zero_ckpt_slices(struct zero *z, enum zero_ckpt_group g, struct ckpt_slice *out);
/* The master weights' slices this rank writes in an export: its range of
 * every tensor (at stage 0, 1/N of every tensor); zero_ckpt_stage first on a device. */
void zero_export_slices(struct zero *z, struct ckpt_slice *out);
void zero_ckpt_stage(struct zero *z);
void zero_ckpt_unstage(struct zero *z);
/* Reads this rank's optimizer range of every group from a checkpoint saved at
 * any world size, then rebuilds the parameters from the master weights. */
void zero_ckpt_load(struct zero *z, struct ckpt_reader *r);

/* Test hook: makes one gradient element of this rank infinite (SHARDLM_INJECT_INF_STEP). */
void zero_inject_inf(struct zero *z);

#endif
