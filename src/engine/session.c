/*
 * session — one engine opened for passes (see session.h).
 */
#include "session.h"

#include <string.h>

#include "core/quant4.h"
#include "core/util.h"
#include "io/quant_reader.h"

void session_init(struct session *s, struct comm *comm, const struct config *cfg)
{
    memset(s, 0, sizeof *s);
    s->cfg = cfg;
    s->comm = comm;
    s->rank = comm->rank;
    s->world = comm->world;
}

/* The plan of a shape: generation's (Tmax > 0), or the config's training. */
static void plan_of(const struct session *s, const struct session_shape *shape, struct mem_plan *p)
{
    if (shape->Tmax > 0)
        plan_compute_generate(p, &s->model, s->cfg, s->world, shape->B, shape->T, shape->Tmax);
    else
        plan_compute(p, &s->model, s->cfg, s->world);
}

void session_plan(struct session *s, const struct session_shape *shape)
{
    const struct config *cfg = s->cfg;
    s->target = target_running();
    family_build_passes(&s->model, plan_ckpt_interval(cfg), &s->train_pass, &s->eval_pass);
    plan_of(s, shape, &s->plan);
    plan_check_device(&s->plan, 1);
    for (int sp = 0; sp < SPACE_COUNT; sp++)
        arena_create(&s->arenas[sp], sp, s->plan.space_total[sp]);
    s->planned = true;
}

static void inner_read(void *ctx, int u, size_t begin, size_t count, float *out)
{
    const struct param_source *inner = ctx;
    inner->read(inner->ctx, u, begin, count, out);
}

static void quant_read(void *ctx, int u, size_t begin, size_t count, float *out)
{
    struct session_base *b = ctx;
    quant_reader_read(&b->reader, u, begin, count, out);
}

static bool quant_read_as(void *ctx, int u, size_t begin, size_t count, enum dtype dt, void *out,
                          void (*landed)(void *landed_ctx, size_t elems), void *landed_ctx)
{
    struct session_base *b = ctx;
    if (quant_reader_quantizes(&b->reader, u) || !b->inner || !b->inner->read_as)
        return false; /* its weights are not the source's: through quant_reader_read */
    return b->inner->read_as(b->inner->ctx, u, begin, count, dt, out, landed, landed_ctx);
}

static void quant_read_q4(void *ctx, int u, int t, size_t first, size_t n, const struct quant4_range *out)
{
    struct session_base *b = ctx;
    quant_reader_read_q4(&b->reader, u, t, first, n, out);
}

const struct param_source *session_base_source(const struct session *s, const struct param_source *src,
                                               struct session_base *b)
{
    const struct quant_config *qc = &s->cfg->quant;
    memset(b, 0, sizeof *b);
    if (!qc->load_in_4bit || qc->prequantized) /* prequantized: the files' 4-bit weights, read dequantized */
        return src;
    b->on = true;
    b->inner = src;
    b->src = (struct param_source){quant_read, quant_read_as, b, quant_read_q4};
    quant_reader_init(&b->reader, &s->model, qc, src ? inner_read : NULL, (void *)src);
    b->reader.comm = s->comm; /* a 4-bit unit's share is quantized by its rank alone (quant_reader_read_q4) */
    return &b->src;
}

void session_base_free(struct session_base *b)
{
    if (b->on)
        quant_reader_free(&b->reader);
    memset(b, 0, sizeof *b);
}

void session_load(struct session *s, const struct param_source *src)
{
    const int(*slots)[ZERO_POOLS] = (const int(*)[ZERO_POOLS])s->plan.pool_slots;
    zero_init(&s->zero, &s->model, s->cfg, &s->target, s->comm, s->rank, s->world, false, slots, s->arenas, &s->mem,
              src);
    s->loaded = true;
}

void session_acts(struct session *s, const struct session_shape *shape)
{
    const struct config *cfg = s->cfg;
    const int Tmax = shape->Tmax;
    const bool positions = Tmax > 0 || cfg->data.packing;
    arena_mark_take(&s->acts_mark, s->arenas, &s->mem);
    family_acts_init(&s->acts, &s->model, &s->target, shape->B, shape->T, Tmax > 0 ? Tmax : shape->T,
                     plan_ckpt_interval(cfg), positions, target_space(&s->target, cfg, BUF_ACT_CKPT), s->arenas,
                     &s->mem);
    if (Tmax > 0)
        family_kv_init(&s->acts, &s->kv, &s->target, Tmax, s->arenas, &s->mem);
    s->started = true;
}

double session_forward(struct session *s, int B, int T, int with_targets)
{
    zero_begin_pass(&s->zero, &s->eval_pass);
    double sum = family_forward(&s->zero, &s->acts, B, T, with_targets, FAMILY_EVAL, 0.0f);
    zero_end_pass(&s->zero);
    return sum;
}

bool session_fits(const struct session *s, const struct session_shape *shape)
{
    struct mem_plan need;
    plan_of(s, shape, &need);
    for (int c = 0; c < BUF_COUNT; c++)
        if (need.bytes[c] > s->plan.bytes[c] || need.space[c] != s->plan.space[c])
            return false;
    return true;
}

void session_reshape(struct session *s, const struct session_shape *shape)
{
    family_kv_free(&s->acts);
    family_acts_free(&s->acts);
    arena_rewind(&s->acts_mark, s->arenas, &s->mem);
    session_acts(s, shape);
}

void session_close(struct session *s)
{
    if (s->started) {
        family_kv_free(&s->acts);
        family_acts_free(&s->acts);
    }
    if (s->loaded)
        zero_free(&s->zero);
    if (s->planned) {
        family_free_passes(&s->train_pass, &s->eval_pass);
        for (int sp = 0; sp < SPACE_COUNT; sp++)
            arena_destroy(&s->arenas[sp]);
    }
    model_free(&s->model);
    memset(s, 0, sizeof *s);
}
