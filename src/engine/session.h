/*
 * session — one engine opened for passes: the model, its memory plan and
 * tracker, the arenas, the ZeRO state and its two passes, the execution
 * target, the activations and (generating) the key/value cache. The trainer
 * (run/train.c) and the forward-only model of generate, eval and the end-of-
 * run sample (run/infer.c) both embed one, so they plan, allocate, read
 * parameters, run a forward and free in the same code.
 *
 * Opening, in this order (each caller keeps its own failure agreement
 * around the steps, as the set-up differs: the trainer traps all of it,
 * infer only the planning, before its collective weight read):
 *   session_init   the comm and the config (no allocation); the caller then
 *                  builds s->model (model_build, model_add_lora, freezes);
 *   session_plan   the target, the passes, the plan for a shape and the
 *                  arenas it sizes;
 *   session_load   the ZeRO state, its parameters from a source (zero_init);
 *   session_acts   the activations of the shape, and its cache when Tmax > 0.
 * session_close frees what was opened, the model included.
 *
 * The shape: B rows of at most T tokens, and Tmax > 0 for a key/value cache
 * of Tmax positions per row (the rotary tables then cover Tmax). The config's
 * act_ckpt (its interval) and data.packing (positions given) apply.
 */
#ifndef SHARDLM_SESSION_H
#define SHARDLM_SESSION_H

#include <stdbool.h>

#include "backend/arena.h"
#include "backend/target.h"
#include "comm/comm.h"
#include "core/options.h"
#include "families/family.h"
#include "io/quant_reader.h"
#include "model/model.h"
#include "plan.h"
#include "zero/zero.h"

struct session_shape {
    int B, T;    /* rows and tokens of the largest forward */
    int Tmax;    /* > 0: a key/value cache of Tmax positions per row (generation) */
};

struct session {
    const struct config *cfg;
    struct comm *comm;
    int rank, world;
    struct model model;
    struct mem_plan plan;
    struct mem_tracker mem;
    struct arena arenas[SPACE_COUNT];
    struct zero zero;
    struct zero_pass train_pass, eval_pass;
    struct exec_target target; /* the backend this binary runs, as configured */
    struct family_acts acts;
    struct family_kv kv;
    struct arena_mark acts_mark; /* the arenas before the activations (session_reshape) */
    bool planned, loaded, started; /* what session_close frees */
};

/* Empties s and notes the comm and the config (which outlives s). */
void session_init(struct session *s, struct comm *comm, const struct config *cfg);
/* The target, the passes and the memory plan of the shape; the arenas. Local. */
void session_plan(struct session *s, const struct session_shape *shape);
/* The ZeRO state with its parameters from src (NULL: the seeded init), each
 * rank reading what it stores. Collective. */
void session_load(struct session *s, const struct param_source *src);

/* The base's values for s's config: src itself (NULL: the seeded init), or
 * with quantization.load_in_4bit over an unquantized source, src's values
 * with the blocks' linear weights as bitsandbytes' 4-bit makes them
 * (io/quant_reader.h). Wrap it (the base's checksum) and give it to
 * session_load; b holds the wrapper until session_base_free. */
struct session_base {
    struct param_source src;
    const struct param_source *inner;
    struct quant_reader reader;
    bool on;
};
const struct param_source *session_base_source(const struct session *s, const struct param_source *src,
                                               struct session_base *b);
void session_base_free(struct session_base *b);
/* The activations of the shape (and the cache when shape->Tmax > 0). */
void session_acts(struct session *s, const struct session_shape *shape);
void session_close(struct session *s);

/* Whether the activations (and cache) of shape need, in every buffer class,
 * at most what s's plan reserved there. Local; the same answer on every rank. */
bool session_fits(const struct session *s, const struct session_shape *shape);
/* Frees the activations (and cache) and carves those of shape in their place
 * (the same arena memory: the shape must fit, session_fits). The tracker's
 * peaks stay; what is live is the new shape's. */
void session_reshape(struct session *s, const struct session_shape *shape);

/* One evaluation forward of s->acts' B x T tokens (inputs and positions
 * filled; with the cache, kv.past and kv.last too), bracketed by the eval
 * pass; with targets, the sum of the trained positions' losses. */
double session_forward(struct session *s, int B, int T, int with_targets);

#endif
