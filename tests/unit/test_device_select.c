/*
 * test_device_select — which GPU each rank takes (src/backend/device_select.c): one
 * per local rank, a launcher-bound single GPU, sharing only when asked, and
 * the errors (no GPU, too few GPUs) with their hints.
 */
#include "check.h"
#include "backend/device_select.h"

#include <string.h>

int main(void)
{
    char why[512];
    int bad = 0;
    for (int size = 1; size <= 8; size++)
        for (int r = 0; r < size; r++)
            bad += device_select(r, size, 8, NULL, false, false, why, sizeof why) != r;
    CHECK("local_rank_takes_its_gpu", bad == 0, "%d of 36 placements wrong", bad);
    CHECK("more_gpus_than_ranks", device_select(1, 2, 4, NULL, false, false, why, sizeof why) == 1, "not 1");

    why[0] = 0;
    int d = device_select(0, 1, 0, "no CUDA-capable device is detected", false, false, why, sizeof why);
    CHECK("no_gpu_is_an_error", d == -1 && strstr(why, "no CUDA device") && strstr(why, "no CUDA-capable device") &&
                                    strstr(why, "Hint"),
          "got %d: %s", d, why);
    d = device_select(0, 1, 0, NULL, true, true, why, sizeof why);
    CHECK("no_gpu_even_when_sharing", d == -1 && strstr(why, "CPU build"), "got %d: %s", d, why);

    d = device_select(5, 8, 4, NULL, false, false, why, sizeof why);
    CHECK("too_few_gpus_is_an_error", d == -1 && strstr(why, "8 ranks") && strstr(why, "4 GPUs") &&
                                          strstr(why, "--ntasks-per-node=4"),
          "got %d: %s", d, why);
    d = device_select(3, 4, 1, NULL, false, false, why, sizeof why);
    CHECK("one_gpu_four_ranks_unbound", d == -1 && strstr(why, "1 GPU:"), "got %d: %s", d, why);

    bad = 0;
    for (int r = 0; r < 8; r++)
        bad += device_select(r, 8, 1, NULL, true, false, why, sizeof why) != 0;
    CHECK("launcher_bound_one_gpu_per_task", bad == 0, "%d ranks did not take their only GPU", bad);

    bad = 0;
    for (int r = 0; r < 4; r++)
        bad += device_select(r, 4, 2, NULL, false, true, why, sizeof why) != r % 2;
    CHECK("shared_gpus_round_robin", bad == 0, "%d ranks misplaced", bad);
    d = device_select(2, 2, 4, NULL, false, false, why, sizeof why);
    CHECK("bad_local_rank", d == -1 && strstr(why, "out of range"), "got %d: %s", d, why);
    return check_status();
}
