/*
 * test_devemu — emulated device memory (src/core/devemu.c, SHARDLM_EMULATE_DEVICE):
 * the host faults on a device address, the kernels see the data through the
 * other view, copies move it both ways, and a collective that mixes device
 * and host buffers is refused as NCCL would.
 */
#include "backend/backend.h"
#include "check.h"
#include "comm/comm.h"
#include "core/devemu.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs fn in a child, its stderr into a temporary file; returns the signal
 * that ended it (0: exited, status in *status) and whether its stderr
 * mentions a SEGV (AddressSanitizer reports the fault and exits instead). */
static int in_child(void (*fn)(void *), void *arg, int *status, int *segv_report)
{
    char path[] = "/tmp/test_devemu.XXXXXX";
    int fd = mkstemp(path);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 2);
        fn(arg);
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    char buf[4096] = {0};
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    close(fd);
    unlink(path);
    if (segv_report)
        *segv_report = n > 0 && strstr(buf, "SEGV") != NULL;
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return WIFSIGNALED(st) ? WTERMSIG(st) : 0;
}

/* The host touched device memory and died of it: SIGSEGV, or under
 * AddressSanitizer its SEGV report and a failing exit. */
static int faulted(void (*fn)(void *), void *arg)
{
    int status, report;
    int sig = in_child(fn, arg, &status, &report);
    return sig == SIGSEGV || (sig == 0 && status != 0 && report);
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
    CHECK("host_write_faults", faulted(host_write, dev + 7), "no SIGSEGV");
    CHECK("host_read_faults", faulted(host_read, dev), "no SIGSEGV");
    CHECK("pinned_is_host_memory", in_child(host_write, pinned, &status, NULL) == 0 && status == 0, "status %d",
          status);

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

    int sig = in_child(device_allgather, dev, &status, NULL);
    CHECK("device_collective_runs", sig == 0 && status == 0, "signal %d, status %d", sig, status);
    in_child(mixed_allgather, dev, &status, NULL);
    CHECK("mixed_collective_refused", status != 0, "a device send with a host receive buffer ran (status 0)");

    backend_mem_free(SPACE_DEVICE, dev16, n * sizeof(uint16_t));
    backend_mem_free(SPACE_DEVICE, dev, n * sizeof(float));
    backend_mem_free(SPACE_PINNED, pinned, n * sizeof(float));
    CHECK("freed", devemu_host(dev) == (void *)dev, "the region is still mapped");
    free(back);
    return check_status();
}
