/*
 * comm over MPI on host buffers, with one communication thread per rank.
 *
 * MPI is initialised with MPI_THREAD_SERIALIZED: during training only the
 * communication thread calls MPI, one request at a time, in submission order.
 * The main thread calls MPI only to start, to finish and to abort.
 *
 * Waiting for a late rank sleeps. Open MPI's blocking collectives wait by
 * polling (calling sched_yield between polls with mpi_yield_when_idle), so a
 * rank that reaches a collective first stays runnable all the while its peers
 * compute. With more ranks than cores (mpirun --oversubscribe, several Slurm
 * jobs on one node) the scheduler then hands whole cores to the pollers for
 * seconds: in tests/t_slurm.py's job mix on 2 cores (Linux 6.18), a 1-rank
 * job's runnable thread waited 5-7 s on the run queue at a time while a 2-rank
 * job took both cores, and single steps of 25-70 ms took 7-20 s (issue 13: a
 * 4-rank job that needs 1 s alone was still running after 151 s). So the
 * communication thread starts the non-blocking collective and waits with
 * wait_sleeping: it polls for COMM_POLL_SECONDS, then sleeps between polls;
 * the collective progresses in those polls (Open MPI progresses non-blocking
 * collectives only inside MPI calls).
 */
#include "comm.h"

#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/devemu.h"
#include "core/dtype.h"
#include "liveness.h"
#include "core/util.h"

#define COMM_QUEUE_LEN 256
#define COMM_TIMEOUT_DEFAULT 600 /* seconds a request may take before the job is aborted */
/* wait_sleeping: how long it polls before it sleeps, and the range of its
 * sleeps (doubling from the first). Measured with 2 ranks on 2 cores
 * (input/default.json): polling 1 ms keeps the step time of blocking
 * collectives, 0.1 ms made steps 20% slower (a large collective's transfer
 * then waits out sleeps); in the Slurm job mix 1 ms cut the longest stall of a
 * step from 7-20 s to 1-2 s. A sleep of at most 1 ms delays the end of a
 * collective that followed a long wait by at most that. */
#define COMM_POLL_SECONDS 1e-3
#define COMM_SLEEP_FIRST_NS 20000L
#define COMM_SLEEP_MAX_NS 1000000L
/* After a timeout: how long the peers are pinged (liveness.h) before those
 * that never answered are named, and how long a rank that is not the lowest
 * surviving one waits for that rank's report and abort before it reports
 * itself (one line in the job log, not one per survivor). A ping crosses
 * a network in well under a millisecond; the margin is for loaded hosts. */
#define COMM_PROBE_SECONDS 5.0
#define COMM_REPORT_GRACE_SECONDS 15

struct comm_op {
    enum comm_kind kind;
    enum comm_reduce reduce;
    enum comm_dtype dtype;
    const void *send;
    void *recv;
    size_t count;
    int root;
    struct comm_request *req;
};

struct comm_mpi {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;     /* signalled on submit, on completion, on shutdown */
    struct comm_op queue[COMM_QUEUE_LEN];
    int head, tail, count;
    int shutdown;
    int thread_started;
    double timeout;
    struct comm *owner;
    struct liveness *liveness; /* NULL with one rank */
    struct rank_card *cards;   /* (world): every rank's host, pid, node-local rank */
    /* The watchdog of comm_watch_begin/end; watch_lock guards the fields below. */
    pthread_t watchdog;
    int watchdog_started;
    pthread_mutex_t watch_lock;
    pthread_cond_t watch_cond;
    const char *watching;      /* the phase being watched, NULL when none */
    int watch_shutdown;
    double watch_since;        /* when it began, or when every rank last answered */
};

static int g_world_for_abort = 1;
static MPI_Op g_sum_f16 = MPI_OP_NULL, g_sum_bf16 = MPI_OP_NULL;

/* Sums of half-precision values: each pair added in fp32 and rounded back to
 * the half type, as a GPU's reduction does. */
static void sum_f16(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = f32_to_f16(f16_to_f32(a[i]) + f16_to_f32(b[i]));
}

static void sum_bf16(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

static void abort_hook(int status)
{
    if (g_world_for_abort > 1)
        MPI_Abort(MPI_COMM_WORLD, status);
    exit(status);
}

size_t comm_dtype_size(enum comm_dtype dt)
{
    switch (dt) {
    case COMM_F32: return 4;
    case COMM_F64: return 8;
    case COMM_I32: return 4;
    default: return 2;
    }
}

static MPI_Datatype mpi_type(enum comm_dtype dt)
{
    switch (dt) {
    case COMM_F32: return MPI_FLOAT;
    case COMM_F64: return MPI_DOUBLE;
    case COMM_I32: return MPI_INT;
    default: return MPI_UINT16_T;
    }
}

static MPI_Op mpi_sum(enum comm_dtype dt)
{
    return dt == COMM_U16_SUM_F16 ? g_sum_f16 : dt == COMM_U16_SUM_BF16 ? g_sum_bf16 : MPI_SUM;
}

static int mpi_count(size_t count)
{
    if (count > (size_t)INT32_MAX)
        fail_internal("comm: %zu elements in one collective exceed MPI's int count", count);
    return (int)count;
}

static void mpi_check(int rc, const char *what)
{
    if (rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, msg, &len);
        fail_internal("MPI %s failed: %s", what, msg);
    }
}

/* Completes REQ: polls with MPI_Test for COMM_POLL_SECONDS, then sleeps
 * between polls, each sleep twice the last up to COMM_SLEEP_MAX_NS (see the
 * top of the file for why). */
static void wait_sleeping(MPI_Request *req, const char *what)
{
    double poll_until = now_seconds() + COMM_POLL_SECONDS;
    long sleep_ns = COMM_SLEEP_FIRST_NS;
    for (;;) {
        int done = 0;
        mpi_check(MPI_Test(req, &done, MPI_STATUS_IGNORE), what);
        if (done)
            return;
        if (now_seconds() < poll_until)
            continue;
        struct timespec pause = {0, sleep_ns};
        nanosleep(&pause, NULL);
        sleep_ns = sleep_ns * 2 < COMM_SLEEP_MAX_NS ? sleep_ns * 2 : COMM_SLEEP_MAX_NS;
    }
}

static void run_op(struct comm *c, const struct comm_op *op)
{
    int n = mpi_count(op->count);
    MPI_Datatype t = mpi_type(op->dtype);
    MPI_Request req;
    switch (op->kind) {
    case COMM_ALLGATHER: {
        size_t slot = (size_t)c->rank * op->count * comm_dtype_size(op->dtype);
        const void *send = op->send == (char *)op->recv + slot ? MPI_IN_PLACE : op->send;
        mpi_check(MPI_Iallgather(send, n, t, op->recv, n, t, MPI_COMM_WORLD, &req), "all-gather");
        break;
    }
    case COMM_REDUCE_SCATTER:
        mpi_check(MPI_Ireduce_scatter_block(op->send, op->recv, n, t, mpi_sum(op->dtype), MPI_COMM_WORLD, &req),
                  "reduce-scatter");
        break;
    case COMM_ALLREDUCE:
        if (op->reduce == COMM_MAX && (op->dtype == COMM_U16_SUM_F16 || op->dtype == COMM_U16_SUM_BF16))
            fail_internal("comm: no max reduction of half-precision values");
        mpi_check(MPI_Iallreduce(MPI_IN_PLACE, op->recv, n, t, op->reduce == COMM_MAX ? MPI_MAX : mpi_sum(op->dtype),
                                 MPI_COMM_WORLD, &req),
                  "all-reduce");
        break;
    case COMM_BROADCAST:
        mpi_check(MPI_Ibcast(op->recv, n, t, op->root, MPI_COMM_WORLD, &req), "broadcast");
        break;
    default:
        mpi_check(MPI_Ibarrier(MPI_COMM_WORLD, &req), "barrier");
        break;
    }
    wait_sleeping(&req, comm_kind_name(op->kind));
}

static void *comm_thread_main(void *arg)
{
    struct comm_mpi *m = arg;
    struct comm *c = m->owner;
    pthread_mutex_lock(&m->lock);
    for (;;) {
        while (m->count == 0 && !m->shutdown)
            pthread_cond_wait(&m->cond, &m->lock);
        if (m->count == 0 && m->shutdown)
            break;
        struct comm_op op = m->queue[m->head];
        pthread_mutex_unlock(&m->lock);
        double t0 = now_seconds();
        run_op(c, &op);
        double dt = now_seconds() - t0;
        pthread_mutex_lock(&m->lock);
        c->busy_seconds += dt;
        m->head = (m->head + 1) % COMM_QUEUE_LEN;
        m->count--;
        op.req->done = 1;
        pthread_cond_broadcast(&m->cond);
    }
    pthread_mutex_unlock(&m->lock);
    return NULL;
}

/* Every rank's card (liveness.h) to every rank, and this rank's responder
 * started, so that a timeout can name the ranks that are gone. */
static void exchange_cards(struct comm *c, struct comm_mpi *m)
{
    struct rank_card mine;
    m->liveness = liveness_start(c->rank, &mine);
    mine.local_rank = c->local_rank;
    mine.local_world = c->local_world;
    m->cards = xcalloc((size_t)c->world, sizeof *m->cards);
    mpi_check(MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, m->cards, (int)sizeof mine, MPI_BYTE, MPI_COMM_WORLD),
              "all-gather of the rank cards");
    /* A rank without a responder would look lost: then no rank asks. */
    for (int r = 0; r < c->world; r++)
        if (m->cards[r].port == 0) {
            liveness_stop(m->liveness);
            m->liveness = NULL;
            return;
        }
    liveness_set_peers(m->liveness, m->cards, c->world);
}

void comm_log_ranks(const struct comm *c)
{
    const struct comm_mpi *m = c->impl;
    for (int r = 0; m->cards && r < c->world; r++) {
        const struct rank_card *k = &m->cards[r];
        log_info("rank %d of %d | host %s | pid %d | node-local rank %d of %d", r, c->world, k->host, (int)k->pid,
                 (int)k->local_rank, (int)k->local_world);
    }
}

/* "2, 3 (host node2), 6 (host node4)": the ranks with answered[r] == 0,
 * each run on one host followed by the host's name. */
static void name_lost_ranks(const struct comm_mpi *m, int world, const int *answered, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    for (int r = 0; r < world && n + 1 < cap; r++) {
        if (answered[r])
            continue;
        n += (size_t)snprintf(out + n, cap - n, "%s%d", n ? ", " : "", r);
        int next = r + 1;
        while (next < world && answered[next])
            next++;
        if ((next == world || strcmp(m->cards[next].host, m->cards[r].host) != 0) && n + 1 < cap)
            n += (size_t)snprintf(out + n, cap - n, " (host %s)", m->cards[r].host);
    }
}

/* Fails with one line that names the ranks with answered[r] == 0 (LOST of
 * them) and their hosts. The lowest rank that answered reports; the others
 * give it COMM_REPORT_GRACE_SECONDS to abort the job first. */
__attribute__((noreturn)) static void fail_lost(struct comm *c, struct comm_mpi *m, const char *what,
                                                const int *answered, int lost)
{
    int reporter = 0;
    while (!answered[reporter])
        reporter++;
    if (reporter != c->rank)
        sleep(COMM_REPORT_GRACE_SECONDS);
    char names[1024];
    name_lost_ranks(m, c->world, answered, names, sizeof names);
    /* Not one of several peers answering may as well be a firewall that
     * drops the pings as every other rank gone: say so. */
    const char *caveat = lost == c->world - 1 && c->world > 2
                             ? " (or UDP between the ranks is blocked here, and the ranks are merely stuck)"
                             : "";
    fail_internal("%s did not finish within %.0f s: lost rank%s %s, no answer: process or host gone%s; "
                  "%d of %d ranks answer; resume from the last checkpoint (SHARDLM_COMM_TIMEOUT sets the limit)",
                  what, m->timeout, lost > 1 ? "s" : "", names, caveat, c->world - lost, c->world);
}

/* Pings every rank (liveness.h); fails naming the lost ones when a rank does
 * not answer. Returns 1 when all answer, 0 when they cannot be asked. */
static int fail_if_ranks_lost(struct comm *c, struct comm_mpi *m, const char *what)
{
    if (!m->liveness)
        return 0;
    int *answered = xcalloc((size_t)c->world, sizeof *answered);
    int lost = liveness_probe(m->liveness, COMM_PROBE_SECONDS, answered);
    if (lost > 0)
        fail_lost(c, m, what, answered, lost);
    free(answered);
    return lost == 0;
}

/* A collective timed out: a lost rank is named; with every rank there, one
 * is stuck, which is an error as well. */
__attribute__((noreturn)) static void fail_timed_out(struct comm *c, struct comm_mpi *m)
{
    if (fail_if_ranks_lost(c, m, "a collective"))
        fail_internal("a collective did not finish within %.0f s, yet every rank answers: one is stuck, not gone "
                      "(SHARDLM_COMM_TIMEOUT sets the limit)",
                      m->timeout);
    fail_internal("a collective did not finish within %.0f s: another rank has probably died or hangs "
                  "(SHARDLM_COMM_TIMEOUT sets the limit)",
                  m->timeout);
}

/* The watchdog of comm_watch_begin/end: once a watched phase has lasted the
 * comm timeout, it asks every rank; a lost one ends the job, a phase that is
 * only slow (every rank answers) is given another timeout. */
static void *watchdog_main(void *arg)
{
    struct comm_mpi *m = arg;
    pthread_mutex_lock(&m->watch_lock);
    while (!m->watch_shutdown) {
        if (!m->watching) {
            pthread_cond_wait(&m->watch_cond, &m->watch_lock);
            continue;
        }
        double due = m->watch_since + m->timeout;
        if (now_seconds() < due) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += (time_t)(due - now_seconds()) + 1;
            pthread_cond_timedwait(&m->watch_cond, &m->watch_lock, &until);
            continue;
        }
        const char *what = m->watching;
        pthread_mutex_unlock(&m->watch_lock);
        fail_if_ranks_lost(m->owner, m, what);
        pthread_mutex_lock(&m->watch_lock);
        m->watch_since = now_seconds();
    }
    pthread_mutex_unlock(&m->watch_lock);
    return NULL;
}

static void set_watch(struct comm *c, const char *what)
{
    struct comm_mpi *m = c->impl;
    if (!m->watchdog_started)
        return;
    pthread_mutex_lock(&m->watch_lock);
    m->watching = what;
    m->watch_since = now_seconds();
    pthread_cond_broadcast(&m->watch_cond);
    pthread_mutex_unlock(&m->watch_lock);
}

void comm_watch_begin(struct comm *c, const char *what) { set_watch(c, what); }
void comm_watch_end(struct comm *c) { set_watch(c, NULL); }

void comm_init(struct comm *c, int *argc, char ***argv)
{
    memset(c, 0, sizeof *c);
    /* The communication thread shares the cores with the compute threads:
     * Open MPI's progress loop must yield while it waits for a peer instead of
     * spinning a core away from the compute (measured: 450 ms per step with
     * yield against 770 ms without, 2 ranks on 2 cores). A user's setting wins. */
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
    int provided = 0;
    mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided), "init");
    if (provided < MPI_THREAD_SERIALIZED)
        fail_internal("this MPI library offers no MPI_THREAD_SERIALIZED support (got level %d); "
                      "shardlm needs it for its communication thread",
                      provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->world);
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &c->local_rank);
    MPI_Comm_size(local, &c->local_world);
    MPI_Comm_free(&local);
    g_world_for_abort = c->world;
    mpi_check(MPI_Op_create(sum_f16, 1, &g_sum_f16), "op create");
    mpi_check(MPI_Op_create(sum_bf16, 1, &g_sum_bf16), "op create");
    util_set_rank(c->rank, c->world);
    util_set_abort_hook(abort_hook);

    struct comm_mpi *m = xcalloc(1, sizeof *m);
    c->impl = m;
    m->owner = c;
    const char *bench = getenv("SHARDLM_BENCH");
    c->skip = bench && strcmp(bench, "compute-only") == 0;
    const char *t = getenv("SHARDLM_COMM_TIMEOUT");
    m->timeout = t && atof(t) > 0 ? atof(t) : COMM_TIMEOUT_DEFAULT;
    pthread_mutex_init(&m->lock, NULL);
    pthread_cond_init(&m->cond, NULL);
    pthread_mutex_init(&m->watch_lock, NULL);
    pthread_cond_init(&m->watch_cond, NULL);
    if (c->world > 1) {
        exchange_cards(c, m);
        if (pthread_create(&m->thread, NULL, comm_thread_main, m) != 0)
            fail_internal("cannot start the communication thread: %s", strerror(errno));
        m->thread_started = 1;
        if (m->liveness) {
            if (pthread_create(&m->watchdog, NULL, watchdog_main, m) != 0)
                fail_internal("cannot start the communication watchdog: %s", strerror(errno));
            m->watchdog_started = 1;
        }
    }
}

/* Sets *FLAG under LOCK, wakes the thread waiting on COND and joins it. */
static void stop_thread(pthread_t thread, pthread_mutex_t *lock, pthread_cond_t *cond, int *flag)
{
    pthread_mutex_lock(lock);
    *flag = 1;
    pthread_cond_broadcast(cond);
    pthread_mutex_unlock(lock);
    pthread_join(thread, NULL);
}

void comm_finalize(struct comm *c)
{
    if (c->device) {
        c->device->finalize(c->device->ctx);
        c->device = NULL;
    }
    struct comm_mpi *m = c->impl;
    if (m->thread_started)
        stop_thread(m->thread, &m->lock, &m->cond, &m->shutdown);
    if (m->watchdog_started)
        stop_thread(m->watchdog, &m->watch_lock, &m->watch_cond, &m->watch_shutdown);
    pthread_cond_destroy(&m->watch_cond);
    pthread_mutex_destroy(&m->watch_lock);
    pthread_cond_destroy(&m->cond);
    pthread_mutex_destroy(&m->lock);
    liveness_stop(m->liveness);
    free(m->cards);
    free(m);
    c->impl = NULL;
    util_set_abort_hook(NULL);
    MPI_Op_free(&g_sum_f16);
    MPI_Op_free(&g_sum_bf16);
    MPI_Finalize();
}

void comm_agree_failure(struct comm *c, const struct fail_trap *t)
{
    /* (world - rank) << 8 | status: the maximum is the lowest failing rank */
    int32_t key = t->status ? (int32_t)((c->world - c->rank) << 8 | (t->status & 0xff)) : 0;
    comm_allreduce(c, &key, 1, COMM_I32, COMM_MAX, NULL);
    if (!key)
        return;
    if (c->world - (key >> 8) == c->rank)
        fail_report(t);
    /* what this rank was writing (an NVMe state file preallocated at set-up, a .tmp) goes, as under util_exit */
    util_remove_pending_files();
    comm_finalize(c);
    exit(key & 0xff);
}

/* One rank: the collectives are copies (or nothing). */
static void run_single(const struct comm_op *op)
{
    size_t bytes = op->count * comm_dtype_size(op->dtype);
    if ((op->kind == COMM_ALLGATHER || op->kind == COMM_REDUCE_SCATTER) && op->send != op->recv)
        memmove(op->recv, op->send, bytes);
}

/* Emulated device memory (devemu.h): the collective works on the read-write
 * views, and like NCCL it refuses a call that mixes device and host buffers. */
static void emulated_operands(struct comm_op *op)
{
    void *send = devemu_host(op->send), *recv = devemu_host(op->recv);
    if (op->send && op->recv && (send != op->send) != (recv != op->recv))
        fail_internal("%s mixes device and host buffers", comm_kind_name(op->kind));
    op->send = send;
    op->recv = recv;
}

/* Hands a collective of device buffers to the device transport; returns 0
 * when its buffers are host memory. */
static int device_collective(struct comm *c, const struct comm_op *op, struct comm_request *req)
{
    struct comm_device_ops *d = c->device;
    if (!d || op->kind == COMM_KINDS)
        return 0;
    int send_dev = op->send && d->is_device(op->send), recv_dev = op->recv && d->is_device(op->recv);
    if (op->send && op->recv && send_dev != recv_dev)
        fail_internal("%s mixes device and host buffers", comm_kind_name(op->kind));
    if (!send_dev && !recv_dev)
        return 0;
    req->done = 0;
    req->active = 1;
    req->on_device = 1;
    if (!c->skip)
        d->collective(d->ctx, op->kind, op->send, op->recv, op->count, op->dtype, op->reduce, op->root, req);
    return 1;
}

static void submit(struct comm *c, struct comm_op op, struct comm_request *req)
{
    struct comm_mpi *m = c->impl;
    emulated_operands(&op);
    struct comm_request local = {0};
    if (device_collective(c, &op, req ? req : &local)) {
        if (!req)
            comm_wait(c, &local);
        return;
    }
    if (!req)
        req = &local;
    req->done = 0;
    req->active = 1;
    req->on_device = 0;
    op.req = req;
    if (c->skip) {
        req->done = 1;
    } else if (c->world == 1) {
        run_single(&op);
        req->done = 1;
    } else {
        pthread_mutex_lock(&m->lock);
        while (m->count == COMM_QUEUE_LEN)
            pthread_cond_wait(&m->cond, &m->lock);
        m->queue[m->tail] = op;
        m->tail = (m->tail + 1) % COMM_QUEUE_LEN;
        m->count++;
        pthread_cond_broadcast(&m->cond);
        pthread_mutex_unlock(&m->lock);
    }
    if (req == &local)
        comm_wait(c, req);
}

void comm_wait(struct comm *c, struct comm_request *req)
{
    if (!req->active)
        return;
    if (req->on_device) {
        if (!c->skip)
            c->device->wait(c->device->ctx, req);
        req->active = 0;
        return;
    }
    struct comm_mpi *m = c->impl;
    if (!req->done) {
        double t0 = now_seconds();
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_sec += (time_t)m->timeout;
        pthread_mutex_lock(&m->lock);
        while (!req->done) {
            int rc = pthread_cond_timedwait(&m->cond, &m->lock, &deadline);
            if (rc == ETIMEDOUT && !req->done) {
                pthread_mutex_unlock(&m->lock);
                fail_timed_out(c, m);
            }
        }
        pthread_mutex_unlock(&m->lock);
        c->wait_seconds += now_seconds() - t0;
    }
    req->active = 0;
}

void comm_allgather(struct comm *c, const void *send, void *recv, size_t count, enum comm_dtype dt,
                    struct comm_request *req)
{
    struct comm_op op = {.kind = COMM_ALLGATHER, .dtype = dt, .send = send, .recv = recv, .count = count};
    submit(c, op, req);
}

void comm_reduce_scatter(struct comm *c, const void *send, void *recv, size_t count, enum comm_dtype dt,
                         struct comm_request *req)
{
    struct comm_op op = {.kind = COMM_REDUCE_SCATTER, .dtype = dt, .send = send, .recv = recv, .count = count};
    submit(c, op, req);
}

void comm_allreduce(struct comm *c, void *buf, size_t count, enum comm_dtype dt, enum comm_reduce reduce,
                    struct comm_request *req)
{
    struct comm_op op = {.kind = COMM_ALLREDUCE, .reduce = reduce, .dtype = dt, .recv = buf, .count = count};
    submit(c, op, req);
}

void comm_broadcast(struct comm *c, void *buf, size_t count, enum comm_dtype dt, int root,
                    struct comm_request *req)
{
    struct comm_op op = {.kind = COMM_BROADCAST, .dtype = dt, .recv = buf, .count = count, .root = root};
    submit(c, op, req);
}

void comm_barrier(struct comm *c)
{
    struct comm_op op = {.kind = COMM_KINDS, .dtype = COMM_I32};
    submit(c, op, NULL);
}

const char *comm_kind_name(enum comm_kind k)
{
    static const char *names[COMM_KINDS] = {"all-gather", "reduce-scatter", "all-reduce", "broadcast"};
    return k < COMM_KINDS ? names[k] : "barrier";
}
