#!/usr/bin/env python3
"""torch_llama8b — PyTorch's side of issue 45's workload: a Llama of Llama-3.1-8B's width trained the way shardlm
trains it, for tests/gpu/throughput.py's llama8b part (the GPU session) to set beside shardlm-cuda on the same GPU.

  --mode full   full fine-tune: FSDP2 (torch.distributed.fsdp.fully_shard, one rank) with MixedPrecisionPolicy
                (bf16 compute, fp32 gradients reduced) and CPUOffloadPolicy (the fp32 parameters, gradients and
                AdamW state in pinned host memory, the step on the host), as DeepSpeed's ZeRO-3 with
                offload_optimizer "cpu" and shardlm's offload do
  --mode lora   PEFT LoRA r 16 (alpha 16, dropout 0) on every linear layer of a frozen bf16 model on the GPU,
                attention through PyTorch's SDPA, AdamW on the adapters

Both: random init, bf16, activation checkpointing (transformers' gradient_checkpointing_enable, non-reentrant),
micro-batch --batch of --seq-len tokens and --accum micro-batches a step (the seed's ds_config.json: 2 and 8).
--layers: fewer layers of the same width where the machine cannot hold 32 (the per-layer figures are the same;
issue 45: never a narrower model). --width toy: a small model of the same layout (d 64, 4 heads, 2 kv heads)
for a run on the CPU (no offload policy there: the parameters are on the host already; gloo instead of NCCL).

Prints one line "summary {json}": milliseconds per step, peak device bytes (torch.cuda.max_memory_allocated),
peak host RSS bytes, parameter counts and the model FLOPs per token (6N full, 4N LoRA: the frozen base has no
weight gradients; attention, 12 L C T, counted in both). Exit 3 with "skip: ..." when transformers, PEFT or
FSDP2 are not importable.
"""
import argparse
import json
import os
import resource
import socket
import sys
import time

WIDTHS = {
    # Llama-3.1-8B (its config.json): RoPE "llama3" scaling
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
               vocab_size=128256, rope_theta=500000.0, max_position_embeddings=131072,
               rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192}),
    "toy": dict(hidden_size=64, intermediate_size=224, num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                rope_theta=500000.0, max_position_embeddings=256,
                rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 64}),
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flops_per_token(w, L, T, lora):
    """src/model/model.c model_flops_per_token's count (untied head), with 4N for LoRA."""
    C, F, V = w["hidden_size"], w["intermediate_size"], w["vocab_size"]
    KV = C // w["num_attention_heads"] * w["num_key_value_heads"]
    N = L * (2.0 * C * C + 2.0 * C * KV + 3.0 * C * F) + V * C
    return (4.0 if lora else 6.0) * N + 12.0 * L * C * T


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["full", "lora"], required=True)
    ap.add_argument("--width", choices=sorted(WIDTHS), default="8b")
    # the integers (the docstring says what they are); defaults: the workload
    for name, default in (("--layers", 32), ("--seq-len", 2048), ("--batch", 2), ("--accum", 8), ("--steps", 10),
                          ("--lora-r", 16), ("--seed", 7)):
        ap.add_argument(name, type=int, default=default)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args()
    try:
        import torch
        import torch.distributed as dist
        from transformers import LlamaConfig, LlamaForCausalLM
        if args.mode == "lora":
            import peft
        else:
            from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    except ImportError as e:
        print(f"skip: torch_llama8b --mode {args.mode} needs torch 2.6+, transformers and PEFT ({e})", flush=True)
        return 3
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("skip: torch has no CUDA device", flush=True)
        return 3
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    L, T, B = args.layers, args.seq_len, args.batch
    w = WIDTHS[args.width]
    cfg = LlamaConfig(num_hidden_layers=L, rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False,
                      mlp_bias=False, **w)
    cfg._attn_implementation = "sdpa"

    if args.mode == "full":
        # one rank: FSDP2 still shards (into one piece), keeps the fp32 master on the host and steps there
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
        dist.init_process_group("nccl" if cuda else "gloo")
        if cuda:
            torch.cuda.set_device(0)
        model = LlamaForCausalLM(cfg)  # fp32 on the host: the master weights
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        kw = {"mp_policy": mp}
        if cuda:
            kw["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
        else:
            from torch.distributed.device_mesh import init_device_mesh
            kw["mesh"] = init_device_mesh("cpu", (1,))
        for layer in model.model.layers:
            fully_shard(layer, **kw)
        fully_shard(model, **kw)
        trainable = list(model.parameters())
    else:
        model = LlamaForCausalLM(cfg).to(dtype=torch.bfloat16, device=dev)
        model = peft.get_peft_model(model, peft.LoraConfig(r=args.lora_r, lora_alpha=args.lora_r, lora_dropout=0.0,
                                                           target_modules="all-linear", task_type="CAUSAL_LM"))
        trainable = [p for p in model.parameters() if p.requires_grad]
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.mode == "lora":
        model.enable_input_require_grads()  # checkpointed blocks of a frozen model need a grad-requiring input
    model.train()
    opt = torch.optim.AdamW(trainable, lr=1e-5, weight_decay=0.01)
    n_params = sum(p.numel() for p in model.parameters())
    n_train = sum(p.numel() for p in trainable)
    gen = torch.Generator().manual_seed(args.seed)
    ms = []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for step in range(args.steps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.accum):
            ids = torch.randint(0, w["vocab_size"], (B, T), generator=gen).to(dev)
            with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.mode == "lora" and cuda):
                loss = model(input_ids=ids, labels=ids).loss / args.accum
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        ms.append((time.perf_counter() - t0) * 1e3)
        print(f"step {step + 1} loss {loss.item() * args.accum:.4f} {ms[-1]:.1f} ms", flush=True)
    summary = {"mode": args.mode, "width": args.width, "layers": L, "T": T, "B": B, "accum": args.accum,
               "device": torch.cuda.get_device_name() if cuda else "cpu", "ms": [round(m, 2) for m in ms],
               "peak_bytes": torch.cuda.max_memory_allocated() if cuda else 0,
               "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
               "params": n_params, "trainable": n_train,
               "flops_per_token": flops_per_token(w, L, T, args.mode == "lora"),
               "offload": args.mode == "full" and cuda, "torch": torch.__version__}
    print("summary " + json.dumps(summary), flush=True)
    if args.mode == "full":
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
