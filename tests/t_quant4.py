#!/usr/bin/env python3
"""t_quant4 — shardlm's 4-bit quantization (src/core/quant4.c, driven by
build/tests/quant4_tool) against bitsandbytes 0.50.2 on the CPU, in
build/ref5-venv (torch 2.11; the script re-executes itself there).

For NF4 and FP4, fp32, bf16 and fp16 inputs, with and without double
quantization, and tensor lengths that are a multiple of the block (64), not
one (a short last block, which bitsandbytes scales by a division), and odd
(a pad nibble), everything is compared bit for bit with
bitsandbytes.functional.quantize_4bit(blocksize=64, compress_statistics=...)
and dequantize_4bit:
  codes   the packed bytes (high nibble first)
  absmax  the fp32 block maxima (from the call without double quantization)
  nested  the 8-bit absmax, nested_absmax (per 256 blocks) and the offset
  deq     the dequantized tensor in the input dtype
The inputs are normal values with a spread of scales per block, plus blocks
that hit the rules' corners: all zeros, FP4's two zeros (values in
(-eps, 0] and (0, eps]), values equal to the block absmax, and values on the
midpoints between table entries. shardlm quantizes each fp32 case as 1 and as 3
ranks (each range whole blocks, or whole nested blocks); both must match.
One exception, documented in src/core/quant4.c: for an odd length,
bitsandbytes dequantizes with a torch fallback whose FP4 code 8 is +0 where
its kernel writes -0, so those cases compare values rather than bits.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import use_ref5_venv  # noqa: E402

use_ref5_venv("quant4.env")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import bitsandbytes.functional as bnbf  # noqa: E402

from harness import check, failures, scratch_dir  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, os.environ.get("BUILD", "build"), "tests", "quant4_tool")
TMP = scratch_dir("t_quant4")
torch.set_num_threads(1)

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
# Lengths: whole blocks over several nested blocks (5 * 256 + 3 blocks), a short last block, an odd length,
# and a tensor of 9000 blocks (the offset's cascade sum runs several levels).
LENGTHS = [64 * (5 * 256 + 3), 64 * 40 + 17, 64 * 7 + 33, 64 * 9000]


def inputs(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp(torch.randn(n // 64 + 1, generator=g)).repeat_interleave(64)[:n]
    x[:64] = 0.0                                             # an all-zero block
    code = bnbf.get_4bit_type("fp4", device="cpu")
    mids = ((code.sort().values[:-1] + code.sort().values[1:]) / 2)
    x[64:128] = torch.tensor([1e-9, -1e-9, 0.0, -0.0] * 16)  # FP4's zeros
    x[128] = 1.0                                             # the block absmax, then values on midpoints
    x[129:129 + 15] = mids
    x[192:256] = -x[192:256].abs()                           # a block whose absmax is a negative value
    return x


def tool(qtype, dtype, nested, shards, x):
    path = os.path.join(TMP, "in.bin")
    x.contiguous().view(torch.uint8).numpy().tofile(path) if x.dtype != torch.float32 else x.numpy().tofile(path)
    out = os.path.join(TMP, "out")
    r = subprocess.run([TOOL, "quantize", qtype, dtype, str(nested), str(shards), path, out],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip()

    def rd(suffix, dt):
        return np.fromfile(f"{out}.{suffix}", dtype=dt)
    res = {"codes": rd("codes", np.uint8), "absmax": rd("absmax", np.uint32), "deq": rd("deq", np.uint8)}
    if nested:
        res.update(qabsmax=rd("qabsmax", np.uint8), nested_absmax=rd("nested_absmax", np.uint32),
                   offset=rd("offset", np.uint32))
    return res, ""


def bits(t):
    return t.contiguous().reshape(-1).view(torch.uint8 if t.dtype == torch.uint8 else torch.int32).numpy().view(
        np.uint8 if t.dtype == torch.uint8 else np.uint32)


def raw(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy()


def first_diff(a, b):
    if a.shape != b.shape:
        return f"shape {a.shape} vs {b.shape}"
    idx = np.nonzero(a != b)[0]
    return "equal" if idx.size == 0 else f"{idx.size} differ, first at {idx[0]}: {a[idx[0]]} vs {b[idx[0]]}"


for qtype in ("nf4", "fp4"):
    for dname, dtype in DTYPES.items():
        for nested in (0, 1):
            for n in LENGTHS:
                if n == LENGTHS[3] and (dname != "f32" or qtype != "nf4"):
                    continue  # the long tensor once: its point is the offset's sum
                x = inputs(n, seed=n + len(dname)).to(dtype)
                q_plain, st_plain = bnbf.quantize_4bit(x, blocksize=64, compress_statistics=False, quant_type=qtype)
                q, st = bnbf.quantize_4bit(x, blocksize=64, compress_statistics=bool(nested), quant_type=qtype)
                deq = bnbf.dequantize_4bit(q, st)
                for shards in ((1, 3) if dname == "f32" else (1,)):
                    name = f"{qtype}.{dname}.{'nested' if nested else 'plain'}.n{n}.ranks{shards}"
                    got, err = tool(qtype, dname, nested, shards, x)
                    if got is None:
                        check(name, False, err)
                        continue
                    check(name + ".codes", np.array_equal(got["codes"], raw(q)), first_diff(got["codes"], raw(q)))
                    want_absmax = bits(st_plain.absmax)
                    check(name + ".absmax", np.array_equal(got["absmax"], want_absmax),
                          first_diff(got["absmax"], want_absmax))
                    if nested:
                        check(name + ".offset", np.array_equal(got["offset"], bits(st.offset.reshape(1))),
                              f"{got['offset'].view(np.float32)} vs {st.offset.item()}")
                        check(name + ".qabsmax", np.array_equal(got["qabsmax"], raw(st.absmax)),
                              first_diff(got["qabsmax"], raw(st.absmax)))
                        want = bits(st.state2.absmax)
                        check(name + ".nested_absmax", np.array_equal(got["nested_absmax"], want),
                              first_diff(got["nested_absmax"], want))
                    if n % 2:
                        # bitsandbytes dequantizes an odd last dimension with its torch fallback, whose FP4 code 8
                        # is +0 where its kernel (every even last dimension) writes -0: values compared, not bits
                        a = np.frombuffer(got["deq"].tobytes(), dtype=deq.numpy().dtype if dtype != torch.bfloat16
                                          else np.uint16)
                        b = deq.float().numpy() if dtype != torch.bfloat16 else None
                        if b is None:  # bf16: compare the fp32 widenings
                            a = (a.astype(np.uint32) << 16).view(np.float32)
                            b = deq.float().numpy()
                        check(name + ".deq", np.array_equal(a.astype(np.float32), b.astype(np.float32)),
                              first_diff(a.astype(np.float32), b.astype(np.float32)))
                    else:
                        check(name + ".deq", np.array_equal(got["deq"], raw(deq)), first_diff(got["deq"], raw(deq)))

sys.exit(1 if failures() else 0)
