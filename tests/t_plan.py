#!/usr/bin/env python3
"""t_plan — `shardlm plan` (issue 8): presets, sizes, fit search, messages, and the
trainer's measured peaks against the plan the command prints.

Checks (one "ok NAME" / "FAIL NAME: why" line each):
  preset.*    every preset's parameter count (--json n_params, vocabulary padding
              removed) equals the published total exactly (GPT-2 124M..1.5B,
              Llama-2 6.74 B, 13.0 B, 68.98 B)
  bad.*       unknown preset (exit 2, one stderr line listing every known preset);
              --gpu-mem / --host-mem "80XB", "-1", "", "1e400" (exit 2, one line
              naming the option); sizes "80GB", "80GiB", "8e10" accepted with the
              value they mean (the fit verdict flips exactly at the plan's bytes)
  opt.*       --help; --ranks 0, ranks not a multiple of --nodes, an unknown
              --target, --fit without --gpu-mem, two CONFIGs: exit 2, one line
  train.llama a Llama config from a preset trains (exit 0) and is plannable on the
              cpu target
  goal.*      Llama-2-70B, 8 ranks, bf16, seq 4096, stage 3 + activation
              checkpointing + optimizer and parameter offload: <= 24 GB per GPU
              and fits 80 GB GPUs; without parameter offload it does not fit 24 GB
              and says by how much and which setting to change (exit 4); with
              nothing offloaded it prints a combination of keys that fits, raising
              the stage when the config's stage cannot fit (fp32 stage 0: 1.17 TiB)
  fit.*       --fit at 24 GB per GPU and 2 TiB per node prints config keys; the plan
              with those keys fits, and micro-batch + 1 does not; a given
              train_batch_size is kept (micro-batch divides it, accumulation printed)
  readme.*    every row tools/plan_tables.py prints is in docs/memory.md or methods.md
  zero.*      model states per GPU of a 7.5 B-parameter model on 64 GPUs at stages
              0-3 equal shardlm's accounting (fp16 params and grads, fp32
              gradient accumulators, master weights, Adam m and v) exactly;
              communication per step = DESIGN §3's formulas
  peak.*      tiny GPT-2 shapes on the CPU backend under mpirun, N = 1, 2, 4,
              stages 0-3, fp32/bf16/fp16, checkpointing intervals, cpu_checkpointing,
              GPT-2 and Llama (grouped-query, untied and tied heads),
              optimizer and parameter offload: for every buffer class the bytes and
              space `shardlm plan --target cpu --json` prints equal the trainer's
              plan and its measured peak (metrics file), and the bytes sent per
              step equal the plan's communication figures; offload_param gives
              the losses and gradient norms of the same run without it, exactly
  nvme.*      offload to NVMe (issue 36): the optimizer file's elements are CPU
              offload's master row's; its bytes, piece and buffers equal nvme.h's
              nvme_sizes formula (8 ranks' files are 8 x one on the node), master, m and v
              leave the pinned arena by exactly their bytes, host per node counts the
              buffers, the bytes per step and --nvme-bw's seconds; the parameter file;
              the settings line and the nvme section; bad --nvme-bw (0, negative,
              junk, empty): exit 2, one line; --fit puts state on NVMe only where
              nvme_path is set and nothing fits without it, the optimizer first, then
              the parameters, saying so (the nvme_open file size against the plan:
              tests/unit/test_plan.c)
  attention.* SHARDLM_ATTENTION=materialized (the CPU's T x T attention): plan
              equals peak for every class, the block activations exceed the
              tiled kernel's (the default) by exactly the probabilities each layer
              keeps instead of its log-sum-exp, and the losses agree within 1e-5;
              an unknown kernel is refused (exit 2, one line naming the variable)
"""
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BIN, ENV, ROOT, check, note, run_main, scratch_dir, write_shard  # noqa: E402

TMP = scratch_dir("t_plan")
GB = 1e9


def plan(*args, cfg=None):
    cmd = [BIN, "plan"] + ([cfg] if cfg else []) + list(args)
    r = subprocess.run(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    return r.returncode, r.stdout.decode(), r.stderr.decode()


def plan_json(*args, cfg=None):
    rc, out, err = plan(*args, "--json", cfg=cfg)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    return rc, (json.loads(lines[-1]) if lines else None), out, err


def one_error_line(err):
    lines = [line for line in err.splitlines() if line.strip()]
    return len(lines) == 1 and lines[0].startswith("shardlm: error: ")


# ---- presets, bad input ---------------------------------------------------------------------------
PUBLISHED = {"gpt2-124m": 124439808, "gpt2-350m": 354823168, "gpt2-774m": 774030080, "gpt2-1.5b": 1557611200,
             "llama2-7b": 6738415616, "llama2-13b": 13015864320, "llama2-70b": 68976648192,
             "llama3.1-8b": 8030261248}
SHAPES = {"gpt2-124m": (768, 50257, 1), "gpt2-350m": (1024, 50257, 1), "gpt2-774m": (1280, 50257, 1),
          "gpt2-1.5b": (1600, 50257, 1), "llama2-7b": (4096, 32000, 2), "llama2-13b": (5120, 32000, 2),
          "llama2-70b": (8192, 32000, 2), "llama3.1-8b": (4096, 128256, 2)}


def check_presets():
    for name, want in PUBLISHED.items():
        rc, j, out, err = plan_json("--preset", name)
        C, V, mats = SHAPES[name]
        padding = ((V + 127) // 128 * 128 - V) * C * mats
        got = j["n_params"] - padding if j else None
        check(f"preset.{name}.n_params", rc == 0 and got == want, f"rc {rc}, got {got}, published {want}: {err}")
    # Phi-4 (microsoft/phi-4's config.json): the Llama-like count from its shape, untied, no vocabulary padding
    C, L, NH, NKV, F, V = 5120, 40, 40, 10, 17920, 100352
    hs = C // NH
    want = 2 * V * C + C + L * (C * (NH + 2 * NKV) * hs + NH * hs * C + 3 * C * F + 2 * C)
    rc, j, out, err = plan_json("--preset", "phi-4")
    check("preset.phi-4.n_params", rc == 0 and j["n_params"] == want == 14659507200, f"rc {rc}, {j and j['n_params']}")
    rc, _, out, err = plan_json("--preset", "llama2-70b")
    check("preset.llama2-70b.printed", "68.98 B" in out and "8 KV heads" in out and "SwiGLU" in out, out[:300])


def check_bad_input():
    rc, out, err = plan("--preset", "llama9-1t")
    known = ["gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b", "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b",
             "llama3.1-8b", "llama3.1-70b", "qwen2.5-7b", "qwen2.5-72b", "qwen3-8b", "qwen3-32b", "phi-4"]
    check("bad.unknown_preset", rc == 2 and one_error_line(err) and all(k in err for k in known),
          f"rc {rc}, stderr {err!r}")
    for opt in ("gpu-mem", "host-mem"):
        for text in ("80XB", "-1", "", "1e400"):
            rc, out, err = plan("--preset", "gpt2-124m", f"--{opt}", text)
            check(f"bad.{opt}_{text or 'empty'}", rc == 2 and one_error_line(err) and f"--{opt}" in err,
                  f"rc {rc}, stderr {err!r}")
    # the sizes mean what they say: the plan's device bytes fit in exactly that many bytes, not one fewer
    _, j, _, _ = plan_json("--preset", "gpt2-124m")
    need = j["space_total"]["device"]
    for text, value in (("80GB", 80e9), ("80GiB", 80 * 2 ** 30), ("8e10", 8e10)):
        rc, j2, _, _ = plan_json("--preset", "gpt2-124m", "--gpu-mem", text)
        check(f"size.{text}", rc == 0 and j2["fits"] is True, f"rc {rc}")
    for n, want_rc in ((need, 0), (need - 1, 4)):
        rc, j2, out, _ = plan_json("--preset", "gpt2-124m", "--gpu-mem", str(n))
        check(f"size.exact_{'fits' if want_rc == 0 else 'one_byte_short'}", rc == want_rc, f"rc {rc} for {n} B")


def check_options():
    rc, out, err = plan("--help")
    check("opt.help", rc == 0 and "--gpu-mem" in out and "llama2-70b" in out, err)
    for args, needle in ((["--ranks", "0"], "--ranks"), (["--ranks", "8", "--nodes", "3"], "--nodes 3"),
                         (["--target", "tpu"], "--target"), (["--fit"], "--fit needs --gpu-mem"),
                         (["a.json", "b.json"], "at most one CONFIG")):
        rc, out, err = plan("--preset", "gpt2-124m", *args)
        check(f"opt.bad_{args[0].strip('-')}", rc == 2 and one_error_line(err) and needle in err,
              f"rc {rc}, stderr {err!r}")
    # the cuda target is what bin/shardlm-cuda allocates, Llama included; without SHARDLM_FP32_ACTIVATIONS it is
    # the gpu target
    rc, j, out, err = plan_json("--preset", "llama2-7b", "--target", "cuda", "--set", "bf16.enabled=true")
    rc2, j2, out2, err2 = plan_json("--preset", "llama2-7b", "--target", "gpu", "--set", "bf16.enabled=true")
    check("opt.cuda_target_llama", rc == 0 and rc2 == 0 and j["memory"] == j2["memory"] and
          j["memory"]["block activations"]["bytes"] > 0, f"rc {rc} {rc2}: {err} {err2}")
    # the optimizer state on the device, or in pinned host memory with offload_optimizer
    rc, j, out, err = plan_json("--preset", "gpt2-124m", "--target", "cuda", "--set", "bf16.enabled=true")
    rc2, j2, out2, err2 = plan_json("--preset", "gpt2-124m", "--target", "cuda", "--set", "bf16.enabled=true",
                                    "--set", "zero_optimization.stage=2",
                                    "--set", "zero_optimization.offload_optimizer.device=cpu")
    spaces = [(x["memory"]["Adam m"]["space"], x["memory"]["fp32 master weights"]["space"]) if x else None
              for x in (j, j2)]
    check("opt.cuda_target_optimizer_placement", rc == 0 and rc2 == 0 and spaces[0] == ("device", "device")
          and spaces[1] == ("pinned host", "pinned host") and j["memory"]["host staging"]["bytes"] > 0
          and j["memory"]["fp32 compute copies"]["bytes"] == 0, f"spaces {spaces}: {err} {err2}")



def check_train_llama():
    path = os.path.join(TMP, "llama.json")
    write_shard(os.path.join(TMP, "tok.bin"), np.arange(5000) % 100)
    with open(path, "w") as f:
        json.dump({"model": {"preset": "llama2-7b", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_kv_head": 2,
                             "ffn_dim": 128, "vocab_size": 100, "n_positions": 16},
                   "data": {"train": os.path.join(TMP, "tok.bin")}, "train_micro_batch_size_per_gpu": 1}, f)
    r = subprocess.run([BIN, "train", path, "--set", "train.steps=2", "--set", "train.sample_tokens=0", "--quiet"],
                       env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    err = r.stderr.decode()
    check("train.llama_trains", r.returncode == 0, f"rc {r.returncode}: {err[-300:]!r}")
    rc, j, out, err = plan_json("--target", "cpu", cfg=path)
    check("train.llama_plannable_on_cpu_target", rc == 0 and j and j["space_total"]["device"] > 0, err)


# ---- the 70B goal, fit ----------------------------------------------------------------------------
L70 = ["--preset", "llama2-70b", "--ranks", "8", "--set", "bf16.enabled=true", "--set", "zero_optimization.stage=3"]
GOAL = ["--set", "activation_checkpointing.enabled=true", "--set", "zero_optimization.offload_optimizer.device=cpu",
        "--set", "zero_optimization.offload_param.device=cpu"]


def check_goal_and_fit():
    rc, j, out, err = plan_json(*L70, *GOAL, "--gpu-mem", "80GB")
    dev = j["space_total"]["device"] if j else None
    check("goal.70b_le_24GB_per_gpu", rc == 0 and j["seq_len"] == 4096 and dev <= 24 * GB and j["fits"] is True,
          f"rc {rc}, device {dev}: {err}")
    note(f"70B goal: device {dev / GB:.2f} GB per GPU, host {j['host_per_node'] / GB:.1f} GB per node")
    rc, out, err = plan(*L70, *GOAL[:4], "--gpu-mem", "24GB")
    check("goal.not_fit_says_by_how_much_and_what", rc == 4 and "does not fit: needs 30.43 GiB per GPU, 8.08 GiB over "
          "22.35 GiB; try zero_optimization.offload_param.device=cpu (14.37 GiB per GPU" in out, out[-400:])
    rc, out, err = plan(*L70, "--gpu-mem", "24GB")
    check("goal.not_fit_combination", rc == 4 and "no single setting is enough; this combination fits" in out and
          "  --set zero_optimization.offload_param.device=cpu" in out, out[-400:])
    rc, out, err = plan("--preset", "llama2-70b", "--ranks", "8", "--gpu-mem", "80GB")
    check("goal.not_fit_raises_stage", rc == 4 and "needs 1.17 TiB per GPU" in out and
          "  --set zero_optimization.stage=3" in out, out[-500:])
    rc, out, err = plan(*L70, "--fit", "--gpu-mem", "24GB", "--host-mem", "2TiB")
    sets = [line.split()[1] for line in out.splitlines() if line.startswith("  --set ")]
    check("fit.prints_keys", rc == 0 and any(s.startswith("train_micro_batch_size_per_gpu=") for s in sets), out[:600])
    if not sets:
        return
    args = [a for s in sets for a in ("--set", s)]
    rc, j, out2, _ = plan_json(*L70, *args, "--gpu-mem", "24GB", "--host-mem", "2TiB")
    check("fit.result_fits", rc == 0 and j["fits"] is True, out2[-300:])
    micro = int(next(s for s in sets if s.startswith("train_micro")).split("=")[1])
    more = [a if not a.startswith("train_micro") else f"train_micro_batch_size_per_gpu={micro + 1}" for a in args]
    rc, j, out3, _ = plan_json(*L70, *more, "--gpu-mem", "24GB", "--host-mem", "2TiB")
    check("fit.one_more_does_not", rc == 4 and j["fits"] is False, out3[-300:])
    note(f"fit 70B at 24 GB: {' '.join(sets)}")
    # a given train_batch_size stays: the micro-batch divides its share per rank (24 / 8 = 3, where 4 would fit
    # at 80 GB) and the accumulation makes up the rest; the keys make a config the plan accepts and that fits
    rc, out, err = plan(*L70, "--set", "train_batch_size=24", "--fit", "--gpu-mem", "80GB", "--host-mem", "2TiB")
    sets = dict(line.split()[1].split("=", 1) for line in out.splitlines() if line.startswith("  --set "))
    micro, accum = int(sets.get("train_micro_batch_size_per_gpu", 0)), int(sets.get("gradient_accumulation_steps", 0))
    check("fit.keeps_train_batch_size", rc == 0 and micro > 0 and 3 % micro == 0 and micro * accum == 3, out[-500:])
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    rc, j, out2, _ = plan_json(*L70, "--set", "train_batch_size=24", *args, "--gpu-mem", "80GB", "--host-mem", "2TiB")
    check("fit.keeps_train_batch_size_result_fits", rc == 0 and j["fits"] is True, out2[-300:])


# ---- ZeRO paper: 7.5 B parameters on 64 GPUs ----------------------------------------------------------
# GPT-2 layout, 36 layers, d_model 4096, 32 heads, vocab 50257, context 2048: 7.46 B parameters.
PAPER = ["--set", "model.n_layer=36", "--set", "model.n_embd=4096", "--set", "model.n_head=32", "--set",
         "model.n_positions=2048", "--set", "fp16.enabled=true", "--ranks", "64"]


def check_zero_paper():
    rc, j, _, _ = plan_json(*PAPER)
    psi_units = None
    for stage in range(4):
        extra = ["--set", f"zero_optimization.stage={stage}"]
        rc, j, out, err = plan_json(*PAPER, *extra)
        if rc != 0 or j is None:
            check(f"zero.stage{stage}", False, err)
            continue
        m = j["memory"]
        psi = j["n_params"]
        if psi_units is None:
            psi_units = psi
        # exact accounting (64-byte rounding per unit aside): bytes per parameter
        per = j["model_states"] / psi
        want = {0: 2 + 2 + 4 + 12, 1: 2 + 2 + 4 + 12 / 64, 2: 2 + (4 + 12) / 64, 3: (2 + 4 + 12) / 64}[stage]
        recv = m["gradient shard"]["bytes"] / psi if stage >= 2 else 0  # the one reduce-scatter receive buffer
        check(f"zero.stage{stage}.model_states", abs(per - recv - want) / want < 2e-3,
              f"{per:.4f} B/param ({recv:.4f} receive buffer), want {want:.4f}")
        # DESIGN §3 traffic with fp16 elements
        n = 64
        ag, rs, ar = j["bytes_allgather"], j["bytes_reduce_scatter"], j["bytes_allreduce"]
        vol = {0: ar, 1: ar + ag, 2: rs + ag, 3: rs + ag}[stage] / (2 * psi * (n - 1) / n)
        want_vol = {0: 2, 1: 3, 2: 2, 3: 3}[stage]
        check(f"zero.stage{stage}.traffic", abs(vol - want_vol) < 2e-3, f"{vol:.4f} x 2 Psi (N-1)/N, want {want_vol}")
        note(f"7.5B/64 stage {stage}: model states {j['model_states'] / GB:.2f} GB per GPU")


# ---- measured peaks equal the plan ---------------------------------------------------------------
V, T = 100, 16
DATA = os.path.join(TMP, "train.bin")


def peak_config(name, model, stage, dtype="fp32", micro=2, accum=2, interval=0, cpu_ckpt=False, off_opt=False,
                off_param=False):
    cfg = {
        "model": dict(model, vocab_size=V, n_positions=T),
        "data": {"train": DATA, "seq_len": T, "shuffle": False},
        "train": {"steps": 3, "metrics": os.path.join(TMP, name + ".jsonl"), "sample_tokens": 0},
        "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": accum,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": stage, "stage3_prefetch_bucket_size": 20000,
                              "stage3_param_persistence_threshold": 100,
                              "offload_optimizer": {"device": "cpu" if off_opt else "none"}},
    }
    if off_param:
        cfg["zero_optimization"]["offload_param"] = {"device": "cpu"}
    if dtype != "fp32":
        cfg[dtype] = {"enabled": True}
    if interval:
        cfg["activation_checkpointing"] = {"enabled": True, "interval": interval, "cpu_checkpointing": cpu_ckpt}
    path = os.path.join(TMP, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


A = {"n_layer": 2, "n_head": 2, "n_embd": 32}
B = {"n_layer": 3, "n_head": 4, "n_embd": 48}
C = {"n_layer": 4, "n_head": 4, "n_embd": 64}
LG = {"type": "llama", "n_layer": 3, "n_head": 4, "n_kv_head": 2, "n_embd": 32, "ffn_dim": 40}
LT = {"type": "llama", "n_layer": 2, "n_head": 2, "n_kv_head": 1, "n_embd": 32, "ffn_dim": 48,
      "tie_word_embeddings": True}


def peak_cases():
    cases = []
    for N in (1, 2, 4):
        for stage in range(4):
            cases.append((f"A_N{N}_s{stage}", N, dict(model=A, stage=stage)))
    for N in (2, 4):
        for stage in (1, 2, 3):
            cases.append((f"B_N{N}_s{stage}_bf16_ckpt2_off", N,
                          dict(model=B, stage=stage, dtype="bf16", interval=2, off_opt=True)))
    for N in (1, 2, 4):
        cases.append((f"C_N{N}_s3_fp16_ckpt1cpu_offall", N,
                      dict(model=C, stage=3, dtype="fp16", interval=1, cpu_ckpt=True, off_opt=True, off_param=True)))
    cases.append(("C_N2_s3_fp16_ckpt1cpu_offopt", 2,
                  dict(model=C, stage=3, dtype="fp16", interval=1, cpu_ckpt=True, off_opt=True)))
    cases.append(("C_N4_s2_bf16_ckpt3_m1", 4, dict(model=C, stage=2, dtype="bf16", interval=3, micro=1, accum=3)))
    cases.append(("B_N2_s0_fp16_ckpt1", 2, dict(model=B, stage=0, dtype="fp16", interval=1)))
    for N in (1, 2, 4):
        for stage in range(4):
            cases.append((f"LG_N{N}_s{stage}", N, dict(model=LG, stage=stage)))
    cases.append(("LG_N2_s3_bf16_ckpt2_off", 2, dict(model=LG, stage=3, dtype="bf16", interval=2, off_opt=True)))
    cases.append(("LG_N4_s3_fp16_ckpt1cpu_offall", 4,
                  dict(model=LG, stage=3, dtype="fp16", interval=1, cpu_ckpt=True, off_opt=True, off_param=True)))
    cases.append(("LT_N2_s2_bf16_ckpt1", 2, dict(model=LT, stage=2, dtype="bf16", interval=1)))
    cases.append(("LT_N3_s3_fp32", 3, dict(model=LT, stage=3)))
    return cases


def check_peaks():
    write_shard(DATA, np.random.default_rng(7).integers(0, V, size=400 * T + 1))
    curves = {}
    for name, N, kw in peak_cases():
        cfg = peak_config(name, **kw)
        mpath = os.path.join(TMP, name + ".jsonl")
        cmd = ["mpirun", "-np", str(N), "--oversubscribe", BIN, "train", cfg, "--quiet"]
        r = subprocess.run(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
        if r.returncode != 0 or not os.path.exists(mpath):
            check(f"peak.{name}.run", False, f"exit {r.returncode}: {r.stdout.decode()[-400:]}")
            continue
        rows = [json.loads(line) for line in open(mpath) if line.strip()]
        mem = next((row["memory"] for row in rows if "memory" in row), None)
        steps = [row for row in rows if "loss" in row]
        curves[name] = [(row["loss"], row["grad_norm"]) for row in steps]
        rc, j, out, err = plan_json("--target", "cpu", "--ranks", str(N), cfg=cfg)
        if mem is None or j is None or rc != 0:
            check(f"peak.{name}", False, f"metrics memory {mem is not None}, plan rc {rc}: {err}")
            continue
        bad = [f"{c}: plan {j['memory'][c]}, trainer planned {v['planned']} peak {v['peak']} in {v['space']}"
               for c, v in mem.items()
               if not (j["memory"][c]["bytes"] == v["planned"] == v["peak"] and j["memory"][c]["space"] == v["space"])]
        check(f"peak.{name}.every_class_plan_eq_peak", not bad and len(mem) == len(j["memory"]), "; ".join(bad[:4]))
        kinds = ("bytes_allgather", "bytes_reduce_scatter", "bytes_allreduce")
        off = [(row["step"], {k: row[k] for k in kinds}) for row in steps if any(row[k] != j[k] for k in kinds)]
        check(f"peak.{name}.traffic_eq_plan", steps and not off,
              f"plan {({k: j[k] for k in kinds})}, logged {off[:1]}")
    # parameter offload moves the shards, not the results
    a, b = curves.get("C_N2_s3_fp16_ckpt1cpu_offall"), curves.get("C_N2_s3_fp16_ckpt1cpu_offopt")
    check("peak.offload_param_same_losses_and_norms", a is not None and a == b, f"{a} vs {b}")


def arena_round(n):
    return (n + 63) // 64 * 64  # src/backend/arena.h: ARENA_ALIGN


def check_attention_kernels():
    """The materialized kernel against the tiled one (default) on case A at N = 2, stage 2."""
    name, N, kw = "A_N2_s2", 2, dict(model=A, stage=2)
    env = dict(ENV, SHARDLM_ATTENTION="materialized")
    cfg = peak_config(name + "_materialized", **kw)
    r = subprocess.run(["mpirun", "-np", str(N), "--oversubscribe", BIN, "train", cfg, "--quiet"], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
    mpath = os.path.join(TMP, name + "_materialized.jsonl")
    if r.returncode != 0 or not os.path.exists(mpath):
        check("attention.materialized_run", False, f"exit {r.returncode}: {r.stdout.decode()[-400:]}")
        return
    rows = [json.loads(line) for line in open(mpath) if line.strip()]
    mem = next((row["memory"] for row in rows if "memory" in row), None)
    p = subprocess.run([BIN, "plan", cfg, "--target", "cpu", "--ranks", str(N), "--json"], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    j = json.loads([line for line in p.stdout.decode().splitlines() if line.startswith("{")][-1])
    bad = [c for c, v in mem.items() if not j["memory"][c]["bytes"] == v["planned"] == v["peak"]]
    check("attention.materialized_plan_eq_peak", not bad, f"{bad}: {mem} vs {j['memory']}")
    rc, tiled, _, err = plan_json("--target", "cpu", "--ranks", str(N), cfg=peak_config(name, **kw))
    micro, NH, L = 2, A["n_head"], A["n_layer"]
    want = L * (arena_round(4 * micro * NH * T * T) - arena_round(4 * micro * NH * T))
    got = j["memory"]["block activations"]["bytes"] - tiled["memory"]["block activations"]["bytes"]
    check("attention.materialized_keeps_probabilities", rc == 0 and got == want, f"{got} more bytes, want {want}")
    tiled_rows = [json.loads(line) for line in open(os.path.join(TMP, name + ".jsonl")) if line.strip()]
    losses = [[row["loss"] for row in rs if "loss" in row] for rs in (rows, tiled_rows)]
    check("attention.materialized_same_losses", len(losses[0]) == len(losses[1]) > 0 and
          all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(*losses)), f"{losses}")
    r = subprocess.run([BIN, "plan", cfg, "--target", "cpu"], env=dict(ENV, SHARDLM_ATTENTION="flash"),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    err = r.stderr.decode()
    check("attention.unknown_kernel_refused", r.returncode == 2 and one_error_line(err) and "SHARDLM_ATTENTION" in err,
          f"exit {r.returncode}: {err!r}")


# ---- offload to NVMe (issue 36) -----------------------------------------------------------------------
NVME_PIECE, NVME_ALIGN, NVME_BUFFERS_MIN = 2 << 20, 1024, 3
CFG70 = os.path.join(ROOT, "input", "llama2_70b_finetune.json")
OPT_NVME = ["--set", "zero_optimization.offload_optimizer.device=nvme"]
OPT_PATH = ["--set", "zero_optimization.offload_optimizer.nvme_path=/nvme/a"]
PARAM_NVME = ["--set", "zero_optimization.offload_param.device=nvme"]
PARAM_PATH = ["--set", "zero_optimization.offload_param.nvme_path=/nvme/b"]
STATE_ROWS = ("fp32 master weights", "Adam m", "Adam v")


def nvme_sizes(n, buffers):
    """nvme.h's nvme_sizes, from its comment: the file and the pinned buffers of a range of n elements."""
    piece = NVME_PIECE if n >= NVME_PIECE else max(1, -(-n // NVME_ALIGN)) * NVME_ALIGN
    return -(-n // piece) * 12 * piece, max(buffers, NVME_BUFFERS_MIN) * 12 * piece, piece


def check_nvme():
    # one rank, stage 1, fp32: the one file holds the elements CPU offload's master row holds (every parameter,
    # each unit padded to 16); buffer_count 2 takes the minimum, 3
    # (the trainer's own target: a device target adds the engine's one-unit stage of the master to its row)
    small = ["--preset", "gpt2-124m", "--set", "zero_optimization.stage=1", "--target", "cpu"]
    rc, j, out, err = plan_json(*small, *OPT_NVME, *OPT_PATH, "--set",
                                "zero_optimization.offload_optimizer.buffer_count=2")
    rc2, jc, _, _ = plan_json(*small, "--set", "zero_optimization.offload_optimizer.device=cpu")
    nv = j["nvme"] if j else {}
    file, host, piece = nvme_sizes(nv.get("optimizer_elems", 0), 2)
    master = jc["memory"]["fp32 master weights"]["bytes"] if jc else None
    check("nvme.file_is_nvme_sizes", rc == 0 and 4 * nv["optimizer_elems"] == master and
          0 <= nv["optimizer_elems"] - j["n_params"] < 16 * 64 and
          (nv["optimizer_file"], nv["optimizer_buffers"], nv["optimizer_piece"]) == (file, host, piece) and
          j["space_total"]["nvme"] == file and nv["param_file"] == 0, f"rc {rc}, {nv}, want {file} {host} {piece}")
    rows = sum(jc["memory"][k]["bytes"] for k in STATE_ROWS) if jc else None
    # the fp32 gradient shard moves from pinned host memory (CPU offload) to the device (as without offload)
    g32 = jc["memory"]["fp32 gradient shard"] if jc else {}
    check("nvme.rows_leave_pinned", rc2 == 0 and all(j["memory"][k]["bytes"] == 0 for k in STATE_ROWS) and
          all(nv["memory"][k] == file / 3 for k in STATE_ROWS) and g32["space"] == "pinned host" and
          g32["bytes"] > 0 and j["memory"]["fp32 gradient shard"] == dict(g32, space="device") and
          jc["space_total"]["pinned host"] - j["space_total"]["pinned host"] == rows + g32["bytes"] and
          j["space_total"]["device"] - jc["space_total"]["device"] == g32["bytes"], f"{j['memory'] if j else err}")
    check("nvme.host_counts_buffers", j and j["host_per_node"] == j["space_total"]["pinned host"] +
          j["space_total"]["host"] + host and j["model_states"] == jc["model_states"] - rows + file,
          f"host {j and j['host_per_node']}")
    check("nvme.traffic_and_default_bw", j and nv["read_per_step"] == file and nv["written_per_step"] == file and
          nv["bandwidth_per_node"] == 2e9 and abs(nv["optimizer_seconds"] - 2 * file / 2e9) < 1e-9 * file,
          f"{nv}")
    check("nvme.printed", "offload_optimizer nvme, offload_param none" in out and "nvme (files on disk)" in out and
          "NVMe buffers (optimizer)" in out and f"{file} B" in out and "optimizer phase" in out, out[-1500:])
    # Llama-2-70B on 8 ranks of one node: the disk per node is 8 files; --nvme-bw is shared by the ranks
    rc, j, out, err = plan_json(*OPT_NVME, *OPT_PATH, *PARAM_NVME, *PARAM_PATH, "--ranks", "8", "--gpu-mem", "80GB",
                                "--nvme-bw", "6GB/s", cfg=CFG70)
    nv = j["nvme"] if j else {}
    file, host, piece = nvme_sizes(nv.get("optimizer_elems", 0), 4)
    moved = nv.get("read_per_step", 0) + nv.get("written_per_step", 0) - nv.get("param_read_per_step", 0)
    check("nvme.70b_8_ranks", rc == 0 and (nv["optimizer_file"], nv["optimizer_buffers"]) == (file, host) and
          8.5e9 < nv["optimizer_elems"] < 8.7e9 and nv["disk_per_node"] == 8 * (file + nv["param_file"]) and
          nv["param_buffers"] == 5 * nv["param_unit"] and nv["param_unit"] % 4096 == 0 and
          abs(nv["optimizer_seconds"] - moved / (6e9 / 8)) < 1e-9 * moved and
          nv["param_written_per_step"] == nv["param_file"] and
          j["memory"]["parameter shard"]["bytes"] == 0 and nv["memory"]["parameter shard"] == nv["param_file"],
          f"rc {rc}: {nv} {err[-300:]}")
    check("nvme.buffer_size_note", "offload_param.buffer_size 100000000 elements is below the largest unit shard"
          in out, out[-1200:])
    note(f"70B, optimizer + parameters on NVMe: {nv.get('disk_per_node', 0) / GB:.0f} GB of disk per node, "
         f"optimizer phase {nv.get('optimizer_seconds', 0):.0f} s at 6 GB/s, "
         f"host {j and j['host_per_node'] / GB:.0f} GB")
    for text in ("0", "-1", "junk", "", "0GB/s", "6XB/s"):
        rc, out, err = plan("--preset", "gpt2-124m", "--nvme-bw", text)
        name = text.replace("/", "_per_") or "empty"
        check(f"nvme.bad_bw_{name}", rc == 2 and one_error_line(err) and "--nvme-bw" in err, f"rc {rc}, stderr {err!r}")
    # --fit: at 300 GB per node the optimizer state fits only on NVMe, and only where its nvme_path is set
    fit = ["--ranks", "8", "--gpu-mem", "80GB", "--fit"]
    rc, out, err = plan(*fit, "--host-mem", "300GB", cfg=CFG70)
    check("nvme.fit_needs_path", rc == 4 and "device=nvme" not in out and "nvme_path" in out, out[-600:])
    rc, out, err = plan(*fit, "--host-mem", "300GB", *OPT_PATH, cfg=CFG70)
    sets = [line.split()[1] for line in out.splitlines() if line.startswith("  --set ")]
    # (the fp32 gradient shard on the device under nvme: the fit may offload the parameters to host memory)
    check("nvme.fit_moves_optimizer", rc == 0 and "zero_optimization.offload_optimizer.device=nvme" in sets and
          ("zero_optimization.offload_param.device=none" in sets or
           "zero_optimization.offload_param.device=cpu" in sets) and "goes to NVMe under '/nvme/a'" in out,
          out[-800:])
    # the fit's micro-batch with a global batch it divides (accumulation 32)
    micro = [int(s.split("=")[1]) for s in sets if s.startswith("train_micro_batch_size_per_gpu=")] or [1]
    args = [a for s in sets + [f"train_batch_size={micro[0] * 8 * 32}"] if not s.startswith("gradient_accumulation")
            for a in ("--set", s)]
    rc, j, _, _ = plan_json(*args, *OPT_PATH, "--ranks", "8", "--gpu-mem", "80GB", "--host-mem", "300GB", cfg=CFG70)
    check("nvme.fit_result_fits", rc == 0 and j["fits"] is True and j["host_per_node"] <= 300e9, f"rc {rc}")
    rc, out, err = plan(*fit, "--host-mem", "2TB", *OPT_PATH, cfg=CFG70)
    check("nvme.fit_prefers_host_memory", rc == 0 and "device=nvme" not in out and "device=cpu" in out, out[-600:])
    # 48 GB GPUs need the parameters offloaded; at 150 GB per node they go to NVMe too, after the optimizer state
    # (24 GB GPUs no longer fit: the fp32 gradient shard, 32 GiB per rank, is in device memory under nvme)
    rc, out, err = plan("--ranks", "8", "--gpu-mem", "48GB", "--fit", "--host-mem", "150GB", *OPT_PATH, *PARAM_PATH,
                        cfg=CFG70)
    check("nvme.fit_then_parameters", rc == 0 and "  --set zero_optimization.offload_optimizer.device=nvme" in out and
          "  --set zero_optimization.offload_param.device=nvme" in out and "parameter shard goes to NVMe" in out and
          "  --set zero_optimization.offload_param.buffer_size=106956800" in out,
          out[-800:])


def check_nvme_peaks():
    """Offload to NVMe in the trainer: every class's planned bytes == the trainer's planned == peak, and the files
    and buffers the trainer reports (metrics "nvme" and "nvme_param" lines) == the plan's (after check_peaks, whose
    data shard it uses)."""
    for name, N, opt, par, kw in (
            ("nA_N2_s2", 2, True, False, dict(model=A, stage=2, off_opt=True)),
            ("nC_N3_s3_fp16", 3, True, False, dict(model=C, stage=3, dtype="fp16", interval=1, cpu_ckpt=True,
                                                    off_opt=True)),
            ("pC_N2_s3_bf16", 2, False, True, dict(model=C, stage=3, dtype="bf16", interval=1, off_opt=True,
                                                    off_param=True)),
            ("pLG_N1_s3_fp16", 1, False, True, dict(model=LG, stage=3, dtype="fp16", off_opt=True, off_param=True)),
            ("bC_N2_s3_fp32", 2, True, True, dict(model=C, stage=3, off_opt=True, off_param=True))):
        cfg = peak_config(name, **kw)
        with open(cfg) as f:
            c = json.load(f)
        z = c["zero_optimization"]
        if opt:
            z["offload_optimizer"] = {"device": "nvme", "nvme_path": os.path.join(TMP, "nv")}
        if par:
            z["offload_param"] = {"device": "nvme", "nvme_path": os.path.join(TMP, "nv")}
        with open(cfg, "w") as f:
            json.dump(c, f)
        r = subprocess.run(["mpirun", "-np", str(N), "--oversubscribe", BIN, "train", cfg, "--quiet"], env=ENV,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
        if r.returncode:
            check(f"nvme.peak.{name}.run", False, r.stdout.decode()[-400:])
            continue
        with open(os.path.join(TMP, name + ".jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        mem = next(row["memory"] for row in rows if "memory" in row)
        nvl = next((row["nvme"] for row in rows if "nvme" in row), None)
        pvl = next((row["nvme_param"] for row in rows if "nvme_param" in row), None)
        rc, j, out, err = plan_json("--target", "cpu", "--ranks", str(N), cfg=cfg)
        bad = [f"{k}: plan {j['memory'][k]}, trainer {v}" for k, v in mem.items()
               if not (j["memory"][k]["bytes"] == v["planned"] == v["peak"] and j["memory"][k]["space"] == v["space"])]
        check(f"nvme.peak.{name}.plan_eq_peak", rc == 0 and not bad, "; ".join(bad[:3]))
        nv = j["nvme"]
        ok_opt = (nvl is not None and nvl["file_bytes"] == nv["optimizer_file"] > 0
                  and nvl["host_bytes"] == nv["optimizer_buffers"] > 0) if opt else nvl is None
        ok_par = (pvl is not None and pvl["file_bytes"] == nv["param_file"] > 0
                  and pvl["host_bytes"] == nv["param_buffers"] > 0) if par else pvl is None
        check(f"nvme.peak.{name}.files_and_buffers", ok_opt and ok_par, f"{nvl} / {pvl} vs {nv}")


# ---- DPO (issue 37): the reference costs no parameters ---------------------------------------------
def check_dpo():
    """A dpo section: a micro-batch of B pairs is planned as 2B rows (every buffer class equals the SFT plan at
    micro-batch 2B), no reference weights (model states and parameters equal the SFT plan's at B), the LoRA
    reference forward adds no memory and gathers the units once more; full fine-tune (precomputed reference)
    traffic unchanged."""
    base = L70 + ["--set", "activation_checkpointing.enabled=true", "--set", "data.seq_len=1024"]
    lora = ["--set", "lora.r=16", "--set", "lora.target_modules=all-linear"]
    dpo = ["--set", "dpo.beta=0.1"]
    for kind, extra, ref in (("full", [], "precomputed"), ("lora", lora, "adapters_off")):
        for target in ("gpu", "cpu"):
            name = f"dpo.{kind}.{target}"
            at = ["--target", target] + base + extra
            rc, d, out, err = plan_json(*at, "--set", "train_micro_batch_size_per_gpu=2", *dpo)
            _, sft2, _, _ = plan_json(*at, "--set", "train_micro_batch_size_per_gpu=2")
            _, sft4, _, _ = plan_json(*at, "--set", "train_micro_batch_size_per_gpu=4")
            planned = bool(rc == 0 and d and sft2 and sft4)
            check(f"{name}.plans", planned, err[-300:])
            if not planned:
                continue
            check(f"{name}.rows_are_2x_pairs", d["memory"] == sft4["memory"],
                  str({k: (v["bytes"], sft4["memory"][k]["bytes"]) for k, v in d["memory"].items()
                       if v != sft4["memory"][k]}))
            check(f"{name}.no_reference_weights", d["model_states"] == sft2["model_states"] and
                  d["n_params"] == sft2["n_params"] and
                  d["memory"]["parameter shard"] == sft2["memory"]["parameter shard"],
                  f"{d['model_states']} vs {sft2['model_states']}")
            check(f"{name}.json", d.get("dpo") == {"rows_per_micro_batch": 4, "reference": ref,
                                                  "reference_param_bytes": 0, "reference_extra_activation_bytes": 0},
                  str(d.get("dpo")))
            check(f"{name}.says_no_reference_weights", "reference weights: 0 B (the reference costs no parameters"
                  in out and "micro-batch 2 pairs = 4 rows" in out, out[:600])
            check(f"{name}.reduce_scatter_same", d["bytes_reduce_scatter"] == sft2["bytes_reduce_scatter"],
                  f"{d['bytes_reduce_scatter']} vs {sft2['bytes_reduce_scatter']}")
            if kind == "lora":
                acts = [ln for ln in out.splitlines() if ln.startswith("DPO reference forward (LoRA)")]
                check(f"{name}.lora_forward_line", len(acts) == 1 and "0 B more" in acts[0] and
                      "working-activation peak stays" in acts[0], out[:900])
                # the reference forward gathers each sharded unit once; the policy's forward and backward twice
                ratio = d["bytes_allgather"] / sft2["bytes_allgather"]
                check(f"{name}.reference_forward_gathers", 1.45 < ratio < 1.55, f"all-gather ratio {ratio}")
            else:
                check(f"{name}.traffic_same", d["bytes_allgather"] == sft2["bytes_allgather"],
                      f"{d['bytes_allgather']} vs {sft2['bytes_allgather']}")


PLAN_TABLE_PAGES = ("memory.md", "methods.md")  # the pages that hold the planner tables


def check_readme_tables():
    """Every table row tools/plan_tables.py prints is in docs/memory.md or docs/methods.md (LoRA) as printed (the tables there say they come
    from it; a change to the planner that moves a figure must move the page's too)."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "plan_tables.py"), "--bin", BIN],
                       capture_output=True, text=True, env=ENV, timeout=300)
    rows = [x for x in r.stdout.splitlines() if x.startswith("| ") and not x.startswith("|---")]
    readme = ""
    for page in PLAN_TABLE_PAGES:
        with open(os.path.join(ROOT, "docs", page)) as f:
            readme += f.read()
    stale = [x for x in rows if x not in readme]
    check("readme.plan_tables_rows", r.returncode == 0 and len(rows) >= 20 and not stale,
          f"exit {r.returncode}, {len(rows)} rows, not in docs/{' or '.join(PLAN_TABLE_PAGES)}: {stale[:3]} {r.stderr[-200:]}")



# ---- QLoRA: the 70B base stored and gathered in 4 bits (issue 50) -------------------------------------
Q70 = ["--preset", "llama2-70b", "--ranks", "2", "--set", "bf16.enabled=true", "--set", "zero_optimization.stage=3",
       "--set", "data.seq_len=2048", "--set", "lora.r=64", "--set", "lora.alpha=16",
       "--set", "lora.target_modules=all-linear", "--set", "quantization.bnb_4bit_quant_type=nf4",
       "--set", "quantization.bnb_4bit_use_double_quant=true", "--set", "quantization.bnb_4bit_compute_dtype=bfloat16",
       *GOAL]


def q4_block_sizes(ranks):
    """One Llama-2-70B block at N ranks: (padded elements, a rank's 4-bit shard bytes), from the layout of
    zero.h's struct q4_layout: each linear weight in whole 64-blocks, ceil(blocks / N) per rank, 32 bytes of
    codes and, double-quantized, bitsandbytes' nested form: a byte per block (padded to 4), the fp32 nested
    absmax of each group of 256 blocks a rank's blocks touch (the most any rank touches) and the fp32 offset;
    the two norms (the plain part) padded to N * 16 elements, bf16."""
    C, F, KV = 8192, 28672, 1024
    linears = [C * C, KV * C, KV * C, C * C, F * C, F * C, C * F]
    numel = sum(linears) + 2 * C  # every tensor a multiple of 16 elements: no alignment gaps
    padded = -(-numel // (ranks * 16)) * ranks * 16

    def nested(blocks):
        per = -(-blocks // ranks)
        touched = max((min(blocks, (r + 1) * per) - 1) // 256 - r * per // 256 + 1
                      for r in range(ranks) if r * per < blocks)
        return per * 32 + -(-per // 4) * 4 + (touched + 1) * 4

    q4 = sum(nested(n // 64) for n in linears)
    plain = -(-(2 * C) // (ranks * 16)) * 16
    return padded, -(-(q4 + plain * 2) // 16) * 16


def arena(b):
    return -(-b // 64) * 64


def check_qlora_70b():
    """Llama-2-70B QLoRA r 64, T 2048, activation checkpointing, offload, N = 2 on 24 GB GPUs: the plan counts
    the 4-bit shards, gathers and compute slot; the same run without quantization is the LoRA plan."""
    rc, q, out, err = plan_json(*Q70, "--set", "quantization.load_in_4bit=true", "--gpu-mem", "24GB",
                                "--host-mem", "128GB")
    rc2, lo, _, err2 = plan_json(*Q70, "--set", "quantization.load_in_4bit=false", "--gpu-mem", "24GB")
    if not (rc == 0 and rc2 == 0 and q and lo):
        check("qlora70b.plans", False, f"rc {rc} {rc2}: {err[-300:]} {err2[-300:]}")
        return
    mem = {k: v["bytes"] for k, v in q["memory"].items()}
    lmem = {k: v["bytes"] for k, v in lo["memory"].items()}
    padded, shard = q4_block_sizes(2)
    L = 80
    # the pinned parameter shards: the LoRA plan's with every block's bf16 shard replaced by its 4-bit one
    want = lmem["parameter shard"] - L * arena(padded // 2 * 2) + L * arena(shard)
    check("qlora70b.param_shard", mem["parameter shard"] == want, f"{mem['parameter shard']} vs {want}")
    # 855638016 quantized weights: 6684672 blocks per rank x (32 bytes of codes + 1 of qabsmax), 26112 nested
    # absmax and 7 offsets (fp32), and 8192 norm elements x 2 bytes (fp32 absmax instead: 240664576)
    check("qlora70b.param_shard_bytes", shard == 220715040, f"{shard}")
    # gathered slots hold the N shards in 4 bits; one compute slot holds a block dequantized to bf16
    # the same slots as LoRA's (the prefetch counts elements), each the two 4-bit shards instead of a bf16 block
    slots = (lmem["gathered units"] - mem["gathered units"]) / (arena(padded * 2) - arena(2 * shard))
    check("qlora70b.gathered", slots == int(slots) and 1 <= slots <= 3,
          f"{mem['gathered units']} vs LoRA {lmem['gathered units']}: {slots} slots")
    check("qlora70b.compute_slot", mem["fp32 compute copies"] == arena(padded * 2),
          f"{mem['fp32 compute copies']} vs {arena(padded * 2)}")
    # each block gathered for forward and again for backward: (N - 1) x its shard, twice
    saved = lo["bytes_allgather"] - q["bytes_allgather"]
    check("qlora70b.traffic", saved == L * 2 * (padded // 2 * 2 - shard), f"{saved}")
    dev, host = q["space_total"]["device"], q["host_per_node"]
    check("qlora70b.targets", dev <= 20 * 2**30 and host <= 128e9 and q["fits"] is True,
          f"device {dev / 2**30:.2f} GiB, host {host / 2**30:.2f} GiB")
    check("qlora70b.printed", "stored and gathered in 4 bits" in out, out[:800])
    note(f"Llama-2-70B QLoRA N=2: {dev / 2**30:.2f} GiB per GPU, {host / 2**30:.2f} GiB host per node "
         f"(LoRA: {lo['space_total']['device'] / 2**30:.2f} GiB, {lo['host_per_node'] / 2**30:.2f} GiB); all-gather "
         f"{q['bytes_allgather'] / lo['bytes_allgather']:.3f} of LoRA's")

def main():
    check_readme_tables()
    check_presets()
    check_bad_input()
    check_options()
    check_train_llama()
    check_goal_and_fit()
    check_qlora_70b()
    check_zero_paper()
    check_peaks()
    check_attention_kernels()
    check_nvme()
    check_nvme_peaks()
    check_dpo()


if __name__ == "__main__":
    run_main("t_plan", main)
