/*
 * main — the command line: `shardlm COMMAND [options]`, each command parsed
 * with getopt_long and answering --help.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_tools.h"
#include "comm/comm.h"
#include "config/config.h"
#include "generate.h"
#include "plan_cli.h"
#include "tokenize_cli.h"
#include "run/run_config.h"
#include "run/train.h"
#include "core/util.h"

#define MAX_SETS 256

static void usage_main(FILE *out)
{
    fprintf(out,
            "usage: shardlm COMMAND [options]\n"
            "\n"
            "commands:\n"
            "  train CONFIG     train a model as the config says (see 'shardlm train --help')\n"
            "  inspect CKPT     summarise a checkpoint and verify its checksums (see 'shardlm inspect --help')\n"
            "  export CKPT OUT  write a checkpoint's weights as safetensors or HDF5 (see 'shardlm export --help')\n"
            "  generate MODEL   continue prompts with a model, checkpoint or Hugging Face directory (see\n"
            "                   'shardlm generate --help')\n"
            "  eval MODEL       mean loss and perplexity of a model over a data file (see 'shardlm eval --help')\n"
            "  plan [CONFIG]    memory per rank, communication and FLOPs of a model and settings, without\n"
            "                   running; --fit finds settings that fit (see 'shardlm plan --help')\n"
            "  tokenize TOK [FILE]  encode a text with a Hugging Face tokenizer.json (or --decode ids) as\n"
            "                   Python's tokenizers does (see 'shardlm tokenize --help')\n"
            "  version          print the version\n"
            "  help             this text\n");
}

static void usage_train(FILE *out)
{
    fprintf(out,
            "usage: shardlm train CONFIG [options]\n"
            "\n"
            "Trains the model of CONFIG (JSON, DeepSpeed keys plus model/data/train/checkpoint sections).\n"
            "\n"
            "options:\n"
            "  --deepspeed FILE     merge a DeepSpeed JSON config (as Hugging Face users pass it)\n"
            "  --set KEY.PATH=VALUE override a config key (repeatable), e.g. --set train.steps=50\n"
            "  --dump FILE          write the first step's weights, logits, loss and gradients (tests)\n"
            "  --dump-final FILE    write the parameters after the last step (tests)\n"
            "  --resume auto|none|PATH\n"
            "                       auto: continue from checkpoint.dir's latest checkpoint; start fresh only\n"
            "                       when the directory holds none (with checkpoints but no usable 'latest' it\n"
            "                       refuses, naming them); none: start fresh; PATH: a checkpoint file, its\n"
            "                       directory or that directory's 'latest'\n"
            "  --print-config       log the resolved configuration (file, --deepspeed, --set, derived batch sizes)\n"
            "  --quiet              no per-step lines\n"
            "  -h, --help           this text\n"
            "\n"
            "exit status: 0 done; 1 internal error; 2 bad input (config, data, checkpoint, arguments);\n"
            "             3 stopped by SIGUSR1, SIGTERM or SIGINT with everything trained saved in checkpoint.dir:\n"
            "               requeue and --resume auto (without checkpoint.dir: 128 + the signal)\n");
}

/* Every rank reads the config; a bad one is reported once, by the lowest rank. */
static void load_train_config(struct comm *comm, struct config *cfg, const char *path, const char *deepspeed,
                              const char *const *sets, int n_sets)
{
    struct fail_trap trap;
    if (FAIL_TRAP(&trap) == 0) {
        run_config_load(cfg, path, deepspeed, sets, n_sets);
    }
    fail_untrap();
    comm_agree_failure(comm, &trap);
}

static int cmd_train(int argc, char **argv)
{
    static const struct option opts[] = {
        {"deepspeed", required_argument, NULL, 'd'},
        {"set", required_argument, NULL, 's'},
        {"dump", required_argument, NULL, 'D'},
        {"dump-final", required_argument, NULL, 'F'},
        {"quiet", no_argument, NULL, 'q'},
        {"print-config", no_argument, NULL, 'p'},
        {"resume", required_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *deepspeed = NULL;
    const char *sets[MAX_SETS];
    int n_sets = 0;
    struct train_options topt = {0};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'd': deepspeed = optarg; break;
        case 's':
            if (n_sets == MAX_SETS)
                fail_input("too many --set options (at most %d)", MAX_SETS);
            sets[n_sets++] = optarg;
            break;
        case 'D': topt.dump_path = optarg; break;
        case 'F': topt.dump_final_path = optarg; break;
        case 'q': topt.quiet = 1; break;
        case 'p': topt.print_config = 1; break;
        case 'r': topt.resume = optarg; break;
        case 'h': usage_train(stdout); return EXIT_OK;
        default: usage_train(stderr); return EXIT_BAD_INPUT;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "shardlm: error: train needs exactly one CONFIG file; see 'shardlm train --help'\n");
        return EXIT_BAD_INPUT;
    }
    topt.config_path = argv[optind];
    topt.deepspeed_path = deepspeed;
    train_install_stop_handlers();
    train_fault_point("start");
    struct comm comm;
    comm_init(&comm, NULL, NULL);
    struct config cfg;
    load_train_config(&comm, &cfg, argv[optind], deepspeed, sets, n_sets);
    train_fault_point("config");
    int status = train_run(&cfg, &comm, &topt);
    config_free(&cfg);
    comm_finalize(&comm);
    return status;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "shardlm: error: no command given; see 'shardlm help' for the usage\n");
        return EXIT_BAD_INPUT;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "train") == 0)
        return cmd_train(argc - 1, argv + 1);
    if (strcmp(cmd, "inspect") == 0)
        return cmd_inspect(argc - 1, argv + 1);
    if (strcmp(cmd, "export") == 0)
        return cmd_export(argc - 1, argv + 1);
    if (strcmp(cmd, "generate") == 0)
        return cmd_generate(argc - 1, argv + 1);
    if (strcmp(cmd, "eval") == 0)
        return cmd_eval(argc - 1, argv + 1);
    if (strcmp(cmd, "plan") == 0)
        return cmd_plan(argc - 1, argv + 1);
    if (strcmp(cmd, "tokenize") == 0)
        return cmd_tokenize(argc - 1, argv + 1);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("shardlm %s\n", SHARDLM_VERSION);
        return EXIT_OK;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage_main(stdout);
        return EXIT_OK;
    }
    fprintf(stderr, "shardlm: error: unknown command '%s'; see 'shardlm help'\n", cmd);
    return EXIT_BAD_INPUT;
}
