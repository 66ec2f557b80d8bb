#!/usr/bin/env python3
"""dpo — DPO's step time (issue 37): shardlm's DPO with LoRA against TRL's
DPOTrainer with PEFT (or, where TRL cannot run, a PyTorch loop with the same
loss) over transformers' LlamaForCausalLM, and shardlm's DPO step against its
own SFT step on the same tokens, in one run.

Driven by tools/bench/dpo.sh (which builds bin/shardlm and the sgemm probe
first). On train_llama.py's 12-layer Llama shape (12 layers, C 768, 12 heads /
4 KV heads, FFN 2048, vocab 32000, T 512, fp32, untied head) with 8 rows a
micro-batch: 4 pairs for DPO (chosen and rejected: 8 rows), 8 samples for SFT.
The data is made here: --pairs pairs of a BOS, a prompt of T/2 - 1 random
tokens, a completion of T/2 - 1 and an EOS (every sample exactly T tokens, the
completion and EOS trained), as a preference file for shardlm's DPO, the same
samples as an SFT sample file for its SFT runs, and as token ids for the
reference (trl_dpo.py writes them as words of a word-level tokenizer, so TRL's
tokenize_row makes the same rows). One environment for every run
(OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = --threads, OMP_WAIT_POLICY=passive,
OPENBLAS_CORETYPE from --coretype as tools/bench/coretype.py resolves it).

Runs: shardlm SFT LoRA, shardlm DPO LoRA (the reference: the base with the
adapters off, one extra forward per micro-batch), the reference (DPO, LoRA),
shardlm SFT full fine-tune, shardlm DPO full fine-tune (the reference
log-probs precomputed before step 1, outside the timed steps). LoRA r 16,
alpha 32, dropout 0, the seven linear layers; AdamW, clipping 1.0, beta 0.1,
"sigmoid".

Targets: shardlm DPO LoRA tok/s >= 1.5x the reference's; DPO LoRA step <=
1.6x the SFT LoRA step; DPO full step <= 1.1x the SFT full step (medians
after --warmup steps). A shardlm whose trainer does not train DPO yet is
reported as such, the other figures still measured.

The reference runs under --ref-python: a venv with TRL (make one with
`bash tools/bench/trl_venv.sh /tmp/shardlm-trl-venv`: TRL 0.8.6 and its
data stack installed with --no-deps over build/ref-venv's transformers 4.40.2
and PEFT 0.10.0 on Debian's torch 1.13), default $SHARDLM_TRL_PYTHON, else
/tmp/shardlm-trl-venv/bin/python when there, else build/ref-venv/bin/python
(which has no TRL: the PyTorch loop).
"""
import json
import os
import sys

import numpy as np

import train_llama
import train_throughput as tt
from lora import lora_bench_args

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
REF_RATIO_TARGET = 1.5   # shardlm DPO LoRA tok/s / the reference's, at least
LORA_STEP_TARGET = 1.6   # shardlm DPO LoRA step / its SFT LoRA step, at most
FULL_STEP_TARGET = 1.1   # shardlm DPO full step (precomputed reference) / its SFT full step, at most
BOS, EOS, PAD = 1, 2, 0
TRL_VENV_PY = "/tmp/shardlm-trl-venv/bin/python"


def default_ref_python():
    env = os.environ.get("SHARDLM_TRL_PYTHON")
    if env:
        return env
    return TRL_VENV_PY if os.access(TRL_VENV_PY, os.X_OK) else train_llama.HF_PYTHON


def make_data(n_pairs, T, V, seed):
    """(pairs JSON path, preference file, SFT sample file), made once per shape."""
    import h5py
    tag = f"dpo_T{T}_V{V}_n{n_pairs}"
    paths = [os.path.join(tt.OUT, f"{tag}{ext}") for ext in (".pairs.json", ".pref.h5", ".sft.h5")]
    if all(os.path.exists(p) for p in paths):
        return paths
    rng = np.random.default_rng(seed)
    half = T // 2 - 1
    pairs = [[rng.integers(3, V, half).tolist(), rng.integers(3, V, half).tolist(), rng.integers(3, V, half).tolist()]
             for _ in range(n_pairs)]
    with open(paths[0], "w") as f:
        json.dump({"bos": BOS, "eos": EOS, "pad": PAD, "pairs": pairs}, f)
    toks, trained = [], []
    for p, c, r in pairs:
        for comp in (c, r):
            toks.append([BOS] + p + comp + [EOS])
            trained.append([0] * (1 + len(p)) + [1] * (len(comp) + 1))
    offsets = np.cumsum([0] + [len(t) for t in toks]).astype(np.int64)
    for path, fmt in ((paths[1], "shardlm-preferences"), (paths[2], "shardlm-samples")):
        with h5py.File(path + ".tmp", "w") as f:
            f.create_dataset("tokens", data=np.concatenate(toks).astype(np.int32))
            f.create_dataset("trained", data=np.concatenate(trained).astype(np.uint8))
            f.create_dataset("offsets", data=offsets)
            f.attrs["format"] = np.bytes_(fmt)
            f.attrs["version"] = np.int64(1)
            f.attrs["vocab_size"] = np.int64(V)
            f.attrs["pad_token_id"] = np.int64(PAD)
            f.attrs["eos_token_id"] = np.int64(EOS)
            if fmt == "shardlm-preferences":
                f.create_dataset("prompt_lengths", data=np.full(n_pairs, 1 + half, np.int64))
                f.attrs["n_pairs"] = np.int64(n_pairs)
                f.attrs["max_seq_length"] = np.int64(0)
                f.attrs["max_prompt_length"] = np.int64(0)
                f.attrs["n_truncated_pairs"] = np.int64(0)
                f.attrs["pair_formats"] = np.bytes_(json.dumps({"strings": n_pairs}))
        os.replace(path + ".tmp", path)
    return paths


def shardlm_shape(name, dims, steps, rows, data, dpo, lora):
    L, C, NH, KVH, F, V, T, _, _ = dims
    shape = train_llama.llama_shape(name, L, C, NH, KVH, F, V, T, rows // 2 if dpo else rows, steps, "eager")
    shape.config = {"data": {"train": data, "val": None, "seq_len": T, "shuffle": False}}
    if dpo:
        shape.config["dpo"] = {"beta": 0.1, "loss_type": "sigmoid"}
    if lora:
        shape.config["lora"] = lora
    return shape


def main():
    ap = lora_bench_args("shardlm DPO (LoRA, full) vs its SFT step vs TRL's DPOTrainer + PEFT", "dpo.json")
    ap.add_argument("--pairs", type=int, default=64, help="pairs in the data (default 64)")
    ap.add_argument("--ref-python", default=default_ref_python(),
                    help="interpreter of the reference (TRL there: DPOTrainer; else the PyTorch loop)")
    ap.add_argument("--ref-impl", default="auto", choices=("auto", "trl", "loop"))
    ap.add_argument("--only", default="", help="comma-separated runs to measure (sft_lora, dpo_lora, ref, "
                                               "sft_full, dpo_full; default all)")
    args = ap.parse_args()

    os.makedirs(tt.OUT, exist_ok=True)
    env, coretype_env, cpu = tt.bench_env(args)
    if not os.access(args.ref_python, os.X_OK):
        raise SystemExit(f"error: {args.ref_python} missing: the reference runs there; make one with bash "
                         f"tools/bench/trl_venv.sh {os.path.dirname(os.path.dirname(TRL_VENV_PY))} (or bash "
                         f"tools/deps.sh --test for build/ref-venv: the PyTorch loop)")
    if args.check_only:
        return

    dims = train_llama.SHAPES[args.shape]
    L, C, NH, KVH, F, V, T, rows, _ = dims
    pairs_json, pref, sft = make_data(args.pairs, T, V, 4321)
    lora = {"r": args.r, "alpha": args.alpha, "target_modules": list(TARGETS), "dropout": 0.0}
    shapes = {
        "sft_lora": shardlm_shape(f"dpo_{args.shape}_sft_lora", dims, args.steps, rows, sft, False, lora),
        "dpo_lora": shardlm_shape(f"dpo_{args.shape}_dpo_lora", dims, args.steps, rows, pref, True, lora),
        "sft_full": shardlm_shape(f"dpo_{args.shape}_sft_full", dims, args.steps, rows, sft, False, None),
        "dpo_full": shardlm_shape(f"dpo_{args.shape}_dpo_full", dims, args.steps, rows, pref, True, None),
    }
    ref_shape = shardlm_shape(f"dpo_{args.shape}_ref", dims, args.steps, rows, pref, True, lora)
    ref_shape.ref_args = ["--n-layer", L, "--n-head", NH, "--kv-heads", KVH, "--n-embd", C, "--ffn", F,
                          "--vocab", tt.padded_vocab(V), "--lora", args.r, "--lora-alpha", args.alpha,
                          "--lora-targets", ",".join(TARGETS), "--pairs", pairs_json, "--impl", args.ref_impl,
                          "--out", tt.OUT]
    ref = tt.Reference("trl_dpo", args.ref_python, script=os.path.join(tt.ROOT, "tools", "bench", "trl_dpo.py"),
                       label="reference DPO")
    n = str(args.threads)
    print(f"cpu: {cpu}; shardlm: {os.path.relpath(tt.SHARDLM, tt.ROOT)}; reference: {args.ref_python} "
          f"tools/bench/trl_dpo.py --impl {args.ref_impl}")
    print(f"env: OMP_NUM_THREADS={n} OPENBLAS_NUM_THREADS={n} OMP_WAIT_POLICY=passive "
          f"OPENBLAS_CORETYPE={coretype_env}  (same for every run)")
    print(f"shape: {args.shape} L{L} C{C} H{NH}/{KVH} F{F} V{V} T{T}, fp32, untied head; {rows} rows a micro-batch "
          f"(DPO: {rows // 2} pairs); LoRA r {args.r}, alpha {args.alpha:g}, {', '.join(TARGETS)}; DPO beta 0.1 "
          f"sigmoid; {args.pairs} pairs of {T}-token samples")
    with open("/proc/loadavg") as f:
        print(f"load average before: {' '.join(f.read().split()[:3])} on {os.cpu_count()} CPUs")
    for s in list(shapes.values()) + [ref_shape]:
        tt.write_config(s, args.threads)

    quiet = tt.QuietWaiter(args.wait_quiet, args.wait_quiet_total)
    quiet("sgemm_peak")
    peak, core, _, _ = tt.sgemm_peak(env, args.threads)
    print(f"sgemm_peak: {peak:.1f} GFLOP/s; openblas_get_corename() = {core}  [{cpu}]")
    runs = [("sft_lora", "shardlm SFT LoRA", shapes["sft_lora"], None),
            ("dpo_lora", "shardlm DPO LoRA", shapes["dpo_lora"], None),
            ("ref", "reference DPO LoRA", ref_shape, ref),
            ("sft_full", "shardlm SFT full", shapes["sft_full"], None),
            ("dpo_full", "shardlm DPO full", shapes["dpo_full"], None)]
    only = set(filter(None, args.only.split(",")))
    best, failed = {}, {}
    for rnd in range(args.rounds):
        for key, who, shape, r in runs:
            if only and key not in only:
                continue
            quiet(who)
            try:
                res = tt.measure(args, shape, r, env, f"r{rnd}", f"round {rnd} {who:20s}", core)
            except SystemExit as e:  # a shardlm that does not train DPO yet, a reference that cannot run
                failed[key] = str(e)
                print(f"  {who}: did not run ({e})", flush=True)
                continue
            if key not in best or res["median_ms"] < best[key]["median_ms"]:
                best[key] = res

    tok = rows * T
    figures = {k: {"name": who, "median_ms": best[k]["median_ms"], "best_ms": best[k]["best_ms"],
                   "steps": best[k]["n"], "tok_s": tok / best[k]["median_ms"] * 1e3, "other": best[k]["other"],
                   "ms": best[k]["ms"], "log": best[k]["log"]} for k, who, _, _ in runs if k in best}
    print()
    print(f"{cpu}: threads {n}, OPENBLAS_CORETYPE={coretype_env}, OpenBLAS kernel {core}; {tok} tokens a step; "
          f"median (best) over the steps after {args.warmup} warm-up")
    for k, who, _, _ in runs:
        if k in figures:
            g = figures[k]
            print(f"  {who:<22} {g['median_ms']:>9.1f} ms ({g['best_ms']:>8.1f})  {g['tok_s']:>8.1f} tok/s  "
                  f"other procs {100 * g['other']:.0f}%")
        else:
            print(f"  {who:<22} not measured{': ' + failed[k][:200] if k in failed else ''}")
    ratios, verdicts = {}, []
    for name, num, den, target, kind in (("shardlm DPO LoRA / reference tok/s", "ref", "dpo_lora",
                                          REF_RATIO_TARGET, "min"),
                                         ("DPO LoRA step / SFT LoRA step", "dpo_lora", "sft_lora",
                                          LORA_STEP_TARGET, "max"),
                                         ("DPO full step / SFT full step", "dpo_full", "sft_full",
                                          FULL_STEP_TARGET, "max")):
        if num in figures and den in figures:
            v = figures[num]["median_ms"] / figures[den]["median_ms"]
            ratios[name] = v
            ok = v >= target if kind == "min" else v <= target
            verdicts.append(f"target {name} {'>=' if kind == 'min' else '<='} {target}: "
                            f"{'met' if ok else 'NOT met'} ({v:.3f})  [{cpu}]")
        else:
            verdicts.append(f"target {name}: not measured (a run is missing)")
    print("\n".join(verdicts))
    summary = best.get("ref", {}).get("summary", {})
    if summary:
        print(f"reference: {summary.get('impl')}, trl {summary.get('trl', '-')}, peft {summary.get('peft')}, "
              f"transformers {summary.get('transformers')}, torch {summary.get('torch')}, "
              f"{summary.get('trainable_params')} trainable parameters")
    with open(args.json, "w") as f:
        json.dump({"cpu": cpu, "threads": args.threads, "coretype_env": coretype_env, "corename": core,
                   "shape": args.shape, "tokens_per_step": tok, "sgemm_peak_gflops": peak, "runs": figures,
                   "failed": failed, "ratios": ratios, "reference": summary,
                   "targets": {"ref_ratio_min": REF_RATIO_TARGET, "lora_step_max": LORA_STEP_TARGET,
                               "full_step_max": FULL_STEP_TARGET}}, f, indent=1)
    print(f"results: {os.path.relpath(args.json, tt.ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
