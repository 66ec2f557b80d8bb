#include "dump.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "util.h"

#define DUMP_MAGIC "SLMDUMP1"

static void write_all(FILE *f, const void *p, size_t n)
{
    if (n && fwrite(p, 1, n, f) != n)
        fail_input("writing a dump file: %s", strerror(errno));
}

FILE *dump_open(const char *path)
{
    FILE *f = xfopen(path, "wb", "dump file");
    write_all(f, DUMP_MAGIC, 8);
    return f;
}

void dump_tensor(FILE *f, const char *name, int ndim, const size_t *dims, const float *data)
{
    uint32_t len = (uint32_t)strlen(name), nd = (uint32_t)ndim;
    size_t numel = 1;
    write_all(f, &len, sizeof len);
    write_all(f, name, len);
    write_all(f, &nd, sizeof nd);
    for (int i = 0; i < ndim; i++) {
        uint64_t d = dims[i];
        write_all(f, &d, sizeof d);
        numel *= dims[i];
    }
    write_all(f, data, numel * sizeof(float));
}

void dump_close(FILE *f, const char *path)
{
    if (fclose(f) != 0)
        fail_input("closing dump file '%s': %s", path, strerror(errno));
}
