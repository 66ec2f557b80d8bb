/*
 * CUDA backend, the device and its memory: device selection and backend_init (the cuBLAS and
 * cuBLASLt handles, the compute and copy streams, the reduction buffers: the device state
 * cuda_internal.h declares, defined here), the activation and weight-gradient dtypes, the waits
 * (stream_wait: never forever), memory spaces, copies, and the casts between dtypes (on the copy
 * stream when they move device memory into pinned host memory).
 */
#include <time.h>

#include "cuda_internal.h"

extern "C" {
#include "backend/device_select.h"
}

cublasHandle_t g_cublas;
cublasLtHandle_t g_cublaslt;
cudaStream_t g_stream;
cublasComputeType_t g_compute = CUBLAS_COMPUTE_32F;
double *g_partials;
double *g_partials_h;
int *g_flag;
float *g_colsum;

static cudaEvent_t g_sync_event;
/* The copy stream: device-to-pinned-host transfers (a reduced gradient shard
 * added into the pinned fp32 shard, casts into pinned memory) run there, beside
 * the kernels of the next unit. g_fork orders it after the kernels issued so
 * far; g_copy_done marks its last transfer, which the kernels' stream waits
 * for before it next touches host memory or is waited on (join_copies), and
 * the NCCL stream before its next collective (backend_cuda_copy_event), as a
 * transfer's source may be the shared reduce-scatter receive buffer. */
static cudaStream_t g_copy;
static cudaEvent_t g_fork, g_copy_done;
static int g_copy_pending;
static double g_sync_timeout = 600.0;     /* SHARDLM_COMM_TIMEOUT, as for MPI collectives */
static const char *(*g_watchdog)(void);   /* comm_nccl: a message when NCCL has failed */

/* The device arenas (backend_mem_alloc): a copy between two of them is
 * ordered on the stream like a kernel and needs no wait by the host. */
#define MAX_DEVICE_RANGES 64
static struct {
    const char *base;
    size_t bytes;
} g_device_ranges[MAX_DEVICE_RANGES];
static int g_n_device_ranges;

static int in_device_arena(const void *p, size_t bytes)
{
    const char *c = (const char *)p;
    for (int i = 0; i < g_n_device_ranges; i++)
        if (c >= g_device_ranges[i].base && bytes <= g_device_ranges[i].bytes &&
            (size_t)(c - g_device_ranges[i].base) <= g_device_ranges[i].bytes - bytes)
            return 1;
    return 0;
}

static void join_copies(void);

void order_host(const void *p, size_t bytes)
{
    if (g_copy_pending && bytes && !in_device_arena(p, bytes))
        join_copies();
}

/* The stream for a kernel that writes dst (dst_bytes) from src (src_bytes):
 * the copy stream when it moves device memory into host memory, ordered after
 * the kernels issued so far; else the compute stream, after the copy stream's
 * transfers if either side is host memory. End a copy-stream kernel with
 * copy_issued(). */
static cudaStream_t transfer_stream(const void *dst, size_t dst_bytes, const void *src, size_t src_bytes)
{
    if (in_device_arena(dst, dst_bytes) || !in_device_arena(src, src_bytes)) {
        order_host(dst, dst_bytes);
        order_host(src, src_bytes);
        return g_stream;
    }
    cudaCheck(cudaEventRecord(g_fork, g_stream));
    cudaCheck(cudaStreamWaitEvent(g_copy, g_fork, 0));
    return g_copy;
}

static void copy_issued(cudaStream_t s)
{
    if (s != g_copy)
        return;
    cudaCheck(cudaEventRecord(g_copy_done, g_copy));
    g_copy_pending = 1;
}

static void join_copies(void)
{
    if (g_copy_pending) {
        cudaCheck(cudaStreamWaitEvent(g_stream, g_copy_done, 0));
        g_copy_pending = 0;
    }
}

void stream_wait(void)
{
    /* a launch with a bad configuration is only reported here, by the runtime's last error */
    cudaCheck(cudaGetLastError());
    join_copies(); /* the copy stream's transfers too */
    cudaCheck(cudaEventRecord(g_sync_event, g_stream));
    double t0 = now_seconds();
    for (unsigned spins = 0;; spins++) {
        cudaError_t e = cudaEventQuery(g_sync_event);
        if (e == cudaSuccess)
            return;
        if (e != cudaErrorNotReady)
            cudaCheck(e);
        const char *failed = g_watchdog ? g_watchdog() : NULL;
        if (failed)
            fail_internal("%s", failed);
        if (now_seconds() - t0 > g_sync_timeout)
            fail_internal("the GPU's queued work did not finish within %.0f s: a collective probably waits for a "
                          "rank that died or hangs (SHARDLM_COMM_TIMEOUT sets the limit)",
                          g_sync_timeout);
        if (spins > 1000) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
}

unsigned blocks_for(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 65535 * 16 ? (b ? b : 1) : 65535 * 16);
}

extern "C" void backend_init(int threads)
{
    (void)threads;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    char why[256];
    int device = device_select_from_env(e == cudaSuccess ? count : 0,
                                        e == cudaSuccess ? NULL : cudaGetErrorString(e), why, sizeof why);
    if (device < 0)
        fail_input("%s", why);
    cudaCheck(cudaSetDevice(device));
    cudaCheck(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    cublasCheck(cublasCreate(&g_cublas));
    cublasCheck(cublasSetStream(g_cublas, g_stream));
    cublasCheck(cublasLtCreate(&g_cublaslt));
    const char *tf32 = getenv("SHARDLM_TF32");
    if (tf32 && strcmp(tf32, "1") == 0)
        g_compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    cudaCheck(cudaMalloc(&g_partials, MAX_REDUCE_BLOCKS * sizeof(double)));
    cudaCheck(cudaMallocHost(&g_partials_h, MAX_REDUCE_BLOCKS * sizeof(double)));
    cudaCheck(cudaMalloc(&g_flag, sizeof(int)));
    cudaCheck(cudaMalloc(&g_colsum, COLSUM_FLOATS * sizeof(float)));
    cudaCheck(cudaEventCreateWithFlags(&g_sync_event, cudaEventDisableTiming));
    cudaCheck(cudaStreamCreateWithFlags(&g_copy, cudaStreamNonBlocking));
    cudaCheck(cudaEventCreateWithFlags(&g_fork, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&g_copy_done, cudaEventDisableTiming));
    const char *timeout = getenv("SHARDLM_COMM_TIMEOUT");
    if (timeout && atof(timeout) > 0)
        g_sync_timeout = atof(timeout);
}

extern "C" void backend_check_performance(void) {}

extern "C" const char *backend_name(void) { return "cuda (cuBLAS, cuBLASLt + own kernels)"; }

extern "C" int backend_is_device(void) { return 1; }

/* ---- activation dtype ([A] in backend.h) ------------------------------------------------ */

enum dtype g_act = DTYPE_F32;

extern "C" void backend_set_act_dtype(enum dtype dt) { g_act = dt; }
extern "C" enum dtype backend_act_dtype(void) { return g_act; }

/* Weight-gradient dtype ([G] in backend.h). */
enum dtype g_grad = DTYPE_F32;

extern "C" void backend_set_grad_dtype(enum dtype dt) { g_grad = dt; }
extern "C" enum dtype backend_grad_dtype(void) { return g_grad; }

extern "C" void backend_copy(void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return;
    order_host(dst, bytes), order_host(src, bytes);
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, g_stream));
    if (!in_device_arena(dst, bytes) || !in_device_arena(src, bytes))
        stream_wait(); /* host memory: complete on return */
}

extern "C" void backend_copy_async(void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return;
    order_host(dst, bytes), order_host(src, bytes);
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, g_stream));
}

/* ---- memory spaces and casts ------------------------------------------------------------------- */

extern "C" void *backend_mem_alloc(enum mem_space space, size_t bytes, const char *what)
{
    void *p = NULL;
    cudaError_t e = cudaSuccess;
    size_t n = bytes ? bytes : 1;
    if (space == SPACE_DEVICE)
        e = cudaMalloc(&p, n);
    else if (space == SPACE_PINNED) /* mapped: kernels address it with the host pointer (UVA) */
        e = cudaHostAlloc(&p, n, cudaHostAllocMapped | cudaHostAllocPortable);
    else if (posix_memalign(&p, 4096, n) != 0)
        p = NULL;
    if (e != cudaSuccess || !p) {
        char b[32], f[32];
        size_t free_bytes = 0, total = 0;
        if (space == SPACE_DEVICE)
            cudaMemGetInfo(&free_bytes, &total);
        (void)cudaGetLastError(); /* an allocation failure is not sticky; clear it */
        fail_input("out of %s memory allocating %s for %s%s%s; shrink the plan (`shardlm plan` shows it)",
                   mem_space_name(space), format_bytes((double)bytes, b, sizeof b), what,
                   space == SPACE_DEVICE ? ", the GPU has free " : "",
                   space == SPACE_DEVICE ? format_bytes((double)free_bytes, f, sizeof f) : "");
    }
    if (space == SPACE_DEVICE) { /* on the kernels' stream: a non-blocking stream does not wait for the default one */
        cudaCheck(cudaMemsetAsync(p, 0, n, g_stream));
        if (g_n_device_ranges < MAX_DEVICE_RANGES) /* an unlisted range only costs copies a wait */
            g_device_ranges[g_n_device_ranges].base = (const char *)p, g_device_ranges[g_n_device_ranges++].bytes = n;
    } else
        memset(p, 0, n);
    return p;
}

extern "C" void backend_mem_free(enum mem_space space, void *p, size_t bytes)
{
    (void)bytes;
    if (!p)
        return;
    if (space == SPACE_DEVICE) {
        for (int i = 0; i < g_n_device_ranges; i++)
            if (g_device_ranges[i].base == p)
                g_device_ranges[i] = g_device_ranges[--g_n_device_ranges];
        cudaCheck(cudaFree(p));
    } else if (space == SPACE_PINNED)
        cudaCheck(cudaFreeHost(p));
    else
        free(p);
}

extern "C" int backend_mem_info(size_t *free_bytes, size_t *total_bytes)
{
    return cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess;
}

__global__ static void convert_kernel(void *dst, enum dtype dst_dt, const void *src, enum dtype src_dt, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        store_from_f32(dst, dst_dt, i, load_as_f32(src, src_dt, i));
}

__global__ static void add_to_f32_kernel(float *acc, const void *src, enum dtype dt, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc[i] += load_as_f32(src, dt, i);
}

extern "C" void backend_convert(void *dst, enum dtype dst_dt, const void *src, enum dtype src_dt, size_t n)
{
    if (!n)
        return;
    cudaStream_t s = transfer_stream(dst, n * dtype_size(dst_dt), src, n * dtype_size(src_dt));
    convert_kernel<<<blocks_for(n, BLOCK), BLOCK, 0, s>>>(dst, dst_dt, src, src_dt, n);
    copy_issued(s);
}

extern "C" void backend_add_to_f32(float *acc, const void *src, enum dtype dt, size_t n)
{
    if (!n)
        return;
    cudaStream_t s = transfer_stream(acc, n * sizeof *acc, src, n * dtype_size(dt));
    add_to_f32_kernel<<<blocks_for(n, BLOCK), BLOCK, 0, s>>>(acc, src, dt, n);
    copy_issued(s);
}

extern "C" void backend_synchronize(void) { stream_wait(); }

extern "C" void backend_cuda_set_watchdog(const char *(*check)(void)) { g_watchdog = check; }

extern "C" cudaStream_t backend_cuda_stream(void) { return g_stream; }

/* The copy stream's last transfer while the compute stream has not waited for
 * it, else NULL: comm_nccl's stream waits for it before its next collective,
 * whose output may be a pending transfer's source. */
extern "C" cudaEvent_t backend_cuda_copy_event(void) { return g_copy_pending ? g_copy_done : NULL; }
