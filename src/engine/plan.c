#include "plan.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backend/backend.h"
#include "families/family.h"
#include "core/util.h"
#include "zero/nvme.h"
#include "zero/zero.h"

int plan_ckpt_interval(const struct config *cfg) { return cfg->act_ckpt.enabled ? cfg->act_ckpt.interval : 0; }

/* ---- the plan ------------------------------------------------------------------- */

/* The execution target a plan target stands for. */
static struct exec_target target_of(const struct config *cfg, enum plan_target target)
{
    if (target == PLAN_TARGET_CPU)
        return target_running();
    /* bin/shardlm-cuda computes in fp32 with SHARDLM_FP32_ACTIVATIONS=1 (a debugging mode) */
    const char *f32_acts = getenv("SHARDLM_FP32_ACTIVATIONS");
    bool f32 = target == PLAN_TARGET_CUDA && f32_acts && strcmp(f32_acts, "1") == 0;
    return target_cuda(f32 ? DTYPE_F32 : cfg->dtype);
}

/* Offload to NVMe: the files' and buffers' bytes and the traffic per step
 * (plan.h struct plan_nvme), as the engine lays them out: the optimizer file
 * holds every unit whose role keeps its state in the file (its optimizer
 * range: zero.c size_unit), sized by nvme_sizes; the parameter file is
 * zero_nvme_layout's. The roles already leave that state out of the arenas. */
static void plan_nvme(struct mem_plan *p, const struct model *m, const struct config *cfg, int world,
                      const struct exec_target *t, const struct zero_pass *train)
{
    struct plan_nvme *nv = &p->nvme;
    if (!cfg->zero.offload_optimizer_nvme && !cfg->zero.offload_param_nvme)
        return;
    size_t *off = xcalloc((size_t)m->n_units, sizeof *off);
    double master_reads = 0.0;
    struct zero_nvme_sizes sz;
    zero_nvme_layout(m, cfg, t, world, off, &sz);
    for (int u = 0; u < m->n_units; u++) {
        struct unit_role r;
        zero_unit_role(m, cfg, t, world, u, &r);
        const size_t padded = round_up(m->units[u].numel, (size_t)world * MODEL_TENSOR_ALIGN);
        const size_t opt_count = cfg->zero.stage == 0 ? padded : padded / (size_t)world;
        if (r.state_in_file)
            nv->opt_elems += opt_count;
        if (!r.param_nvme)
            continue;
        if (r.state_in_file) /* its new master read again from the optimizer file, narrowed into the parameter file */
            master_reads += 4.0 * (double)opt_count;
        /* its span in the file: up to the next unit's offset, or to the end */
        size_t next = sz.file_bytes;
        for (int v = u + 1; v < m->n_units; v++)
            if (off[v] > off[u]) {
                next = off[v];
                break;
            }
        /* read at every gather of the train pass (at most: a shard still in a buffer is not read again) */
        nv->param_read += (double)cfg->grad_accum * zero_pass_gathers(train, u) * (double)(next - off[u]);
        if (r.trained)
            nv->param_written += (double)(next - off[u]);
    }
    free(off);
    if (nv->opt_elems) {
        nvme_sizes(nv->opt_elems, cfg->zero.optimizer_buffer_count, &nv->opt_file, &nv->opt_buffers,
                   &nv->opt_piece);
        nv->opt_read = nv->opt_written = (double)nv->opt_file;
        nv->opt_read += master_reads; /* (its 4 KiB blocks: a little more where a range starts or ends inside one) */
    }
    nv->param_file = sz.file_bytes;
    nv->param_buffers = sz.host_bytes;
    nv->param_unit_elems = sz.largest_shard;
    nv->param_unit = sz.widest < 0 ? 0 : sz.host_bytes / (size_t)sz.buffers;
}

/* The engine's buffers for micro-batch B x T with rotary tables of max_pos
 * positions, and a key/value cache of kv_T positions per row (0: none). */
static void plan_fill(struct mem_plan *p, const struct model *m, const struct config *cfg, int world,
                      const struct exec_target *tp, int B, int T, int max_pos, bool positions, int kv_T)
{
    const struct exec_target t = *tp;
    memset(p, 0, sizeof *p);
    p->world = world;
    const int interval = plan_ckpt_interval(cfg);
    struct zero_pass passes[2];
    family_build_passes(m, interval, &passes[0], &passes[1]);
    zero_plan(m, cfg, &t, world, passes, 2, p->bytes, p->pool_slots);
    family_plan(m, &t, B, T, max_pos, interval, positions, p->bytes);
    if (kv_T)
        family_kv_plan(m, &t, B, kv_T, p->bytes);
    plan_nvme(p, m, cfg, world, &t, &passes[0]);
    family_free_passes(&passes[0], &passes[1]);
    for (int c = 0; c < BUF_COUNT; c++) {
        p->space[c] = target_space(&t, cfg, c);
        /* the config's size bounds keep every buffer far below 2^64 bytes */
        if (__builtin_add_overflow(p->space_total[p->space[c]], p->bytes[c], &p->space_total[p->space[c]]))
            fail_internal("memory plan: the %s total wraps at 2^64 bytes", arena_class_name(c));
    }
}

void plan_compute_for(struct mem_plan *p, const struct model *m, const struct config *cfg, int world,
                      enum plan_target target)
{
    const struct exec_target t = target_of(cfg, target);
    /* DPO: a micro-batch of B pairs runs as 2B rows (data/samples.h) */
    const int rows = cfg->micro_batch * (cfg->dpo.enabled ? 2 : 1);
    plan_fill(p, m, cfg, world, &t, rows, cfg->data.seq_len, cfg->data.seq_len, cfg->data.packing, 0);
}

void plan_compute_generate(struct mem_plan *p, const struct model *m, const struct config *cfg, int world, int B,
                           int T, int Tmax)
{
    const struct exec_target t = target_running();
    plan_fill(p, m, cfg, world, &t, B, T, Tmax, true, Tmax);
}

void plan_compute(struct mem_plan *p, const struct model *m, const struct config *cfg, int world)
{
    plan_compute_for(p, m, cfg, world, PLAN_TARGET_CPU);
}

size_t plan_host_bytes(const struct mem_plan *p)
{
    return p->space_total[SPACE_PINNED] + p->space_total[SPACE_HOST] + p->nvme.opt_buffers + p->nvme.param_buffers;
}

/* ---- traffic -------------------------------------------------------------------- */

void plan_traffic(const struct model *m, const struct config *cfg, int world, int accum, double bytes[COMM_KINDS])
{
    memset(bytes, 0, COMM_KINDS * sizeof *bytes);
    const double N = world, esize = dtype_size(cfg->dtype);
    /* the units' roles decide the traffic whatever the target; the train pass says how often each is gathered */
    const struct exec_target t = target_running();
    struct zero_pass train, eval;
    family_build_passes(m, plan_ckpt_interval(cfg), &train, &eval);
    for (int u = 0; u < m->n_units; u++) {
        struct unit_role r;
        zero_unit_role(m, cfg, &t, world, u, &r);
        const double padded = (double)round_up(m->units[u].numel, (size_t)world * MODEL_TENSOR_ALIGN);
        const double shard = padded / N;
        if (r.grad == GRAD_ALLREDUCE) /* all-reduce of the gradients at the boundary: 2 (N-1)/N of the buffer */
            bytes[COMM_ALLREDUCE] += floor(2.0 * (N - 1) * padded * esize / N);
        else if (r.grad != GRAD_NONE) /* reduce-scattered after every micro-batch's backward; frozen: never */
            bytes[COMM_REDUCE_SCATTER] += accum * (N - 1) * shard * esize;
        if (r.gather_after_step) /* the updated slices gathered after the step */
            bytes[COMM_ALLGATHER] += (N - 1) * shard * esize;
        /* a 4-bit unit's shard is its packed bytes (zero.h) */
        const double gathered = r.sharded ? (double)zero_gather_shard_bytes(m, cfg, &t, world, u) : 0.0;
        if (r.sharded) /* gathered wherever the pass acquires it unheld: for forward and again for backward */
            bytes[COMM_ALLGATHER] += zero_pass_gathers(&train, u) * accum * (N - 1) * gathered;
        /* DPO with LoRA: the reference's evaluation forward (adapters off) gathers them once more */
        if (r.sharded && cfg->dpo.enabled && !cfg->dpo.precompute_ref_log_probs)
            bytes[COMM_ALLGATHER] += zero_pass_gathers(&eval, u) * accum * (N - 1) * gathered;
    }
    family_free_passes(&train, &eval);
}

/* ---- sizes ---------------------------------------------------------------------- */

int plan_parse_bytes(const char *text, double *bytes, const char **why)
{
    static const struct {
        const char *suffix;
        double scale;
    } units[] = {
        {"", 1}, {"b", 1}, {"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12}, {"pb", 1e15},
        {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0},
        {"pib", 1125899906842624.0},
    };
    *why = NULL;
    if (!text || !*text) {
        *why = "empty";
        return -1;
    }
    char *end;
    double v = strtod(text, &end);
    if (end == text || isspace((unsigned char)text[0]) || isnan(v)) {
        *why = "not a number";
        return -1;
    }
    while (*end == ' ')
        end++;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(end, units[i].suffix) != 0)
            continue;
        v *= units[i].scale;
        if (!isfinite(v) || v > 1e18) {
            *why = "too large";
            return -1;
        }
        if (!(v > 0)) {
            *why = "must be positive";
            return -1;
        }
        *bytes = v;
        return 0;
    }
    *why = "unknown unit (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)";
    return -1;
}

void plan_print(const struct mem_plan *p, const struct mem_tracker *t, const char *title)
{
    char a[32], b[32];
    log_info("%s", title);
    log_info("  %-24s %-12s %14s %14s", "buffer", "space", "planned", t ? "peak" : "");
    for (int c = 0; c < BUF_COUNT; c++) {
        if (p->bytes[c] == 0 && (!t || t->peak[c] == 0))
            continue;
        log_info("  %-24s %-12s %14s %14s", arena_class_name(c), mem_space_name(p->space[c]),
                 format_bytes((double)p->bytes[c], a, sizeof a),
                 t ? format_bytes((double)t->peak[c], b, sizeof b) : "");
    }
    for (int s = 0; s < SPACE_COUNT; s++) {
        if (p->space_total[s] == 0)
            continue;
        size_t peak = 0;
        for (int c = 0; t && c < BUF_COUNT; c++)
            if (p->space[c] == (enum mem_space)s)
                peak += t->peak[c];
        log_info("  %-24s %-12s %14s %14s", "total", mem_space_name(s),
                 format_bytes((double)p->space_total[s], a, sizeof a),
                 t ? format_bytes((double)peak, b, sizeof b) : "");
    }
    const struct plan_nvme *nv = &p->nvme;
    if (nv->opt_file)
        log_info("  %-24s %-12s %14s (file), %s of pinned buffers", "master, Adam m and v", "nvme",
                 format_bytes((double)nv->opt_file, a, sizeof a), format_bytes((double)nv->opt_buffers, b, sizeof b));
    if (nv->param_file)
        log_info("  %-24s %-12s %14s (file), %s of pinned buffers", "parameter shard", "nvme",
                 format_bytes((double)nv->param_file, a, sizeof a),
                 format_bytes((double)nv->param_buffers, b, sizeof b));
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
                 format_bytes((double)p->bytes[best], b, sizeof b));
    }
}

/* MemAvailable of /proc/meminfo in bytes, 0 when unknown. */
static size_t host_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
            break;
    fclose(f);
    return (size_t)kib * 1024;
}

/* Without a device (the CPU backend) every space is host memory: a plan
 * larger than the memory this node has free is refused before the arenas are
 * allocated (with overcommit, the allocation would succeed and the kernel
 * would kill the job at the first touch). */
static void check_host(const struct mem_plan *p)
{
    size_t need = plan_host_bytes(p) + p->space_total[SPACE_DEVICE], avail = host_available();
    if (!avail || need <= avail)
        return;
    char a[32], b[32], items[256];
    largest_items(p, SPACE_DEVICE, items, sizeof items);
    fail_input("the plan needs %s of host memory per rank, more than the %s available on this node; largest: %s. "
               "Hint: a smaller model, train_micro_batch_size_per_gpu or data.seq_len, more ranks with "
               "zero_optimization.stage 3, or activation_checkpointing shrink it (`shardlm plan` shows the effect)",
               format_bytes((double)need, a, sizeof a), format_bytes((double)avail, b, sizeof b), items);
}

void plan_check_device(const struct mem_plan *p, int at_start)
{
    size_t free_bytes, total;
    if (!backend_mem_info(&free_bytes, &total)) {
        if (at_start)
            check_host(p);
        return;
    }
    char a[32], b[32], c[32], items[256];
    const size_t need = p->space_total[SPACE_DEVICE];
    if (!at_start) {
        log_info("device memory at the end: %s in use of %s (the plan's arenas: %s; the rest is the CUDA "
                 "context and the libraries' workspaces)",
                 format_bytes((double)(total - free_bytes), a, sizeof a),
                 format_bytes((double)total, b, sizeof b), format_bytes((double)need, c, sizeof c));
        return;
    }
    log_info("device memory: the plan needs %s of the %s free on this GPU (%s total)",
             format_bytes((double)need, a, sizeof a), format_bytes((double)free_bytes, b, sizeof b),
             format_bytes((double)total, c, sizeof c));
    if (need <= free_bytes)
        return;
    largest_items(p, SPACE_DEVICE, items, sizeof items);
    fail_input("the plan needs %s of device memory per rank, %s more than the %s free on this GPU; largest: %s. "
               "Hint: zero_optimization.stage 3, offload_optimizer, activation_checkpointing or a smaller "
               "train_micro_batch_size_per_gpu shrink it (`shardlm plan` shows the effect)",
               format_bytes((double)need, a, sizeof a),
               format_bytes((double)(need - free_bytes), b, sizeof b),
               format_bytes((double)free_bytes, c, sizeof c), items);
}
