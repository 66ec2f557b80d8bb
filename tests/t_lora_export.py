#!/usr/bin/env python3
"""t_lora_export — LoRA out of shardlm (issue 19): PEFT's adapter directory
(checkpoint.export_hf of a LoRA run, and `shardlm export CKPT DIR`) and the
merged model (`shardlm export --merge CKPT DIR`), against PEFT 0.10.0 over
transformers 4.40 (build/ref-venv; this script re-executes itself there).

transformers saves the bases the runs start from (model.from_pretrained):
a tiny untied Llama with grouped-query attention and a tiny GPT-2. Cases
(r 4, alpha 8, lora.init false so that B is nonzero from the start):
  llama      every linear layer ("all-linear")
  llama_mts  the same with lora.modules_to_save ["lm_head"], at ZeRO stage 0
             (every rank holds every tensor and exports 1/N of each)
  gpt2       c_attn, mlp.c_fc and mlp.c_proj (Conv1D: fan_in_fan_out; GPT-2's
             attn.c_proj stays unadapted, so target_modules must say
             "mlp.c_proj", not "c_proj")
  llama_bf16 all-linear in bf16

Checks, per case, with two runs at N = 2 (ZeRO stage 3 but llama_mts):
  X.lr0.*    one step at lr 0 with --dump (the step's logits, from the
             adapters the export holds): peft.PeftModel.from_pretrained(base,
             ckpt/hf) loads every tensor of adapter_model.safetensors (no
             unexpected key, no adapter key missing, its state dict is the
             file's) and gives shardlm's logits on the dumped tokens (rel
             1e-4); adapter_config.json as PEFT 0.10.0 writes it (and
             LoraConfig reads it back); AutoPeftModelForCausalLM finds the base
             through base_model_name_or_path
  X.train.*  three steps at lr 1e-2 with --dump-final: the exported tensors
             are the final parameters (bitwise, in the run's dtype), the
             adapters moved; `shardlm export CKPT DIR` writes the same two
             files; `shardlm export --merge CKPT DIR` (mpirun -np 2) loads with
             from_pretrained and has the PEFT model's logits (rel 1e-4) and
             PEFT's merge_and_unload's tensors (and the trained lm_head)
  bad.*      one line on stderr, exit status 2, nothing written: --merge and
             --base of a whole-model checkpoint, --base of a missing
             directory, of another model's config.json, of files whose tensors
             have other shapes than their config.json says; a LoRA checkpoint
             to a single .safetensors file; adapters into a directory holding a
             Hugging Face model
"""
import json
import os
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import use_ref_venv  # noqa: E402

use_ref_venv("peft", "lora_export.env")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from peft import (AutoPeftModelForCausalLM, LoraConfig, PeftModel, get_peft_model_state_dict,  # noqa: E402
                  set_peft_model_state_dict)
from safetensors.torch import load_file  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402

from harness import (BIN, ENV, check, note, read_dump, rel, run_main, scratch_dir, write_config,  # noqa: E402
                     write_shard)

TMP = scratch_dir("t_lora_export")
torch.manual_seed(7)
torch.set_num_threads(1)
V, T, B = 100, 16, 2
R, ALPHA = 4, 8
TOL = 1e-4  # shardlm's fp32 forward against PEFT's in float64, and the merged model against PEFT's
PREFIX = "base_model.model."
TOKENS = np.random.default_rng(5).integers(0, V, 40 * T + 1)
DATA = os.path.join(TMP, "train.bin")
write_shard(DATA, TOKENS)

LLAMA_LINEARS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
CASES = {
    # name: base, lora section, dtype, ZeRO stage, target_modules adapter_config.json must hold
    "llama": ("llama", {"target_modules": "all-linear"}, "fp32", 3, LLAMA_LINEARS),
    "llama_mts": ("llama", {"target_modules": "all-linear", "modules_to_save": ["lm_head"]}, "fp32", 0, LLAMA_LINEARS),
    "gpt2": ("gpt2", {"target_modules": ["c_attn", "mlp.c_fc", "mlp.c_proj"]}, "fp32", 3,
             {"c_attn", "c_fc", "mlp.c_proj"}),
    "llama_bf16": ("llama", {"target_modules": "all-linear"}, "bf16", 3, LLAMA_LINEARS),
}


def make_bases():
    bases = {}
    lc = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, initializer_range=0.1,
                     tie_word_embeddings=False)
    bases["llama"] = os.path.join(TMP, "base_llama")
    LlamaForCausalLM(lc).float().save_pretrained(bases["llama"], safe_serialization=True)
    gc = GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=2, n_positions=64, initializer_range=0.1)
    bases["gpt2"] = os.path.join(TMP, "base_gpt2")
    GPT2LMHeadModel(gc).float().save_pretrained(bases["gpt2"], safe_serialization=True)
    # the same Llama shape in config.json, but its files' MLP 64 wide
    wide = os.path.join(TMP, "base_llama_wide")
    LlamaForCausalLM(LlamaConfig(**dict(lc.to_dict(), intermediate_size=64))).save_pretrained(wide)
    c = json.load(open(os.path.join(wide, "config.json")))
    c["intermediate_size"] = 48
    json.dump(c, open(os.path.join(wide, "config.json"), "w"))
    bases["llama_wide_files"] = wide
    return bases


def hf_class(kind):
    return GPT2LMHeadModel if kind == "gpt2" else LlamaForCausalLM


def run(args, N=1):
    cmd = (["mpirun", "-np", str(N), "--oversubscribe"] if N > 1 else []) + [BIN] + args
    return subprocess.run(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)


def train(name, base, lora, dtype, lr, steps, dump_flag, stage=3):
    ck = os.path.join(TMP, name)
    shutil.rmtree(ck, ignore_errors=True)
    cfg = {"model": {"from_pretrained": base},
           "data": {"train": DATA, "seq_len": T, "shuffle": False},
           "train": {"steps": steps, "eval_every": 0, "sample_tokens": 0},
           "train_micro_batch_size_per_gpu": B,
           "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.0}},
           "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
           "checkpoint": {"dir": ck, "export_hf": True}}
    if lora is not None:
        cfg["lora"] = dict({"r": R, "alpha": ALPHA, "init": False}, **lora)
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    path = write_config(os.path.join(TMP, name + ".json"), cfg)
    dump = os.path.join(TMP, name + ".dump")
    r = run(["train", path, dump_flag, dump], N=2)
    check(f"{name}.run", r.returncode == 0, f"exit {r.returncode}: {r.stderr[-600:]}")
    return (ck, read_dump(dump)) if r.returncode == 0 else (None, None)


def shardlm_name(key, kind):
    """The shardlm tensor a PEFT file's key holds."""
    name = key[len(PREFIX):]
    return name[len("transformer."):] if kind == "gpt2" else name


def peft_model(kind, base, adapters):
    model = PeftModel.from_pretrained(hf_class(kind).from_pretrained(base, torch_dtype=torch.float32), adapters)
    return model.double().eval()


def logits(model, tokens):
    with torch.no_grad():
        return model(input_ids=torch.as_tensor(tokens, dtype=torch.int64)).logits.numpy()


def check_loaded(name, model, adapters):
    """Every tensor of the adapter file is in the PEFT model, and it has no adapter tensor the file lacks."""
    f = load_file(os.path.join(adapters, "adapter_model.safetensors"))
    res = set_peft_model_state_dict(model, {k: v.double() for k, v in f.items()})
    missing = [k for k in res.missing_keys if "lora_" in k or "modules_to_save" in k]
    sd = get_peft_model_state_dict(model, save_embedding_layers=False)
    same = sd.keys() == f.keys() and all(torch.equal(sd[k], f[k].double()) for k in f)
    check(f"{name}.peft_keys", not res.unexpected_keys and not missing and same,
          f"unexpected {res.unexpected_keys[:3]}, missing {missing[:3]}, file {sorted(f)[:2]} vs model "
          f"{sorted(sd)[:2]}")
    return f


def check_adapter_config(name, d, base, lora, kind, targets):
    c = json.load(open(os.path.join(d, "adapter_config.json")))
    want = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": R, "lora_alpha": ALPHA, "lora_dropout": 0.0,
            "fan_in_fan_out": kind == "gpt2", "bias": "none", "modules_to_save": lora.get("modules_to_save"),
            "init_lora_weights": False, "inference_mode": True, "use_rslora": False, "use_dora": False,
            "base_model_name_or_path": os.path.realpath(base), "revision": None, "layers_to_transform": None,
            "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {}, "megatron_config": None,
            "megatron_core": "megatron.core", "loftq_config": {}, "layer_replication": None, "auto_mapping": None}
    bad = {k: c.get(k, "(absent)") for k, v in want.items() if c.get(k, "(absent)") != v}
    extra = set(c) - set(want) - {"target_modules"}
    tm = c.get("target_modules")
    ok = not bad and not extra and isinstance(tm, list) and len(tm) == len(set(tm)) and set(tm) == targets
    check(f"{name}.adapter_config", ok, f"differ {bad}, unknown {extra}, target_modules {tm} (want {sorted(targets)})")
    try:
        lc = LoraConfig.from_pretrained(d)
        check(f"{name}.adapter_config_reads", lc.r == R and lc.lora_alpha == ALPHA, f"{lc}")
    except Exception as e:  # noqa: BLE001
        check(f"{name}.adapter_config_reads", False, f"{type(e).__name__}: {e}")


def check_lr0(case, bases):
    kind, lora, dtype, stage, targets = CASES[case]
    name = f"{case}.lr0"
    ck, d = train(name.replace(".", "_"), bases[kind], lora, dtype, 0.0, 1, "--dump", stage)
    if ck is None:
        return
    hf = os.path.join(ck, "hf")
    check(f"{name}.files", sorted(os.listdir(hf)) == ["adapter_config.json", "adapter_model.safetensors"],
          f"{sorted(os.listdir(hf))}")
    check_adapter_config(name, hf, bases[kind], lora, kind, targets)
    model = peft_model(kind, bases[kind], hf)
    check_loaded(name, model, hf)
    got = d["logits"][..., :V]
    e = rel(got, logits(model, d["inputs"]))
    # bf16: shardlm's forward rounds its activations to bf16 and PEFT's here is float64 on the bf16 parameters
    tol = 2e-2 if dtype == "bf16" else TOL
    note(f"{name}: shardlm's logits against PEFT's: rel {e:.2e}")
    check(f"{name}.logits_equal_shardlm", e <= tol, f"rel {e:.2e} (tolerance {tol})")
    if case == "llama":  # the base found through base_model_name_or_path
        auto = AutoPeftModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32).double().eval()
        e = rel(logits(auto, d["inputs"]), logits(model, d["inputs"]))
        check(f"{name}.auto_peft_finds_base", e == 0.0, f"rel {e:.2e}")


def st_dtypes(path):
    raw = open(path, "rb").read(8)
    n = struct.unpack("<Q", raw)[0]
    header = json.loads(open(path, "rb").read(8 + n)[8:])
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


def check_train(case, bases):
    kind, lora, dtype, stage, _ = CASES[case]
    name = f"{case}.train"
    ck, final = train(name.replace(".", "_"), bases[kind], lora, dtype, 1e-2, 3, "--dump-final", stage)
    if ck is None:
        return
    hf = os.path.join(ck, "hf")
    f = load_file(os.path.join(hf, "adapter_model.safetensors"))
    want_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    bad = []
    for k, v in f.items():
        ref = final.get(shardlm_name(k, kind))
        if ref is None or v.dtype != want_dtype or not np.array_equal(v.float().numpy(), ref[:v.shape[0]]):
            bad.append(k)
    n_adapters = sum(1 for k in f if ".lora_" in k)
    check(f"{name}.tensors_are_final_params", f and not bad, f"{len(bad)} of {len(f)} differ, e.g. {bad[:2]}")
    lr0 = load_file(os.path.join(TMP, f"{case}_lr0", "hf", "adapter_model.safetensors"))
    moved = [k for k in f if ".lora_" in k and k in lr0 and not torch.equal(f[k], lr0[k])]
    check(f"{name}.adapters_trained", len(moved) == n_adapters, f"{len(moved)} of {n_adapters} changed")
    # shardlm export CKPT DIR: the same files
    out = os.path.join(TMP, f"{case}_exported")
    shutil.rmtree(out, ignore_errors=True)
    r = run(["export", ck, out])
    same = r.returncode == 0 and all(open(os.path.join(out, x), "rb").read() == open(os.path.join(hf, x), "rb").read()
                                     for x in ("adapter_model.safetensors", "adapter_config.json"))
    check(f"{name}.export_ckpt_equals_in_run", same, f"exit {r.returncode}: {r.stderr[-300:]}")
    # --merge: a Hugging Face directory of the base with the adapters folded in
    merged = os.path.join(TMP, f"{case}_merged")
    shutil.rmtree(merged, ignore_errors=True)
    r = run(["export", "--merge", ck, merged], N=2)
    check(f"{name}.merge_runs", r.returncode == 0, f"exit {r.returncode}: {r.stderr[-400:]}")
    if r.returncode != 0:
        return
    st, torch_dtype = {"fp32": ("F32", "float32"), "bf16": ("BF16", "bfloat16")}[dtype]
    have = (st_dtypes(os.path.join(merged, "model.safetensors")), json.load(open(os.path.join(merged, "config.json")))
            .get("torch_dtype"))
    check(f"{name}.merge_dtype", have == ({st}, torch_dtype), f"{have}, want the run's {dtype}")
    if dtype != "fp32":
        return
    m = hf_class(kind).from_pretrained(merged, torch_dtype=torch.float32).double().eval()
    p = peft_model(kind, bases[kind], hf)
    e = rel(logits(m, final_tokens()), logits(p, final_tokens()))
    note(f"{name}: the merged model's logits against PEFT's: rel {e:.2e}")
    check(f"{name}.merged_logits_equal_peft", e <= TOL, f"rel {e:.2e}")
    ref = p.merge_and_unload().state_dict()
    got = m.state_dict()
    worst = max((rel(got[k].numpy(), ref[k].numpy()), k) for k in ref if not k.endswith("attn.bias")
                and not k.endswith("masked_bias"))
    check(f"{name}.merged_tensors_equal_peft_merge", worst[0] <= 1e-6, f"worst {worst[1]} rel {worst[0]:.2e}")
    if "modules_to_save" in lora:
        check(f"{name}.merged_lm_head_is_trained", np.array_equal(got["lm_head.weight"].float().numpy(),
                                                                  final["lm_head.weight"][:V]), "")


def final_tokens():
    return np.stack([TOKENS[k * T:k * T + T] for k in range(4)])


def expect_bad(name, args, words, out):
    r = run(args)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    ok = r.returncode == 2 and len(lines) == 1 and all(w in lines[0] for w in words) and not os.path.exists(out)
    check(f"bad.{name}", ok, f"exit {r.returncode}, stderr {lines[:3]} (want one line naming {words}), "
                             f"{out} written {os.path.exists(out)}")


def check_bad(bases):
    lora_ck = os.path.join(TMP, "llama_train")
    whole, _ = train("whole", bases["llama"], None, "fp32", 1e-2, 1, "--dump-final")
    out = os.path.join(TMP, "bad_out")
    shutil.rmtree(out, ignore_errors=True)
    if whole:
        expect_bad("merge_whole_model", ["export", "--merge", whole, out], ["--merge", "not a LoRA checkpoint"], out)
        expect_bad("base_whole_model", ["export", "--base", bases["llama"], whole, out], ["--base", "not a LoRA"], out)
    missing = os.path.join(TMP, "no_such_base")
    expect_bad("base_missing", ["export", "--merge", "--base", missing, lora_ck, out], [missing, "--base"], out)
    expect_bad("base_other_model", ["export", "--merge", "--base", bases["gpt2"], lora_ck, out],
               [bases["gpt2"], "another model"], out)
    expect_bad("base_other_tensor_shapes", ["export", "--merge", "--base", bases["llama_wide_files"], lora_ck, out],
               ["mlp", "[64, 32]"], out)
    expect_bad("lora_to_single_file", ["export", lora_ck, out + ".safetensors"], ["LoRA checkpoint", "--merge"],
               out + ".safetensors")
    holds_model = os.path.join(TMP, "holds_model")
    shutil.rmtree(holds_model, ignore_errors=True)
    shutil.copytree(bases["llama"], holds_model)
    r = run(["export", lora_ck, holds_model])
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    check("bad.adapters_beside_model", r.returncode == 2 and len(lines) == 1 and "config.json" in lines[0] and
          not os.path.exists(os.path.join(holds_model, "adapter_config.json")), f"exit {r.returncode}, {lines[:3]}")


def main():
    bases = make_bases()
    for case in CASES:
        note(f"case {case}")
        check_lr0(case, bases)
        check_train(case, bases)
    check_bad(bases)


run_main("lora_export.main", main)
