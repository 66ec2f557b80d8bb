#!/usr/bin/env bash
# The Hugging Face reference environment that tools/deps.sh --test makes
# (build/ref-venv over Debian's interpreter): transformers 4.40.2,
# tokenizers, safetensors, PEFT 0.10.0 and accelerate 0.29.3 import over
# Debian's torch 1.13 (never PyPI's), and what the Llama, tokenizer and LoRA
# reference tests need works on inputs made here: a tiny LlamaForCausalLM
# (grouped-query attention) trains a step, a byte-level BPE trained on a few
# lines round-trips text, and PEFT's LoRA adds exactly r (in + out) parameters
# per adapted projection.
set -u
cd "$(dirname "$0")/.."
PY=build/ref-venv/bin/python
if [ ! -x "$PY" ]; then
  echo "FAIL ref_env.exists: $PY missing; run tools/deps.sh --test"
  exit 1
fi
"$PY" - <<'PYEOF'
import importlib.metadata as md
import os
import sys

failed = 0


def check(name, ok, why=""):
    global failed
    print(("ok " if ok else "FAIL ") + name + ("" if ok else ": " + why), flush=True)
    failed += not ok


import torch  # noqa: E402
import transformers  # noqa: E402

check("ref_env.debian_torch", torch.__file__.startswith("/usr/lib/python3/dist-packages/")
      and torch.__version__.startswith("1.13"), f"{torch.__file__} {torch.__version__}")
check("ref_env.versions", transformers.__version__ == "4.40.2" and md.version("peft") == "0.10.0"
      and md.version("accelerate") == "0.29.3", f"transformers {transformers.__version__}")
dists = {d.metadata["Name"].lower() for d in md.distributions(path=[p for p in sys.path if "ref-venv" in p])}
bad = sorted(d for d in dists if d.startswith("nvidia") or d in ("torch", "triton"))
check("ref_env.no_pypi_torch", not bad, f"installed in the venv: {bad}")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=32, rope_theta=5000.0, tie_word_embeddings=False)
model = LlamaForCausalLM(cfg)
ids = torch.randint(0, 64, (2, 16))
out = model(input_ids=ids, labels=ids)
out.loss.backward()
grads = [p.grad for p in model.parameters()]
check("ref_env.llama_trains", out.logits.shape == (2, 16, 64) and torch.isfinite(out.loss).item()
      and all(g is not None and torch.isfinite(g).all().item() for g in grads),
      f"logits {tuple(out.logits.shape)}, loss {out.loss.item()}")
k = model.model.layers[0].self_attn.k_proj.weight.shape
check("ref_env.llama_gqa_shapes", tuple(k) == (16, 32), f"k_proj {tuple(k)} (want (16, 32): 2 KV heads of 8)")

from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers  # noqa: E402

tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(["the cat sat on the mat", "the dog sat on the log"] * 20,
                        trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
text = "the cat sat on the log"
enc = tok.encode(text)
check("ref_env.tokenizers_roundtrip", tok.decode(enc.ids) == text and len(enc.ids) < len(text),
      f"{enc.ids} -> {tok.decode(enc.ids)!r}")

from peft import LoraConfig, get_peft_model  # noqa: E402

before = sum(p.numel() for p in model.parameters())
peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
want = 2 * 4 * ((32 + 32) + (32 + 16))  # layers x r x (in + out) of q_proj and v_proj
check("ref_env.peft_lora_parameters", trainable == want, f"{trainable} trainable, want {want} (model had {before})")
sys.exit(1 if failed else 0)
PYEOF
