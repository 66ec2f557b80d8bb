/*
 * comm_nccl — the CUDA build's transport for collectives of device buffers
 * (comm.h, backend_attach_comm).
 *
 * NCCL (default): one communicator per job, created from an ncclUniqueId that
 * rank 0 broadcasts over MPI, and one stream of its own. A collective first
 * makes that stream wait for everything the compute stream has been given so
 * far (an event), and for the backend's copy stream's last transfer, so it
 * reads finished data and writes buffers the kernels and transfers are done with; its completion is another event, and comm_wait makes the
 * compute stream wait for it. The host never blocks: a gather started ahead
 * (prefetch) runs while the kernels of the unit before it run, and a
 * reduce-scatter while the backward of the next unit runs.
 *
 * Host-staged MPI (SHARDLM_COMM=mpi, the default when SHARDLM_SHARE_GPUS=1
 * puts several ranks on one GPU, which NCCL refuses): each collective waits
 * for the compute stream, copies its buffers to pinned host memory, runs over
 * MPI and copies the result back. Slow, and its staging buffers are outside
 * the memory plan; it exists so that multi-rank sharding can be checked on
 * one GPU.
 *
 * Owns the NCCL communicator, its stream and events, the staging buffers.
 */
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"

extern "C" {
#include "backend/backend.h"
#include "comm/comm.h"
#include "core/util.h"
}

#define ncclCheck(call)                                                                                        \
    do {                                                                                                       \
        ncclResult_t _r = (call);                                                                              \
        if (_r != ncclSuccess)                                                                                 \
            fail_internal("NCCL error at %s:%d: %s (%s)%s", __FILE__, __LINE__, ncclGetErrorString(_r), #call, \
                          _r == ncclInvalidUsage ? "; several ranks on one GPU need SHARDLM_COMM=mpi" : "");  \
    } while (0)

#define NCCL_EVENTS 1024 /* completion events, reused in a ring: a wait on a reused one only waits longer */

extern "C" cudaStream_t backend_cuda_stream(void);
extern "C" cudaEvent_t backend_cuda_copy_event(void);
extern "C" void backend_cuda_set_watchdog(const char *(*check)(void));

struct nccl_ctx {
    struct comm *comm;
    int staged;
    ncclComm_t nccl;
    cudaStream_t stream;  /* NCCL's */
    cudaStream_t compute; /* the kernels' (cuda_memory.cu) */
    cudaEvent_t ready;    /* recorded on the compute stream before each collective */
    cudaEvent_t done[NCCL_EVENTS];
    unsigned next;
    void *host_send, *host_recv; /* staged: pinned copies of the buffers */
    size_t host_bytes;
};

static struct nccl_ctx *g_ctx; /* for the watchdog and the abort hook */
static abort_hook_fn g_next_abort;

/* The backend's waits ask this: a message once NCCL reports an error. */
static const char *nccl_watchdog(void)
{
    static char msg[256];
    ncclResult_t state = ncclSuccess;
    if (!g_ctx || g_ctx->staged || ncclCommGetAsyncError(g_ctx->nccl, &state) != ncclSuccess)
        return NULL;
    if (state == ncclSuccess || state == ncclInProgress)
        return NULL;
    snprintf(msg, sizeof msg, "NCCL failed during a collective: %s (another rank has probably died)",
             ncclGetErrorString(state));
    return msg;
}

/* Before MPI_Abort: abort the communicator, so no kernel waits on a peer. */
static void nccl_abort_hook(int status)
{
    if (g_ctx && !g_ctx->staged && g_ctx->nccl) {
        ncclCommAbort(g_ctx->nccl);
        g_ctx->nccl = NULL;
    }
    if (g_next_abort)
        g_next_abort(status);
}

static int is_device_pointer(const void *p)
{
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError(); /* pageable host memory on old runtimes */
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

static ncclDataType_t nccl_type(enum comm_dtype dt)
{
    switch (dt) {
    case COMM_F32: return ncclFloat32;
    case COMM_F64: return ncclFloat64;
    case COMM_I32: return ncclInt32;
    case COMM_U16_SUM_F16: return ncclFloat16;
    case COMM_U16_SUM_BF16: return ncclBfloat16;
    }
    fail_internal("no NCCL type for comm dtype %d", (int)dt);
}

static void nccl_collective(void *ctx, enum comm_kind kind, const void *send, void *recv, size_t count,
                            enum comm_dtype dt, enum comm_reduce op, int root, struct comm_request *req)
{
    struct nccl_ctx *x = (struct nccl_ctx *)ctx;
    ncclDataType_t t = nccl_type(dt);
    cudaCheck(cudaEventRecord(x->ready, x->compute));
    cudaCheck(cudaStreamWaitEvent(x->stream, x->ready, 0));
    cudaEvent_t copies = backend_cuda_copy_event(); /* a pending transfer may read this collective's output */
    if (copies)
        cudaCheck(cudaStreamWaitEvent(x->stream, copies, 0));
    switch (kind) {
    case COMM_ALLGATHER: ncclCheck(ncclAllGather(send, recv, count, t, x->nccl, x->stream)); break;
    case COMM_REDUCE_SCATTER: ncclCheck(ncclReduceScatter(send, recv, count, t, ncclSum, x->nccl, x->stream)); break;
    case COMM_ALLREDUCE:
        ncclCheck(ncclAllReduce(recv, recv, count, t, op == COMM_MAX ? ncclMax : ncclSum, x->nccl, x->stream));
        break;
    case COMM_BROADCAST: ncclCheck(ncclBroadcast(recv, recv, count, t, root, x->nccl, x->stream)); break;
    default: fail_internal("no device transport for %s", comm_kind_name(kind));
    }
    req->event = (int)(x->next++ % NCCL_EVENTS);
    cudaCheck(cudaEventRecord(x->done[req->event], x->stream));
}

static void nccl_wait(void *ctx, struct comm_request *req)
{
    struct nccl_ctx *x = (struct nccl_ctx *)ctx;
    if (req->event >= 0)
        cudaCheck(cudaStreamWaitEvent(x->compute, x->done[req->event], 0));
}

static void staging_reserve(struct nccl_ctx *x, size_t bytes)
{
    if (bytes <= x->host_bytes)
        return;
    if (x->host_send) {
        cudaCheck(cudaFreeHost(x->host_send));
        cudaCheck(cudaFreeHost(x->host_recv));
    }
    cudaCheck(cudaMallocHost(&x->host_send, bytes));
    cudaCheck(cudaMallocHost(&x->host_recv, bytes));
    x->host_bytes = bytes;
}

static void staged_collective(void *ctx, enum comm_kind kind, const void *send, void *recv, size_t count,
                              enum comm_dtype dt, enum comm_reduce op, int root, struct comm_request *req)
{
    struct nccl_ctx *x = (struct nccl_ctx *)ctx;
    const size_t one = count * comm_dtype_size(dt), all = one * (size_t)x->comm->world;
    const size_t send_bytes = kind == COMM_REDUCE_SCATTER ? all : kind == COMM_ALLGATHER ? one : 0;
    const size_t recv_bytes = kind == COMM_ALLGATHER ? all : one;
    staging_reserve(x, all);
    backend_synchronize(); /* the kernels and the copy stream's transfers */
    if (send_bytes)
        cudaCheck(cudaMemcpy(x->host_send, send, send_bytes, cudaMemcpyDeviceToHost));
    else
        cudaCheck(cudaMemcpy(x->host_recv, recv, recv_bytes, cudaMemcpyDeviceToHost));
    /* host buffers: these calls take the MPI path */
    switch (kind) {
    case COMM_ALLGATHER: comm_allgather(x->comm, x->host_send, x->host_recv, count, dt, NULL); break;
    case COMM_REDUCE_SCATTER: comm_reduce_scatter(x->comm, x->host_send, x->host_recv, count, dt, NULL); break;
    case COMM_ALLREDUCE: comm_allreduce(x->comm, x->host_recv, count, dt, op, NULL); break;
    case COMM_BROADCAST: comm_broadcast(x->comm, x->host_recv, count, dt, root, NULL); break;
    default: fail_internal("no device transport for %s", comm_kind_name(kind));
    }
    cudaCheck(cudaMemcpy(recv, x->host_recv, recv_bytes, cudaMemcpyHostToDevice));
    req->event = -1;
}

static void nccl_finalize(void *ctx)
{
    struct nccl_ctx *x = (struct nccl_ctx *)ctx;
    if (!x->staged) {
        cudaCheck(cudaStreamSynchronize(x->stream));
        ncclCheck(ncclCommDestroy(x->nccl));
        for (int i = 0; i < NCCL_EVENTS; i++)
            cudaCheck(cudaEventDestroy(x->done[i]));
        cudaCheck(cudaEventDestroy(x->ready));
        cudaCheck(cudaStreamDestroy(x->stream));
    }
    if (x->host_send) {
        cudaCheck(cudaFreeHost(x->host_send));
        cudaCheck(cudaFreeHost(x->host_recv));
    }
    memset(x, 0, sizeof *x);
    g_ctx = NULL;
    backend_cuda_set_watchdog(NULL);
    util_set_abort_hook(g_next_abort);
}

extern "C" void backend_attach_comm(struct comm *c)
{
    static struct nccl_ctx ctx;
    static struct comm_device_ops ops;
    const char *mode = getenv("SHARDLM_COMM"), *share = getenv("SHARDLM_SHARE_GPUS");
    if (mode && *mode && strcmp(mode, "nccl") != 0 && strcmp(mode, "mpi") != 0)
        fail_input("SHARDLM_COMM=%s: expected nccl (the default) or mpi (host-staged, for several ranks on one GPU)",
                   mode);
    memset(&ctx, 0, sizeof ctx);
    ctx.comm = c;
    ctx.compute = backend_cuda_stream();
    ctx.staged = mode && *mode ? strcmp(mode, "mpi") == 0 : share && strcmp(share, "1") == 0;
    if (!ctx.staged) {
        ncclUniqueId id;
        if (c->rank == 0)
            ncclCheck(ncclGetUniqueId(&id));
        /* over MPI: no transport is attached yet */
        comm_broadcast(c, &id, sizeof id / sizeof(int32_t), COMM_I32, 0, NULL);
        ncclCheck(ncclCommInitRank(&ctx.nccl, c->world, id, c->rank));
        cudaCheck(cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking));
        cudaCheck(cudaEventCreateWithFlags(&ctx.ready, cudaEventDisableTiming));
        for (int i = 0; i < NCCL_EVENTS; i++)
            cudaCheck(cudaEventCreateWithFlags(&ctx.done[i], cudaEventDisableTiming));
    }
    g_ctx = &ctx;
    backend_cuda_set_watchdog(nccl_watchdog);
    g_next_abort = util_get_abort_hook();
    util_set_abort_hook(nccl_abort_hook);
    ops.is_device = is_device_pointer;
    ops.collective = ctx.staged ? staged_collective : nccl_collective;
    ops.wait = nccl_wait;
    ops.finalize = nccl_finalize;
    ops.ctx = &ctx;
    c->device = &ops;
    log_info("collectives of device buffers: %s", ctx.staged ? "host-staged MPI (SHARDLM_COMM=mpi)"
                                                               : "NCCL on a stream of its own");
}
