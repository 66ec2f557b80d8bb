"""Reads shardlm's dump files (src/core/dump.h) into a dict of numpy arrays.

    "SLMDUMP1", then records: u32 name length, name, u32 ndim, ndim x u64
    dims, float32 data (little-endian).
"""
import struct
import sys

import numpy as np


def read_dump(path):
    tensors = {}
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"SLMDUMP1":
        raise ValueError(f"{path}: not a shardlm dump file")
    pos = 8
    while pos < len(data):
        (name_len,) = struct.unpack_from("<I", data, pos)
        pos += 4
        name = data[pos:pos + name_len].decode()
        pos += name_len
        (ndim,) = struct.unpack_from("<I", data, pos)
        pos += 4
        dims = struct.unpack_from(f"<{ndim}Q", data, pos)
        pos += 8 * ndim
        count = int(np.prod(dims)) if ndim else 1
        arr = np.frombuffer(data, dtype="<f4", count=count, offset=pos).reshape(dims)
        pos += 4 * count
        tensors[name] = arr.copy()
    return tensors


if __name__ == "__main__":
    for name, arr in read_dump(sys.argv[1]).items():
        print(f"{name:40s} {str(arr.shape):20s} mean {arr.mean():+.6e} std {arr.std():.6e}")
