/*
 * dtype — conversions between fp32 and the 16-bit parameter dtypes (fp16,
 * bf16), scalar and bulk.
 *
 * Every conversion rounds to nearest, ties to even, as the hardware does:
 *   fp32 -> fp16: subnormal results are kept (not flushed); values whose
 *                 rounded magnitude exceeds 65504 become inf; NaN stays NaN,
 *                 made quiet, with the top 10 payload bits kept (VCVTPS2PH).
 *   fp32 -> bf16: subnormals kept; values that round past 0x7f7f become inf;
 *                 NaN stays NaN, made quiet, top 7 payload bits kept.
 *   fp16/bf16 -> fp32: exact (every value is representable); a signalling
 *                 NaN comes out quiet (VCVTPH2PS does the same).
 * No function reads or changes MXCSR, so DAZ/FTZ set by someone else do not
 * change a result either.
 *
 * The scalar conversions are static inline here because loops elsewhere call
 * them per element. The bulk functions (dtype_convert, dtype_add_to_f32,
 * dtype_all_finite) run OpenMP over the range and pick, at run time, the
 * widest SIMD the CPU has (AVX-512F, else AVX2+FMA+F16C, else scalar); every
 * level gives the same bits as the scalar code (tests/unit/test_dtype.c
 * checks it). The *_simd variants take the level explicitly, for tests and
 * benchmarks.
 *
 * The module owns no state beyond the cached CPU feature check.
 */
#ifndef SHARDLM_DTYPE_H
#define SHARDLM_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>


/* The parameter and activation dtypes. */
enum dtype { DTYPE_F32 = 0, DTYPE_F16 = 1, DTYPE_BF16 = 2 };

const char *dtype_name(enum dtype dt);
int dtype_size(enum dtype dt);

/* SIMD levels of the bulk kernels (here and in adamw), lowest first. */
enum dtype_simd {
    DTYPE_SIMD_SCALAR = 0,
    DTYPE_SIMD_AVX2 = 1,   /* AVX2 + FMA + F16C */
    DTYPE_SIMD_AVX512 = 2, /* AVX-512F */
};

/* The widest level this CPU runs (checked once, then cached). */
enum dtype_simd dtype_simd_best(void);
/* Whether this CPU can run the level. */
int dtype_simd_available(enum dtype_simd level);
const char *dtype_simd_name(enum dtype_simd level);

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* fp32 -> fp16, round to nearest even (integer arithmetic only). */
static inline uint16_t f32_to_f16(float f)
{
    const uint32_t x = f32_bits(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t a = x & 0x7fffffffu;
    if (a >= 0x47800000u) {            /* |f| >= 2^16, inf or NaN */
        if (a > 0x7f800000u)           /* NaN: quiet, top payload bits kept */
            return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
        return (uint16_t)(sign | 0x7c00u);
    }
    if (a < 0x38800000u) {             /* |f| < 2^-14: fp16 subnormal or zero */
        const uint32_t shift = 126u - (a >> 23); /* value = mant >> shift, in units of 2^-24 */
        if (shift > 24u)               /* below half the smallest subnormal (2^-25) */
            return sign;
        const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
        const uint32_t half = 1u << (shift - 1);
        const uint32_t rest = mant & ((half << 1) - 1);
        uint32_t q = mant >> shift;
        q += rest > half || (rest == half && (q & 1u)); /* may carry into the smallest normal */
        return (uint16_t)(sign | q);
    }
    /* Normal: rebias the exponent, round the 13 dropped bits to even; a carry
     * out of the mantissa bumps the exponent, up to 0x7c00 (inf) past 65504. */
    const uint32_t rebiased = a - ((127u - 15u) << 23);
    return (uint16_t)(sign | ((rebiased + 0xfffu + ((rebiased >> 13) & 1u)) >> 13));
}

/* fp16 -> fp32, exact; signalling NaN made quiet. */
static inline float f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t mant = h & 0x3ffu;
    if (exp == 0x1fu) /* inf, or NaN with the quiet bit set */
        return f32_from_bits(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u));
    if (exp == 0) {
        if (mant == 0)
            return f32_from_bits(sign);
        /* Subnormal: mant * 2^-24, exact in fp32; normalise by the leading bit. */
        const int lead = 31 - __builtin_clz(mant); /* 0..9 */
        const uint32_t frac = (mant << (23 - lead)) & 0x7fffffu;
        return f32_from_bits(sign | ((uint32_t)(lead + 127 - 24) << 23) | frac);
    }
    return f32_from_bits(sign | ((exp + 127u - 15u) << 23) | (mant << 13));
}

/* fp32 -> bf16, round to nearest even. Branch-free so that loops vectorise. */
static inline uint16_t f32_to_bf16(float f)
{
    const uint32_t x = f32_bits(f);
    const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (x >> 16) | 0x40u;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

/* bf16 -> fp32, exact; signalling NaN made quiet. */
static inline float bf16_to_f32(uint16_t b)
{
    const uint32_t x = (uint32_t)b << 16;
    return f32_from_bits((x & 0x7fffffffu) > 0x7f800000u ? x | 0x400000u : x);
}

/*
 * dst[i] = src[i] converted, i < n. Any pair of dtypes; the same dtype copies.
 * dst and src must not overlap.
 */
void dtype_convert(void *dst, enum dtype dst_dt, const void *src, enum dtype src_dt, size_t n);
void dtype_convert_simd(void *dst, enum dtype dst_dt, const void *src, enum dtype src_dt, size_t n,
                        enum dtype_simd level);

/* acc[i] += (float)src[i], i < n (one fp32 rounding per element). */
void dtype_add_to_f32(float *acc, const void *src, enum dtype dt, size_t n);
void dtype_add_to_f32_simd(float *acc, const void *src, enum dtype dt, size_t n, enum dtype_simd level);

/* 1 when no element is inf or NaN, else 0. */
int dtype_all_finite(const void *x, enum dtype dt, size_t n);

#endif
