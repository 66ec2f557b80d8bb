/*
 * cudaemu: nvcuda::wmma, the warp matrix operations, for the 16 x 16 x 16 shape with __half or __nv_bfloat16
 * operands and a float accumulator (tests/cudaemu/README.md).
 *
 * A fragment is per thread, as on a GPU: each of the warp's 32 lanes holds 8 of the tile's 256 elements, lane l's
 * element e being tile element p = 32 e + l (row p / 16, column p % 16). That mapping is deliberately not a GPU's:
 * CUDA leaves it unspecified, so a kernel that assumes one fails here. Every operation is warp-collective, as
 * CUDA requires ("all threads in a warp must call"): it meets the warp at a __syncwarp (so a fragment operation
 * in divergent code deadlocks and aborts naming the kernel). mma_sync gathers the operands through a table of the
 * lanes' fragment addresses: each lane publishes its A and B, the warp meets, each lane computes its own elements
 * of D = A B + C in fp32 (the products of 16-bit operands exact, the sums rounded as fp32, in k order), the warp
 * meets again (no lane changes an operand another still reads), then each lane writes its D. Loads and stores
 * check what CUDA documents: the pointer 256-bit (32-byte) aligned, ldm a multiple of 8 elements for 16-bit types
 * and of 4 for float.
 */
#ifndef CUDAEMU_MMA_H
#define CUDAEMU_MMA_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"

/* The lanes' published operands (mma_sync), by the thread's linear index in its block. */
extern const void *cudaemu_wmma_slot[1024][2];

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int m, int n, int k, typename T, typename Layout = void> class fragment {
    static_assert(m == 16 && n == 16 && k == 16, "cudaemu emulates the 16 x 16 x 16 wmma shape only");

public:
    enum { num_elements = 8 };
    typedef T element_type;
    T x[num_elements];
};

namespace cudaemu_detail {
inline unsigned linear_thread(void) { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
inline unsigned lane(void) { return linear_thread() % 32; }
/* Tile element of lane l's element e: p = 32 e + l. */
inline int row_of(unsigned l, int e) { return (32 * e + (int)l) / 16; }
inline int col_of(unsigned l, int e) { return (32 * e + (int)l) % 16; }

inline float widen(float v) { return v; }
inline float widen(__half v) { return __half2float(v); }
inline float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
inline void narrow(float &d, float v) { d = v; }

inline void check(const void *p, unsigned ldm, unsigned elem_bytes, const char *what)
{
    const unsigned multiple = elem_bytes == 2 ? 8 : 4;
    if ((uintptr_t)p % 32 != 0 || ldm % multiple != 0) {
        fprintf(stderr,
                "cudaemu: wmma::%s(%p, ldm %u) in block (%u,%u,%u) thread (%u,%u,%u): the pointer must be 32-byte "
                "aligned and ldm a multiple of %u elements\n",
                what, p, ldm, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z, multiple);
        abort();
    }
}

/* Element (r, c) of a 16 x 16 tile at p, ldm apart, row- or column-major. */
template <typename T> inline T at(const T *p, unsigned ldm, int r, int c, bool row_major)
{
    return row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
}

template <typename Use, typename T, typename Layout>
inline void load(fragment<Use, 16, 16, 16, T, Layout> &f, const T *p, unsigned ldm, bool row_major)
{
    check(p, ldm, sizeof(T), "load_matrix_sync");
    __syncwarp();
    const unsigned l = lane();
    for (int e = 0; e < 8; e++)
        f.x[e] = at(p, ldm, row_of(l, e), col_of(l, e), row_major);
}

template <typename L> constexpr bool is_row_major(void) { return std::is_same<L, row_major>::value; }
} // namespace cudaemu_detail

template <typename Use, typename T, typename Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout> &f, const T *p, unsigned ldm)
{
    static_assert(!std::is_same<Use, accumulator>::value, "an accumulator load names its memory layout");
    cudaemu_detail::load(f, p, ldm, cudaemu_detail::is_row_major<Layout>());
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm,
                             layout_t layout)
{
    cudaemu_detail::load(f, p, ldm, layout == mem_row_major);
}

inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm,
                              layout_t layout)
{
    using namespace cudaemu_detail;
    check(p, ldm, sizeof(float), "store_matrix_sync");
    __syncwarp();
    const unsigned l = lane();
    for (int e = 0; e < 8; e++) {
        const int r = row_of(l, e), c = col_of(l, e);
        (layout == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]) = f.x[e];
    }
}

template <typename Use, typename T, typename Layout>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout> &f, const typename std::common_type<T>::type &v)
{
    __syncwarp();
    for (int e = 0; e < 8; e++)
        f.x[e] = v;
}

template <typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d, const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, T, LB> &b, const fragment<accumulator, 16, 16, 16, float> &c)
{
    using namespace cudaemu_detail;
    static_assert(std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value,
                  "cudaemu emulates wmma on __half and __nv_bfloat16 operands");
    const unsigned me = linear_thread(), base = me - me % 32, l = me % 32;
    cudaemu_wmma_slot[me][0] = &a;
    cudaemu_wmma_slot[me][1] = &b;
    __syncwarp();
    /* A's (r, k) is lane (16 r + k) % 32's element (16 r + k) / 32; B's (k, c) likewise */
    float out[8];
    for (int e = 0; e < 8; e++) {
        const int r = row_of(l, e), cc = col_of(l, e);
        float sum = c.x[e];
        for (int k = 0; k < 16; k++) {
            const int pa = 16 * r + k, pb = 16 * k + cc;
            const auto *fa = (const fragment<matrix_a, 16, 16, 16, T, LA> *)cudaemu_wmma_slot[base + pa % 32][0];
            const auto *fb = (const fragment<matrix_b, 16, 16, 16, T, LB> *)cudaemu_wmma_slot[base + pb % 32][1];
            sum = fmaf(widen(fa->x[pa / 32]), widen(fb->x[pb / 32]), sum);
        }
        out[e] = sum;
    }
    __syncwarp();
    for (int e = 0; e < 8; e++)
        d.x[e] = out[e];
}

} // namespace wmma
} // namespace nvcuda
#endif
