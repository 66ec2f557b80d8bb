/*
 * CPU backend, memory side: the three memory spaces are host memory, except
 * under SHARDLM_EMULATE_DEVICE=1, where device memory is emulated (devemu.h)
 * so that the engine's device paths run, and fault on any host access to
 * device memory, without a GPU.
 */

#include "backend/backend.h"

#include <stdlib.h>
#include <string.h>

#include "core/adamw.h"
#include "core/devemu.h"
#include "core/dtype.h"
#include "core/util.h"

int backend_is_device(void) { return devemu_enabled(); }

void *backend_mem_alloc(enum mem_space space, size_t bytes, const char *what)
{
    void *p = NULL;
    if (space == SPACE_DEVICE && devemu_enabled())
        p = devemu_alloc(bytes);
    else if (posix_memalign(&p, 4096, round_up(bytes ? bytes : 1, 4096)) == 0)
        memset(p, 0, round_up(bytes ? bytes : 1, 4096));
    else
        p = NULL;
    if (!p) {
        char b[32];
        fail_input("out of %s memory allocating %s for %s; shrink the plan (`shardlm plan` shows it)",
                   mem_space_name(space), format_bytes((double)bytes, b, sizeof b), what);
    }
    return p;
}

void backend_mem_free(enum mem_space space, void *p, size_t bytes)
{
    if (space == SPACE_DEVICE && devemu_enabled())
        devemu_free(p);
    else
        free(p);
}

/* Emulated devices have the capacity SHARDLM_EMULATE_DEVICE_MEM (bytes), so
 * that the check of the plan against a GPU's free memory is tested too. */
int backend_mem_info(size_t *free_bytes, size_t *total_bytes)
{
    const char *cap = getenv("SHARDLM_EMULATE_DEVICE_MEM");
    *free_bytes = *total_bytes = 0;
    if (!devemu_enabled() || !cap || !*cap)
        return 0;
    *total_bytes = (size_t)strtoull(cap, NULL, 10);
    size_t used = devemu_allocated();
    *free_bytes = used < *total_bytes ? *total_bytes - used : 0;
    return 1;
}

double backend_sum_squares_multi(const float *const *x, const size_t *n, int count)
{
    double sum = 0.0;
    for (int k = 0; k < count; k++)
        sum += backend_sum_squares(x[k], n[k]);
    return sum;
}

void backend_adamw(const struct adamw_range *r, int count, const struct adamw_hparams *hp, enum dtype out_dtype)
{
    struct adamw_hparams h = *hp;
    for (int k = 0; k < count; k++) {
        float *p = r[k].param, *m = r[k].m, *v = r[k].v;
        const float *g = r[k].grad;
        void *out = r[k].param_out;
        DEVEMU_VIEW(p);
        DEVEMU_VIEW(m);
        DEVEMU_VIEW(v);
        DEVEMU_VIEW(g);
        if (out)
            DEVEMU_VIEW(out);
        h.weight_decay = r[k].weight_decay;
        adamw_update(p, m, v, g, r[k].n, &h, out, out_dtype);
    }
}

size_t backend_library_workspace(void) { return 0; }

void backend_set_library_workspace(void *p, size_t bytes)
{
    (void)p;
    (void)bytes;
}

void backend_convert(void *dst, enum dtype dst_dt, const void *src, enum dtype src_dt, size_t n)
{
    dtype_convert(devemu_host(dst), dst_dt, devemu_host(src), src_dt, n);
}

void backend_add_to_f32(float *acc, const void *src, enum dtype dt, size_t n)
{
    dtype_add_to_f32(devemu_host(acc), devemu_host(src), dt, n);
}

void backend_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        memcpy(devemu_host(dst), devemu_host(src), bytes);
}

void backend_copy_async(void *dst, const void *src, size_t bytes) { backend_copy(dst, src, bytes); }

void backend_synchronize(void) {}

void backend_attach_comm(struct comm *c) { (void)c; }
