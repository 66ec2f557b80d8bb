/*
 * target — where the kernels of a run execute, as the memory plan and the
 * engine need to know it: device or host memory, the activation dtype ([A]
 * in backend.h), and what attention keeps and needs as scratch.
 *
 * Two kinds. target_running() is the backend linked into this binary, as it
 * is configured now (backend_act_dtype): the trainer allocates from it.
 * target_cuda() is the CUDA backend's layout computed from any build, so that
 * `shardlm plan --target gpu` on a laptop gives what bin/shardlm-cuda will
 * allocate. Every function that sizes or places a buffer takes the target it
 * plans for; none reads a global.
 */
#ifndef SHARDLM_TARGET_H
#define SHARDLM_TARGET_H

#include <stdbool.h>
#include <stddef.h>

#include "arena.h"
#include "core/options.h"

struct exec_target {
    bool as_cuda;     /* the CUDA backend's facts, whatever this binary links */
    bool device;      /* kernels work on device memory (host code stages through pinned memory) */
    enum dtype act;   /* the activation dtype ([A]) */
};

struct exec_target target_running(void);
struct exec_target target_cuda(enum dtype act);

/* Bytes attention keeps per block between forward and backward, and its scratch in floats. */
size_t target_attention_saved(const struct exec_target *t, int B, int T, int NH);
size_t target_attention_scratch(const struct exec_target *t, int T, int NH);
/* Floats of scratch a norm's backward needs (layernorm and RMSNorm alike). */
size_t target_norm_scratch(const struct exec_target *t, int C);
/* The math library's workspace in bytes (cuBLAS: 32 MiB; the CPU: none). */
size_t target_library_workspace(const struct exec_target *t);
/* The arena bytes that hold a library workspace of `bytes`, 256-byte aligned
 * (cuBLAS) inside the 64-byte-aligned arena. */
#define TARGET_LIBRARY_ALIGN 256
static inline size_t target_library_arena_bytes(size_t bytes)
{
    return bytes ? arena_round(bytes + TARGET_LIBRARY_ALIGN - ARENA_ALIGN) : 0;
}
/* Bytes of n elements of the target's activation dtype, rounded as the arena rounds. */
size_t target_act_bytes(const struct exec_target *t, size_t n);

/* The memory space of a buffer class under this config on this target: the
 * optimizer state (master weights, Adam m and v, fp32 gradient shard) in
 * pinned host memory with offload_optimizer (ordinary host memory with
 * pin_memory false), kept activations in pinned host memory with
 * cpu_checkpointing, the parameter shards in pinned host memory with
 * offload_param. A device keeps offloaded state in pinned (mapped) memory
 * whatever the config says, as its kernels read and write it, and its
 * staging buffers there too. */
enum mem_space target_space(const struct exec_target *t, const struct config *cfg, enum buf_class c);

#endif
