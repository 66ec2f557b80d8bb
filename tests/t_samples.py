#!/usr/bin/env python3
"""Sample files in the trainer (issue 18): dynamic padding, packing and the
exact loss normalisation, on GPT-2 and Llama (CPU backend, fp32).

  targets.*     the first micro-batch's inputs and targets (--dump) are the
                file's samples: targets are the next tokens where they are
                trained, -1 elsewhere and on padding; the loss is the mean of
                the dumped logits' cross-entropy over the trained targets
  padding.*     a padded micro-batch of 4 samples gives the loss and every
                gradient of the same samples one per micro-batch, unpadded
                (<= 1e-6 relative)
  packing.*     rows packed with several samples (positions restarting,
                attention within each) give the loss and gradients of the
                same samples one by one
  accum.*       1 x 8, 4 x 2 and 8 x 1 (micro-batch x accumulation) at N = 1,
                and N = 2 and 4, on lengths from 3 to 500: the same step
  validation.*  data.val on a sample file: its loss over the step's samples
                with lr 0 equals the step's loss
  memory.*      the measured peak within the plan for data.seq_len, on data
                whose longest sample is exactly data.seq_len
  truncation.*  truncate / drop counts in the metrics
  resume.*      bitwise at the same world size, within 1e-6 at another
  bad.*         token id outside the vocabulary, another tokenizer's
                vocabulary, a truncated file, not a sample file, and the data
                keys' errors: one line, exit 2
"""
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BIN, ENV, check, failures, read_dump, rel, scratch_dir, write_config, write_shard  # noqa: E402

import datafiles  # noqa: E402  (tools/, on the path through harness)

TMP = scratch_dir("samples")
V = 256


def write_samples(path, samples, vocab=V):
    """samples: list of (tokens, trained) arrays."""
    off = np.cumsum([0] + [len(t) for t, _ in samples])
    return datafiles.write_samples(path, np.concatenate([t for t, _ in samples]), np.concatenate([m for _, m in samples]),
                            off, vocab)


def make(lengths, seed):
    rng = np.random.default_rng(seed)
    out = []
    for L in lengths:
        t = rng.integers(0, V, size=L)
        m = np.zeros(L, np.uint8)
        m[rng.integers(1, L):] = 1  # a prompt, then the trained completion
        out.append((t, m))
    return out


MODELS = {
    "gpt2": {"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": V, "n_positions": 512},
    "llama": {"type": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 32, "ffn_dim": 48,
              "vocab_size": V, "n_positions": 512, "tie_word_embeddings": False},
}


def config(name, model, data, max_len, micro, accum, steps=1, extra=None):
    cfg = {"model": MODELS[model],
           "data": {"train": data, "max_seq_length": max_len, "shuffle": False},
           "train": {"steps": steps, "eval_every": 0, "sample_tokens": 0,
                     "metrics": os.path.join(TMP, name + ".jsonl")},
           "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": accum,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0}},
           "zero_optimization": {"stage": 3}}
    return write_config(os.path.join(TMP, name + ".json"), cfg, extra)


def train(N, cfg, *args, timeout=300, env=None):
    cmd = ["mpirun", "-np", str(N), "--oversubscribe", BIN, "train", cfg] + list(args)
    return subprocess.run(cmd, env=env or ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)


def first_step(name, N, cfg, env=None):
    """The first step's dump (weights, grads, first micro-batch), or None after a FAIL line."""
    path = os.path.join(TMP, name + ".dump")
    r = train(N, cfg, "--dump", path, env=env)
    if r.returncode != 0:
        check(f"{name}.runs", False, r.stderr.strip()[-400:])
        return None
    return read_dump(path)


def same_step(tag, a, b, tol=1e-6):
    if a is None or b is None:
        return
    e_loss = abs(float(a["loss"][0]) - float(b["loss"][0])) / abs(float(b["loss"][0]))
    grads = [k for k in b if k.startswith("grad.")]
    worst = max((rel(a[k], b[k]), k) for k in grads)
    check(f"{tag}.loss", e_loss <= tol, f"{a['loss'][0]} vs {b['loss'][0]} (rel {e_loss:.2e})")
    check(f"{tag}.grads", worst[0] <= tol and len(grads) > 4, f"worst {worst[1]} rel {worst[0]:.2e}")


def metrics(name):
    with open(os.path.join(TMP, name + ".jsonl")) as f:
        return [json.loads(x) for x in f if x.strip()]


def check_targets(model):
    smp = make([5, 17, 9, 12], 1)
    data = write_samples(os.path.join(TMP, f"tg_{model}.h5"), smp)
    d = first_step(f"targets.{model}", 1, config(f"tg_{model}", model, data, 64, 4, 1,
                                                  extra={"data": {"pad_to_multiple_of": 8}}))
    if d is None:
        return
    x, y = d["inputs"].astype(np.int64), d["targets"].astype(np.int64)
    check(f"targets.{model}.row_length", x.shape == (4, 24), f"{x.shape} (longest 17 rounded up to 8: 24)")
    ok = True
    for b, (t, m) in enumerate(smp):
        L = len(t)
        want = np.full(x.shape[1], -1)
        want[:L - 1] = np.where(m[1:] == 1, t[1:], -1)
        ok &= np.array_equal(x[b, :L], t) and np.array_equal(y[b], want)
    check(f"targets.{model}.samples", ok, "inputs / targets differ from the file's samples and trained flags")
    logits = d["logits"][:, :, :V].astype(np.float64)
    lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    mask = y >= 0
    ce = (lse - np.take_along_axis(logits, np.where(mask, y, 0)[..., None], -1)[..., 0])[mask]
    want = ce.mean()
    got = float(d["loss"][0])
    check(f"targets.{model}.loss_mean_over_trained", abs(got - want) / want <= 1e-5,
          f"{got} vs {want} over {mask.sum()} trained targets")


def check_padding_packing(model):
    lens = [30, 20, 10, 40, 25, 15, 50, 8]
    smp = make(lens, 2)
    data = write_samples(os.path.join(TMP, f"pp_{model}.h5"), smp)
    one = {"data": {"pad_to_multiple_of": 1}}
    alone = first_step(f"padding.{model}.alone", 1, config(f"pa_{model}", model, data, 64, 1, 8, extra=one))
    padded = first_step(f"padding.{model}.padded", 1, config(f"pp_{model}", model, data, 64, 4, 2))
    same_step(f"padding.{model}", padded, alone)
    # first fit over rows of 64: [30 20 10] [40 15 8] [25] [50] -> 4 rows, the whole file in one step
    packed = first_step(f"packing.{model}.packed", 1,
                        config(f"pk_{model}", model, data, 64, 2, 2, extra={"data": {"packing": True}}))
    same_step(f"packing.{model}", packed, alone)
    # an emulated device: the positions and targets uploaded with the tokens
    dev = first_step(f"packing.{model}.device", 1,
                     config(f"pkd_{model}", model, data, 64, 2, 2, extra={"data": {"packing": True}}),
                     env=dict(ENV, SHARDLM_EMULATE_DEVICE="1"))
    same_step(f"packing.{model}.device", dev, alone)
    if packed is not None:
        rec = [r for r in metrics(f"pk_{model}") if "step" in r and "loss" in r]
        check(f"packing.{model}.one_step_all_samples", rec and rec[0]["real_tokens"] == sum(lens) and
              rec[0]["trained_tokens"] == sum(int(m[1:].sum()) for _, m in smp), f"{rec[:1]}")


def check_accumulation(model):
    rng = np.random.default_rng(3)
    lens = [3, 500, 17, 250, 64, 5, 333, 120]
    data = write_samples(os.path.join(TMP, f"acc_{model}.h5"), make(lens, 4))
    ref = first_step(f"accum.{model}.1x8", 1, config(f"a18_{model}", model, data, 512, 1, 8))
    for micro, accum, N in ((4, 2, 1), (8, 1, 1), (2, 2, 2), (1, 2, 4), (2, 1, 4)):
        tag = f"accum.{model}.{micro}x{accum}_N{N}"
        d = first_step(tag, N, config(f"a{micro}{accum}{N}_{model}", model, data, 512, micro, accum))
        same_step(tag, d, ref, 1e-5)  # other summation orders of the fp32 gradients
    del rng


def check_validation():
    """data.val on a sample file: with lr 0 the validation loss over the first step's samples is that step's loss."""
    data = write_samples(os.path.join(TMP, "val.h5"), make([9, 30, 4, 17, 25, 11, 6, 40], 10))
    name = "val"
    cfg = config(name, "llama", data, 64, 2, 2, extra={
        "data": {"val": data}, "train": {"eval_every": 1, "eval_batches": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.0, "weight_decay": 0.0}}})
    r = train(2, cfg)
    rows = metrics(name) if r.returncode == 0 else []
    loss = [x["loss"] for x in rows if "loss" in x]
    val = [x["val_loss"] for x in rows if "val_loss" in x]
    check("validation.equals_step_loss", loss and val and abs(val[0] - loss[0]) <= 1e-6 * abs(loss[0]),
          f"val {val} step {loss} {r.stderr[-300:]}")


def check_memory():
    lens = [256, 7, 100, 31]
    data = write_samples(os.path.join(TMP, "mem.h5"), make(lens, 5))
    for model in ("gpt2", "llama"):
        name = f"mem_{model}"
        r = train(2, config(name, model, data, 256, 2, 1, steps=2))
        if r.returncode != 0:
            check(f"memory.{model}", False, r.stderr[-300:])
            continue
        mem = [x["memory"] for x in metrics(name) if "memory" in x][-1]
        over = {k: v for k, v in mem.items() if v["peak"] > v["planned"]}
        check(f"memory.{model}.peak_within_plan", not over and any(v["peak"] > 0 for v in mem.values()), f"{over}")


def check_truncation():
    lens = [10, 80, 20, 100]
    data = write_samples(os.path.join(TMP, "trunc.h5"), make(lens, 6))
    for mode, kept, trunc, dropped in (("truncate", 4, 2, 0), ("drop", 2, 0, 2)):
        name = f"tr_{mode}"
        r = train(1, config(name, "gpt2", data, 64, 1, 1, extra={"data": {"truncation": mode}}))
        rec = [x for x in metrics(name) if "data" in x] if r.returncode == 0 else []
        ok = rec and rec[0]["samples"] + rec[0]["dropped_untrained"] == kept and rec[0]["truncated"] == trunc and \
            rec[0]["dropped_longer"] == dropped
        check(f"truncation.{mode}", bool(ok), f"{rec[:1]} {r.stderr[-300:]}")


def check_resume():
    data = write_samples(os.path.join(TMP, "res.h5"), make([5, 40, 12, 33, 7, 60, 21, 9, 14, 50], 7))
    ck = os.path.join(TMP, "res_ck")
    straight = os.path.join(TMP, "res_straight.dump")
    cfg4 = config("res4", "llama", data, 64, 2, 1, steps=4, extra={"data": {"shuffle": True, "group_by_length": True}})
    r = train(2, cfg4, "--dump-final", straight)
    cfg2 = config("res2", "llama", data, 64, 2, 1, steps=2,
                  extra={"data": {"shuffle": True, "group_by_length": True}, "checkpoint": {"dir": ck, "every": 2}})
    r2 = train(2, cfg2)
    resumed, other = os.path.join(TMP, "res_resumed.dump"), os.path.join(TMP, "res_other.dump")
    cfg_rest = config("res_rest", "llama", data, 64, 2, 1, steps=4,
                      extra={"data": {"shuffle": True, "group_by_length": True}, "checkpoint": {"dir": ck}})
    r3 = train(2, cfg_rest, "--resume", "auto", "--dump-final", resumed)
    cfg_one = config("res_one", "llama", data, 64, 4, 1, steps=4,
                     extra={"data": {"shuffle": True, "group_by_length": True}, "checkpoint": {"dir": ck}})
    r4 = train(1, cfg_one, "--resume", os.path.join(ck, "step_000002.h5"), "--dump-final", other)
    if any(x.returncode != 0 for x in (r, r2, r3, r4)):
        check("resume.runs", False, " | ".join(x.stderr[-200:] for x in (r, r2, r3, r4)))
        return
    a, b, c = read_dump(straight), read_dump(resumed), read_dump(other)
    check("resume.same_world_bitwise", all(np.array_equal(a[k], b[k]) for k in a), "")
    worst = max(rel(c[k], a[k]) for k in a)
    check("resume.other_world", worst <= 1e-6, f"worst rel {worst:.2e}")


def expect_bad(tag, data, words, model_vocab=V, data_extra=None):
    cfg = config(f"bad_{tag}", "gpt2", data, 64, 1, 1)
    with open(cfg) as f:
        c = json.load(f)
    c["model"] = dict(c["model"], vocab_size=model_vocab)
    c["data"].update(data_extra or {})
    with open(cfg, "w") as f:
        json.dump(c, f)
    r = train(1, cfg)
    lines = [x for x in r.stderr.splitlines() if "error" in x]
    check(f"bad.{tag}", r.returncode == 2 and len(lines) == 1 and all(w in lines[0] for w in words),
          f"exit {r.returncode}: {r.stderr.strip()[-300:]}")


def check_bad():
    good = make([10, 12, 9], 8)
    # the file claims a vocabulary the model has, but holds ids beyond it
    expect_bad("token_outside_vocab", write_samples(os.path.join(TMP, "bad_tok.h5"), good, vocab=128),
               ["token id", "vocabulary", "bad_tok.h5"], model_vocab=128)
    expect_bad("other_tokenizer", write_samples(os.path.join(TMP, "bad_vocab.h5"), good, vocab=512),
               ["another tokenizer", "512"])
    path = write_samples(os.path.join(TMP, "bad_trunc.h5"), make([400] * 40, 9))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    expect_bad("truncated", path, ["bad_trunc.h5", "truncated"])
    junk = os.path.join(TMP, "bad_junk.h5")
    with open(junk, "w") as f:
        f.write("not hdf5\n")
    expect_bad("not_hdf5", junk, ["bad_junk.h5"])
    ok = write_samples(os.path.join(TMP, "ok.h5"), good)
    shard = os.path.join(TMP, "tokens.bin")
    write_shard(shard, np.arange(200) % V)
    expect_bad("config_truncation", ok, ["data.truncation", "cut"], data_extra={"truncation": "left"})
    expect_bad("config_packing_bin", shard, ["data.packing", "sample file"], data_extra={"packing": True})
    expect_bad("config_val_kind", ok, ["data.val", "both"], data_extra={"val": shard})
    expect_bad("config_two_lengths", ok, ["max_seq_length", "seq_len"], data_extra={"seq_len": 32})


def main():
    for model in ("gpt2", "llama"):
        check_targets(model)
        check_padding_packing(model)
        check_accumulation(model)
    check_validation()
    check_memory()
    check_truncation()
    check_resume()
    check_bad()
    sys.exit(1 if failures() else 0)


if __name__ == "__main__":
    main()
