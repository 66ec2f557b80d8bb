#include "plan_cli.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "core/quant4.h"
#include "model/arch.h"
#include "model/model.h"
#include "engine/plan.h"
#include "run/run_config.h"
#include "core/util.h"

#define MAX_SETS 256
/* The fit search tries micro-batches up to this many sequences per rank. */
#define FIT_MAX_MICRO 1024
/* --nvme-bw's default: 2 GB/s of disk per node, shared by its ranks (one
 * PCIe 3 NVMe drive's sustained mixed read + write, or a modest RAID). */
#define NVME_BW_DEFAULT 2e9

struct plan_options {
    int ranks, nodes;
    double gpu_mem, host_mem;    /* bytes per GPU, per node; 0: not given */
    enum plan_target target;
    int fit;
    int max_seq;                  /* --max-seq: the longest sequence that fits */
    int json;                     /* also one JSON line with the exact numbers */
    double nvme_bw;               /* bytes per second of NVMe per node, shared by its ranks */
    int rank_batch;               /* train_batch_size / ranks when the config gives train_batch_size, else 0:
                                   * --fit keeps that batch, its micro-batch a divisor of it */
};

/* One candidate setting: the plan and its sums. */
struct plan_eval {
    struct mem_plan plan;
    double device;                /* bytes per rank on the device */
    double host_per_node;         /* pinned + ordinary host, all ranks of a node */
};

static void usage_plan(FILE *out)
{
    fprintf(out,
            "usage: shardlm plan [CONFIG] [options]\n"
            "\n"
            "Prints the memory plan of one rank for the model and settings of CONFIG (or of a preset)\n"
            "without running: device and pinned host memory per buffer, host memory per node,\n"
            "communication per step and model FLOPs per token.\n"
            "\n"
            "options:\n"
            "  --preset NAME        model shape (model.preset): %s\n"
            "  --set KEY.PATH=VALUE override a config key (repeatable), as for train\n"
            "  --deepspeed FILE     merge a DeepSpeed JSON config\n"
            "  --ranks N            world size: GPUs in all (default 1)\n"
            "  --nodes M            nodes the ranks are spread over (default 1; host memory is per node)\n"
            "  --gpu-mem SIZE       memory of one GPU, e.g. 80GB (10^9), 80GiB (2^30), 8e10\n"
            "  --host-mem SIZE      host memory of one node for pinned and ordinary buffers, e.g. 1TiB\n"
            "  --target gpu|cuda|cpu  gpu (default): the CUDA engine's target layout (DESIGN section 5:\n"
            "                       fused attention, gradient buffers in the parameter dtype), any model;\n"
            "                       cuda: what bin/shardlm-cuda allocates today (GPT-2 models);\n"
            "                       cpu: what this CPU build's trainer allocates (fp32 compute)\n"
            "  --fit                search micro-batch, activation checkpointing, cpu_checkpointing and\n"
            "                       offload for the most tokens per step within --gpu-mem (and --host-mem);\n"
            "                       where a section's nvme_path is set, its state may go to NVMe (optimizer\n"
            "                       first, then parameters) when host memory is short\n"
            "  --max-seq            the longest data.seq_len (up to model.n_positions) that fits within\n"
            "                       --gpu-mem (and --host-mem) at the micro-batch of CONFIG (default 1), with\n"
            "                       the checkpointing and offload settings --fit would choose there\n"
            "  --nvme-bw BW         disk bandwidth of one node for offload to NVMe, shared by its ranks, e.g.\n"
            "                       6GB/s (10^9 bytes per second) or 6e9 (default 2GB/s, a conservative\n"
            "                       figure): the optimizer phase's expected seconds\n"
            "  --json               end with one JSON line: bytes per buffer class and space, traffic, FLOPs\n"
            "  -h, --help           this text\n"
            "\n"
            "Without a micro-batch in CONFIG the plan uses 1 sequence of data.seq_len tokens per rank.\n"
            "exit status: 0 fits (or no memory given); 2 bad input; %d does not fit\n",
            arch_preset_names(), EXIT_PLAN_DOES_NOT_FIT);
}

static double parse_size_option(const char *option, const char *text)
{
    double bytes;
    const char *why;
    if (plan_parse_bytes(text, &bytes, &why) != 0)
        fail_input("--%s '%s': %s; give a size such as 80GB (10^9 bytes), 80GiB (2^30) or 8e10", option, text, why);
    return bytes;
}

/* --nvme-bw: a size per second ("6GB/s", "6GB", "6e9"). */
static double parse_bw_option(const char *text)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%s", text);
    size_t len = strlen(buf);
    if (len > 2 && (strcmp(buf + len - 2, "/s") == 0 || strcmp(buf + len - 2, "/S") == 0))
        buf[len - 2] = 0;
    double bytes;
    const char *why;
    if (strlen(text) >= sizeof buf || plan_parse_bytes(buf, &bytes, &why) != 0)
        fail_input("--nvme-bw '%s': %s; give the disk bandwidth of one node, e.g. 6GB/s (10^9 bytes per second) or "
                   "6e9", text, strlen(text) >= sizeof buf ? "too long" : why);
    return bytes;
}

static int parse_count_option(const char *option, const char *text)
{
    char *end;
    long v = strtol(text, &end, 10);
    if (end == text || *end || v < 1 || v > 1000000)
        fail_input("--%s '%s': give a whole number from 1 to 1000000", option, text);
    return (int)v;
}

/* ---- evaluation --------------------------------------------------------------- */

static void evaluate(struct plan_eval *e, const struct model *m, const struct config *cfg,
                     const struct plan_options *o)
{
    plan_compute_for(&e->plan, m, cfg, o->ranks, o->target);
    e->device = (double)e->plan.space_total[SPACE_DEVICE];
    e->host_per_node = (double)plan_host_bytes(&e->plan) * (double)(o->ranks / o->nodes);
}

static bool fits(const struct plan_eval *e, const struct plan_options *o)
{
    return (o->gpu_mem <= 0 || e->device <= o->gpu_mem) && (o->host_mem <= 0 || e->host_per_node <= o->host_mem);
}

static const char *gib(double bytes, char *buf, size_t n) { return format_bytes(bytes, buf, n); }

/* ---- printing ----------------------------------------------------------------- */

/* The names of DESIGN §2 / issue 8 for each buffer class. */
static const char *class_label(enum buf_class c, enum mem_space s)
{
    switch (c) {
    case BUF_PARAMS: return "parameter shard";
    case BUF_GRADS: return "gradient shard";
    case BUF_GATHERED: return "gathered units in flight";
    case BUF_GRAD_BUFFERS: return "gradient buffers";
    case BUF_GRAD_SEND: return "gradient send buffers";
    case BUF_COMPUTE_COPIES: return "fp32 compute copies";
    case BUF_MASTER: return "master weights (fp32)";
    case BUF_ADAM_M: return "Adam m";
    case BUF_ADAM_V: return "Adam v";
    case BUF_FP32_GRADS: return "fp32 gradient shard";
    case BUF_ACT_CKPT: return s == SPACE_DEVICE ? "activation checkpoints" : "offloaded checkpoints";
    case BUF_ACTIVATIONS: return "working activations";
    case BUF_LOGITS: return "logits and loss buffers";
    case BUF_WORKSPACE: return "library workspace";
    case BUF_STAGING: return "staging (token ids, losses)";
    case BUF_COUNT: break;
    }
    return "?";
}

static void print_model(const struct model *m)
{
    const struct model_config *c = &m->cfg;
    char kv[128] = "";
    int at = 0;
    if (c->n_kv_head != c->n_head)
        at += snprintf(kv + at, sizeof kv - at, ", %d KV heads", c->n_kv_head);
    if (c->head_dim * c->n_head != c->n_embd)
        at += snprintf(kv + at, sizeof kv - at, " of %d", c->head_dim);
    if (c->qkv_bias)
        at += snprintf(kv + at, sizeof kv - at, ", q|k|v biases");
    if (c->qk_norm)
        at += snprintf(kv + at, sizeof kv - at, ", q/k norms");
    int sliding = 0;
    for (int l = 0; l < c->n_layer; l++)
        sliding += model_attention_sliding(&c->attention, l);
    if (sliding) /* a generation's cache keeps the window only on those layers (family_kv_plan) */
        snprintf(kv + at, sizeof kv - at, ", window %d on %d layers", c->attention.window, sliding);
    printf("model: %s%s%s%s, %d layers, d_model %d, %d heads%s, FFN %d (%s), vocab %d (padded %d), context %d, %s "
           "head: %zu parameters (%.2f B)\n",
           c->preset[0] ? c->preset : "", c->preset[0] ? " (" : "", c->type, c->preset[0] ? ")" : "", c->n_layer,
           c->n_embd, c->n_head, kv, c->ffn_dim, c->mlp == MLP_SWIGLU ? "SwiGLU" : c->mlp == MLP_GEGLU ? "GeGLU" : "GELU", c->vocab_size,
           c->padded_vocab, c->n_positions, c->tied_head ? "tied" : "untied", m->n_params, (double)m->n_params / 1e9);
    if (m->lora.on)
        printf("LoRA: r %d, alpha / r %g, %d adapted layers, %zu adapter parameters\n", m->lora.r, m->lora.scale,
               m->lora.n_adapted, model_adapter_params(m));
    if (model_frozen_params(m))
        printf("frozen: %zu parameters (no gradients, master weights or Adam state)\n", model_frozen_params(m));
}

static const char *offload_device(bool on, bool nvme) { return nvme ? "nvme" : on ? "cpu" : "none"; }

static void print_settings(const struct config *cfg, const struct plan_options *o)
{
    int interval = plan_ckpt_interval(cfg);
    char ckpt[96];
    if (interval)
        snprintf(ckpt, sizeof ckpt, "activation checkpointing every %d block%s%s", interval, interval > 1 ? "s" : "",
                 cfg->act_ckpt.cpu_checkpointing ? " (cpu_checkpointing)" : "");
    else
        snprintf(ckpt, sizeof ckpt, "no activation checkpointing");
    printf("settings: %s target, %d rank%s on %d node%s, %s, ZeRO stage %d, offload_optimizer %s, offload_param %s, "
           "%s, micro-batch %d x %d tokens, accumulation %d\n",
           o->target == PLAN_TARGET_GPU ? "GPU" : o->target == PLAN_TARGET_CUDA ? "CUDA-build" : "CPU-backend", o->ranks, o->ranks > 1 ? "s" : "", o->nodes,
           o->nodes > 1 ? "s" : "", dtype_name(cfg->dtype), cfg->zero.stage,
           offload_device(cfg->zero.offload_optimizer, cfg->zero.offload_optimizer_nvme),
           offload_device(cfg->zero.offload_param, cfg->zero.offload_param_nvme && cfg->zero.stage == 3), ckpt,
           cfg->micro_batch, cfg->data.seq_len, cfg->grad_accum);
}

/* DPO (issue 37): what the reference costs. The plan (plan_compute_for) already counts a micro-batch of B pairs
 * as 2B rows; the reference adds no parameters: LoRA runs the base with the adapters off, one evaluation forward
 * of the same rows before the policy's, in the same working buffers (it keeps no activations: the policy's forward
 * writes them afterwards); a full fine-tune computes the reference log-probs once before step 1 (16 B a sample,
 * a file beside the preference file). */
static void print_dpo(const struct plan_eval *e, const struct model *m, const struct config *cfg)
{
    if (!cfg->dpo.enabled)
        return;
    const struct mem_plan *p = &e->plan;
    char a[32], b[32];
    printf("DPO: micro-batch %d pair%s = %d rows (chosen, rejected) x %d tokens, planned as %d rows; reference "
           "weights: 0 B (the reference costs no parameters: %s)\n",
           cfg->micro_batch, cfg->micro_batch > 1 ? "s" : "", 2 * cfg->micro_batch, cfg->data.seq_len,
           2 * cfg->micro_batch,
           cfg->dpo.precompute_ref_log_probs
               ? "its log-probs are precomputed before step 1 with the initial weights, 16 B a sample in a file "
                 "beside the preference file"
               : "LoRA's base with the adapters off");
    if (!cfg->dpo.precompute_ref_log_probs)
        printf("DPO reference forward (LoRA): one evaluation forward of the same %d rows per micro-batch, before the "
               "policy's, in the same buffers: 0 B more; the working-activation peak stays %s (activation "
               "checkpoints %s); it gathers the units once more (in the communication below)\n",
               2 * cfg->micro_batch, gib((double)p->bytes[BUF_ACTIVATIONS], a, sizeof a),
               gib((double)p->bytes[BUF_ACT_CKPT], b, sizeof b));
    else
        printf("DPO reference pass (before step 1): evaluation forwards of the initial weights in the same buffers: "
               "0 B more%s\n", m->lora.on ? " (LoRA with dpo.precompute_ref_log_probs)" : "");
}

static double model_states(const struct mem_plan *p)
{
    static const enum buf_class states[] = {BUF_PARAMS, BUF_GRADS, BUF_MASTER, BUF_ADAM_M, BUF_ADAM_V,
                                            BUF_FP32_GRADS};
    double sum = (double)p->nvme.opt_file + (double)p->nvme.param_file; /* the states in files */
    for (size_t i = 0; i < sizeof states / sizeof states[0]; i++)
        sum += (double)p->bytes[states[i]];
    return sum;
}

/* Offload to NVMe: the seconds one rank's file traffic per optimizer step
 * takes at its share of --nvme-bw (the node's ranks share the disk): the
 * optimizer phase (the optimizer file read and written, the trained
 * parameter shards written back) and the passes' parameter reads. */
static void nvme_seconds(const struct plan_nvme *nv, const struct plan_options *o, double *opt_s, double *read_s)
{
    const double bw = o->nvme_bw / (double)(o->ranks / o->nodes);
    *opt_s = (nv->opt_read + nv->opt_written + nv->param_written) / bw;
    *read_s = nv->param_read / bw;
}

static void print_row(const char *label, double bytes)
{
    char a[32];
    printf("    %-28s %14s %20.0f B\n", label, gib(bytes, a, sizeof a), bytes);
}

/* The nvme space: the rows the files hold, the traffic per step, the time at --nvme-bw. */
static void print_nvme(const struct mem_plan *p, const struct config *cfg, const struct plan_options *o)
{
    const struct plan_nvme *nv = &p->nvme;
    if (!nv->opt_file && !nv->param_file)
        return;
    char a[32], b[32], c[32];
    printf("  nvme (files on disk)\n");
    if (nv->opt_file) { /* [master | m | v] per piece: a third each */
        print_row("master weights (fp32)", (double)nv->opt_file / 3);
        print_row("Adam m", (double)nv->opt_file / 3);
        print_row("Adam v", (double)nv->opt_file / 3);
    }
    if (nv->param_file)
        print_row("parameter shard", (double)nv->param_file);
    print_row("total", (double)(nv->opt_file + nv->param_file));
    const int per_node = o->ranks / o->nodes;
    double opt_s, read_s;
    nvme_seconds(nv, o, &opt_s, &read_s);
    if (nv->opt_file)
        printf("nvme optimizer file: %zu elements in pieces of %zu, %zu B (%s); %zu B of pinned buffers (%s)\n",
               nv->opt_elems, nv->opt_piece, nv->opt_file, gib((double)nv->opt_file, a, sizeof a), nv->opt_buffers,
               gib((double)nv->opt_buffers, b, sizeof b));
    if (nv->param_file)
        printf("nvme parameter file: %zu B (%s); %d buffers of the largest unit shard, %zu B: %zu B pinned (%s)\n",
               nv->param_file, gib((double)nv->param_file, a, sizeof a), (int)(nv->param_buffers / nv->param_unit),
               nv->param_unit, nv->param_buffers, gib((double)nv->param_buffers, b, sizeof b));
    if (nv->param_file && (double)nv->param_unit_elems > cfg->zero.param_buffer_size)
        printf("nvme: offload_param.buffer_size %.0f elements is below the largest unit shard, %zu elements: set "
               "zero_optimization.offload_param.buffer_size to at least %zu (the trainer refuses less)\n",
               cfg->zero.param_buffer_size, nv->param_unit_elems, nv->param_unit_elems);
    printf("nvme per step per rank: read %.0f B, written %.0f B (%s, %s); disk per node (%d ranks): %s\n",
           nv->opt_read + nv->param_read, nv->opt_written + nv->param_written,
           gib(nv->opt_read + nv->param_read, a, sizeof a), gib(nv->opt_written + nv->param_written, b, sizeof b),
           per_node, gib((double)(nv->opt_file + nv->param_file) * per_node, c, sizeof c));
    printf("nvme at --nvme-bw %.3g GB/s per node (%.3g GB/s per rank): optimizer phase %.1f s per step",
           o->nvme_bw / 1e9, o->nvme_bw / 1e9 / per_node, opt_s);
    if (nv->param_file)
        printf(", parameter reads of the passes %.1f s per step", read_s);
    printf("\n");
}

static void print_plan(const struct plan_eval *e, const struct model *m, const struct config *cfg,
                       const struct plan_options *o)
{
    const struct mem_plan *p = &e->plan;
    char a[32], b[32];
    printf("per rank:\n");
    for (int s = 0; s < SPACE_COUNT; s++) {
        if (s == SPACE_HOST && p->space_total[s] == 0)
            continue;
        printf("  %s\n", mem_space_name(s));
        for (int c = 0; c < BUF_COUNT; c++) {
            if (p->space[c] != (enum mem_space)s)
                continue;
            if (p->bytes[c] == 0 && (s != SPACE_DEVICE || c == BUF_GRAD_SEND || c == BUF_COMPUTE_COPIES ||
                                     c == BUF_MASTER || c == BUF_FP32_GRADS))
                continue;
            printf("    %-28s %14s %20zu B\n", class_label(c, s), gib((double)p->bytes[c], a, sizeof a), p->bytes[c]);
        }
        size_t total = p->space_total[s];
        if (s == SPACE_PINNED) { /* the buffers that stream the NVMe files */
            if (p->nvme.opt_buffers)
                print_row("NVMe buffers (optimizer)", (double)p->nvme.opt_buffers);
            if (p->nvme.param_buffers)
                print_row("NVMe buffers (parameters)", (double)p->nvme.param_buffers);
            total += p->nvme.opt_buffers + p->nvme.param_buffers;
        }
        printf("    %-28s %14s %20zu B\n", "total", gib((double)total, a, sizeof a), total);
    }
    print_nvme(p, cfg, o);
    double states = model_states(p);
    printf("model states per rank (parameters, gradients, master weights, Adam m and v, all spaces%s): %s (%.2f GB)\n",
           p->nvme.opt_file || p->nvme.param_file ? " and files" : "", gib(states, a, sizeof a), states / 1e9);
    printf("host memory per node (%d ranks): %s pinned + ordinary\n", o->ranks / o->nodes,
           gib(e->host_per_node, b, sizeof b));
    double traffic[COMM_KINDS];
    plan_traffic(m, cfg, o->ranks, cfg->grad_accum, traffic);
    double total = traffic[COMM_ALLGATHER] + traffic[COMM_REDUCE_SCATTER] + traffic[COMM_ALLREDUCE];
    printf("communication per step per rank: %.0f B (%s): all-gather %.0f, reduce-scatter %.0f, all-reduce %.0f\n",
           total, gib(total, a, sizeof a), traffic[COMM_ALLGATHER], traffic[COMM_REDUCE_SCATTER],
           traffic[COMM_ALLREDUCE]);
    double flops = model_flops_per_token(m, cfg->data.seq_len);
    double tokens = (double)cfg->micro_batch * (cfg->dpo.enabled ? 2 : 1) * cfg->data.seq_len * cfg->grad_accum *
                    o->ranks;
    printf("model FLOPs per token: %.4g (6 N_matmul + 12 L d_model T, PaLM appendix B); per step (%.0f tokens): "
           "%.4g\n",
           flops, tokens, flops * tokens);
}

/* One line for scripts and tests: the exact numbers, buffer classes under the
 * names of the trainer's metrics file. */
static void print_json(const struct plan_eval *e, const struct model *m, const struct config *cfg,
                       const struct plan_options *o)
{
    const struct mem_plan *p = &e->plan;
    double traffic[COMM_KINDS];
    plan_traffic(m, cfg, o->ranks, cfg->grad_accum, traffic);
    printf("{\"n_params\": %zu, \"flops_per_token\": %.17g, \"ranks\": %d, \"micro_batch\": %d, \"seq_len\": %d, "
           "\"memory\": {",
           m->n_params, model_flops_per_token(m, cfg->data.seq_len), o->ranks, cfg->micro_batch, cfg->data.seq_len);
    for (int c = 0; c < BUF_COUNT; c++)
        printf("%s\"%s\": {\"space\": \"%s\", \"bytes\": %zu}", c ? ", " : "", arena_class_name(c),
               mem_space_name(p->space[c]), p->bytes[c]);
    printf("}, \"space_total\": {");
    for (int s = 0; s < SPACE_COUNT; s++)
        printf("%s\"%s\": %zu", s ? ", " : "", mem_space_name(s), p->space_total[s]);
    const struct plan_nvme *nv = &p->nvme;
    double opt_s, read_s;
    nvme_seconds(nv, o, &opt_s, &read_s);
    /* nvme: the files (their rows: what the arenas no longer hold), the buffers (pinned host, outside the arenas
     * the space totals above size), the traffic and time per step */
    printf(", \"nvme\": %zu}, \"nvme\": {\"memory\": {\"%s\": %.0f, \"%s\": %.0f, \"%s\": %.0f, \"%s\": %zu}, "
           "\"optimizer_elems\": %zu, \"optimizer_piece\": %zu, \"optimizer_file\": %zu, \"optimizer_buffers\": %zu, "
           "\"param_file\": %zu, \"param_unit\": %zu, \"param_buffers\": %zu, \"read_per_step\": %.0f, "
           "\"written_per_step\": %.0f, \"param_read_per_step\": %.0f, \"param_written_per_step\": %.0f, "
           "\"disk_per_node\": %.0f, \"bandwidth_per_node\": %.17g, \"optimizer_seconds\": %.17g, "
           "\"param_read_seconds\": %.17g",
           nv->opt_file + nv->param_file, arena_class_name(BUF_MASTER), (double)nv->opt_file / 3,
           arena_class_name(BUF_ADAM_M), (double)nv->opt_file / 3, arena_class_name(BUF_ADAM_V),
           (double)nv->opt_file / 3, arena_class_name(BUF_PARAMS), nv->param_file, nv->opt_elems, nv->opt_piece,
           nv->opt_file, nv->opt_buffers, nv->param_file, nv->param_unit, nv->param_buffers,
           nv->opt_read + nv->param_read, nv->opt_written + nv->param_written, nv->param_read, nv->param_written,
           (double)(nv->opt_file + nv->param_file) * (o->ranks / o->nodes), o->nvme_bw, opt_s, read_s);
    if (cfg->dpo.enabled)
        printf("}, \"dpo\": {\"rows_per_micro_batch\": %d, \"reference\": \"%s\", \"reference_param_bytes\": 0, "
               "\"reference_extra_activation_bytes\": 0",
               2 * cfg->micro_batch, cfg->dpo.precompute_ref_log_probs ? "precomputed" : "adapters_off");
    printf("}, \"model_states\": %.0f, \"host_per_node\": %.0f, \"bytes_allgather\": %.0f, "
           "\"bytes_reduce_scatter\": %.0f, \"bytes_allreduce\": %.0f, \"fits\": %s}\n",
           model_states(p), e->host_per_node, traffic[COMM_ALLGATHER], traffic[COMM_REDUCE_SCATTER],
           traffic[COMM_ALLREDUCE], o->gpu_mem <= 0 && o->host_mem <= 0 ? "null" : fits(e, o) ? "true" : "false");
}

/* ---- settings the search and the hints change ------------------------------------ */

struct setting {
    int micro, interval;        /* interval 0: no activation checkpointing */
    bool cpu_ckpt, offload_optimizer, offload_param;
    int stage;
    bool optimizer_nvme, param_nvme; /* the offloaded state in files under nvme_path (with offload_*) */
};

/* Whether --fit may put a section's state on NVMe: its nvme_path is set. */
static bool nvme_allowed(const char *path) { return path && *path; }

static struct setting current_setting(const struct config *cfg)
{
    struct setting s = {
        .micro = cfg->micro_batch,
        .interval = plan_ckpt_interval(cfg),
        .cpu_ckpt = cfg->act_ckpt.enabled && cfg->act_ckpt.cpu_checkpointing,
        .offload_optimizer = cfg->zero.offload_optimizer,
        .offload_param = cfg->zero.offload_param,
        .stage = cfg->zero.stage,
        .optimizer_nvme = cfg->zero.offload_optimizer_nvme,
        .param_nvme = cfg->zero.offload_param_nvme,
    };
    return s;
}

static void apply_setting(struct config *cfg, const struct setting *s)
{
    cfg->micro_batch = s->micro;
    cfg->act_ckpt.enabled = s->interval > 0;
    cfg->act_ckpt.interval = s->interval > 0 ? s->interval : 1;
    cfg->act_ckpt.cpu_checkpointing = s->interval > 0 && s->cpu_ckpt;
    cfg->zero.offload_optimizer = s->offload_optimizer;
    cfg->zero.offload_param = s->offload_param;
    cfg->zero.offload_optimizer_nvme = s->offload_optimizer && s->optimizer_nvme;
    cfg->zero.offload_param_nvme = s->offload_param && s->param_nvme;
    cfg->zero.stage = s->stage;
}

static void print_setting_keys(const struct setting *s, const struct setting *was, const struct plan_options *o)
{
    printf("  --set train_micro_batch_size_per_gpu=%d\n", s->micro);
    if (o->rank_batch > 0) /* train_batch_size stays: the accumulation makes up the rest */
        printf("  --set gradient_accumulation_steps=%d\n", o->rank_batch / s->micro);
    if (s->stage != was->stage)
        printf("  --set zero_optimization.stage=%d\n", s->stage);
    printf("  --set activation_checkpointing.enabled=%s\n", s->interval > 0 ? "true" : "false");
    if (s->interval > 0) {
        printf("  --set activation_checkpointing.interval=%d\n", s->interval);
        printf("  --set activation_checkpointing.cpu_checkpointing=%s\n", s->cpu_ckpt ? "true" : "false");
    }
    if (s->stage >= 1)
        printf("  --set zero_optimization.offload_optimizer.device=%s\n",
               offload_device(s->offload_optimizer, s->optimizer_nvme));
    if (s->stage == 3)
        printf("  --set zero_optimization.offload_param.device=%s\n", offload_device(s->offload_param, s->param_nvme));
}

/* Lexicographic preference among settings that fit with the same tokens: no
 * state on NVMe (parameters, then the optimizer: a disk is slower than
 * PCIe), then the fewest transfers over PCIe (offload_param, then optimizer
 * offload, then cpu_checkpointing), then no recomputation, then the least
 * device memory. */
static int cost_rank(const struct setting *s)
{
    return (s->param_nvme ? 32 : 0) + (s->optimizer_nvme ? 16 : 0) + (s->offload_param ? 8 : 0) +
           (s->offload_optimizer ? 4 : 0) + (s->cpu_ckpt ? 2 : 0) + (s->interval ? 1 : 0);
}

/* The largest micro-batch in [1, FIT_MAX_MICRO] that fits with the other
 * settings of s (memory grows with the micro-batch), 0 when even 1 does not. */
static int largest_micro(struct config *cfg, const struct model *m, const struct plan_options *o, struct setting s,
                         struct plan_eval *e)
{
    int lo = 0, hi = FIT_MAX_MICRO;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        s.micro = mid;
        apply_setting(cfg, &s);
        evaluate(e, m, cfg, o);
        if (fits(e, o))
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Checkpoint intervals worth trying: off, powers of two up to L, and L. */
static int candidate_intervals(int L, int out[])
{
    int n = 0;
    out[n++] = 0;
    for (int k = 1; k < L; k *= 2)
        out[n++] = k;
    out[n++] = L;
    return n;
}

/* Searches the settings (micro-batch fixed when fixed_micro > 0); returns
 * whether one fits and writes the best into best. Deterministic: the order of
 * the loops and strict comparisons decide ties. */
static bool fit_search(struct config *cfg, const struct model *m, const struct plan_options *o, int fixed_micro,
                       struct setting *best, double *best_device)
{
    const struct setting was = current_setting(cfg);
    int intervals[40];
    int n_intervals = candidate_intervals(m->cfg.n_layer, intervals);
    bool found = false;
    struct plan_eval *e = xcalloc(1, sizeof *e);
    /* offload of each section: 0 none, 1 cpu, 2 nvme (where its nvme_path is set); the state goes to NVMe only
     * when nothing fits without it: the optimizer first (tier 1), then the parameters too (tier 2) */
    const int max_op = was.stage == 3 ? 1 + nvme_allowed(cfg->zero.param_nvme_path) : 0;
    const int max_oo = was.stage >= 1 ? 1 + nvme_allowed(cfg->zero.optimizer_nvme_path) : 0;
    for (int tier = 0; tier <= 2 && !found; tier++)
        for (int op = 0; op <= max_op; op++)
            for (int oo = 0; oo <= max_oo; oo++) {
                if ((op == 2 ? 2 : oo == 2) != tier)
                    continue;
                for (int i = 0; i < n_intervals; i++)
                    for (int cc = 0; cc <= (intervals[i] > 0); cc++) {
                        struct setting s = {fixed_micro, intervals[i], cc, oo > 0, op > 0, was.stage, oo == 2,
                                            op == 2};
                        if (fixed_micro > 0) {
                            apply_setting(cfg, &s);
                            evaluate(e, m, cfg, o);
                            if (!fits(e, o))
                                continue;
                        } else {
                            s.micro = largest_micro(cfg, m, o, s, e);
                            while (o->rank_batch > 0 && s.micro > 0 && o->rank_batch % s.micro)
                                s.micro--; /* a divisor of the given batch: smaller fits too */
                            if (s.micro == 0)
                                continue;
                            apply_setting(cfg, &s);
                            evaluate(e, m, cfg, o);
                        }
                        bool better = !found || s.micro > best->micro ||
                                      (s.micro == best->micro && (cost_rank(&s) < cost_rank(best) ||
                                                                  (cost_rank(&s) == cost_rank(best) &&
                                                                   e->device < *best_device)));
                        if (better) {
                            *best = s;
                            *best_device = e->device;
                            found = true;
                        }
                    }
            }
    free(e);
    apply_setting(cfg, &was);
    return found;
}

/* One change at a time, cheapest first: a higher stage, checkpointing every
 * block, optimizer offload, checkpoints to the host, parameter offload, a
 * smaller micro-batch. Writes the first that fits, as a key, into hint. */
static bool single_change_hint(struct config *cfg, const struct model *m, const struct plan_options *o, char *hint,
                               size_t n)
{
    const struct setting was = current_setting(cfg);
    struct setting tries[16];
    const char *keys[16];
    char micro_keys[4][64];
    int k = 0;
    for (int st = was.stage + 1; st <= 3; st++) {
        tries[k] = was;
        tries[k].stage = st;
        keys[k++] = st == 1 ? "zero_optimization.stage=1" : st == 2 ? "zero_optimization.stage=2"
                                                                    : "zero_optimization.stage=3";
    }
    if (!was.interval) {
        tries[k] = was;
        tries[k].interval = 1;
        keys[k++] = "activation_checkpointing.enabled=true";
    }
    if (was.stage >= 1 && !was.offload_optimizer) {
        tries[k] = was;
        tries[k].offload_optimizer = true;
        keys[k++] = "zero_optimization.offload_optimizer.device=cpu";
    }
    if (was.interval && !was.cpu_ckpt) {
        tries[k] = was;
        tries[k].cpu_ckpt = true;
        keys[k++] = "activation_checkpointing.cpu_checkpointing=true";
    }
    if (was.stage == 3 && !was.offload_param) {
        tries[k] = was;
        tries[k].offload_param = true;
        keys[k++] = "zero_optimization.offload_param.device=cpu";
    }
    if (was.stage >= 1 && !was.optimizer_nvme && nvme_allowed(cfg->zero.optimizer_nvme_path)) {
        tries[k] = was;
        tries[k].offload_optimizer = tries[k].optimizer_nvme = true;
        keys[k++] = "zero_optimization.offload_optimizer.device=nvme";
    }
    if (was.stage == 3 && !was.param_nvme && nvme_allowed(cfg->zero.param_nvme_path)) {
        tries[k] = was;
        tries[k].offload_param = tries[k].param_nvme = true;
        keys[k++] = "zero_optimization.offload_param.device=nvme";
    }
    for (int micro = was.micro / 2, i = 0; micro >= 1 && i < 4; micro /= 2, i++) {
        tries[k] = was;
        tries[k].micro = micro;
        snprintf(micro_keys[i], sizeof micro_keys[i], "train_micro_batch_size_per_gpu=%d", micro);
        keys[k++] = micro_keys[i];
    }
    bool found = false;
    struct plan_eval *e = xcalloc(1, sizeof *e);
    char a[32];
    for (int i = 0; i < k && !found; i++) {
        apply_setting(cfg, &tries[i]);
        evaluate(e, m, cfg, o);
        if (fits(e, o)) {
            snprintf(hint, n, "try %s (%s per GPU, %s host per node)", keys[i], gib(e->device, a, sizeof a),
                     format_bytes(e->host_per_node, (char[32]){0}, 32));
            found = true;
        }
    }
    free(e);
    apply_setting(cfg, &was);
    return found;
}

/* Prints the verdict; returns the exit status. */
static int report_fit(const struct plan_eval *e, struct config *cfg, const struct model *m,
                      const struct plan_options *o)
{
    char a[32], b[32], c[32];
    if (o->gpu_mem <= 0 && o->host_mem <= 0)
        return EXIT_OK;
    if (fits(e, o)) {
        printf("fits: %s per GPU%s%s, %s host memory per node%s%s\n", gib(e->device, a, sizeof a),
               o->gpu_mem > 0 ? " of " : " (no --gpu-mem)", o->gpu_mem > 0 ? gib(o->gpu_mem, b, sizeof b) : "",
               gib(e->host_per_node, c, sizeof c), o->host_mem > 0 ? " of " : " (no --host-mem)",
               o->host_mem > 0 ? format_bytes(o->host_mem, (char[32]){0}, 32) : "");
        return EXIT_OK;
    }
    char over[160] = "";
    size_t used = 0;
    if (o->gpu_mem > 0 && e->device > o->gpu_mem)
        used += (size_t)snprintf(over + used, sizeof over - used, "needs %s per GPU, %s over %s",
                                 gib(e->device, a, sizeof a), gib(e->device - o->gpu_mem, b, sizeof b),
                                 gib(o->gpu_mem, c, sizeof c));
    if (o->host_mem > 0 && e->host_per_node > o->host_mem)
        snprintf(over + used, sizeof over - used, "%sneeds %s host memory per node, %s over %s", used ? "; " : "",
                 gib(e->host_per_node, a, sizeof a), gib(e->host_per_node - o->host_mem, b, sizeof b),
                 gib(o->host_mem, c, sizeof c));
    char hint[256];
    if (single_change_hint(cfg, m, o, hint, sizeof hint)) {
        printf("does not fit: %s; %s\n", over, hint);
        return EXIT_PLAN_DOES_NOT_FIT;
    }
    /* the lowest stage at which some combination fits this micro-batch, else any micro-batch */
    struct setting best, was = current_setting(cfg);
    double best_device = 0;
    bool found = false;
    for (int fixed = 0; fixed < 2 && !found; fixed++)
        for (int stage = was.stage; stage <= 3 && !found; stage++) {
            cfg->zero.stage = stage;
            found = fit_search(cfg, m, o, fixed == 0 ? was.micro : 0, &best, &best_device);
        }
    cfg->zero.stage = was.stage;
    if (found) {
        printf("does not fit: %s; no single setting is enough; this combination fits (%s per GPU):\n", over,
               gib(best_device, a, sizeof a));
        print_setting_keys(&best, &was, o);
    } else {
        printf("does not fit: %s; no stage, micro-batch, checkpointing or offload setting fits on %d rank%s: use "
               "more ranks (--ranks), half precision, or GPUs with more memory\n",
               over, o->ranks, o->ranks > 1 ? "s" : "");
    }
    return EXIT_PLAN_DOES_NOT_FIT;
}

static int run_fit(struct config *cfg, const struct model *m, const struct plan_options *o)
{
    if (o->gpu_mem <= 0)
        fail_input("--fit needs --gpu-mem (and, to bound the offloaded buffers, --host-mem)");
    struct setting best, was = current_setting(cfg);
    double best_device = 0;
    if (!fit_search(cfg, m, o, 0, &best, &best_device)) {
        char a[32];
        printf("fit: nothing fits in %s per GPU%s at ZeRO stage %d on %d ranks, not even micro-batch 1 with every "
               "offload; use more ranks (--ranks), a higher stage, or GPUs with more memory%s\n",
               gib(o->gpu_mem, a, sizeof a), o->host_mem > 0 ? " and --host-mem" : "", cfg->zero.stage, o->ranks,
               o->host_mem > 0 && cfg->zero.stage >= 1 && !nvme_allowed(cfg->zero.optimizer_nvme_path)
                   ? "; or set zero_optimization.offload_optimizer.nvme_path (and offload_param's) to let --fit "
                     "put the state on NVMe"
                   : "");
        return EXIT_PLAN_DOES_NOT_FIT;
    }
    apply_setting(cfg, &best);
    struct plan_eval *e = xcalloc(1, sizeof *e);
    evaluate(e, m, cfg, o);
    if ((best.optimizer_nvme && !was.optimizer_nvme) || (best.param_nvme && !was.param_nvme)) {
        char a[32], b[32], c[32];
        if (best.optimizer_nvme && !was.optimizer_nvme)
            printf("fit: host memory is short: the optimizer state (master weights, Adam m and v) goes to NVMe "
                   "under '%s' (%s on disk per rank)\n", cfg->zero.optimizer_nvme_path,
                   gib((double)e->plan.nvme.opt_file, a, sizeof a));
        if (best.param_nvme && !was.param_nvme)
            printf("fit: host memory is short: the parameter shard goes to NVMe under '%s' (%s on disk per rank)\n",
                   cfg->zero.param_nvme_path, gib((double)e->plan.nvme.param_file, a, sizeof a));
        printf("fit: host memory per node %s%s%s\n", gib(e->host_per_node, b, sizeof b),
               o->host_mem > 0 ? " of --host-mem " : "", o->host_mem > 0 ? gib(o->host_mem, c, sizeof c) : "");
    }
    const int rows = best.micro * (cfg->dpo.enabled ? 2 : 1);
    printf("fit: micro-batch %d%s x %d tokens x %d ranks = %.0f tokens per micro-step (gradient_accumulation_steps "
           "multiplies it at no memory cost); config keys:\n",
           best.micro, cfg->dpo.enabled ? " pairs (2 rows each)" : "", cfg->data.seq_len, o->ranks,
           (double)rows * cfg->data.seq_len * o->ranks);
    print_setting_keys(&best, &was, o);
    if ((double)e->plan.nvme.param_unit_elems > cfg->zero.param_buffer_size) /* a buffer holds the largest shard */
        printf("  --set zero_optimization.offload_param.buffer_size=%zu\n", e->plan.nvme.param_unit_elems);
    free(e);
    return EXIT_OK;
}

/* --max-seq: memory grows with the sequence (the activations, the logits'
 * chunk and the attention's statistics all linearly), so the longest length
 * at which the fit search finds a setting for the config's micro-batch is
 * found by bisection over [1, model.n_positions]. */
static int run_max_seq(struct config *cfg, const struct model *m, const struct plan_options *o)
{
    if (o->gpu_mem <= 0)
        fail_input("--max-seq needs --gpu-mem (and, to bound the offloaded buffers, --host-mem)");
    const int was_T = cfg->data.seq_len, micro = cfg->micro_batch;
    struct setting best, s;
    double device = 0, d;
    int lo = 0, hi = m->cfg.n_positions;
    while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        cfg->data.seq_len = mid;
        if (fit_search(cfg, m, o, micro, &s, &d))
            lo = mid;
        else
            hi = mid - 1;
    }
    char a[32];
    if (lo == 0) {
        cfg->data.seq_len = was_T;
        printf("max-seq: not even 1 token per sequence fits at micro-batch %d in %s per GPU on %d rank%s\n", micro,
               gib(o->gpu_mem, a, sizeof a), o->ranks, o->ranks > 1 ? "s" : "");
        return EXIT_PLAN_DOES_NOT_FIT;
    }
    cfg->data.seq_len = lo;
    fit_search(cfg, m, o, micro, &best, &device);
    struct setting was = current_setting(cfg);
    apply_setting(cfg, &best);
    printf("max-seq: %d tokens per sequence at micro-batch %d (%s per GPU)%s; config keys:\n", lo, micro,
           gib(device, a, sizeof a), lo == m->cfg.n_positions ? ", the model's context (model.n_positions)" : "");
    printf("  --set data.seq_len=%d\n", lo);
    print_setting_keys(&best, &was, o);
    return EXIT_OK;
}

/* ---- the command ------------------------------------------------------------ */

int cmd_plan(int argc, char **argv)
{
    static const struct option opts[] = {
        {"preset", required_argument, NULL, 'p'},   {"set", required_argument, NULL, 's'},
        {"deepspeed", required_argument, NULL, 'd'}, {"ranks", required_argument, NULL, 'n'},
        {"nodes", required_argument, NULL, 'N'},    {"gpu-mem", required_argument, NULL, 'g'},
        {"host-mem", required_argument, NULL, 'H'}, {"target", required_argument, NULL, 't'},
        {"fit", no_argument, NULL, 'f'},            {"help", no_argument, NULL, 'h'},
        {"json", no_argument, NULL, 'j'},          {"max-seq", no_argument, NULL, 'x'},
        {"nvme-bw", required_argument, NULL, 'B'},
        {NULL, 0, NULL, 0},
    };
    struct plan_options o = {1, 1, 0, 0, PLAN_TARGET_GPU, 0, 0, 0, NVME_BW_DEFAULT, 0};
    const char *sets[MAX_SETS + 1];
    int n_sets = 0;
    const char *deepspeed = NULL;
    char preset_set[96];
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'p':
            snprintf(preset_set, sizeof preset_set, "model.preset=%s", optarg);
            sets[n_sets++] = preset_set;
            break;
        case 's':
            if (n_sets == MAX_SETS)
                fail_input("too many --set options (at most %d)", MAX_SETS - 1);
            sets[n_sets++] = optarg;
            break;
        case 'd': deepspeed = optarg; break;
        case 'n': o.ranks = parse_count_option("ranks", optarg); break;
        case 'N': o.nodes = parse_count_option("nodes", optarg); break;
        case 'g': o.gpu_mem = parse_size_option("gpu-mem", optarg); break;
        case 'H': o.host_mem = parse_size_option("host-mem", optarg); break;
        case 't':
            if (strcmp(optarg, "gpu") == 0)
                o.target = PLAN_TARGET_GPU;
            else if (strcmp(optarg, "cpu") == 0)
                o.target = PLAN_TARGET_CPU;
            else if (strcmp(optarg, "cuda") == 0)
                o.target = PLAN_TARGET_CUDA;
            else
                fail_input("--target '%s': known targets: gpu, cuda, cpu", optarg);
            break;
        case 'f': o.fit = 1; break;
        case 'j': o.json = 1; break;
        case 'x': o.max_seq = 1; break;
        case 'B': o.nvme_bw = parse_bw_option(optarg); break;
        case 'h': usage_plan(stdout); return EXIT_OK;
        default: usage_plan(stderr); return EXIT_BAD_INPUT;
        }
    }
    if (argc - optind > 1) {
        fprintf(stderr, "shardlm: error: plan takes at most one CONFIG file; see 'shardlm plan --help'\n");
        return EXIT_BAD_INPUT;
    }
    if (o.ranks % o.nodes != 0)
        fail_input("--ranks %d is not a multiple of --nodes %d: give the same number of ranks on every node", o.ranks,
                   o.nodes);
    struct config cfg;
    if (optind < argc)
        run_config_load(&cfg, argv[optind], deepspeed, sets, n_sets);
    else if (deepspeed)
        run_config_load(&cfg, deepspeed, NULL, sets, n_sets);
    else
        run_config_load_string(&cfg, "{}", sets, n_sets);
    if (cfg.train_batch_size == 0 && cfg.micro_batch == 0)
        cfg.micro_batch = 1;
    const int batch_given = cfg.train_batch_size;
    config_resolve_batch(&cfg, o.ranks);
    o.rank_batch = batch_given > 0 ? cfg.train_batch_size / o.ranks : 0;
    if (cfg.zero.offload_optimizer && cfg.zero.stage == 0)
        fail_input("config: zero_optimization.offload_optimizer needs zero_optimization.stage 1, 2 or 3 (as in "
                   "DeepSpeed); raise the stage or set offload_optimizer.device to \"none\"");
    struct model m;
    model_build(&m, &cfg.model);
    model_add_lora(&m, &cfg.lora);
    const char *freeze = getenv(MODEL_TEST_FREEZE_ENV); /* the trainer's test hook, planned the same way */
    if (freeze && *freeze)
        model_freeze(&m, freeze, MODEL_TEST_FREEZE_ENV);
    print_model(&m);
    int status = EXIT_OK;
    if (o.fit && o.max_seq)
        fail_input("--fit and --max-seq: give one (--max-seq searches the same settings at each length)");
    if (o.fit)
        status = run_fit(&cfg, &m, &o);
    if (o.max_seq)
        status = run_max_seq(&cfg, &m, &o);
    struct plan_eval *e = xcalloc(1, sizeof *e);
    print_settings(&cfg, &o);
    if (cfg.quant.load_in_4bit)
        printf("quantization: the blocks' linear weights in bitsandbytes' %s%s, stored and gathered in 4 bits (packed "
               "codes and %s), dequantized to %s one unit at a time\n",
               quant4_type_name((enum quant4_type)cfg.quant.quant_type),
               cfg.quant.double_quant ? " (double-quantized)" : "",
               cfg.quant.double_quant ? "an 8-bit absmax per 64, an fp32 nested absmax per 256 blocks" : "an fp32 absmax per 64",
               dtype_name(cfg.dtype));
    evaluate(e, &m, &cfg, &o);
    print_dpo(e, &m, &cfg);
    print_plan(e, &m, &cfg, &o);
    if (status == EXIT_OK)
        status = report_fit(e, &cfg, &m, &o);
    if (o.json)
        print_json(e, &m, &cfg, &o);
    free(e);
    model_free(&m);
    config_free(&cfg);
    return status;
}
