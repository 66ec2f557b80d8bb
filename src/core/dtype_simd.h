/*
 * dtype_simd — vector helpers shared by dtype.c and adamw.c on x86: the
 * target attributes of the two SIMD levels and bf16 rounding on 8 and 16
 * lanes, bit for bit the scalar f32_to_bf16() of dtype.h (round to nearest
 * even, NaN kept quiet; no vcvtneps2bf16, which flushes subnormals).
 *
 * Internal: include only from .c files that dispatch on dtype_simd_best().
 */
#ifndef SHARDLM_DTYPE_SIMD_H
#define SHARDLM_DTYPE_SIMD_H

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TARGET_AVX512 __attribute__((target("avx512f")))

/* f32_to_bf16() on 8 lanes, 32-bit results in the low halves. */
TARGET_AVX2 static inline __m256i bf16_round_avx2(__m256 f)
{
    const __m256i x = _mm256_castps_si256(f);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                              _mm256_set1_epi32(0x7f800000));
    return _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
}

/* f32_to_bf16() on 16 lanes, narrowed to 16 bits. */
TARGET_AVX512 static inline __m256i bf16_round_avx512(__m512 f)
{
    const __m512i x = _mm512_castps_si512(f);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
    const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                                     _mm512_set1_epi32(0x7f800000));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, quiet_nan));
}

#endif
#endif
