/*
 * test_plan — the planner's pieces that need no run: memory sizes as the plan
 * command parses them, the presets' parameter counts against the published
 * totals, Llama's tensor names and shapes, the FLOPs formula, and plan
 * invariants (offload moves bytes between spaces without changing them; the
 * GPU target has no CPU-only buffers); offload to NVMe (issue 36): nvme_sizes
 * against hand-computed sizes, the optimizer file's elements against CPU
 * offload's rows, and the plan's file, buffer and traffic bytes against
 * the file nvme_open makes and nvme_traffic after a step over the whole range;
 * the rows that leave the pinned arena, the parameter file's bounds.
 */
#include "check.h"
#include "config/config.h"
#include "model/arch.h"
#include "model/model.h"
#include "engine/plan.h"
#include "zero/nvme.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The published totals (Hugging Face model cards, safetensors) are exact counts. */
#define PARAM_TOL 0.0

static void test_sizes(void)
{
    static const struct {
        const char *text;
        double want;
    } good[] = {
        {"80GB", 80e9},          {"80GiB", 80.0 * 1073741824.0}, {"8e10", 8e10},    {"1TiB", 1099511627776.0},
        {"1TB", 1e12},           {"512", 512},                    {"24 GB", 24e9},   {"80gib", 80.0 * 1073741824.0},
        {"1.5MiB", 1572864.0},   {"64KiB", 65536},                {"2kB", 2000},     {"100B", 100},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        double v = 0;
        const char *why = NULL;
        char name[64];
        snprintf(name, sizeof name, "size parses: %s", good[i].text);
        CHECK(name, plan_parse_bytes(good[i].text, &v, &why) == 0 && v == good[i].want, "got %.17g (%s), want %.17g",
              v, why ? why : "ok", good[i].want);
    }
    static const struct {
        const char *text;
        const char *why;
    } bad[] = {
        {"80XB", "unknown unit"}, {"-1", "must be positive"}, {"", "empty"},       {"1e400", "too large"},
        {"GB", "not a number"},   {"0", "must be positive"},  {"80 G B", "unknown unit"}, {"nan", "not a number"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        double v = 0;
        const char *why = NULL;
        char name[64];
        snprintf(name, sizeof name, "size rejected: '%s'", bad[i].text);
        CHECK(name, plan_parse_bytes(bad[i].text, &v, &why) == -1 && why && strstr(why, bad[i].why),
              "why: %s", why ? why : "(accepted)");
    }
}

static void preset_model(struct model *m, const struct model_preset *p)
{
    struct model_config mc;
    memset(&mc, 0, sizeof mc);
    snprintf(mc.type, sizeof mc.type, "%s", p->type);
    mc.n_layer = p->n_layer;
    mc.n_head = p->n_head;
    mc.n_kv_head = p->n_kv_head;
    mc.n_embd = p->n_embd;
    mc.ffn_dim = p->ffn_dim;
    mc.n_positions = p->n_positions;
    mc.vocab_size = p->vocab_size;
    mc.head_dim = p->head_dim;
    mc.qkv_bias = p->qkv_bias;
    mc.qk_norm = p->qk_norm;
    mc.window_pattern = p->window_pattern;
    mc.rope_local_theta = p->rope_local_theta;
    mc.tie_embeddings = arch_is(p->type, ARCH_GEMMA); /* the released Gemma models tie (config.c's default for gemma) */
    mc.padded_vocab = (p->vocab_size + 127) / 128 * 128;
    model_build(m, &mc);
}

static void test_presets(void)
{
    for (int i = 0; i < arch_n_presets; i++) {
        const struct model_preset *p = &arch_presets[i];
        struct model m;
        preset_model(&m, p);
        /* the published counts have no vocabulary padding: one (V, C) matrix tied, two untied */
        size_t padding = (size_t)(m.cfg.padded_vocab - m.cfg.vocab_size) * (size_t)m.cfg.n_embd *
                         (m.cfg.tied_head ? 1 : 2);
        char name[80];
        snprintf(name, sizeof name, "preset %s: parameters = published %.5g", p->name, p->published_params);
        CHECK_CLOSE(name, (double)(m.n_params - padding), p->published_params, PARAM_TOL, 1.0);
        model_free(&m);
    }
    struct model m;
    preset_model(&m, arch_find_preset("llama2-70b"));
    CHECK("llama2-70b: exactly 68976648192 parameters", m.n_params == 68976648192ull, "got %zu", m.n_params);
    int u, t;
    bool k = model_find_tensor(&m, "model.layers.79.self_attn.k_proj.weight", &u, &t);
    CHECK("llama2-70b: k_proj (8 KV heads x 128, 8192), (out, in) as Hugging Face stores it",
          k && m.units[u].tensors[t].shape[0] == 1024 && m.units[u].tensors[t].shape[1] == 8192, "found %d", k);
    bool head = model_find_tensor(&m, "lm_head.weight", &u, &t);
    CHECK("llama2-70b: untied lm_head in the head unit", head && u == model_head_unit(&m), "unit %d", u);
    CHECK("llama2-70b: 82 units (embedding, 80 blocks, head), no position table",
          m.n_units == 82 && !model_find_tensor(&m, "wpe.weight", &u, &t), "units %d", m.n_units);
    /* 6 N_matmul + 12 L C T: N_matmul = 80 (2 C^2 + 2 C 1024 + 3 C F) + V C */
    double C = 8192, F = 28672, T = 4096;
    double want = 6.0 * (80.0 * (2 * C * C + 2 * C * 1024 + 3 * C * F) + 32000.0 * C) + 12.0 * 80 * C * T;
    CHECK_CLOSE("llama2-70b: FLOPs per token = 6 N_matmul + 12 L C T", model_flops_per_token(&m, 4096), want, 1e-12,
                1.0);
    model_free(&m);
}

/* Offload moves classes between spaces with their bytes unchanged; the GPU
 * target has no fp32 compute copies or send buffers. */
static void test_plan_invariants(void)
{
    const char *sets_off[] = {"model.preset=llama2-7b", "bf16.enabled=true", "zero_optimization.stage=3",
                              "train_micro_batch_size_per_gpu=1", "zero_optimization.offload_optimizer.device=cpu",
                              "zero_optimization.offload_param.device=cpu"};
    struct config on, off;
    config_load_string(&off, "{}", sets_off, 4);
    config_load_string(&on, "{}", sets_off, 6);
    config_resolve_batch(&off, 1);
    config_resolve_batch(&on, 1);
    struct model m;
    model_build(&m, &off.model);
    struct mem_plan a, b;
    plan_compute_for(&a, &m, &off, 8, PLAN_TARGET_GPU);
    plan_compute_for(&b, &m, &on, 8, PLAN_TARGET_GPU);
    static const enum buf_class moved[] = {BUF_PARAMS, BUF_MASTER, BUF_ADAM_M, BUF_ADAM_V, BUF_FP32_GRADS};
    bool same = true, spaces = true;
    size_t moved_bytes = 0;
    for (size_t i = 0; i < sizeof moved / sizeof moved[0]; i++) {
        same &= a.bytes[moved[i]] == b.bytes[moved[i]];
        spaces &= a.space[moved[i]] == SPACE_DEVICE && b.space[moved[i]] == SPACE_PINNED;
        moved_bytes += b.bytes[moved[i]];
    }
    CHECK("offload: parameters, master, Adam, fp32 grads keep their bytes", same, "differ");
    CHECK("offload: they move from device to pinned host", spaces, "wrong spaces");
    CHECK("offload: the device total shrinks by exactly those bytes (pinned: them and the token staging)",
          a.space_total[SPACE_DEVICE] - b.space_total[SPACE_DEVICE] == moved_bytes &&
              b.space_total[SPACE_PINNED] - b.bytes[BUF_STAGING] == moved_bytes &&
              a.space_total[SPACE_PINNED] == a.bytes[BUF_STAGING] && a.bytes[BUF_STAGING] > 0,
          "device %zu -> %zu, pinned %zu, moved %zu", a.space_total[SPACE_DEVICE], b.space_total[SPACE_DEVICE],
          b.space_total[SPACE_PINNED], moved_bytes);
    CHECK("GPU target: no fp32 compute copies, no send buffers",
          b.bytes[BUF_COMPUTE_COPIES] == 0 && b.bytes[BUF_GRAD_SEND] == 0 && b.bytes[BUF_GRAD_BUFFERS] > 0, "%zu %zu",
          b.bytes[BUF_COMPUTE_COPIES], b.bytes[BUF_GRAD_SEND]);
    struct mem_plan c;
    plan_compute_for(&c, &m, &on, 8, PLAN_TARGET_CPU);
    CHECK("CPU target: fp32 compute copies of the bf16 units",
          c.bytes[BUF_COMPUTE_COPIES] > 0 && c.bytes[BUF_GATHERED] == b.bytes[BUF_GATHERED], "%zu",
          c.bytes[BUF_COMPUTE_COPIES]);
    model_free(&m);
    config_free(&on);
    config_free(&off);
}

/* nvme_sizes: the piece, the file and the buffers, computed by hand. */
static void test_nvme_sizes(void)
{
    static const struct {
        size_t n;
        int buffers;
        size_t piece, file, host;
    } cases[] = {
        {5000, 2, 5120, 5120 * 12, 3 * 5120 * 12},                   /* a small range: rounded up to 1024; 3 buffers */
        {1024, 4, 1024, 1024 * 12, 4 * 1024 * 12},                   /* exactly one aligned piece */
        {(3u << 20) + 1, 4, 2u << 20, 2 * (2u << 20) * 12, 4 * (2u << 20) * 12}, /* two default pieces, padded */
        {2u << 20, 6, 2u << 20, (2u << 20) * 12, 6 * (2u << 20) * 12},
        {0, 4, 1024, 0, 4 * 1024 * 12},                               /* no elements: an empty file */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t file, host, piece;
        nvme_sizes(cases[i].n, cases[i].buffers, &file, &host, &piece);
        char name[96];
        snprintf(name, sizeof name, "nvme_sizes(%zu, %d): piece, file and buffers", cases[i].n, cases[i].buffers);
        CHECK(name, piece == cases[i].piece && file == cases[i].file && host == cases[i].host &&
                        file == nvme_file_bytes(cases[i].n, piece),
              "piece %zu file %zu host %zu, want %zu %zu %zu", piece, file, host, cases[i].piece, cases[i].file,
              cases[i].host);
    }
}

/* A tiny Llama, 2 ranks, bf16, stage 3, accumulation 2, with the given offload devices. */
static void nvme_config(struct config *c, const char *opt_dev, const char *param_dev, const char *lora)
{
    char dev_o[96], dev_p[96];
    snprintf(dev_o, sizeof dev_o, "zero_optimization.offload_optimizer.device=%s", opt_dev);
    snprintf(dev_p, sizeof dev_p, "zero_optimization.offload_param.device=%s", param_dev);
    const char *sets[] = {"model.preset=llama2-7b", "model.n_layer=2", "model.n_embd=64", "model.n_head=4",
                          "model.n_kv_head=2", "model.ffn_dim=160", "model.vocab_size=300", "model.n_positions=32",
                          "data.seq_len=16", "bf16.enabled=true", "zero_optimization.stage=3",
                          "train_micro_batch_size_per_gpu=1", "gradient_accumulation_steps=2",
                          "zero_optimization.offload_optimizer.nvme_path=/nvme",
                          "zero_optimization.offload_param.nvme_path=/nvme",
                          "zero_optimization.offload_optimizer.buffer_count=2", dev_o, dev_p, lora};
    config_load_string(c, "{}", sets, lora ? 19 : 18);
    config_resolve_batch(c, 2);
}

static void test_nvme_plan(void)
{
    struct config cpu, nv, par, lora, lora_par;
    nvme_config(&cpu, "cpu", "cpu", NULL);
    nvme_config(&nv, "nvme", "cpu", NULL);
    nvme_config(&par, "cpu", "nvme", NULL);
    nvme_config(&lora, "nvme", "nvme", "lora.r=4");
    nvme_config(&lora_par, "cpu", "nvme", "lora.r=4");
    struct model m, ml;
    model_build(&m, &cpu.model);
    model_build(&ml, &lora.model);
    model_add_lora(&ml, &lora.lora);
    struct mem_plan a, b, c, d, dc, e;
    /* the trainer's own target (a device target adds the engine's one-unit stage of the master, k36opt) */
    plan_compute_for(&a, &m, &cpu, 2, PLAN_TARGET_CPU);
    plan_compute_for(&b, &m, &nv, 2, PLAN_TARGET_CPU);
    plan_compute_for(&c, &m, &par, 2, PLAN_TARGET_CPU);
    plan_compute_for(&d, &ml, &lora, 2, PLAN_TARGET_CPU);
    plan_compute_for(&e, &ml, &lora_par, 2, PLAN_TARGET_CPU);
    /* the file holds what CPU offload's rows hold: the rank's optimizer range in fp32 (multiples of 16 elements:
     * the rows are not rounded) */
    const size_t n0 = b.nvme.opt_elems;
    CHECK("nvme: the optimizer file holds the elements CPU offload's master, m and v rows hold",
          n0 > 0 && 4 * n0 == a.bytes[BUF_MASTER] && 4 * n0 == a.bytes[BUF_ADAM_M] && 4 * n0 == a.bytes[BUF_ADAM_V] &&
              2 * n0 >= m.n_params && 2 * n0 < m.n_params + (size_t)m.n_units * 2 * MODEL_TENSOR_ALIGN,
          "%zu elements, master row %zu B, %zu parameters", n0, a.bytes[BUF_MASTER], m.n_params);
    struct config lora_cpu;
    nvme_config(&lora_cpu, "cpu", "cpu", "lora.r=4");
    plan_compute_for(&dc, &ml, &lora_cpu, 2, PLAN_TARGET_CPU);
    config_free(&lora_cpu);
    CHECK("nvme: LoRA's optimizer file holds the adapters' range only",
          d.nvme.opt_elems > 0 && 4 * d.nvme.opt_elems == dc.bytes[BUF_ADAM_M] &&
              2 * d.nvme.opt_elems < m.n_params / 4 && 2 * d.nvme.opt_elems >= model_adapter_params(&ml),
          "%zu elements, Adam m row %zu B, adapters %zu", d.nvme.opt_elems, dc.bytes[BUF_ADAM_M],
          model_adapter_params(&ml));
    size_t file, host, piece;
    nvme_sizes(n0, 2, &file, &host, &piece);
    CHECK("nvme plan: the optimizer file and buffers are nvme_sizes' for the rank's elements",
          b.nvme.opt_elems == n0 && b.nvme.opt_file == file && b.nvme.opt_buffers == host &&
              b.nvme.opt_piece == piece && b.nvme.opt_read == (double)file && b.nvme.opt_written == (double)file,
          "elems %zu file %zu buffers %zu piece %zu", b.nvme.opt_elems, b.nvme.opt_file, b.nvme.opt_buffers,
          b.nvme.opt_piece);
    const size_t opt_rows = a.bytes[BUF_MASTER] + a.bytes[BUF_ADAM_M] + a.bytes[BUF_ADAM_V];
    const size_t g32 = a.bytes[BUF_FP32_GRADS];
    CHECK("nvme plan: master, Adam m and v leave the pinned arena; the fp32 gradient shard moves to the device",
          b.bytes[BUF_MASTER] == 0 && b.bytes[BUF_ADAM_M] == 0 && b.bytes[BUF_ADAM_V] == 0 && opt_rows > 0 &&
              g32 > 0 && a.space_total[SPACE_PINNED] - b.space_total[SPACE_PINNED] == opt_rows + g32 &&
              b.space_total[SPACE_DEVICE] - a.space_total[SPACE_DEVICE] == g32 && b.bytes[BUF_FP32_GRADS] == g32 &&
              a.space[BUF_FP32_GRADS] == SPACE_PINNED && b.space[BUF_FP32_GRADS] == SPACE_DEVICE,
          "pinned %zu -> %zu, device %zu -> %zu, rows %zu, fp32 gradients %zu", a.space_total[SPACE_PINNED],
          b.space_total[SPACE_PINNED], a.space_total[SPACE_DEVICE], b.space_total[SPACE_DEVICE], opt_rows, g32);
    CHECK("nvme plan: host bytes = pinned + ordinary arenas + the buffers",
          plan_host_bytes(&b) == b.space_total[SPACE_PINNED] + b.space_total[SPACE_HOST] + host &&
              plan_host_bytes(&a) == a.space_total[SPACE_PINNED] + a.space_total[SPACE_HOST] && a.nvme.opt_file == 0,
          "%zu", plan_host_bytes(&b));
    /* the parameter file: each unit's shard from a 4 KiB boundary; every gather reads it, the trained are written */
    const size_t shards = a.bytes[BUF_PARAMS];
    CHECK("nvme plan: the parameter shard leaves the pinned arena for a file of the shards, 4 KiB-aligned per unit",
          c.bytes[BUF_PARAMS] == 0 && c.nvme.param_file >= shards &&
              c.nvme.param_file < shards + (size_t)m.n_units * NVME_BLOCK && c.nvme.param_file % NVME_BLOCK == 0 &&
              c.nvme.param_buffers == 5 * c.nvme.param_unit && c.nvme.param_unit % NVME_BLOCK == 0 &&
              c.space_total[SPACE_PINNED] == a.space_total[SPACE_PINNED] - shards,
          "file %zu, shards %zu, unit %zu, buffers %zu", c.nvme.param_file, shards, c.nvme.param_unit,
          c.nvme.param_buffers);
    CHECK("nvme plan: per step every unit is read at least once per micro-batch (2), at most three times; the "
          "trained shards written once",
          c.nvme.param_read >= 2.0 * c.nvme.param_file && c.nvme.param_read <= 6.0 * c.nvme.param_file &&
              c.nvme.param_written == (double)c.nvme.param_file,
          "read %.0f written %.0f of a %zu B file", c.nvme.param_read, c.nvme.param_written, c.nvme.param_file);
    CHECK("nvme plan: a LoRA base on NVMe is read, never written; only the adapters' shards are",
          e.nvme.param_written > 0 && e.nvme.param_written < (double)e.nvme.param_file / 4 && e.nvme.param_read > 0,
          "written %.0f of %zu", e.nvme.param_written, e.nvme.param_file);
    /* the engine's layout (zero_nvme_layout): with the optimizer on NVMe too, the trained shards are in the file
     * as well, narrowed from the masters the optimizer file holds (read again after each step) */
    CHECK("nvme plan: with offload_optimizer nvme too, the same parameter file; its masters are read again",
          d.nvme.param_file == e.nvme.param_file && d.nvme.param_written == e.nvme.param_written &&
              d.bytes[BUF_PARAMS] == 0 && d.nvme.opt_written == (double)d.nvme.opt_file &&
              d.nvme.opt_read == (double)d.nvme.opt_file + 4.0 * (double)d.nvme.opt_elems,
          "file %zu (%zu with cpu), params row %zu, read %.0f of a %zu B file", d.nvme.param_file,
          e.nvme.param_file, d.bytes[BUF_PARAMS], d.nvme.opt_read, d.nvme.opt_file);

    /* the real file: nvme_open with the plan's elements, piece and buffer count makes exactly the planned bytes,
     * and one step over the whole range reads and writes what the plan says */
    char dir[512];
    const char *tmp = getenv("SHARDLM_TEST_TMP");
    snprintf(dir, sizeof dir, "%s/plan-nvme-%d", tmp ? tmp : "/tmp", (int)getpid());
    struct nvme_file *f = nvme_open(dir, "plan", 0, b.nvme.opt_elems, b.nvme.opt_piece, nv.zero.optimizer_buffer_count);
    struct stat st;
    CHECK("nvme plan: nvme_open's file is the planned disk bytes, its buffers the planned host bytes",
          stat(nvme_path(f), &st) == 0 && (size_t)st.st_size == b.nvme.opt_file &&
              nvme_host_bytes(f) == b.nvme.opt_buffers,
          "file %lld B, buffers %zu B; plan %zu, %zu", (long long)st.st_size, nvme_host_bytes(f), b.nvme.opt_file,
          b.nvme.opt_buffers);
    float *grad = xcalloc(b.nvme.opt_elems, sizeof *grad);
    struct nvme_segment seg = {0, b.nvme.opt_elems, grad, 0.0f, NULL};
    struct adamw_hparams hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .adam_w_mode = true,
                               .bias_correction1 = 0.1f, .bias_correction2 = 0.001f, .grad_scale = 1.0f};
    nvme_adamw_step(f, &seg, 1, &hp, DTYPE_F32);
    double rd, wr;
    nvme_traffic(f, &rd, &wr);
    CHECK("nvme plan: one step reads and writes the planned bytes (nvme_traffic)",
          rd == b.nvme.opt_read && wr == b.nvme.opt_written, "read %.0f written %.0f, plan %.0f %.0f", rd, wr,
          b.nvme.opt_read, b.nvme.opt_written);
    nvme_close(f);
    rmdir(dir);
    free(grad);
    model_free(&m);
    model_free(&ml);
    config_free(&cpu);
    config_free(&nv);
    config_free(&par);
    config_free(&lora_par);
    config_free(&lora);
}

int main(void)
{
    test_sizes();
    test_presets();
    test_plan_invariants();
    test_nvme_sizes();
    test_nvme_plan();
    return check_status();
}
