"""Writes shardlm's data files from arrays, for the tests and benchmarks that make their own data: llm.c token
shards (.bin, src/data/data.h) and sample files (the layout of tools/prepare_data.py, src/data/samples.h) without a
tokenizer."""
import numpy as np


def write_shard(path, tokens):
    """An llm.c uint16 token shard: 256 int32 header (magic, version 1, count), tokens."""
    header = np.zeros(256, dtype="<i4")
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def set_str(f, name, value):
    """A scalar fixed-length NUL-terminated string attribute, as the trainer reads it."""
    import h5py  # only the sample files need it
    data = value.encode() + b"\0"
    t = h5py.h5t.C_S1.copy()
    t.set_size(len(data))
    t.set_strpad(h5py.h5t.STR_NULLTERM)
    a = h5py.h5a.create(f.id, name.encode(), t, h5py.h5s.create(h5py.h5s.SCALAR))
    a.write(np.array(data, dtype=f"S{len(data)}"), mtype=t)


def write_samples(path, tokens, trained, offsets, vocab_size):
    """tokens (int), trained (0/1) concatenated; offsets: n_samples + 1 starts."""
    import h5py
    with h5py.File(path, "w") as f:
        f["tokens"] = np.asarray(tokens, np.int32)
        f["trained"] = np.asarray(trained, np.uint8)
        f["offsets"] = np.asarray(offsets, np.int64)
        set_str(f, "format", "shardlm-samples")
        for k, v in (("version", 1), ("vocab_size", vocab_size), ("pad_token_id", -1), ("eos_token_id", -1),
                     ("n_samples", len(offsets) - 1)):
            f.attrs.create(k, np.int64(v))
    return path
