/*
 * cudaemu NCCL: collectives run synchronously over MPI on a duplicate of
 * MPI_COMM_WORLD (device memory is host memory here). Semantics are NCCL's:
 * all-gather's count is per rank (in place when sendbuff == recvbuff +
 * rank * sendcount), reduce-scatter's recvcount is per rank, half and bf16
 * sums add each pair in fp32 and round to nearest even (as src/comm/comm_mpi.c
 * does). Every buffer must lie inside one cudaMalloc/cudaHostAlloc
 * allocation, and ncclCommInitRank checks that every rank got the same
 * unique id (that the id broadcast really happened).
 *
 * MPI_Init_thread is interposed (PMPI) to ask for MPI_THREAD_MULTIPLE: the
 * engine's communication thread calls MPI while the main thread runs these
 * collectives (on a GPU, NCCL would not touch MPI at all).
 *
 * Streams are lazy (cudaemu.cc): see complete_later for when a collective
 * reads its inputs and when its result lands.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <memory>
#include <vector>

#include "cuda_runtime.h"

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "nccl.h"

extern "C" int MPI_Init_thread(int *argc, char ***argv, int required, int *provided)
{
    (void)required;
    int rc = PMPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, provided);
    if (rc == MPI_SUCCESS && *provided < MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "cudaemu: this MPI gives thread level %d, the NCCL emulation needs MPI_THREAD_MULTIPLE\n",
                *provided);
        return MPI_ERR_OTHER;
    }
    return rc;
}

struct cudaemu_nccl {
    MPI_Comm comm;
    int rank, nranks;
};

static MPI_Op g_sum_f16 = MPI_OP_NULL, g_sum_bf16 = MPI_OP_NULL;

static void sum_f16(void *in, void *inout, int *len, MPI_Datatype *)
{
    const __half *a = (const __half *)in;
    __half *b = (__half *)inout;
    for (int i = 0; i < *len; i++)
        b[i] = __float2half_rn(__half2float(a[i]) + __half2float(b[i]));
}

static void sum_bf16(void *in, void *inout, int *len, MPI_Datatype *)
{
    const __nv_bfloat16 *a = (const __nv_bfloat16 *)in;
    __nv_bfloat16 *b = (__nv_bfloat16 *)inout;
    for (int i = 0; i < *len; i++)
        b[i] = __float2bfloat16_rn(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

extern "C" const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    }
    return "unknown result code";
}

static ncclResult_t fail(ncclResult_t r, const char *fn, const char *why)
{
    fprintf(stderr, "cudaemu: %s: %s\n", fn, why);
    return r;
}

extern "C" ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    memset(id, 0, sizeof *id);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(id->internal, sizeof id->internal, "cudaemu-nccl pid %d host %ld t %ld.%09ld", (int)getpid(),
             gethostid(), (long)ts.tv_sec, ts.tv_nsec);
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    int init = 0, world_rank = 0, world = 0;
    MPI_Initialized(&init);
    if (!init)
        return fail(ncclInvalidUsage, "ncclCommInitRank", "the emulation runs over MPI, which is not initialised");
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (nranks != world || rank != world_rank) {
        char why[160];
        snprintf(why, sizeof why, "rank %d of %d asked for, but the emulation needs the MPI world's (rank %d of %d)",
                 rank, nranks, world_rank, world);
        return fail(ncclInvalidArgument, "ncclCommInitRank", why);
    }
    if (strncmp(id.internal, "cudaemu-nccl", 12) != 0)
        return fail(ncclInvalidArgument, "ncclCommInitRank", "the unique id was not made by ncclGetUniqueId");
    std::vector<char> ids((size_t)world * sizeof id);
    MPI_Allgather(&id, sizeof id, MPI_BYTE, ids.data(), sizeof id, MPI_BYTE, MPI_COMM_WORLD);
    for (int r = 0; r < world; r++)
        if (memcmp(&ids[(size_t)r * sizeof id], &id, sizeof id) != 0)
            return fail(ncclInvalidUsage, "ncclCommInitRank", "ranks were given different unique ids");
    cudaemu_nccl *c = new cudaemu_nccl;
    MPI_Comm_dup(MPI_COMM_WORLD, &c->comm);
    c->rank = rank;
    c->nranks = nranks;
    if (g_sum_f16 == MPI_OP_NULL) {
        MPI_Op_create(sum_f16, 1, &g_sum_f16);
        MPI_Op_create(sum_bf16, 1, &g_sum_bf16);
    }
    *comm = c;
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclInvalidArgument;
    MPI_Comm_free(&comm->comm);
    delete comm;
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    delete comm; /* MPI_Abort follows; freeing the communicator collectively could hang */
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state)
{
    if (!comm)
        return ncclInvalidArgument;
    *state = ncclSuccess;
    return ncclSuccess;
}

static int g_group_depth;
extern "C" ncclResult_t ncclGroupStart(void)
{
    g_group_depth++;
    return ncclSuccess;
}
extern "C" ncclResult_t ncclGroupEnd(void)
{
    if (g_group_depth <= 0)
        return ncclInvalidUsage;
    g_group_depth--;
    return ncclSuccess;
}

static int type_info(ncclDataType_t t, MPI_Datatype *mt, size_t *size)
{
    switch (t) {
    case ncclFloat32: *mt = MPI_FLOAT, *size = 4; return 1;
    case ncclFloat64: *mt = MPI_DOUBLE, *size = 8; return 1;
    case ncclInt32: *mt = MPI_INT, *size = 4; return 1;
    case ncclFloat16:
    case ncclBfloat16: *mt = MPI_UINT16_T, *size = 2; return 1;
    default: return 0;
    }
}

static int op_info(ncclRedOp_t op, ncclDataType_t t, MPI_Op *mo)
{
    if (op == ncclSum)
        *mo = t == ncclFloat16 ? g_sum_f16 : t == ncclBfloat16 ? g_sum_bf16 : MPI_SUM;
    else if (op == ncclMax && t != ncclFloat16 && t != ncclBfloat16)
        *mo = MPI_MAX;
    else
        return 0;
    return 1;
}

static int device_buffer(const void *p, size_t bytes)
{
    cudaMemoryType kind;
    return !bytes || cudaemu_lookup(p, bytes, &kind);
}

static ncclResult_t check_args(const char *fn, ncclComm_t comm, const void *send, size_t send_bytes, const void *recv,
                               size_t recv_bytes, size_t count)
{
    if (!comm)
        return fail(ncclInvalidArgument, fn, "no communicator");
    if (count > (size_t)INT32_MAX)
        return fail(ncclInvalidArgument, fn, "count beyond the emulation's MPI int");
    if (!device_buffer(send, send_bytes))
        return fail(ncclInvalidArgument, fn, "sendbuff is not inside one cudaMalloc/cudaHostAlloc allocation");
    if (!device_buffer(recv, recv_bytes))
        return fail(ncclInvalidArgument, fn, "recvbuff is not inside one cudaMalloc/cudaHostAlloc allocation");
    return ncclSuccess;
}

static int overlap(const void *a, size_t an, const void *b, size_t bn)
{
    return (const char *)a < (const char *)b + bn && (const char *)b < (const char *)a + an;
}

static uint64_t checksum(const void *p, size_t bytes)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    const unsigned char *c = (const unsigned char *)p;
    for (size_t i = 0; i < bytes; i++)
        h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

/* A collective's exchange runs over MPI at the call, after the stream's earlier
 * work (its waits on the compute stream's events included: what a GPU does
 * too), into a private buffer, so that no rank blocks on another's lazy
 * stream; the result reaches recvbuff only when the stream runs past the
 * collective (its completion). A kernel that reads recvbuff without waiting
 * for the collective's event sees the old contents. Any change to sendbuff or
 * recvbuff between the call and the completion is a write that was not
 * ordered after the collective (a GPU collective may still be reading or
 * writing them then): it stops the run. */
static void complete_later(const char *fn, cudaStream_t stream, const void *send, size_t send_bytes, void *recv,
                           std::shared_ptr<std::vector<char>> result)
{
    uint64_t send_sum = send ? checksum(send, send_bytes) : 0, recv_sum = checksum(recv, result->size());
    cudaemu_enqueue(stream, [=] {
        if ((send && checksum(send, send_bytes) != send_sum) || checksum(recv, result->size()) != recv_sum) {
            fprintf(stderr, "cudaemu: ordering hazard: %s's %s (%p) was written after the collective was issued and "
                            "before it completed (a write not ordered after the collective's event)\n",
                    fn, send && checksum(send, send_bytes) != send_sum ? "sendbuff" : "recvbuff",
                    send && checksum(send, send_bytes) != send_sum ? send : recv);
            abort();
        }
        memcpy(recv, result->data(), result->size());
    });
}

static std::shared_ptr<std::vector<char>> result_buffer(size_t bytes)
{
    return std::make_shared<std::vector<char>>(bytes);
}

extern "C" ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t, ncclComm_t comm,
                                      cudaStream_t stream)
{
    MPI_Datatype mt;
    size_t size;
    if (!type_info(t, &mt, &size))
        return fail(ncclInvalidArgument, "ncclAllGather", "datatype not emulated");
    ncclResult_t r = check_args("ncclAllGather", comm, send, count * size, recv, count * size * comm->nranks, count);
    if (r != ncclSuccess)
        return r;
    const char *slot = (const char *)recv + (size_t)comm->rank * count * size;
    int in_place = send == slot; /* the exchange reads sendbuff into a private buffer either way */
    if (!in_place && overlap(send, count * size, recv, count * size * comm->nranks))
        return fail(ncclInvalidArgument, "ncclAllGather", "sendbuff overlaps recvbuff without being in place");
    cudaemu_stream_run(stream);
    auto out = result_buffer(count * size * comm->nranks);
    MPI_Allgather(send, (int)count, mt, out->data(), (int)count, mt, comm->comm);
    complete_later("ncclAllGather", stream, in_place ? NULL : send, count * size, recv, out);
    return ncclSuccess;
}

extern "C" ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t t,
                                          ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    MPI_Datatype mt;
    MPI_Op mo;
    size_t size;
    if (!type_info(t, &mt, &size) || !op_info(op, t, &mo))
        return fail(ncclInvalidArgument, "ncclReduceScatter", "datatype or op not emulated");
    ncclResult_t r = check_args("ncclReduceScatter", comm, send, count * size * comm->nranks, recv, count * size, count);
    if (r != ncclSuccess)
        return r;
    const char *slot = (const char *)send + (size_t)comm->rank * count * size;
    if (recv != slot && overlap(send, count * size * comm->nranks, recv, count * size))
        return fail(ncclInvalidArgument, "ncclReduceScatter", "recvbuff overlaps sendbuff without being in place");
    cudaemu_stream_run(stream);
    auto out = result_buffer(count * size); /* in place too: the result goes to a private buffer first */
    MPI_Reduce_scatter_block(send, out->data(), (int)count, mt, mo, comm->comm);
    complete_later("ncclReduceScatter", stream, send, count * size * comm->nranks, recv, out);
    return ncclSuccess;
}

extern "C" ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                                      ncclComm_t comm, cudaStream_t stream)
{
    MPI_Datatype mt;
    MPI_Op mo;
    size_t size;
    if (!type_info(t, &mt, &size) || !op_info(op, t, &mo))
        return fail(ncclInvalidArgument, "ncclAllReduce", "datatype or op not emulated");
    ncclResult_t r = check_args("ncclAllReduce", comm, send, count * size, recv, count * size, count);
    if (r != ncclSuccess)
        return r;
    if (send != recv && overlap(send, count * size, recv, count * size))
        return fail(ncclInvalidArgument, "ncclAllReduce", "buffers overlap without being in place");
    cudaemu_stream_run(stream);
    auto out = result_buffer(count * size);
    MPI_Allreduce(send, out->data(), (int)count, mt, mo, comm->comm);
    complete_later("ncclAllReduce", stream, send == recv ? NULL : send, count * size, recv, out);
    return ncclSuccess;
}

extern "C" ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                                      ncclComm_t comm, cudaStream_t stream)
{
    MPI_Datatype mt;
    size_t size;
    if (!type_info(t, &mt, &size))
        return fail(ncclInvalidArgument, "ncclBroadcast", "datatype not emulated");
    if (!comm || root < 0 || root >= comm->nranks)
        return fail(ncclInvalidArgument, "ncclBroadcast", "root out of range");
    ncclResult_t r =
        check_args("ncclBroadcast", comm, comm->rank == root ? send : NULL, comm->rank == root ? count * size : 0,
                   recv, count * size, count);
    if (r != ncclSuccess)
        return r;
    cudaemu_stream_run(stream);
    auto out = result_buffer(count * size);
    if (comm->rank == root)
        memcpy(out->data(), send, count * size);
    MPI_Bcast(out->data(), (int)count, mt, root, comm->comm);
    complete_later("ncclBroadcast", stream, comm->rank == root && send != recv ? send : NULL, count * size, recv, out);
    return ncclSuccess;
}
