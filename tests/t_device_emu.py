#!/usr/bin/env python3
"""t_device_emu — the engine's device paths on the CPU (backend.h, devemu.h).

SHARDLM_EMULATE_DEVICE=1 makes the CPU backend act as a device backend: the
optimizer state stays in device memory (pinned host memory with
offload_optimizer), token ids and losses go through
staging buffers, every cast of device data runs as a backend call, and device
memory is a PROT_NONE view, so one host read or write of it crashes the run.
With fp32 activations (SHARDLM_FP32_ACTIVATIONS=1) the math is the same as
without emulation, so the results must be identical to the bit; with the
default half-precision activations of a GPU in fp16/bf16 (backend.h [A]) they
must stay close. This is how the CUDA build's engine logic is tested without
a GPU.

Checks (one "ok NAME" / "FAIL NAME: why" line each):
  same.CASE     emulated (fp32 activations) and plain runs of CASE (N=2;
                stages 0-3; fp32, fp16, bf16; offload; activation
                checkpointing in device and pinned memory; an fp16 overflow
                step): identical loss and grad norm at every step and
                identical final parameters
  act.CASE      the half-precision cases again with half-precision
                activations: every step's loss within 1e-2 (fp16) / 3e-2
                (bf16) of the plain run, planned == peak, and a device total
                below the fp32-activation run's
  sample.CASE   with validation and a text sample: the same validation losses
                and the same sampled text
  mem.CASE      under emulation: planned == peak for every buffer class;
                master weights, Adam m and v and the fp32 gradient shard in
                device memory, or in pinned host memory with offload_optimizer;
                token and loss staging in pinned host memory
  ckpt.*        a checkpoint saved under emulation resumes in a plain run (and
                the reverse) to the same final parameters as an uninterrupted run
  plan.CASE     `shardlm plan --target cuda --json` (what bin/shardlm-cuda
                allocates) equals the emulated run's planned and peak bytes
                and spaces for every buffer class, but the attention's scratch
                (the CPU backend's tiled kernel needs a few tiles; both keep
                each row's log-sum-exp) and cuBLAS's workspace, which must be
                exactly the difference
  gpu_target.CASE  what the CUDA build
                allocates (--target cuda, tied to the run by plan.CASE) in
                every buffer class equals `shardlm plan --target gpu`
                (DESIGN §5), bytes and space: no fp32 compute copies or send
                buffers; half-precision gradient buffers, residual stream and
                logits; the attention's statistics only
  pretrained.DT  a Llama exported to a Hugging Face directory in fp32 and bf16:
                training from it and `shardlm eval` of it, emulated and plain, equal
                to the bit (fp32 read as stored, then copied to the device)
  (CASE includes Llama: bf16 stage 3, fp16 stage 2 with checkpointing,
  a tied head in fp32 stage 1)
  fit.*         with an emulated device capacity (SHARDLM_EMULATE_DEVICE_MEM):
                a plan that fits logs "the plan needs X of the Y free" and the
                memory in use at the end; one that does not stops with exit 2
                before allocating, naming the shortfall and the largest items
(tests/unit/test_devemu.c checks the emulation itself: host access faults,
collectives refuse a mix of device and host buffers.)
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BIN, ENV, check, read_dump, run_main, scratch_dir, write_shard  # noqa: E402

TMP = scratch_dir("t_device_emu")
V, T, STEPS = 100, 16, 8
MODEL = {"n_layer": 3, "n_head": 2, "n_embd": 32, "n_positions": T, "vocab_size": V}
LLAMA = {"type": "llama", "n_kv_head": 1, "ffn_dim": 48}
DATA = os.path.join(TMP, "train.bin")
write_shard(DATA, np.random.default_rng(77).integers(0, V, size=200 * T + 1))

# name: (stage, dtype, extra config)
CASES = {
    "s0_fp32": (0, "fp32", {}),
    "s1_bf16": (1, "bf16", {}),
    "s2_fp16": (2, "fp16", {}),
    "s3_fp32": (3, "fp32", {}),
    "s3_bf16": (3, "bf16", {}),
    "s3_eval_sample": (3, "bf16", {"data": {"val": DATA}, "train": {"eval_every": 4, "sample_tokens": 6}}),
    "s3_bf16_offload": (3, "bf16", {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}),
    "s3_fp16_offload_param": (3, "fp16", {"zero_optimization": {"offload_param": {"device": "cpu"},
                                                                "offload_optimizer": {"device": "cpu"}}}),
    "s2_fp32_ckpt": (2, "fp32", {"activation_checkpointing": {"enabled": True, "interval": 2}}),
    "s3_fp16_cpuckpt": (3, "fp16", {"activation_checkpointing": {"enabled": True, "interval": 1,
                                                                  "cpu_checkpointing": True}}),
    # Llama (the same heads, layers and channels, so the attention deltas below hold): 2 query heads over one
    # KV head, SwiGLU, untied or tied head
    "llama_s3_bf16": (3, "bf16", {"model": LLAMA}),
    "llama_s2_fp16_ckpt": (2, "fp16", {"model": LLAMA, "activation_checkpointing": {"enabled": True,
                                                                                     "interval": 2}}),
    "llama_tied_s1_fp32": (1, "fp32", {"model": dict(LLAMA, tie_word_embeddings=True)}),
}
OPTIMIZER_CLASSES = ("fp32 master weights", "Adam m", "Adam v", "fp32 gradient shard")


def merge(a, b):
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(a.get(k), dict):
            merge(a[k], v)
        else:
            a[k] = v


def make_config(name, stage, dtype, extra, steps=STEPS, ckdir=None):
    cfg = {
        "model": dict(MODEL),
        "data": {"train": DATA, "seq_len": T, "shuffle": False},
        "train": {"steps": steps, "seed": 99, "eval_every": 0, "sample_tokens": 0},
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
    }
    if dtype != "fp32":
        cfg[dtype] = {"enabled": True}
    if ckdir:
        cfg["checkpoint"] = {"dir": ckdir, "every": 4}
    merge(cfg, extra)
    path = os.path.join(TMP, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def run(name, cfg, emulate, extra_args=(), env_extra=None, N=2, f32_acts=True):
    metrics = os.path.join(TMP, name + ".jsonl")
    final = os.path.join(TMP, name + ".final")
    if os.path.exists(metrics) and "--resume" not in extra_args:
        os.remove(metrics)
    env = dict(ENV, SHARDLM_EMULATE_DEVICE="1" if emulate else "0", SHARDLM_FP32_ACTIVATIONS="1" if f32_acts else "0",
               **(env_extra or {}))
    cmd = ["mpirun", "-np", str(N), "--oversubscribe", BIN, "train", cfg, "--quiet", "--dump-final", final,
           "--set", "train.metrics=" + metrics]
    r = subprocess.run(cmd + list(extra_args), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=300)
    out = r.stdout.decode(errors="replace")
    if r.returncode != 0:
        return None, out
    with open(metrics) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {"rows": [x for x in rows if "loss" in x], "val": [x for x in rows if "val_loss" in x], "memory": next(x["memory"] for x in rows if "memory" in x),
            "final": read_dump(final)}, out


def same_params(a, b):
    """The name of the first tensor that differs, or None."""
    for k in a:
        if k not in b or not np.array_equal(a[k], b[k]):
            return k
    return None


def arena_round(n):
    return (n + 63) // 64 * 64


def plan_memory(name, cfg, target, env=ENV):
    """The memory classes of `shardlm plan CFG --ranks 2 --target TARGET --json`, or None (a FAIL NAME line)."""
    r = subprocess.run([BIN, "plan", cfg, "--ranks", "2", "--target", target, "--json"], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    lines = r.stdout.decode(errors="replace").strip().splitlines()
    try:
        return json.loads(lines[-1])["memory"]
    except (ValueError, KeyError, IndexError):
        check(name, False, " | ".join(lines[-3:]))
        return None


# The CPU backend's tiled attention (src/backend/cpu/backend_cpu_attention.c): tiles of ATTN_TILE_Q queries x ATTN_TILE_K
# keys, its scratch per thread two tiles and two row vectors.
ATTN_TILE_Q, ATTN_TILE_K = 128, 512


def cpu_attention_scratch_floats(T):
    rows, keys = min(T, ATTN_TILE_Q), min(T, ATTN_TILE_K)
    return 2 * rows * keys + 2 * rows


def check_cuda_plan(tag, cfg, run_memory, f32_acts):
    """plan --target cuda against an emulated run: the same but for the attention's scratch, which the CPU
    backend's tiled kernel needs (OMP_NUM_THREADS=1) and the CUDA backend does not (both keep each row's
    log-sum-exp, B NH T fp32), and cuBLAS's workspace."""
    planned = plan_memory(f"plan.{tag}", cfg, "cuda", dict(ENV, SHARDLM_FP32_ACTIVATIONS="1" if f32_acts else "0"))
    if planned is None:
        return
    delta = {
        "workspace": arena_round((32 << 20) + 256 - 64)  # cuBLAS's workspace, 256-byte aligned (gpt2.c)
        - arena_round(4 * max(cpu_attention_scratch_floats(T), 2 * MODEL["n_embd"])),
    }
    bad = []
    for k, v in run_memory.items():
        want = v["planned"] + delta.get(k, 0)
        p = planned.get(k, {"bytes": 0, "space": v["space"]})
        if p["bytes"] != want or v["peak"] != v["planned"] or (want and p["space"] != v["space"]):
            bad.append(f"{k}: plan {p['bytes']} {p['space']}, run {v['planned']}/{v['peak']} {v['space']}")
    extra_classes = [k for k, v in planned.items() if v["bytes"] and k not in run_memory]
    check(f"plan.{tag}", not bad and not extra_classes, f"{bad}; only in the plan: {extra_classes}")


# What the CUDA engine allocates against what the planner's GPU target (DESIGN §5) says (issue 15): every
# class, bytes and space, equal.
def check_gpu_target(tag, cfg):
    """--target gpu against --target cuda (what bin/shardlm-cuda allocates: plan.CASE ties it to this
    emulated run's measured peaks, but for what the CPU backend's own attention and libraries need)."""
    planned = plan_memory(f"gpu_target.{tag}", cfg, "gpu")
    cuda = plan_memory(f"gpu_target.{tag}", cfg, "cuda", dict(ENV, SHARDLM_FP32_ACTIVATIONS="0"))
    if planned is None or cuda is None:
        return
    bad = []
    for k in sorted(set(planned) | set(cuda)):
        p = planned.get(k, {"bytes": 0, "space": "device"})
        v = cuda.get(k, {"bytes": 0, "space": p["space"]})
        if p["bytes"] != v["bytes"] or (p["bytes"] and p["space"] != v["space"]):
            bad.append(f"{k}: GPU target {p['bytes']} {p['space']}, CUDA build {v['bytes']} {v['space']}")
    check(f"gpu_target.{tag}", not bad, f"{bad}")


def compare(tag, plain, emu):
    pr = [(x["loss"], x["grad_norm"], x["skipped"]) for x in plain["rows"]]
    er = [(x["loss"], x["grad_norm"], x["skipped"]) for x in emu["rows"]]
    diff = same_params(plain["final"], emu["final"])
    pv = [x["val_loss"] for x in plain["val"]]
    ev = [x["val_loss"] for x in emu["val"]]
    check(f"same.{tag}", pr == er and len(pr) == STEPS and diff is None and pv == ev,
          f"steps {len(pr)}/{len(er)}, rows equal {pr == er}, first differing tensor {diff}, "
          f"validation {pv} vs {ev}")


def pretrained():
    """pretrained.DT: a Llama read from a Hugging Face directory (exported from a checkpoint of its own) in fp32,
    where the parameters are the master and are read as stored into host memory before the device copy, and in
    bf16: training from it (ZeRO 3, N = 2) and `shardlm eval` of it give the plain run's results to the bit."""
    ckdir = os.path.join(TMP, "pre_ck")
    shutil.rmtree(ckdir, ignore_errors=True)
    stage, dtype, extra = CASES["llama_s3_bf16"]
    src, out = run("pre_src", make_config("pre_src", stage, "fp32", extra, steps=4, ckdir=ckdir), False)
    for dt in ("fp32", "bf16"):
        hf = os.path.join(TMP, "pre_hf_" + dt)
        shutil.rmtree(hf, ignore_errors=True)
        r = subprocess.run([BIN, "export", ckdir, hf, "--dtype", dt], env=ENV, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=120)
        if src is None or r.returncode != 0:
            check(f"pretrained.{dt}", False, (out if src is None else r.stdout.decode()).strip().splitlines()[-3:])
            continue
        path = make_config("pre_" + dt, 3, dt, {}, steps=2)
        with open(path) as f:
            cfg = json.load(f)
        cfg["model"] = {"from_pretrained": hf}
        with open(path, "w") as f:
            json.dump(cfg, f)
        runs = [run(f"pre_{dt}_{'emu' if e else 'plain'}", path, e) for e in (False, True)]
        ok = all(x is not None for x, _ in runs)
        diff = same_params(runs[0][0]["final"], runs[1][0]["final"]) if ok else "run failed"
        same_loss = ok and [x["loss"] for x in runs[0][0]["rows"]] == [x["loss"] for x in runs[1][0]["rows"]]
        evals = []
        for e in ("0", "1"):
            r = subprocess.run([BIN, "eval", hf, "--data", DATA, "--seq-len", str(T), "--max-batches", "2", "--json"],
                               env=dict(ENV, SHARDLM_EMULATE_DEVICE=e, SHARDLM_FP32_ACTIVATIONS="1"),
                               capture_output=True, timeout=120)
            lines = [x for x in r.stdout.decode(errors="replace").splitlines() if x.startswith("{")]
            evals.append(json.loads(lines[-1]).get("loss") if r.returncode == 0 and lines else
                         " | ".join(r.stderr.decode(errors="replace").strip().splitlines()[-2:]))
        failed = "" if ok else " | ".join(next(o for x, o in runs if x is None).strip().splitlines()[-3:])
        check(f"pretrained.{dt}", ok and same_loss and diff is None and isinstance(evals[0], float)
              and evals[0] == evals[1],
              f"train: {failed} differing tensor {diff}, same losses {same_loss}; eval plain/emulated {evals}")


def main():
    for tag, (stage, dtype, extra) in CASES.items():
        env_extra = {"SHARDLM_INJECT_INF_STEP": "3"} if dtype == "fp16" else None
        cfg = make_config(tag, stage, dtype, extra)
        plain, out_p = run(tag + "_plain", cfg, False, env_extra=env_extra)
        emu, out_e = run(tag + "_emu", cfg, True, env_extra=env_extra)
        if plain is None or emu is None:
            check(f"same.{tag}", False, "run failed: " + " | ".join((out_p if plain is None else out_e)
                                                                    .strip().splitlines()[-4:]))
            continue
        compare(tag, plain, emu)
        if dtype == "fp32":
            check_cuda_plan(tag, cfg, emu["memory"], True)
            check_gpu_target(tag, cfg)
        if "sample_tokens" in extra.get("train", {}):
            samples = [o[o.find("---- sample"):o.find("---- end of sample")] for o in (out_p, out_e)]
            check(f"sample.{tag}", len(emu["val"]) == 2 and samples[0] == samples[1] and len(samples[0]) > 30,
                  f"{len(emu['val'])} validations; samples {samples}")
        mem = emu["memory"]
        bad = [k for k, v in mem.items() if v["planned"] != v["peak"]]
        offload = "offload_optimizer" in extra.get("zero_optimization", {})
        want_space = {k: "pinned host" if offload else "device" for k in OPTIMIZER_CLASSES}
        want_space["host staging"] = "pinned host"
        misplaced = [f"{k} in {mem[k]['space']}" for k, v in want_space.items() if k in mem and mem[k]["space"] != v]
        missing = [k for k in ("Adam m", "host staging") if k not in mem]
        check(f"mem.{tag}", not bad and not misplaced and not missing,
              f"planned != peak: {bad}; misplaced (offload_optimizer {offload}): {misplaced}; missing: {missing}")
        if dtype == "fp16":
            skipped = [x["step"] for x in emu["rows"] if x["skipped"]]
            check(f"overflow.{tag}", skipped == [3], f"skipped steps {skipped}, expected [3]")
        if dtype != "fp32":
            half, out_h = run(tag + "_act", cfg, True, env_extra=env_extra, f32_acts=False)
            if half is None:
                check(f"act.{tag}", False, " | ".join(out_h.strip().splitlines()[-4:]))
                continue
            tol = 1e-2 if dtype == "fp16" else 3e-2
            worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(half["rows"], plain["rows"]))
            device = [sum(v["peak"] for v in r["memory"].values() if v["space"] == "device") for r in (half, emu)]
            bad = [k for k, v in half["memory"].items() if v["planned"] != v["peak"]]
            check_cuda_plan(tag, cfg, half["memory"], False)
            check_gpu_target(tag, cfg)
            check(f"act.{tag}", len(half["rows"]) == STEPS and worst <= tol and not bad and device[0] < device[1],
                  f"worst loss difference {worst:.3g} (tol {tol}), planned != peak {bad}, device {device}")

    # checkpoints cross over between emulated and plain runs
    stage, dtype, extra = CASES["s3_bf16"]
    full, _ = run("ck_full", make_config("ck_full", stage, dtype, extra), False)
    for tag, first_emu in (("emu_to_plain", True), ("plain_to_emu", False)):
        ckdir = os.path.join(TMP, "ck_" + tag)
        shutil.rmtree(ckdir, ignore_errors=True)
        name = "ck_" + tag
        first, out1 = run(name, make_config(name, stage, dtype, extra, steps=4, ckdir=ckdir), first_emu)
        second, out2 = run(name, make_config(name, stage, dtype, extra, steps=STEPS, ckdir=ckdir), not first_emu,
                           extra_args=("--resume", "auto"))
        ok = full is not None and first is not None and second is not None
        diff = same_params(full["final"], second["final"]) if ok else "run failed"
        check(f"ckpt.{tag}", ok and diff is None and "resumed from" in out2,
              f"first differing tensor {diff}; " + " | ".join((out2 or out1).strip().splitlines()[-3:]))

    pretrained()

    # the plan against the device's free memory
    cfg = make_config("fit", 3, "bf16", {})
    r, out = run("fit_ok", cfg, True, env_extra={"SHARDLM_EMULATE_DEVICE_MEM": str(1 << 30)}, N=1)
    check("fit.fits", r is not None and "the plan needs" in out and "of the 1.00 GiB free" in out
          and "device memory at the end" in out, out.strip().splitlines()[-3:])
    r = subprocess.run(["mpirun", "-np", "1", BIN, "train", cfg, "--quiet"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=120,
                       env=dict(ENV, SHARDLM_EMULATE_DEVICE="1", SHARDLM_EMULATE_DEVICE_MEM="100000"))
    out = r.stdout.decode(errors="replace")
    errs = [x for x in out.splitlines() if "error:" in x]
    check("fit.too_small", r.returncode != 0 and len(errs) >= 1 and "more than the 97.66 KiB free" in errs[0]
          and "largest: fp32 master weights" in errs[0] and "Hint" in errs[0], out.strip().splitlines()[-3:])


if __name__ == "__main__":
    run_main("t_device_emu", main)
