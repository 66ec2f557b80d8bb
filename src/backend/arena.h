/*
 * arena — the only allocator of large buffers (DESIGN §2).
 *
 * One arena per memory space, sized from the memory plan and allocated once
 * before step 1. Buffers are carved out of it at start-up, each tagged with its
 * buffer class; nothing is allocated inside the step loop. Buffers whose use
 * comes and goes (gathered units, gradient buffers of units in backward) are
 * marked live and free around each use, so the tracker records the real peak
 * per class, which the trainer compares with the plan.
 *
 * Owns: the arenas' memory and the per-class counters. Knows nothing about
 * models or configs; plan.c decides the sizes.
 */
#ifndef SHARDLM_ARENA_H
#define SHARDLM_ARENA_H

#include <stddef.h>

#include "backend.h" /* enum mem_space: the arenas allocate through the backend */

enum buf_class {
    BUF_PARAMS = 0,    /* parameter shard (the full parameters at stages 0-2) */
    BUF_GRADS,         /* gradient shard in the parameter dtype (full at stages 0-1) */
    BUF_GATHERED,      /* units gathered for compute (stage 3) */
    BUF_GRAD_BUFFERS,  /* full-unit gradient buffers before reduce-scatter (stages 2-3) */
    BUF_GRAD_SEND,     /* full-unit gradients cast to the parameter dtype for the reduce-scatter */
    BUF_COMPUTE_COPIES, /* fp32 copies of acquired half-precision units (CPU backend computes in fp32) */
    BUF_MASTER,        /* fp32 master weights (when the parameter dtype is not fp32, or offloaded) */
    BUF_ADAM_M,
    BUF_ADAM_V,
    BUF_FP32_GRADS,    /* fp32 gradient shard for the optimizer (mixed precision / offload) */
    BUF_ACT_CKPT,      /* residual stream kept between forward and backward */
    BUF_ACTIVATIONS,   /* working activations of the blocks */
    BUF_LOGITS,        /* logits, probabilities and losses */
    BUF_WORKSPACE,     /* kernel scratch and backward work buffers */
    BUF_STAGING,       /* device backends: pinned token ids and losses on their way to and from the device */
    BUF_COUNT
};

struct arena {
    enum mem_space space;
    char *base;
    size_t capacity;
    size_t used;
};

struct mem_tracker {
    size_t reserved[BUF_COUNT]; /* carved out of an arena */
    size_t live[BUF_COUNT];     /* in use now */
    size_t peak[BUF_COUNT];     /* highest live */
    size_t space_live[SPACE_COUNT], space_peak[SPACE_COUNT];
    enum mem_space space_of[BUF_COUNT];
};

const char *arena_class_name(enum buf_class c);

void arena_create(struct arena *a, enum mem_space space, size_t capacity);
void arena_destroy(struct arena *a);

/* Carves bytes (rounded up to 64) out of a; counted as reserved. When live is
 * nonzero the buffer counts as in use from now on (static buffers); otherwise
 * the caller marks its uses with arena_mark_live / arena_mark_free. Exceeding
 * the arena's capacity is an internal error: the plan was wrong. */
void *arena_alloc(struct arena *a, struct mem_tracker *t, enum buf_class c, size_t bytes, int live);
void arena_mark_live(struct mem_tracker *t, enum buf_class c, size_t bytes);
void arena_mark_free(struct mem_tracker *t, enum buf_class c, size_t bytes);

/* A point to come back to: every arena's use and every class's reserved
 * bytes. arena_rewind gives back what was carved since (the buffers must be
 * no longer used, and were carved live: static buffers), freeing it in the
 * tracker too, so the same memory can be carved again; the peaks stay. */
struct arena_mark {
    size_t used[SPACE_COUNT];
    size_t reserved[BUF_COUNT];
};
void arena_mark_take(struct arena_mark *m, const struct arena arenas[SPACE_COUNT], const struct mem_tracker *t);
void arena_rewind(const struct arena_mark *m, struct arena arenas[SPACE_COUNT], struct mem_tracker *t);

/* Rounding used for every buffer, so the plan can predict it. */
#define ARENA_ALIGN 64 /* bytes: every buffer starts on a multiple */
static inline size_t arena_round(size_t bytes) { return (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN; }

#endif
