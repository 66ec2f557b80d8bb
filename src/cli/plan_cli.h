/*
 * plan_cli — the `shardlm plan` command: prints the memory plan of one rank
 * (DESIGN §2) for any model shape, world size and target without running or
 * allocating anything, the host memory per node, the communication per step
 * and the model FLOPs per token; checks it against --gpu-mem / --host-mem,
 * says by how much a plan does not fit and which setting would make it fit,
 * and with --fit searches micro-batch, activation checkpointing,
 * cpu_checkpointing and offload for the most tokens per step that fit.
 *
 * Owns only the command's options and output; every number comes from
 * plan_compute_for() and plan_traffic() (plan.c), the trainer's own plan.
 * Called by main.c.
 */
#ifndef SHARDLM_PLAN_CLI_H
#define SHARDLM_PLAN_CLI_H

/* Exit status of a plan that does not fit the given memory. */
#define EXIT_PLAN_DOES_NOT_FIT 4

/* argv[0] is "plan"; returns the process exit status. */
int cmd_plan(int argc, char **argv);

#endif
