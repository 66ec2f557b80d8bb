/* cudaemu: __nv_bfloat16 as 16 bits, conversions rounding to nearest even (tests/cudaemu). */
#ifndef CUDAEMU_BF16_H
#define CUDAEMU_BF16_H
#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 {
    uint16_t __x;
};

/* As CUDA's __float2bfloat16_rn: NaN becomes the canonical 0x7FFF. */
static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 b;
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
        b.__x = 0x7FFF;
        return b;
    }
    b.__x = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    return b;
}

static inline float __bfloat162float(__nv_bfloat16 b)
{
    uint32_t u = (uint32_t)b.__x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
#endif
