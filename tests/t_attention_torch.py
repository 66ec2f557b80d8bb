#!/usr/bin/env python3
"""t_attention_torch — the CPU backend's attention kernels against PyTorch (issue 21).

build/tests/attention_tool runs the grouped-query forward and backward of
src/backend/cpu/backend_cpu_attention.c on inputs this test makes; PyTorch (Debian's 1.13)
computes the same attention in float64 from the same fp32 inputs, with
autograd for the gradients: softmax(q k^T / sqrt(hs) + mask) v, query head h
reading key/value head h // (NH / NKV), the mask causal and, for packed rows,
block-diagonal over the samples (a token sees the earlier tokens of its own
sample only). Each case, for the tiled kernel (the default) and the
materialized one (SHARDLM_ATTENTION=materialized):
  CASE.KERNEL.out     the output, max |err| / max |ref| < 1e-5
  CASE.KERNEL.dqkv    the gradient of q, k and v for a random output gradient
  CASE.tiled.lse      the tiled kernel's log-sum-exp per row (what it keeps)
Cases: T = 1; T = 700 (past the 128 x 512 tiles and not a multiple of them)
with three query heads per key/value head; packed rows whose samples cross the
tiles; an odd head size; T = 4096.
"""
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ENV, ROOT, check, rel, run_main, scratch_dir  # noqa: E402

TOOL = os.path.join(ROOT, os.environ.get("BUILD", "build"), "tests", "attention_tool")
TMP = scratch_dir("t_attention_torch")
TOL = 1e-5

# name, B, T, NH, NKV, hs, packed sample lengths per row (None: one sample per row)
CASES = [
    ("T1", 2, 1, 4, 2, 8, None),
    ("T700_gqa3", 1, 700, 6, 2, 16, None),
    ("T1100_packed", 2, 1100, 4, 1, 8, [[1, 126, 2, 600, 45, 1, 5, 320], [513, 3, 1, 700]]),
    ("T300_hs7", 1, 300, 3, 3, 7, None),
    ("T4096", 1, 4096, 2, 1, 16, None),
]


def positions(B, T, lengths):
    """(B, T) int32: each token's position in its sample; the last sample cut at T."""
    pos = np.zeros((B, T), np.int32)
    for b in range(B):
        t = 0
        for n in lengths[b]:
            k = min(n, T - t)
            pos[b, t:t + k] = np.arange(k)
            t += k
        assert t == T, "the lengths must cover the row"
    return pos


def reference(qkv, dout, pos, NH, NKV, hs):
    """out, lse (B, NH, T) and dqkv in float64 through autograd."""
    B, T, _ = qkv.shape
    x = torch.tensor(qkv, dtype=torch.float64, requires_grad=True)
    q = x[:, :, :NH * hs].reshape(B, T, NH, hs).transpose(1, 2)
    k = x[:, :, NH * hs:(NH + NKV) * hs].reshape(B, T, NKV, hs).transpose(1, 2)
    v = x[:, :, (NH + NKV) * hs:].reshape(B, T, NKV, hs).transpose(1, 2)
    group = NH // NKV
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    i = torch.arange(T)
    allowed = (i[None, :] <= i[:, None]).expand(B, T, T)  # key j <= query i
    if pos is not None:
        first = torch.tensor(np.arange(T)[None, :] - pos, dtype=torch.long)  # (B, T) each query's first key
        allowed = allowed & (i[None, None, :] >= first[:, :, None])
    scores = (q @ k.transpose(-1, -2)) / hs ** 0.5
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, NH * hs)
    out.backward(torch.tensor(dout, dtype=torch.float64))
    return out.detach().numpy(), lse.detach().numpy(), x.grad.numpy()


def run_tool(case_dir, kernel, B, T, NH, NKV, hs):
    env = dict(ENV, SHARDLM_ATTENTION=kernel)
    r = subprocess.run([TOOL, case_dir, str(B), str(T), str(NH), str(NKV), str(hs)], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    if r.returncode != 0:
        return None, r.stdout[-400:]

    def load(name, shape):
        return np.fromfile(os.path.join(case_dir, name), dtype="<f4").reshape(shape)

    width = (NH + 2 * NKV) * hs
    got = {"out": load("out.f32", (B, T, NH * hs)), "dqkv": load("dqkv.f32", (B, T, width))}
    if kernel == "tiled":
        got["lse"] = load("lse.f32", (B, NH, T))
    for name in ("out.f32", "dqkv.f32", "lse.f32"):
        if os.path.exists(os.path.join(case_dir, name)):
            os.remove(os.path.join(case_dir, name))
    return got, ""


def check_case(name, B, T, NH, NKV, hs, lengths, rng):
    case_dir = os.path.join(TMP, name)
    os.makedirs(case_dir, exist_ok=True)
    width = (NH + 2 * NKV) * hs
    qkv = rng.standard_normal((B, T, width)).astype(np.float32)
    dout = rng.standard_normal((B, T, NH * hs)).astype(np.float32)
    qkv.astype("<f4").tofile(os.path.join(case_dir, "qkv.f32"))
    dout.astype("<f4").tofile(os.path.join(case_dir, "dout.f32"))
    pos = positions(B, T, lengths) if lengths else None
    pos_path = os.path.join(case_dir, "pos.i32")
    if pos is not None:
        pos.astype("<i4").tofile(pos_path)
    elif os.path.exists(pos_path):
        os.remove(pos_path)
    want_out, want_lse, want_dqkv = reference(qkv, dout, pos, NH, NKV, hs)
    for kernel in ("tiled", "materialized"):
        got, why = run_tool(case_dir, kernel, B, T, NH, NKV, hs)
        if got is None:
            check(f"{name}.{kernel}.run", False, why)
            continue
        e = rel(got["out"], want_out)
        check(f"{name}.{kernel}.out", e < TOL, f"max error {e:.3g} relative (tol {TOL})")
        e = rel(got["dqkv"], want_dqkv)
        check(f"{name}.{kernel}.dqkv", e < TOL, f"max error {e:.3g} relative (tol {TOL})")
        if kernel == "tiled":
            e = rel(got["lse"], want_lse)
            check(f"{name}.tiled.lse", e < TOL, f"max error {e:.3g} relative (tol {TOL})")


def main():
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    rng = np.random.default_rng(21)
    for case in CASES:
        check_case(*case, rng)


if __name__ == "__main__":
    run_main("attention_torch", main)
