/* device_select — see device_select.h. */
#include "device_select.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int device_select(int local_rank, int local_size, int n_devices, const char *cuda_error, bool visible_one,
                  bool shared, char *why, size_t cap)
{
    if (n_devices <= 0) {
        snprintf(why, cap,
                 "no CUDA device is visible to this process%s%s%s. Hint: run on a GPU node (with --gpus or "
                 "--gres=gpu:N under Slurm), check CUDA_VISIBLE_DEVICES, or use the CPU build (make without CUDA=1)",
                 cuda_error ? " (" : "", cuda_error ? cuda_error : "", cuda_error ? ")" : "");
        return -1;
    }
    if (local_rank < 0 || local_rank >= local_size) {
        snprintf(why, cap, "node-local rank %d of %d is out of range", local_rank, local_size);
        return -1;
    }
    if (n_devices >= local_size)
        return local_rank;
    if (n_devices == 1 && visible_one)
        return 0;
    if (shared)
        return local_rank % n_devices;
    snprintf(why, cap,
             "this node runs %d ranks but this rank sees %d GPU%s: shardlm drives one GPU per rank. Hint: start at "
             "most %d ranks per node (srun --ntasks-per-node=%d, mpirun --npernode %d), or set "
             "SHARDLM_SHARE_GPUS=1 to test sharding with ranks sharing GPUs",
             local_size, n_devices, n_devices == 1 ? "" : "s", n_devices, n_devices, n_devices);
    return -1;
}

int device_select_from_env(int n_devices, const char *cuda_error, char *why, size_t cap)
{
    int local_rank = 0, local_size = 1, initialised = 0;
    MPI_Initialized(&initialised);
    if (initialised) {
        MPI_Comm node;
        if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
            MPI_Comm_rank(node, &local_rank);
            MPI_Comm_size(node, &local_size);
            MPI_Comm_free(&node);
        }
    }
    const char *visible = getenv("CUDA_VISIBLE_DEVICES"), *share = getenv("SHARDLM_SHARE_GPUS");
    bool visible_one = visible && visible[0] && !strchr(visible, ',');
    bool shared = share && strcmp(share, "1") == 0;
    return device_select(local_rank, local_size, n_devices, cuda_error, visible_one, shared, why, cap);
}
