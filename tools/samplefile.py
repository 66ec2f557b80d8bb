"""Writes shardlm sample files (the layout of tools/prepare_data.py, src/samples.h) from arrays: for the tests
and benchmarks that make their own samples without a tokenizer."""
import h5py
import numpy as np


def set_str(f, name, value):
    """A scalar fixed-length NUL-terminated string attribute, as the trainer reads it."""
    data = value.encode() + b"\0"
    t = h5py.h5t.C_S1.copy()
    t.set_size(len(data))
    t.set_strpad(h5py.h5t.STR_NULLTERM)
    a = h5py.h5a.create(f.id, name.encode(), t, h5py.h5s.create(h5py.h5s.SCALAR))
    a.write(np.array(data, dtype=f"S{len(data)}"), mtype=t)


def write(path, tokens, trained, offsets, vocab_size):
    """tokens (int), trained (0/1) concatenated; offsets: n_samples + 1 starts."""
    with h5py.File(path, "w") as f:
        f["tokens"] = np.asarray(tokens, np.int32)
        f["trained"] = np.asarray(trained, np.uint8)
        f["offsets"] = np.asarray(offsets, np.int64)
        set_str(f, "format", "shardlm-samples")
        for k, v in (("version", 1), ("vocab_size", vocab_size), ("pad_token_id", -1), ("eos_token_id", -1),
                     ("n_samples", len(offsets) - 1)):
            f.attrs.create(k, np.int64(v))
    return path
