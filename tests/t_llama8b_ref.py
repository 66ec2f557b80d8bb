#!/usr/bin/env python3
"""t_llama8b_ref — tools/bench/torch_llama8b.py, PyTorch's side of issue 45's 8B-wide workload (FSDP2 with
CPUOffloadPolicy for the full fine-tune, PEFT LoRA r 16 with SDPA), run here on the CPU at toy size
(--width toy: d 64, 4 heads, 2 kv heads, FFN 224, vocabulary 512, 2 layers, T 32) in build/ref5-venv (PyPI's
torch 2.11, transformers 5.25, PEFT 0.21; the script re-executes itself there), so that the GPU session's
throughput stage meets no surprise in the script itself.

Checks, for --mode full and --mode lora:
  run          exit 0, three steps timed, a summary line
  params       the parameter count is the layout's (2 layers of q, k, v, o, gate, up, down and two norms, the
               embedding, the untied head, the final norm: 176,448), every one trained in full; LoRA trains
               r (in + out) per linear layer of every block, 41,984, and no base weight
  flops        model FLOPs per token: 6N (full) or 4N (LoRA) over the matrices plus 12 L C T of attention, as
               src/model/model.c counts them
  loss         the first step's loss is about ln 512 (random init, random tokens), finite, and the same in both
               modes (the same seed gives the same model)
"""
import json
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from harness import check, failures, use_ref5_venv  # noqa: E402

use_ref5_venv("llama8b_ref.venv")

SCRIPT = os.path.join(ROOT, "tools", "bench", "torch_llama8b.py")
L, C, NH, NKV, F, V, T = 2, 64, 4, 2, 224, 512, 32
KV = C // NH * NKV
PER_LAYER = 2 * C * C + 2 * C * KV + 3 * C * F
WANT_PARAMS = L * (PER_LAYER + 2 * C) + 2 * V * C + C
R = 16
WANT_LORA = L * R * ((C + C) + 2 * (C + KV) + (C + C) + 2 * (C + F) + (F + C))
WANT_FPT = {"full": 6.0 * (L * PER_LAYER + V * C) + 12.0 * L * C * T,
            "lora": 4.0 * (L * PER_LAYER + V * C) + 12.0 * L * C * T}


def run(mode):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, SCRIPT, "--mode", mode, "--width", "toy", "--layers", str(L), "--seq-len",
                        str(T), "--batch", "2", "--accum", "2", "--steps", "3", "--device", "cpu"],
                       capture_output=True, text=True, env=env, timeout=600)
    lines = r.stdout.splitlines()
    summary = next((json.loads(x[8:]) for x in lines if x.startswith("summary ")), None)
    first = next((float(x.split()[3]) for x in lines if x.startswith("step 1 ")), float("nan"))
    check(f"llama8b_ref.{mode}.run", r.returncode == 0 and summary is not None and len(summary["ms"]) == 3,
          f"exit {r.returncode}: {(r.stdout + r.stderr).strip().splitlines()[-3:]}")
    return summary or {}, first


got = {}
for mode in ("full", "lora"):
    s, first = run(mode)
    got[mode] = first
    want_train = WANT_PARAMS if mode == "full" else WANT_LORA
    want_total = WANT_PARAMS + (0 if mode == "full" else WANT_LORA)
    check(f"llama8b_ref.{mode}.params", s.get("params") == want_total and s.get("trainable") == want_train,
          f"params {s.get('params')} trainable {s.get('trainable')}, want {want_total} and {want_train}")
    check(f"llama8b_ref.{mode}.flops", s.get("flops_per_token") == WANT_FPT[mode],
          f"{s.get('flops_per_token')}, want {WANT_FPT[mode]}")
    check(f"llama8b_ref.{mode}.loss", abs(first - math.log(V)) < 0.2, f"step 1 loss {first}, want about {math.log(V):.3f}")
check("llama8b_ref.same_model", abs(got["full"] - got["lora"]) < 1e-3,
      f"step 1 loss full {got['full']}, LoRA {got['lora']} (the same seed: the same model)")
sys.exit(1 if failures() else 0)
