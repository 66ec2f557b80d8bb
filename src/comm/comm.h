/*
 * comm — collectives between ranks (DESIGN §9): all-gather, reduce-scatter,
 * all-reduce (sum, max), broadcast, barrier; each blocking or started
 * asynchronously and finished with comm_wait.
 *
 * The MPI implementation (comm_mpi.c) moves host buffers. One communication
 * thread per rank owns every MPI call of the training loop and runs the
 * requests in the order they were started, so an all-gather started before a
 * block's compute really progresses during it (Open MPI's non-blocking
 * collectives only progress inside MPI calls). The order of requests is the
 * same on every rank because the program is, which is what MPI needs. While
 * it waits for a late rank the thread sleeps after a short poll, so ranks
 * that share cores (oversubscribed, or several jobs on one node) leave them to
 * the ranks still computing (comm_mpi.c says what polling did to them).
 *
 * A request not finished after comm timeout seconds (SHARDLM_COMM_TIMEOUT,
 * default 600) aborts the job: a dead or stuck rank never leaves the others
 * waiting forever. Before it aborts, the rank asks every peer outside MPI
 * whether it is still there (liveness.h) and names those that are not, with
 * their hosts: a lost node is one line in the job log. Any fail_input/fail_internal on a rank aborts every rank
 * (MPI_Abort) once comm_init has run.
 *
 * SHARDLM_BENCH=compute-only turns every collective into a no-op, so that the
 * overlap benchmark can time compute alone (results are then wrong).
 *
 * comm_wait_seconds and comm_busy_seconds say how much communication was
 * exposed (the caller blocked) and how long the collectives took; the engine
 * counts the bytes it moves itself (zero.c), by the formulas of DESIGN §3.
 *
 * Device buffers: a device backend attaches a transport for them
 * (backend_attach_comm: NCCL on its own stream in the CUDA build), and every
 * collective whose buffers are device memory goes there; host buffers keep
 * going through MPI. One collective never mixes the two. A device request's
 * comm_wait orders the device's compute after the collective instead of
 * blocking the host.
 *
 * Owns: MPI initialisation and finalisation, the communication thread, the
 * liveness responder (liveness.h) and the watchdog of watched phases. The
 * engine never includes mpi.h.
 */
#ifndef SHARDLM_COMM_H
#define SHARDLM_COMM_H

#include <stddef.h>
#include <stdint.h>

enum comm_dtype { COMM_F32 = 0, COMM_F64, COMM_I32, COMM_U16_SUM_F16, COMM_U16_SUM_BF16 };
enum comm_kind { COMM_ALLGATHER = 0, COMM_REDUCE_SCATTER, COMM_ALLREDUCE, COMM_BROADCAST, COMM_KINDS };
enum comm_reduce { COMM_SUM = 0, COMM_MAX };

struct comm_request {
    volatile int done;
    int active;
    int on_device;  /* started on the device transport */
    int event;      /* the transport's handle for it */
};

/* The collectives of device buffers (see above). kind COMM_KINDS: barrier. */
struct comm_device_ops {
    int (*is_device)(const void *p);
    void (*collective)(void *ctx, enum comm_kind kind, const void *send, void *recv, size_t count,
                       enum comm_dtype dt, enum comm_reduce op, int root, struct comm_request *req);
    void (*wait)(void *ctx, struct comm_request *req);
    void (*finalize)(void *ctx);
    void *ctx;
};

struct comm {
    int rank, world;           /* in the job */
    int local_rank, local_world; /* on this node (device selection) */
    double wait_seconds;       /* time spent blocked in comm_wait (exposed communication) */
    double busy_seconds;       /* time the communication thread spent in collectives */
    int skip;                  /* SHARDLM_BENCH=compute-only: collectives do nothing (benchmarks) */
    struct comm_device_ops *device; /* NULL: every buffer is host memory to MPI */
    void *impl;
};

/* Starts MPI (or runs as one process when launched without mpirun/srun). */
void comm_init(struct comm *c, int *argc, char ***argv);
void comm_finalize(struct comm *c);

size_t comm_dtype_size(enum comm_dtype dt);

/* A phase in which the main thread calls MPI itself, outside comm_wait's
 * timeout: checkpoint I/O (HDF5 over MPI-IO), which may legitimately take
 * long. While one is open a watchdog thread asks every rank, once per comm
 * timeout, whether it is still there, and fails the job naming the lost ranks
 * when one is not ("WHAT did not finish within N s: lost ranks ..."); a phase
 * that is only slow runs on. No-ops with one rank. */
void comm_watch_begin(struct comm *c, const char *what);
void comm_watch_end(struct comm *c);

/* Rank 0 logs one line per rank: its host, pid, node-local rank and the
 * number of ranks on its node, as each rank found them (nothing with one rank). */
void comm_log_ranks(const struct comm *c);

struct fail_trap;
/* After a trapped start-up phase (util.h FAIL_TRAP) that every rank ran: when
 * any rank failed, the lowest failing rank prints its message, and every rank
 * finishes MPI and exits with that rank's status (no MPI_Abort, so no abort
 * banner from the launcher). Returns when no rank failed. A collective. */
void comm_agree_failure(struct comm *c, const struct fail_trap *t);

/* recv (world x count) = concatenation of every rank's send (count). send may
 * point into recv at this rank's slot (in place). */
void comm_allgather(struct comm *c, const void *send, void *recv, size_t count, enum comm_dtype dt,
                    struct comm_request *req);
/* recv (count) = sum over ranks of their send[rank*count .. (rank+1)*count). */
void comm_reduce_scatter(struct comm *c, const void *send, void *recv, size_t count, enum comm_dtype dt,
                         struct comm_request *req);
/* buf (count) reduced in place over ranks. */
void comm_allreduce(struct comm *c, void *buf, size_t count, enum comm_dtype dt, enum comm_reduce op,
                    struct comm_request *req);
void comm_broadcast(struct comm *c, void *buf, size_t count, enum comm_dtype dt, int root,
                    struct comm_request *req);
void comm_barrier(struct comm *c);

/* req == NULL in the calls above: blocking. Otherwise the call returns at once
 * and comm_wait(req) finishes it; buffers must stay untouched until then. */
void comm_wait(struct comm *c, struct comm_request *req);

const char *comm_kind_name(enum comm_kind k);

#endif
