#!/usr/bin/env python3
"""t_dpo_trl — shardlm's DPO training against TRL's own DPOTrainer (TRL 0.8.6 over transformers 4.40.2 and
Debian's torch 1.13, in build/ref-venv: tools/deps.sh --test installs it with --no-deps).

The test makes a tiny LlamaForCausalLM (saved with save_pretrained: shardlm reads the same files through
model.from_pretrained) and a word-level tokenizer ("w4" ... "w127", <s> </s> <pad> <unk>), and writes one
list of string pairs twice: as TRL's dataset ({"prompt", "chosen", "rejected"}) and, through
tools/prepare_data.py with that tokenizer, as shardlm's preference file. Then both train 2 steps on all the
pairs in one batch (the second step is the second epoch of the same pairs), fp32, beta 0.1, AdamW (TRL's
Trainer: adamw_torch) at the same lr, betas, eps and weight decay, no warm-up, a constant rate, global-norm
clipping 1.0 on both sides.

What is aligned by construction (and checked, data.*): a whitespace word-level tokenizer, completions
written with a leading space, so that TRL's build_tokenized_answer (enc(prompt + answer) after
enc(prompt)) splits where prepare_data encodes the parts apart; TRL's tokenize_row adds BOS before the
prompt and EOS after each completion, and prepare_data does the same (the tokenizer's post-processor adds
BOS); prompt and BOS untrained (TRL's label -100), completion + EOS trained; nothing is cut (max_length
above every pair). TRL pads its rows with <pad> under a zero attention mask and -100 labels, shardlm pads
to the longest row; right padding changes no logit of a real position (causal attention).
TRL's weight decay skips biases and norm weights (LlamaRMSNorm is in ALL_LAYERNORM_LAYERS) and shardlm's
applies to 2-D weights only: the same set for Llama. TRL's logged loss is rounded to 4 digits, so the loss
is read unrounded from get_batch_loss_metrics (a subclass records it and the metrics of each step).

Cases: full (the whole model; TRL's reference a copy of the initial model, shardlm's the precomputed file
of the initial model), lora_cdpo (PEFT LoRA r 4 on q/v/down_proj, label_smoothing 0.1; the reference the
base with the adapters off on both sides; shardlm's initial adapters, B random (lora.init false), copied
into TRL's PeftModel before its first step, so that step 1 has z != 0), ipo (the whole model, loss_type
"ipo": TRL's mean log-probs).

Checks per case:
  CASE.shardlm_run   shardlm trains (a DPO full fine-tune from model.from_pretrained once failed here: the
                     reference pass reopened the file with a dangling tokenizer path)
  CASE.import        shardlm's initial weights (--dump) = the saved LlamaForCausalLM's, exactly
  CASE.step1 / step2 .loss and .metrics: the loss and TRL's metrics rewards/chosen, rewards/rejected,
                     rewards/margins, rewards/accuracies, logps/chosen, logps/rejected of each step against
                     TRL's; .moved: step 2 is a real comparison (the policy has left the reference)
  CASE.weights       the two steps' updates (W_final - W_initial) of every trained tensor against TRL's:
                     the norm of the difference relative to TRL's update's, and elementwise in units of lr
  lora_cdpo.adapters_cover_peft  shardlm's adapters are exactly PEFT's trainable tensors
  data.prepare, data.tokens      prepare_data converts the pairs; its samples = TRL's tokenize_row rows
                     (input ids, trained exactly where TRL's label is not -100)
Tolerances (fp32 on both sides; measured on an AMD EPYC, 2 cores): loss and metrics agree to 1e-7 relative
(log-prob sums of about 10 log-softmax values, summed in another order; rewards relative to the log-probs'
scale, as they are differences of them), so 2e-6; the updates to 1.1e-5 (full), 3e-6 (LoRA) and 1e-4 (IPO,
whose gradients are clipped 65-fold) relative, so 1e-3, while a missing weight decay (wd 0.1 here) is 1e-2
and clipping off 1e-2 (both tried); elementwise 1.2e-2 lr at worst (IPO: Adam's first steps are about
lr g / (|g| + eps), so an element whose clipped gradient is near eps moves by a part of lr that rounding
decides), so 0.1 lr. Under BUILD=build-asan the ipo case is left out (said so).
"""
import json
import math
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import use_ref_venv  # noqa: E402

use_ref_venv("trl", "dpo_trl.env")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from harness import BIN, ENV, ROOT, check, note, read_dump, run_main, scratch_dir, write_config  # noqa: E402

TMP = scratch_dir("t_dpo_trl")
ASAN = "asan" in os.environ.get("BUILD", "")
os.environ.update(HF_DATASETS_CACHE=os.path.join(TMP, "hf-datasets"), HF_HUB_OFFLINE="1",
                  HF_DATASETS_OFFLINE="1", WANDB_DISABLED="true", TOKENIZERS_PARALLELISM="false")
torch.set_num_threads(1)

V, T, N_PAIRS = 128, 16, 4
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]
LLAMA = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-5, initializer_range=0.1,
             tie_word_embeddings=False)
BETA, LR, BETAS, EPS, WD = 0.1, 1e-3, (0.9, 0.999), 1e-8, 0.1
LORA = dict(r=4, alpha=8.0, targets=["q_proj", "v_proj", "down_proj"])
# see the module's text: about 10 to 20 times what was measured
TOL = {"loss": 2e-6, "metrics": 2e-6, "update": 1e-3, "element": 0.1}
METRICS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
           "logps/rejected")


def make_pairs():
    rng = np.random.default_rng(38)
    words = lambda n: " ".join(f"w{i}" for i in rng.integers(len(SPECIAL), V, n))  # noqa: E731
    pairs = []
    for _ in range(N_PAIRS):
        chosen, rejected = words(rng.integers(2, 7)), words(rng.integers(2, 7))
        pairs.append({"prompt": words(rng.integers(2, 6)), "chosen": " " + chosen, "rejected": " " + rejected})
    return pairs


def make_model_dir():
    """The tiny Llama and the tokenizer, saved as a Hugging Face directory; returns it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    d = os.path.join(TMP, "model")
    vocab = {t: i for i, t in enumerate(SPECIAL + [f"w{i}" for i in range(len(SPECIAL), V)])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>")
    torch.manual_seed(38)
    LlamaForCausalLM(LlamaConfig(**LLAMA)).float().save_pretrained(d, safe_serialization=True)
    tok.save_pretrained(d)
    return d


def prepare(model_dir, pairs):
    src = os.path.join(TMP, "pairs.jsonl")
    with open(src, "w") as f:
        f.writelines(json.dumps(p) + "\n" for p in pairs)
    out = os.path.join(TMP, "pref.h5")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "prepare_data.py"), "--tokenizer", model_dir,
                        "-o", out, src], capture_output=True, text=True)
    check("data.prepare", r.returncode == 0, f"exit {r.returncode}: {r.stderr[-400:]}")
    return out


def shardlm(name, model_dir, pref, loss_type="sigmoid", smoothing=0.0, lora=False):
    """Two steps of shardlm; (initial dump, final dump, metrics rows) or None."""
    cfg = {"model": {"from_pretrained": model_dir},
           "data": {"train": pref, "seq_len": T, "shuffle": False},
           "train": {"steps": 2, "eval_every": 0, "sample_tokens": 0, "seed": 5,
                     "metrics": os.path.join(TMP, name + ".jsonl")},
           "train_batch_size": N_PAIRS, "train_micro_batch_size_per_gpu": N_PAIRS,
           "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS,
                                                     "weight_decay": WD}},
           "gradient_clipping": 1.0,
           "dpo": {"beta": BETA, "loss_type": loss_type, "label_smoothing": smoothing,
                   "ref_log_probs_path": os.path.join(TMP, name + ".ref.h5")}}
    if lora:
        cfg["lora"] = {"r": LORA["r"], "alpha": LORA["alpha"], "dropout": 0.0, "init": False,
                       "target_modules": LORA["targets"]}
    path = write_config(os.path.join(TMP, name + ".json"), cfg)
    first, final = os.path.join(TMP, name + ".dump"), os.path.join(TMP, name + ".final")
    r = subprocess.run([BIN, "train", path, "--quiet", "--dump", first, "--dump-final", final], env=ENV,
                       capture_output=True, text=True, timeout=600)
    check(f"{name}.shardlm_run", r.returncode == 0, f"exit {r.returncode}: {r.stderr[-600:]}")
    if r.returncode != 0:
        return None
    with open(os.path.join(TMP, name + ".jsonl")) as f:
        rows = [x for x in map(json.loads, filter(str.strip, f)) if "loss" in x]
    return read_dump(first), read_dump(final), rows


def peft_name(shardlm_name):
    module, kind = shardlm_name.rsplit(".lora_", 1)
    return f"base_model.model.{module}.lora_{kind[0]}.default.weight"


def run_trl(name, model_dir, pairs, loss_type="sigmoid", smoothing=0.0, adapters=None):
    """Two steps of TRL's DPOTrainer; (the recorded steps, the final named parameters, TRL's tokenized rows)."""
    import datasets
    import peft
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast, TrainingArguments
    from trl import DPOTrainer

    class Recording(DPOTrainer):
        steps = []

        def get_batch_loss_metrics(self, model, batch, train_eval="train"):
            loss, metrics = super().get_batch_loss_metrics(model, batch, train_eval)
            self.steps.append(dict({k: float(v) for k, v in metrics.items()}, loss=loss.item()))
            return loss, metrics

    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
    args = TrainingArguments(output_dir=os.path.join(TMP, name + ".trl"), per_device_train_batch_size=N_PAIRS,
                             gradient_accumulation_steps=1, max_steps=2, learning_rate=LR, weight_decay=WD,
                             adam_beta1=BETAS[0], adam_beta2=BETAS[1], adam_epsilon=EPS, optim="adamw_torch",
                             max_grad_norm=1.0, lr_scheduler_type="constant", warmup_steps=0, logging_steps=1,
                             save_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0,
                             remove_unused_columns=False, seed=5, disable_tqdm=True)
    peft_config = None
    if adapters is not None:
        peft_config = peft.LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=0.0,
                                      target_modules=LORA["targets"], task_type="CAUSAL_LM")
    trainer = Recording(model=model, ref_model=None, beta=BETA, loss_type=loss_type, label_smoothing=smoothing,
                        args=args, train_dataset=datasets.Dataset.from_list(pairs), tokenizer=tok,
                        max_length=T, max_prompt_length=T // 2, peft_config=peft_config)
    if adapters is not None:
        params = dict(trainer.model.named_parameters())
        trained = {n for n, p in params.items() if p.requires_grad}
        check(f"{name}.adapters_cover_peft", trained == {peft_name(n) for n in adapters}, f"{sorted(trained)[:3]}")
        with torch.no_grad():
            for n, w in adapters.items():
                params[peft_name(n)].copy_(torch.from_numpy(np.ascontiguousarray(w)))
    Recording.steps = []
    trainer.train()
    final = {n: p.detach().numpy().copy() for n, p in trainer.model.named_parameters()}
    return list(Recording.steps), final, trainer.train_dataset


def check_rows(pref, rows):
    """prepare_data's samples against TRL's tokenize_row: the same ids, trained exactly where TRL's label is set."""
    import h5py
    with h5py.File(pref, "r") as f:
        tokens, trained, offsets = f["tokens"][:], f["trained"][:], f["offsets"][:]
    bad = []
    for k, row in enumerate(rows):
        for j, key in enumerate(("chosen", "rejected")):
            a, b = offsets[2 * k + j], offsets[2 * k + j + 1]
            ids, labels = row[f"{key}_input_ids"], row[f"{key}_labels"]
            if tokens[a:b].tolist() != ids or trained[a:b].tolist() != [int(x != -100) for x in labels]:
                bad.append((k, key, tokens[a:b].tolist(), ids))
    check("data.tokens", not bad and len(rows) == N_PAIRS and len(offsets) == 2 * N_PAIRS + 1, f"{bad[:1]}")


def compare(name, ours, theirs, lora):
    first, final, rows = ours
    steps, trl_final, _ = theirs
    check(f"{name}.steps", len(rows) == 2 and len(steps) == 2, f"shardlm {len(rows)} steps, TRL {len(steps)}")
    worst = {"loss": 0.0, "metrics": 0.0}
    for s, (a, b) in enumerate(zip(rows, steps)):
        e = abs(a["loss"] - b["loss"]) / max(abs(b["loss"]), 1e-3)
        worst["loss"] = max(worst["loss"], e)
        check(f"{name}.step{s + 1}.loss", e <= TOL["loss"], f"shardlm {a['loss']:.9g}, TRL {b['loss']:.9g}")
        # rewards are beta (pi - ref): a difference of sums of about -50, so their scale is that of the log-probs
        scale = max(1.0, abs(b["logps/chosen"]), abs(b["logps/rejected"]))
        errs = {k: abs(a.get(k, math.inf) - b[k]) / (scale if k.startswith("rewards") else max(1.0, abs(b[k])))
                for k in METRICS}
        worst["metrics"] = max(worst["metrics"], max(errs.values()))
        bad = [(k, a.get(k), b[k]) for k in METRICS if errs[k] > TOL["metrics"]]
        check(f"{name}.step{s + 1}.metrics", not bad, f"{bad[:2]}")
    # step 2 must be a real comparison: the policy has moved away from the reference
    check(f"{name}.step2.moved", abs(steps[1]["loss"] - steps[0]["loss"]) > 1e-4 and
          abs(steps[1]["rewards/margins"]) > 1e-5, f"TRL's losses {steps[0]['loss']}, {steps[1]['loss']}")
    # the updates W_final - W_initial of every trained tensor: their difference relative to TRL's update (a
    # missing weight decay would be about wd |w| of it), and elementwise in units of lr (Adam's first steps are
    # about lr g / (|g| + eps): an element whose gradient is near eps after clipping moves by a part of lr that
    # rounding decides, so the elementwise bound is loose and the norm one tight)
    upd, elem, where = 0.0, 0.0, ""
    for n, w in final.items():
        if n.startswith("grad.") or n in ("inputs", "targets", "logits", "loss") or (lora and ".lora_" not in n):
            continue
        t = trl_final.get(peft_name(n) if lora else n)
        if t is None or t.shape != w.shape or n not in first:
            upd, where = math.inf, f"{n} missing or of another shape in TRL's model"
            break
        d_ours, d_trl = w.astype(np.float64) - first[n], t.astype(np.float64) - first[n]
        e = float(np.linalg.norm(d_ours - d_trl)) / max(float(np.linalg.norm(d_trl)), 1e-30)
        if e > upd:
            upd, where = e, n
        elem = max(elem, float(np.max(np.abs(d_ours - d_trl))) / LR)
    check(f"{name}.weights", upd <= TOL["update"] and elem <= TOL["element"],
          f"update rel {upd:.3g} at {where}, max |diff| {elem:.3g} lr")
    note(f"{name}: loss rel {worst['loss']:.2e}, metrics {worst['metrics']:.2e}, update rel {upd:.2e}, "
         f"max element {elem:.2e} lr")


def check_import(name, dump, model_dir):
    from safetensors.numpy import load_file
    saved = load_file(os.path.join(model_dir, "model.safetensors"))
    bad = [n for n, w in saved.items() if n not in dump or not np.array_equal(dump[n], w)]
    check(f"{name}.import", not bad, f"{bad[:3]} differ")


def main():
    try:
        import datasets  # noqa: F401
        import trl
        from trl import DPOTrainer  # noqa: F401
        ok, why = trl.__version__ == "0.8.6", f"trl {trl.__version__}"
    except Exception as e:  # ImportError, or trl's RuntimeError naming a missing package
        ok, why = False, f"{type(e).__name__}: {e}"
    check("dpo_trl.env", ok, f"TRL's DPOTrainer does not import ({why}); run tools/deps.sh --test")
    if not ok:
        return
    model_dir = make_model_dir()
    pairs = make_pairs()
    pref = prepare(model_dir, pairs)
    cases = [("full", "sigmoid", 0.0, False), ("lora_cdpo", "sigmoid", 0.1, True), ("ipo", "ipo", 0.0, False)]
    if ASAN:
        note("BUILD=build-asan: the full and lora_cdpo cases only (ipo left out)")
        cases = cases[:2]
    for name, loss_type, smoothing, lora in cases:
        ours = shardlm(name, model_dir, pref, loss_type, smoothing, lora)
        if not ours:
            continue
        check_import(name, ours[0], model_dir)
        adapters = {n: w for n, w in ours[0].items() if ".lora_" in n and not n.startswith("grad.")} if lora else None
        theirs = run_trl(name, model_dir, pairs, loss_type, smoothing, adapters)
        if name == "full":
            check_rows(pref, theirs[2])
        compare(name, ours, theirs, lora)


if __name__ == "__main__":
    run_main("dpo_trl", main)
