#!/usr/bin/env python3
"""t_hf — Hugging Face model directories in and out (issue 17).

transformers 4.40.2 (build/ref-venv; this script re-executes itself there)
saves random models the test makes: a LlamaForCausalLM with grouped-query
attention in fp32 and in bf16, forced into several .safetensors files with an
index by a small max_shard_size, and a GPT2LMHeadModel (one file, keys with
the "transformer." prefix, tied lm_head not stored).

Checks:
  load.*      (also a GPT-2 file without the prefix and with the attention's
              mask buffers, and a MistralForCausalLM)
              shardlm starts from each directory (model.from_pretrained) at
              N = 1, 2, 3 (ZeRO stage 3, and stages 0 and 2 at N = 2): the first
              step's loss equals transformers' loss on the same tokens within
              1e-5 (fp32 weights; the bf16 files compared with the fp32 model
              they were rounded from, through transformers loading them); the
              bytes each rank read (its log) add up to the file's weights and
              at stage 3 are the rank's share within the alignment rounding
  export.*    after 3 steps with checkpoint.export_hf the directory loads with
              from_pretrained, and shardlm started from it has transformers'
              logits for it (1e-5); `shardlm export CKPT DIR` under mpirun -np
              2 with --max-shard-size gives the same tensors as -np 1
  roundtrip.* import, one step at lr 0 and weight decay 0, export (N = 2 at
              stages 3, 2 and 0): every tensor bitwise equal to the original, in
              the file's dtype
  bad.*       one line naming the file (and the tensor), exit status 2, nothing
              written: a header length past the end of the file, offsets past
              the end (a truncated shard), overlapping tensors, an I8 and an
              F8_E4M3 tensor, a tensor missing from every file, a shape that
              disagrees with config.json, an index naming a missing file, an
              unknown architecture, a config key contradicting config.json, an
              export into a directory holding another model
"""
import glob
import json
import os
import re
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import use_ref_venv  # noqa: E402

use_ref_venv("transformers", "hf.env")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig,  # noqa: E402
                          MistralForCausalLM)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (BIN, ENV, check, failures, memory_binary, note, read_dump, rel, scratch_dir,  # noqa: E402
                     write_config, write_shard)

TMP = scratch_dir("t_hf")
torch.manual_seed(3)
V, T, B = 100, 16, 2
TOKENS = np.random.default_rng(5).integers(0, V, 60 * T + 1)
DATA = os.path.join(TMP, "train.bin")
write_shard(DATA, TOKENS)


def hf_dirs():
    dirs = {}
    lc = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=64, rope_theta=500000.0, rms_norm_eps=1e-5,
                     initializer_range=0.1)
    llama = LlamaForCausalLM(lc).float()
    dirs["llama_fp32"] = os.path.join(TMP, "llama_fp32")
    llama.save_pretrained(dirs["llama_fp32"], max_shard_size="20KB", safe_serialization=True)
    dirs["llama_bf16"] = os.path.join(TMP, "llama_bf16")
    LlamaForCausalLM(lc).to(torch.bfloat16).save_pretrained(dirs["llama_bf16"], max_shard_size="20KB",
                                                            safe_serialization=True)
    gc = GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=2, n_positions=64, initializer_range=0.1)
    dirs["gpt2"] = os.path.join(TMP, "gpt2")
    GPT2LMHeadModel(gc).float().save_pretrained(dirs["gpt2"], safe_serialization=True)
    # GPT-2 as older files store it: no "transformer." prefix, the attention's mask buffers beside the weights
    dirs["gpt2_noprefix"] = os.path.join(TMP, "gpt2_noprefix")
    shutil.copytree(dirs["gpt2"], dirs["gpt2_noprefix"], dirs_exist_ok=True)
    old = load_file(os.path.join(dirs["gpt2"], "model.safetensors"))
    new = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in old.items()}
    for layer in range(2):
        new[f"h.{layer}.attn.bias"] = torch.tril(torch.ones(1, 1, 64, 64))
        new[f"h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(new, os.path.join(dirs["gpt2_noprefix"], "model.safetensors"), metadata={"format": "pt"})
    # Mistral: the Llama layout with a sliding window (longer than the run's sequences here)
    mc = MistralConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=1, max_position_embeddings=64, sliding_window=32, initializer_range=0.1)
    dirs["mistral"] = os.path.join(TMP, "mistral")
    MistralForCausalLM(mc).float().save_pretrained(dirs["mistral"], safe_serialization=True)
    # tokenizer files travel with an export
    for name, text in (("tokenizer.json", '{"version": "1.0", "model": {"type": "BPE"}}'),
                       ("tokenizer_config.json", '{"model_max_length": 64}')):
        with open(os.path.join(dirs["llama_fp32"], name), "w") as f:
            f.write(text)
    return dirs


def hf_load(d):
    kind = json.load(open(os.path.join(d, "config.json")))["model_type"]
    cls = {"gpt2": GPT2LMHeadModel, "mistral": MistralForCausalLM}.get(kind, LlamaForCausalLM)
    model = cls.from_pretrained(d, torch_dtype=torch.float32).eval()
    # float64 where transformers allows it (Mistral's 4.40 mask code overflows in float64: fp32 there)
    return model if kind == "mistral" else model.double()


def hf_loss(model, x, y):
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(x)).logits
        return logits, torch.nn.functional.cross_entropy(logits.reshape(-1, V), torch.from_numpy(y).reshape(-1)).item()


def config(name, src, stage=3, steps=1, extra=None):
    cfg = {"model": {"from_pretrained": src},
           "data": {"train": DATA, "seq_len": T, "shuffle": False},
           "train": {"steps": steps, "eval_every": 0, "sample_tokens": 0, "metrics": os.path.join(TMP, name + ".jsonl")},
           "train_micro_batch_size_per_gpu": B,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0}},
           "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
    return write_config(os.path.join(TMP, name + ".json"), cfg, extra)


def train(name, N, cfg, *args):
    cmd = ["mpirun", "-np", str(N), "--oversubscribe", BIN, "train", cfg] + list(args)
    return subprocess.run(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)


def bytes_per_rank(out):
    m = re.search(r"from_pretrained \S+: (\d+) weight bytes in \d+ files? read in \S+ s; bytes read per rank: ([\d ]+)",
                  out)
    return (int(m.group(1)), [int(v) for v in m.group(2).split()]) if m else (None, None)


def check_load(dirs):
    for tag in ("llama_fp32", "llama_bf16", "gpt2", "gpt2_noprefix", "mistral"):
        ref = hf_load(dirs["gpt2" if tag == "gpt2_noprefix" else tag])
        runs = ((1, 3), (2, 3), (3, 3), (2, 0), (2, 2)) if tag in ("llama_fp32", "llama_bf16", "gpt2") else ((2, 3),)
        for N, stage in runs:
            name = f"load_{tag}_N{N}_s{stage}"
            dump = os.path.join(TMP, name + ".dump")
            r = train(name, N, config(name, dirs[tag], stage), "--dump", dump)
            if r.returncode != 0:
                check(f"load.{tag}.N{N}_s{stage}", False, f"exit {r.returncode}: {r.stderr[-400:]}")
                continue
            d = read_dump(dump)  # the first step's loss: the mean over every rank's micro-batch, windows 0..NB-1
            x = np.stack([TOKENS[k * T:k * T + T] for k in range(N * B)]).astype(np.int64)
            y = np.stack([TOKENS[k * T + 1:k * T + T + 1] for k in range(N * B)]).astype(np.int64)
            _, want = hf_loss(ref, x, y)
            check(f"load.{tag}.N{N}_s{stage}.tokens", np.array_equal(d["inputs"], x[:B].astype(np.float32)),
                  "rank 0's dumped micro-batch is not windows 0..B-1")
            got = float(d["loss"].ravel()[0])
            e = abs(got - want) / abs(want)
            check(f"load.{tag}.N{N}_s{stage}.loss", e <= 1e-5, f"{got} vs transformers {want} (rel {e:.2e})")
            total, per = bytes_per_rank(r.stdout)
            ok = total is not None and len(per) == N and sum(per) == total
            if ok and stage == 3 and N > 1:
                ok = max(per) - min(per) <= 0.2 * total / N + 4096 * 16
            check(f"load.{tag}.N{N}_s{stage}.bytes_read", ok, f"total {total}, per rank {per}")


def st_tensors(d):
    out = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        out.update(load_file(f))
    return out


def check_export(dirs):
    for tag in ("llama_fp32", "gpt2"):
        ck = os.path.join(TMP, f"ck_{tag}")
        shutil.rmtree(ck, ignore_errors=True)
        name = f"export_{tag}"
        r = train(name, 2, config(name, dirs[tag], 3, steps=3, extra={"checkpoint": {"dir": ck, "export_hf": True}}))
        if r.returncode != 0:
            check(f"export.{tag}.run", False, f"exit {r.returncode}: {r.stderr[-400:]}")
            continue
        hfdir = os.path.join(ck, "hf")
        try:
            model = hf_load(hfdir)
        except Exception as e:  # noqa: BLE001
            check(f"export.{tag}.from_pretrained", False, f"{type(e).__name__}: {e}")
            continue
        check(f"export.{tag}.from_pretrained", True)
        name2 = f"reload_{tag}"
        dump = os.path.join(TMP, name2 + ".dump")
        r = train(name2, 1, config(name2, hfdir, 3), "--dump", dump)
        if r.returncode != 0:
            check(f"export.{tag}.reload", False, r.stderr[-400:])
            continue
        d = read_dump(dump)
        logits, _ = hf_loss(model, d["inputs"].astype(np.int64), d["targets"].astype(np.int64))
        got = d["logits"][..., :V]
        e = rel(got, logits.numpy())
        check(f"export.{tag}.logits_equal_shardlm", e <= 1e-5, f"rel {e:.2e}")
        if tag == "llama_fp32":
            same = all(open(os.path.join(dirs[tag], f)).read() == open(os.path.join(hfdir, f)).read()
                       for f in ("tokenizer.json", "tokenizer_config.json") if os.path.exists(os.path.join(hfdir, f)))
            check("export.tokenizer_files_copied", same and os.path.exists(os.path.join(hfdir, "tokenizer.json")),
                  f"{sorted(os.listdir(hfdir))}")
        # shardlm export under mpirun, files capped small: the same tensors as one rank
        outs = {}
        for N in (1, 2):
            out = os.path.join(TMP, f"exp_{tag}_N{N}")
            shutil.rmtree(out, ignore_errors=True)
            r = subprocess.run(["mpirun", "-np", str(N), "--oversubscribe", BIN, "export", ck, out, "--dtype", "bf16",
                                "--max-shard-size", "30KB"], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, timeout=120)
            outs[N] = st_tensors(out) if r.returncode == 0 else None
            check(f"export.{tag}.cli_N{N}", r.returncode == 0 and os.path.exists(os.path.join(out, "config.json")),
                  r.stderr[-300:])
        if outs[1] and outs[2]:
            same = outs[1].keys() == outs[2].keys() and all(torch.equal(outs[1][k], outs[2][k]) for k in outs[1])
            files = len(glob.glob(os.path.join(TMP, f"exp_{tag}_N2", "*.safetensors")))
            index = os.path.exists(os.path.join(TMP, f"exp_{tag}_N2", "model.safetensors.index.json"))
            check(f"export.{tag}.cli_N2_equals_N1", same and (files > 1) == index, f"{files} files, index {index}")


def check_roundtrip(dirs):
    # bf16 files into a bf16 run take the path without conversion (straight into the parameters, the master
    # widened from them), also with an emulated device holding the parameters (and the master, or not: offload)
    offload = {"offload_optimizer": {"device": "cpu"}}
    for tag, dt, stage, where in (("llama_fp32", None, 3, ""), ("llama_bf16", "bf16", 3, ""), ("gpt2", None, 3, ""),
                                  ("llama_fp32", None, 0, ""), ("llama_bf16", "bf16", 2, ""),
                                  ("llama_bf16", "bf16", 3, "_device"),
                                  ("llama_bf16", "bf16", 2, "_device_offload")):
        name = f"rt_{tag}_s{stage}{where}"
        ck = os.path.join(TMP, name)
        shutil.rmtree(ck, ignore_errors=True)
        extra = {"checkpoint": {"dir": ck, "export_hf": True},
                 "optimizer": {"type": "AdamW", "params": {"lr": 0.0, "weight_decay": 0.0}}}
        if dt:
            extra[dt] = {"enabled": True}
        if "offload" in where:
            extra["zero_optimization"] = dict(offload, stage=stage)
        env = dict(ENV, SHARDLM_EMULATE_DEVICE="1") if where else ENV
        r = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", BIN, "train", config(name, dirs[tag], stage, extra=extra)],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
        if r.returncode != 0:
            check(f"roundtrip.{name[3:]}", False, r.stderr[-400:])
            continue
        a, b = st_tensors(dirs[tag]), st_tensors(os.path.join(ck, "hf"))
        bad = [k for k in a if k not in b or a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])]
        check(f"roundtrip.{name[3:]}.bitwise", not bad and len(a) == len(b), f"{len(bad)} differ, e.g. {bad[:3]}")


def expect_bad(name, cfg_src, words, extra=None):
    cfg = config(name, cfg_src, 3, extra=extra)
    r = train(name, 1, cfg)
    lines = [x for x in r.stderr.splitlines() if "error" in x]
    written = os.path.exists(os.path.join(TMP, name + ".jsonl"))
    ok = r.returncode == 2 and len(lines) == 1 and all(w in lines[0] for w in words) and not written
    check(f"bad.{name}", ok, f"exit {r.returncode}, lines {lines[:2]} (want one naming {words}), metrics written "
                             f"{written}")


def corrupt_copy(src, name):
    d = os.path.join(TMP, name)
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(src, d)
    return d


def rewrite_header(path, edit):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    edit(h)
    hb = json.dumps(h).encode()
    hb += b" " * (-len(hb) % 8)
    open(path, "wb").write(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])


def check_bad(dirs):
    g = dirs["gpt2"]
    f = "model.safetensors"
    d = corrupt_copy(g, "bad_hlen")
    raw = open(os.path.join(d, f), "rb").read()
    open(os.path.join(d, f), "wb").write(struct.pack("<Q", len(raw) * 2) + raw[8:])
    expect_bad("header_past_end", d, [f])
    d = corrupt_copy(g, "bad_trunc")
    raw = open(os.path.join(d, f), "rb").read()
    open(os.path.join(d, f), "wb").write(raw[:len(raw) - 100])
    expect_bad("truncated", d, [f])

    def overlap(h):
        names = sorted(k for k in h if k != "__metadata__")
        h[names[1]]["data_offsets"] = h[names[0]]["data_offsets"]
    d = corrupt_copy(g, "bad_overlap")
    rewrite_header(os.path.join(d, f), overlap)
    expect_bad("overlapping", d, [f])
    for dtype in ("I8", "F8_E4M3"):
        def to_dtype(h, dtype=dtype):
            k = "transformer.h.0.ln_1.weight"
            e = h[k]
            e["dtype"] = dtype
            e["shape"] = [e["shape"][0] * 4]
        d = corrupt_copy(g, f"bad_{dtype}")
        rewrite_header(os.path.join(d, f), to_dtype)
        expect_bad(f"dtype_{dtype}", d, [f, dtype])

    def drop(h):
        del h["transformer.h.1.mlp.c_fc.bias"]
    d = corrupt_copy(g, "bad_missing")
    rewrite_header(os.path.join(d, f), drop)
    expect_bad("missing_tensor", d, ["h.1.mlp.c_fc.bias"])
    d = corrupt_copy(dirs["llama_fp32"], "bad_shape")
    cfgp = os.path.join(d, "config.json")
    c = json.load(open(cfgp))
    c["intermediate_size"] = 64
    json.dump(c, open(cfgp, "w"))
    expect_bad("shape_vs_config", d, ["mlp", "config.json"])
    d = corrupt_copy(dirs["llama_fp32"], "bad_index")
    os.remove(sorted(glob.glob(os.path.join(d, "model-*.safetensors")))[-1])
    expect_bad("index_missing_file", d, ["model-"])
    d = corrupt_copy(g, "bad_arch")
    c = json.load(open(os.path.join(d, "config.json")))
    c["architectures"] = ["BertForMaskedLM"]
    json.dump(c, open(os.path.join(d, "config.json"), "w"))
    expect_bad("unknown_architecture", d, ["BertForMaskedLM", "LlamaForCausalLM"])
    expect_bad("contradicting_key", g, ["model.n_layer", "config.json"], extra={"model": {"n_layer": 5}})
    check_eval_window(dirs["mistral"])
    # an export into a directory that holds another model
    ck = os.path.join(TMP, "ck_llama_fp32")
    out = os.path.join(TMP, "bad_export_dir")
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(dirs["gpt2"], out)
    before = sorted(os.listdir(out))
    r = subprocess.run([BIN, "export", ck, out], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=120)
    lines = [x for x in r.stderr.splitlines() if "error" in x]
    check("bad.export_into_other_model", r.returncode == 2 and len(lines) == 1 and "another model" in lines[0]
          and sorted(os.listdir(out)) == before, f"exit {r.returncode}: {lines}")


def check_eval_window(mistral):
    """eval of a Mistral directory (sliding_window 32, 64 positions): --seq-len 48 evaluates past the window (the
    window is implemented: tests/t_qwen.py checks it against transformers 5), and --seq-len 80, past the 64
    positions, is refused naming --seq-len and the model's context, not data.seq_len"""
    def evaluate(*args):
        return subprocess.run([BIN, "eval", mistral, "--data", DATA] + list(args), env=ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    r = evaluate("--seq-len", "48", "--max-batches", "2")
    check("eval_window.seq_len_48", r.returncode == 0 and "loss" in r.stdout + r.stderr,
          f"exit {r.returncode}: {r.stderr.strip()[-300:]}")
    r = evaluate("--seq-len", "80")
    lines = [x for x in r.stderr.splitlines() if "error" in x]
    check("eval_window.seq_len_80_refused", r.returncode == 2 and len(lines) == 1 and "--seq-len 80" in lines[0]
          and "64 positions" in lines[0] and "data.seq_len" not in lines[0], f"exit {r.returncode}: {lines}")


def peak_kib(out):
    m = re.search(r"peak host memory per rank after the parameters' init \(KiB\): ([\d ]+)", out)
    return [int(v) for v in m.group(1).split()] if m else None


def check_memory():
    """A 33.6 M-parameter Llama (67 MB of bf16 files in 4) imported by 4 ranks at stage 3: every rank's peak
    resident memory after the init exceeds that of the same run from the seeded init (which holds the same shard)
    by at most 24 MiB, the bounded buffer (one file's rawio bounce buffers, 16 MiB, and a 4 MiB conversion
    buffer), whatever the model's size; materialising the model would add 67 MB."""
    lc = LlamaConfig(vocab_size=8000, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                     num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=64)
    d = os.path.join(TMP, "llama_mem")
    LlamaForCausalLM(lc).to(torch.bfloat16).save_pretrained(d, max_shard_size="20MB", safe_serialization=True)
    size = sum(os.path.getsize(f) for f in glob.glob(os.path.join(d, "*.safetensors")))
    model = {"type": "llama", "n_layer": 8, "n_head": 8, "n_kv_head": 8, "n_embd": 512, "ffn_dim": 1376,
             "n_positions": 64, "vocab_size": 8000, "rms_norm_eps": 1e-6}
    peaks = {}
    for tag, m in (("import", {"from_pretrained": d}), ("seeded", model)):
        cfg = config(f"mem_{tag}", d, 3, extra={"bf16": {"enabled": True}})
        c = json.load(open(cfg))
        c["model"] = m
        json.dump(c, open(cfg, "w"))
        r = subprocess.run(["mpirun", "-np", "4", "--oversubscribe", memory_binary(), "train", cfg], env=ENV,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
        peaks[tag] = peak_kib(r.stdout) if r.returncode == 0 else None
        if r.returncode != 0:
            check(f"memory.{tag}.run", False, r.stderr[-300:])
    a, b = peaks.get("import"), peaks.get("seeded")
    extra = [x - y for x, y in zip(a, b)] if a and b and len(a) == len(b) == 4 else None
    check("memory.import_adds_only_the_buffer", extra is not None and max(extra) <= 24 * 1024 and
          max(extra) * 1024 < size / 2, f"extra KiB per rank {extra} (file {size} bytes, peaks {a} vs {b})")
    note(f"memory: import peak per rank {a} KiB, seeded {b} KiB, file {size / 1e6:.1f} MB")


def main():
    dirs = hf_dirs()
    check_memory()
    note(f"llama_fp32 files: {sorted(os.listdir(dirs['llama_fp32']))}")
    check_load(dirs)
    check_export(dirs)
    check_roundtrip(dirs)
    check_bad(dirs)


main()
sys.exit(1 if failures() else 0)
