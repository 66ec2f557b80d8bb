"""Rough edges of issue 32's fault sweep, each a named error or warning instead of silence:

  import.nonfinite        a NaN in the weights of model.from_pretrained is an error naming the tensor
                          (exit 2), not a step-1 loss advising a lower learning rate; the files unchanged
  import.nonfinite_inf    the same for an infinity
  lora.rank_over_layer    lora.r above an adapted layer's smaller side is a warning naming the layer and
                          the rank that makes sense; a rank within it prints none
  samples.trained_flag    a sample file whose trained flag is 2 is refused naming the sample and token
                          (exit 2), not trained as if it were 1
"""
import hashlib
import json
import os
import shutil
import struct
import subprocess

import harness
import datafiles  # noqa: E402  (tools/, on the path through harness)
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
        check("import.nonfinite", False, f"setup: train exit {rc}, export exit {rc2}: {out[-300:]} {out2[-300:]}")
        return
    with open(os.path.join(base, "model.safetensors"), "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        names = [k for k in json.loads(f.read(n)) if k != "__metadata__"]
    tensor = next((k for k in names if k.endswith("mlp.c_fc.weight")), names[0])
    for name, value in (("import.nonfinite", float("nan")), ("import.nonfinite_inf", float("-inf"))):
        d = os.path.join(TMP, name)
        shutil.copytree(base, d)
        poke(os.path.join(d, "model.safetensors"), tensor, value)
        before = tree_sums(d)
        rc, out = run(["train", config(name, {"from_pretrained": d}), "--quiet"])
        line = out.strip().splitlines()[-1] if out.strip() else ""
        check(name, rc == 2 and tensor in line and "NaN or an infinity" in line and "element 3" in line
              and tree_sums(d) == before, f"exit {rc}: {out[-400:]}")


def rank_over_layer():
    lora = lambda r: {"r": r, "target_modules": ["c_attn"]}
    rc, out = run(["plan", config("lora_big", MODEL, lora=lora(32)), "--target", "cpu"])
    rc2, out2 = run(["plan", config("lora_ok", MODEL, lora=lora(16)), "--target", "cpu"])
    check("lora.rank_over_layer", rc == 0 and "warning: lora.r 32 is larger than the adapted layer attn.c_attn "
          "(48 x 16)" in out and "choose lora.r <= 16" in out and rc2 == 0 and "lora.r" not in out2,
          f"exit {rc}, {rc2}: {out[:400]} / {out2[:400]}")


def trained_flag():
    path = os.path.join(TMP, "flags.h5")
    tokens = np.arange(12) % V
    trained = np.array([0, 1, 1, 1, 1, 1, 0, 0, 2, 1, 1, 1], np.uint8)
    datafiles.write_samples(path, tokens, trained, np.array([0, 6, 12]), V)
    before = tree_sums(TMP)
    rc, out = run(["train", config("flags", MODEL, data={"train": path, "max_seq_length": T}), "--quiet"])
    line = out.strip().splitlines()[-1] if out.strip() else ""
    check("samples.trained_flag", rc == 2 and "sample 1 (token 2) has trained flag 2" in line
          and all(v == before[k] for k, v in tree_sums(TMP).items() if k in before), f"exit {rc}: {out[-400:]}")


def main():
    nonfinite()
    rank_over_layer()
    trained_flag()


if __name__ == "__main__":
    harness.run_main("t_faults_rough", main)
