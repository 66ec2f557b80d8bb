/*
 * eval_cli — `shardlm eval` (run/infer.h opens the model): the mean loss
 * over every trained target of a token file (.bin, windows of data.seq_len
 * + 1) or a sample file, summed as the trainer's validation sums it, and its
 * perplexity.
 */
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli_args.h"
#include "comm/comm.h"
#include "core/util.h"
#include "data/loader.h"
#include "data/samples.h"
#include "eval_cli.h"
#include "run/infer.h"

static void usage_eval(FILE *out)
{
    fprintf(out, "usage: shardlm eval MODEL --data FILE [options]\n"
                 "\n"
                 "The mean loss and perplexity of MODEL (a Hugging Face directory, a checkpoint or a run's\n"
                 "checkpoint.dir) over every trained target of FILE: a .bin token file (windows of data.seq_len\n"
                 "+ 1 tokens) or a sample file (tools/prepare_data.py), as the trainer's validation loss counts.\n"
                 "A checkpoint's data options (seq_len, packing, ...) apply unless --set changes them.\n"
                 "\n"
                 "options:\n"
                 "  --data FILE            the tokens (required)\n"
                 "  --seq-len T            eval's length (default: a sample file's longest sample within the\n"
                 "                         model's context; a .bin file's data.seq_len); longer samples are\n"
                 "                         truncated, and a warning says how many; against a reference log-prob\n"
                 "                         file the default is at most the data.seq_len it was computed at\n"
                 "  --batch B              sequences per rank per forward (default 8)\n"
                 "  --max-batches N        at most N forwards per rank (default: the whole file); on preference\n"
                 "                         pairs, N micro-batches of B/2 pairs per rank: the file's first\n"
                 "                         N x B/2 x ranks pairs\n"
                 "  --json                 the result as a JSON line\n"
                 "  --preferences          FILE is a preference file (tools/prepare_data.py's DPO pairs; implied by\n"
                 "                         such a file): DPO's loss (the config's dpo section, or TRL's defaults), and\n"
                 "                         TRL's rewards/accuracies, rewards/margins, rewards/chosen, rewards/rejected,\n"
                 "                         logps/chosen, logps/rejected of MODEL against its reference: a LoRA\n"
                 "                         checkpoint's base with the adapters off, else the reference log-prob file\n"
                 "                         a checkpoint records, or:\n"
                 "  --ref-log-probs FILE   the reference log-probs (a DPO run's <preferences>.ref-logps.h5)\n"
                 "  --ref MODEL            the reference model (a Hugging Face directory or a checkpoint)\n"
                 "  --base DIR             a LoRA checkpoint's base (default: the directory its run started from)\n"
                 "  --tokenizer FILE       the tokenizer a sample file was made with (checked as in training)\n"
                 "  --set KEY.PATH=VALUE   override a config key\n"
                 "  -h, --help             this text\n");
}

void eval_check_length(const struct config *cfg, int T)
{
    if (T > cfg->model.n_positions)
        fail_input("eval --seq-len %d is longer than the model's context (%d positions); lower it", T,
                   cfg->model.n_positions);
}

/* The data as the trainer reads validation data, with the config's data
 * options, at eval's own length: --seq-len, else a sample file's longest
 * sample (within the model's context), else data.seq_len (a .bin file's
 * windows). Longer samples are truncated and reported. Agreed across ranks. */
static void open_eval_data(struct infer *s, struct loader *ld, const char *path, int B, int seq_len)
{
    struct fail_trap trap;
    if (FAIL_TRAP(&trap) == 0) {
        struct config *cfg = &s->cfg;
        cfg->micro_batch = B;
        cfg->train_batch_size = B * s->sess.world;
        const int context = cfg->model.n_positions;
        if (seq_len > 0)
            cfg->data.seq_len = seq_len;
        else if (samples_is_sample_file(path)) {
            size_t longest = samples_longest(path, cfg->model.vocab_size, false, "eval data");
            cfg->data.seq_len = longest < (size_t)context ? (int)longest : context;
        }
        eval_check_length(cfg, seq_len > 0 ? seq_len : cfg->data.seq_len);
        cfg->data.truncate = true;
        loader_open(ld, cfg, path, false, s->tokenizer_path[0] ? s->tokenizer_path : NULL, "eval data");
        if (loader_units(ld) == 0)
            fail_input("eval data '%s' holds no sequence of data.seq_len %d", path, cfg->data.seq_len);
    }
    fail_untrap();
    comm_agree_failure(s->sess.comm, &trap);
    if (ld->samples && ld->smp.n_truncated && s->sess.rank == 0) {
        const struct sample_set *smp = &ld->smp;
        unsigned long long cut = 0;
        for (size_t i = 0; i < smp->n_file; i++) {
            long long L = smp->offsets[i + 1] - smp->offsets[i];
            cut += L > s->cfg.data.seq_len ? (unsigned long long)(L - s->cfg.data.seq_len) : 0;
        }
        log_warn("eval data '%s': %zu of %zu samples are longer than the eval length %d and were truncated to it "
                 "(%llu tokens not scored); give --seq-len to score them whole",
                 path, smp->n_truncated, smp->n_file, s->cfg.data.seq_len, cut);
    }
}

int cmd_eval(int argc, char **argv)
{
    static const struct option opts[] = {
        {"data", required_argument, NULL, 'd'},  {"seq-len", required_argument, NULL, 'T'},
        {"batch", required_argument, NULL, 'b'}, {"max-batches", required_argument, NULL, 'm'},
        {"json", no_argument, NULL, 'j'},        {"base", required_argument, NULL, 'B'},
        {"tokenizer", required_argument, NULL, 'z'}, {"set", required_argument, NULL, 's'},
        {"preferences", no_argument, NULL, 'p'}, {"ref-log-probs", required_argument, NULL, 'r'},
        {"ref", required_argument, NULL, 'R'},
        {"help", no_argument, NULL, 'h'},        {NULL, 0, NULL, 0},
    };
    struct infer_options o = {0};
    const char *sets[CLI_MAX_SETS + 1];
    int n_sets = 0, c, B = 8;
    long max_batches = 0;
    bool json = false, preferences = false;
    struct eval_pref_options e = {0};
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'd': o.data = optarg; break;
        case 'T': o.seq_len = (int)cli_parse_int(optarg, "--seq-len", 1, 1 << 24); break;
        case 'b': B = (int)cli_parse_int(optarg, "--batch", 1, 1 << 16); break;
        case 'm': max_batches = cli_parse_int(optarg, "--max-batches", 1, 1L << 40); break;
        case 'j': json = true; break;
        case 'p': preferences = true; break;
        case 'r': e.ref_file = optarg; break;
        case 'R': e.ref_model = optarg; break;
        case 'h': usage_eval(stdout); return EXIT_OK;
        default:
            if (cli_model_option(c, &o, sets, &n_sets))
                break;
            usage_eval(stderr);
            return EXIT_BAD_INPUT;
        }
    }
    if (optind != argc - 1)
        fail_input("eval needs exactly one MODEL; see 'shardlm eval --help'");
    if (!o.data)
        fail_input("eval needs --data FILE (a .bin token file or a sample file); see 'shardlm eval --help'");
    o.model = argv[optind];
    o.sets = sets;
    o.n_sets = n_sets;
    if (e.ref_file && e.ref_model)
        fail_input("eval: give one reference, --ref-log-probs FILE or --ref MODEL, not both");
    preferences |= samples_is_preference_file(o.data);
    if (!preferences && (e.ref_file || e.ref_model))
        fail_input("eval: --ref-log-probs and --ref apply to a preference file; '%s' is not one (give --preferences "
                   "to say it should be)", o.data);
    log_info_to_stderr();
    struct comm comm;
    comm_init(&comm, NULL, NULL);
    if (preferences) {
        e.model = o.model;
        e.data = o.data;
        e.batch = B;
        e.max_batches = max_batches;
        e.json = json;
        const int status = eval_preferences(&comm, &o, &e);
        comm_finalize(&comm);
        return status;
    }
    struct infer s;
    infer_open(&s, &comm, &o);
    struct loader ld;
    open_eval_data(&s, &ld, o.data, B, o.seq_len);
    const int T = s.cfg.data.seq_len;
    infer_start(&s, &o, B, T, 0);
    const uint64_t units = loader_units(&ld), group = (uint64_t)B * (uint64_t)s.sess.world;
    uint64_t groups = (units + group - 1) / group;
    if (max_batches > 0 && (uint64_t)max_batches < groups)
        groups = (uint64_t)max_batches;
    double sums[2] = {0.0, 0.0}; /* losses, trained targets */
    const double t0 = now_seconds();
    for (uint64_t i = 0; i < groups; i++) {
        const uint64_t first = i * group + (uint64_t)s.sess.rank * B;
        int rows = first < units ? (int)(units - first < (uint64_t)B ? units - first : (uint64_t)B) : 0, t = 1;
        if (rows) {
            t = loader_read(&ld, first, rows, s.sess.acts.inputs, s.sess.acts.targets, s.sess.acts.positions);
        } else { /* past the end: one untrained token, so that this rank's gathers still match */
            rows = 1;
            s.sess.acts.inputs[0] = 0;
            s.sess.acts.targets[0] = -1;
            if (s.sess.acts.positions)
                s.sess.acts.positions[0] = 0;
        }
        for (int k = 0; k < rows * t; k++)
            sums[1] += s.sess.acts.targets[k] >= 0;
        sums[0] += session_forward(&s.sess, rows, t, 1);
    }
    comm_allreduce(&comm, sums, 2, COMM_F64, COMM_SUM, NULL);
    const uint64_t used = groups * group < units ? groups * group : units;
    if (sums[1] == 0.0)
        fail_input("eval data '%s' has no trained target in the sequences read", o.data);
    const double loss = sums[0] / sums[1];
    if (s.sess.rank == 0) {
        if (json)
            printf("{\"model\": \"%s\", \"data\": \"%s\", \"loss\": %.9g, \"perplexity\": %.9g, \"tokens\": %.0f, "
                   "\"sequences\": %llu}\n",
                   o.model, o.data, loss, exp(loss), sums[1], (unsigned long long)used);
        else
            printf("eval %s on %s: loss %.6f | perplexity %.4f | %.0f tokens in %llu sequences\n", o.model, o.data,
                   loss, exp(loss), sums[1], (unsigned long long)used);
        fflush(stdout);
        log_info("eval: %.2f s", now_seconds() - t0);
    }
    loader_close(&ld);
    infer_close(&s);
    comm_finalize(&comm);
    return EXIT_OK;
}
