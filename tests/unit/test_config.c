/*
 * test_config — the JSON config: DeepSpeed's defaults, a DeepSpeed file merged
 * into the main one, --set overrides, batch resolution, and the errors and
 * warnings (each error must exit with status 2 and name the key path).
 *
 * Error paths end the process (fail_input), so they run in a fork()ed child
 * whose stderr comes back through a pipe.
 */
#include "check.h"
#include "config/config.h"
#include "model/model.h"
#include "core/util.h"
#include "engine/dpo.h"

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

/* ---- running a load in a child ----------------------------------------- */

#define MAX_SETS 4

struct load_args {
    const char *json;              /* config_load_string when set */
    const char *path, *ds_path;    /* else config_load from files */
    const char *sets[MAX_SETS];
    int world;                     /* > 0: also config_resolve_batch */
};

struct child_result {
    int status; /* exit status, or 128 + signal */
    char err[16384];
};

static int count_sets(const struct load_args *a)
{
    int n = 0;
    while (n < MAX_SETS && a->sets[n])
        n++;
    return n;
}

static void load_in_child(const struct load_args *a)
{
#if defined(__SANITIZE_ADDRESS__)
    /* fail_input() exits with the document still allocated; that is by design. */
    __lsan_disable();
#endif
    struct config cfg;
    if (a->json)
        config_load_string(&cfg, a->json, a->sets, count_sets(a));
    else
        config_load(&cfg, a->path, a->ds_path, a->sets, count_sets(a));
    if (a->world > 0)
        config_resolve_batch(&cfg, a->world);
    if (cfg.lora.enabled) { /* the module names are checked against the model, as the commands do */
        struct model m;
        model_build(&m, &cfg.model);
        model_add_lora(&m, &cfg.lora);
        model_free(&m);
    }
    config_free(&cfg);
}

/* Runs load_in_child in a child process; returns its exit status and stderr. */
static void run_child(const struct load_args *a, struct child_result *r)
{
    int fds[2];
    if (pipe(fds) != 0) {
        perror("pipe");
        exit(1);
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(1);
    }
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], STDERR_FILENO);
        close(fds[1]);
        load_in_child(a);
        exit(0);
    }
    close(fds[1]);
    size_t used = 0;
    for (;;) {
        ssize_t n = read(fds[0], r->err + used, sizeof r->err - 1 - used);
        if (n <= 0)
            break;
        used += (size_t)n;
        if (used == sizeof r->err - 1)
            break;
    }
    r->err[used] = '\0';
    close(fds[0]);
    int wstatus = 0;
    waitpid(pid, &wstatus, 0);
    r->status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
}

static int count_occurrences(const char *haystack, const char *needle)
{
    int n = 0;
    for (const char *p = haystack; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* The load must fail with status 2 and a "config: " message containing `needle`. */
static void expect_fail(const char *name, const struct load_args *a, const char *needle)
{
    struct child_result r;
    run_child(a, &r);
    CHECK(name, r.status == EXIT_BAD_INPUT && strstr(r.err, "error: config: ") && strstr(r.err, needle),
          "status %d, stderr: %s (wanted status 2 and \"%s\")", r.status, r.err, needle);
}

static void expect_fail_json(const char *name, const char *json, const char *set, const char *needle)
{
    struct load_args a = {.json = json, .sets = {set}};
    expect_fail(name, &a, needle);
}

/* The load must succeed; returns its stderr (warnings) in r. */
static void expect_ok(const char *name, const struct load_args *a, struct child_result *r)
{
    run_child(a, r);
    CHECK(name, r->status == 0, "status %d, stderr: %s", r->status, r->err);
}

static void load(struct config *cfg, const char *json, const char *set0, const char *set1)
{
    const char *sets[2] = {set0, set1};
    int n = set1 ? 2 : set0 ? 1 : 0;
    config_load_string(cfg, json, sets, n);
}

/* ---- defaults ---------------------------------------------------------- */

static void test_defaults(void)
{
    struct config c;
    load(&c, "{}", NULL, NULL);
    CHECK("default model.type", strcmp(c.model.type, "gpt2") == 0, "got %s", c.model.type);
    CHECK("default GPT-2 124M shape",
          c.model.n_layer == 12 && c.model.n_head == 12 && c.model.n_embd == 768 && c.model.n_positions == 1024 &&
              c.model.vocab_size == 50257,
          "got %d %d %d %d %d", c.model.n_layer, c.model.n_head, c.model.n_embd, c.model.n_positions,
          c.model.vocab_size);
    CHECK("padded_vocab is vocab rounded up to 128", c.model.padded_vocab == 50304, "got %d", c.model.padded_vocab);
    CHECK_CLOSE("default init_std", c.model.init_std, 0.02, 1e-6, 0);
    CHECK("default init_seed", c.model.init_seed == 1337, "got %llu", (unsigned long long)c.model.init_seed);
    CHECK("default data", !c.data.train_path && !c.data.val_path && c.data.seq_len == 1024, "seq_len %d",
          c.data.seq_len);
    CHECK("default train",
          c.train.steps == 100 && c.train.seed == 1337 && c.train.eval_every == 0 && c.train.eval_batches == 4 &&
              c.train.sample_tokens == 0 && c.train.sample_temperature == 1.0f && !c.train.metrics_path &&
              c.train.threads == 0,
          "steps %d eval_batches %d", c.train.steps, c.train.eval_batches);
    CHECK("default checkpoint", !c.checkpoint.dir && c.checkpoint.every == 0 && c.checkpoint.keep == 2, "keep %d",
          c.checkpoint.keep);

    CHECK("default optimizer is AdamW", strcmp(c.optimizer.type, "AdamW") == 0 && c.optimizer.adam_w_mode, "got %s",
          c.optimizer.type);
    CHECK_CLOSE("default lr (FusedAdam 1e-3)", c.optimizer.lr, 1e-3, 1e-7, 0);
    CHECK_CLOSE("default beta1", c.optimizer.beta1, 0.9, 1e-7, 0);
    CHECK_CLOSE("default beta2", c.optimizer.beta2, 0.999, 1e-7, 0);
    CHECK_CLOSE("default eps", c.optimizer.eps, 1e-8, 1e-6, 0);
    CHECK("default weight_decay 0", c.optimizer.weight_decay == 0.0f, "got %g", c.optimizer.weight_decay);
    CHECK("default scheduler constant", c.scheduler.type == SCHED_CONSTANT, "got %d", c.scheduler.type);

    CHECK("default fp16 (DeepSpeed)",
          !c.fp16.enabled && c.fp16.loss_scale == 0.0f && c.fp16.initial_scale_power == 16 &&
              c.fp16.loss_scale_window == 1000 && c.fp16.hysteresis == 2 && !c.fp16.consecutive_hysteresis &&
              c.fp16.min_loss_scale == 1.0f,
          "window %d hysteresis %d", c.fp16.loss_scale_window, c.fp16.hysteresis);
    CHECK("default dtype fp32", !c.bf16 && c.dtype == DTYPE_F32, "got %d", c.dtype);

    CHECK("default zero stage 0, no offload", c.zero.stage == 0 && !c.zero.offload_optimizer, "stage %d",
          c.zero.stage);
    CHECK("default offload pin_memory true (DeepSpeed v0.19.5)", c.zero.offload_pin_memory, "false");
    CHECK("default zero sizes",
          c.zero.reduce_bucket_size == 5e8 && c.zero.stage3_prefetch_bucket_size == 5e7 &&
              c.zero.stage3_max_live_parameters == 1e9 && c.zero.stage3_param_persistence_threshold == 1e5,
          "%g %g %g %g", c.zero.reduce_bucket_size, c.zero.stage3_prefetch_bucket_size,
          c.zero.stage3_max_live_parameters, c.zero.stage3_param_persistence_threshold);
    CHECK("default overlap_comm false below stage 3", !c.zero.overlap_comm, "true");
    CHECK("default contiguous_gradients true", c.zero.contiguous_gradients, "false");
    CHECK("default activation checkpointing off", !c.act_ckpt.enabled && c.act_ckpt.interval == 1 &&
          !c.act_ckpt.cpu_checkpointing, "interval %d", c.act_ckpt.interval);

    CHECK("default batch not given", c.train_batch_size == 0 && c.micro_batch == 0 && c.grad_accum == 0,
          "%d %d %d", c.train_batch_size, c.micro_batch, c.grad_accum);
    CHECK_CLOSE("default gradient_clipping (DeepSpeed >= 0.19.3: 1.0)", c.gradient_clipping, 1.0, 0, 0);
    CHECK("default steps_per_print 10", c.steps_per_print == 10, "got %d", c.steps_per_print);
    CHECK("default wall_clock_breakdown false", !c.wall_clock_breakdown, "true");

    CHECK("dtype names", strcmp(dtype_name(DTYPE_F32), "fp32") == 0 && strcmp(dtype_name(DTYPE_F16), "fp16") == 0 &&
          strcmp(dtype_name(DTYPE_BF16), "bf16") == 0, "wrong");
    CHECK("dtype sizes", dtype_size(DTYPE_F32) == 4 && dtype_size(DTYPE_F16) == 2 && dtype_size(DTYPE_BF16) == 2,
          "wrong");

    /* The dump is the resolved config: defaults are in it, and it reads back to itself. */
    char *dump = config_dump(&c);
    CHECK("dump shows defaults", strstr(dump, "\"n_layer\": 12") && strstr(dump, "\"loss_scale_window\": 1000") &&
          strstr(dump, "\"seq_len\": 1024"), "%s", dump);
    struct config again;
    config_load_string(&again, dump, NULL, 0);
    char *dump2 = config_dump(&again);
    CHECK("dump reads back to the same config", strcmp(dump, dump2) == 0, "%s\nvs\n%s", dump, dump2);
    free(dump);
    free(dump2);
    config_free(&again);
    config_free(&c);
    CHECK("config_free clears", c.json == NULL && c.data.train_path == NULL, "not cleared");
}

static void test_stage3_defaults_and_values(void)
{
    struct config c;
    load(&c,
         "{\"zero_optimization\": {\"stage\": 3, \"overlap_comm\": null, \"stage3_prefetch_bucket_size\": 2e7},"
         " \"model\": {\"n_layer\": 4, \"n_head\": 4, \"n_embd\": 128, \"n_positions\": 256, \"vocab_size\": 1000},"
         " \"data\": {\"train\": \"/data/train_*.bin\", \"val\": \"/data/val.bin\", \"seq_len\": 128},"
         " \"train\": {\"steps\": 7, \"metrics\": \"m.jsonl\", \"threads\": 3},"
         " \"checkpoint\": {\"dir\": \"ck\", \"every\": 5, \"keep\": 0},"
         " \"activation_checkpointing\": {\"enabled\": true, \"interval\": 2, \"cpu_checkpointing\": true},"
         " \"wall_clock_breakdown\": true, \"gradient_clipping\": 0.0, \"steps_per_print\": 1}",
         NULL, NULL);
    CHECK("overlap_comm null -> true at stage 3 (DeepSpeed)", c.zero.overlap_comm, "false");
    CHECK("integral real accepted for an integer key", c.zero.stage3_prefetch_bucket_size == 2e7, "got %g",
          c.zero.stage3_prefetch_bucket_size);
    CHECK("padded_vocab 1000 -> 1024", c.model.padded_vocab == 1024, "got %d", c.model.padded_vocab);
    CHECK("data paths", c.data.train_path && strcmp(c.data.train_path, "/data/train_*.bin") == 0 &&
          c.data.val_path && strcmp(c.data.val_path, "/data/val.bin") == 0 && c.data.seq_len == 128, "wrong");
    CHECK("train values", c.train.steps == 7 && c.train.metrics_path && strcmp(c.train.metrics_path, "m.jsonl") == 0 &&
          c.train.threads == 3, "wrong");
    CHECK("checkpoint values", c.checkpoint.dir && strcmp(c.checkpoint.dir, "ck") == 0 && c.checkpoint.every == 5 &&
          c.checkpoint.keep == 0, "wrong");
    CHECK("activation checkpointing values", c.act_ckpt.enabled && c.act_ckpt.interval == 2 &&
          c.act_ckpt.cpu_checkpointing, "wrong");
    CHECK("clipping off, print every step, wall clock on", c.gradient_clipping == 0.0f && c.steps_per_print == 1 &&
          c.wall_clock_breakdown, "wrong");
    config_free(&c);

    load(&c, "{\"bfloat16\": {\"enabled\": true}}", NULL, NULL);
    CHECK("bfloat16 (DeepSpeed's old name) enables bf16", c.bf16 && c.dtype == DTYPE_BF16, "dtype %d", c.dtype);
    config_free(&c);
    load(&c, "{\"fp16\": {\"enabled\": true, \"loss_scale\": 128, \"loss_scale_window\": 0}}", NULL, NULL);
    CHECK("static loss scale: window not checked (as DeepSpeed)", c.fp16.enabled && c.fp16.loss_scale == 128.0f &&
          c.dtype == DTYPE_F16, "wrong");
    config_free(&c);
    load(&c, "{\"fp16\": {\"enabled\": false, \"hysteresis\": 0}}", NULL, NULL);
    CHECK("fp16 off: hysteresis not checked", !c.fp16.enabled, "wrong");
    config_free(&c);
}

/* ---- issue 4: a DeepSpeed file must load unchanged ----------------------- */

#define ISSUE4_JSON                                                                                                   \
    "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 8, \"optimizer\": {\"type\": "         \
    "\"AdamW\", \"params\": {\"lr\": 5e-5, \"weight_decay\": 0.01}}, \"fp16\": {\"enabled\": true, "                  \
    "\"loss_scale_window\": 1000}, \"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": "        \
    "\"cpu\"}}}"

#define ISSUE4_JSON_BUCKETS                                                                                           \
    "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 8, \"optimizer\": {\"type\": "         \
    "\"AdamW\", \"params\": {\"lr\": 5e-5, \"weight_decay\": 0.01}}, \"fp16\": {\"enabled\": true, "                  \
    "\"loss_scale_window\": 1000}, \"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": "        \
    "\"cpu\"}, \"reduce_bucket_size\": 5e8, \"contiguous_gradients\": true}}"

static void test_issue4(void)
{
    struct config c;
    load(&c, ISSUE4_JSON, NULL, NULL);
    CHECK("issue 4: fp16, stage 3, cpu offload", c.fp16.enabled && c.dtype == DTYPE_F16 && c.zero.stage == 3 &&
          c.zero.offload_optimizer && c.zero.overlap_comm, "wrong");
    CHECK_CLOSE("issue 4: lr", c.optimizer.lr, 5e-5, 1e-6, 0);
    CHECK_CLOSE("issue 4: weight_decay", c.optimizer.weight_decay, 0.01, 1e-6, 0);
    CHECK("issue 4: AdamW", strcmp(c.optimizer.type, "AdamW") == 0 && c.optimizer.adam_w_mode, "wrong");
    CHECK("issue 4: batch as given", c.micro_batch == 2 && c.grad_accum == 8 && c.train_batch_size == 0, "%d %d %d",
          c.micro_batch, c.grad_accum, c.train_batch_size);
    config_resolve_batch(&c, 4);
    CHECK("issue 4: train_batch_size = 2 x 8 x 4", c.train_batch_size == 64 && c.micro_batch == 2 && c.grad_accum == 8,
          "%d %d %d", c.train_batch_size, c.micro_batch, c.grad_accum);
    char *dump = config_dump(&c);
    CHECK("resolved batch in the dump", strstr(dump, "\"train_batch_size\": 64") != NULL, "%s", dump);
    free(dump);
    config_free(&c);

    struct child_result r;
    struct load_args a = {.json = ISSUE4_JSON, .world = 1};
    expect_ok("issue 4 loads", &a, &r);
    CHECK("issue 4: no warnings", strstr(r.err, "warning") == NULL, "stderr: %s", r.err);

    load(&c, ISSUE4_JSON_BUCKETS, NULL, NULL);
    CHECK("issue 4 + buckets: values stored", c.zero.reduce_bucket_size == 5e8 && c.zero.contiguous_gradients,
          "%g", c.zero.reduce_bucket_size);
    config_free(&c);
    struct load_args b = {.json = ISSUE4_JSON_BUCKETS, .world = 2};
    expect_ok("issue 4 + buckets loads", &b, &r);
    CHECK("one warning for reduce_bucket_size",
          count_occurrences(r.err, "zero_optimization.reduce_bucket_size is accepted but has no effect in shardlm") == 1,
          "stderr: %s", r.err);
    CHECK("one warning for contiguous_gradients",
          count_occurrences(r.err, "zero_optimization.contiguous_gradients is accepted but has no effect in shardlm") ==
              1,
          "stderr: %s", r.err);
    CHECK("only those two warnings", count_occurrences(r.err, "warning:") == 2, "stderr: %s", r.err);
}

/* ---- optimizer and scheduler ------------------------------------------- */

static void test_optimizer(void)
{
    struct config c;
    load(&c, "{\"optimizer\": {\"type\": \"adam\", \"params\": {\"betas\": [0.8, 0.95], \"eps\": 1e-6}}}", NULL,
         NULL);
    CHECK("type is case-insensitive (DeepSpeed lower-cases it)", strcmp(c.optimizer.type, "Adam") == 0, "got %s",
          c.optimizer.type);
    CHECK("Adam: adam_w_mode defaults to true (DeepSpeed)", c.optimizer.adam_w_mode, "false");
    CHECK_CLOSE("betas[0]", c.optimizer.beta1, 0.8, 1e-7, 0);
    CHECK_CLOSE("betas[1]", c.optimizer.beta2, 0.95, 1e-7, 0);
    CHECK_CLOSE("eps", c.optimizer.eps, 1e-6, 1e-6, 0);
    config_free(&c);

    load(&c, "{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"adam_w_mode\": false, \"bias_correction\": true}}}",
         NULL, NULL);
    CHECK("Adam with adam_w_mode false: L2 mode", !c.optimizer.adam_w_mode, "true");
    config_free(&c);

    load(&c, "{\"optimizer\": {\"params\": {\"lr\": 1e-4}}}", NULL, NULL);
    CHECK("optimizer without type: AdamW", strcmp(c.optimizer.type, "AdamW") == 0 && c.optimizer.adam_w_mode &&
          fabsf(c.optimizer.lr - 1e-4f) < 1e-10f, "got %s", c.optimizer.type);
    config_free(&c);

    struct child_result r;
    struct load_args a = {.json = "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"adam_w_mode\": false}}}"};
    expect_ok("AdamW with adam_w_mode false loads", &a, &r);
    CHECK("AdamW ignores adam_w_mode false, with a warning", strstr(r.err, "optimizer.params.adam_w_mode") != NULL,
          "stderr: %s", r.err);
    load(&c, a.json, NULL, NULL);
    CHECK("AdamW forces decoupled decay", c.optimizer.adam_w_mode, "false");
    config_free(&c);
}

static void test_scheduler(void)
{
    struct config c;
    load(&c, "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 7e-4}}, \"scheduler\": {\"type\": \"WarmupLR\"}}",
         NULL, NULL);
    CHECK("WarmupLR defaults", c.scheduler.type == SCHED_WARMUP_LR && c.scheduler.warmup_min_lr == 0.0f &&
          c.scheduler.warmup_num_steps == 1000 && c.scheduler.warmup_type == WARMUP_LOG, "wrong");
    CHECK_CLOSE("WarmupLR warmup_max_lr defaults to the optimizer lr (DeepSpeed >= 0.17.2)",
                c.scheduler.warmup_max_lr, 7e-4, 1e-6, 0);
    config_free(&c);

    load(&c, "{\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"total_num_steps\": 5000, "
             "\"warmup_num_steps\": 100, \"warmup_type\": \"linear\", \"warmup_min_lr\": 1e-5, "
             "\"last_batch_iteration\": -1}}}",
         NULL, NULL);
    CHECK("WarmupDecayLR values", c.scheduler.type == SCHED_WARMUP_DECAY_LR && c.scheduler.total_num_steps == 5000 &&
          c.scheduler.warmup_num_steps == 100 && c.scheduler.warmup_type == WARMUP_LINEAR, "wrong");
    CHECK_CLOSE("WarmupDecayLR warmup_max_lr default 0.001", c.scheduler.warmup_max_lr, 1e-3, 1e-6, 0);
    CHECK_CLOSE("WarmupDecayLR warmup_min_lr", c.scheduler.warmup_min_lr, 1e-5, 1e-6, 0);
    config_free(&c);

    load(&c, "{\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"total_num_steps\": 100, "
             "\"warmup_num_steps\": 10}}}",
         NULL, NULL);
    CHECK("WarmupCosineLR defaults", c.scheduler.type == SCHED_WARMUP_COSINE_LR && c.scheduler.warmup_min_ratio == 0.0f,
          "wrong");
    CHECK_CLOSE("cos_min_ratio default 1e-4", c.scheduler.cos_min_ratio, 1e-4, 1e-6, 0);
    config_free(&c);
}

/* ---- --set ------------------------------------------------------------- */

static void test_set(void)
{
    struct config c;
    const char *base = "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}}, \"train_batch_size\": 64}";
    load(&c, base, "optimizer.params.lr=3e-4", "data.train=/tmp/shards/train_*.bin");
    CHECK_CLOSE("--set number", c.optimizer.lr, 3e-4, 1e-6, 0);
    CHECK("--set plain string (not JSON)", c.data.train_path && strcmp(c.data.train_path, "/tmp/shards/train_*.bin") == 0,
          "got %s", c.data.train_path ? c.data.train_path : "(null)");
    config_free(&c);

    load(&c, base, "fp16.enabled=true", "data.val=\"123\"");
    CHECK("--set bool creates the fp16 section", c.fp16.enabled && c.dtype == DTYPE_F16, "wrong");
    CHECK("--set quoted string stays a string", c.data.val_path && strcmp(c.data.val_path, "123") == 0, "wrong");
    config_free(&c);

    load(&c, base, "scheduler.type=WarmupDecayLR", "scheduler.params.total_num_steps=5000");
    CHECK("--set creates nested objects", c.scheduler.type == SCHED_WARMUP_DECAY_LR &&
          c.scheduler.total_num_steps == 5000, "type %d total %d", c.scheduler.type, c.scheduler.total_num_steps);
    config_free(&c);

    load(&c, base, "optimizer.params.betas=[0.9, 0.95]", "model={\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 64}");
    CHECK("--set array", fabsf(c.optimizer.beta2 - 0.95f) < 1e-7f, "beta2 %g", c.optimizer.beta2);
    CHECK("--set object", c.model.n_layer == 2 && c.model.n_embd == 64 && c.model.vocab_size == 50257, "wrong");
    config_free(&c);

    load(&c, base, "train_batch_size=null", "train_micro_batch_size_per_gpu=4");
    CHECK("--set null removes a batch number", c.train_batch_size == 0 && c.micro_batch == 4, "%d %d",
          c.train_batch_size, c.micro_batch);
    config_resolve_batch(&c, 2);
    CHECK("... and the rest resolves", c.train_batch_size == 8 && c.grad_accum == 1, "%d %d", c.train_batch_size,
          c.grad_accum);
    config_free(&c);

    expect_fail_json("--set without '='", "{}", "optimizer.params.lr", "has no '='");
    expect_fail_json("--set with an empty path", "{}", "=3", "empty key path");
    expect_fail_json("--set with an empty component", "{}", "optimizer..lr=3", "empty component");
    expect_fail_json("--set through a non-object", "{\"model\": {\"n_layer\": 4}}", "model.n_layer.x=1",
                     "'model.n_layer' is integer, not an object");
    expect_fail_json("--set unknown key is caught", "{}", "zero_optimization.stagee=3",
                     "unknown key 'zero_optimization.stagee'");
    expect_fail_json("--set wrong type", "{}", "model.n_layer=many", "'model.n_layer' must be an integer, got string");
}

/* ---- files: main + DeepSpeed ------------------------------------------- */

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
}

static void test_files(void)
{
    char dir[] = "/tmp/test_config.XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        exit(1);
    }
    char main_path[256], ds_path[256], bad_path[256], conflict_path[256], array_path[256], same_path[256];
    snprintf(main_path, sizeof main_path, "%s/main.json", dir);
    snprintf(ds_path, sizeof ds_path, "%s/ds_config.json", dir);
    snprintf(bad_path, sizeof bad_path, "%s/bad.json", dir);
    snprintf(conflict_path, sizeof conflict_path, "%s/conflict.json", dir);
    snprintf(array_path, sizeof array_path, "%s/array.json", dir);
    snprintf(same_path, sizeof same_path, "%s/same.json", dir);
    write_file(main_path, "{\"model\": {\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 64, \"n_positions\": 128},\n"
                          " \"data\": {\"train\": \"train.bin\"}, \"train\": {\"steps\": 10},\n"
                          " \"optimizer\": {\"params\": {\"eps\": 1e-7}},\n"
                          " \"zero_optimization\": {\"reduce_bucket_size\": 500000000}}\n");
    write_file(ds_path, ISSUE4_JSON_BUCKETS);
    write_file(bad_path, "{\n  \"train\": {\"steps\": 10,}\n}\n");
    write_file(conflict_path, "{\"optimizer\": {\"params\": {\"weight_decay\": 0.2}}}");
    write_file(array_path, "[1, 2]");
    write_file(same_path, "{\"train\": {\"steps\": 10.0}, \"zero_optimization\": {\"reduce_bucket_size\": 5e8}}");

    struct config c;
    const char *sets[] = {"train.steps=20"};
    config_load(&c, main_path, ds_path, sets, 1);
    CHECK("merged: main file's keys", c.model.n_layer == 2 && c.data.seq_len == 128, "n_layer %d", c.model.n_layer);
    CHECK("merged: DeepSpeed file's keys", c.fp16.enabled && c.zero.stage == 3 && c.zero.offload_optimizer &&
          c.micro_batch == 2 && c.grad_accum == 8, "wrong");
    CHECK("merged: nested objects combine", strcmp(c.optimizer.type, "AdamW") == 0 &&
          fabsf(c.optimizer.lr - 5e-5f) < 1e-9f && fabsf(c.optimizer.weight_decay - 0.01f) < 1e-9f &&
          fabsf(c.optimizer.eps - 1e-7f) < 1e-12f,
          "lr %g wd %g eps %g", c.optimizer.lr, c.optimizer.weight_decay, c.optimizer.eps);
    CHECK("--set applies after the merge", c.train.steps == 20, "got %d", c.train.steps);
    config_free(&c);

    /* weight_decay 0.1 in main vs 0.01 in the DeepSpeed file. */
    char conflict_main[256];
    snprintf(conflict_main, sizeof conflict_main, "%s/main2.json", dir);
    write_file(conflict_main, "{\"optimizer\": {\"params\": {\"weight_decay\": 0.1}}}");
    struct load_args a = {.path = conflict_main, .ds_path = conflict_path};
    expect_fail("merge conflict names the key", &a, "'optimizer.params.weight_decay' is given in both");
    expect_fail("merge conflict names both files", &a, "conflict.json (0.2)");
    struct load_args same = {.path = main_path, .ds_path = same_path};
    struct child_result r;
    expect_ok("same value in both files (5e8 == 500000000, 10.0 == 10) is fine", &same, &r);

    struct load_args bad = {.path = bad_path};
    char want[300];
    snprintf(want, sizeof want, "config: %s:2:", bad_path);
    expect_fail("malformed JSON: FILE:LINE:COLUMN", &bad, want);
    struct load_args missing = {.path = "/nonexistent/shardlm.json"};
    expect_fail("missing file", &missing, "cannot read config file '/nonexistent/shardlm.json'");
    struct load_args missing_ds = {.path = main_path, .ds_path = "/nonexistent/ds.json"};
    expect_fail("missing DeepSpeed file", &missing_ds, "cannot read DeepSpeed config '/nonexistent/ds.json'");
    struct load_args directory = {.path = dir};
    expect_fail("a directory", &directory, "is a directory");
    struct load_args array = {.path = array_path};
    expect_fail("top level not an object", &array, "must be a JSON object");

    const char *paths[] = {main_path, ds_path, bad_path, conflict_path, array_path, same_path, conflict_main};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
        unlink(paths[i]);
    rmdir(dir);
}

/* ---- batch resolution --------------------------------------------------- */

struct batch_case {
    const char *name;
    const char *json;
    int world;
    int tbs, micro, accum; /* expected; 0 = must fail */
    const char *needle;    /* in the error */
};

static void test_batch(void)
{
    static const struct batch_case cases[] = {
        {"all three consistent", "{\"train_batch_size\": 64, \"train_micro_batch_size_per_gpu\": 2, "
                                 "\"gradient_accumulation_steps\": 8}", 4, 64, 2, 8, NULL},
        {"all three inconsistent", "{\"train_batch_size\": 64, \"train_micro_batch_size_per_gpu\": 2, "
                                   "\"gradient_accumulation_steps\": 8}", 2, 0, 0, 0,
         "train_batch_size (64) must equal train_micro_batch_size_per_gpu (2) x gradient_accumulation_steps (8) x "
         "world size (2) = 32"},
        {"tbs + micro -> accum", "{\"train_batch_size\": 64, \"train_micro_batch_size_per_gpu\": 2}", 4, 64, 2, 8, NULL},
        {"tbs + micro not divisible", "{\"train_batch_size\": 64, \"train_micro_batch_size_per_gpu\": 3}", 4, 0, 0, 0,
         "train_batch_size (64) is not a multiple of train_micro_batch_size_per_gpu (3) x world size (4)"},
        {"tbs + accum -> micro", "{\"train_batch_size\": 64, \"gradient_accumulation_steps\": 8}", 4, 64, 2, 8, NULL},
        {"tbs + accum not divisible", "{\"train_batch_size\": 64, \"gradient_accumulation_steps\": 3}", 2, 0, 0, 0,
         "gradient_accumulation_steps (3) x world size (2)"},
        {"micro + accum -> tbs", "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 8}", 4, 64,
         2, 8, NULL},
        {"only tbs", "{\"train_batch_size\": 64}", 4, 64, 16, 1, NULL},
        {"only tbs not divisible", "{\"train_batch_size\": 10}", 4, 0, 0, 0,
         "train_batch_size (10) is not a multiple of the world size (4)"},
        {"only micro", "{\"train_micro_batch_size_per_gpu\": 3}", 4, 12, 3, 1, NULL},
        {"only accum", "{\"gradient_accumulation_steps\": 4}", 1, 0, 0, 0,
         "train_batch_size or train_micro_batch_size_per_gpu must be given"},
        {"none", "{}", 1, 0, 0, 0, "train_batch_size or train_micro_batch_size_per_gpu must be given"},
        {"product overflows", "{\"train_micro_batch_size_per_gpu\": 2000000000, \"gradient_accumulation_steps\": "
                              "2000000000}", 8, 0, 0, 0, "is too large"},
        {"integral reals", "{\"train_batch_size\": 32.0, \"train_micro_batch_size_per_gpu\": 4e0}", 1, 32, 4, 8, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct batch_case *bc = &cases[i];
        char name[160];
        snprintf(name, sizeof name, "batch: %s (world %d)", bc->name, bc->world);
        if (!bc->needle) {
            struct config c;
            load(&c, bc->json, NULL, NULL);
            config_resolve_batch(&c, bc->world);
            CHECK(name, c.train_batch_size == bc->tbs && c.micro_batch == bc->micro && c.grad_accum == bc->accum,
                  "got %d %d %d, want %d %d %d", c.train_batch_size, c.micro_batch, c.grad_accum, bc->tbs, bc->micro,
                  bc->accum);
            config_free(&c);
        } else {
            struct load_args a = {.json = bc->json, .world = bc->world};
            expect_fail(name, &a, bc->needle);
        }
    }
    expect_fail_json("batch: zero train_batch_size", "{\"train_batch_size\": 0}", NULL,
                     "'train_batch_size' must be positive, got 0");
    expect_fail_json("batch: negative micro", "{\"train_micro_batch_size_per_gpu\": -2}", NULL,
                     "'train_micro_batch_size_per_gpu' must be positive");
    expect_fail_json("batch: \"auto\" (Hugging Face)", "{\"train_micro_batch_size_per_gpu\": \"auto\"}", NULL,
                     "'train_micro_batch_size_per_gpu' is \"auto\": \"auto\" is filled in by the Hugging Face Trainer");
}

/* ---- errors ------------------------------------------------------------ */

struct error_case {
    const char *name;
    const char *json;
    const char *set;
    const char *needle;
};

static void test_errors(void)
{
    static const struct error_case cases[] = {
        {"unknown nested key, with a suggestion", "{\"zero_optimization\": {\"stagee\": 3}}", NULL,
         "unknown key 'zero_optimization.stagee' (did you mean 'zero_optimization.stage'?)"},
        {"unknown top-level key", "{\"modle_name\": 1, \"x\": 2}", NULL, "unknown key 'modle_name'"},
        {"unknown key lists the known ones", "{\"checkpoint\": {\"path\": \"x\"}}", NULL,
         "the keys of 'checkpoint' are: dir, every, keep"},
        {"wrong type", "{\"model\": {\"n_layer\": \"12\"}}", NULL, "'model.n_layer' must be an integer, got string"},
        {"non-integral real", "{\"model\": {\"n_layer\": 12.5}}", NULL, "'model.n_layer' must be an integer, got 12.5"},
        {"bool for a number", "{\"gradient_clipping\": true}", NULL, "'gradient_clipping' must be a number, got boolean"},
        {"object expected", "{\"fp16\": true}", NULL, "'fp16' must be an object"},
        {"null where not allowed", "{\"model\": {\"n_head\": null}}", NULL, "'model.n_head' must be an integer, got null"},
        {"auto in fp16", "{\"fp16\": {\"enabled\": \"auto\"}}", NULL, "'fp16.enabled' is \"auto\""},
        {"duplicate key", "{\"train\": {\"steps\": 1, \"steps\": 2}}", NULL, "duplicate object key"},
        {"n_layer zero", "{\"model\": {\"n_layer\": 0}}", NULL, "'model.n_layer' must be positive, got 0"},
        {"n_head negative", "{\"model\": {\"n_head\": -1}}", NULL, "'model.n_head' must be positive"},
        {"n_embd zero", "{\"model\": {\"n_embd\": 0}}", NULL, "'model.n_embd' must be positive"},
        {"n_positions zero", "{\"model\": {\"n_positions\": 0}}", NULL, "'model.n_positions' must be positive"},
        {"vocab_size zero", "{\"model\": {\"vocab_size\": 0}}", NULL, "'model.vocab_size' must be positive"},
        {"n_embd not divisible by n_head", "{\"model\": {\"n_embd\": 100, \"n_head\": 12}}", NULL,
         "'model.n_embd' (100) must be divisible by 'model.n_head' (12)"},
        {"unknown model type", "{\"model\": {\"type\": \"mamba\"}}", NULL,
         "'model.type' is \"mamba\"; known model types: gpt2, llama"},
        {"unknown preset lists the known ones", "{\"model\": {\"preset\": \"llama3-70b\"}}", NULL,
         "'model.preset' is \"llama3-70b\"; known presets: gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b, llama2-7b, "
         "llama2-13b, llama2-70b, llama3-8b"},
        {"n_head not a multiple of n_kv_head", "{\"model\": {\"type\": \"llama\", \"n_kv_head\": 5}}", NULL,
         "'model.n_head' (12) must be a multiple of 'model.n_kv_head' (5)"},
        {"gpt2 with a custom ffn_dim", "{\"model\": {\"ffn_dim\": 1000}}", NULL,
         "GPT-2 has n_kv_head = n_head (12) and ffn_dim = 4 n_embd (3072)"},
        {"llama ffn_dim zero", "{\"model\": {\"type\": \"llama\", \"ffn_dim\": 0}}", NULL,
         "'model.ffn_dim' must be positive, got 0"},
        {"llama ffn_dim negative", "{\"model\": {\"type\": \"llama\"}}", "model.ffn_dim=-8",
         "'model.ffn_dim' must be positive, got -8"},
        {"llama n_kv_head not dividing n_head", "{\"model\": {\"type\": \"llama\", \"n_head\": 8, \"n_kv_head\": 3}}",
         NULL, "'model.n_head' (8) must be a multiple of 'model.n_kv_head' (3)"},
        {"llama odd head dimension", "{\"model\": {\"type\": \"llama\", \"n_embd\": 36, \"n_head\": 4}}", NULL,
         "'model.n_embd' / 'model.n_head') is 9, odd: rotary embeddings rotate channel pairs"},
        {"unknown rope_scaling type", "{\"model\": {\"type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"yarn\"}}}",
         NULL, "'model.rope_scaling.rope_type' is \"yarn\"; supported: \"llama3\""},
        {"linear rope_scaling without factor",
         "{\"model\": {\"type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"linear\"}}}", NULL,
         "'model.rope_scaling.factor' of a \"linear\" rope_scaling must be given"},
        {"unknown rope_scaling type, legacy key",
         "{\"model\": {\"type\": \"llama\", \"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}}}", NULL,
         "'model.rope_scaling.rope_type' is \"dynamic\""},
        {"rope_scaling factor below 1",
         "{\"model\": {\"type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 0.5, "
         "\"low_freq_factor\": 1, \"high_freq_factor\": 4}}}", NULL,
         "'model.rope_scaling.factor' must be at least 1, got 0.5"},
        {"llama3 rope_scaling without its numbers (issue 46)",
         "{\"model\": {\"type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8}}}", NULL,
         "'model.rope_scaling' of rope_type \"llama3\" lacks low_freq_factor, high_freq_factor, as transformers "
         "refuses it"},
        {"llama3 rope_scaling with no number at all (issue 46)",
         "{\"model\": {\"type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"llama3\"}}}", NULL,
         "lacks factor, low_freq_factor, high_freq_factor"},
        {"rope_theta zero", "{\"model\": {\"type\": \"llama\", \"rope_theta\": 0}}", NULL,
         "'model.rope_theta' must be larger than 1, got 0"},
        {"rms_norm_eps zero", "{\"model\": {\"type\": \"llama\", \"rms_norm_eps\": 0}}", NULL,
         "'model.rms_norm_eps' must be in (0, 1], got 0"},
        {"a Llama key on GPT-2", "{\"model\": {\"rope_theta\": 500000}}", NULL,
         "'model.rope_theta' is a Llama key; GPT-2 has LayerNorm"},
        {"tie_word_embeddings on GPT-2", "{}", "model.tie_word_embeddings=false",
         "'model.tie_word_embeddings' is a Llama key"},
        {"offload_param below stage 3",
         "{\"zero_optimization\": {\"stage\": 2, \"offload_param\": {\"device\": \"cpu\"}}}", NULL,
         "'zero_optimization.offload_param' needs zero_optimization.stage 3"},
        {"seq_len > n_positions", "{\"data\": {\"seq_len\": 2048}}", NULL,
         "'data.seq_len' (2048) is larger than 'model.n_positions' (1024): a sequence longer than the context"},
        {"seq_len zero", "{\"data\": {\"seq_len\": 0}}", NULL, "'data.seq_len' must be positive"},
        {"empty data.train", "{\"data\": {\"train\": \"\"}}", NULL, "'data.train' is an empty string"},
        {"steps zero", "{\"train\": {\"steps\": 0}}", NULL, "'train.steps' must be positive"},
        {"negative eval_every", "{\"train\": {\"eval_every\": -1}}", NULL, "'train.eval_every' must be >= 0"},
        {"zero temperature", "{\"train\": {\"sample_temperature\": 0}}", NULL, "'train.sample_temperature' must be positive"},
        {"negative keep", "{\"checkpoint\": {\"keep\": -1}}", NULL, "'checkpoint.keep' must be >= 0"},
        {"negative lr", "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": -1e-3}}}", NULL,
         "'optimizer.params.lr' must be >= 0"},
        {"negative eps", "{}", "optimizer.params.eps=-1e-8", "'optimizer.params.eps' must be >= 0"},
        {"negative weight_decay", "{}", "optimizer.params.weight_decay=-0.1",
         "'optimizer.params.weight_decay' must be >= 0"},
        {"negative gradient_clipping", "{\"gradient_clipping\": -1.0}", NULL, "'gradient_clipping' must be >= 0"},
        {"beta2 = 1", "{}", "optimizer.params.betas=[0.9, 1.0]", "'optimizer.params.betas[1]' must be in [0, 1)"},
        {"negative beta1", "{}", "optimizer.params.betas=[-0.1, 0.9]", "'optimizer.params.betas[0]' must be in [0, 1)"},
        {"one beta", "{}", "optimizer.params.betas=[0.9]", "'optimizer.params.betas' must be an array of two numbers"},
        {"unknown optimizer", "{\"optimizer\": {\"type\": \"Lamb\"}}", NULL, "Adam and AdamW"},
        {"bias_correction false", "{}", "optimizer.params.bias_correction=false",
         "'optimizer.params.bias_correction' is false"},
        {"amsgrad", "{}", "optimizer.params.amsgrad=true", "'optimizer.params.amsgrad' is true"},
        {"max_grad_norm", "{}", "optimizer.params.max_grad_norm=1.0", "use the top-level \"gradient_clipping\""},
        {"zero stage 4", "{\"zero_optimization\": {\"stage\": 4}}", NULL,
         "'zero_optimization.stage' must be 0, 1, 2 or 3, got 4"},
        {"negative zero stage", "{}", "zero_optimization.stage=-1", "'zero_optimization.stage' must be 0, 1, 2 or 3"},
        {"nvme offload without a path", "{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"nvme\"}}}",
         NULL, "'zero_optimization.offload_optimizer.nvme_path' is not set"},
        {"nvme param offload without a path",
         "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\"}}}", NULL,
         "'zero_optimization.offload_param.nvme_path' is not set"},
        {"nvme param offload at stage 2",
         "{\"zero_optimization\": {\"stage\": 2, \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/x\"}}}",
         NULL, "'zero_optimization.offload_param' needs zero_optimization.stage 3"},
        {"nvme buffer_count 0", "{}", "zero_optimization.offload_optimizer.buffer_count=0",
         "'zero_optimization.offload_optimizer.buffer_count' must be positive"},
        {"dpo beta 0", "{\"dpo\": {\"beta\": 0}}", NULL, "dpo.beta must be a positive number"},
        {"dpo loss_type", "{\"dpo\": {\"loss_type\": \"hinge\"}}", NULL, "'dpo.loss_type' is \"hinge\""},
        {"dpo smoothing with ipo", "{\"dpo\": {\"loss_type\": \"ipo\", \"label_smoothing\": 0.1}}", NULL,
         "dpo.label_smoothing is for loss_type \"sigmoid\""},
        {"dpo full fine-tune without precompute", "{\"dpo\": {\"precompute_ref_log_probs\": false}}", NULL,
         "'dpo.precompute_ref_log_probs' is false on a full fine-tune"},
        {"dpo max_length", "{\"dpo\": {\"max_length\": 512}}", NULL, "pass --max-seq-length to tools/prepare_data.py"},
        {"unknown offload device", "{}", "zero_optimization.offload_optimizer.device=gpu",
         "'zero_optimization.offload_optimizer.device' is \"gpu\""},
        {"partial offload", "{}", "zero_optimization.offload_optimizer.ratio=0.5",
         "'zero_optimization.offload_optimizer.ratio' is 0.5"},
        {"deprecated cpu_offload", "{\"zero_optimization\": {\"cpu_offload\": true}}", NULL,
         "'zero_optimization.cpu_offload' is DeepSpeed's deprecated spelling"},
        {"fp16 and bf16", "{\"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}", NULL,
         "'fp16.enabled' and 'bf16.enabled' are both true"},
        {"loss_scale_window 0", "{\"fp16\": {\"enabled\": true, \"loss_scale_window\": 0}}", NULL,
         "'fp16.loss_scale_window' must be positive"},
        {"hysteresis 0", "{\"fp16\": {\"enabled\": true, \"hysteresis\": 0}}", NULL,
         "'fp16.hysteresis' must be at least 1"},
        {"min_loss_scale 0", "{\"fp16\": {\"enabled\": true, \"min_loss_scale\": 0}}", NULL,
         "'fp16.min_loss_scale' must be positive"},
        {"negative loss_scale", "{\"fp16\": {\"loss_scale\": -1}}", NULL, "'fp16.loss_scale' must be >= 0"},
        {"initial_scale_power too big", "{\"fp16\": {\"initial_scale_power\": 200}}", NULL,
         "'fp16.initial_scale_power' must be between 0 and 127"},
        {"fp16 master weights", "{}", "fp16.fp16_master_weights_and_grads=true",
         "'fp16.fp16_master_weights_and_grads' is true"},
        {"bf16 optimizer states", "{}", "bf16.bf16_optimizer_states=true", "'bf16.bf16_optimizer_states' is true"},
        {"interval 0", "{\"activation_checkpointing\": {\"enabled\": true, \"interval\": 0}}", NULL,
         "'activation_checkpointing.interval' must be between 1 and model.n_layer (12), got 0"},
        {"interval > n_layer", "{\"activation_checkpointing\": {\"enabled\": true, \"interval\": 13}}", NULL,
         "'activation_checkpointing.interval' must be between 1 and model.n_layer (12), got 13"},
        {"scheduler without type", "{\"scheduler\": {\"params\": {}}}", NULL, "'scheduler.type' is missing"},
        {"unknown scheduler", "{\"scheduler\": {\"type\": \"Cosine\"}}", NULL,
         "known scheduler types: WarmupLR, WarmupDecayLR, WarmupCosineLR"},
        {"scheduler case", "{\"scheduler\": {\"type\": \"warmuplr\"}}", NULL, "did you mean \"WarmupLR\"?"},
        {"OneCycle", "{\"scheduler\": {\"type\": \"OneCycle\"}}", NULL, "OneCycle is a DeepSpeed schedule that shardlm"},
        {"param of another schedule",
         "{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"total_num_steps\": 10}}}", NULL,
         "'scheduler.params.total_num_steps' is not a parameter of WarmupLR"},
        {"decay without total_num_steps", "{\"scheduler\": {\"type\": \"WarmupDecayLR\"}}", NULL,
         "'scheduler.params.total_num_steps' is required by WarmupDecayLR"},
        {"total < warmup", "{\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"total_num_steps\": 100}}}",
         NULL, "'scheduler.params.total_num_steps' (100) is smaller than 'scheduler.params.warmup_num_steps' (1000)"},
        {"warmup_num_steps zero", "{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 0}}}",
         NULL, "'scheduler.params.warmup_num_steps' must be positive"},
        {"warmup_type", "{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_type\": \"cosine\"}}}", NULL,
         "'scheduler.params.warmup_type' is \"cosine\""},
        {"last_batch_iteration", "{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"last_batch_iteration\": 5}}}",
         NULL, "'scheduler.params.last_batch_iteration' must be -1"},
        {"negative warmup_max_lr", "{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_max_lr\": -1}}}",
         NULL, "'scheduler.params.warmup_max_lr' must be >= 0"},
        {"cos_min_ratio > 1",
         "{\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"total_num_steps\": 2000, "
         "\"cos_min_ratio\": 2}}}",
         NULL, "'scheduler.params.cos_min_ratio' must be between 0 and 1"},
        {"steps_per_print zero", "{\"steps_per_print\": 0}", NULL, "'steps_per_print' must be positive"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[160];
        snprintf(name, sizeof name, "error: %s", cases[i].name);
        expect_fail_json(name, cases[i].json, cases[i].set, cases[i].needle);
    }
}

/* ---- warnings ---------------------------------------------------------- */

static void test_warnings(void)
{
    struct child_result r;
    struct load_args a = {
        .json = "{\"zero_optimization\": {\"stage\": 3, \"reduce_scatter\": true, \"allgather_bucket_size\": 5e8,"
                " \"sub_group_size\": 1e9, \"offload_param\": {\"device\": \"cpu\", \"pin_memory\": true}},"
                " \"activation_checkpointing\": {\"enabled\": true, \"partition_activations\": true,"
                " \"number_checkpoints\": null},"
                " \"fp16\": {\"enabled\": true, \"auto_cast\": false},"
                " \"tensorboard\": {\"enabled\": true, \"output_path\": \"tb\"},"
                " \"zero_allow_untested_optimizer\": true, \"wall_clock_breakdown\": true}",
    };
    expect_ok("no-effect keys load", &a, &r);
    static const char *const warned[] = {
        "zero_optimization.reduce_scatter is accepted but has no effect in shardlm",
        "zero_optimization.allgather_bucket_size is accepted but has no effect in shardlm",
        "zero_optimization.sub_group_size is accepted but has no effect in shardlm",
        "activation_checkpointing.partition_activations is accepted but has no effect in shardlm",
        "activation_checkpointing.number_checkpoints is accepted but has no effect in shardlm",
        "fp16.auto_cast is accepted but has no effect in shardlm",
        "tensorboard is accepted but has no effect in shardlm",
        "zero_allow_untested_optimizer is accepted but has no effect in shardlm",
    };
    for (size_t i = 0; i < sizeof warned / sizeof warned[0]; i++) {
        char name[200];
        snprintf(name, sizeof name, "warned once: %.60s", warned[i]);
        CHECK(name, count_occurrences(r.err, warned[i]) == 1, "stderr: %s", r.err);
    }
    CHECK("offload_param is honoured (stage 3): no warning", strstr(r.err, "offload_param") == NULL,
          "stderr: %s", r.err);
    CHECK("wall_clock_breakdown is implemented: no warning", strstr(r.err, "wall_clock_breakdown") == NULL,
          "stderr: %s", r.err);
    CHECK("exactly the expected warnings", count_occurrences(r.err, "warning:") == 8, "stderr: %s", r.err);

    struct load_args b = {.json = "{\"activation_checkpointing\": {\"partition_activations\": false}}"};
    expect_ok("activation_checkpointing without enabled loads", &b, &r);
    CHECK("activation_checkpointing without enabled: told it is off",
          strstr(r.err, "activation_checkpointing has no \"enabled\" key") != NULL, "stderr: %s", r.err);
}

/* Llama's keys: Hugging Face's names and meaning, Llama 2's published values as defaults. */
static void test_llama(void)
{
    struct config c;
    load(&c, "{\"model\": {\"type\": \"llama\", \"n_head\": 8, \"n_kv_head\": 2, \"n_embd\": 64, \"ffn_dim\": 176}}",
         NULL, NULL);
    CHECK("llama defaults: rms_norm_eps 1e-5, rope_theta 1e4, untied, no rope scaling",
          c.model.norm_eps == 1e-5 && c.model.rope_theta == 10000.0 && !c.model.tie_embeddings &&
              c.model.rope_scaling.type == ROPE_SCALING_NONE,
          "eps %g theta %g tie %d scaling %d", c.model.norm_eps, c.model.rope_theta, c.model.tie_embeddings,
          c.model.rope_scaling.type);
    config_free(&c);
    load(&c,
         "{\"model\": {\"type\": \"llama\", \"n_head\": 8, \"n_kv_head\": 2, \"n_embd\": 64, \"ffn_dim\": 176, "
         "\"rms_norm_eps\": 1e-6, \"rope_theta\": 500000.0, \"tie_word_embeddings\": true, \"rope_scaling\": "
         "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
         "\"original_max_position_embeddings\": 8192}}}",
         NULL, NULL);
    CHECK("llama 3.1 keys read",
          c.model.norm_eps == 1e-6 && c.model.rope_theta == 500000.0 && c.model.tie_embeddings &&
              c.model.rope_scaling.type == ROPE_SCALING_LLAMA3 && c.model.rope_scaling.factor == 8.0 &&
              c.model.rope_scaling.low_freq_factor == 1.0 && c.model.rope_scaling.high_freq_factor == 4.0 &&
              c.model.rope_scaling.original_max_positions == 8192,
          "eps %g theta %g tie %d", c.model.norm_eps, c.model.rope_theta, c.model.tie_embeddings);
    config_free(&c);
    load(&c, "{\"model\": {\"type\": \"llama\", \"rope_scaling\": null}}", NULL, NULL);
    CHECK("rope_scaling null: none", c.model.rope_scaling.type == ROPE_SCALING_NONE, "got %d", c.model.rope_scaling.type);
    config_free(&c);
    load(&c, "{\"model\": {\"type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"default\"}}}", NULL, NULL);
    CHECK("rope_scaling of type default: none", c.model.rope_scaling.type == ROPE_SCALING_NONE, "got %d",
          c.model.rope_scaling.type);
    config_free(&c);
    load(&c, "{\"model\": {\"type\": \"llama\", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.5}}}", NULL,
         NULL);
    CHECK("rope_scaling linear (4.x's 'type' key): factor read", c.model.rope_scaling.type == ROPE_SCALING_LINEAR &&
              c.model.rope_scaling.factor == 2.5, "type %d factor %g", c.model.rope_scaling.type,
          c.model.rope_scaling.factor);
    config_free(&c);
}

/* ---- lora (issue 19) ---- */

#define LLAMA_SMALL "\"model\": {\"type\": \"llama\", \"n_layer\": 2, \"n_head\": 4, \"n_embd\": 64, \"ffn_dim\": 96}"

static bool names_are(const char *const *got, int n, const char *const *want)
{
    int k = 0;
    while (want[k])
        k++;
    if (n != k)
        return false;
    for (int i = 0; i < n; i++)
        if (strcmp(got[i], want[i]) != 0)
            return false;
    return true;
}

static void test_lora_values(void)
{
    struct config c;
    load(&c, "{}", NULL, NULL);
    CHECK("lora: off without the section", !c.lora.enabled, "enabled");
    config_free(&c);
    load(&c, "{\"lora\": null}", NULL, NULL);
    CHECK("lora: null is off", !c.lora.enabled, "enabled");
    config_free(&c);

    load(&c, "{\"lora\": {}}", NULL, NULL);
    static const char *const gpt2_default[] = {"c_attn", NULL};
    CHECK("lora: PEFT's defaults (r 8, alpha 8, dropout 0, init default)",
          c.lora.enabled && c.lora.r == 8 && c.lora.alpha == 8.0 && c.lora.dropout == 0.0 &&
              c.lora.init == LORA_INIT_DEFAULT && c.lora.n_modules_to_save == 0 && !c.lora.all_linear,
          "enabled %d r %d alpha %g dropout %g init %d", c.lora.enabled, c.lora.r, c.lora.alpha, c.lora.dropout,
          c.lora.init);
    CHECK("lora: GPT-2's default target is PEFT's (c_attn)",
          names_are(c.lora.target_modules, c.lora.n_target_modules, gpt2_default), "%d targets",
          c.lora.n_target_modules);
    char *dump = config_dump(&c);
    CHECK("lora: the resolved config shows the defaults",
          strstr(dump, "\"target_modules\": [\n      \"c_attn\"\n    ]") && strstr(dump, "\"r\": 8") &&
              strstr(dump, "\"init\": \"default\""),
          "%s", dump);
    free(dump);
    config_free(&c);

    load(&c, "{" LLAMA_SMALL ", \"lora\": {}}", NULL, NULL);
    static const char *const llama_default[] = {"q_proj", "v_proj", NULL};
    CHECK("lora: Llama's default targets are PEFT's (q_proj, v_proj)",
          names_are(c.lora.target_modules, c.lora.n_target_modules, llama_default), "%d targets",
          c.lora.n_target_modules);
    config_free(&c);

    load(&c,
         "{" LLAMA_SMALL ", \"lora\": {\"r\": 16, \"lora_alpha\": 32, \"lora_dropout\": 0.05, \"init\": "
         "\"gaussian\", \"target_modules\": [\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\", "
         "\"up_proj\", \"down_proj\"], \"modules_to_save\": [\"lm_head\", \"embed_tokens\"]}}",
         NULL, NULL);
    static const char *const all7[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                                       NULL};
    static const char *const saved[] = {"lm_head", "embed_tokens", NULL};
    CHECK("lora: PEFT's key names, every Llama linear layer, modules_to_save",
          c.lora.r == 16 && c.lora.alpha == 32.0 && c.lora.dropout == 0.05 && c.lora.init == LORA_INIT_GAUSSIAN &&
              names_are(c.lora.target_modules, c.lora.n_target_modules, all7) &&
              names_are(c.lora.modules_to_save, c.lora.n_modules_to_save, saved),
          "r %d alpha %g dropout %g init %d targets %d saved %d", c.lora.r, c.lora.alpha, c.lora.dropout, c.lora.init,
          c.lora.n_target_modules, c.lora.n_modules_to_save);
    config_free(&c);

    load(&c, "{\"lora\": {\"alpha\": 16, \"lora_alpha\": 16, \"target_modules\": \"all-linear\"}}", NULL, NULL);
    CHECK("lora: all-linear; alpha given under both names with one value",
          c.lora.all_linear && c.lora.n_target_modules == 0 && c.lora.alpha == 16.0, "all_linear %d alpha %g",
          c.lora.all_linear, c.lora.alpha);
    config_free(&c);

    load(&c, "{\"lora\": {\"target_modules\": [\"attn.c_proj\", \"mlp.c_fc\"], \"modules_to_save\": [\"ln_f\"]}}",
         NULL, NULL);
    CHECK("lora: dotted module names match as in PEFT", c.lora.n_target_modules == 2 && c.lora.n_modules_to_save == 1,
          "%d targets %d saved", c.lora.n_target_modules, c.lora.n_modules_to_save);
    config_free(&c);

    load(&c, "{\"lora\": {\"init\": false}}", NULL, NULL);
    CHECK("lora: init false is PEFT's init_lora_weights=False", c.lora.init == LORA_INIT_RANDOM, "init %d",
          c.lora.init);
    config_free(&c);

    load(&c, "{}", "lora.r=4", "lora.dropout=0.1");
    CHECK("lora: --set creates the section", c.lora.enabled && c.lora.r == 4 && c.lora.dropout == 0.1,
          "enabled %d r %d dropout %g", c.lora.enabled, c.lora.r, c.lora.dropout);
    config_free(&c);
}

/* Every bad lora input: exit 2, one line that names the key and what to do. */
static void test_lora_errors(void)
{
    static const struct error_case cases[] = {
        {"r zero", "{\"lora\": {\"r\": 0}}", NULL,
         "'lora.r' must be a positive integer (the adapters' rank; PEFT's default is 8), got 0"},
        {"r negative", "{\"lora\": {}}", "lora.r=-4", "'lora.r' must be a positive integer"},
        {"r not an integer", "{\"lora\": {\"r\": 8.5}}", NULL, "'lora.r' must be an integer, got 8.5"},
        {"r too large", "{\"lora\": {\"r\": 2000000000}}", NULL,
         "the adapters of one linear layer would hold 7.68e+12 elements (lora.r 2000000000"},
        {"alpha zero", "{\"lora\": {\"alpha\": 0}}", NULL,
         "'lora.alpha' must be positive (the adapters' output is scaled by alpha / r; PEFT's default is 8), got 0"},
        {"lora_alpha negative", "{\"lora\": {\"lora_alpha\": -16}}", NULL, "'lora.lora_alpha' must be positive"},
        {"alpha under two names", "{\"lora\": {\"alpha\": 16, \"lora_alpha\": 32}}", NULL,
         "'lora.alpha' and 'lora.lora_alpha' name the same setting with different values; give one"},
        {"dropout one", "{\"lora\": {\"dropout\": 1}}", NULL,
         "'lora.dropout' must be in [0, 1) (the probability that an adapter input is zeroed; 0: no dropout), got 1"},
        {"dropout negative", "{\"lora\": {\"dropout\": -0.1}}", NULL, "'lora.dropout' must be in [0, 1)"},
        {"lora_dropout too large", "{\"lora\": {\"lora_dropout\": 1.5}}", NULL,
         "'lora.lora_dropout' must be in [0, 1)"},
        {"target on no linear layer (Llama)", "{" LLAMA_SMALL ", \"lora\": {\"target_modules\": [\"q_proj\", "
         "\"qproj\"]}}", NULL, "'lora.target_modules' has \"qproj\", which matches no linear layer of this llama "
         "model; its linear layers are: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"},
        {"Llama name on GPT-2", "{\"lora\": {\"target_modules\": [\"q_proj\"]}}", NULL,
         "matches no linear layer of this gpt2 model; its linear layers are: c_attn, c_proj, c_fc"},
        {"a norm is no linear layer", "{\"lora\": {\"target_modules\": [\"ln_1\"]}}", NULL,
         "'lora.target_modules' has \"ln_1\", which matches no linear layer"},
        {"a partial name matches nothing", "{\"lora\": {\"target_modules\": [\"attn\"]}}", NULL,
         "'lora.target_modules' has \"attn\", which matches no linear layer"},
        {"lm_head as a target", "{" LLAMA_SMALL ", \"lora\": {\"target_modules\": [\"lm_head\"]}}", NULL,
         "(to train the LM head, list it in lora.modules_to_save)"},
        {"empty targets", "{\"lora\": {\"target_modules\": []}}", NULL, "'lora.target_modules' is empty"},
        {"a regex", "{\"lora\": {\"target_modules\": \".*proj\"}}", NULL,
         "'lora.target_modules' is \".*proj\"; give a list of module names"},
        {"targets of the wrong type", "{\"lora\": {\"target_modules\": 3}}", NULL,
         "'lora.target_modules' must be a list of module names or \"all-linear\", got 3"},
        {"a target that is no string", "{\"lora\": {\"target_modules\": [\"c_attn\", 3]}}", NULL,
         "'lora.target_modules[1]' must be a string (a module name), got 3"},
        {"lm_head of a tied model", "{\"lora\": {\"modules_to_save\": [\"lm_head\"]}}", NULL,
         "'lora.modules_to_save' has \"lm_head\", which matches no module of this gpt2 model (its LM head is the "
         "token embedding, tied); its modules are: wte, wpe, ln_1, c_attn, c_proj, ln_2, c_fc, ln_f"},
        {"lm_head of a tied Llama", "{\"model\": {\"type\": \"llama\", \"tie_word_embeddings\": true}, \"lora\": "
         "{\"modules_to_save\": [\"lm_head\"]}}", NULL, "(its LM head is the token embedding, tied)"},
        {"a missing module to save", "{" LLAMA_SMALL ", \"lora\": {\"modules_to_save\": [\"score\"]}}", NULL,
         "'lora.modules_to_save' has \"score\", which matches no module of this llama model; its modules are: "
         "embed_tokens, input_layernorm, q_proj, k_proj, v_proj, o_proj, post_attention_layernorm, gate_proj, "
         "up_proj, down_proj, norm, lm_head"},
        {"modules_to_save of the wrong type", "{\"lora\": {\"modules_to_save\": \"lm_head\"}}", NULL,
         "'lora.modules_to_save' must be an array, got string"},
        {"adapted and saved", "{\"lora\": {\"target_modules\": [\"c_attn\"], \"modules_to_save\": [\"c_attn\"]}}",
         NULL, "\"c_attn\" is in lora.modules_to_save and adapted by lora.target_modules; a module is either adapted "
         "or trained in full: remove it from one of them"},
        {"all-linear and saved", "{\"lora\": {\"target_modules\": \"all-linear\", \"modules_to_save\": "
         "[\"c_fc\"]}}", NULL, "\"c_fc\" is in lora.modules_to_save and adapted"},
        {"unknown init", "{\"lora\": {\"init\": \"pissa\"}}", NULL,
         "'lora.init' is \"pissa\"; known: \"default\" or true (PEFT's: A Kaiming-uniform, B zero), \"gaussian\""},
        {"init not a name", "{\"lora\": {\"init\": 3}}", NULL, "'lora.init' is 3; known: \"default\" or true"},
        {"unknown key", "{\"lora\": {\"rank\": 8}}", NULL, "unknown key 'lora.rank'"},
        {"not an object", "{\"lora\": true}", NULL, "'lora' must be an object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[160];
        struct child_result r;
        struct load_args a = {.json = cases[i].json, .sets = {cases[i].set}};
        run_child(&a, &r);
        snprintf(name, sizeof name, "lora error: %s", cases[i].name);
        const char *nl = strchr(r.err, '\n');
        CHECK(name,
              r.status == EXIT_BAD_INPUT && strstr(r.err, "error: config: ") && strstr(r.err, cases[i].needle) &&
                  nl && nl[1] == '\0',
              "status %d, stderr: %s (wanted status 2 and one line with \"%s\")", r.status, r.err, cases[i].needle);
    }
}

/* issue 36's offload to NVMe and issue 37's dpo section: values and defaults */
static void test_nvme_and_dpo_values(void)
{
    struct config c;
    load(&c,
         "{\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": "
         "\"/nvme/a\", \"buffer_count\": 6}, \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/nvme/b\", "
         "\"buffer_size\": 5e6}}}",
         NULL, NULL);
    CHECK("nvme: optimizer on host and in files", c.zero.offload_optimizer && c.zero.offload_optimizer_nvme &&
          strcmp(c.zero.optimizer_nvme_path, "/nvme/a") == 0 && c.zero.optimizer_buffer_count == 6, "wrong");
    CHECK("nvme: parameters on host and in files", c.zero.offload_param && c.zero.offload_param_nvme &&
          strcmp(c.zero.param_nvme_path, "/nvme/b") == 0 && c.zero.param_buffer_size == 5e6 &&
          c.zero.param_buffer_count == 5, "wrong");
    config_free(&c);
    load(&c, "{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}}", NULL, NULL);
    CHECK("nvme: cpu offload is not nvme", c.zero.offload_optimizer && !c.zero.offload_optimizer_nvme &&
          !c.zero.optimizer_nvme_path && c.zero.optimizer_buffer_count == 4, "wrong");
    config_free(&c);
    load(&c, "{\"dpo\": {}}", NULL, NULL);
    CHECK("dpo: TRL's defaults (beta 0.1, sigmoid, no smoothing); full fine-tune precomputes",
          c.dpo.enabled && c.dpo.beta == 0.1 && c.dpo.loss_type == DPO_SIGMOID && c.dpo.label_smoothing == 0.0 &&
              c.dpo.precompute_ref_log_probs && !c.dpo.ref_log_probs_path, "wrong");
    config_free(&c);
    load(&c, "{\"lora\": {}, \"dpo\": {\"beta\": 0.5, \"loss_type\": \"ipo\", \"ref_log_probs_path\": \"r.h5\"}}",
         NULL, NULL);
    CHECK("dpo: LoRA's reference is the base in the same step", c.dpo.enabled && c.dpo.beta == 0.5 &&
          c.dpo.loss_type == DPO_IPO && !c.dpo.precompute_ref_log_probs && strcmp(c.dpo.ref_log_probs_path, "r.h5") == 0,
          "wrong");
    config_free(&c);
    load(&c, "{}", NULL, NULL);
    CHECK("dpo: off without the section", !c.dpo.enabled, "enabled");
    config_free(&c);
}

int main(void)
{
    test_defaults();
    test_llama();
    test_stage3_defaults_and_values();
    test_issue4();
    test_optimizer();
    test_scheduler();
    test_set();
    test_files();
    test_batch();
    test_errors();
    test_warnings();
    test_lora_values();
    test_lora_errors();
    test_nvme_and_dpo_values();
    return check_status();
}
