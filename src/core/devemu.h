/*
 * devemu — device memory emulated on the host, for testing the engine's
 * device paths without a GPU (SHARDLM_EMULATE_DEVICE=1, see backend.h).
 *
 * Each emulated device allocation is one memory file mapped twice: the address
 * handed to the engine is a PROT_NONE view, so host code that reads or writes
 * device memory faults at once; the other view is read-write, and the CPU
 * backend's kernels and the MPI collectives (the emulated NCCL) translate
 * device addresses into it with devemu_host before touching them.
 *
 * Owns the mappings. Knows nothing about the engine.
 */
#ifndef SHARDLM_DEVEMU_H
#define SHARDLM_DEVEMU_H

#include <stddef.h>

/* Whether SHARDLM_EMULATE_DEVICE=1 (read once). */
int devemu_enabled(void);
/* A zeroed emulated device allocation; NULL when the host is out of memory. */
void *devemu_alloc(size_t bytes);
void devemu_free(void *p);
/* Bytes of emulated device memory allocated now. */
size_t devemu_allocated(void);
/* The read-write view of p when p lies in emulated device memory, else p. */
void *devemu_host(const void *p);

/* Translates a pointer argument in place, keeping its type. */
#define DEVEMU_VIEW(p) ((p) = (__typeof__(p))devemu_host(p))

#endif
