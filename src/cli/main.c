/*
 * main — the command line: `shardlm COMMAND [options]`, each command parsed
 * with getopt_long and answering --help.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_tools.h"
#include "config_cli.h"
#include "eval_cli.h"
#include "generate.h"
#include "plan_cli.h"
#include "tokenize_cli.h"
#include "train_cli.h"
#include "core/util.h"

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
            "  config CONFIG    check a config as train would and print it resolved, running nothing;\n"
            "                   --reference prints every key (see 'shardlm config --help')\n"
            "  tokenize TOK [FILE]  encode a text with a Hugging Face tokenizer.json (or --decode ids) as\n"
            "                   Python's tokenizers does (see 'shardlm tokenize --help')\n"
            "  version          print the version\n"
            "  help             this text\n");
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
    if (strcmp(cmd, "config") == 0)
        return cmd_config(argc - 1, argv + 1);
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
