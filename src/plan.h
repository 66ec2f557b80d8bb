/*
 * plan — the memory plan: the bytes of every buffer class on every memory
 * space of one rank, computed from the config, the model and the world size
 * before anything is allocated (DESIGN §2). The trainer sizes its arenas from
 * it; the `plan` command prints it; at the end of a run the measured peaks are
 * compared with it.
 *
 * Owns nothing but the numbers; the formulas live with the modules that
 * allocate (zero_plan, gpt2_plan), so a buffer and its prediction change together.
 */
#ifndef SHARDLM_PLAN_H
#define SHARDLM_PLAN_H

#include <stddef.h>

#include "arena.h"
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

void plan_compute(struct mem_plan *p, const struct model *m, const struct config *cfg, int world);
/* The memory space of a buffer class under this config: the optimizer state
 * (master weights, Adam m and v, fp32 gradient shard) in pinned host memory
 * with offload_optimizer (ordinary host memory with pin_memory false), kept
 * activations in pinned host memory with cpu_checkpointing. A device backend
 * keeps the optimizer state in pinned host memory whatever the config says,
 * and its staging buffers there too. */
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
