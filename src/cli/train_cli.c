/*
 * train_cli — `shardlm train CONFIG`: its options, the config read on every
 * rank (a bad one reported once), then run/train.c's run.
 */
#include "train_cli.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli_args.h"
#include "comm/comm.h"
#include "config/config.h"
#include "core/util.h"
#include "run/run_config.h"
#include "run/train.h"

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
            "                       directory or that directory's 'latest'. Without --resume (or with none) a\n"
            "                       checkpoint.dir that holds checkpoints is refused, unless --overwrite\n"
            "  --overwrite          a fresh start may save over the checkpoints in checkpoint.dir (and its latest)\n"
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

int cmd_train(int argc, char **argv)
{
    static const struct option opts[] = {
        {"deepspeed", required_argument, NULL, 'd'},
        {"set", required_argument, NULL, 's'},
        {"dump", required_argument, NULL, 'D'},
        {"dump-final", required_argument, NULL, 'F'},
        {"quiet", no_argument, NULL, 'q'},
        {"print-config", no_argument, NULL, 'p'},
        {"resume", required_argument, NULL, 'r'},
        {"overwrite", no_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *deepspeed = NULL;
    const char *sets[CLI_MAX_SETS];
    int n_sets = 0;
    struct train_options topt = {0};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'd': deepspeed = optarg; break;
        case 's':
            if (n_sets == CLI_MAX_SETS)
                fail_input("too many --set options (at most %d)", CLI_MAX_SETS);
            sets[n_sets++] = optarg;
            break;
        case 'D': topt.dump_path = optarg; break;
        case 'F': topt.dump_final_path = optarg; break;
        case 'q': topt.quiet = 1; break;
        case 'p': topt.print_config = 1; break;
        case 'r': topt.resume = optarg; break;
        case 'o': topt.overwrite = 1; break;
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
