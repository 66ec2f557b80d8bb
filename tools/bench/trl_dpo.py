#!/usr/bin/env python3
"""trl_dpo — the reference side of tools/bench/dpo.py: DPO with LoRA over
transformers' LlamaForCausalLM, timed per optimizer step, in
torch_gpt2.py's protocol (one JSON object per step, then "summary {...}").

--impl trl (the default when trl imports): TRL's DPOTrainer (0.8.x, installed
with --no-deps; its TrainingArguments, AdamW, clipping 1.0) with a PEFT model
and no ref_model, so its reference is the base with the adapters disabled
(null_ref_context), one extra forward per step, as shardlm's LoRA DPO does.
The pairs are the bench's: token ids written as the words of a word-level
tokenizer ("t<id>"), so that TRL's tokenize_row makes exactly the rows of
shardlm's preference file (BOS + prompt untrained, completion + EOS trained).
Step times come from a TrainerCallback (on_step_begin / on_step_end).

--impl loop: the same step by hand when TRL is not there (zero_grad; the
reference's log-probs with peft's disable_adapter() under no_grad; the
policy's forward of the 2B rows (chosen then rejected, TRL's
concatenated_forward); summed log-probs of the trained tokens; the sigmoid
loss; backward; clip_grad_norm_(1.0); AdamW).

--pairs FILE: the bench's pairs (JSON: {"bos", "eos", "pad", "pairs":
[[prompt ids, chosen ids, rejected ids], ...]}).
"""
import argparse
import json
import os
import sys
import time

import torch
from torch_gpt2 import openblas_corename


def build_model(args):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.n_embd, intermediate_size=args.ffn,
                      num_hidden_layers=args.n_layer, num_attention_heads=args.n_head,
                      num_key_value_heads=args.kv_heads, max_position_embeddings=args.seq_len,
                      rope_theta=args.rope_theta, rms_norm_eps=args.rms_norm_eps, tie_word_embeddings=False,
                      attn_implementation="eager")
    return LlamaForCausalLM(cfg).float()


def lora_config(args):
    import peft
    return peft.LoraConfig(r=args.lora, lora_alpha=args.lora_alpha, target_modules=args.lora_targets.split(","),
                           lora_dropout=0.0, task_type="CAUSAL_LM")


def run_trl(args, data, report):
    import datasets
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, TrainerCallback, TrainingArguments
    from trl import DPOTrainer

    vocab = {f"t{i}": i for i in range(args.vocab)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=f"t{data['bos']}", eos_token=f"t{data['eos']}",
                                  pad_token=f"t{data['pad']}", unk_token="t0")

    def text(ids, lead=""):
        return lead + " ".join(f"t{i}" for i in ids)

    rows = {"prompt": [], "chosen": [], "rejected": []}
    for p, c, r in data["pairs"]:
        rows["prompt"].append(text(p))
        rows["chosen"].append(text(c, " "))
        rows["rejected"].append(text(r, " "))
    ds = datasets.Dataset.from_dict(rows)
    times = []

    class Timer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            dt = time.perf_counter() - self.t0
            times.append(dt)
            report(len(times), dt)
            if args.time_budget > 0 and len(times) >= args.min_steps and \
                    time.perf_counter() - t_start > args.time_budget:
                control.should_training_stop = True

    targs = TrainingArguments(output_dir=os.path.join(args.out, "trl_out"), per_device_train_batch_size=args.batch,
                              gradient_accumulation_steps=1, max_steps=args.steps, learning_rate=1e-4,
                              weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.95, adam_epsilon=1e-8,
                              max_grad_norm=1.0, lr_scheduler_type="constant", logging_steps=10 ** 6,
                              save_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0,
                              remove_unused_columns=False, seed=args.seed, disable_tqdm=True)
    trainer = DPOTrainer(model=build_model(args), ref_model=None, beta=0.1, args=targs, train_dataset=ds,
                         tokenizer=tok, max_length=args.seq_len, max_prompt_length=args.seq_len // 2,
                         peft_config=lora_config(args), callbacks=[Timer()])
    n_trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    t_start = time.perf_counter()
    trainer.train()
    import peft
    import trl
    return times, {"impl": "trl DPOTrainer", "trl": trl.__version__, "peft": peft.__version__,
                   "transformers": transformers.__version__, "trainable_params": n_trainable}


def run_loop(args, data, report):
    import peft
    import transformers
    model = peft.get_peft_model(build_model(args), lora_config(args))
    model.train()
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    ids, labels = [], []
    for p, c, r in data["pairs"]:
        for comp in (c, r):
            seq = [data["bos"]] + p + comp + [data["eos"]]
            ids.append(seq)
            labels.append([-100] * (1 + len(p)) + comp + [data["eos"]])
    ids, labels = torch.tensor(ids), torch.tensor(labels)

    def logps(logits, lab):
        lab = lab[:, 1:].clone()
        mask = lab != -100
        lab[~mask] = 0
        lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(2, lab.unsqueeze(2)).squeeze(2)
        return (lp * mask).sum(-1)

    B, times, t_start = args.batch, [], time.perf_counter()
    n_pairs = len(data["pairs"])
    for step in range(args.steps):
        t0 = time.perf_counter()
        first = (step * B) % n_pairs
        sel = [2 * ((first + k) % n_pairs) for k in range(B)]
        order = sel + [s + 1 for s in sel]  # the chosen rows, then the rejected (concatenated_forward)
        x, y = ids[order], labels[order]
        opt.zero_grad(set_to_none=True)
        with torch.no_grad(), model.disable_adapter():
            ref = logps(model(x).logits, y)
        pol = logps(model(x).logits, y)
        z = (pol[:B] - pol[B:]) - (ref[:B] - ref[B:])
        loss = -torch.nn.functional.logsigmoid(0.1 * z).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        times.append(dt)
        report(step + 1, dt)
        if args.time_budget > 0 and step + 1 >= args.min_steps and time.perf_counter() - t_start > args.time_budget:
            break
    return times, {"impl": "PyTorch loop (TRL's loss)", "peft": peft.__version__,
                   "transformers": transformers.__version__, "trainable_params": sum(p.numel() for p in trained)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("n-layer", "n-head", "kv-heads", "n-embd", "ffn", "vocab", "seq-len", "batch", "lora"):
        ap.add_argument(f"--{name}", type=int, required=True)
    ap.add_argument("--lora-alpha", type=float, required=True)
    ap.add_argument("--lora-targets", required=True)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--rms-norm-eps", type=float, default=1e-5)
    ap.add_argument("--pairs", required=True)
    ap.add_argument("--impl", default="auto", choices=("auto", "trl", "loop"))
    ap.add_argument("--out", default="/tmp")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--min-steps", type=int, default=4)
    ap.add_argument("--time-budget", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--real-vocab", type=int, default=0)  # train_throughput's protocol; the pairs decide
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    with open(args.pairs) as f:
        data = json.load(f)
    impl = args.impl
    if impl == "auto":
        try:
            import trl  # noqa: F401
            from trl import DPOTrainer  # noqa: F401
            impl = "trl"
        except Exception as e:  # ImportError, or trl's RuntimeError for a missing dependency
            print(f"note: TRL's DPOTrainer does not import here ({type(e).__name__}: {e}); timing the PyTorch loop",
                  flush=True)
            impl = "loop"
    tokens = 2 * args.batch * args.seq_len

    def report(step, dt):
        print(json.dumps({"step": step, "ms": round(dt * 1e3, 3), "tokens_per_s": round(tokens / dt, 1)}),
              flush=True)

    times, info = (run_trl if impl == "trl" else run_loop)(args, data, report)
    summary = {"torch": torch.__version__, "threads": torch.get_num_threads(), "corename": openblas_corename(),
               "tokens_per_step": tokens, "steps_run": len(times), "ms": [round(t * 1e3, 3) for t in times]}
    summary.update(info)
    print("summary " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    sys.exit(main())
