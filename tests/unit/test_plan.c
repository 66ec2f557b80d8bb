/*
 * test_plan — the planner's pieces that need no run: memory sizes as the plan
 * command parses them, the presets' parameter counts against the published
 * totals, Llama's tensor names and shapes, the FLOPs formula, and plan
 * invariants (offload moves bytes between spaces without changing them; the
 * GPU target has no CPU-only buffers).
 */
#include "check.h"
#include "config/config.h"
#include "model/arch.h"
#include "model/model.h"
#include "engine/plan.h"

#include <stdio.h>
#include <string.h>

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

int main(void)
{
    test_sizes();
    test_presets();
    test_plan_invariants();
    return check_status();
}
