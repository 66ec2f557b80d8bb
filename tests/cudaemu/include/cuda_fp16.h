/* cudaemu: __half as 16 bits, conversions rounding to nearest even (tests/cudaemu). */
#ifndef CUDAEMU_FP16_H
#define CUDAEMU_FP16_H
#include <stdint.h>
#include <string.h>

struct __half {
    uint16_t __x;
};

/* IEEE binary16, round to nearest even, overflow to inf, subnormals kept, NaN stays NaN. */
static inline __half __float2half_rn(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, exp = (u >> 23) & 0xFFu, man = u & 0x7FFFFFu;
    __half h;
    if (exp == 0xFF) {
        h.__x = (uint16_t)(sign | 0x7C00u | (man ? 0x200u | (man >> 13) : 0u));
        return h;
    }
    int e = (int)exp - 127 + 15;
    if (e >= 31) {
        h.__x = (uint16_t)(sign | 0x7C00u);
        return h;
    }
    if (e <= 0) { /* subnormal half (or zero): shift the full significand */
        if (e < -10) {
            h.__x = (uint16_t)sign;
            return h;
        }
        uint32_t full = man | 0x800000u;
        int shift = 14 - e; /* 24-bit significand down to the subnormal's 10 bits */
        uint32_t q = full >> shift, rem = full & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        h.__x = (uint16_t)(sign | q);
        return h;
    }
    uint32_t q = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1)))
        q++; /* a carry into the exponent is right, up to inf */
    h.__x = (uint16_t)(sign | q);
    return h;
}

static inline float __half2float(__half h)
{
    uint32_t sign = (uint32_t)(h.__x & 0x8000u) << 16, exp = (h.__x >> 10) & 0x1Fu, man = h.__x & 0x3FFu, u;
    if (exp == 0x1F)
        u = sign | 0x7F800000u | (man << 13);
    else if (exp)
        u = sign | ((exp - 15 + 127) << 23) | (man << 13);
    else if (!man)
        u = sign;
    else { /* subnormal: normalise */
        int e = -14;
        while (!(man & 0x400u))
            man <<= 1, e--;
        u = sign | ((uint32_t)(e + 127) << 23) | ((man & 0x3FFu) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}
#endif
