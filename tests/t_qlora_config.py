#!/usr/bin/env python3
"""t_qlora_config — the quantization section (issue 50) under transformers'
BitsAndBytesConfig names, in build/ref5-venv (transformers 5.25; the script
re-executes itself there).

  accept.*   BitsAndBytesConfig(...).to_dict() of transformers itself, pasted
             whole as the quantization section, beside DeepSpeed's keys (a
             --deepspeed file with zero_optimization stage 3 and offload):
             `shardlm config` exits 0 and the resolved section holds the
             values given (nf4, double quantization, bfloat16 compute)
  refuse.*   one line on stderr naming the key, exit status 2, for: full
             fine-tuning of a 4-bit base (no lora section), an unknown
             bnb_4bit_quant_type, a quant_method other than bitsandbytes
             (gptq, awq), load_in_8bit, a compute dtype that is not the run's,
             an unknown storage dtype, a skipped module other than lm_head, a
             misspelt key (with "did you mean"), a model other than a Llama
             with separate projections (GPT-2)
  plan       `shardlm plan` of a valid QLoRA config exits 0 and says that it
             plans the base in the parameter dtype (4-bit storage is not
             implemented yet; the numerics are tests/t_qlora.py's)
"""
import json
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import use_ref5_venv  # noqa: E402

use_ref5_venv("qlora_config.env")

import torch  # noqa: E402
from transformers import BitsAndBytesConfig  # noqa: E402

from harness import check, failures, scratch_dir  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("SHARDLM_BIN", os.path.join(ROOT, "bin", "shardlm"))
TMP = scratch_dir("t_qlora_config")

tokens = os.path.join(TMP, "tokens.bin")
with open(tokens, "wb") as f:  # an llm.c shard (magic 20240520, version 1) of 4000 tokens below 64
    f.write(struct.pack("<256i", 20240520, 1, 4000, *([0] * 253)))
    f.write(struct.pack("<4000H", *[(i * 7) % 50 for i in range(4000)]))

base = {
    "model": {"type": "llama", "n_layer": 2, "n_head": 2, "n_embd": 64, "ffn_dim": 128, "n_positions": 32,
              "vocab_size": 64},
    "data": {"train": tokens},
    "train": {"steps": 1},
    "lora": {"r": 4, "target_modules": "all-linear"},
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
}
deepspeed = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
             "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                                   "offload_optimizer": {"device": "cpu"}}}
ds_path = os.path.join(TMP, "ds.json")
with open(ds_path, "w") as f:
    json.dump(deepspeed, f)

bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                         bnb_4bit_compute_dtype=torch.bfloat16).to_dict()


def run(command, cfg, *extra):
    path = os.path.join(TMP, "cfg.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    args = [BIN, command, path, "--deepspeed", ds_path, *extra]
    return subprocess.run(args, capture_output=True, text=True, cwd=TMP)


def one_line_error(name, r, *words):
    lines = [line for line in r.stderr.splitlines() if "error" in line]
    check(name, r.returncode == 2 and len(lines) == 1 and all(w in lines[0] for w in words),
          f"rc {r.returncode}, stderr {r.stderr.strip()[-400:]!r}, want one error line with {words}")


# accept: transformers' own to_dict() beside DeepSpeed's keys
r = run("config", dict(base, quantization=bnb), "--no-files")
check("accept.exit0", r.returncode == 0, r.stderr.strip()[-300:])
if r.returncode == 0:
    start = r.stdout.find("{")
    resolved = json.loads(r.stdout[start:]) if start >= 0 else {}
    q = resolved.get("quantization", {})
    check("accept.values", q.get("load_in_4bit") is True and q.get("bnb_4bit_quant_type") == "nf4"
          and q.get("bnb_4bit_use_double_quant") is True and q.get("bnb_4bit_compute_dtype") == "bfloat16"
          and q.get("quant_method") == "bitsandbytes", json.dumps(q))
    check("accept.deepspeed", resolved.get("zero_optimization", {}).get("stage") == 3,
          json.dumps(resolved.get("zero_optimization")))
    check("accept.transformers_keys", sorted(bnb) and all(k in q for k in bnb), f"{sorted(bnb)} vs {sorted(q)}")

qlora = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
cases = {
    "full_finetune": (dict({k: v for k, v in base.items() if k != "lora"}, quantization=qlora),
                      ["quantization.load_in_4bit", "lora"]),
    "quant_type": (dict(base, quantization=dict(qlora, bnb_4bit_quant_type="int4")),
                   ["bnb_4bit_quant_type", "int4", "nf4"]),
    "gptq": (dict(base, quantization=dict(qlora, quant_method="gptq")), ["quant_method", "gptq"]),
    "awq": (dict(base, quantization=dict(qlora, quant_method="awq")), ["quant_method", "awq"]),
    "int8": (dict(base, quantization={"load_in_8bit": True}), ["load_in_8bit"]),
    "compute_dtype": (dict(base, quantization=dict(qlora, bnb_4bit_compute_dtype="float16")),
                      ["bnb_4bit_compute_dtype", "bfloat16"]),
    "storage": (dict(base, quantization=dict(qlora, bnb_4bit_quant_storage="int3")), ["bnb_4bit_quant_storage"]),
    "storage_number": (dict(base, quantization=dict(qlora, bnb_4bit_quant_storage=8)), ["bnb_4bit_quant_storage"]),
    "skip_modules": (dict(base, quantization=dict(qlora, llm_int8_skip_modules=["q_proj"])),
                     ["llm_int8_skip_modules", "q_proj"]),
    "misspelt": (dict(base, quantization=dict(qlora, bnb_4bit_quant_typ="nf4")), ["did you mean"]),
}
for name, (cfg, words) in cases.items():
    one_line_error("refuse." + name, run("config", cfg, "--no-files"), *words)

gpt2 = dict(base, model={"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 64, "n_positions": 32,
                          "vocab_size": 64}, quantization=qlora)
one_line_error("refuse.gpt2", run("config", gpt2, "--no-files"), "load_in_4bit", "gpt2")

r = run("plan", dict(base, quantization=qlora))
check("plan", r.returncode == 0 and "stored and gathered in 4 bits" in r.stdout,
      r.stderr.strip()[-300:] + r.stdout[:300])


def shard_bytes(cfg):
    """The plan's parameter shard of cfg at stage 3 with every unit sharded (--json), or None."""
    r = run("plan", cfg, "--ranks", "2", "--json", "--set", "zero_optimization.stage=3",
            "--set", "zero_optimization.stage3_param_persistence_threshold=0")
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1])["memory"]["parameter shard"]["bytes"] if r.returncode == 0 and lines else None


# the blocks' shards in 4 bits: a 2-layer model's 4-bit shards replace its bf16 ones (t_qlora checks the bytes)
q4, lora = shard_bytes(dict(base, quantization=qlora)), shard_bytes(base)
check("plan.4bit_shards", q4 is not None and lora is not None and q4 < lora, f"QLoRA {q4} B, LoRA {lora} B")

sys.exit(1 if failures() else 0)
