#!/usr/bin/env python3
"""train_llama — shardlm's Llama against Hugging Face transformers'
LlamaForCausalLM: training tokens/s side by side, and shardlm's share of the
sgemm peak.

Driven by tools/bench/train_llama.sh (which builds bin/shardlm and the sgemm
probe first). For each shape, with one environment for both sides
(OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = --threads, OMP_WAIT_POLICY=passive,
OPENBLAS_CORETYPE from --coretype as tools/bench/coretype.py resolves it):

  * bin/shardlm train: model.type "llama", CPU backend, fp32, 1 rank, ZeRO
    stage 0, AdamW, clipping 1.0, on a synthetic token shard of the shape's
    vocabulary; step times from its metrics JSONL (train.metrics);
  * tools/bench/torch_gpt2.py --arch llama under build/ref-venv/bin/python:
    transformers 4.40.2's LlamaForCausalLM over Debian's torch 1.13, fp32,
    torch.set_num_threads(--threads), the same model (untied head,
    rope_theta 1e4, rms_norm_eps 1e-5, shardlm's padded vocabulary), the same
    micro-batch and sequence, zero_grad + forward + loss + backward +
    clip_grad_norm_ + AdamW(foreach) step timed. Attention is transformers'
    "eager": its "sdpa" needs torch >= 2.1.1 (torch 1.13 has no
    scaled_dot_product_attention), so --hf-attn auto resolves to eager here;
    the summary names what ran.

The first --warmup steps of each side are dropped; tokens/s are B*T over the
median step. MFU = tokens/s x model FLOPs per token (`shardlm plan --json`:
6 x matmul parameters + 12 L C T, the PaLM definition) / the sgemm peak
measured in the same run (build/bench/sgemm_peak, the same OpenBLAS, core
type and threads), the higher of a probe before and one after.

Targets: shardlm >= 1.5x transformers on both shapes; >= 70% of the sgemm
peak on the 12-layer shape. The machinery (runs, quiet waits, contention
report, table, JSON) is tools/bench/train_throughput.py's compare.
"""
import argparse
import os
import sys

import train_throughput as tt

HF_PYTHON = os.path.join(tt.ROOT, "build", "ref-venv", "bin", "python")

# name: (n_layer, n_embd, n_head, n_kv_head, ffn_dim, vocab, seq_len, micro-batch, steps)
# Micro-batches and steps sized for a 2-core machine: a 12L step (8 x 512 tokens x 0.66 GFLOP = 2.7 TFLOP)
# takes ~12 s at 70% of a 300 GFLOP/s sgemm peak and ~2x that in transformers; the whole bench takes
# about 12 minutes with one round. B 8 for 12L: 4096 rows per matmul (B 4 measured 60% of the peak:
# OpenBLAS is less efficient on the smaller products).
SHAPES = {
    "small": (4, 256, 4, 2, 688, 8192, 256, 8, 12),
    "12L": (12, 768, 12, 4, 2048, 32000, 512, 8, 6),
}
# shardlm's fraction of the sgemm peak to reach on the large shape (the 12-layer Llama).
MFU_TARGETS = {"12L": 0.70}
ROPE_THETA = 10000.0  # Llama 2's, shardlm's default
RMS_NORM_EPS = 1e-5  # Llama 2's, shardlm's default


def llama_shape(name, L, C, NH, KVH, F, V, T, B, steps, attn):
    model = {"type": "llama", "n_layer": L, "n_head": NH, "n_kv_head": KVH, "n_embd": C, "ffn_dim": F,
             "n_positions": T, "vocab_size": V, "rope_theta": ROPE_THETA, "rms_norm_eps": RMS_NORM_EPS,
             "tie_word_embeddings": False}
    Vp = tt.padded_vocab(V)
    ref_args = ["--arch", "llama", "--n-layer", L, "--n-head", NH, "--kv-heads", KVH, "--n-embd", C, "--ffn", F,
                "--vocab", Vp, "--real-vocab", V, "--rope-theta", ROPE_THETA, "--rms-norm-eps", RMS_NORM_EPS,
                "--attn", attn]
    label = f"{name} L{L} C{C} H{NH}/{KVH} F{F} B{B} T{T} V{Vp}"
    return tt.Shape(name, label, model, T, B, steps, ref_args, extra={"n_kv_head": KVH, "ffn_dim": F})


def main():
    ap = argparse.ArgumentParser(description="shardlm Llama vs transformers LlamaForCausalLM training tokens/s")
    tt.add_common_args(ap, "train_llama.json", SHAPES["small"][-1])
    ap.add_argument("--steps-12l", type=int, default=SHAPES["12L"][-1],
                    help=f"steps for the 12L shape, warm-up included (default {SHAPES['12L'][-1]})")
    ap.add_argument("--batch-small", type=int, default=SHAPES["small"][-2])
    ap.add_argument("--batch-12l", type=int, default=SHAPES["12L"][-2])
    ap.add_argument("--shapes", default="small,12L", help="comma list of: " + ",".join(SHAPES))
    ap.add_argument("--hf-attn", default="auto", choices=("auto", "eager", "sdpa"),
                    help="transformers' attn_implementation (auto: its default, eager on torch < 2.1.1)")
    ap.add_argument("--hf-python", default=HF_PYTHON,
                    help="interpreter with transformers (default build/ref-venv/bin/python, tools/deps.sh --test)")
    args = ap.parse_args()

    os.makedirs(tt.OUT, exist_ok=True)
    env, coretype_env, cpu = tt.bench_env(args)
    names = args.shapes.split(",")
    for s in names:
        if s not in SHAPES:
            raise SystemExit(f"error: unknown shape {s!r}; choose from {', '.join(SHAPES)}")
    if not os.access(args.hf_python, os.X_OK):
        raise SystemExit(f"error: {args.hf_python} missing: the transformers reference runs there; "
                         f"make it with: bash tools/deps.sh --test (or pass --hf-python)")
    if args.check_only:
        return

    shapes = []
    for s in names:
        L, C, NH, KVH, F, V, T, B, steps = SHAPES[s]
        B = args.batch_12l if s == "12L" else args.batch_small
        steps = args.steps_12l if s == "12L" else args.steps
        shapes.append(llama_shape(s, L, C, NH, KVH, F, V, T, B, steps, args.hf_attn))
    results = tt.compare(args, shapes, tt.Reference("hf", args.hf_python, label="HF"), env, coretype_env, cpu, MFU_TARGETS)
    attn = sorted({r.get("attn", "?") for r in results})
    print(f"HF: transformers {results[0].get('transformers', '?')}, torch {results[0]['torch_version']}, "
          f"attn_implementation {', '.join(attn)}")


if __name__ == "__main__":
    sys.exit(main())
