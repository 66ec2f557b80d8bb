/*
 * test_comm_device — how comm_mpi.c routes collectives once a device transport
 * is attached (comm.h): device buffers go to the transport with their kind,
 * count, dtype, reduction and root; host buffers stay on MPI; comm_wait of a
 * device request asks the transport to order the compute stream and returns
 * without blocking; a blocking call (req NULL) waits at once; a mix of device
 * and host buffers is refused. "Device" memory here is a static array the fake
 * transport claims.
 */
#include "check.h"
#include "comm/comm.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static float g_device[64];

struct call {
    enum comm_kind kind;
    const void *send;
    void *recv;
    size_t count;
    enum comm_dtype dt;
    enum comm_reduce op;
    int root;
};

static struct call g_calls[16];
static int g_n_calls, g_waits, g_last_wait_event = -2;

static int fake_is_device(const void *p)
{
    return (const char *)p >= (const char *)g_device && (const char *)p < (const char *)(g_device + 64);
}

static void fake_collective(void *ctx, enum comm_kind kind, const void *send, void *recv, size_t count,
                            enum comm_dtype dt, enum comm_reduce op, int root, struct comm_request *req)
{
    (void)ctx;
    g_calls[g_n_calls] = (struct call){kind, send, recv, count, dt, op, root};
    req->event = 100 + g_n_calls++;
}

static void fake_wait(void *ctx, struct comm_request *req)
{
    (void)ctx;
    g_waits++;
    g_last_wait_event = req->event;
}

static void fake_finalize(void *ctx) { *(int *)ctx = 1; }

static void mixed(struct comm *c)
{
    float host[4];
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 2);
    comm_allgather(c, g_device, host, 4, COMM_F32, NULL);
}

int main(int argc, char **argv)
{
    struct comm c;
    comm_init(&c, &argc, &argv);
    int finalized = 0;
    struct comm_device_ops ops = {fake_is_device, fake_collective, fake_wait, fake_finalize, &finalized};
    c.device = &ops;

    struct comm_request req = {0};
    comm_allgather(&c, g_device, g_device + 8, 4, COMM_U16_SUM_BF16, &req);
    CHECK("device_allgather_to_transport",
          g_n_calls == 1 && g_calls[0].kind == COMM_ALLGATHER && g_calls[0].send == g_device &&
              g_calls[0].recv == g_device + 8 && g_calls[0].count == 4 && g_calls[0].dt == COMM_U16_SUM_BF16,
          "%d calls", g_n_calls);
    CHECK("device_request_not_waited_yet", g_waits == 0 && req.active && req.on_device, "waits %d", g_waits);
    comm_wait(&c, &req);
    CHECK("wait_orders_through_transport", g_waits == 1 && g_last_wait_event == 100 && !req.active,
          "waits %d, event %d", g_waits, g_last_wait_event);
    comm_wait(&c, &req);
    CHECK("second_wait_is_a_no_op", g_waits == 1, "waits %d", g_waits);

    comm_reduce_scatter(&c, g_device, g_device + 32, 8, COMM_F32, NULL);
    CHECK("blocking_reduce_scatter_waits", g_n_calls == 2 && g_calls[1].kind == COMM_REDUCE_SCATTER && g_waits == 2 &&
                                               g_last_wait_event == 101,
          "%d calls, %d waits", g_n_calls, g_waits);
    comm_allreduce(&c, g_device, 3, COMM_F32, COMM_MAX, NULL);
    CHECK("allreduce_keeps_its_op", g_n_calls == 3 && g_calls[2].op == COMM_MAX && g_calls[2].send == NULL &&
                                        g_calls[2].recv == g_device,
          "%d calls", g_n_calls);
    comm_broadcast(&c, g_device + 4, 2, COMM_I32, 0, NULL);
    CHECK("broadcast_keeps_its_root", g_n_calls == 4 && g_calls[3].kind == COMM_BROADCAST && g_calls[3].root == 0,
          "%d calls", g_n_calls);

    /* host buffers keep going through MPI (one rank: a copy) */
    float hs[4] = {1, 2, 3, 4}, hr[4] = {0};
    comm_allgather(&c, hs, hr, 4, COMM_F32, NULL);
    CHECK("host_buffers_stay_on_mpi", g_n_calls == 4 && hr[3] == 4.0f, "%d calls, recv %g", g_n_calls, hr[3]);
    double x = 2.5;
    comm_allreduce(&c, &x, 1, COMM_F64, COMM_SUM, NULL);
    CHECK("host_scalar_allreduce", g_n_calls == 4 && x == 2.5, "%d calls, %g", g_n_calls, x);

    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        mixed(&c);
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK("mixed_buffers_refused", !(WIFEXITED(st) && WEXITSTATUS(st) == 0), "the mixed call ran");

    comm_finalize(&c);
    CHECK("finalize_reaches_transport", finalized == 1, "not finalized");
    return check_status();
}
