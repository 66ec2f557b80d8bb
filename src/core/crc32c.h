/*
 * crc32c — CRC-32C (Castagnoli, polynomial 0x1EDC6F41, reflected; the CRC of
 * iSCSI, ext4 and Btrfs), the checksum the checkpoint layer stores for every
 * piece of every dataset (ckpt.h).
 *
 * Debian 12 packages no CRC-32C library for C, so this is the standard
 * algorithm in its two usual forms: the SSE4.2 crc32 instruction, 8 bytes at
 * a time (about 8 GB/s on one core, chosen at run time when the CPU has it),
 * and a byte-wise table otherwise. Both give the same value; tests check them
 * against each other, against the published check value of "123456789"
 * (0xE3069283) and against Python's crc32c package on real checkpoint files.
 *
 * crc32c_extend(0, data, n) is the CRC of data; crc32c_extend(crc32c_extend(0,
 * a, na), b, nb) is the CRC of a followed by b (the usual pre- and
 * post-inversion is inside), so a piece can be checksummed in parts.
 */
#ifndef SHARDLM_CRC32C_H
#define SHARDLM_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t crc32c_extend(uint32_t crc, const void *data, size_t n);

/* The table form, whatever the CPU has (for tests). */
uint32_t crc32c_extend_portable(uint32_t crc, const void *data, size_t n);

#endif
