#!/usr/bin/env python3
"""torch_gpt2 — PyTorch reference for shardlm's training throughput.

A plain GPT-2 (the same tensors as src/model/model.c: wte/wpe, per block ln_1,
c_attn (C x 3C, bias), c_proj, ln_2, c_fc (C x 4C), c_proj, then ln_f and a
head tied to wte), trained on random tokens. One timed step is what shardlm's
train_step does:

    zero_grad -> forward -> cross-entropy -> backward
              -> clip_grad_norm_(1.0) -> AdamW(foreach=True).step()

Attention is matmul + causal mask + softmax + matmul (torch 1.13 has no
F.scaled_dot_product_attention); GELU is the tanh approximation. The
vocabulary given is used as is (the driver passes shardlm's padded vocab,
so the logits matmul does the same work; targets are drawn below --real-vocab).

On a GPU (--device cuda) it runs the model in --dtype bf16 under autocast
(fp32 master weights, as shardlm keeps them), with
F.scaled_dot_product_attention where torch has it, times each step after a
cuda synchronize, and reports the peak of torch.cuda.max_memory_allocated.
--accum N runs N micro-batches of --batch per step (gradient accumulation,
the loss of each scaled by 1/N), as shardlm's gradient_accumulation_steps.

--arch llama builds the Llama shape instead (--kv-heads, --ffn; RMSNorm,
rotary positions, SwiGLU, untied head) from transformers' LlamaForCausalLM,
when transformers is importable (else it prints "skip: ..." and exits 3);
--rope-theta, --rms-norm-eps and --tie set the rest of LlamaConfig as
shardlm's config has them (unset: transformers' defaults). --attn picks
transformers' attention: auto (its default: "sdpa" where torch >= 2.1.1,
else "eager"), eager, or sdpa (refused by transformers on older torch);
the summary names the one that ran. tools/bench/train_llama.py runs it from
build/ref-venv (transformers 4.40.2 over Debian's torch 1.13) against
shardlm's Llama. Its FLOPs per token count the grouped K/V projections as
they are.

--lora R (with --arch llama) trains LoRA adapters instead, as PEFT does:
get_peft_model(LlamaForCausalLM, LoraConfig(r=R, lora_alpha=--lora-alpha,
target_modules=--lora-targets, lora_dropout=--lora-dropout)), the base
frozen (requires_grad False: autograd computes no weight gradient for it),
AdamW and clip_grad_norm_ over the trainable parameters only, the same timed
step. Its FLOPs per token are then 4 per frozen matmul parameter (forward and
input gradient), 6 per adapter parameter, plus attention; the summary names
peft's version and the trainable parameters. tools/bench/lora.py runs it
against shardlm's LoRA.

Prints one JSON object per step ({"step", "ms", "tokens_per_s"}), then a
summary line starting with "summary ". Stops early, after at least
--min-steps steps, when --time-budget seconds are spent.

Run it with the environment the benchmark gives both sides
(OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, OMP_WAIT_POLICY, OPENBLAS_CORETYPE);
torch 1.13 here links Debian's libblas.so.3 = OpenBLAS (openmp), so the
core type applies to it as to shardlm.
"""
import argparse
import ctypes
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH, T):
        super().__init__()
        self.NH = NH
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)
        self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        NH, hs = self.NH, C // self.NH
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        if hasattr(F, "scaled_dot_product_attention") and q.is_cuda:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(self.mask[:T, :T], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.attn_proj(y)
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT2(nn.Module):
    def __init__(self, L, NH, C, T, V, init_std=0.02):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, NH, T) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        res_std = init_std / math.sqrt(2 * L)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = res_std if name.endswith("proj.weight") else init_std
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.h:
            x = blk(x)
        x = self.ln_f(x)
        logits = x @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def flops_per_token(L, C, Vp, T):
    """src/model/model.c model_flops_per_token: 6 * matmul params + attention."""
    return 6.0 * (L * 12.0 * C * C + Vp * C) + 12.0 * L * C * T


def llama_flops_per_token(L, C, NH, KVH, F, V, T):
    """6 * matmul params (q, o: C x C; k, v: C x KVH*hs; gate, up, down: C x F; head V x C) + attention."""
    kv = KVH * (C // NH)
    return 6.0 * (L * (2.0 * C * C + 2.0 * C * kv + 3.0 * C * F) + V * C) + 12.0 * L * C * T


class Llama(nn.Module):
    """transformers' LlamaForCausalLM with the forward(idx, targets) -> loss of GPT2 above."""

    def __init__(self, L, NH, KVH, C, F, T, V, tie=False, rope_theta=None, rms_norm_eps=None, attn="auto"):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM
        optional = {"rope_theta": rope_theta, "rms_norm_eps": rms_norm_eps,
                    "attn_implementation": None if attn == "auto" else attn}
        cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=F, num_hidden_layers=L,
                          num_attention_heads=NH, num_key_value_heads=KVH, max_position_embeddings=T,
                          tie_word_embeddings=tie, **{k: v for k, v in optional.items() if v is not None})
        self.m = LlamaForCausalLM(cfg)
        self.attn = self.m.config._attn_implementation

    def forward(self, idx, targets):
        logits = self.m(input_ids=idx).logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def openblas_corename():
    try:
        lib = ctypes.CDLL("libopenblas.so.0")  # already loaded by torch: same handle
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-layer", type=int, required=True)
    ap.add_argument("--n-head", type=int, required=True)
    ap.add_argument("--n-embd", type=int, required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True, help="vocabulary of the embedding/head (padded)")
    ap.add_argument("--real-vocab", type=int, default=0, help="targets/inputs are drawn below this")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "0") or 0))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--min-steps", type=int, default=4, help="never stop before this many steps")
    ap.add_argument("--time-budget", type=float, default=0.0, help="seconds; 0 = none")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="autocast dtype on cuda")
    ap.add_argument("--accum", type=int, default=1, help="micro-batches per step (gradient accumulation)")
    ap.add_argument("--arch", default="gpt2", choices=["gpt2", "llama"])
    ap.add_argument("--kv-heads", type=int, default=0, help="llama: key/value heads (default --n-head)")
    ap.add_argument("--ffn", type=int, default=0, help="llama: MLP width (default 4 * --n-embd)")
    ap.add_argument("--tie", action="store_true", help="llama: head tied to the token embedding")
    ap.add_argument("--rope-theta", type=float, default=None, help="llama: rotary base (default transformers')")
    ap.add_argument("--rms-norm-eps", type=float, default=None, help="llama: RMSNorm epsilon (default transformers')")
    ap.add_argument("--attn", default="auto", choices=["auto", "eager", "sdpa"],
                    help="llama: transformers' attn_implementation (auto: its default)")
    ap.add_argument("--lora", type=int, default=0, metavar="R",
                    help="llama: train PEFT LoRA adapters of rank R on the frozen model (0 = full fine-tune)")
    ap.add_argument("--lora-alpha", type=float, default=0.0, help="LoRA alpha (default R)")
    ap.add_argument("--lora-targets", default="all-linear",
                    help="LoRA target_modules: all-linear or a comma list (q_proj,v_proj,...)")
    ap.add_argument("--lora-dropout", type=float, default=0.0)
    args = ap.parse_args()
    if args.lora and args.arch != "llama":
        ap.error("--lora needs --arch llama")
    if args.arch == "llama":
        try:
            import transformers
            if args.lora:
                import peft
        except ImportError as e:
            print(f"skip: --arch llama{' --lora' if args.lora else ''} needs transformers and peft ({e})", flush=True)
            return 3

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    L, NH, C, T, B, V = args.n_layer, args.n_head, args.n_embd, args.seq_len, args.batch, args.vocab
    RV = args.real_vocab or V

    dev = torch.device(args.device)
    KVH, FF = args.kv_heads or NH, args.ffn or 4 * C
    if args.arch == "llama":
        model = Llama(L, NH, KVH, C, FF, T, V, args.tie, args.rope_theta, args.rms_norm_eps, args.attn).to(dev)
        fpt = llama_flops_per_token(L, C, NH, KVH, FF, V, T)
    else:
        model = GPT2(L, NH, C, T, V).to(dev)
        fpt = flops_per_token(L, C, V, T)
    if args.lora:
        targets = args.lora_targets if args.lora_targets == "all-linear" else args.lora_targets.split(",")
        model.m = peft.get_peft_model(model.m, peft.LoraConfig(
            r=args.lora, lora_alpha=args.lora_alpha or args.lora, target_modules=targets,
            lora_dropout=args.lora_dropout, task_type="CAUSAL_LM")).to(dev)
        n_adapter = sum(p.numel() for p in model.parameters() if p.requires_grad)
        # 6 flops per adapter parameter, 4 (forward, input gradient) per frozen matmul parameter, attention as is
        attn = 12.0 * L * C * T
        fpt = attn + (fpt - attn) * 4.0 / 6.0 + 6.0 * n_adapter
    model.train()
    cuda = dev.type == "cuda"
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.dtype == "bf16") if cuda
                else torch.autocast("cpu", enabled=False))
    trained = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trained if p.dim() >= 2]
    no_decay = [p for p in trained if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    n_params = sum(p.numel() for p in model.parameters())

    gen = torch.Generator().manual_seed(args.seed)
    seqs = [torch.randint(0, RV, (B, T + 1), generator=gen) for _ in range(max(4, args.accum))]
    batches = [(s[:, :-1].contiguous().to(dev), s[:, 1:].contiguous().to(dev)) for s in seqs]

    t_start = time.perf_counter()
    times = []
    for step in range(args.steps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for micro in range(args.accum):
            x, y = batches[(step * args.accum + micro) % len(batches)]
            with autocast:
                loss = model(x, y)
            (loss / args.accum).backward() if args.accum > 1 else loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        times.append(dt)
        print(json.dumps({"step": step + 1, "loss": round(loss.item(), 6), "ms": round(dt * 1e3, 3),
                          "tokens_per_s": round(B * T * args.accum / dt, 1)}), flush=True)
        if args.time_budget > 0 and step + 1 >= args.min_steps and time.perf_counter() - t_start > args.time_budget:
            break

    summary = {
        "torch": torch.__version__, "threads": torch.get_num_threads(), "corename": openblas_corename(),
        "n_params": n_params, "tokens_per_step": B * T * args.accum, "flops_per_token": fpt,
        "steps_run": len(times), "ms": [round(t * 1e3, 3) for t in times],
        "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
    }
    if args.arch == "llama":
        summary.update(transformers=transformers.__version__, attn=model.attn)
    if args.lora:
        summary.update(peft=peft.__version__, trainable_params=n_adapter,
                       lora={"r": args.lora, "alpha": args.lora_alpha or args.lora, "target_modules": targets,
                             "dropout": args.lora_dropout})
    print("summary " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    sys.exit(main())
