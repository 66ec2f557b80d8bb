/*
 * plan — the memory plan: the bytes of every buffer class on every memory
 * space of one rank, computed from the config, the model and the world size
 * before anything is allocated (DESIGN §2). The trainer sizes its arenas from
 * it; the `plan` command prints it; at the end of a run the measured peaks are
 * compared with it.
 *
 * Owns nothing but the numbers; the formulas live with the modules that
 * allocate (zero_plan, family_plan), so a buffer and its prediction change
 * together, and they take the execution target (target.h) they plan for.
 *
 * Targets. PLAN_TARGET_CPU is what this engine allocates on the backend it
 * runs (on the CPU: fp32 compute copies of half-precision units, fp32
 * activations, the full attention matrix): the trainer allocates from it and
 * its peaks are measured against it. PLAN_TARGET_GPU is what the CUDA engine
 * allocates (DESIGN §5): activations and unit gradient buffers in the
 * parameter dtype, no compute copies or send buffers, a fused attention that
 * keeps only each row's log-sum-exp, cuBLAS's workspace. PLAN_TARGET_CUDA is
 * the same, honouring bin/shardlm-cuda's SHARDLM_FP32_ACTIVATIONS=1.
 */
#ifndef SHARDLM_PLAN_H
#define SHARDLM_PLAN_H

#include <stddef.h>

#include "backend/arena.h"
#include "backend/backend.h"
#include "comm/comm.h"
#include "core/options.h"
#include "model/model.h"
#include "backend/target.h"
#include "zero/zero.h"

/* Offload to NVMe (issue 36): each rank's files and the pinned host buffers
 * that stream them. The classes a file holds (master weights, Adam m and v;
 * the parameter shard) have no bytes in their arenas then (bytes[] 0). */
struct plan_nvme {
    size_t opt_elems, opt_piece;      /* the optimizer file's elements (the rank's optimizer ranges) and piece
                                       * (nvme_sizes) */
    size_t opt_file, opt_buffers;     /* its bytes on disk and its buffers' pinned bytes (0: not on NVMe) */
    size_t param_file, param_buffers; /* the parameter file (the shards of the sharded units that are frozen or
                                       * have a master, each from an NVME_BLOCK boundary) and its buffers,
                                       * param_buffer_count x param_unit (0: not on NVMe) */
    size_t param_unit;                /* the largest unit's shard in the file: one buffer */
    size_t param_unit_elems;          /* its elements (offload_param.buffer_size must hold them) */
    double opt_read, opt_written;     /* bytes per optimizer step: the whole file each way, and reads
                                       * the masters of trained shards in the parameter file again */
    double param_read, param_written; /* every gather of the train pass reads its unit's shard, each
                                       * micro-batch (at most: a shard still in a buffer is not read again);
                                       * the trained units' shards are written once a step */
};

struct mem_plan {
    int world;
    struct plan_nvme nvme;
    size_t bytes[BUF_COUNT];
    int pool_slots[POOL_SETS][ZERO_POOLS]; /* slots of each pool (zero.h) */
    enum mem_space space[BUF_COUNT];
    size_t space_total[SPACE_COUNT];
};

enum plan_target { PLAN_TARGET_CPU = 0, PLAN_TARGET_GPU, PLAN_TARGET_CUDA };

/* The plan of the running trainer (PLAN_TARGET_CPU). */
void plan_compute(struct mem_plan *p, const struct model *m, const struct config *cfg, int world);
void plan_compute_for(struct mem_plan *p, const struct model *m, const struct config *cfg, int world,
                      enum plan_target target);
/* Bytes one rank sends per optimizer step with accum micro-batches (DESIGN §3,
 * the ring formulas the engine counts), per collective kind. */
/* Generation's buffers on the running backend: forwards of at most B rows
 * of T tokens (positions given) and a key/value cache of Tmax positions per
 * row (family_kv_plan), the rotary tables covering Tmax. */
void plan_compute_generate(struct mem_plan *p, const struct model *m, const struct config *cfg, int world, int B,
                           int T, int Tmax);
void plan_traffic(const struct model *m, const struct config *cfg, int world, int accum, double bytes[COMM_KINDS]);
/* Host bytes of one rank: the pinned and ordinary arenas and the NVMe buffers. */
size_t plan_host_bytes(const struct mem_plan *p);
/* Parses a memory size: "80GB" (10^9), "80GiB" (2^30), "8e10", "1TiB", "512"
 * (bytes; suffixes B, kB/KB, MB, GB, TB, KiB, MiB, GiB, TiB, any case). Returns
 * 0 and the bytes, or -1 with a reason in why (positive and finite only). */
int plan_parse_bytes(const char *text, double *bytes, const char **why);
/* The activation checkpointing interval in effect (0: off). */
int plan_ckpt_interval(const struct config *cfg);
/* Prints the table; with a tracker, also the measured peak per class. The peak
 * of a pooled class (gathered units, gradient buffers) is the sum of its
 * pools' high-water marks: the memory those pools need. */
void plan_print(const struct mem_plan *p, const struct mem_tracker *t, const char *title);
/* On a backend that can tell its free device memory (CUDA): at start, logs
 * the plan's device total against it and stops with exit status 2 and the
 * largest items when it does not fit, before anything is allocated; at the
 * end, logs the memory in use. Nothing on the CPU. */
void plan_check_device(const struct mem_plan *p, int at_start);

#endif
