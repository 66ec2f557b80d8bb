"""Rough edges of issue 32's fault sweep beside tests/t_faults_hf.py (which checks a NaN weight):

  import.nonfinite_inf    an infinity in the weights of model.from_pretrained is an error naming the tensor
                          (exit 2), not a step-1 loss advising a lower learning rate; the model's files unchanged
"""
import hashlib
import json
import os
import shutil
import struct
import subprocess

import harness
from harness import BIN, ENV, check, write_shard

import numpy as np

TMP = harness.scratch_dir("faults_rough")
V, T = 64, 16
DATA = os.path.join(TMP, "train.bin")
write_shard(DATA, np.random.default_rng(32).integers(0, V, size=64 * T + 1))
MODEL = {"n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": T, "vocab_size": V}


def config(name, model, **top):
    cfg = {"model": model, "data": {"train": DATA, "seq_len": T},
           "train": {"steps": 1, "eval_every": 0, "sample_tokens": 0}, "train_micro_batch_size_per_gpu": 2}
    cfg.update(top)
    path = os.path.join(TMP, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def run(args):
    p = subprocess.run([BIN] + args, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    return p.returncode, p.stdout


def tree_sums(root):
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            with open(os.path.join(d, n), "rb") as f:
                out[os.path.join(d, n)] = hashlib.sha256(f.read()).hexdigest()
    return out


def poke(path, tensor, value):
    """Writes VALUE (fp32) over element 3 of TENSOR in the safetensors file PATH."""
    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        assert header[tensor]["dtype"] == "F32", header[tensor]
        f.seek(8 + n + header[tensor]["data_offsets"][0] + 3 * 4)
        f.write(struct.pack("<f", value))


def nonfinite():
    ck, base = os.path.join(TMP, "ck"), os.path.join(TMP, "base")
    rc, out = run(["train", config("pre", MODEL, checkpoint={"dir": ck}), "--quiet"])
    rc2, out2 = run(["export", ck, base])
    if rc or rc2:
        check("import.nonfinite_inf", False, f"setup: train exit {rc}, export exit {rc2}: {out[-300:]} {out2[-300:]}")
        return
    with open(os.path.join(base, "model.safetensors"), "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        names = [k for k in json.loads(f.read(n)) if k != "__metadata__"]
    tensor = next((k for k in names if k.endswith("mlp.c_fc.weight")), names[0])
    for name, value in (("import.nonfinite_inf", float("-inf")),):
        d = os.path.join(TMP, name)
        shutil.copytree(base, d)
        poke(os.path.join(d, "model.safetensors"), tensor, value)
        before = tree_sums(d)
        rc, out = run(["train", config(name, {"from_pretrained": d}), "--quiet"])
        line = out.strip().splitlines()[-1] if out.strip() else ""
        check(name, rc == 2 and tensor in line and "NaN or Inf" in line
              and tree_sums(d) == before, f"exit {rc}: {out[-400:]}")


def main():
    nonfinite()


if __name__ == "__main__":
    harness.run_main("t_faults_rough", main)
