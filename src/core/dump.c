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

/* Written to PATH.tmp and renamed over PATH by dump_close: a failed write
 * leaves PATH as it was. */
static void tmp_name(const char *path, char *buf, size_t n)
{
    if (snprintf(buf, n, "%s.tmp", path) >= (int)n)
        fail_input("dump file path is too long: '%s'", path);
}

FILE *dump_open(const char *path)
{
    char tmp[4096];
    tmp_name(path, tmp, sizeof tmp);
    FILE *f = xfopen(tmp, "wb", "dump file");
    util_remove_on_failure(tmp);
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
    char tmp[4096];
    tmp_name(path, tmp, sizeof tmp);
    if (fclose(f) != 0)
        fail_input("closing dump file '%s': %s", tmp, strerror(errno));
    if (rename(tmp, path) != 0)
        fail_input("cannot rename dump file '%s' to '%s': %s", tmp, path, strerror(errno));
    util_keep_file(tmp);
}
