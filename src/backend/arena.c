#include "arena.h"

#include <stdlib.h>

#include "backend.h"
#include "core/util.h"

static const char *class_names[BUF_COUNT] = {
    [BUF_PARAMS] = "parameter shard",
    [BUF_GRADS] = "gradient shard",
    [BUF_GATHERED] = "gathered units",
    [BUF_GRAD_BUFFERS] = "unit gradient buffers",
    [BUF_GRAD_SEND] = "gradient send buffers",
    [BUF_COMPUTE_COPIES] = "fp32 compute copies",
    [BUF_MASTER] = "fp32 master weights",
    [BUF_ADAM_M] = "Adam m",
    [BUF_ADAM_V] = "Adam v",
    [BUF_FP32_GRADS] = "fp32 gradient shard",
    [BUF_ACT_CKPT] = "activation checkpoints",
    [BUF_ACTIVATIONS] = "block activations",
    [BUF_LOGITS] = "logits and loss",
    [BUF_WORKSPACE] = "workspace",
    [BUF_STAGING] = "host staging",
};

const char *arena_class_name(enum buf_class c) { return class_names[c]; }

void arena_create(struct arena *a, enum mem_space space, size_t capacity)
{
    a->space = space;
    a->capacity = capacity;
    a->used = 0;
    a->base = capacity ? backend_mem_alloc(space, capacity, "the memory plan's arena") : NULL;
}

void arena_destroy(struct arena *a)
{
    if (a->base)
        backend_mem_free(a->space, a->base, a->capacity);
    a->base = NULL;
    a->capacity = a->used = 0;
}

void arena_mark_live(struct mem_tracker *t, enum buf_class c, size_t bytes)
{
    t->live[c] += bytes;
    if (t->live[c] > t->peak[c])
        t->peak[c] = t->live[c];
    enum mem_space s = t->space_of[c];
    t->space_live[s] += bytes;
    if (t->space_live[s] > t->space_peak[s])
        t->space_peak[s] = t->space_live[s];
}

void arena_mark_free(struct mem_tracker *t, enum buf_class c, size_t bytes)
{
    if (bytes > t->live[c])
        fail_internal("memory tracker: freeing %zu bytes of %s with %zu live", bytes,
                      class_names[c], t->live[c]);
    t->live[c] -= bytes;
    t->space_live[t->space_of[c]] -= bytes;
}

void *arena_alloc(struct arena *a, struct mem_tracker *t, enum buf_class c, size_t bytes, int live)
{
    size_t n = arena_round(bytes);
    if (n == 0)
        return NULL;
    if (a->used + n > a->capacity)
        fail_internal("%s arena: %s needs %zu bytes, %zu of %zu left (the memory plan is wrong)",
                      mem_space_name(a->space), class_names[c], n, a->capacity - a->used, a->capacity);
    void *p = a->base + a->used;
    a->used += n;
    t->space_of[c] = a->space;
    t->reserved[c] += n;
    if (live)
        arena_mark_live(t, c, n);
    return p;
}

void arena_mark_take(struct arena_mark *m, const struct arena arenas[SPACE_COUNT], const struct mem_tracker *t)
{
    for (int s = 0; s < SPACE_COUNT; s++)
        m->used[s] = arenas[s].used;
    for (int c = 0; c < BUF_COUNT; c++)
        m->reserved[c] = t->reserved[c];
}

void arena_rewind(const struct arena_mark *m, struct arena arenas[SPACE_COUNT], struct mem_tracker *t)
{
    for (int c = 0; c < BUF_COUNT; c++) {
        if (t->reserved[c] < m->reserved[c])
            fail_internal("memory tracker: rewinding %s to %zu bytes reserved, %zu now", class_names[c],
                          m->reserved[c], t->reserved[c]);
        arena_mark_free(t, c, t->reserved[c] - m->reserved[c]);
        t->reserved[c] = m->reserved[c];
    }
    for (int s = 0; s < SPACE_COUNT; s++) {
        if (arenas[s].used < m->used[s])
            fail_internal("%s arena: rewinding to %zu bytes used, %zu now", mem_space_name(arenas[s].space),
                          m->used[s], arenas[s].used);
        arenas[s].used = m->used[s];
    }
}
