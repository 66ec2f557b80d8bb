#include "train.h"
#include "train_internal.h"
#include "ckpt_run.h"
#include "dpo_ref.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/arena.h"
#include "backend/backend.h"
#include "io/ckpt.h"
#include "data/data.h"
#include "core/dump.h"
#include "families/family.h"
#include "io/hf.h"
#include "data/loader.h"
#include "engine/loss_scaler.h"
#include "model/model.h"
#include "engine/plan.h"
#include "engine/sched.h"
#include "sample.h"
#include "engine/session.h"
#include "tokenizer/tokenizer.h"
#include "core/util.h"
#include "zero/zero.h"
#include "zero/nvme.h"

/* Set by SIGUSR1 or SIGTERM (Slurm's warning before a time limit) or SIGINT
 * (Ctrl-C): finish the step, save, exit with EXIT_PREEMPTED so the job script
 * requeues. */
static volatile sig_atomic_t g_stop_signal;

static void on_stop_signal(int sig) { g_stop_signal = sig; }

void train_install_stop_handlers(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    /* a second Ctrl-C kills at once, as users expect; the save protocol keeps
     * `latest` naming a whole checkpoint whenever the kill comes */
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGINT, &sa, NULL);
}

/* Fault injection for the tests (tests/t_faults.py): SHARDLM_INJECT_SIGNAL=
 * PHASE:SIG raises SIG (USR1, TERM, INT; STOP freezes the rank, which the
 * others then see as lost: tests/t_lost_rank.py) in this process the first time the
 * run reaches PHASE: start (before MPI and the config), config (after it),
 * setup, resume (after the checkpoint is read), step (inside the first step,
 * between the backward and the optimizer), save (as a checkpoint save
 * begins) or exit (after the last step's save). A signal then arrives at a
 * known point instead of at a time the test can only hope for. */
void train_fault_point(const char *phase)
{
    static int fired, looked;
    static const char *spec;
    if (!looked) { /* once: the step loop reaches this point every micro-batch */
        spec = getenv("SHARDLM_INJECT_SIGNAL");
        looked = 1;
    }
    if (!spec || fired)
        return;
    size_t n = strlen(phase);
    if (strncmp(spec, phase, n) != 0 || spec[n] != ':')
        return;
    const char *name = spec + n + 1;
    int sig = strcmp(name, "USR1") == 0 ? SIGUSR1 : strcmp(name, "TERM") == 0 ? SIGTERM
            : strcmp(name, "INT") == 0  ? SIGINT
            : strcmp(name, "STOP") == 0 ? SIGSTOP
                                        : 0;
    if (!sig)
        fail_input("SHARDLM_INJECT_SIGNAL='%s': the signal must be USR1, TERM, INT or STOP", spec);
    fired = 1;
    raise(sig);
}

/* For the tests of a launcher's signals (tests/t_slurm.py, t_slurm_nodes.py): SHARDLM_TEST_HOLD_STEP=N holds
 * each rank after step N (its metrics written) until a stop signal reaches it, for at most 300 s, so that a signal
 * the test sends once it sees step N arrives within the run whatever the machine's speed. */
static void test_hold(long step)
{
    static long hold = -2;
    if (hold == -2) {
        const char *s = getenv("SHARDLM_TEST_HOLD_STEP");
        hold = s ? strtol(s, NULL, 10) : -1;
    }
    for (int i = 0; step == hold && !g_stop_signal && i < 30000; i++)
        usleep(10000);
}

static const char *stop_signal_name(int sig)
{
    return sig == SIGUSR1 ? "SIGUSR1" : sig == SIGINT ? "SIGINT" : "SIGTERM";
}

/* The stop signal any rank has received (0: none); a collective. */
static int agree_stop_signal(struct comm *comm)
{
    int32_t signalled = g_stop_signal;
    comm_allreduce(comm, &signalled, 1, COMM_I32, COMM_MAX, NULL);
    return signalled;
}

/* After the save of a stop: how many ranks the signal itself reached (the
 * stop needs only one; a launcher that signals the ranks of one node only
 * shows here). By then the save has given a signal sent to all of them
 * time to arrive everywhere. A collective; nothing with one rank. */
static void log_ranks_signalled(struct comm *comm, long step, const char *name)
{
    if (comm->world == 1)
        return;
    int32_t received = g_stop_signal != 0;
    comm_allreduce(comm, &received, 1, COMM_I32, COMM_SUM, NULL);
    log_info("step %5ld | %s reached %d of %d ranks", step, name, (int)received, comm->world);
}

/* PyTorch's clip_grad_norm_ adds this to the norm before dividing. */
#define REF_KEY "dpo.ref_log_probs_path"
#define CLIP_EPS 1e-6


/* The precomputed DPO reference file the run reads (and writes when it is missing): the one a resumed checkpoint
 * names once the resume has read it, else dpo.ref_log_probs_path or the default beside the preference file; NULL
 * without one. */
static const char *reference_file(const struct trainer *tr, char *buf, size_t cap)
{
    const struct config *cfg = tr->cfg;
    if (!cfg->dpo.enabled || !cfg->dpo.precompute_ref_log_probs)
        return NULL;
    if (tr->dpo.ref_path[0])
        return tr->dpo.ref_path;
    if (cfg->dpo.ref_log_probs_path)
        return cfg->dpo.ref_log_probs_path;
    if (!tr->train_data.samples)
        return NULL;
    dpo_ref_default_path(tr->train_data.smp.path, buf, cap);
    return buf;
}

/* An output the run opens for writing (train.metrics, the dumps, the DPO reference it computes) must not be a
 * file the run reads or keeps, under any name or link: a data file, the config, the checkpoint it resumes from,
 * the reference it reads, a file of the base model, or a file the checkpoint directory manages (saves replace
 * or prune it; 'w' would truncate it). Checked before the output is opened, so a refusal changes nothing. */
static void refuse_output_alias(const struct trainer *tr, const char *out, const char *key)
{
    const struct loader *sets[2] = {&tr->train_data, tr->have_val ? &tr->val_data : NULL};
    const char *name;
    for (int s = 0; s < 2; s++)
        if (sets[s] && loader_has_file(sets[s], out, &name))
            fail_input("%s '%s' is the %s file '%s': writing there would destroy it. Hint: name another file", key,
                       out, sets[s]->what, name);
    char ref_buf[CKPT_MAX_PATH];
    const char *ref = reference_file(tr, ref_buf, sizeof ref_buf);
    const char *inputs[4] = {tr->opt->config_path, tr->opt->deepspeed_path, tr->opt->resume,
                             ref && strcmp(key, REF_KEY) != 0 ? ref : NULL};
    const char *what[4] = {"config file", "DeepSpeed config file", "checkpoint to resume from",
                           "DPO reference log-probs file (" REF_KEY ")"};
    for (int i = 0; i < 4; i++)
        if (inputs[i] && util_same_file(out, inputs[i], -1))
            fail_input("%s '%s' is the %s '%s': writing there would destroy it. Hint: name another file", key, out,
                       what[i], inputs[i]);
    char parent[CKPT_MAX_PATH];
    const char *slash = strrchr(out, '/');
    snprintf(parent, sizeof parent, "%.*s", slash ? (int)(slash - out) + 1 : 1, slash ? out : ".");
    const char *base = tr->cfg->model.pretrained;
    if (base[0] && util_same_file(parent, base, -1) && access(out, F_OK) == 0)
        fail_input("%s '%s' is a file of the base model (model.from_pretrained '%s'): writing there would destroy "
                   "it. Hint: name a file outside that directory", key, out, base);
    const char *dir = tr->cfg->checkpoint.dir;
    if (dir && ckpt_managed_name(slash ? slash + 1 : out) && util_same_file(parent, dir, -1))
        fail_input("%s '%s' is a file of checkpoint.dir ('%s'), which its saves replace or delete. Hint: name "
                   "another file",
                   key, out, dir);
}

/* Every rank's peak resident memory so far (VmHWM, KiB), gathered on every
 * rank (a collective); the caller frees it. */
static double *gather_peak_rss(struct trainer *tr)
{
    double *kib = xcalloc((size_t)tr->sess.world, sizeof *kib);
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long v = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %llu kB", &v) == 1)
            break;
    if (f)
        fclose(f);
    kib[tr->sess.rank] = (double)v;
    comm_allgather(tr->sess.comm, &kib[tr->sess.rank], kib, 1, COMM_F64, NULL);
    return kib;
}

/* Logs every rank's peak resident memory (VmHWM) so far: what the parameters'
 * init cost the host, whether seeded or read from a model directory; at the
 * end, the run's. Returns it (KiB per rank; the caller frees it). */
static double *log_peak_rss(struct trainer *tr, const char *when)
{
    double *kib = gather_peak_rss(tr);
    char list[1024] = "";
    for (int r = 0; r < tr->sess.world; r++) {
        size_t len = strlen(list);
        snprintf(list + len, sizeof list - len, "%s%.0f", r ? " " : "", kib[r]);
    }
    log_info("peak host memory per rank %s (KiB): %s", when, list);
    return kib;
}

/* Whether --resume will load a checkpoint (then the initial weights are not read). */
static bool will_resume(const struct trainer *tr)
{
    const char *spec = tr->opt->resume;
    if (!spec || strcmp(spec, "none") == 0)
        return false;
    if (strcmp(spec, "auto") != 0 || !tr->cfg->checkpoint.dir)
        return true;
    char *path = ckpt_resolve(tr->cfg->checkpoint.dir, "auto");
    free(path);
    return path != NULL;
}

/* LoRA: where the base came from and the checksum of its tensors as read
 * (zero_hash_source over the base units: the values in the files, before any
 * rounding to the run's dtype, so that a run in another precision matches). */
static void identify_base(struct trainer *tr, uint64_t sum)
{
    const struct config *cfg = tr->cfg;
    snprintf(tr->base_checksum, sizeof tr->base_checksum, "%016llx", (unsigned long long)sum);
    if (cfg->model.pretrained[0])
        snprintf(tr->base_source, sizeof tr->base_source, "%s", cfg->model.pretrained);
    else
        snprintf(tr->base_source, sizeof tr->base_source, "random init (model.init_seed %llu)",
                 (unsigned long long)cfg->model.init_seed);
    if (!tr->sess.model.lora.on) /* DPO's precomputed reference names the initial model too */
        return;
    /* r above a layer's smaller side adds parameters and no rank: the update B A is full rank already */
    const struct model_lora *lo = &tr->sess.model.lora;
    for (int b = 0; b < cfg->model.n_layer && tr->sess.rank == 0; b++)
        for (int k = 0; k < lo->n_linear; k++) {
            const int side = lo->linear[k].in < lo->linear[k].out ? lo->linear[k].in : lo->linear[k].out;
            if (lo->a_tensor[b][k] >= 0 && lo->r > side) {
                char module[MODEL_MAX_NAME];
                model_linear_module(&tr->sess.model, b, &lo->linear[k], module, sizeof module);
                log_warn("lora.r %d is larger than an adapted layer's smaller side (%d, %s of block %d): the adapters "
                         "cost more than the layer and add no rank; lower lora.r",
                         lo->r, side, module, b);
                b = cfg->model.n_layer; /* one warning */
                break;
            }
        }
    if (tr->sess.rank == 0)
        log_info("LoRA: r %d, alpha/r %g, dropout %g, %d adapted layers, %zu adapter parameters on a frozen base of "
                 "%zu (%s, checksum %s)",
                 tr->sess.model.lora.r, tr->sess.model.lora.scale, tr->sess.model.lora.dropout,
                 tr->sess.model.lora.n_adapted,
                 model_adapter_params(&tr->sess.model), tr->sess.model.n_params - model_adapter_params(&tr->sess.model),
                 tr->base_source, tr->base_checksum);
}

/* The ZeRO engine and its parameters: the seeded init, or model.from_pretrained's
 * weights, each rank reading only what it stores (1/N of the rest). A resumed
 * whole-model run skips the read (the checkpoint holds every weight); a LoRA
 * run reads its base even then: its checkpoints hold only what it trains. */
static void init_parameters(struct trainer *tr)
{
    const struct config *cfg = tr->cfg;
    /* LoRA: the base's checksum, of its values as read (identify_base); also a fresh DPO run's initial
     * model, which its precomputed reference log-probs name */
    struct base_hash hash;
    const bool hashed = tr->sess.model.lora.on ||
                        (cfg->dpo.enabled && cfg->dpo.precompute_ref_log_probs && !will_resume(tr));
    struct session_base base; /* a 4-bit base: the quantized values are the base (and its checksum) */
    if (!cfg->model.pretrained[0] || (will_resume(tr) && !tr->sess.model.lora.on)) {
        const struct param_source *seeded = session_base_source(&tr->sess, NULL, &base);
        zero_hash_source(&hash, &tr->sess.model, tr->sess.model.n_base_units, seeded);
        session_load(&tr->sess, hashed ? &hash.src : seeded);
        session_base_free(&base);
        if (hashed)
            identify_base(tr, zero_hash_total(&hash, tr->sess.comm, tr->sess.rank, tr->sess.world));
        free(log_peak_rss(tr, "after the parameters' init"));
        return;
    }
    struct hf_source hf;
    double t0 = now_seconds();
    hf_source_open(&hf, &tr->sess.model, cfg->model.pretrained);
    struct param_source hf_src = {hf_source_read, hf_source_read_as, &hf, hf_source_read_q4};
    const struct param_source *src = session_base_source(&tr->sess, &hf_src, &base);
    zero_hash_source(&hash, &tr->sess.model, tr->sess.model.n_base_units, src);
    session_load(&tr->sess, hashed ? &hash.src : src);
    session_base_free(&base);
    if (hashed)
        identify_base(tr, zero_hash_total(&hash, tr->sess.comm, tr->sess.rank, tr->sess.world));
    double total = hf_source_bytes(&hf), *bytes = xcalloc((size_t)tr->sess.world, sizeof *bytes);
    bytes[tr->sess.rank] = (double)hf.st.bytes_read;
    comm_allgather(tr->sess.comm, &bytes[tr->sess.rank], bytes, 1, COMM_F64, NULL);
    char list[1024] = "";
    for (int r = 0; r < tr->sess.world; r++) {
        size_t len = strlen(list);
        snprintf(list + len, sizeof list - len, "%s%.0f", r ? " " : "", bytes[r]);
    }
    log_info("from_pretrained %s: %.0f weight bytes in %d file%s read in %.2f s; bytes read per rank: %s",
             cfg->model.pretrained, total, hf.st.n_files, hf.st.n_files == 1 ? "" : "s", now_seconds() - t0, list);
    free(bytes);
    hf_source_close(&hf);
    free(log_peak_rss(tr, "after the parameters' init"));
}

/* SHARDLM_TEST_FREEZE (a test hook until LoRA freezes the base units): the
 * units it names are frozen (model_freeze). Checkpoints and exports of frozen
 * units come with LoRA (issue 19); until then such a run refuses them. */
static void freeze_for_tests(struct trainer *tr)
{
    const char *spec = getenv(MODEL_TEST_FREEZE_ENV);
    if (!spec || !*spec)
        return;
    int n = model_freeze(&tr->sess.model, spec, MODEL_TEST_FREEZE_ENV);
    if (tr->cfg->checkpoint.dir || tr->opt->resume)
        fail_input("%s: checkpoints of a run with frozen units are not supported yet (issue 19); drop "
                   "checkpoint.dir and --resume",
                   MODEL_TEST_FREEZE_ENV);
    if (tr->sess.rank == 0)
        log_info("%s=%s: %d of %d units frozen (%zu of %zu parameters)", MODEL_TEST_FREEZE_ENV, spec, n,
                 tr->sess.model.n_units, model_frozen_params(&tr->sess.model), tr->sess.model.n_params);
}

/* A fresh start (no --resume, or --resume none) on a checkpoint.dir that holds checkpoints would save over
 * them, move latest and rewrite the metrics: a job script that forgets --resume auto loses its training on the
 * first requeue. Refused unless --overwrite says that is meant. Rank 0, with the directory locked. */
static void refuse_fresh_start_over(const char *dir, const struct train_options *opt)
{
    if (opt->overwrite || (opt->resume && strcmp(opt->resume, "none") != 0))
        return;
    char list[512];
    long step = ckpt_dir_checkpoints(dir, list, sizeof list);
    if (step < 0)
        return;
    fail_input("checkpoint.dir '%s' holds another run's checkpoints up to step %ld (%s), and this run starts "
               "fresh%s: its saves would replace them. Hint: continue it with --resume auto, or start over on top "
               "of it with --resume none --overwrite",
               dir, step, list, opt->resume ? " (--resume none)" : " (no --resume)");
}

/* checkpoint.dir made, writable and this run's alone (ckpt_lock_dir) before anything reads or writes it:
 * a second run on it stops here, before its reference pass, metrics or start-up cleanup touch a file. Rank 0,
 * before the set-up (whose collectives the other ranks would be waiting in), its failure agreed by all. */
static void claim_checkpoint_dir(const struct config *cfg, const struct train_options *opt)
{
    if (cfg->model.pretrained[0] && util_same_file(cfg->checkpoint.dir, cfg->model.pretrained, -1))
        fail_input("config: checkpoint.dir '%s' is the model.from_pretrained directory: checkpoints (and "
                   "checkpoint.export_hf) would mix with the base model. Hint: give checkpoint.dir another directory",
                   cfg->checkpoint.dir);
    char why[2 * CKPT_MAX_PATH];
    if (ckpt_check_dir(cfg->checkpoint.dir, why, sizeof why) != 0) {
        if (!cfg->checkpoint.on_error_continue)
            fail_input("%s. Hint: point checkpoint.dir at a writable directory", why);
        log_warn("%s; training anyway, as checkpoint.on_error is \"continue\": its saves will fail", why);
        return;
    }
    if (ckpt_lock_dir(cfg->checkpoint.dir, why, sizeof why) != 0)
        fail_input("%s", why);
    ckpt_remove_stale_tmp(cfg->checkpoint.dir); /* ours alone now: no live run is writing them */
    refuse_fresh_start_over(cfg->checkpoint.dir, opt);
}

static void trainer_setup(struct trainer *tr)
{
    struct config *cfg = tr->cfg;
    config_resolve_batch(cfg, tr->sess.world);
    loss_scaler_init(&tr->scaler, cfg);
    const char *inject = getenv("SHARDLM_INJECT_INF_STEP");
    tr->inject_inf_step = inject ? atol(inject) : 0;
    if (cfg->zero.offload_optimizer && cfg->zero.stage == 0)
        fail_input("config: zero_optimization.offload_optimizer needs zero_optimization.stage 1, 2 or 3 (as in "
                   "DeepSpeed); raise the stage or set offload_optimizer.device to \"none\"");
    if (cfg->dpo.enabled && cfg->data.val_path)
        fail_input("config: data.val with a dpo section: the trainer validates SFT data only; drop data.val and "
                   "run `shardlm eval` on a preference file for the reward accuracy");
    if (cfg->dpo.enabled && !cfg->dpo.precompute_ref_log_probs && cfg->lora.n_modules_to_save > 0)
        fail_input("config: lora.modules_to_save trains base modules, so the base with the adapters off is no longer "
                   "the reference: set dpo.precompute_ref_log_probs to true");
    if (!cfg->data.train_path)
        fail_input("config: 'data.train' is required for training: give the path (or glob) of .bin token shards");
    /* model.from_pretrained as an absolute path: the checkpoints record it,
     * and an export or a generate from another directory must find the base */
    char *abs = cfg->model.pretrained[0] ? realpath(cfg->model.pretrained, NULL) : NULL;
    if (abs && strlen(abs) < sizeof cfg->model.pretrained) {
        snprintf(cfg->model.pretrained, sizeof cfg->model.pretrained, "%s", abs);
        json_object_set_new(json_object_get(cfg->json, "model"), "from_pretrained", json_string(abs));
    }
    free(abs);
    model_build(&tr->sess.model, &cfg->model);
    model_add_lora(&tr->sess.model, &cfg->lora);
    freeze_for_tests(tr);
    char tokenizer[CKPT_MAX_PATH + 32];
    snprintf(tokenizer, sizeof tokenizer, "%s/tokenizer.json", cfg->model.pretrained);
    const char *tok = cfg->model.pretrained[0] && access(tokenizer, R_OK) == 0 ? tokenizer : NULL;
    loader_open(&tr->train_data, cfg, cfg->data.train_path, true, tok, "train data");
    if (cfg->data.val_path) {
        loader_open(&tr->val_data, cfg, cfg->data.val_path, false, tok, "validation data");
        tr->have_val = 1;
        if (loader_units(&tr->val_data) < (uint64_t)cfg->micro_batch * (uint64_t)tr->sess.world)
            fail_input("validation data '%s' has %llu %s, fewer than one micro-batch on every rank (%d x %d); give "
                       "a larger validation set or drop data.val",
                       cfg->data.val_path, (unsigned long long)loader_units(&tr->val_data),
                       tr->val_data.samples ? "samples (or packed rows)" : "windows", cfg->micro_batch, tr->sess.world);
    }
    if (cfg->dpo.enabled && !tr->train_data.samples)
        fail_input("config: a dpo section needs a preference file as data.train (an .h5 of tools/prepare_data.py on "
                   "{\"prompt\", \"chosen\", \"rejected\"} lines), not token shards '%s'", cfg->data.train_path);
    /* DPO: a micro-batch of B pairs is 2B rows */
    const struct session_shape shape = {loader_rows(&tr->train_data, cfg->micro_batch), cfg->data.seq_len, 0};
    session_plan(&tr->sess, &shape);
    init_parameters(tr);
    session_acts(&tr->sess, &shape);
    dpo_setup(tr);
    if (tr->sess.rank == 0) {
        const char *dumps[2] = {tr->opt->dump_path, tr->opt->dump_final_path};
        const char *dump_keys[2] = {"--dump", "--dump-final"};
        for (int i = 0; i < 2; i++)
            if (dumps[i])
                refuse_output_alias(tr, dumps[i], dump_keys[i]);
    }
    if (tr->sess.rank == 0) {
        /* the reference the run computes when it is missing, and the metrics against the reference configured
         * (checked again once a resume names the one it was trained with: open_metrics) */
        char ref_buf[CKPT_MAX_PATH];
        const char *ref = reference_file(tr, ref_buf, sizeof ref_buf);
        if (ref)
            refuse_output_alias(tr, ref, REF_KEY);
        if (cfg->train.metrics_path)
            refuse_output_alias(tr, cfg->train.metrics_path, "train.metrics");
    }
}

/* train.metrics opened once the resume and the DPO reference are settled, so that a run refused there leaves
 * the file as it was (no line appended, nothing truncated), then its first line (sample files: what the data
 * holds). Rank 0; a failure agreed by every rank. */
static void open_metrics(struct trainer *tr)
{
    const struct config *cfg = tr->cfg;
    if (!cfg->train.metrics_path || tr->sess.rank != 0)
        return;
    refuse_output_alias(tr, cfg->train.metrics_path, "train.metrics");
    /* a resumed run continues the metrics of the run it resumes */
    tr->metrics = fopen(cfg->train.metrics_path, tr->opt->resume ? "a" : "w");
    if (!tr->metrics)
        fail_input("cannot write metrics file '%s': %s (train.metrics)", cfg->train.metrics_path, strerror(errno));
    if (!tr->train_data.samples)
        return;
    const struct sample_set *smp = &tr->train_data.smp;
    fprintf(tr->metrics,
            "{\"data\": \"%s\", \"samples\": %u, \"samples_in_file\": %zu, \"tokens\": %llu, "
            "\"trained_tokens\": %llu, \"truncated\": %zu, \"dropped_longer\": %zu, "
            "\"dropped_untrained\": %zu, \"units_per_epoch\": %llu}\n",
            smp->path, smp->n, smp->n_file, (unsigned long long)smp->tokens_kept,
            (unsigned long long)smp->trained_kept, smp->n_truncated, smp->n_dropped_long, smp->n_dropped_untrained,
            (unsigned long long)loader_units(&tr->train_data));
}

static void trainer_teardown(struct trainer *tr)
{
    if (tr->metrics)
        fclose(tr->metrics);
    dpo_teardown(tr);
    loader_close(&tr->train_data);
    if (tr->have_val)
        loader_close(&tr->val_data);
    session_close(&tr->sess);
}

/* Every tensor of the model under its name; all ranks take part, rank 0 writes. */
static void dump_params(FILE *f, struct trainer *tr, int grads)
{
    const struct model *m = &tr->sess.model;
    char name[MODEL_MAX_NAME + 8];
    for (int u = 0; u < m->n_units; u++) {
        if (grads && m->units[u].frozen) /* no gradients to dump */
            continue;
        float *full = xcalloc(tr->sess.zero.units[u].padded, sizeof *full);
        if (grads)
            zero_gather_grads(&tr->sess.zero, u, full);
        else
            zero_gather_unit(&tr->sess.zero, u, full);
        for (int t = 0; f && t < m->units[u].n_tensors; t++) {
            const struct tensor_desc *td = &m->units[u].tensors[t];
            size_t dims[2] = {(size_t)td->shape[0], (size_t)td->shape[1]};
            snprintf(name, sizeof name, "%s%s", grads ? "grad." : "", td->name);
            dump_tensor(f, name, td->ndim, dims, full + td->offset);
        }
        free(full);
    }
}

/* The first step's state, before the optimizer touches it: weights, the first
 * micro-batch's tokens and logits, the step's loss and its full gradients. */
static void dump_first_step(struct trainer *tr, const int32_t *inputs, const int32_t *targets,
                            const float *logits, float loss, int T_micro)
{
    const struct config *cfg = tr->cfg;
    const size_t B = (size_t)loader_rows(&tr->train_data, cfg->micro_batch), T = (size_t)T_micro;
    FILE *f = tr->sess.rank == 0 ? dump_open(tr->opt->dump_path) : NULL;
    float *tokens = xcalloc(2 * B * T, sizeof *tokens);
    for (size_t i = 0; i < B * T; i++) {
        tokens[i] = (float)inputs[i];
        tokens[B * T + i] = (float)targets[i];
    }
    size_t dims[3] = {B, T, (size_t)cfg->model.padded_vocab};
    size_t one = 1;
    if (f) {
        dump_tensor(f, "inputs", 2, dims, tokens);
        dump_tensor(f, "targets", 2, dims, tokens + B * T);
        dump_tensor(f, "logits", 3, dims, logits);
        dump_tensor(f, "loss", 1, &one, &loss);
    }
    dump_params(f, tr, 0);
    dump_params(f, tr, 1);
    if (f)
        dump_close(f, tr->opt->dump_path);
    free(tokens);
}

/* One optimizer step: accumulation over micro-batches, norm, clip, AdamW.
 * Returns the mean loss over the step's global batch. */
static float train_step(struct trainer *tr, float lr, double *grad_norm, bool *skipped)
{
    const struct config *cfg = tr->cfg;
    const int B = cfg->micro_batch, accum = cfg->grad_accum, rows = loader_rows(&tr->train_data, B);
    const size_t BT = (size_t)rows * cfg->data.seq_len;
    /* The step's trained targets, known from the order before any is read:
     * the loss is their mean over every micro-batch of every rank. */
    struct sample_batch step = loader_step(&tr->train_data, tr->samples_seen, B, accum, tr->sess.world, &tr->slots);
    tr->real_tokens = step.real;
    tr->trained_tokens = step.trained;
    /* the loss scale multiplies the backward; the optimizer divides it out */
    const double scale = tr->scaler.scale;
    const float dloss = (float)(scale / (double)step.trained);
    if (tr->dpo.on)
        dpo_step_begin(tr, step.pairs, scale);
    int dump_T = 0;
    const int dumping = tr->opt->dump_path && tr->step == 0;
    float *dump_logits = NULL;
    int32_t *dump_tokens = NULL;
    if (dumping) {
        dump_logits = xcalloc(BT * cfg->model.padded_vocab, sizeof *dump_logits);
        dump_tokens = xcalloc(2 * BT, sizeof *dump_tokens);
    }
    zero_zero_grads(&tr->sess.zero);
    double loss_sum = 0.0;
    for (int micro = 0; micro < accum; micro++) {
        uint64_t first = tr->samples_seen + (uint64_t)micro * B * tr->sess.world + (uint64_t)tr->sess.rank * B;
        const int T = loader_read(&tr->train_data, first, B, tr->sess.acts.inputs, tr->sess.acts.targets,
                                  tr->sess.acts.positions);
        tr->sess.acts.debug_logits = dumping && micro == 0 ? dump_logits : NULL;
        if (dumping && micro == 0) {
            dump_T = T;
            memcpy(dump_tokens, tr->sess.acts.inputs, (size_t)rows * T * sizeof *dump_tokens);
            memcpy(dump_tokens + BT, tr->sess.acts.targets, (size_t)rows * T * sizeof *dump_tokens);
        }
        if (tr->comm_only) {
            zero_replay_pass(&tr->sess.zero, &tr->sess.train_pass);
            continue;
        }
        if (tr->dpo.on) /* the reference: its own (evaluation) pass before the policy's */
            dpo_reference(tr, first, B, T);
        zero_begin_pass(&tr->sess.zero, &tr->sess.train_pass);
        /* LoRA's dropout: the mask of a row depends on the step and the row's index in the run's order */
        family_lora_step(&tr->sess.acts, tr->cfg->train.seed, tr->step, first * (uint64_t)(rows / B));
        if (tr->dpo.on)
            dpo_policy_forward(tr, rows, T);
        else
            loss_sum += family_forward(&tr->sess.zero, &tr->sess.acts, B, T, 1, FAMILY_TRAIN, dloss);
        family_backward(&tr->sess.zero, &tr->sess.acts, rows, T);
        zero_end_pass(&tr->sess.zero);
        train_fault_point("step");
    }
    tr->sess.acts.debug_logits = NULL;
    zero_reduce_grads(&tr->sess.zero);
    /* the step's loss: the mean over every trained target of every rank's micro-batches (DPO: over its pairs) */
    float loss;
    if (tr->dpo.on) {
        loss = dpo_step_end(tr);
    } else {
        comm_allreduce(tr->sess.comm, &loss_sum, 1, COMM_F64, COMM_SUM, NULL);
        loss = (float)(loss_sum / (double)step.trained);
    }
    if (dumping) {
        dump_first_step(tr, dump_tokens, dump_tokens + BT, dump_logits, loss, dump_T);
        free(dump_logits);
        free(dump_tokens);
    }
    if (tr->inject_inf_step == tr->step + 1 && tr->sess.rank == 0)
        zero_inject_inf(&tr->sess.zero);
    bool overflow;
    double raw_norm;
    zero_grad_stats(&tr->sess.zero, &overflow, &raw_norm);
    tr->samples_seen += (uint64_t)cfg->train_batch_size;
    tr->step++;
    *skipped = false;
    if (tr->scaler.skips_overflow) {
        /* fp16: DeepSpeed's loss scaler decides; an overflowed step is skipped whole */
        double old_scale = tr->scaler.scale;
        enum loss_scaler_result r = loss_scaler_update(&tr->scaler, overflow);
        if (r == LS_AT_MINIMUM)
            fail_input("step %ld: gradient overflow with the loss scale already at its minimum (%g); the run "
                       "cannot continue in fp16: lower optimizer.params.lr, use bf16, or lower fp16.min_loss_scale",
                       tr->step, tr->scaler.scale);
        if (r == LS_SKIP) {
            tr->skipped_steps++;
            *skipped = true;
            *grad_norm = NAN;
            if (!tr->opt->quiet)
                log_info("step %5ld | gradient overflow: step skipped, loss scale %g -> %g", tr->step, old_scale,
                         tr->scaler.scale);
            return loss;
        }
    } else if (overflow) {
        fail_input("step %ld: the gradients hold inf or NaN (loss %g); lower optimizer.params.lr, enable "
                   "gradient_clipping, or check the data",
                   tr->step, loss);
    }
    double norm = raw_norm / scale;
    *grad_norm = norm;
    double grad_scale = 1.0 / scale;
    if (cfg->gradient_clipping > 0.0f) {
        double coef = cfg->gradient_clipping / (norm + CLIP_EPS);
        if (coef < 1.0)
            grad_scale *= coef;
    }
    if (!tr->comm_only)
        zero_optimizer_step(&tr->sess.zero, &cfg->optimizer, lr, (float)grad_scale);
    return loss;
}

/* Validation loss over the first eval_batches x train_batch_size sequences of
 * the validation set (fewer if it is smaller), the same sequences at any world
 * size: rank r takes micro-batch slots r, r + N, ... of each group of N. */
static float evaluate(struct trainer *tr)
{
    const struct config *cfg = tr->cfg;
    const int B = cfg->micro_batch;
    const size_t group = (size_t)B * tr->sess.world;
    size_t groups = (size_t)cfg->train.eval_batches * cfg->grad_accum;
    if (groups * group > loader_units(&tr->val_data))
        groups = loader_units(&tr->val_data) / group;
    uint64_t slots;
    const struct sample_batch all = loader_step(&tr->val_data, 0, B, (int)groups, tr->sess.world, &slots);
    double sum = 0.0;
    for (size_t i = 0; i < groups; i++) {
        uint64_t first = (uint64_t)(i * group) + (uint64_t)tr->sess.rank * B;
        const int T = loader_read(&tr->val_data, first, B, tr->sess.acts.inputs, tr->sess.acts.targets,
                                  tr->sess.acts.positions);
        sum += session_forward(&tr->sess, B, T, 1);
    }
    comm_allreduce(tr->sess.comm, &sum, 1, COMM_F64, COMM_SUM, NULL);
    return (float)(sum / (double)all.trained);
}

/* The sample's stop: a stop signal any rank received (a collective), by name. */
static const char *sample_stopped(struct comm *comm)
{
    int sig = agree_stop_signal(comm);
    return sig ? stop_signal_name(sig) : NULL;
}

/* Flushes the metrics file (rank 0) and ends the run with an input error when
 * any write to it failed: a full disk must not leave it cut mid-line while the
 * run exits 0. CLOSING also closes it. */
static void metrics_flush(struct trainer *tr, bool closing)
{
    if (!tr->metrics)
        return;
    int failed = fflush(tr->metrics) != 0 || ferror(tr->metrics);
    int err = errno;
    if (closing) {
        failed |= fclose(tr->metrics) != 0;
        err = failed && !err ? errno : err;
        tr->metrics = NULL;
    }
    if (failed)
        fail_input("cannot write the metrics file '%s': %s. Hint: free space on its disk or point train.metrics "
                   "elsewhere; the checkpoints already saved are intact",
                   tr->cfg->train.metrics_path, strerror(err ? err : EIO));
}

/* The last metrics line: planned and peak bytes per buffer class, exact, and
 * each rank's peak resident memory (VmHWM, bytes: rss_kib x 1024). */
static void write_memory_json(struct trainer *tr, const double *rss_kib)
{
    fprintf(tr->metrics, "{\"memory\": {");
    for (int k = 0; k < BUF_COUNT; k++)
        fprintf(tr->metrics, "%s\"%s\": {\"space\": \"%s\", \"planned\": %zu, \"peak\": %zu}", k ? ", " : "",
                arena_class_name(k), mem_space_name(tr->sess.plan.space[k]), tr->sess.plan.bytes[k],
                tr->sess.mem.peak[k]);
    fprintf(tr->metrics, "}, \"host_rss_peak\": [");
    for (int r = 0; r < tr->sess.world; r++)
        fprintf(tr->metrics, "%s%.0f", r ? ", " : "", rss_kib[r] * 1024.0);
    fprintf(tr->metrics, "]}\n");
    struct nvme_file *f = tr->sess.zero.nvme; /* offload_optimizer "nvme": rank 0's file and its traffic */
    if (f) {
        double rd, wr;
        nvme_traffic(f, &rd, &wr);
        struct stat st;
        fprintf(tr->metrics,
                "{\"nvme\": {\"file\": \"%s\", \"file_bytes\": %lld, \"host_bytes\": %zu, \"read_bytes\": %.0f, "
                "\"written_bytes\": %.0f, \"direct\": %s, \"async\": %s}}\n",
                nvme_path(f), stat(nvme_path(f), &st) == 0 ? (long long)st.st_size : -1LL, nvme_host_bytes(f), rd, wr,
                nvme_direct(f) ? "true" : "false", nvme_async(f) ? "true" : "false");
    }
    const struct nvme_params *pf = tr->sess.zero.pfile; /* offload_param "nvme": rank 0's parameter file */
    if (pf) {
        double rd, wr;
        zero_nvme_traffic(&tr->sess.zero, &rd, &wr);
        struct stat st;
        fprintf(tr->metrics,
                "{\"nvme_param\": {\"file\": \"%s\", \"file_bytes\": %lld, \"host_bytes\": %zu, "
                "\"read_bytes\": %.0f, \"written_bytes\": %.0f}}\n",
                nvme_params_path(pf), stat(nvme_params_path(pf), &st) == 0 ? (long long)st.st_size : -1LL,
                nvme_params_host_bytes(pf), rd, wr);
    }
}

/* " | scale 65536 | skipped 2" for fp16 runs, nothing otherwise. */
static const char *scale_note(const struct trainer *tr, char *buf, size_t n)
{
    if (!tr->scaler.skips_overflow)
        return "";
    snprintf(buf, n, " | scale %g | skipped %ld", tr->scaler.scale, tr->skipped_steps);
    return buf;
}

static void log_traffic(struct trainer *tr, const uint64_t bytes[COMM_KINDS], char *json, size_t n)
{
    snprintf(json, n, ", \"bytes_allgather\": %llu, \"bytes_reduce_scatter\": %llu, \"bytes_allreduce\": %llu",
             (unsigned long long)bytes[COMM_ALLGATHER], (unsigned long long)bytes[COMM_REDUCE_SCATTER],
             (unsigned long long)bytes[COMM_ALLREDUCE]);
}

/* The set-up is local on every rank (no collective), so a failure in it,
 * on any rank, is reported once (comm_agree_failure). */
static void trainer_setup_agreed(struct trainer *tr)
{
    struct fail_trap trap;
    if (FAIL_TRAP(&trap) == 0)
        trainer_setup(tr);
    fail_untrap();
    comm_agree_failure(tr->sess.comm, &trap);
}

int train_run(struct config *cfg, struct comm *comm, const struct train_options *opt)
{
    struct trainer tr;
    memset(&tr, 0, sizeof tr);
    tr.cfg = cfg;
    tr.opt = opt;
    session_init(&tr.sess, comm, cfg);
    const char *bench = getenv("SHARDLM_BENCH");
    tr.comm_only = bench && strcmp(bench, "comm-only") == 0;
    backend_init(cfg->train.threads);
    backend_attach_comm(comm);
    /* A GPU computes in the parameter dtype (backend.h [A]); the CPU in fp32.
     * SHARDLM_FP32_ACTIVATIONS=1 keeps fp32 activations on a GPU too. */
    const char *f32_acts = getenv("SHARDLM_FP32_ACTIVATIONS");
    backend_set_act_dtype(backend_is_device() && !(f32_acts && strcmp(f32_acts, "1") == 0) ? cfg->dtype
                                                                                          : DTYPE_F32);
    struct fail_trap trap;
    if (FAIL_TRAP(&trap) == 0 && cfg->checkpoint.dir && tr.sess.rank == 0)
        claim_checkpoint_dir(cfg, opt);
    fail_untrap();
    comm_agree_failure(comm, &trap);
    trainer_setup_agreed(&tr);
    /* a device's unit gradient buffers in the parameter dtype (zero.h half_grad_buffers) */
    backend_set_grad_dtype(tr.sess.zero.half_grad_buffers ? cfg->dtype : DTYPE_F32);
    train_fault_point("setup");
    backend_check_performance();

    const int T = cfg->data.seq_len;
    char a[32], b[64];
    comm_log_ranks(comm);
    log_info("shardlm %s | backend %s | %d rank%s | ZeRO stage %d | %s", SHARDLM_VERSION, backend_name(), tr.sess.world,
             tr.sess.world > 1 ? "s" : "", cfg->zero.stage, dtype_name(cfg->dtype));
    log_info("model %s: %d layers, %d heads (%d key/value), %d channels, MLP %d, context %d, vocab %d (padded %d%s): "
             "%zu parameters",
             cfg->model.type, cfg->model.n_layer, cfg->model.n_head, cfg->model.n_kv_head, cfg->model.n_embd,
             cfg->model.ffn_dim, cfg->model.n_positions, cfg->model.vocab_size, cfg->model.padded_vocab,
             tr.sess.model.cfg.tied_head ? ", LM head tied" : "", tr.sess.model.n_params);
    if (tr.sess.model.cfg.rotary) {
        const struct rope_scaling *rs = &cfg->model.rope_scaling;
        log_info("rotary: rope_theta %g, rope_type %s%s, rms_norm_eps %g", cfg->model.rope_theta,
                 rs->type == ROPE_SCALING_LLAMA3     ? "llama3"
                 : rs->type == ROPE_SCALING_LINEAR   ? "linear"
                 : rs->type == ROPE_SCALING_LONGROPE ? "longrope"
                                                     : "default",
                 rs->type == ROPE_SCALING_NONE ? "" : (snprintf(a, sizeof a, " x%g", rs->factor), a),
                 cfg->model.norm_eps);
    }
    if (!tr.train_data.samples) {
        log_info("batch: %d sequences of %d tokens = %d micro x %d accumulation x %d ranks; %zu training windows",
                 cfg->train_batch_size, T, cfg->micro_batch, cfg->grad_accum, tr.sess.world,
                 tr.train_data.bin.n_windows);
    } else {
        const struct sample_set *smp = &tr.train_data.smp;
        /* DPO: a unit is a pair (two rows), or with packing a row pair */
        const char *units = tr.dpo.on ? (cfg->data.packing ? "packed row pairs" : "pairs")
                                      : (cfg->data.packing ? "packed rows" : "samples");
        log_info("batch: %d %s of at most %d tokens = %d micro x %d accumulation x %d ranks, padded to the longest "
                 "(a multiple of %d)%s",
                 cfg->train_batch_size, units, T, cfg->micro_batch,
                 cfg->grad_accum, tr.sess.world, cfg->data.pad_multiple,
                 cfg->data.group_by_length ? ", grouped by length" : "");
        log_info("train data %s: %u samples (%llu tokens, %llu trained) of %zu; %zu truncated to %d tokens, %zu "
                 "dropped as longer, %zu dropped with no trained token; %llu %s per epoch",
                 smp->path, smp->n, (unsigned long long)smp->tokens_kept, (unsigned long long)smp->trained_kept,
                 smp->n_file, smp->n_truncated, T, smp->n_dropped_long, smp->n_dropped_untrained,
                 (unsigned long long)loader_units(&tr.train_data), units);
    }
    if (opt->print_config) {
        char *config_json = config_dump(cfg);
        log_info("resolved config:\n%s", config_json);
        free(config_json);
    }
    plan_print(&tr.sess.plan, NULL, "memory plan per rank:");

    if (opt->resume)
        ckpt_run_resume(&tr, opt->resume);
    dpo_prepare(&tr);
    if (FAIL_TRAP(&trap) == 0)
        open_metrics(&tr);
    fail_untrap();
    comm_agree_failure(comm, &trap);
    /* A stop signal during the set-up or the resume (the handlers are in
     * place from the start, train_install_stop_handlers) is seen after the
     * first step: the run trains that step and saves it, so that even a job
     * signalled before every first step makes progress through its requeues,
     * and exit 3 always means a checkpoint of this run was written. */
    int stop_signal = 0;
    const float base_lr = cfg->optimizer.lr;
    while (tr.step < cfg->train.steps) {
        double t0 = now_seconds(), norm = 0.0;
        float lr = sched_lr(&cfg->scheduler, base_lr, tr.step - tr.skipped_steps);
        bool skipped = false;
        float loss = train_step(&tr, lr, &norm, &skipped);
        double dt = now_seconds() - t0;
        uint64_t bytes[COMM_KINDS];
        zero_take_traffic(&tr.sess.zero, bytes);
        if (!isfinite(loss) && !tr.comm_only && !comm->skip)
            fail_input("step %ld: the loss is %f; lower optimizer.params.lr or enable gradient_clipping", tr.step,
                       loss);
        uint64_t total = bytes[COMM_ALLGATHER] + bytes[COMM_REDUCE_SCATTER] + bytes[COMM_ALLREDUCE];
        /* tokens of samples (not padding) and trained targets per second, the padding's share of the rows */
        const double real_per_s = (double)tr.real_tokens / dt, trained_per_s = (double)tr.trained_tokens / dt;
        const double padding = tr.slots ? 1.0 - (double)tr.real_tokens / (double)tr.slots : 0.0;
        char fill[96] = "";
        if (tr.train_data.samples)
            snprintf(fill, sizeof fill, " | trained %.0f tok/s | padding %.1f%%", trained_per_s, 100.0 * padding);
        char dpo_line[64], dpo_json[512];
        dpo_step_notes(&tr, dpo_line, sizeof dpo_line, dpo_json, sizeof dpo_json);
        if (!opt->quiet && (tr.step % cfg->steps_per_print == 0 || tr.step == 1 || tr.step == cfg->train.steps))
            log_info("step %5ld/%d | loss %.6f%s | lr %.3e | norm %.4f | %8.0f tok/s%s | %7.1f ms | sent %s%s",
                     tr.step, cfg->train.steps, loss, dpo_line, lr, norm, real_per_s, fill, dt * 1e3,
                     format_bytes((double)total, a, sizeof a), scale_note(&tr, b, sizeof b));
        if (tr.metrics) {
            char traffic[256];
            log_traffic(&tr, bytes, traffic, sizeof traffic);
            fprintf(tr.metrics,
                    "{\"step\": %ld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, \"tokens_per_s\": %.1f, "
                    "\"trained_tokens_per_s\": %.1f, \"real_tokens\": %llu, \"trained_tokens\": %llu, "
                    "\"padding\": %.6f, \"ms\": %.3f, \"loss_scale\": %.9g, \"skipped\": %s, "
                    "\"skipped_steps\": %ld%s%s}\n",
                    tr.step, loss, lr, skipped ? 0.0 : norm, real_per_s, trained_per_s,
                    (unsigned long long)tr.real_tokens, (unsigned long long)tr.trained_tokens, padding, dt * 1e3,
                    tr.scaler.scale, skipped ? "true" : "false", tr.skipped_steps, traffic, dpo_json);
        }
        if (tr.have_val && cfg->train.eval_every > 0 &&
            (tr.step % cfg->train.eval_every == 0 || tr.step == cfg->train.steps)) {
            float vl = evaluate(&tr);
            zero_take_traffic(&tr.sess.zero, bytes); /* validation's gathers are not the step's */
            log_info("step %5ld | validation loss %.6f", tr.step, vl);
            if (tr.metrics)
                fprintf(tr.metrics, "{\"step\": %ld, \"val_loss\": %.9g, \"val_bytes_allgather\": %llu}\n", tr.step,
                        vl, (unsigned long long)bytes[COMM_ALLGATHER]);
        }
        metrics_flush(&tr, false);
        test_hold(tr.step);
        /* every rank stops at the same step if any was signalled */
        stop_signal = agree_stop_signal(comm);
        if (stop_signal)
            break;
        if (cfg->checkpoint.dir && cfg->checkpoint.every > 0 && tr.step % cfg->checkpoint.every == 0 &&
            tr.step < cfg->train.steps)
            ckpt_run_save(&tr);
    }
    if (cfg->checkpoint.dir)
        ckpt_run_save(&tr);
    if (!stop_signal)
        train_fault_point("exit");
    if (stop_signal) {
        const char *name = stop_signal_name(stop_signal);
        log_ranks_signalled(comm, tr.step, name);
        trainer_teardown(&tr);
        if (cfg->checkpoint.dir) {
            log_info("step %5ld | stopped by %s after saving a checkpoint; exit status %d asks the job script to "
                     "requeue",
                     tr.step, name, EXIT_PREEMPTED);
            return EXIT_PREEMPTED;
        }
        /* Exit 3 promises a checkpoint to resume from: a job script would
         * requeue a run that can only start over. Report the signal instead,
         * as a process it had killed would. */
        log_warn("step %5ld | stopped by %s with nothing saved (no checkpoint.dir); exit status %d, not %d: "
                 "there is no checkpoint to resume from",
                 tr.step, name, 128 + stop_signal, EXIT_PREEMPTED);
        return 128 + stop_signal;
    }
    if (opt->dump_final_path) {
        FILE *f = tr.sess.rank == 0 ? dump_open(opt->dump_final_path) : NULL;
        dump_params(f, &tr, 0);
        if (f)
            dump_close(f, opt->dump_final_path);
    }
    sample_text(&tr.sess, cfg, sample_stopped);
    zero_note_pool_peaks(&tr.sess.zero);
    /* Every rank's peaks, worst case: the table shows what the largest rank needed. */
    double peaks[BUF_COUNT];
    for (int k = 0; k < BUF_COUNT; k++)
        peaks[k] = (double)tr.sess.mem.peak[k];
    comm_allreduce(comm, peaks, BUF_COUNT, COMM_F64, COMM_MAX, NULL);
    for (int k = 0; k < BUF_COUNT; k++)
        tr.sess.mem.peak[k] = (size_t)peaks[k];
    double *rss = log_peak_rss(&tr, "at the end");
    if (tr.metrics) {
        write_memory_json(&tr, rss);
        metrics_flush(&tr, true);
    }
    free(rss);
    plan_print(&tr.sess.plan, &tr.sess.mem, "memory per rank at the end (planned vs peak):");
    plan_check_device(&tr.sess.plan, 0);
    if (tr.sess.world > 1)
        log_info("communication on rank 0: %.2f s in collectives, %.2f s of it exposed (compute waited)",
                 comm->busy_seconds, comm->wait_seconds);
    trainer_teardown(&tr);
    return EXIT_OK;
}
