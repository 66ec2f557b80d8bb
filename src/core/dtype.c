#include "dtype.h"
#include "dtype_simd.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define DTYPE_X86 1
#else
#define DTYPE_X86 0
#endif

/* Elements per unit of OpenMP work: large enough that the call through a
 * function pointer and the scalar tail are noise, small enough to balance. */
#define DTYPE_BLOCK 4096
/* Below this many elements one thread does the work: forking costs a few µs,
 * about what 64K elements take to convert. */
#define DTYPE_PARALLEL_MIN 65536

/* ---- CPU features ------------------------------------------------------ */

#if DTYPE_X86
/* CPUID leaf 1, ECX bit 29 (not every compiler's __builtin_cpu_supports knows "f16c"). */
static int cpu_has_f16c(void)
{
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
}
#endif

int dtype_simd_available(enum dtype_simd level)
{
    switch (level) {
    case DTYPE_SIMD_SCALAR:
        return 1;
#if DTYPE_X86
    case DTYPE_SIMD_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case DTYPE_SIMD_AVX512:
        return __builtin_cpu_supports("avx512f");
#else
    case DTYPE_SIMD_AVX2:
    case DTYPE_SIMD_AVX512:
        return 0;
#endif
    }
    return 0;
}

enum dtype_simd dtype_simd_best(void)
{
    static int best = -1; /* benign race: every thread computes the same value */
    if (best < 0)
        best = dtype_simd_available(DTYPE_SIMD_AVX512) ? DTYPE_SIMD_AVX512
             : dtype_simd_available(DTYPE_SIMD_AVX2)   ? DTYPE_SIMD_AVX2
                                                       : DTYPE_SIMD_SCALAR;
    return (enum dtype_simd)best;
}

const char *dtype_simd_name(enum dtype_simd level)
{
    switch (level) {
    case DTYPE_SIMD_SCALAR: return "scalar";
    case DTYPE_SIMD_AVX2: return "avx2+f16c";
    case DTYPE_SIMD_AVX512: return "avx512f";
    }
    return "?";
}

/* ---- scalar kernels (the reference every SIMD level must match) -------- */

typedef void (*convert_fn)(void *dst, const void *src, size_t n);
typedef void (*add_fn)(float *acc, const void *src, size_t n);

static void f32_to_f16_scalar(void *dst, const void *src, size_t n)
{
    uint16_t *d = dst;
    const float *s = src;
    for (size_t i = 0; i < n; i++)
        d[i] = f32_to_f16(s[i]);
}

static void f16_to_f32_scalar(void *dst, const void *src, size_t n)
{
    float *d = dst;
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i++)
        d[i] = f16_to_f32(s[i]);
}

static void f32_to_bf16_scalar(void *dst, const void *src, size_t n)
{
    uint16_t *d = dst;
    const float *s = src;
    for (size_t i = 0; i < n; i++)
        d[i] = f32_to_bf16(s[i]);
}

static void bf16_to_f32_scalar(void *dst, const void *src, size_t n)
{
    float *d = dst;
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i++)
        d[i] = bf16_to_f32(s[i]);
}

static void add_f32_scalar(float *acc, const void *src, size_t n)
{
    const float *s = src;
    for (size_t i = 0; i < n; i++)
        acc[i] += s[i];
}

static void add_f16_scalar(float *acc, const void *src, size_t n)
{
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i++)
        acc[i] += f16_to_f32(s[i]);
}

static void add_bf16_scalar(float *acc, const void *src, size_t n)
{
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i++)
        acc[i] += bf16_to_f32(s[i]);
}

/* ---- AVX2 + FMA + F16C ------------------------------------------------- */
#if DTYPE_X86

/* bf16_to_f32() on 8 lanes. */
TARGET_AVX2 static inline __m256 bf16_widen_avx2(const uint16_t *s)
{
    const __m256i x = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)s)), 16);
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                              _mm256_set1_epi32(0x7f800000));
    return _mm256_castsi256_ps(_mm256_or_si256(x, _mm256_and_si256(is_nan, _mm256_set1_epi32(0x400000))));
}

TARGET_AVX2 static void f32_to_f16_avx2(void *dst, const void *src, size_t n)
{
    uint16_t *d = dst;
    const float *s = src;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    f32_to_f16_scalar(d + i, s + i, n - i);
}

TARGET_AVX2 static void f16_to_f32_avx2(void *dst, const void *src, size_t n)
{
    float *d = dst;
    const uint16_t *s = src;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    f16_to_f32_scalar(d + i, s + i, n - i);
}

TARGET_AVX2 static void f32_to_bf16_avx2(void *dst, const void *src, size_t n)
{
    uint16_t *d = dst;
    const float *s = src;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i lo = bf16_round_avx2(_mm256_loadu_ps(s + i));
        const __m256i hi = bf16_round_avx2(_mm256_loadu_ps(s + i + 8));
        /* packus interleaves 128-bit lanes (lo0-3 hi0-3 lo4-7 hi4-7); the permute restores order */
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
        _mm256_storeu_si256((__m256i *)(d + i), packed);
    }
    f32_to_bf16_scalar(d + i, s + i, n - i);
}

TARGET_AVX2 static void bf16_to_f32_avx2(void *dst, const void *src, size_t n)
{
    float *d = dst;
    const uint16_t *s = src;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, bf16_widen_avx2(s + i));
    bf16_to_f32_scalar(d + i, s + i, n - i);
}

TARGET_AVX2 static void add_f32_avx2(float *acc, const void *src, size_t n)
{
    const float *s = src;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_loadu_ps(s + i)));
    add_f32_scalar(acc + i, s + i, n - i);
}

TARGET_AVX2 static void add_f16_avx2(float *acc, const void *src, size_t n)
{
    const uint16_t *s = src;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i)));
        _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), x));
    }
    add_f16_scalar(acc + i, s + i, n - i);
}

TARGET_AVX2 static void add_bf16_avx2(float *acc, const void *src, size_t n)
{
    const uint16_t *s = src;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), bf16_widen_avx2(s + i)));
    add_bf16_scalar(acc + i, s + i, n - i);
}

/* ---- AVX-512F ---------------------------------------------------------- */

/* bf16_to_f32() on 16 lanes. */
TARGET_AVX512 static inline __m512 bf16_widen_avx512(const uint16_t *s)
{
    const __m512i x = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)s)), 16);
    const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                                     _mm512_set1_epi32(0x7f800000));
    return _mm512_castsi512_ps(_mm512_mask_or_epi32(x, is_nan, x, _mm512_set1_epi32(0x400000)));
}

TARGET_AVX512 static void f32_to_f16_avx512(void *dst, const void *src, size_t n)
{
    uint16_t *d = dst;
    const float *s = src;
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(d + i), _mm512_cvtps_ph(_mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    f32_to_f16_scalar(d + i, s + i, n - i);
}

TARGET_AVX512 static void f16_to_f32_avx512(void *dst, const void *src, size_t n)
{
    float *d = dst;
    const uint16_t *s = src;
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
    f16_to_f32_scalar(d + i, s + i, n - i);
}

TARGET_AVX512 static void f32_to_bf16_avx512(void *dst, const void *src, size_t n)
{
    uint16_t *d = dst;
    const float *s = src;
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(d + i), bf16_round_avx512(_mm512_loadu_ps(s + i)));
    f32_to_bf16_scalar(d + i, s + i, n - i);
}

TARGET_AVX512 static void bf16_to_f32_avx512(void *dst, const void *src, size_t n)
{
    float *d = dst;
    const uint16_t *s = src;
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(d + i, bf16_widen_avx512(s + i));
    bf16_to_f32_scalar(d + i, s + i, n - i);
}

TARGET_AVX512 static void add_f32_avx512(float *acc, const void *src, size_t n)
{
    const float *s = src;
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), _mm512_loadu_ps(s + i)));
    add_f32_scalar(acc + i, s + i, n - i);
}

TARGET_AVX512 static void add_f16_avx512(float *acc, const void *src, size_t n)
{
    const uint16_t *s = src;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i)));
        _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), x));
    }
    add_f16_scalar(acc + i, s + i, n - i);
}

TARGET_AVX512 static void add_bf16_avx512(float *acc, const void *src, size_t n)
{
    const uint16_t *s = src;
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), bf16_widen_avx512(s + i)));
    add_bf16_scalar(acc + i, s + i, n - i);
}
#endif /* DTYPE_X86 */

/* ---- dispatch ---------------------------------------------------------- */

/* A level the CPU lacks falls back to the next one below. */
static enum dtype_simd usable_level(enum dtype_simd level)
{
    while (level > DTYPE_SIMD_SCALAR && !dtype_simd_available(level))
        level = (enum dtype_simd)(level - 1);
    return level;
}

/* The kernel from src_dt to dst_dt where one of them is fp32 and the other is not. */
static convert_fn pick_convert(enum dtype dst_dt, enum dtype src_dt, enum dtype_simd level)
{
    static const convert_fn to16[3][2] = {
        /* [level][dst is bf16] */
        {f32_to_f16_scalar, f32_to_bf16_scalar},
#if DTYPE_X86
        {f32_to_f16_avx2, f32_to_bf16_avx2},
        {f32_to_f16_avx512, f32_to_bf16_avx512},
#endif
    };
    static const convert_fn to32[3][2] = {
        /* [level][src is bf16] */
        {f16_to_f32_scalar, bf16_to_f32_scalar},
#if DTYPE_X86
        {f16_to_f32_avx2, bf16_to_f32_avx2},
        {f16_to_f32_avx512, bf16_to_f32_avx512},
#endif
    };
    if (src_dt == DTYPE_F32)
        return to16[level][dst_dt == DTYPE_BF16];
    return to32[level][src_dt == DTYPE_BF16];
}

static add_fn pick_add(enum dtype dt, enum dtype_simd level)
{
    static const add_fn table[3][3] = {
        /* [level][dtype] */
        {add_f32_scalar, add_f16_scalar, add_bf16_scalar},
#if DTYPE_X86
        {add_f32_avx2, add_f16_avx2, add_bf16_avx2},
        {add_f32_avx512, add_f16_avx512, add_bf16_avx512},
#endif
    };
    return table[level][dt];
}

/* fp16 <-> bf16 through an fp32 buffer on the stack, one block at a time. */
static void convert_via_f32(void *dst, enum dtype dst_dt, const void *src, enum dtype src_dt, size_t n,
                            enum dtype_simd level)
{
    const convert_fn widen = pick_convert(DTYPE_F32, src_dt, level);
    const convert_fn narrow = pick_convert(dst_dt, DTYPE_F32, level);
    float wide[512];
    for (size_t i = 0; i < n; i += 512) {
        const size_t len = n - i < 512 ? n - i : 512;
        widen(wide, (const uint16_t *)src + i, len);
        narrow((uint16_t *)dst + i, wide, len);
    }
}

void dtype_convert_simd(void *dst, enum dtype dst_dt, const void *src, enum dtype src_dt, size_t n,
                        enum dtype_simd level)
{
    level = usable_level(level);
    const size_t dst_size = (size_t)dtype_size(dst_dt), src_size = (size_t)dtype_size(src_dt);
    const size_t n_blocks = (n + DTYPE_BLOCK - 1) / DTYPE_BLOCK;
    const int same = dst_dt == src_dt, direct = dst_dt == DTYPE_F32 || src_dt == DTYPE_F32;
    const convert_fn kernel = !same && direct ? pick_convert(dst_dt, src_dt, level) : NULL;
#pragma omp parallel for schedule(static) if (n >= DTYPE_PARALLEL_MIN)
    for (size_t b = 0; b < n_blocks; b++) {
        const size_t i = b * DTYPE_BLOCK;
        const size_t len = n - i < DTYPE_BLOCK ? n - i : DTYPE_BLOCK;
        char *d = (char *)dst + i * dst_size;
        const char *s = (const char *)src + i * src_size;
        if (same)
            memcpy(d, s, len * dst_size);
        else if (kernel)
            kernel(d, s, len);
        else
            convert_via_f32(d, dst_dt, s, src_dt, len, level);
    }
}

void dtype_convert(void *dst, enum dtype dst_dt, const void *src, enum dtype src_dt, size_t n)
{
    dtype_convert_simd(dst, dst_dt, src, src_dt, n, dtype_simd_best());
}

void dtype_add_to_f32_simd(float *acc, const void *src, enum dtype dt, size_t n, enum dtype_simd level)
{
    const add_fn kernel = pick_add(dt, usable_level(level));
    const size_t src_size = (size_t)dtype_size(dt);
    const size_t n_blocks = (n + DTYPE_BLOCK - 1) / DTYPE_BLOCK;
#pragma omp parallel for schedule(static) if (n >= DTYPE_PARALLEL_MIN)
    for (size_t b = 0; b < n_blocks; b++) {
        const size_t i = b * DTYPE_BLOCK;
        const size_t len = n - i < DTYPE_BLOCK ? n - i : DTYPE_BLOCK;
        kernel(acc + i, (const char *)src + i * src_size, len);
    }
}

void dtype_add_to_f32(float *acc, const void *src, enum dtype dt, size_t n)
{
    dtype_add_to_f32_simd(acc, src, dt, n, dtype_simd_best());
}

/* The exponent field all ones means inf or NaN; the loops are plain C
 * reductions that the compiler vectorises. */
int dtype_all_finite(const void *x, enum dtype dt, size_t n)
{
    unsigned non_finite = 0;
    if (dt == DTYPE_F32) {
        const uint32_t *u = x;
#pragma omp parallel for schedule(static) reduction(| : non_finite) if (n >= DTYPE_PARALLEL_MIN)
        for (size_t i = 0; i < n; i++)
            non_finite |= (u[i] & 0x7f800000u) == 0x7f800000u;
    } else {
        const uint16_t *h = x;
        const uint16_t exp_mask = dt == DTYPE_F16 ? 0x7c00u : 0x7f80u;
#pragma omp parallel for schedule(static) reduction(| : non_finite) if (n >= DTYPE_PARALLEL_MIN)
        for (size_t i = 0; i < n; i++)
            non_finite |= (h[i] & exp_mask) == exp_mask;
    }
    return !non_finite;
}

const char *dtype_name(enum dtype dt)
{
    switch (dt) {
    case DTYPE_F32: return "fp32";
    case DTYPE_F16: return "fp16";
    case DTYPE_BF16: return "bf16";
    }
    return "?";
}

int dtype_size(enum dtype dt)
{
    switch (dt) {
    case DTYPE_F32: return 4;
    case DTYPE_F16: return 2;
    case DTYPE_BF16: return 2;
    }
    return 0;
}
