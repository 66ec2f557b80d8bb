#!/usr/bin/env python3
"""t_safetensors — shardlm's safetensors reader and writer (src/io/safetensors.c,
driven by build/tests/safetensors_tool) against the files Hugging Face's own
code writes and reads: the `safetensors` package (0.8) and transformers
(4.40.2), both in build/ref-venv over Debian's torch 1.13; this script
re-executes itself there.

Reading: files written by safetensors.numpy.save_file (F32, F16, a scalar,
a 3-D tensor) and safetensors.torch.save_file (BF16), and a tiny
LlamaForCausalLM saved by save_pretrained in bfloat16 with a small
max_shard_size (several files and their index): every element read back
bitwise equal to the stored value widened to fp32.

Writing: shardlm writes that Llama's tensors in F32, F16 and BF16, in one file
and in several; safe_open reads every tensor with the right dtype and shape
and the bits of numpy's float16 / torch's bfloat16 rounding of the fp32
source (both round to nearest even, as shardlm does); the index has the
total size and the weight map; and LlamaForCausalLM.from_pretrained loads the
directory with no missing or unexpected weight.
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import use_ref_venv  # noqa: E402

use_ref_venv("safetensors", "safetensors.env")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import save_file as save_numpy  # noqa: E402
from safetensors.torch import save_file as save_torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import check, failures, scratch_dir  # noqa: E402

TMP = scratch_dir("t_safetensors")
TOOL = os.path.join(ROOT, os.environ.get("BUILD", "build"), "tests", "safetensors_tool")
torch.set_num_threads(1)
hf_logging.disable_progress_bar()

# A tiny Llama: 2 layers, grouped-query attention, untied head: 19 tensors.
LLAMA = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
# Data bytes per file in the multi-file cases: smaller than the embedding in
# F32 (12 KiB), so that it takes a file of its own, and several layers' worth.
MAX_FILE_BYTES = 10000


def tool_read(directory):
    """{name: (dtype, shape, fp32 array, file)}, bytes_read, n_files."""
    out = subprocess.run([TOOL, "read", directory], capture_output=True, text=True)
    if out.returncode != 0:
        return None, 0, 0, out.stderr.strip()
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    tensors = {t["name"]: (t["dtype"], tuple(t["shape"]), np.array(t["bits"], dtype=np.uint32).view(np.float32),
                           t["file"]) for t in lines[:-1]}
    return tensors, lines[-1]["bytes_read"], lines[-1]["n_files"], ""


def bits_equal(a, b):
    a = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
    b = np.ascontiguousarray(b, dtype=np.float32).reshape(-1)
    return a.shape == b.shape and bool(np.all(a.view(np.uint32) == b.view(np.uint32)))


def as_f32(t):
    """A torch tensor of any float dtype widened to fp32 numpy (exact)."""
    return t.to(torch.float32).numpy()


def llama_state():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LLAMA)
    with torch.no_grad():  # norms away from 1, so that their values are checked too
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
    return model, {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}


def read_python_files():
    rng = np.random.default_rng(1)
    d = os.path.join(TMP, "numpy")
    os.makedirs(d, exist_ok=True)
    arrays = {
        "w32": rng.standard_normal((5, 7)).astype(np.float32),
        "w16": (rng.standard_normal((3, 4, 5)) * 100).astype(np.float16),
        "scalar": np.array(2.5, dtype=np.float32),
        "edge16": np.array([65504, -0.0, 2 ** -24, np.inf, 1e-3], dtype=np.float16),
    }
    save_numpy(arrays, os.path.join(d, "model.safetensors"))
    got, nread, nfiles, err = tool_read(d)
    check("read_numpy_opens", got is not None and set(got) == set(arrays), err or f"tensors {sorted(got or {})}")
    for name, a in arrays.items():
        dtype, shape, values, _ = (got or {}).get(name, (None, None, np.zeros(0), None))
        check(f"read_numpy_{name}", dtype == {np.float32: "F32", np.float16: "F16"}[a.dtype.type] and
              shape == a.shape and bits_equal(values, a.astype(np.float32)), f"dtype {dtype} shape {shape}")
    want_bytes = sum(a.nbytes for a in arrays.values())
    check("read_numpy_bytes_read", nread == want_bytes and nfiles == 1, f"{nread} bytes, want {want_bytes}")

    d = os.path.join(TMP, "torch_bf16")
    os.makedirs(d, exist_ok=True)
    tensors = {"b": torch.randn(33, 9).to(torch.bfloat16),
               "edge": torch.tensor([1.0, -3.0e38, 1e-40, float("inf"), 0.1]).to(torch.bfloat16)}
    save_torch(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    got, nread, _, err = tool_read(d)
    ok = got is not None and all(got[k][0] == "BF16" and got[k][1] == tuple(t.shape) and
                                 bits_equal(got[k][2], as_f32(t)) for k, t in tensors.items())
    check("read_torch_bf16", ok, err or "dtype, shape or bits differ")


def read_save_pretrained(model, state):
    d = os.path.join(TMP, "pretrained_bf16")
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True, max_shard_size="20KB")
    model.to(torch.float32)
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        index = json.load(f)
    got, nread, nfiles, err = tool_read(d)
    check("read_pretrained_sharded", len(files) > 1 and got is not None and nfiles == len(files) and
          set(got) == set(index["weight_map"]), err or f"{len(files)} files, {nfiles} read")
    if got is None:
        return
    bad = [k for k, (dtype, shape, values, file) in got.items()
           if dtype != "BF16" or shape != tuple(state[k].shape) or file != index["weight_map"][k]
           or not bits_equal(values, as_f32(state[k].to(torch.bfloat16)))]
    check("read_pretrained_values", not bad, f"differ: {bad[:4]}")
    check("read_pretrained_bytes_read", nread == index["metadata"]["total_size"],
          f"{nread} bytes, index total_size {index['metadata']['total_size']}")


def tool_write(directory, dtype, max_file_bytes, state):
    os.makedirs(directory, exist_ok=True)
    values = os.path.join(directory, "values.f32")
    np.concatenate([t.numpy().reshape(-1) for t in state.values()]).astype(np.float32).tofile(values)
    specs = [f"{k}={'x'.join(str(s) for s in t.shape)}" for k, t in state.items()]
    out = subprocess.run([TOOL, "write", directory, dtype, str(max_file_bytes), values] + specs,
                         capture_output=True, text=True)
    os.unlink(values)
    return out.returncode, out.stdout.split(), out.stderr.strip()


def rounded(t, dtype):
    """The fp32 source rounded to dtype by torch / numpy (round to nearest even)."""
    if dtype == "F16":
        return torch.from_numpy(t.numpy().astype(np.float16))
    return t.to({"F32": torch.float32, "BF16": torch.bfloat16}[dtype])


def write_and_load(state, dtype, max_file_bytes):
    case = f"write_{dtype.lower()}_{'multi' if max_file_bytes else 'single'}"
    d = os.path.join(TMP, case)
    rc, files, err = tool_write(d, dtype, max_file_bytes, state)
    check(f"{case}_runs", rc == 0, err)
    if rc != 0:
        return
    if max_file_bytes:
        n = len(files)
        check(f"{case}_names", n > 1 and files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)],
              f"{files}")
        with open(os.path.join(d, "model.safetensors.index.json")) as f:
            index = json.load(f)
        size = {"F32": 4, "F16": 2, "BF16": 2}[dtype]
        total = sum(t.numel() for t in state.values()) * size
        check(f"{case}_index", index["metadata"]["total_size"] == total and set(index["weight_map"]) == set(state) and
              set(index["weight_map"].values()) == set(files), f"{index['metadata']}")
        check(f"{case}_no_single_file", not os.path.exists(os.path.join(d, "model.safetensors")), "")
    else:
        check(f"{case}_names", files == ["model.safetensors"] and
              not os.path.exists(os.path.join(d, "model.safetensors.index.json")), f"{files}")
    check(f"{case}_no_tmp", not [f for f in os.listdir(d) if f.endswith(".tmp")], f"{os.listdir(d)}")

    seen, bad, aligned = {}, [], True
    for file in files:
        path = os.path.join(d, file)
        with open(path, "rb") as f:
            aligned &= int.from_bytes(f.read(8), "little") % 8 == 0
        with safe_open(path, framework="pt") as f:
            meta = f.metadata()
            for k in f.keys():
                t = f.get_tensor(k)
                seen[k] = file
                want = rounded(state[k], dtype)
                if t.dtype != want.dtype or t.shape != want.shape or not bits_equal(as_f32(t), as_f32(want)):
                    bad.append(k)
    check(f"{case}_safe_open", set(seen) == set(state) and not bad and meta == {"format": "pt"} and aligned,
          f"missing {sorted(set(state) - set(seen))[:3]}, differ {bad[:3]}, metadata {meta}, aligned {aligned}")

    # transformers loads the directory as it would a downloaded model.
    LLAMA.save_pretrained(d)
    torch_dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[dtype]
    loaded, info = LlamaForCausalLM.from_pretrained(d, torch_dtype=torch_dtype, output_loading_info=True)
    missing = info["missing_keys"] + info["unexpected_keys"] + info["mismatched_keys"] + info["error_msgs"]
    loaded_state = loaded.state_dict()
    differ = [k for k in state if not bits_equal(as_f32(loaded_state[k]), as_f32(rounded(state[k], dtype)))]
    check(f"{case}_from_pretrained", not missing and not differ, f"loading info {missing[:3]}, differ {differ[:3]}")

    # And shardlm reads back what it wrote, bitwise.
    got, nread, nfiles, err = tool_read(d)
    ok = got is not None and nfiles == len(files) and all(
        bits_equal(got[k][2], as_f32(rounded(state[k], dtype))) for k in state)
    check(f"{case}_read_back", ok, err or "values differ")


def main():
    if not os.path.exists(TOOL):
        check("safetensors.tool", False, f"{TOOL} is missing; run make")
        return
    read_python_files()
    model, state = llama_state()
    read_save_pretrained(model, state)
    for dtype in ("F32", "F16", "BF16"):
        write_and_load(state, dtype, 0)
        write_and_load(state, dtype, MAX_FILE_BYTES)


main()
sys.exit(1 if failures() else 0)
