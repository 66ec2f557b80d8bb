/*
 * fastmath — exp and tanh in plain float arithmetic, so that the compiler can
 * vectorise the loops that call them (glibc's expf/tanhf are scalar calls and
 * took a fifth of a training step in the GELU and softmax loops).
 *
 * fast_expf: Cody–Waite reduction x = k ln2 + r, |r| <= ln2/2, a degree-7
 * Taylor polynomial for e^r (truncation error below 6e-9 relative), and 2^k
 * put into the exponent bits. Within 2 ulp of expf over [-87, 88]; inputs
 * are clamped to [-87.3, 88.7] (no branch, so loops vectorise): below, the
 * result stays near 1e-38, which does not change a softmax sum that contains 1.
 * fast_tanhf: 1 - 2 / (e^{2x} + 1), odd-extended; absolute error < 3e-7,
 * which is what GELU's 0.5 x (1 + tanh) needs.
 *
 * The double-precision gradient check (tests/unit/test_gradcheck.c) maps both
 * to libm's exp and tanh.
 */
#ifndef SHARDLM_FASTMATH_H
#define SHARDLM_FASTMATH_H

#include <stdint.h>
#include <string.h>

static inline float fast_expf(float x)
{
    const float log2e = 1.44269504088896341f;
    const float ln2_hi = 0.693145751953125f;     /* ln 2 split so k * ln2_hi is exact */
    const float ln2_lo = 1.428606765330187045e-6f;
    x = x < -87.3f ? -87.3f : x;
    x = x > 88.7f ? 88.7f : x;
    /* k = round(x / ln2) by the 1.5 * 2^23 trick: vectorises, unlike rintf */
    const float round_magic = 12582912.0f;
    float k = (x * log2e + round_magic) - round_magic;
    float r = x - k * ln2_hi - k * ln2_lo;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits;
    memcpy(&bits, &p, sizeof bits);
    bits += (int32_t)k * (1 << 23);
    memcpy(&p, &bits, sizeof p);
    return p;
}

static inline float fast_tanhf(float x)
{
    float ax = x < 0.0f ? -x : x;
    float t = 1.0f - 2.0f / (fast_expf(2.0f * ax) + 1.0f);
    return x < 0.0f ? -t : t;
}

#endif
