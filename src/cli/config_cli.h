/*
 * config_cli — the `shardlm config` command: prints the configuration
 * reference generated from the schema (--reference, docs/configuration.md),
 * or reads and checks a config as `shardlm train` would and prints the
 * resolved document, running nothing (the docs check, tests/t_docs.py, and
 * users checking a config before queueing a job). Called by main.c.
 */
#ifndef SHARDLM_CONFIG_CLI_H
#define SHARDLM_CONFIG_CLI_H

/* argv[0] is "config"; returns the process exit status. */
int cmd_config(int argc, char **argv);

#endif
