#include "plan.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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
        if (!cfg->zero.offload_optimizer)
            return SPACE_DEVICE;
        /* a device's kernels read and write offloaded state only in pinned (mapped) memory */
        return cfg->zero.offload_pin_memory || plan_device() ? SPACE_PINNED : SPACE_HOST;
    case BUF_STAGING: return SPACE_PINNED;
    case BUF_PARAMS:
        if (!cfg->zero.offload_param)
            return SPACE_DEVICE;
        /* a device's kernels write the new parameters: pinned (mapped) memory */
        return cfg->zero.offload_param_pin_memory || plan_device() ? SPACE_PINNED : SPACE_HOST;
    case BUF_ACT_CKPT: return cfg->act_ckpt.enabled && cfg->act_ckpt.cpu_checkpointing ? SPACE_PINNED : SPACE_DEVICE;
    default: return SPACE_DEVICE;
    }
}

/* ---- passes ------------------------------------------------------------------ */

static void add_event(struct zero_pass *p, enum pass_event_kind kind, int unit)
{
    p->events[p->n_events].kind = kind;
    p->events[p->n_events].unit = unit;
    p->n_events++;
}

/* Untied head (Llama): GPT-2's passes without the head's use of the embedding
 * (the forward's second acquire of it, kept through the backward); the
 * embedding is gathered again at the end of the backward for its gradient,
 * so every unit is gathered twice per micro-batch as DESIGN §3 counts. */
static void untied_passes(const struct model *m, int interval, struct zero_pass *train, struct zero_pass *eval)
{
    gpt2_build_passes(m, interval, train, eval);
    struct zero_pass *both[2] = {eval, train};
    for (int i = 0; i < 2; i++) {
        struct zero_pass *p = both[i];
        int kept = 0;
        for (int e = 0; e < p->n_events; e++)
            if (p->events[e].unit != 0 || e < 2) /* the forward's acquire + release of the embedding */
                p->events[kept++] = p->events[e];
        p->n_events = kept;
    }
    add_event(train, PASS_ACQUIRE, 0);
    add_event(train, PASS_GRAD_OPEN, 0);
    add_event(train, PASS_GRAD_DONE, 0);
    add_event(train, PASS_RELEASE, 0);
}

void plan_build_passes(const struct model *m, int interval, struct zero_pass *train, struct zero_pass *eval)
{
    if (m->cfg.tied_head)
        gpt2_build_passes(m, interval, train, eval);
    else
        untied_passes(m, interval, train, eval);
}

/* ---- activations from shapes ---------------------------------------------------- */

/* How activations are stored: element size, and whether attention keeps its
 * (B, NH, T, T) probabilities (CPU backend) or only softmax statistics (B, NH, T)
 * in fp32 (fused attention on the GPU). */
struct act_layout {
    size_t esize;
    bool full_attention;
    size_t scratch_bytes;
};

static size_t act_bytes(const struct act_layout *al, size_t n) { return arena_round(n * al->esize); }
static size_t fp32_bytes(size_t n) { return arena_round(n * sizeof(float)); }

/* One block's working activations (gpt2.h struct block_acts, generalised):
 * norm1 out + stats, q|k|v, attention, its output, the residual after
 * attention, norm2 out + stats, the MLP's hidden activations. */
static size_t block_set(const struct model_config *c, const struct act_layout *al, size_t B, size_t T)
{
    const size_t BT = B * T, C = (size_t)c->n_embd, NH = (size_t)c->n_head, F = (size_t)c->ffn_dim;
    const size_t KV = C / NH * (size_t)c->n_kv_head;
    const size_t stats = (c->norm == NORM_LAYERNORM ? 2 : 1) * fp32_bytes(BT);
    size_t att = al->full_attention ? fp32_bytes(B * NH * T * T) : fp32_bytes(B * NH * T);
    size_t mlp = (c->mlp == MLP_SWIGLU ? 3 : 2) * act_bytes(al, BT * F);
    return act_bytes(al, BT * C) + stats + act_bytes(al, BT * (C + 2 * KV)) + att + act_bytes(al, BT * C) +
           act_bytes(al, BT * C) + act_bytes(al, BT * C) + stats + mlp;
}

/* The activation classes of any model family from its shapes, in gpt2_plan's
 * arrangement (kept block inputs, working sets, final norm and logits, backward
 * work buffers). The losses and the norm statistics stay fp32; the logits are in the activation dtype. */
static void shape_plan(const struct model *m, const struct act_layout *al, int B_, int T_, int interval,
                       size_t bytes[BUF_COUNT])
{
    const struct model_config *c = &m->cfg;
    const size_t B = (size_t)B_, T = (size_t)T_, BT = B * T, L = (size_t)c->n_layer, C = (size_t)c->n_embd;
    const size_t KV = C / (size_t)c->n_head * (size_t)c->n_kv_head, F = (size_t)c->ffn_dim;
    const size_t set = block_set(c, al, B, T), resid = act_bytes(al, BT * C);
    if (interval > 0) {
        bytes[BUF_ACT_CKPT] += (L + (size_t)interval - 1) / (size_t)interval * resid;
        bytes[BUF_ACTIVATIONS] += (size_t)interval * set + ((size_t)interval + 1) * resid + resid;
    } else {
        bytes[BUF_ACT_CKPT] += L * resid;
        bytes[BUF_ACTIVATIONS] += L * set + resid;
    }
    const size_t stats = (c->norm == NORM_LAYERNORM ? 2 : 1) * fp32_bytes(BT);
    /* the logits in the activation dtype: the fused cross-entropy computes the softmax in fp32 from them
     * and writes the gradient in place (no fp32 copy) */
    bytes[BUF_LOGITS] += resid + stats + act_bytes(al, BT * (size_t)c->padded_vocab) + fp32_bytes(BT);
    size_t rope = c->rotary ? 2 * fp32_bytes(T * (C / (size_t)c->n_head) / 2) : 0; /* cos, sin tables */
    bytes[BUF_WORKSPACE] += 3 * resid + act_bytes(al, BT * (C + 2 * KV)) +
                            (c->mlp == MLP_SWIGLU ? 2 : 1) * act_bytes(al, BT * F) + arena_round(al->scratch_bytes) +
                            rope + 2 * arena_round(BT * sizeof(int32_t));
}

/* ---- the plan ------------------------------------------------------------------- */

/* The largest padded unit of each kind: the slot of a full-unit buffer. */
static void slot_elems(const struct model *m, int world, size_t elems[ZERO_POOLS])
{
    memset(elems, 0, ZERO_POOLS * sizeof *elems);
    for (int u = 0; u < m->n_units; u++) {
        size_t padded = round_up(m->units[u].numel, (size_t)world * MODEL_TENSOR_ALIGN);
        int k = (int)m->units[u].kind;
        if (padded > elems[k])
            elems[k] = padded;
    }
}

/* GPU target: unit gradient buffers in the parameter dtype, each held until
 * its reduce-scatter is done (zero.c's path without a master copy gives the
 * slot counts); no fp32 compute copies, no send buffers. */
static void gpu_unit_buffers(struct mem_plan *p, const struct model *m, const struct config *cfg, int world,
                             const struct zero_pass passes[2])
{
    p->bytes[BUF_COMPUTE_COPIES] = p->bytes[BUF_GRAD_SEND] = p->bytes[BUF_GRAD_BUFFERS] = 0;
    memset(p->pool_slots[POOL_COMPUTE], 0, sizeof p->pool_slots[POOL_COMPUTE]);
    memset(p->pool_slots[POOL_SEND], 0, sizeof p->pool_slots[POOL_SEND]);
    if (cfg->zero.stage < 2)
        return;
    struct config direct = *cfg;
    direct.dtype = DTYPE_F32;
    direct.zero.offload_optimizer = false;
    size_t scratch[BUF_COUNT] = {0};
    int slots[POOL_SETS][ZERO_POOLS];
    zero_plan(m, &direct, world, passes, 2, scratch, slots);
    size_t elems[ZERO_POOLS];
    slot_elems(m, world, elems);
    const size_t esize = (size_t)dtype_size(cfg->dtype);
    for (int k = 0; k < ZERO_POOLS; k++) {
        p->pool_slots[POOL_GRAD][k] = slots[POOL_GRAD][k];
        p->bytes[BUF_GRAD_BUFFERS] += (size_t)slots[POOL_GRAD][k] * arena_round(elems[k] * esize);
    }
}

/* Set while the CUDA target is planned by a build whose backend is not CUDA. */
static struct {
    int on;
    enum dtype act;
} g_as_cuda;

int plan_device(void) { return g_as_cuda.on || backend_is_device(); }

enum dtype plan_act_dtype(void) { return g_as_cuda.on ? g_as_cuda.act : backend_act_dtype(); }

size_t plan_attention_scratch(int T, int NH)
{
    return g_as_cuda.on ? BACKEND_CUDA_ATTENTION_SCRATCH(T, NH) : backend_attention_scratch(T, NH);
}

size_t plan_attention_saved(int B, int T, int NH)
{
    return g_as_cuda.on ? BACKEND_CUDA_ATTENTION_SAVED(B, T, NH) : backend_attention_saved(B, T, NH);
}

size_t plan_layernorm_scratch(int C) { return g_as_cuda.on ? 0 : backend_layernorm_scratch(C); }

size_t plan_library_workspace(void) { return g_as_cuda.on ? BACKEND_CUDA_LIBRARY_WORKSPACE : backend_library_workspace(); }

void plan_compute_for(struct mem_plan *p, const struct model *m, const struct config *cfg, int world,
                      enum plan_target target)
{
    if (target == PLAN_TARGET_CUDA) {
        if (!m->cfg.tied_head)
            fail_input("--target cuda plans what bin/shardlm-cuda allocates, and it trains GPT-2 models only; "
                       "use --target gpu for this model");
        const char *f32_acts = getenv("SHARDLM_FP32_ACTIVATIONS");
        g_as_cuda.on = 1;
        g_as_cuda.act = f32_acts && strcmp(f32_acts, "1") == 0 ? DTYPE_F32 : cfg->dtype;
        plan_compute_for(p, m, cfg, world, PLAN_TARGET_CPU);
        g_as_cuda.on = 0;
        return;
    }
    memset(p, 0, sizeof *p);
    p->world = world;
    const int interval = plan_ckpt_interval(cfg);
    struct zero_pass passes[2];
    plan_build_passes(m, interval, &passes[0], &passes[1]);
    zero_plan(m, cfg, world, passes, 2, p->bytes, p->pool_slots);
    if (target == PLAN_TARGET_GPU) {
        gpu_unit_buffers(p, m, cfg, world, passes);
        struct act_layout gpu = {(size_t)dtype_size(cfg->dtype), false,
                                 plan_library_arena_bytes(PLAN_GPU_LIBRARY_WORKSPACE)};
        shape_plan(m, &gpu, cfg->micro_batch, cfg->data.seq_len, interval, p->bytes);
        /* token ids, targets and losses pass through pinned host memory */
        const size_t BT = (size_t)cfg->micro_batch * (size_t)cfg->data.seq_len;
        p->bytes[BUF_STAGING] += 2 * arena_round(BT * sizeof(int32_t)) + fp32_bytes(BT);
    } else if (m->cfg.tied_head) {
        gpt2_plan(m, cfg->micro_batch, cfg->data.seq_len, interval, p->bytes);
    } else {
        size_t att = plan_attention_scratch(cfg->data.seq_len, m->cfg.n_head), ln = plan_layernorm_scratch(m->cfg.n_embd);
        struct act_layout cpu = {sizeof(float), true, (att > ln ? att : ln) * sizeof(float)};
        shape_plan(m, &cpu, cfg->micro_batch, cfg->data.seq_len, interval, p->bytes);
    }
    gpt2_free_passes(&passes[0], &passes[1]);
    for (int c = 0; c < BUF_COUNT; c++) {
        p->space[c] = plan_space(cfg, c);
        /* the config's size bounds keep every buffer far below 2^64 bytes */
        if (__builtin_add_overflow(p->space_total[p->space[c]], p->bytes[c], &p->space_total[p->space[c]]))
            fail_internal("memory plan: the %s total wraps at 2^64 bytes", arena_class_name(c));
    }
}

void plan_compute(struct mem_plan *p, const struct model *m, const struct config *cfg, int world)
{
    plan_compute_for(p, m, cfg, world, PLAN_TARGET_CPU);
}

/* ---- traffic -------------------------------------------------------------------- */

void plan_traffic(const struct model *m, const struct config *cfg, int world, int accum, double bytes[COMM_KINDS])
{
    memset(bytes, 0, COMM_KINDS * sizeof *bytes);
    const double N = world, esize = dtype_size(cfg->dtype);
    const int stage = cfg->zero.stage;
    for (int u = 0; u < m->n_units; u++) {
        const size_t numel = m->units[u].numel;
        const double padded = (double)round_up(numel, (size_t)world * MODEL_TENSOR_ALIGN), shard = padded / N;
        const bool sharded = stage == 3 &&
                             (cfg->zero.offload_param || (double)numel > cfg->zero.stage3_param_persistence_threshold);
        if (stage <= 1) /* all-reduce of the gradients at the boundary: 2 (N-1)/N of the buffer */
            bytes[COMM_ALLREDUCE] += floor(2.0 * (N - 1) * padded * esize / N);
        if (stage == 1 || (stage >= 2 && !sharded)) /* the updated slices gathered after the step */
            bytes[COMM_ALLGATHER] += (N - 1) * shard * esize;
        if (stage >= 2)
            bytes[COMM_REDUCE_SCATTER] += accum * (N - 1) * shard * esize;
        if (sharded) /* gathered for forward and again for backward, every micro-batch */
            bytes[COMM_ALLGATHER] += 2.0 * accum * (N - 1) * shard * esize;
    }
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
    size_t need = 0, avail = host_available();
    for (int s = 0; s < SPACE_COUNT; s++)
        need += p->space_total[s];
    if (!avail || need <= avail)
        return;
    char a[32], b[32], items[256];
    largest_items(p, SPACE_DEVICE, items, sizeof items);
    fail_input("the plan needs %s of host memory per rank, more than the %s available on this node; largest: %s. "
               "Hint: a smaller model, train_micro_batch_size_per_gpu or data.seq_len, more ranks with "
               "zero_optimization.stage 3, or activation_checkpointing shrink it (`shardlm plan` shows the effect)",
               plan_format_bytes((double)need, a, sizeof a), plan_format_bytes((double)avail, b, sizeof b), items);
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
