/*
 * test_crc32c — CRC-32C against published check values (RFC 3720 B.4 and the
 * "123456789" check value of the CRC catalogue), the SSE4.2 form against the
 * table form on every length and alignment up to 300 bytes and a 10 MB
 * buffer, and extending in parts against one pass.
 */
#include "check.h"
#include "core/crc32c.h"

#include <stdlib.h>
#include <string.h>

static void test_known_values(void)
{
    CHECK("check_value_123456789", crc32c_extend(0, "123456789", 9) == 0xE3069283u, "got %08x",
          crc32c_extend(0, "123456789", 9));
    unsigned char buf[32];
    memset(buf, 0, sizeof buf);
    CHECK("rfc3720_32_zeros", crc32c_extend(0, buf, 32) == 0x8A9136AAu, "got %08x", crc32c_extend(0, buf, 32));
    memset(buf, 0xFF, sizeof buf);
    CHECK("rfc3720_32_ones", crc32c_extend(0, buf, 32) == 0x62A8AB43u, "got %08x", crc32c_extend(0, buf, 32));
    for (int i = 0; i < 32; i++)
        buf[i] = (unsigned char)i;
    CHECK("rfc3720_32_incrementing", crc32c_extend(0, buf, 32) == 0x46DD794Eu, "got %08x",
          crc32c_extend(0, buf, 32));
    for (int i = 0; i < 32; i++)
        buf[i] = (unsigned char)(31 - i);
    CHECK("rfc3720_32_decrementing", crc32c_extend(0, buf, 32) == 0x113FDB5Cu, "got %08x",
          crc32c_extend(0, buf, 32));
    CHECK("empty_is_zero", crc32c_extend(0, buf, 0) == 0 && crc32c_extend_portable(0, buf, 0) == 0, "not 0");
    CHECK("portable_check_value", crc32c_extend_portable(0, "123456789", 9) == 0xE3069283u, "got %08x",
          crc32c_extend_portable(0, "123456789", 9));
}

static void test_forms_agree(void)
{
    enum { BIG = 10 * 1000 * 1000 + 3 };
    unsigned char *buf = malloc(BIG);
    uint64_t s = 0x9E3779B97F4A7C15u;
    for (size_t i = 0; i < BIG; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        buf[i] = (unsigned char)s;
    }
    int bad = 0;
    for (size_t offset = 0; offset < 8; offset++)
        for (size_t n = 0; n <= 300; n++)
            bad += crc32c_extend(0, buf + offset, n) != crc32c_extend_portable(0, buf + offset, n);
    CHECK("sse_and_table_agree_small", bad == 0, "%d of 2408 lengths/alignments differ", bad);
    uint32_t whole = crc32c_extend(0, buf, BIG);
    CHECK("sse_and_table_agree_10MB", whole == crc32c_extend_portable(0, buf, BIG), "differ");
    int split_bad = 0;
    for (size_t cut = 0; cut < BIG; cut += 999983)
        split_bad += crc32c_extend(crc32c_extend(0, buf, cut), buf + cut, BIG - cut) != whole;
    CHECK("extend_in_parts", split_bad == 0, "%d splits differ from one pass", split_bad);
    buf[BIG / 2] ^= 1;
    CHECK("one_bit_changes_it", crc32c_extend(0, buf, BIG) != whole, "a flipped bit kept the CRC");
    free(buf);
}

int main(void)
{
    test_known_values();
    test_forms_agree();
    return check_status();
}
