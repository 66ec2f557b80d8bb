#define _GNU_SOURCE
#include "devemu.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define DEVEMU_MAX_REGIONS 64

struct region {
    char *device; /* PROT_NONE view: the address the engine holds */
    char *host;   /* read-write view of the same pages */
    size_t bytes;
};

/* Written under the lock, read without it: an entry is filled before the
 * count that publishes it is raised, and kernels only look up addresses the
 * engine got from devemu_alloc earlier. */
static struct region g_regions[DEVEMU_MAX_REGIONS];
static volatile int g_count;
static size_t g_allocated;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

int devemu_enabled(void)
{
    static int enabled = -1;
    if (enabled < 0) {
        const char *e = getenv("SHARDLM_EMULATE_DEVICE");
        enabled = e && strcmp(e, "1") == 0;
    }
    return enabled;
}

void *devemu_alloc(size_t bytes)
{
    if (bytes == 0)
        bytes = 1;
    int fd = memfd_create("shardlm-devemu", MFD_CLOEXEC);
    if (fd < 0)
        return NULL;
    void *device = MAP_FAILED, *host = MAP_FAILED;
    if (ftruncate(fd, (off_t)bytes) == 0) {
        device = mmap(NULL, bytes, PROT_NONE, MAP_SHARED, fd, 0);
        host = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    close(fd);
    pthread_mutex_lock(&g_lock);
    int slot = -1;
    for (int i = 0; i < g_count; i++)
        if (!g_regions[i].device)
            slot = i;
    if (slot < 0 && g_count < DEVEMU_MAX_REGIONS)
        slot = g_count;
    if (device == MAP_FAILED || host == MAP_FAILED || slot < 0) {
        pthread_mutex_unlock(&g_lock);
        if (device != MAP_FAILED)
            munmap(device, bytes);
        if (host != MAP_FAILED)
            munmap(host, bytes);
        return NULL;
    }
    g_regions[slot].host = host;
    g_regions[slot].bytes = bytes;
    __atomic_store_n(&g_regions[slot].device, (char *)device, __ATOMIC_RELEASE);
    if (slot == g_count)
        __atomic_store_n(&g_count, g_count + 1, __ATOMIC_RELEASE);
    g_allocated += bytes;
    pthread_mutex_unlock(&g_lock);
    return device;
}

void devemu_free(void *p)
{
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_count; i++)
        if (g_regions[i].device == p) {
            munmap(g_regions[i].device, g_regions[i].bytes);
            munmap(g_regions[i].host, g_regions[i].bytes);
            g_allocated -= g_regions[i].bytes;
            memset(&g_regions[i], 0, sizeof g_regions[i]);
        }
    pthread_mutex_unlock(&g_lock);
}

size_t devemu_allocated(void)
{
    pthread_mutex_lock(&g_lock);
    size_t n = g_allocated;
    pthread_mutex_unlock(&g_lock);
    return n;
}

void *devemu_host(const void *p)
{
    int n = __atomic_load_n(&g_count, __ATOMIC_ACQUIRE);
    uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < n; i++) {
        const struct region *r = &g_regions[i];
        uintptr_t d = (uintptr_t)__atomic_load_n(&r->device, __ATOMIC_ACQUIRE);
        if (d && a >= d && a < d + r->bytes)
            return r->host + (a - d);
    }
    return (void *)p;
}
