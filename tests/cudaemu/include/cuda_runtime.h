/*
 * cudaemu — CUDA device code on the CPU (tests/cudaemu/README.md).
 *
 * Kernel source compiles as plain C++: __global__/__device__ vanish,
 * __shared__ becomes static (blocks run one after another in one OS thread),
 * and threadIdx/blockIdx/blockDim/gridDim are globals the launcher sets each
 * time it switches to a thread. tests/cudaemu/rewrite_launches.py turns
 * `k<<<grid, block, smem, stream>>>(args)` into cudaemu_launch(...), which
 * runs every block of the grid in turn and every thread of a block as a
 * fiber; __syncthreads() and the warp shuffles are real barriers between the
 * fibers, and a barrier that cannot complete aborts naming the kernel.
 */
#ifndef CUDAEMU_RUNTIME_H
#define CUDAEMU_RUNTIME_H

#include "cuda_runtime_api.h"
#include "library_types.h"

#ifdef __cplusplus
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...) /* an occupancy hint to nvcc; nothing to emulate */
#define __shared__ static
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
};

/* The running emulated thread's coordinates (set by the launcher on every switch). */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
constexpr int warpSize = 32;

void cudaemu_syncthreads(const char *file, int line);
#define __syncthreads() cudaemu_syncthreads(__FILE__, __LINE__)

enum cudaemu_shfl_mode { CUDAEMU_SHFL_IDX, CUDAEMU_SHFL_UP, CUDAEMU_SHFL_DOWN, CUDAEMU_SHFL_XOR, CUDAEMU_SYNCWARP };
uint64_t cudaemu_warp_exchange(enum cudaemu_shfl_mode mode, unsigned mask, uint64_t bits, int arg, int width);

inline void __syncwarp(unsigned mask = 0xffffffffu) { cudaemu_warp_exchange(CUDAEMU_SYNCWARP, mask, 0, 0, 32); }

template <typename T> inline T cudaemu_shfl(enum cudaemu_shfl_mode mode, unsigned mask, T v, int arg, int width)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a type of at most 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = cudaemu_warp_exchange(mode, mask, bits, arg, width);
    T r;
    memcpy(&r, &bits, sizeof r);
    return r;
}
template <typename T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    return cudaemu_shfl(CUDAEMU_SHFL_IDX, mask, v, src, width);
}
template <typename T> inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    return cudaemu_shfl(CUDAEMU_SHFL_UP, mask, v, (int)delta, width);
}
template <typename T> inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    return cudaemu_shfl(CUDAEMU_SHFL_DOWN, mask, v, (int)delta, width);
}
template <typename T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    return cudaemu_shfl(CUDAEMU_SHFL_XOR, mask, v, lane_mask, width);
}

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
/* Round-to-nearest product and sum that never fuse into a multiply-add (as on the device): the volatile
 * keeps g++ from contracting the two across an inlined call. */
inline float __fmul_rn(float a, float b) { volatile float p = a * b; return p; }
inline float __fadd_rn(float a, float b) { volatile float s = a + b; return s; }

/* Checks a launch and enqueues it on its stream: when the stream reaches it,
 * the body runs for every thread of every block; name and site for messages. */
void cudaemu_launch_impl(const char *name, const char *file, int line, dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream, std::function<void()> body);

/* body is copied: a [&] lambda's references must outlive the launch's execution (a synchronisation). */
template <typename F>
inline void cudaemu_launch(const char *name, const char *file, int line, F &&body, dim3 grid, dim3 block,
                           size_t smem = 0, cudaStream_t stream = 0)
{
    cudaemu_launch_impl(name, file, line, grid, block, smem, stream, std::function<void()>(body));
}

/* What rewrite_launches.py makes of `k<<<config>>>(args)`: the arguments are
 * evaluated at the launch into a tuple (by value, as CUDA copies kernel
 * parameters at the launch), and the kernel runs on them when the stream
 * reaches it. */
template <typename F, typename Args>
inline void cudaemu_launch_args(const char *name, const char *file, int line, F body, Args args, dim3 grid,
                                dim3 block, size_t smem = 0, cudaStream_t stream = 0)
{
    cudaemu_launch_impl(name, file, line, grid, block, smem, stream,
                        std::function<void()>([body, args] { std::apply(body, args); }));
}

/* Emulation only (cuBLAS, NCCL): fn runs when stream reaches it; all of a
 * stream's queued work, now. */
void cudaemu_enqueue(cudaStream_t stream, std::function<void()> fn);
void cudaemu_stream_run(cudaStream_t stream);

/* The runtime's template overloads for typed pointers, as cuda_runtime.h has them. */
template <typename T> inline cudaError_t cudaMalloc(T **ptr, size_t bytes) { return cudaMalloc((void **)ptr, bytes); }
template <typename T> inline cudaError_t cudaMallocHost(T **ptr, size_t bytes)
{
    return cudaMallocHost((void **)ptr, bytes);
}
template <typename T> inline cudaError_t cudaHostAlloc(T **ptr, size_t bytes, unsigned int flags)
{
    return cudaHostAlloc((void **)ptr, bytes, flags);
}
#endif /* __cplusplus */

#endif
