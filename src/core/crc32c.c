/* crc32c — see crc32c.h. */
#include "crc32c.h"

#include <stdbool.h>
#include <string.h>

#define CRC32C_POLY_REFLECTED 0x82F63B78u /* 0x1EDC6F41 bit-reversed */

static uint32_t g_table[256];
static bool g_have_table;

static void build_table(void)
{
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ CRC32C_POLY_REFLECTED : c >> 1;
        g_table[b] = c;
    }
    g_have_table = true;
}

uint32_t crc32c_extend_portable(uint32_t crc, const void *data, size_t n)
{
    if (!g_have_table)
        build_table(); /* idempotent: a race writes the same values */
    const unsigned char *p = data;
    uint32_t c = ~crc;
    while (n--)
        c = (c >> 8) ^ g_table[(c ^ *p++) & 0xFF];
    return ~c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc32c_extend_sse42(uint32_t crc, const void *data, size_t n)
{
    const unsigned char *p = data;
    uint64_t c = ~crc;
    for (; n > 0 && ((uintptr_t)p & 7); n--)
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t word;
        memcpy(&word, p, sizeof word);
        c = __builtin_ia32_crc32di(c, word);
    }
    for (; n > 0; n--)
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
#endif

uint32_t crc32c_extend(uint32_t crc, const void *data, size_t n)
{
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2"))
        return crc32c_extend_sse42(crc, data, n);
#endif
    return crc32c_extend_portable(crc, data, n);
}
