/*
 * cudaemu runtime: device memory, streams, events, the kernel launcher with
 * its fiber scheduler, and cuBLAS GEMMs, on the CPU (README.md here).
 *
 * Launcher: blocks run one after another; within a block each thread is a
 * ucontext fiber on a stack from a reused pool. A thread runs until it ends
 * or reaches a barrier (__syncthreads, a warp shuffle, __syncwarp); when every
 * runnable thread is waiting the scheduler completes the barriers whose
 * participants have all arrived, and if none can complete the kernel has
 * deadlocked (a barrier in divergent code): it aborts naming the kernel.
 * Launch limits are CUDA's; a bad launch aborts too (CUDAEMU_LAUNCH_ERRORS=record
 * records it for cudaGetLastError instead, as a GPU would, silently).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
const void *cudaemu_wmma_slot[1024][2]; /* include/mma.h: the lanes' operands of an mma_sync */

#define ALLOC_ALIGN 256 /* cudaMalloc's documented minimum alignment */
#define DEFAULT_MEM_BYTES (16ull << 30)

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cudaemu: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
    abort();
}

static void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cudaemu: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

/* ---- errors ----------------------------------------------------------------------------------- */

static cudaError_t g_last_error = cudaSuccess;

static cudaError_t record(cudaError_t e)
{
    if (e != cudaSuccess)
        g_last_error = e;
    return e;
}

extern "C" const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    }
    return "cudaErrorUnknown";
}

extern "C" const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    }
    return "unknown error";
}

extern "C" cudaError_t cudaGetLastError(void)
{
    cudaError_t e = g_last_error;
    g_last_error = cudaSuccess;
    return e;
}

extern "C" cudaError_t cudaPeekAtLastError(void) { return g_last_error; }

/* ---- devices ---------------------------------------------------------------------------------- */

static int device_count(void)
{
    const char *s = getenv("CUDAEMU_DEVICES");
    return s && *s ? atoi(s) : 1;
}

static int g_device = 0;

extern "C" cudaError_t cudaGetDeviceCount(int *count)
{
    *count = device_count();
    return *count > 0 ? cudaSuccess : record(cudaErrorNoDevice);
}

extern "C" cudaError_t cudaSetDevice(int device)
{
    if (device < 0 || device >= device_count())
        return record(cudaErrorInvalidDevice);
    g_device = device;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGetDevice(int *device)
{
    *device = g_device;
    return cudaSuccess;
}

static void run_everything(void);
extern "C" cudaError_t cudaDeviceSynchronize(void);

/* ---- memory ------------------------------------------------------------------------------------ */

struct allocation {
    size_t bytes;
    cudaMemoryType kind; /* device or (pinned) host */
};

static std::mutex g_mem_lock;
static std::map<uintptr_t, allocation> g_allocs; /* by base address */
static size_t g_device_bytes;                     /* bytes of device allocations live */

static size_t mem_total(void)
{
    const char *s = getenv("CUDAEMU_MEM_BYTES");
    return s && *s ? (size_t)strtoull(s, NULL, 0) : (size_t)DEFAULT_MEM_BYTES;
}

extern "C" int cudaemu_lookup(const void *p, size_t bytes, cudaMemoryType *kind)
{
    std::lock_guard<std::mutex> hold(g_mem_lock);
    uintptr_t a = (uintptr_t)p;
    auto it = g_allocs.upper_bound(a);
    if (it == g_allocs.begin())
        return 0;
    --it;
    if (a < it->first || a + bytes > it->first + it->second.bytes || (bytes == 0 && a >= it->first + it->second.bytes))
        return 0;
    if (kind)
        *kind = it->second.kind;
    return 1;
}

static cudaError_t allocate(void **ptr, size_t bytes, cudaMemoryType kind)
{
    if (!ptr)
        return record(cudaErrorInvalidValue);
    *ptr = NULL;
    size_t n = bytes ? bytes : 1;
    std::lock_guard<std::mutex> hold(g_mem_lock);
    if (kind == cudaMemoryTypeDevice && g_device_bytes + n > mem_total())
        return record(cudaErrorMemoryAllocation);
    void *p = NULL;
    if (posix_memalign(&p, ALLOC_ALIGN, (n + ALLOC_ALIGN - 1) / ALLOC_ALIGN * ALLOC_ALIGN) != 0)
        return record(cudaErrorMemoryAllocation);
    g_allocs[(uintptr_t)p] = allocation{n, kind};
    if (kind == cudaMemoryTypeDevice)
        g_device_bytes += n;
    *ptr = p;
    return cudaSuccess;
}

static cudaError_t release(void *p, cudaMemoryType kind, const char *fn)
{
    if (!p)
        return cudaSuccess;
    /* cuMemFree: "this API may perform implicit synchronization": queued work that still uses the block runs
     * first (the emulation would otherwise touch freed memory) */
    run_everything();
    std::lock_guard<std::mutex> hold(g_mem_lock);
    auto it = g_allocs.find((uintptr_t)p);
    if (it == g_allocs.end() || it->second.kind != kind) {
        warn("%s(%p): not the start of a live %s allocation", fn, p,
             kind == cudaMemoryTypeDevice ? "cudaMalloc" : "cudaHostAlloc/cudaMallocHost");
        return record(cudaErrorInvalidValue);
    }
    if (kind == cudaMemoryTypeDevice)
        g_device_bytes -= it->second.bytes;
    g_allocs.erase(it);
    free(p);
    return cudaSuccess;
}

extern "C" cudaError_t cudaMalloc(void **ptr, size_t bytes) { return allocate(ptr, bytes, cudaMemoryTypeDevice); }
extern "C" cudaError_t cudaMallocHost(void **ptr, size_t bytes) { return allocate(ptr, bytes, cudaMemoryTypeHost); }
extern "C" cudaError_t cudaHostAlloc(void **ptr, size_t bytes, unsigned int flags)
{
    if (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined))
        return record(cudaErrorInvalidValue);
    return allocate(ptr, bytes, cudaMemoryTypeHost);
}
extern "C" cudaError_t cudaFree(void *ptr) { return release(ptr, cudaMemoryTypeDevice, "cudaFree"); }
extern "C" cudaError_t cudaFreeHost(void *ptr) { return release(ptr, cudaMemoryTypeHost, "cudaFreeHost"); }

extern "C" cudaError_t cudaHostGetDevicePointer(void **device_ptr, void *host_ptr, unsigned int flags)
{
    cudaMemoryType kind;
    if (flags != 0 || !cudaemu_lookup(host_ptr, 0, &kind) || kind != cudaMemoryTypeHost)
        return record(cudaErrorInvalidValue);
    *device_ptr = host_ptr;
    return cudaSuccess;
}

extern "C" cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *ptr)
{
    cudaMemoryType kind = cudaMemoryTypeUnregistered;
    if (!a)
        return record(cudaErrorInvalidValue);
    cudaemu_lookup(ptr, 0, &kind);
    a->type = kind;
    a->device = g_device;
    a->devicePointer = kind == cudaMemoryTypeUnregistered ? NULL : (void *)ptr;
    a->hostPointer = kind == cudaMemoryTypeHost || kind == cudaMemoryTypeUnregistered ? (void *)ptr : NULL;
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    std::lock_guard<std::mutex> hold(g_mem_lock);
    *total_bytes = mem_total();
    *free_bytes = *total_bytes - g_device_bytes;
    return cudaSuccess;
}

/* Device side of a copy: [p, p + bytes) must lie in one device allocation
 * (or a mapped pinned one, which the device addresses too). */
static int device_range(const void *p, size_t bytes, int pinned_ok)
{
    cudaMemoryType kind;
    return cudaemu_lookup(p, bytes, &kind) && (kind == cudaMemoryTypeDevice || (pinned_ok && kind == cudaMemoryTypeHost));
}

static int is_device(const void *p)
{
    cudaMemoryType kind;
    return cudaemu_lookup(p, 0, &kind) && kind == cudaMemoryTypeDevice;
}

static cudaError_t copy_check(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, const char *fn)
{
    if (!bytes)
        return cudaSuccess;
    const char *why = NULL;
    switch (kind) {
    case cudaMemcpyHostToDevice:
        if (!device_range(dst, bytes, 0))
            why = "the destination is not inside one device allocation";
        else if (is_device(src))
            why = "the source is device memory";
        break;
    case cudaMemcpyDeviceToHost:
        if (!device_range(src, bytes, 0))
            why = "the source is not inside one device allocation";
        else if (is_device(dst))
            why = "the destination is device memory";
        break;
    case cudaMemcpyDeviceToDevice:
        if (!device_range(src, bytes, 1) || !device_range(dst, bytes, 1))
            why = "an operand is not inside one device allocation";
        break;
    case cudaMemcpyDefault:
        if ((is_device(src) && !device_range(src, bytes, 0)) || (is_device(dst) && !device_range(dst, bytes, 0)))
            why = "a device operand runs past the end of its allocation";
        break;
    case cudaMemcpyHostToHost: break;
    default: why = "unknown cudaMemcpyKind";
    }
    if (why) {
        warn("%s(dst %p, src %p, %zu bytes, kind %d): %s", fn, dst, src, bytes, (int)kind, why);
        return record(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

/* ---- streams and events: lazy queues ---------------------------------------------------------------
 *
 * Every stream (the legacy default stream, NULL, included) is a FIFO of
 * deferred operations: kernel launches, async copies and memsets, cuBLAS
 * calls, event records and event waits are enqueued, not run. Work runs only
 * when something forces it, as late as CUDA allows (README.md lists the
 * rules and the documentation each follows), so a missing synchronisation
 * changes results instead of going unnoticed. CUDAEMU_EAGER=1 runs every
 * operation at the call instead (the old behaviour).
 */

struct stream_dep {
    cudaemu_stream *stream;
    uint64_t seq; /* that stream's first seq operations must have completed */
};
struct stream_op {
    std::function<void()> fn; /* empty: a marker (event record or wait) */
    std::vector<stream_dep> deps;
};
struct cudaemu_stream {
    unsigned flags;
    std::deque<stream_op> queue;
    uint64_t enqueued, completed;
    int running; /* an operation of this stream is being run */
    int destroyed;
};
struct cudaemu_event {
    unsigned flags;
    cudaemu_stream *stream; /* of the last record; NULL: never recorded */
    uint64_t seq;           /* complete when stream->completed >= seq */
    int queries;            /* cudaEventQuery calls answered cudaErrorNotReady since the record */
};
static cudaemu_stream g_legacy_stream; /* the legacy default stream (NULL) */
static std::set<void *> g_streams, g_events;
static std::vector<cudaemu_stream *> g_stream_list; /* creation order, destroyed ones included (kept: deps may name them) */

/* CUDAEMU_STATS=1: at exit, how lazy the run was */
static struct {
    unsigned long long ops, max_depth, not_ready, forced_by_dep, total_depth_at_run;
} g_stats;
static void print_stats(void)
{
    fprintf(stderr,
            "cudaemu stats: %llu stream operations, mean queue depth when run %.1f (max %llu), %llu run by another "
            "stream's dependency, %llu cudaEventQuery not-ready answers\n",
            g_stats.ops, g_stats.ops ? (double)g_stats.total_depth_at_run / g_stats.ops : 0.0, g_stats.max_depth,
            g_stats.forced_by_dep, g_stats.not_ready);
}

extern "C" int cudaemu_eager(void)
{
    static int eager = -1;
    if (eager < 0) {
        const char *s = getenv("CUDAEMU_EAGER");
        eager = s && strcmp(s, "1") == 0;
    }
    return eager;
}

static int stream_ok(cudaStream_t s) { return s == NULL || g_streams.count(s); }
static cudaemu_stream *stream_of(cudaStream_t s) { return s ? s : &g_legacy_stream; }
static int blocking(const cudaemu_stream *s) { return s != &g_legacy_stream && !(s->flags & cudaStreamNonBlocking); }

/* Runs s's operations until its first `seq` have completed. What they wait
 * for on other streams runs first, all of it, before any of s's own
 * operations: of the orders a GPU may take this one completes s's work as late
 * as possible relative to the other streams, so work elsewhere that should
 * have waited for one of s's operations (and did not) runs before it. */
static void run_until(cudaemu_stream *s, uint64_t seq)
{
    for (uint64_t q = s->completed + 1; q <= seq && !s->running; q++) {
        if (q <= s->completed) /* a dependency ran it already */
            continue;
        std::vector<stream_dep> deps = s->queue[q - s->completed - 1].deps;
        for (const stream_dep &d : deps)
            run_until(d.stream, d.seq);
    }
    while (s->completed < seq) {
        if (s->running)
            die("internal: stream %p is forced past its running operation (a dependency cycle)", (void *)s);
        if (s->queue.empty())
            die("internal: stream %p has %llu operations completed, %llu wanted, none queued", (void *)s,
                (unsigned long long)s->completed, (unsigned long long)seq);
        g_stats.total_depth_at_run += s->queue.size();
        stream_op op = std::move(s->queue.front());
        s->queue.pop_front();
        s->running = 1;
        for (const stream_dep &d : op.deps) { /* an event wait, or the legacy stream's implicit synchronisation */
            g_stats.forced_by_dep += d.stream->completed < d.seq;
            run_until(d.stream, d.seq);
        }
        if (op.fn)
            op.fn();
        s->running = 0;
        s->completed++;
    }
}

static void run_all(cudaemu_stream *s) { run_until(s, s->enqueued); }

static void run_everything(void)
{
    run_all(&g_legacy_stream);
    for (cudaemu_stream *s : g_stream_list)
        run_all(s);
}

/* Enqueues fn on stream s (after deps), with the legacy default stream's
 * implicit synchronisation: an operation on the legacy stream waits for all
 * work issued before it to blocking streams, and an operation on a blocking
 * stream waits for the legacy stream's work issued before it; non-blocking
 * streams take part in neither. Returns the operation's seq. */
static uint64_t enqueue(cudaStream_t stream, std::function<void()> fn, std::vector<stream_dep> deps = {})
{
    cudaemu_stream *s = stream_of(stream);
    if (s == &g_legacy_stream) {
        for (cudaemu_stream *b : g_stream_list)
            if (!b->destroyed && blocking(b) && b->enqueued > b->completed)
                deps.push_back(stream_dep{b, b->enqueued});
    } else if (blocking(s) && g_legacy_stream.enqueued > g_legacy_stream.completed) {
        deps.push_back(stream_dep{&g_legacy_stream, g_legacy_stream.enqueued});
    }
    s->queue.push_back(stream_op{std::move(fn), std::move(deps)});
    uint64_t seq = ++s->enqueued;
    if (!g_stats.ops++ && getenv("CUDAEMU_STATS"))
        atexit(print_stats);
    if (s->queue.size() > g_stats.max_depth)
        g_stats.max_depth = s->queue.size();
    if (cudaemu_eager())
        run_all(s);
    return seq;
}

/* For cuBLAS and NCCL: fn on stream, in order; and all of a stream's work so far. */
void cudaemu_enqueue(cudaStream_t stream, std::function<void()> fn)
{
    if (!stream_ok(stream))
        die("an operation enqueued on a destroyed or unknown stream");
    enqueue(stream, std::move(fn));
}
void cudaemu_stream_run(cudaStream_t stream) { run_all(stream_of(stream)); }

extern "C" cudaError_t cudaDeviceSynchronize(void)
{
    run_everything();
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    cudaemu_stream *s = new cudaemu_stream();
    s->flags = flags;
    *stream = s;
    g_streams.insert(s);
    g_stream_list.push_back(s);
    return cudaSuccess;
}
extern "C" cudaError_t cudaStreamCreate(cudaStream_t *stream) { return cudaStreamCreateWithFlags(stream, 0); }
/* "In case the device is still doing work in the stream when cudaStreamDestroy() is called, the function will
 * return immediately and the resources associated with stream will be released automatically once the device has
 * completed all work in stream": its work is run now (nothing could observe it running later), and the object is
 * kept, marked destroyed, for the dependencies and events that name it. */
extern "C" cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    if (!stream || !g_streams.erase(stream))
        return record(cudaErrorInvalidResourceHandle);
    run_all(stream);
    stream->destroyed = 1;
    return cudaSuccess;
}
extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    if (!stream_ok(stream))
        return record(cudaErrorInvalidResourceHandle);
    run_all(stream_of(stream));
    return cudaSuccess;
}
extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    cudaemu_event *e = new cudaemu_event();
    e->flags = flags;
    *event = e;
    g_events.insert(e);
    return cudaSuccess;
}
extern "C" cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, 0); }
extern "C" cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    if (!event || !g_events.erase(event))
        return record(cudaErrorInvalidResourceHandle);
    delete event;
    return cudaSuccess;
}
/* The event captures the work issued to the stream so far (a marker in the queue: on the legacy stream it
 * carries the implicit synchronisation too). */
extern "C" cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    if (!g_events.count(event) || !stream_ok(stream))
        return record(cudaErrorInvalidResourceHandle);
    event->seq = enqueue(stream, nullptr);
    event->stream = stream_of(stream);
    event->queries = 0;
    return cudaSuccess;
}
static int event_done(const cudaemu_event *e) { return !e->stream || e->stream->completed >= e->seq; }
/* Not ready the first two times it is asked about pending work (so that polling loops run), then the work up to
 * the event runs and it is. */
extern "C" cudaError_t cudaEventQuery(cudaEvent_t event)
{
    if (!g_events.count(event))
        return record(cudaErrorInvalidResourceHandle);
    if (event_done(event))
        return cudaSuccess;
    if (++event->queries <= 2) { /* not an error: not recorded for cudaGetLastError */
        g_stats.not_ready++;
        return cudaErrorNotReady;
    }
    run_until(event->stream, event->seq);
    return cudaSuccess;
}
extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    if (!g_events.count(event))
        return record(cudaErrorInvalidResourceHandle);
    if (!event_done(event))
        run_until(event->stream, event->seq);
    return cudaSuccess;
}
/* Work issued to stream after the call waits for the event's most recent record as of the call (one that has
 * none: no wait). */
extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    if (!g_events.count(event) || !stream_ok(stream) || flags != 0)
        return record(cudaErrorInvalidResourceHandle);
    std::vector<stream_dep> deps;
    if (event->stream)
        deps.push_back(stream_dep{event->stream, event->seq});
    enqueue(stream, nullptr, std::move(deps));
    return cudaSuccess;
}

/* ---- copies and memsets ------------------------------------------------------------------------------ */

enum mem_side { SIDE_PAGEABLE, SIDE_PINNED, SIDE_DEVICE };

static mem_side side_of(const void *p)
{
    cudaMemoryType kind;
    if (!cudaemu_lookup(p, 0, &kind))
        return SIDE_PAGEABLE;
    return kind == cudaMemoryTypeDevice ? SIDE_DEVICE : SIDE_PINNED;
}

/* The copy as an operation: a pageable host source is read now (staged), anything else when it runs. */
static std::function<void()> copy_op(void *dst, const void *src, size_t bytes, int stage)
{
    if (stage) {
        auto staged = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + bytes);
        return [dst, staged, bytes] { memcpy(dst, staged->data(), bytes); };
    }
    return [dst, src, bytes] { memmove(dst, src, bytes); };
}

/* cudaMemcpyAsync (the "API synchronization behavior" section of the runtime API docs): "For transfers between
 * device memory and pageable host memory, the function might be synchronous with respect to host" (here: a
 * pageable source is staged at the call, a pageable destination is written when the copy runs); "For transfers
 * from any host memory to any host memory, the function is fully synchronous with respect to the host" (the
 * stream's earlier work and the copy run at the call); "For all other transfers, the function should be fully
 * asynchronous". */
extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                                       cudaStream_t stream)
{
    if (!stream_ok(stream))
        return record(cudaErrorInvalidResourceHandle);
    cudaError_t e = copy_check(dst, src, bytes, kind, "cudaMemcpyAsync");
    if (e != cudaSuccess || !bytes)
        return e;
    mem_side ss = side_of(src), ds = side_of(dst);
    enqueue(stream, copy_op(dst, src, bytes, ss == SIDE_PAGEABLE && ds == SIDE_DEVICE));
    if (ss != SIDE_DEVICE && ds != SIDE_DEVICE)
        run_all(stream_of(stream));
    return cudaSuccess;
}

/* cudaMemcpy runs on the legacy default stream (so after the work issued to blocking streams, not non-blocking
 * ones), and per the docs: "For transfers from pageable host memory to device memory, ... The function will return
 * once the pageable buffer has been copied to the staging memory for DMA transfer to device memory, but the DMA to
 * final destination may not have completed" (staged, left queued); "For transfers from pinned host memory to device
 * memory, the function is synchronous with respect to the host"; "For transfers from device to either pageable or
 * pinned host memory, the function returns only once the copy has completed"; "For transfers from device memory to
 * device memory, no host-side synchronization is performed" (left queued); host to host: "fully synchronous". */
extern "C" cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    cudaError_t e = copy_check(dst, src, bytes, kind, "cudaMemcpy");
    if (e != cudaSuccess || !bytes)
        return e;
    mem_side ss = side_of(src), ds = side_of(dst);
    enqueue(NULL, copy_op(dst, src, bytes, ss == SIDE_PAGEABLE && ds == SIDE_DEVICE));
    int queued = ds == SIDE_DEVICE && (ss == SIDE_PAGEABLE || ss == SIDE_DEVICE);
    if (!queued)
        run_all(&g_legacy_stream);
    return cudaSuccess;
}

/* "The cudaMemset functions are asynchronous with respect to the host except when the target memory is pinned host
 * memory"; cudaMemset is on the legacy default stream. */
extern "C" cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t stream)
{
    if (!stream_ok(stream))
        return record(cudaErrorInvalidResourceHandle);
    if (bytes && !device_range(ptr, bytes, 0)) {
        warn("cudaMemset(%p, %zu bytes): not inside one device allocation", ptr, bytes);
        return record(cudaErrorInvalidValue);
    }
    if (bytes)
        enqueue(stream, [ptr, value, bytes] { memset(ptr, value, bytes); });
    return cudaSuccess;
}
extern "C" cudaError_t cudaMemset(void *ptr, int value, size_t bytes) { return cudaMemsetAsync(ptr, value, bytes, 0); }

/* ---- the launcher ------------------------------------------------------------------------------- */

enum thread_state { T_NEW, T_RUNNABLE, T_WAIT_BLOCK, T_WAIT_WARP, T_DONE };

/* Fiber switches. On x86-64 a six-register switch (no system call: swapcontext
 * saves the signal mask with one on every switch, which made small kernels
 * slow); elsewhere ucontext. */
#if defined(__x86_64__) && !defined(CUDAEMU_UCONTEXT)
#define FAST_SWITCH 1
extern "C" void cudaemu_switch(void **save_sp, void *load_sp);
__asm__(".text\n"
        ".globl cudaemu_switch\n"
        ".type cudaemu_switch,@function\n"
        "cudaemu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size cudaemu_switch, .-cudaemu_switch\n");
#else
#define FAST_SWITCH 0
#endif

struct emu_thread {
    ucontext_t ctx;
    void *sp; /* FAST_SWITCH: saved stack pointer */
    void *stack;
    thread_state state;
    uint3 idx;
    const char *file; /* where it waits */
    int line;
    /* warp exchange */
    cudaemu_shfl_mode mode;
    unsigned mask;
    int arg, width;
    uint64_t value, result;
};

static size_t stack_bytes(void)
{
    static size_t bytes;
    if (!bytes) {
        const char *s = getenv("CUDAEMU_STACK_KB");
        bytes = (s && *s ? (size_t)atoi(s) : 256) * 1024;
    }
    return bytes;
}

static std::vector<void *> g_stack_pool;
static size_t g_page;

static void *stack_get(void)
{
    if (!g_stack_pool.empty()) {
        void *s = g_stack_pool.back();
        g_stack_pool.pop_back();
        return s;
    }
    g_page = (size_t)sysconf(_SC_PAGESIZE);
    char *m = (char *)mmap(NULL, stack_bytes() + g_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        die("cannot map a fiber stack: %s", strerror(errno));
    mprotect(m, g_page, PROT_NONE); /* guard: an overflow faults instead of corrupting a neighbour */
    return m + g_page;
}

struct launch {
    const char *name, *file;
    int line;
    void (*body)(void *);
    void *ctx;
    unsigned n; /* threads per block */
    std::vector<emu_thread> threads;
    int in_kernel;
};

static launch g_launch;
static ucontext_t g_scheduler __attribute__((unused));
static void *g_scheduler_sp;
static emu_thread *g_current;

static void kernel_fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void kernel_fail(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    die("kernel %s (launched at %s:%d), block (%u,%u,%u) of grid (%u,%u,%u), block (%u,%u,%u): %s", g_launch.name,
        g_launch.file, g_launch.line, blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, gridDim.y, gridDim.z,
        blockDim.x, blockDim.y, blockDim.z, msg);
}

static void thread_entry(void)
{
    g_launch.body(g_launch.ctx);
    g_current->state = T_DONE;
#if FAST_SWITCH
    void *dead;
    cudaemu_switch(&dead, g_scheduler_sp); /* never comes back */
    __builtin_unreachable();
#endif
    /* ucontext: returning resumes uc_link, the scheduler */
}

/* Runs thread t until it ends or waits; gives its stack back when it ends. */
static void run_thread(emu_thread *t)
{
    if (t->state == T_NEW) {
        t->stack = stack_get();
#if FAST_SWITCH
        /* a frame for cudaemu_switch to pop: six registers, then thread_entry as the return address, entered
         * with the stack aligned as after a call */
        uintptr_t top = ((uintptr_t)t->stack + stack_bytes()) & ~(uintptr_t)15;
        void **sp = (void **)(top - 8);
        *sp = NULL;                    /* thread_entry's own return address: never used */
        *--sp = (void *)thread_entry;  /* cudaemu_switch's ret */
        for (int r = 0; r < 6; r++)
            *--sp = NULL;
        t->sp = sp;
    }
    t->state = T_RUNNABLE;
    g_current = t;
    threadIdx = t->idx;
    cudaemu_switch(&g_scheduler_sp, t->sp);
#else
        getcontext(&t->ctx);
        t->ctx.uc_stack.ss_sp = t->stack;
        t->ctx.uc_stack.ss_size = stack_bytes();
        t->ctx.uc_link = &g_scheduler;
        makecontext(&t->ctx, thread_entry, 0);
    }
    t->state = T_RUNNABLE;
    g_current = t;
    threadIdx = t->idx;
    swapcontext(&g_scheduler, &t->ctx);
#endif
    g_current = NULL;
    if (t->state == T_DONE) {
        g_stack_pool.push_back(t->stack);
        t->stack = NULL;
    }
}

static void wait_here(void)
{
    emu_thread *t = g_current;
#if FAST_SWITCH
    cudaemu_switch(&t->sp, g_scheduler_sp);
#else
    swapcontext(&t->ctx, &g_scheduler);
#endif
    g_current = t;
    threadIdx = t->idx;
}

void cudaemu_syncthreads(const char *file, int line)
{
    if (!g_current)
        die("__syncthreads() outside a kernel (%s:%d)", file, line);
    g_current->state = T_WAIT_BLOCK;
    g_current->file = file;
    g_current->line = line;
    wait_here();
}

uint64_t cudaemu_warp_exchange(cudaemu_shfl_mode mode, unsigned mask, uint64_t bits, int arg, int width)
{
    emu_thread *t = g_current;
    if (!t)
        die("a warp shuffle or __syncwarp outside a kernel");
    unsigned linear = (unsigned)(t - g_launch.threads.data()), lane = linear % 32;
    if (!(mask & (1u << lane)))
        kernel_fail("thread %u calls a warp %s with mask 0x%08x, which does not name its own lane %u", linear,
                    mode == CUDAEMU_SYNCWARP ? "__syncwarp" : "shuffle", mask, lane);
    if (mode != CUDAEMU_SYNCWARP && (width < 1 || width > 32 || (width & (width - 1))))
        kernel_fail("thread %u shuffles with width %d: must be a power of two up to 32", linear, width);
    t->state = T_WAIT_WARP;
    t->mode = mode;
    t->mask = mask;
    t->arg = arg;
    t->width = width;
    t->value = bits;
    t->file = NULL;
    wait_here();
    return t->result;
}

static const char *mode_name(cudaemu_shfl_mode m)
{
    switch (m) {
    case CUDAEMU_SHFL_IDX: return "__shfl_sync";
    case CUDAEMU_SHFL_UP: return "__shfl_up_sync";
    case CUDAEMU_SHFL_DOWN: return "__shfl_down_sync";
    case CUDAEMU_SHFL_XOR: return "__shfl_xor_sync";
    case CUDAEMU_SYNCWARP: return "__syncwarp";
    }
    return "?";
}

/* Completes warp w's exchange when every lane its mask names has arrived; returns 1 if it did. */
static int resolve_warp(unsigned w)
{
    std::vector<emu_thread> &th = g_launch.threads;
    unsigned first = w * 32, lanes = g_launch.n - first < 32 ? g_launch.n - first : 32;
    emu_thread *lead = NULL;
    for (unsigned l = 0; l < lanes; l++)
        if (th[first + l].state == T_WAIT_WARP) {
            lead = &th[first + l];
            break;
        }
    if (!lead)
        return 0;
    unsigned mask = lead->mask;
    for (unsigned l = 0; l < 32; l++) {
        if (!(mask & (1u << l)))
            continue;
        if (l >= lanes)
            kernel_fail("warp %u: %s with mask 0x%08x names lane %u, but the block has only %u threads", w,
                        mode_name(lead->mode), mask, l, g_launch.n);
        emu_thread *x = &th[first + l];
        if (x->state == T_DONE)
            kernel_fail("warp %u: lane %u has exited while lane %u waits in %s with mask 0x%08x", w, l,
                        (unsigned)(lead - &th[first]), mode_name(lead->mode), mask);
        if (x->state != T_WAIT_WARP)
            return 0; /* not there yet (or at __syncthreads: the deadlock check reports it) */
        if (x->mask != mask || x->mode != lead->mode)
            kernel_fail("warp %u: lanes %u and %u meet at different warp operations (%s mask 0x%08x, %s mask 0x%08x)",
                        w, (unsigned)(lead - &th[first]), l, mode_name(lead->mode), mask, mode_name(x->mode), x->mask);
    }
    for (unsigned l = 0; l < 32; l++) {
        if (!(mask & (1u << l)))
            continue;
        emu_thread *x = &th[first + l];
        int width = x->width, seg = (int)l & ~(width - 1), src = (int)l;
        switch (x->mode) {
        case CUDAEMU_SHFL_IDX: src = seg + (x->arg % width + width) % width; break;
        case CUDAEMU_SHFL_UP: src = (int)l - x->arg >= seg ? (int)l - x->arg : (int)l; break;
        case CUDAEMU_SHFL_DOWN: src = (int)l + x->arg < seg + width ? (int)l + x->arg : (int)l; break;
        case CUDAEMU_SHFL_XOR: src = ((int)l ^ x->arg) < seg + width ? ((int)l ^ x->arg) : (int)l; break;
        case CUDAEMU_SYNCWARP: break;
        }
        if (src < 0 || src > 31 || !(mask & (1u << src)))
            kernel_fail("warp %u: lane %u reads lane %d in %s, which its mask 0x%08x does not name", w, l, src,
                        mode_name(x->mode), mask);
        x->result = th[first + src].value;
    }
    for (unsigned l = 0; l < 32; l++)
        if (mask & (1u << l))
            th[first + l].state = T_RUNNABLE;
    return 1;
}

/* Completes the block barrier when every thread that has not exited waits at it. */
static int resolve_block(void)
{
    std::vector<emu_thread> &th = g_launch.threads;
    emu_thread *lead = NULL;
    unsigned exited = 0;
    for (unsigned i = 0; i < g_launch.n; i++) {
        if (th[i].state == T_DONE) {
            exited++;
            continue;
        }
        if (th[i].state != T_WAIT_BLOCK)
            return 0;
        if (!lead)
            lead = &th[i];
        else if (th[i].line != lead->line || strcmp(th[i].file, lead->file) != 0)
            kernel_fail("threads %u and %u wait at different __syncthreads() (%s:%d and %s:%d): a barrier in divergent "
                        "code",
                        (unsigned)(lead - th.data()), i, lead->file, lead->line, th[i].file, th[i].line);
    }
    if (!lead)
        return 0;
    if (exited) {
        static int warned;
        if (getenv("CUDAEMU_STRICT"))
            kernel_fail("%u threads exited before the __syncthreads() at %s:%d that the others wait at", exited,
                        lead->file, lead->line);
        if (!warned++)
            warn("kernel %s: %u threads exited before __syncthreads() at %s:%d (undefined in CUDA; works on current "
                 "GPUs; CUDAEMU_STRICT=1 makes it an error)",
                 g_launch.name, exited, lead->file, lead->line);
    }
    for (unsigned i = 0; i < g_launch.n; i++)
        if (th[i].state == T_WAIT_BLOCK)
            th[i].state = T_RUNNABLE;
    return 1;
}

static void deadlock(void)
{
    std::vector<emu_thread> &th = g_launch.threads;
    char what[512] = "";
    size_t used = 0;
    for (unsigned i = 0; i < g_launch.n && used < sizeof what - 100; i++) {
        const emu_thread &x = th[i];
        if (x.state == T_WAIT_BLOCK && (i == 0 || th[i - 1].state != T_WAIT_BLOCK || th[i - 1].line != x.line))
            used += snprintf(what + used, sizeof what - used, " thread %u+ at __syncthreads() %s:%d;", i, x.file,
                             x.line);
        else if (x.state == T_WAIT_WARP && (i == 0 || th[i - 1].state != T_WAIT_WARP))
            used += snprintf(what + used, sizeof what - used, " thread %u+ in %s mask 0x%08x;", i, mode_name(x.mode),
                             x.mask);
        else if (x.state == T_DONE && (i == 0 || th[i - 1].state != T_DONE))
            used += snprintf(what + used, sizeof what - used, " thread %u+ exited;", i);
    }
    kernel_fail("deadlock: no barrier can complete (a barrier or shuffle in divergent code?):%s", what);
}

static void run_block(void)
{
    std::vector<emu_thread> &th = g_launch.threads;
    unsigned n = g_launch.n, i = 0;
    for (unsigned z = 0; z < blockDim.z; z++)
        for (unsigned y = 0; y < blockDim.y; y++)
            for (unsigned x = 0; x < blockDim.x; x++, i++) {
                th[i].state = T_NEW;
                th[i].idx = uint3{x, y, z};
            }
    unsigned done = 0;
    for (i = 0; i < n; i++) {
        run_thread(&th[i]);
        done += th[i].state == T_DONE;
    }
    while (done < n) {
        int released = 0;
        for (unsigned w = 0; w * 32 < n; w++)
            released |= resolve_warp(w);
        if (!released)
            released = resolve_block();
        if (!released)
            deadlock();
        for (i = 0; i < n; i++)
            if (th[i].state == T_RUNNABLE) {
                run_thread(&th[i]);
                done += th[i].state == T_DONE;
            }
    }
}

static int launch_check(const char *name, const char *file, int line, dim3 g, dim3 b, size_t smem)
{
    char why[256] = "";
    unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    if (!g.x || !g.y || !g.z || !b.x || !b.y || !b.z)
        snprintf(why, sizeof why, "a zero dimension");
    else if (threads > 1024)
        snprintf(why, sizeof why, "%llu threads per block (at most 1024)", threads);
    else if (b.x > 1024 || b.y > 1024 || b.z > 64)
        snprintf(why, sizeof why, "block dimensions beyond (1024, 1024, 64)");
    else if (g.x > 2147483647u || g.y > 65535 || g.z > 65535)
        snprintf(why, sizeof why, "grid dimensions beyond (2^31-1, 65535, 65535)");
    else if (smem > 48 * 1024)
        snprintf(why, sizeof why, "%zu bytes of dynamic shared memory (over 48 KiB needs an opt-in)", smem);
    if (!why[0])
        return 1;
    g_last_error = cudaErrorInvalidConfiguration;
    const char *mode = getenv("CUDAEMU_LAUNCH_ERRORS");
    if (mode && strcmp(mode, "record") == 0) {
        warn("launch of %s at %s:%d skipped (cudaErrorInvalidConfiguration): grid (%u,%u,%u) block (%u,%u,%u): %s",
             name, file, line, g.x, g.y, g.z, b.x, b.y, b.z, why);
        return 0;
    }
    die("invalid launch of kernel %s at %s:%d: grid (%u,%u,%u) block (%u,%u,%u): %s (a GPU would skip the kernel and "
        "report cudaErrorInvalidConfiguration only to cudaGetLastError)",
        name, file, line, g.x, g.y, g.z, b.x, b.y, b.z, why);
}

/* Runs every block of a launch (when its stream reaches it). */
static void run_kernel(const char *name, const char *file, int line, dim3 grid, dim3 block,
                       const std::function<void()> &body)
{
    g_launch.name = name;
    g_launch.file = file;
    g_launch.line = line;
    g_launch.body = [](void *c) { (*(const std::function<void()> *)c)(); };
    g_launch.ctx = (void *)&body;
    g_launch.n = block.x * block.y * block.z;
    if (g_launch.threads.size() < g_launch.n)
        g_launch.threads.resize(g_launch.n);
    g_launch.in_kernel = 1;
    gridDim = grid;
    blockDim = block;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = uint3{x, y, z};
                run_block();
            }
    g_launch.in_kernel = 0;
}

/* Checks the launch now (a bad one is reported at the launch, as on a GPU) and enqueues it on its stream. */
void cudaemu_launch_impl(const char *name, const char *file, int line, dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream, std::function<void()> body)
{
    if (g_launch.in_kernel)
        die("kernel %s launched from inside kernel %s (dynamic parallelism is not emulated)", name, g_launch.name);
    if (!stream_ok(stream))
        die("kernel %s at %s:%d launched on a destroyed or unknown stream", name, file, line);
    if (!launch_check(name, file, line, grid, block, smem))
        return;
    enqueue(stream, [name, file, line, grid, block, body] { run_kernel(name, file, line, grid, block, body); });
}
