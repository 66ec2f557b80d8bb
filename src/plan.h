/*
 * plan — the memory plan: the bytes of every buffer class on every memory
 * space of one rank, computed from the config, the model and the world size
 * before anything is allocated (DESIGN §2). The trainer sizes its arenas from
 * it; the `plan` command prints it; at the end of a run the measured peaks are
 * compared with it.
 *
 * Owns nothing but the numbers; the formulas live with the modules that
 * allocate (zero_plan, gpt2_plan), so a buffer and its prediction change together.
 *
 * Two targets. PLAN_TARGET_CPU is what this engine allocates on the CPU
 * backend (fp32 compute copies of half-precision units, fp32 activations, the
 * full attention matrix): the trainer allocates from it and its peaks are
 * measured against it. PLAN_TARGET_GPU is the device layout DESIGN §5 fixes
 * for the CUDA engine: activations and unit gradient buffers in the parameter
 * dtype, no compute copies or send buffers, a fused (flash) attention that
 * keeps only the softmax statistics, cuBLAS's workspace. Shapes only: Llama
 * models (no kernels yet) are planned for both targets from their shapes.
 */
#ifndef SHARDLM_PLAN_H
#define SHARDLM_PLAN_H

#include <stddef.h>

#include "arena.h"
#include "backend.h"
#include "comm.h"
#include "config.h"
#include "model.h"
#include "zero.h"

struct mem_plan {
    int world;
    size_t bytes[BUF_COUNT];
    int pool_slots[POOL_SETS][ZERO_POOLS]; /* slots of each pool (zero.h) */
    enum mem_space space[BUF_COUNT];
    size_t space_total[SPACE_COUNT];
};

enum plan_target { PLAN_TARGET_CPU = 0, PLAN_TARGET_GPU, PLAN_TARGET_CUDA };

/* cuBLAS workspace the GPU target reserves: what the CUDA backend reserves
 * (backend.h). */
#define PLAN_GPU_LIBRARY_WORKSPACE BACKEND_CUDA_LIBRARY_WORKSPACE

/* PLAN_TARGET_CUDA is what bin/shardlm-cuda allocates today, computed by the
 * trainer's own plan code as if on a GPU (device placement, activations in the
 * parameter dtype, the CUDA kernels' scratch): GPT-2 only, like that trainer.
 *
 * The device facts the plan code asks for: the backend's, except while
 * plan_compute_for plans the CUDA target from another build. */
int plan_device(void);
enum dtype plan_act_dtype(void);
size_t plan_attention_scratch(int T, int NH);
size_t plan_layernorm_scratch(int C);
size_t plan_attention_saved(int B, int T, int NH);
size_t plan_library_workspace(void);
/* The arena bytes that hold a library workspace of `bytes`, 256-byte aligned
 * (cuBLAS) inside the 64-byte-aligned arena: the trainer's and the GPU
 * target's. */
#define PLAN_LIBRARY_ALIGN 256
static inline size_t plan_library_arena_bytes(size_t bytes)
{
    return bytes ? arena_round(bytes + PLAN_LIBRARY_ALIGN - ARENA_ALIGN) : 0;
}

/* The plan of the running trainer (the CPU target's code, on its backend). */
void plan_compute(struct mem_plan *p, const struct model *m, const struct config *cfg, int world);
void plan_compute_for(struct mem_plan *p, const struct model *m, const struct config *cfg, int world,
                      enum plan_target target);
/* The engine passes of any model family (GPT-2's come from gpt2.c; untied
 * heads, Llama, use the same order without the head's use of the embedding). */
void plan_build_passes(const struct model *m, int interval, struct zero_pass *train, struct zero_pass *eval);
/* Bytes one rank sends per optimizer step with accum micro-batches (DESIGN §3,
 * the ring formulas the engine counts), per collective kind. */
void plan_traffic(const struct model *m, const struct config *cfg, int world, int accum, double bytes[COMM_KINDS]);
/* Parses a memory size: "80GB" (10^9), "80GiB" (2^30), "8e10", "1TiB", "512"
 * (bytes; suffixes B, kB/KB, MB, GB, TB, KiB, MiB, GiB, TiB, any case). Returns
 * 0 and the bytes, or -1 with a reason in why (positive and finite only). */
int plan_parse_bytes(const char *text, double *bytes, const char **why);
/* The memory space of a buffer class under this config: the optimizer state
 * (master weights, Adam m and v, fp32 gradient shard) in pinned host memory
 * with offload_optimizer (ordinary host memory with pin_memory false), kept
 * activations in pinned host memory with cpu_checkpointing, the parameter
 * shards in pinned host memory with offload_param. A device backend keeps the
 * optimizer state in pinned host memory whatever the config says, and its
 * staging buffers there too. */
enum mem_space plan_space(const struct config *cfg, enum buf_class c);
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
/* Human-readable bytes ("12.3 MiB") into buf. */
const char *plan_format_bytes(double bytes, char *buf, size_t n);

#endif
