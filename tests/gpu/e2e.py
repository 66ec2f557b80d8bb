#!/usr/bin/env python3
"""e2e — end-to-end runs of the CUDA build on a GPU, then the throughput table
(tests/gpu/run.sh step 3 and 4; needs a GPU, bin/shardlm and bin/shardlm-cuda).

  e2e.*    a small GPT-2 (4 layers, C=128, vocab 512, T=64), 10 steps, trained
           by the CPU build and by the CUDA build with the same config:
           N=1 over NCCL, N=2 on one GPU over host-staged MPI
           (SHARDLM_SHARE_GPUS=1), stage 3, fp32 (TF32 off) and bf16; the
           per-step losses agree within 1e-4 (fp32) / 2e-2 (bf16) relative,
           the CUDA run's planned bytes equal its peak, and `shardlm plan
           --target cuda` (run by the CPU build) predicted them exactly
  table    GPT-2 124M and 350M shapes, bf16, T=1024, N=1: shardlm-cuda's
           median tokens/s (steps after the second), MFU against the GPU's
           dense bf16 peak (SHARDLM_PEAK_TFLOPS, default 989 for H100/H200
           SXM) and peak device memory, beside PyTorch on the same GPU and
           shapes (tools/bench/torch_gpt2.py --device cuda --dtype bf16)
Prints "ok"/"FAIL" lines and the table; ends with "N passed, N failed".
Dry run without a GPU: the real CUDA sources under tests/cudaemu's CPU
emulation (bash tests/cudaemu/build.sh first; 12 passed here, about 2 min):
  E2E_GPU_BIN=$PWD/build/cudaemu/shardlm-cudaemu /usr/bin/python3 tests/gpu/e2e.py --e2e-only
(E2E_GPU_BIN=shardlm SHARDLM_EMULATE_DEVICE=1 also runs, but its
plan_cuda_target_is_peak checks fail by the CPU attention scratch, which is
not the CUDA one.)
"""
import json
import os
import statistics
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from harness import check, failures, scratch_dir, write_shard  # noqa: E402

TMP = scratch_dir("gpu_e2e")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")
ENV.pop("SHARDLM_TF32", None)
GPU_BIN = os.environ.get("E2E_GPU_BIN", "shardlm-cuda")  # a name in bin/, or a path (the dry run above)
PEAK = float(os.environ.get("SHARDLM_PEAK_TFLOPS", "989")) * 1e12
passed = 0


def ok(name, cond, why=""):
    global passed
    check(name, cond, why)
    passed += bool(cond)


def shard(name, vocab, n):
    path = os.path.join(TMP, name)
    write_shard(path, np.random.default_rng(5).integers(0, vocab, size=n))
    return path


def config(name, model, data, steps, micro, dtype, stage=3):
    cfg = {"model": model, "data": {"train": data, "seq_len": model["n_positions"], "shuffle": False},
           "train": {"steps": steps, "seed": 7, "eval_every": 0, "sample_tokens": 0,
                     "metrics": os.path.join(TMP, name + ".jsonl")},
           "train_micro_batch_size_per_gpu": micro, "gradient_clipping": 1.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}},
           "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    path = os.path.join(TMP, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def train(name, binary, N, cfg, env=None, timeout=300):
    cmd = ["mpirun", "-np", str(N), "--oversubscribe", "--bind-to", "none", os.path.join(ROOT, "bin", binary),
           "train", cfg, "--quiet"]
    try:
        r = subprocess.run(cmd, env=dict(ENV, **(env or {})), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timed out"
    out = r.stdout.decode(errors="replace")
    if r.returncode != 0:
        return None, " | ".join(out.strip().splitlines()[-4:])
    with open(os.path.join(TMP, name + ".jsonl")) as f:
        rows = [json.loads(x) for x in f if x.strip()]
    return rows, out


def e2e():
    model = {"n_layer": 4, "n_head": 4, "n_embd": 128, "n_positions": 64, "vocab_size": 512}
    data = shard("small.bin", 512, 64 * 400 + 1)
    for dtype, tol in (("fp32", 1e-4), ("bf16", 2e-2)):
        for N, env in ((1, {}), (2, {"SHARDLM_SHARE_GPUS": "1"})):
            tag = f"n{N}_{dtype}"
            cpu, out_c = train(f"cpu_{tag}", "shardlm", N, config(f"cpu_{tag}", model, data, 10, 4, dtype))
            gpu, out_g = train(f"gpu_{tag}", GPU_BIN, N, config(f"gpu_{tag}", model, data, 10, 4, dtype), env)
            if cpu is None or gpu is None:
                ok(f"e2e.{tag}", False, out_c if cpu is None else out_g)
                continue
            lc = [r["loss"] for r in cpu if "loss" in r]
            lg = [r["loss"] for r in gpu if "loss" in r]
            worst = max(abs(a - b) / abs(b) for a, b in zip(lg, lc)) if len(lc) == len(lg) == 10 else float("inf")
            ok(f"e2e.{tag}", worst <= tol, f"worst relative loss difference {worst:.3g} (tol {tol}); "
                                           f"cpu {lc[:3]}..., gpu {lg[:3]}...")
            mem = next(r["memory"] for r in gpu if "memory" in r)
            bad = [k for k, v in mem.items() if v["planned"] != v["peak"]]
            ok(f"e2e.{tag}.planned_is_peak", not bad, f"classes {bad}")
            # the planner's cuda target, computed by the CPU build, is what the CUDA build allocated
            p = subprocess.run([os.path.join(ROOT, "bin", "shardlm"), "plan", config(f"gpu_{tag}", model, data, 10, 4,
                                dtype), "--ranks", str(N), "--target", "cuda", "--json"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, env=ENV)
            try:
                plan = json.loads(p.stdout.decode().strip().splitlines()[-1])["memory"]
                diff = [k for k, v in mem.items() if plan.get(k, {}).get("bytes", 0) != v["peak"]]
            except (ValueError, KeyError, IndexError):
                diff = ["no plan: " + p.stdout.decode()[-200:]]
            ok(f"e2e.{tag}.plan_cuda_target_is_peak", not diff, f"classes {diff}")


def flops_per_token(L, C, Vp, T):
    return 6.0 * (L * 12.0 * C * C + Vp * C) + 12.0 * L * C * T


def table():
    shapes = (("GPT-2 124M", 12, 12, 768, 16), ("GPT-2 350M", 24, 16, 1024, 8))
    T, V, Vp = 1024, 50257, 50304
    data = shard("gpt2.bin", V, 1 << 21)
    lines = ["| model | B x T | shardlm tok/s | MFU | peak device | PyTorch tok/s | MFU | peak | ratio |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, L, NH, C, B in shapes:
        model = {"n_layer": L, "n_head": NH, "n_embd": C, "n_positions": T, "vocab_size": V}
        name = label.split()[-1]
        rows, out = train("tp_" + name, GPU_BIN, 1, config("tp_" + name, model, data, 8, B, "bf16", stage=3),
                          timeout=240)
        fpt = flops_per_token(L, C, Vp, T)
        if rows is None:
            ok(f"table.{name}.shardlm", False, out)
            s_tps = s_peak = None
        else:
            s_tps = statistics.median(r["tokens_per_s"] for r in rows if "loss" in r and r["step"] > 2)
            mem = next(r["memory"] for r in rows if "memory" in r)
            s_peak = sum(v["peak"] for v in mem.values() if v["space"] == "device")
            ok(f"table.{name}.shardlm", s_tps > 0)
        t = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bench", "torch_gpt2.py"),
                            "--n-layer", str(L), "--n-head", str(NH), "--n-embd", str(C), "--seq-len", str(T),
                            "--batch", str(B), "--vocab", str(Vp), "--real-vocab", str(V), "--steps", "8",
                            "--device", "cuda", "--dtype", "bf16"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        summary = next((json.loads(x[8:]) for x in t.stdout.decode().splitlines() if x.startswith("summary ")), None)
        if summary is None:
            print("# PyTorch reference did not run: " + " | ".join(t.stdout.decode().strip().splitlines()[-2:]))
            p_tps = p_peak = None
        else:
            p_tps = statistics.median(B * T / (ms / 1e3) for ms in summary["ms"][2:])
            p_peak = summary["peak_bytes"]

        def f(x, fmt):
            return fmt.format(x) if x is not None else "n/a"
        lines.append(f"| {label} | {B} x {T} | {f(s_tps, '{:.0f}')} | {f(s_tps and s_tps * fpt / PEAK, '{:.1%}')} | "
                     f"{f(s_peak and s_peak / 2**30, '{:.1f} GiB')} | {f(p_tps, '{:.0f}')} | "
                     f"{f(p_tps and p_tps * fpt / PEAK, '{:.1%}')} | {f(p_peak and p_peak / 2**30, '{:.1f} GiB')} | "
                     f"{f(s_tps and p_tps and s_tps / p_tps, '{:.2f}')} |")
    print("\n".join(lines))


def main():
    e2e()
    if "--e2e-only" not in sys.argv:
        table()
    n_failed = failures()
    print(f"{passed} passed, {n_failed} failed")
    return 1 if n_failed else 0


if __name__ == "__main__":
    sys.exit(main())
