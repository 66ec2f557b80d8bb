#include "plan.h"

#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "gpt2.h"
#include "util.h"
#include "zero.h"

int plan_ckpt_interval(const struct config *cfg) { return cfg->act_ckpt.enabled ? cfg->act_ckpt.interval : 0; }

enum mem_space plan_space(const struct config *cfg, enum buf_class c)
{
    switch (c) {
    case BUF_MASTER:
    case BUF_ADAM_M:
    case BUF_ADAM_V:
    case BUF_FP32_GRADS:
        /* a device backend keeps the optimizer state in pinned host memory, always */
        if (backend_is_device())
            return SPACE_PINNED;
        if (!cfg->zero.offload_optimizer)
            return SPACE_DEVICE;
        return cfg->zero.offload_pin_memory ? SPACE_PINNED : SPACE_HOST;
    case BUF_STAGING: return SPACE_PINNED;
    case BUF_ACT_CKPT: return cfg->act_ckpt.enabled && cfg->act_ckpt.cpu_checkpointing ? SPACE_PINNED : SPACE_DEVICE;
    default: return SPACE_DEVICE;
    }
}

void plan_compute(struct mem_plan *p, const struct model *m, const struct config *cfg, int world)
{
    memset(p, 0, sizeof *p);
    p->world = world;
    const int interval = plan_ckpt_interval(cfg);
    struct zero_pass passes[2];
    gpt2_build_passes(m, interval, &passes[0], &passes[1]);
    zero_plan(m, cfg, world, passes, 2, p->bytes, p->pool_slots);
    gpt2_free_passes(&passes[0], &passes[1]);
    gpt2_plan(m, cfg->micro_batch, cfg->data.seq_len, interval, p->bytes);
    for (int c = 0; c < BUF_COUNT; c++) {
        p->space[c] = plan_space(cfg, c);
        p->space_total[p->space[c]] += p->bytes[c];
    }
}

const char *plan_format_bytes(double bytes, char *buf, size_t n)
{
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (bytes >= 1024.0 && i < 4) {
        bytes /= 1024.0;
        i++;
    }
    snprintf(buf, n, i == 0 ? "%.0f %s" : "%.2f %s", bytes, units[i]);
    return buf;
}

void plan_print(const struct mem_plan *p, const struct mem_tracker *t, const char *title)
{
    char a[32], b[32];
    log_info("%s", title);
    log_info("  %-24s %-12s %14s %14s", "buffer", "space", "planned", t ? "peak" : "");
    for (int c = 0; c < BUF_COUNT; c++) {
        if (p->bytes[c] == 0 && (!t || t->peak[c] == 0))
            continue;
        log_info("  %-24s %-12s %14s %14s", arena_class_name(c), arena_space_name(p->space[c]),
                 plan_format_bytes((double)p->bytes[c], a, sizeof a),
                 t ? plan_format_bytes((double)t->peak[c], b, sizeof b) : "");
    }
    for (int s = 0; s < SPACE_COUNT; s++) {
        if (p->space_total[s] == 0)
            continue;
        size_t peak = 0;
        for (int c = 0; t && c < BUF_COUNT; c++)
            if (p->space[c] == (enum mem_space)s)
                peak += t->peak[c];
        log_info("  %-24s %-12s %14s %14s", "total", arena_space_name(s),
                 plan_format_bytes((double)p->space_total[s], a, sizeof a),
                 t ? plan_format_bytes((double)peak, b, sizeof b) : "");
    }
}

/* The largest planned items of a space, "name (size), ..." into buf. */
static void largest_items(const struct mem_plan *p, enum mem_space s, char *buf, size_t n)
{
    int done[BUF_COUNT] = {0};
    buf[0] = 0;
    for (int k = 0; k < 3; k++) {
        int best = -1;
        for (int c = 0; c < BUF_COUNT; c++)
            if (!done[c] && p->space[c] == s && p->bytes[c] && (best < 0 || p->bytes[c] > p->bytes[best]))
                best = c;
        if (best < 0)
            break;
        done[best] = 1;
        char b[32];
        size_t len = strlen(buf);
        snprintf(buf + len, n - len, "%s%s (%s)", k ? ", " : "", arena_class_name(best),
                 plan_format_bytes((double)p->bytes[best], b, sizeof b));
    }
}

void plan_check_device(const struct mem_plan *p, int at_start)
{
    size_t free_bytes, total;
    if (!backend_mem_info(&free_bytes, &total))
        return;
    char a[32], b[32], c[32], items[256];
    const size_t need = p->space_total[SPACE_DEVICE];
    if (!at_start) {
        log_info("device memory at the end: %s in use of %s (the plan's arenas: %s; the rest is the CUDA "
                 "context and the libraries' workspaces)",
                 plan_format_bytes((double)(total - free_bytes), a, sizeof a),
                 plan_format_bytes((double)total, b, sizeof b), plan_format_bytes((double)need, c, sizeof c));
        return;
    }
    log_info("device memory: the plan needs %s of the %s free on this GPU (%s total)",
             plan_format_bytes((double)need, a, sizeof a), plan_format_bytes((double)free_bytes, b, sizeof b),
             plan_format_bytes((double)total, c, sizeof c));
    if (need <= free_bytes)
        return;
    largest_items(p, SPACE_DEVICE, items, sizeof items);
    fail_input("the plan needs %s of device memory per rank, %s more than the %s free on this GPU; largest: %s. "
               "Hint: zero_optimization.stage 3, offload_optimizer, activation_checkpointing or a smaller "
               "train_micro_batch_size_per_gpu shrink it (`shardlm plan` shows the effect)",
               plan_format_bytes((double)need, a, sizeof a),
               plan_format_bytes((double)(need - free_bytes), b, sizeof b),
               plan_format_bytes((double)free_bytes, c, sizeof c), items);
}
