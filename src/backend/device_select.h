/*
 * device_select — which GPU a rank drives (DESIGN §2): the node-local rank's,
 * from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), so mpirun, srun and sbatch
 * need no per-launcher code.
 *
 * Rules (device_select): with at least as many visible GPUs as ranks on the
 * node, local rank r takes GPU r. A rank that sees exactly one GPU through
 * CUDA_VISIBLE_DEVICES naming one device takes it (the launcher bound one GPU
 * per task: srun --gpus-per-task=1, --gpu-bind). Ranks may share GPUs only
 * when SHARDLM_SHARE_GPUS=1 (r takes GPU r mod count; for checking
 * multi-rank sharding on one GPU with host-staged communication). Anything
 * else (no GPU, fewer GPUs than ranks) is an error with a hint, which the
 * CUDA backend turns into exit status 2.
 *
 * Host-only C: unit-tested in the CPU build (tests/unit/test_device_select.c).
 */
#ifndef SHARDLM_DEVICE_SELECT_H
#define SHARDLM_DEVICE_SELECT_H

#include <stdbool.h>
#include <stddef.h>

/* The device index for this rank, or -1 with the reason in why.
 * n_devices: GPUs this process sees (0 when the CUDA runtime failed, with its
 * message in cuda_error, else NULL); visible_one: CUDA_VISIBLE_DEVICES names
 * exactly one device; shared: SHARDLM_SHARE_GPUS=1. */
int device_select(int local_rank, int local_size, int n_devices, const char *cuda_error, bool visible_one,
                  bool shared, char *why, size_t cap);

/* device_select with this process's node-local rank and size (MPI when it is
 * initialised, else rank 0 of 1) and its environment. */
int device_select_from_env(int n_devices, const char *cuda_error, char *why, size_t cap);

#endif
