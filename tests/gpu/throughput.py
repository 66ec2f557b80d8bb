#!/usr/bin/env python3
"""throughput — shardlm-cuda training throughput beside PyTorch on the same GPU
(tests/gpu/session.sh stage 4).

  gemm          a cuBLAS bf16 GEMM (torch.matmul, 8192^3, fp32 accumulation)
                measured here: the peak this GPU reaches in practice
  gpt2_350m     GPT-2 350M (24 layers, C 1024, 16 heads, T 1024, vocab 50257),
                bf16, micro-batch 8, N=1, ZeRO stage 3, gradient accumulation 1
                and 8: shardlm-cuda's median tokens/s (steps after the first
                two; after the first with accumulation 8), MFU against the
                dense bf16 peak and against the GEMM above, peak device
                memory; then tools/bench/torch_gpt2.py --device cuda --dtype
                bf16 with the same shapes and accumulation; 12 steps per run,
                shardlm and PyTorch alternated twice, each side's median and
                spread over the last 8 steps of both runs (medians, not
                means), the SM clock, power and temperature after each run
  llama_12l     the Llama shape (12 layers, C 768, 12 heads, 4 KV heads, FFN
                2048, vocab 32000, T 512), bf16, ZeRO stage 3: shardlm-cuda
                and PyTorch (when transformers is importable, else "skip")
  llama8b       issue 45's workload: Llama-3.1-8B's width (d 4096, 32 heads,
                8 KV heads, FFN 14336, vocab 128256, RoPE llama3), random
                init, bf16, T 2048, micro-batch 2, accumulation 8, activation
                checkpointing, SESSION_8B_LAYERS layers (default 4: the whole
                32 do not fit the machine's 128 GiB of host memory or the
                session's minutes; the per-layer figures are the same):
                (full) ZeRO-3 with offload_optimizer "cpu" against PyTorch
                FSDP2 with CPUOffloadPolicy, (lora) LoRA r 16 on every linear
                layer against PEFT with SDPA (tools/bench/torch_llama8b.py);
                tokens/s, MFU (6N full, 4N LoRA, attention counted), peak
                device memory, peak host RSS, shardlm's plan beside its peaks

MFU = tokens/s x FLOPs per token (src/model/model.c model_flops_per_token) / peak.
PEAK_TFLOPS: NVIDIA's H200 SXM datasheet (nvidia.com/en-us/data-center/h200,
"BF16 Tensor Core 1,979 TFLOPS" with sparsity; half of it dense, the same
989 TFLOP/s as the H100 SXM); SHARDLM_PEAK_TFLOPS overrides it.

--emulate: the same steps at tiny shapes through build/cudaemu/shardlm-cudaemu
and PyTorch on the CPU (the session's rehearsal: every number is meaningless
and marked "emulated"). Each part has its own time limit (--part-timeout).
Prints "ok"/"FAIL"/"skip NAME: why" lines, "@figure {json}" lines as each
part ends (so a stage killed midway keeps what it measured) and a table.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from harness import REF5_VENV, check, failures, ref5_env, scratch_dir, write_shard  # noqa: E402
from procgroup import run_group  # noqa: E402

PEAK_TFLOPS = float(os.environ.get("SHARDLM_PEAK_TFLOPS", "989"))  # H200 SXM dense bf16; see the docstring
TORCH_PY = os.path.join(ROOT, "tools", "bench", "torch_gpt2.py")
TMP = scratch_dir("gpu_throughput")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")
ENV.setdefault("SHARDLM_COMM_TIMEOUT", "60")
ENV.pop("SHARDLM_TF32", None)
passed = 0


def ok(name, cond, why=""):
    global passed
    check(name, cond, why)
    passed += bool(cond)


def skip(name, why):
    print(f"skip {name}: {why}", flush=True)


def figure(**kv):
    print("@figure " + json.dumps(kv), flush=True)


def padded(v, align=128):
    return (v + align - 1) // align * align


def gpt2_flops_per_token(L, C, Vp, T):
    """src/model/model.c model_flops_per_token."""
    return 6.0 * (L * 12.0 * C * C + Vp * C) + 12.0 * L * C * T


def llama_flops_per_token(L, C, NH, KVH, F, Vp, T):
    """src/model/model.c model_flops_per_token for a Llama: q, o (C x C), k, v (KV x C), SwiGLU's three matrices."""
    KV = C // NH * KVH
    return 6.0 * (L * (2.0 * C * C + 2.0 * C * KV + 3.0 * C * F) + Vp * C) + 12.0 * L * C * T


WINDOW = 8  # steps whose median and spread are reported: the last 8 of at least 12


def gpu_state():
    """SM clock (MHz) and power (W) now, from nvidia-smi; None without one."""
    try:
        out = run_group(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader,nounits"],
                        None, 20)
        sm, pw, temp = (float(x) for x in out.stdout.decode().splitlines()[0].split(","))
        return {"sm_mhz": sm, "power_w": pw, "temp_c": temp}
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def summarize(per_run):
    """per_run: [(median, peak, tokens/s of the window steps), ...] of one side; medians, not means."""
    every = [x for r in per_run for x in r[2]]
    med = statistics.median(every)
    return {"tokens_per_s": round(med, 1), "run_medians": [round(r[0], 1) for r in per_run],
            "steps_used": len(every), "spread": round((max(every) - min(every)) / med, 4),
            "min": round(min(every), 1), "max": round(max(every), 1), "peak_device_bytes": max(r[1] for r in per_run)}


def gemm_tflops(emulate):
    """Best of 10 bf16 (emulated: fp32 on the CPU) square GEMMs, in TFLOP/s."""
    import torch
    cuda = torch.cuda.is_available() and not emulate
    n, dt, dev = (8192, torch.bfloat16, "cuda") if cuda else (256, torch.float32, "cpu")
    a = torch.randn(n, n, dtype=dt, device=dev)
    b = torch.randn(n, n, dtype=dt, device=dev)
    best = float("inf")
    for i in range(12):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch.matmul(a, b)
        if cuda:
            torch.cuda.synchronize()
        if i >= 2:
            best = min(best, time.perf_counter() - t0)
    name = torch.cuda.get_device_name() if cuda else "cpu"
    return 2.0 * n ** 3 / best / 1e12, n, name, cuda


def merged(base, extra):
    """base with extra's keys, nested dictionaries merged."""
    out = dict(base)
    for k, v in (extra or {}).items():
        out[k] = merged(out.get(k, {}), v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# Runs a command and prints its descendants' peak resident set (the trainer under mpirun included) as "@rss N".
RSS_WRAPPER = ("import resource, subprocess, sys; r = subprocess.call(sys.argv[1:]); "
               "print('@rss', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, flush=True); sys.exit(r)")


def run_shardlm(args, tag, model, micro, accum, steps, extra=None):
    """Trains with the CUDA build (extra: config keys merged in); returns (tokens/s median, peak device bytes, the
    window's tokens/s, the metrics' memory rows, peak host RSS bytes) or (None, why)."""
    data = os.path.join(TMP, f"tokens_{model['vocab_size']}.bin")
    if not os.path.exists(data):
        import numpy as np
        n = max(1 << 20, (steps * accum + 2) * micro * (model["n_positions"] + 1))
        write_shard(data, np.random.default_rng(5).integers(0, model["vocab_size"], size=n))
    metrics = os.path.join(TMP, tag + ".jsonl")
    cfg = {"model": model, "data": {"train": data, "seq_len": model["n_positions"], "shuffle": False},
           "train": {"steps": steps, "seed": 7, "eval_every": 0, "sample_tokens": 0, "metrics": metrics},
           "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": accum,
           "gradient_clipping": 1.0, "bf16": {"enabled": True},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1}},
           "zero_optimization": {"stage": 3}}
    cfg = merged(cfg, extra)
    path = os.path.join(TMP, tag + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [sys.executable, "-c", RSS_WRAPPER, "mpirun", "-np", "1", "--bind-to", "none", args.shardlm, "train", path,
           "--quiet"]
    r = run_group(cmd, ENV, args.part_timeout)
    if r is None:
        return None, f"timed out after {args.part_timeout} s (its process group killed)"
    out = r.stdout.decode(errors="replace")
    if r.returncode != 0 or not os.path.exists(metrics):
        said = [x for x in out.splitlines() if x.startswith("shardlm:")]  # the trainer's own error lines first
        return None, f"exit {r.returncode}: " + " | ".join(said[-2:] + out.strip().splitlines()[-2:])
    with open(metrics) as f:
        rows = [json.loads(x) for x in f if x.strip()]
    warm = 2 if accum == 1 else 1
    tps = [r["tokens_per_s"] for r in rows if "loss" in r and r["step"] > warm] or \
          [r["tokens_per_s"] for r in rows if "loss" in r][-1:]
    if not tps:
        return None, "no step in the metrics"
    mem = next((r["memory"] for r in rows if "memory" in r), {})
    rss = next((int(x.split()[1]) for x in out.splitlines() if x.startswith("@rss ")), 0)
    return (statistics.median(tps[-WINDOW:]), sum(v["peak"] for v in mem.values() if v["space"] == "device"),
            tps[-WINDOW:], mem, rss), ""


def run_torch(args, L, NH, C, T, B, V, Vp, accum, steps, extra=()):
    """tools/bench/torch_gpt2.py; returns (tokens/s median, peak bytes) or (None, why); why starts
    with 'skip' when the script skipped."""
    cmd = [args.python, TORCH_PY, "--n-layer", str(L), "--n-head", str(NH), "--n-embd", str(C), "--seq-len", str(T),
           "--batch", str(B), "--vocab", str(Vp), "--real-vocab", str(V), "--steps", str(steps),
           "--accum", str(accum), "--device", "cpu" if args.emulate else "cuda", "--dtype", "bf16", *extra]
    t = run_group(cmd, None, args.part_timeout)
    if t is None:
        return None, f"timed out after {args.part_timeout} s (its process group killed)"
    lines = t.stdout.decode(errors="replace").strip().splitlines()
    if t.returncode == 3 and lines and lines[-1].startswith("skip"):
        return None, lines[-1]
    summary = next((json.loads(x[8:]) for x in lines if x.startswith("summary ")), None)
    if summary is None:
        return None, f"exit {t.returncode}: " + " | ".join(lines[-3:])
    warm = 2 if accum == 1 else 1
    ms = (summary["ms"][warm:] or summary["ms"][-1:])[-WINDOW:]
    tps = [B * T * accum / (m / 1e3) for m in ms]
    return (statistics.median(tps), summary["peak_bytes"] or 0, tps), summary


LLAMA8B_TORCH = os.path.join(ROOT, "tools", "bench", "torch_llama8b.py")


def spaces(mem, key):
    """The metrics' memory rows summed per space: {space: bytes} of key ("planned" or "peak")."""
    out = {}
    for v in mem.values():
        out[v["space"]] = out.get(v["space"], 0) + v[key]
    return out


def llama8b(args, gemm):
    """Issue 45's workload (the docstring's llama8b): both modes, shardlm then PyTorch; the table's rows."""
    emulate = args.emulate
    L = int(os.environ.get("SESSION_8B_LAYERS", "4"))
    if emulate:  # torch_llama8b.py --width toy's shape
        L, T, B, accum, steps, width = 2, 32, 2, 2, 3, "toy"
        shape = {"n_head": 4, "n_kv_head": 2, "n_embd": 64, "ffn_dim": 224, "vocab_size": 512, "n_positions": T}
        scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 64}
    else:
        T, B, accum, steps, width = 2048, 2, 8, 10, "8b"
        # n_positions: rope_scaling's original context (it sizes the rotary tables and the data; T is 2048)
        shape = {"n_head": 32, "n_kv_head": 8, "n_embd": 4096, "ffn_dim": 14336, "vocab_size": 128256,
                 "n_positions": 8192}
        scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192}
    model = dict(type="llama", n_layer=L, rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=scaling,
                 tie_word_embeddings=False, **shape)
    C, NH, KVH, F, V = shape["n_embd"], shape["n_head"], shape["n_kv_head"], shape["ffn_dim"], shape["vocab_size"]
    KV = C // NH * KVH
    N = L * (2.0 * C * C + 2.0 * C * KV + 3.0 * C * F) + V * C
    rows = []
    for mode in ("full", "lora"):
        fpt = (6.0 if mode == "full" else 4.0) * N + 12.0 * L * C * T
        extra = {"data": {"seq_len": T}, "activation_checkpointing": {"enabled": True, "interval": 1},
                 "optimizer": {"params": {"lr": 1e-5, "weight_decay": 0.01}}}
        if mode == "full":
            extra["zero_optimization"] = {"offload_optimizer": {"device": "cpu"}}
        else:
            extra["lora"] = {"r": 16, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}
        fig = {"mode": mode, "layers": L, "of_layers": 32, "width": width, "T": T, "B": B, "accum": accum,
               "steps": steps, "emulated": emulate, "flops_per_token": fpt}
        s, why = run_shardlm(args, f"llama8b_{mode}", model, B, accum, steps, extra)
        ok(f"throughput.llama8b.{mode}.shardlm", s is not None and s[0] > 0, why)
        if s is not None:
            fig["shardlm"] = {"tokens_per_s": round(s[0], 1), "mfu_vs_peak": round(s[0] * fpt / 1e12 / PEAK_TFLOPS, 4),
                              "mfu_vs_gemm": round(s[0] * fpt / 1e12 / gemm, 4) if gemm else None,
                              "peak_device_bytes": s[1], "peak_host_rss_bytes": s[4],
                              "planned_by_space": spaces(s[3], "planned"), "peak_by_space": spaces(s[3], "peak")}
        cmd = [args.python, LLAMA8B_TORCH, "--mode", mode, "--width", width, "--layers", str(L), "--seq-len", str(T),
               "--batch", str(B), "--accum", str(accum), "--steps", str(steps),
               "--device", "cpu" if emulate else "cuda"]
        env = None
        if emulate and os.path.exists(os.path.join(REF5_VENV, "bin", "python")):
            # the rehearsal runs the reference for real, at toy size on the CPU, in build/ref5-venv (torch 2.11 with
            # FSDP2, transformers 5, PEFT: what the GPU machine's PyTorch has), where tools/deps.sh --test made it
            cmd[0], env = os.path.join(REF5_VENV, "bin", "python"), dict(ref5_env(), OMP_NUM_THREADS="2")
        t = run_group(cmd, env, args.part_timeout)
        lines = t.stdout.decode(errors="replace").strip().splitlines() if t is not None else []
        summary = next((json.loads(x[8:]) for x in lines if x.startswith("summary ")), None)
        p = None
        if t is not None and t.returncode == 3 and lines and lines[-1].startswith("skip"):
            skip(f"throughput.llama8b.{mode}.pytorch", lines[-1][5:].strip(" :"))
            fig["pytorch"] = {"status": "skip", "reason": lines[-1]}
        else:
            ok(f"throughput.llama8b.{mode}.pytorch", summary is not None,
               "timed out" if t is None else f"exit {t.returncode}: " + " | ".join(lines[-3:]))
        if summary:
            tps = [B * T * accum / (x / 1e3) for x in (summary["ms"][1:] or summary["ms"])[-WINDOW:]]
            p = (statistics.median(tps),)
            fig["pytorch"] = {"tokens_per_s": round(p[0], 1), "mfu_vs_peak": round(p[0] * fpt / 1e12 / PEAK_TFLOPS, 4),
                              "mfu_vs_gemm": round(p[0] * fpt / 1e12 / gemm, 4) if gemm else None,
                              "peak_device_bytes": summary["peak_bytes"],
                              "peak_host_rss_bytes": summary["peak_rss_bytes"], "offload": summary["offload"],
                              "what": "FSDP2 + CPUOffloadPolicy" if mode == "full" else "PEFT LoRA r16, SDPA"}
        if s is not None and p is not None:
            fig["ratio"] = round(s[0] / p[0], 3)
            fig["target_ratio"] = 1.5 if mode == "full" else 1.2
        figure(**{f"llama8b_{mode}": fig})
        rows.append((f"Llama 8B-wide {L}L {mode}", s and (s[0],), p, fpt))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--emulate", action="store_true", help="tiny shapes, emulated CUDA trainer, PyTorch on the CPU")
    ap.add_argument("--shardlm", default=None, help="the CUDA trainer (default bin/shardlm-cuda)")
    ap.add_argument("--python", default=sys.executable, help="the Python with torch for the reference")
    ap.add_argument("--part-timeout", type=float, default=60.0, help="seconds per training run")
    args = ap.parse_args()
    emulate = args.emulate
    if not args.shardlm:
        args.shardlm = os.path.join(ROOT, *(("build", "cudaemu", "shardlm-cudaemu") if emulate else ("bin", "shardlm-cuda")))
    figure(emulated=emulate, peak_tflops=PEAK_TFLOPS)

    gemm = None
    try:
        gemm, n, dev, on_gpu = gemm_tflops(emulate)
        ok("throughput.gemm", gemm > 0 and (on_gpu or emulate), f"torch has no CUDA device (ran on {dev})")
        figure(gemm={"tflops": round(gemm, 2), "n": n, "device": dev, "dtype": "bf16" if on_gpu else "fp32",
                     "emulated": not on_gpu})
    except Exception as e:  # noqa: BLE001 (any torch failure is this check's failure)
        ok("throughput.gemm", False, f"{type(e).__name__}: {e}")

    # which parts (SESSION_THROUGHPUT_PARTS: a session split over two device calls runs llama8b on its own)
    parts = os.environ.get("SESSION_THROUGHPUT_PARTS", "gpt2,llama12l,llama8b").split(",")
    rows = []
    steps = 3 if emulate else 12
    if "gpt2" in parts:
        # GPT-2 350M (emulated: a tiny GPT-2 of the same layout)
        # At least 12 steps (the median and spread of the last 8), shardlm and PyTorch
        # alternated twice, the SM clock and power read after each run (issue 35)
        L, NH, C, T, V, B, steps = (2, 2, 64, 32, 256, 2, 3) if emulate else (24, 16, 1024, 1024, 50257, 8, 12)
        Vp = padded(V)
        fpt = gpt2_flops_per_token(L, C, Vp, T)
        model = {"n_layer": L, "n_head": NH, "n_embd": C, "n_positions": T, "vocab_size": V}
        for accum in (1, 8):
            fig = {"model": "gpt2_350m", "B": B, "T": T, "accum": accum, "steps": steps, "window": WINDOW,
                   "emulated": emulate, "order": [], "after_each": []}
            got = {"shardlm": [], "pytorch": []}
            for rep in range(2):
                s, why = run_shardlm(args, f"gpt2_acc{accum}_{rep}", model, B, accum, steps)
                ok(f"throughput.gpt2_350m.acc{accum}.shardlm.{rep}", s is not None and s[0] > 0, why)
                fig["after_each"].append({"run": f"shardlm.{rep}", "gpu": gpu_state()})
                p, pwhy = run_torch(args, L, NH, C, T, B, V, Vp, accum, steps)
                ok(f"throughput.gpt2_350m.acc{accum}.pytorch.{rep}", p is not None and p[0] > 0, pwhy)
                fig["after_each"].append({"run": f"pytorch.{rep}", "gpu": gpu_state()})
                fig["order"] += [f"shardlm.{rep}", f"pytorch.{rep}"]
                for side, res in (("shardlm", s), ("pytorch", p)):
                    if res is not None:
                        got[side].append(res)
            for side, runs in got.items():
                if runs:
                    fig[side] = summarize(runs)
                    tps = fig[side]["tokens_per_s"]
                    fig[side].update(mfu_vs_peak=round(tps * fpt / 1e12 / PEAK_TFLOPS, 4),
                                     mfu_vs_gemm=round(tps * fpt / 1e12 / gemm, 4) if gemm else None)
            figure(**{f"gpt2_350m_acc{accum}": fig})
            s = (fig["shardlm"]["tokens_per_s"],) if "shardlm" in fig else None
            p = (fig["pytorch"]["tokens_per_s"],) if "pytorch" in fig else None
            rows.append((f"GPT-2 350M acc {accum}", s, p, fpt))

    if "llama12l" in parts:
        # the 12-layer Llama shape
        L, NH, KVH, C, FF, T, V, B = (2, 2, 1, 64, 128, 32, 256, 2) if emulate else (12, 12, 4, 768, 2048, 512, 32000, 16)
        fpt_l = llama_flops_per_token(L, C, NH, KVH, FF, padded(V), T)
        model = {"type": "llama", "n_layer": L, "n_head": NH, "n_kv_head": KVH, "n_embd": C, "ffn_dim": FF,
                 "n_positions": T, "vocab_size": V}
        fig = {"B": B, "T": T, "emulated": emulate}
        s, why = run_shardlm(args, "llama_12l", model, B, 1, steps)
        ok("throughput.llama_12l.shardlm", s is not None and s[0] > 0, why)
        p, pwhy = run_torch(args, L, NH, C, T, B, V, V, 1, steps,
                            ("--arch", "llama", "--kv-heads", str(KVH), "--ffn", str(FF)))
        if p is None and str(pwhy).startswith("skip"):
            skip("throughput.llama_12l.pytorch", pwhy[5:].strip(" :"))
            fig["pytorch"] = {"status": "skip", "reason": pwhy}
        else:
            ok("throughput.llama_12l.pytorch", p is not None and p[0] > 0, pwhy)
        for side, res in (("shardlm", s), ("pytorch", p)):
            if res is not None:
                fig[side] = {"status": "pass", "tokens_per_s": round(res[0], 1),
                             "mfu_vs_peak": round(res[0] * fpt_l / 1e12 / PEAK_TFLOPS, 4),
                             "mfu_vs_gemm": round(res[0] * fpt_l / 1e12 / gemm, 4) if gemm else None,
                             "peak_device_bytes": res[1]}
        figure(llama_12l=fig)
        rows.append(("Llama 12L", s, p, fpt_l))

    if "llama8b" in parts:
        rows += llama8b(args, gemm)

    note = " (EMULATED: meaningless)" if emulate else ""
    print(f"| model{note} | shardlm tok/s | MFU | PyTorch tok/s | MFU | ratio |\n|---|---|---|---|---|---|")
    for label, s, p, fpt in rows:
        def f(x, fmt):
            return fmt.format(x) if x is not None else "n/a"
        st, pt = s and s[0], p and p[0]
        print(f"| {label} | {f(st, '{:.0f}')} | {f(st and st * fpt / 1e12 / PEAK_TFLOPS, '{:.1%}')} | "
              f"{f(pt, '{:.0f}')} | {f(pt and pt * fpt / 1e12 / PEAK_TFLOPS, '{:.1%}')} | "
              f"{f(st and pt and st / pt, '{:.2f}')} |")
    n_failed = failures()
    print(f"{passed} passed, {n_failed} failed")
    return 1 if n_failed else 0


if __name__ == "__main__":
    sys.exit(main())
