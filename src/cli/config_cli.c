/*
 * config_cli — `shardlm config` (config_cli.h).
 */
#include "config_cli.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli_args.h"
#include "config/config.h"
#include "core/util.h"
#include "run/run_config.h"

/* The largest world size --world takes: the batch keys are resolved for it. */
#define CONFIG_CLI_MAX_WORLD 1000000

static void usage_config(FILE *out)
{
    fprintf(out,
            "usage: shardlm config --reference\n"
            "       shardlm config CONFIG [options]\n"
            "\n"
            "--reference prints the configuration reference (docs/configuration.md) from the schema.\n"
            "With CONFIG: reads and checks it as 'shardlm train' would (keys, types, values, the batch for\n"
            "--world ranks, model.from_pretrained's config.json) and prints the resolved config; runs nothing.\n"
            "\n"
            "options:\n"
            "  --deepspeed FILE     merge a DeepSpeed JSON config, as train does\n"
            "  --set KEY.PATH=VALUE override a config key (repeatable), as train does\n"
            "  --world N            resolve the batch keys for N ranks (default 1)\n"
            "  --no-files           do not open model.from_pretrained's directory (check the config's own keys)\n"
            "  -h, --help           this text\n"
            "\n"
            "exit status: 0 the config is valid; 2 it is not (one line naming the key)\n");
}

int cmd_config(int argc, char **argv)
{
    static const struct option opts[] = {
        {"reference", no_argument, NULL, 'R'}, {"deepspeed", required_argument, NULL, 'd'},
        {"set", required_argument, NULL, 's'}, {"world", required_argument, NULL, 'w'},
        {"no-files", no_argument, NULL, 'n'},  {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *deepspeed = NULL;
    const char *sets[CLI_MAX_SETS];
    int n_sets = 0, reference = 0, no_files = 0, world = 1;
    int c;
    optind = 1;
    struct infer_options unused = {0}; /* cli_model_option's; only its --set ('s') is an option here */
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (cli_model_option(c, &unused, sets, &n_sets))
            continue;
        switch (c) {
        case 'R': reference = 1; break;
        case 'd': deepspeed = optarg; break;
        case 'w': world = (int)cli_parse_int(optarg, "--world", 1, CONFIG_CLI_MAX_WORLD); break;
        case 'n': no_files = 1; break;
        case 'h': usage_config(stdout); return EXIT_OK;
        default: usage_config(stderr); return EXIT_BAD_INPUT;
        }
    }
    if (reference) {
        if (optind != argc)
            fail_input("config --reference takes no CONFIG; see 'shardlm config --help'");
        config_print_reference(stdout);
        return EXIT_OK;
    }
    if (optind != argc - 1)
        fail_input("config needs exactly one CONFIG file (or --reference); see 'shardlm config --help'");
    struct config cfg;
    if (no_files) {
        config_begin(&cfg, argv[optind], deepspeed, sets, n_sets);
        config_end(&cfg);
    } else {
        run_config_load(&cfg, argv[optind], deepspeed, sets, n_sets);
    }
    config_resolve_batch(&cfg, world);
    char *text = config_dump(&cfg);
    printf("%s\n", text);
    free(text);
    config_free(&cfg);
    return EXIT_OK;
}
