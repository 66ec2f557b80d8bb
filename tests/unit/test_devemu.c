/*
 * test_devemu — emulated device memory (src/devemu.c, SHARDLM_EMULATE_DEVICE):
 * the host faults on a device address, the kernels see the data through the
 * other view, copies move it both ways, and a collective that mixes device
 * and host buffers is refused as NCCL would.
 */
#include "backend.h"
#include "check.h"
#include "comm.h"
#include "devemu.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs fn in a child; returns the signal that ended it (0: exited, status in *status). */
static int in_child(void (*fn)(void *), void *arg, int *status)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", 1);
        dup2(devnull, 2);
        fn(arg);
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return WIFSIGNALED(st) ? WTERMSIG(st) : 0;
}

static void host_write(void *p) { *(volatile float *)p = 1.0f; }
static void host_read(void *p) { *(volatile float *)p += 0.0f; }

/* An all-gather from device memory into recv (NULL: device memory too). */
static void allgather_into(void *dev, float *recv)
{
    struct comm c;
    int argc = 1;
    char *args[] = {"test_devemu", NULL}, **argv = args;
    comm_init(&c, &argc, &argv);
    comm_allgather(&c, dev, recv ? recv : (float *)dev + 8, 4, COMM_F32, NULL);
    comm_finalize(&c);
}

static void mixed_allgather(void *dev)
{
    float host[4];
    allgather_into(dev, host);
}

static void device_allgather(void *dev) { allgather_into(dev, NULL); }

int main(void)
{
    setenv("SHARDLM_EMULATE_DEVICE", "1", 1);
    CHECK("enabled", devemu_enabled() && backend_is_device(), "emulation not on");

    const size_t n = 3000;
    float *dev = backend_mem_alloc(SPACE_DEVICE, n * sizeof(float), "the test");
    float *pinned = backend_mem_alloc(SPACE_PINNED, n * sizeof(float), "the test");
    CHECK("views_differ", devemu_host(dev) != (void *)dev && devemu_host(pinned) == (void *)pinned,
          "device %p -> %p, pinned %p -> %p", (void *)dev, devemu_host(dev), (void *)pinned, devemu_host(pinned));
    CHECK("interior_pointer", (char *)devemu_host(dev + 100) == (char *)devemu_host(dev) + 100 * sizeof(float),
          "offset not kept");

    int status;
    CHECK("host_write_faults", in_child(host_write, dev + 7, &status) == SIGSEGV, "no SIGSEGV");
    CHECK("host_read_faults", in_child(host_read, dev, &status) == SIGSEGV, "no SIGSEGV");
    CHECK("pinned_is_host_memory", in_child(host_write, pinned, &status) == 0 && status == 0, "status %d", status);

    /* host -> device -> kernels on the device -> host */
    for (size_t i = 0; i < n; i++)
        pinned[i] = (float)i;
    backend_copy(dev, pinned, n * sizeof(float));
    backend_scale(dev, 2.0f, n);
    backend_add(dev, dev, pinned, n); /* device + pinned, as the engine adds a host shard */
    float *back = calloc(n, sizeof *back);
    backend_copy(back, dev, n * sizeof(float));
    int wrong = 0;
    for (size_t i = 0; i < n; i++)
        wrong += back[i] != 3.0f * (float)i;
    CHECK("round_trip", wrong == 0, "%d of %zu elements wrong", wrong, n);
    CHECK("sum_squares_on_device", backend_sum_squares(dev, 3) == 0.0 + 9.0 + 36.0, "got %g",
          backend_sum_squares(dev, 3));

    /* casts between device bf16 and pinned fp32 */
    uint16_t *dev16 = backend_mem_alloc(SPACE_DEVICE, n * sizeof(uint16_t), "the test");
    backend_convert(dev16, DTYPE_BF16, pinned, DTYPE_F32, n);
    memset(back, 0, n * sizeof *back);
    backend_add_to_f32(back, dev16, DTYPE_BF16, 4);
    CHECK("convert_and_accumulate", back[0] == 0.0f && back[3] == 3.0f && back[4] == 0.0f,
          "got %g %g %g", back[0], back[3], back[4]);

    int sig = in_child(device_allgather, dev, &status);
    CHECK("device_collective_runs", sig == 0 && status == 0, "signal %d, status %d", sig, status);
    in_child(mixed_allgather, dev, &status);
    CHECK("mixed_collective_refused", status != 0, "a device send with a host receive buffer ran (status 0)");

    backend_mem_free(SPACE_DEVICE, dev16, n * sizeof(uint16_t));
    backend_mem_free(SPACE_DEVICE, dev, n * sizeof(float));
    backend_mem_free(SPACE_PINNED, pinned, n * sizeof(float));
    CHECK("freed", devemu_host(dev) == (void *)dev, "the region is still mapped");
    free(back);
    return check_status();
}
