/*
 * dump — a small self-describing tensor file for tests and debugging
 * (tools/dumpfile.py reads it with numpy).
 *
 *   "SLMDUMP1" then records: u32 name length, name bytes, u32 ndim,
 *   ndim x u64 dims, float32 data (little-endian), until the end of the file.
 */
#ifndef SHARDLM_DUMP_H
#define SHARDLM_DUMP_H

#include <stddef.h>
#include <stdio.h>

FILE *dump_open(const char *path);
void dump_tensor(FILE *f, const char *name, int ndim, const size_t *dims, const float *data);
void dump_close(FILE *f, const char *path);

#endif
