/*
 * ckpt_tools — checkpoint utilities of the command line: `shardlm inspect`
 * (summary plus a full read of every dataset, which verifies every CRC-32C
 * checksum) and `shardlm export` (the fp32 master weights, under their Hugging
 * Face names and full shapes, converted to fp32/fp16/bf16 and written as
 * safetensors or as a plain HDF5 file).
 *
 * Both run as one process (they call comm_init/comm_finalize themselves,
 * since the checkpoint reader goes through HDF5's MPI-IO driver) and read
 * the checkpoint only through ckpt.h's reader API. Exit status as everywhere:
 * 0 done, 2 bad input (arguments, a missing or corrupted checkpoint).
 */
#ifndef SHARDLM_CKPT_TOOLS_H
#define SHARDLM_CKPT_TOOLS_H

/* argv[0] is the command name ("inspect", "export"); return the exit status. */
int cmd_inspect(int argc, char **argv);
int cmd_export(int argc, char **argv);

#endif
