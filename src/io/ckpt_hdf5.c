/*
 * ckpt_hdf5 — what the checkpoint writer and reader share about HDF5 and MPI
 * (see ckpt_internal.h): HDF5's own stack printing is turned off and its
 * innermost messages are folded into our one-line errors instead (so a
 * corrupted chunk reads "... data error detected by Fletcher32 checksum").
 */
#include "ckpt_internal.h"
#include "core/util.h"

#include <mpi.h>
#include <stdio.h>
#include <string.h>

/* Keeps the two innermost distinct descriptions of the error stack. */
static herr_t collect_error(unsigned n, const H5E_error2_t *err, void *data)
{
    struct hdf5_why *why = data;
    if (why->taken >= 2 || !err->desc || !err->desc[0] || strstr(why->text, err->desc))
        return 0;
    size_t len = strlen(why->text);
    snprintf(why->text + len, sizeof why->text - len, "%s%s", why->taken ? "; " : "", err->desc);
    why->taken++;
    return 0;
}

const char *ckpt_hdf5_error(struct hdf5_why *why)
{
    why->text[0] = 0;
    why->taken = 0;
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_error, why);
    H5Eclear2(H5E_DEFAULT);
    if (!why->text[0])
        snprintf(why->text, sizeof why->text, "unknown HDF5 error");
    return why->text;
}

void ckpt_quiet_hdf5(void)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

void ckpt_require_mpi(const char *what)
{
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (!initialised)
        fail_internal("%s: MPI is not initialised (the checkpoint layer writes through MPI-IO)", what);
}

