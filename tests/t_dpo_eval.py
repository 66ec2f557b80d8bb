#!/usr/bin/env python3
"""t_dpo_eval — `shardlm eval` on a preference file (DPO, issue 37): the reward
accuracy, margins and the rest of TRL's metrics and the DPO loss of a model
against its reference, checked against transformers 4.40's LlamaForCausalLM
(float64) with TRL's formulas (summed log-probs of the trained tokens;
rewards = beta (policy - reference); accuracy counts chosen > rejected
strictly). Runs under build/ref-venv (PEFT for the LoRA case).

The test makes a tiny Llama (the reference, "base"), a policy (the base with
every weight perturbed) and a preference file of random pairs (h5py, the
layout of tools/prefdata.py: chosen = sample 2i, rejected = 2i + 1, prompt
untrained, completion trained).

Checks:
  full.*     policy vs --ref base (mpirun -np 2): accuracy exactly the
             reference's, margin / loss / rewards / logps within 2e-4
  file.*     the same with --ref-log-probs (a reference log-prob file written
             here from the torch values): the same figures
  ipo.*      --set dpo.loss_type=ipo dpo.beta=0.5: IPO's loss on mean log-probs
  equal.*    the base against itself: margins 0, accuracy 0, loss ln 2
  lora.*     a LoRA checkpoint (lora.init false: B nonzero) against its base
             with the adapters off, vs PEFT over the exported adapters;
             lora0.*: lora.init true (B = 0): policy = reference, margins 0
  recorded.* a DPO full fine-tune's checkpoint: eval without flags reads the
             reference file it records (dpo_ref_path) and equals --ref base;
             dpo_lora.*: a DPO LoRA checkpoint's adapters-off reference too
  bad.*      exit 2, one line: an SFT sample file with --preferences, no
             reference for a whole model, a reference file of another
             preference file, --ref with a non-preference file, token shards
             with --preferences; the reader's checks (data/samples.c):
             another tokenizer, another version, a token outside the
             vocabulary, a truncated file
  max_batches.*  --max-batches 2 at --batch 2 on 2 ranks: the first 4 pairs
  seq_len_*  a version-2 reference file's seq_len: eval cuts there by default
             (torch on cut samples), any length that cuts nothing is taken,
             bad.ref_seq_len: a --seq-len that cuts otherwise is refused
"""
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import use_ref_venv  # noqa: E402

use_ref_venv("peft", "dpo_eval.env")

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from peft import PeftModel  # noqa: E402
from tokenizers import Tokenizer, models  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from harness import BIN, ENV, check, note, run_main, scratch_dir, write_config, write_shard  # noqa: E402

TMP = scratch_dir("t_dpo_eval")
torch.manual_seed(11)
torch.set_num_threads(1)
V, N_PAIRS, TOL = 100, 6, 2e-4
POLICY_DIR = None  # main sets it
RNG = np.random.default_rng(3)


def make_models():
    lc = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, initializer_range=0.1,
                     tie_word_embeddings=False)
    base = LlamaForCausalLM(lc).float()
    base_dir = os.path.join(TMP, "base")
    base.save_pretrained(base_dir, safe_serialization=True)
    policy = LlamaForCausalLM(lc).float()
    policy.load_state_dict(base.state_dict())
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    policy_dir = os.path.join(TMP, "policy")
    policy.save_pretrained(policy_dir, safe_serialization=True)
    return base.double().eval(), base_dir, policy.double().eval(), policy_dir


def make_pairs(path):
    """Random pairs in prefdata's layout; returns [(tokens, trained)] in file order."""
    samples = []
    for _ in range(N_PAIRS):
        prompt = list(RNG.integers(0, V, int(RNG.integers(2, 8))))
        for _ in range(2):
            comp = list(RNG.integers(0, V, int(RNG.integers(2, 10))))
            samples.append((np.array(prompt + comp, np.int32), np.array([0] * len(prompt) + [1] * len(comp), np.uint8)))
    with h5py.File(path, "w") as f:
        f.create_dataset("tokens", data=np.concatenate([s[0] for s in samples]))
        f.create_dataset("trained", data=np.concatenate([s[1] for s in samples]))
        f.create_dataset("offsets", data=np.cumsum([0] + [len(s[0]) for s in samples]).astype(np.int64))
        f.create_dataset("prompt_lengths", data=np.array([int((samples[2 * i][1] == 0).sum()) for i in range(N_PAIRS)],
                                                         np.int64))
        f.attrs["format"] = np.bytes_("shardlm-preferences")
        f.attrs["version"] = np.int64(1)
        f.attrs["vocab_size"] = np.int64(V)
        f.attrs["n_pairs"] = np.int64(N_PAIRS)
    return samples


def seq_logps(model, samples):
    """Each sample's summed log-prob of its trained tokens and their count (float64)."""
    out = []
    with torch.no_grad():
        for toks, tr in samples:
            logits = model(torch.tensor(toks[None].astype(np.int64))).logits[0].double()
            lp = torch.log_softmax(logits, -1)
            idx = [t for t in range(1, len(toks)) if tr[t]]
            out.append((sum(float(lp[t - 1, toks[t]]) for t in idx), len(idx)))
    return out


def trl_metrics(pol, ref, beta=0.1, loss_type="sigmoid", n_pairs=N_PAIRS):
    """TRL DPOTrainer's dpo_loss and metrics (means over the first n_pairs pairs)."""
    rows = []
    for i in range(n_pairs):
        pc, pr, rc, rr = [x[0] / (x[1] if loss_type == "ipo" else 1)
                          for x in (pol[2 * i], pol[2 * i + 1], ref[2 * i], ref[2 * i + 1])]
        z = (pc - pr) - (rc - rr)
        loss = (z - 1 / (2 * beta)) ** 2 if loss_type == "ipo" else -math.log(1 / (1 + math.exp(-beta * z)))
        ch, rj = beta * (pc - rc), beta * (pr - rr)
        rows.append({"loss": loss, "rewards/chosen": ch, "rewards/rejected": rj, "rewards/accuracies": float(ch > rj),
                     "rewards/margins": ch - rj, "logps/chosen": pc, "logps/rejected": pr})
    return {k: sum(r[k] for r in rows) / n_pairs for k in rows[0]}


def run(args, N=1):
    cmd = (["mpirun", "-np", str(N), "--oversubscribe"] if N > 1 else []) + [BIN] + args
    return subprocess.run(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)


def eval_json(name, args, N=1):
    r = run(["eval"] + args + ["--json"], N)
    check(f"{name}.run", r.returncode == 0, f"exit {r.returncode}: {r.stderr[-600:]}")
    if r.returncode:
        return None
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    check(f"{name}.one_json_line", len(lines) == 1, r.stdout)
    return json.loads(lines[0]) if lines else None


def compare(name, got, want, exact_acc=True, n_pairs=N_PAIRS):
    if got is None:
        return
    keys = ["loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
            "logps/rejected"]
    note(f"{name}: shardlm {json.dumps({k: got.get(k) for k in keys})}")
    note(f"{name}: torch   {json.dumps(want)}")
    check(f"{name}.accuracy", got["rewards/accuracies"] == want["rewards/accuracies"],
          f"{got['rewards/accuracies']} vs {want['rewards/accuracies']}")
    bad = [k for k in keys if abs(got[k] - want[k]) > TOL * max(1.0, abs(want[k]))]
    check(f"{name}.metrics", not bad, f"differ: {bad}")
    check(f"{name}.pairs", got["pairs"] == n_pairs, str(got["pairs"]))


def write_ref_file(path, samples_path, ref, seq_len=None):
    """A reference log-prob file: version 1 (no seq_len, as issue 37 wrote them: still read), or 2 at seq_len."""
    with h5py.File(path, "w") as f:
        f.attrs["format"] = np.bytes_("shardlm-ref-logps")
        f.attrs["version"] = np.int64(1 if seq_len is None else 2)
        if seq_len is not None:
            f.attrs["seq_len"] = np.int64(seq_len)
        f.attrs["samples_path"] = np.bytes_(os.path.abspath(samples_path))
        f.attrs["samples_sha256"] = np.bytes_(hashlib.sha256(open(samples_path, "rb").read()).hexdigest())
        f.attrs["model"] = np.bytes_("torch")
        f.create_dataset("logps", data=np.array([x[0] for x in ref], np.float64))
        f.create_dataset("n_targets", data=np.array([x[1] for x in ref], np.int64))


BAD = []  # expect_bad's cases, run side by side at the end (each process mostly waits on MPI's start)


def expect_bad(name, args, words):
    BAD.append((name, args, words))


def finish_bad():
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda case: run(["eval"] + case[1]), BAD))
    for (name, _, words), r in zip(BAD, results):
        check_bad(name, r, words)


def check_bad(name, r, words):
    err = r.stderr.strip()
    check(f"{name}.exit_2", r.returncode == 2, f"exit {r.returncode}: {err[-300:]}")
    # one error and no warning (the log's notes, such as a default taken for a key config.json lacks, are not
    # messages of shardlm's: they carry no "shardlm:" prefix)
    said = [line for line in err.splitlines() if line.startswith("shardlm:")]
    check(f"{name}.one_line", len(said) == 1 and said[0].startswith("shardlm: error:"), err)
    check(f"{name}.says", all(w in err for w in words), f"want {words}: {err}")


def lora_case(base, base_dir, pref, samples, ref):
    data = os.path.join(TMP, "train.bin")
    write_shard(data, RNG.integers(0, V, 20 * 16 + 1))
    for name, init in (("lora", False), ("lora0", True)):
        ck = os.path.join(TMP, name + "_ck")
        shutil.rmtree(ck, ignore_errors=True)
        cfg = {"model": {"from_pretrained": base_dir}, "data": {"train": data, "seq_len": 16, "shuffle": False},
               "train": {"steps": 1, "eval_every": 0, "sample_tokens": 0}, "train_micro_batch_size_per_gpu": 2,
               "optimizer": {"type": "AdamW", "params": {"lr": 0.0, "weight_decay": 0.0}},
               "checkpoint": {"dir": ck, "export_hf": True},
               "lora": {"r": 4, "alpha": 8, "init": init, "target_modules": "all-linear"}}
        r = run(["train", write_config(os.path.join(TMP, name + ".json"), cfg)])
        check(f"{name}.train", r.returncode == 0, f"exit {r.returncode}: {r.stderr[-600:]}")
        if r.returncode:
            continue
        got = eval_json(name, [ck, "--data", pref])
        if got is None:
            continue
        check(f"{name}.reference_is_base", "adapters off" in got["reference"], got["reference"])
        if init:
            check(f"{name}.margins_zero", got["rewards/margins"] == 0.0 and got["rewards/chosen"] == 0.0,
                  f"margins {got['rewards/margins']}, rewards/chosen {got['rewards/chosen']}")
            check(f"{name}.accuracy_zero", got["rewards/accuracies"] == 0.0, str(got["rewards/accuracies"]))
            check(f"{name}.loss_ln2", abs(got["loss"] - math.log(2)) < 1e-12, repr(got["loss"]))
            continue
        peft = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(base_dir).double(),
                                         os.path.join(ck, "hf")).double().eval()
        compare(name, got, trl_metrics(seq_logps(peft, samples), ref))


def trained_case(base_dir, pref):
    """A DPO run's checkpoints (the trainer): a full fine-tune's eval without flags reads the reference file the
    checkpoint records; a LoRA run's eval compares with its base, adapters off; both equal --ref base."""
    for name, lora in (("recorded", None), ("dpo_lora", {"r": 4, "alpha": 8, "target_modules": "all-linear"})):
        ck = os.path.join(TMP, name + "_ck")
        shutil.rmtree(ck, ignore_errors=True)
        cfg = {"model": {"from_pretrained": base_dir}, "data": {"train": pref, "seq_len": 32, "shuffle": False},
               "train": {"steps": 2, "eval_every": 0, "sample_tokens": 0}, "train_micro_batch_size_per_gpu": 2,
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
               "checkpoint": {"dir": ck}, "dpo": {"beta": 0.1}}
        if lora is None:  # beside the test's own file at the default path
            cfg["dpo"]["ref_log_probs_path"] = os.path.join(TMP, name + ".ref-logps.h5")
            if os.path.exists(cfg["dpo"]["ref_log_probs_path"]):
                os.remove(cfg["dpo"]["ref_log_probs_path"])
        if lora:
            cfg["lora"] = lora
        r = run(["train", write_config(os.path.join(TMP, name + ".json"), cfg)])
        check(f"{name}.train", r.returncode == 0, f"exit {r.returncode}: {r.stderr[-600:]}")
        if r.returncode:
            continue
        got, want = eval_json(name, [ck, "--data", pref]), eval_json(name + ".ref", [ck, "--data", pref, "--ref",
                                                                                  base_dir])
        if not got or not want:
            continue
        check(f"{name}.reference", (name + ".ref-logps.h5" if lora is None else "adapters off") in got["reference"],
              got["reference"])
        bad = [k for k in ("loss", "rewards/margins", "rewards/chosen", "logps/chosen")
               if abs(got[k] - want[k]) > 1e-6 * max(1.0, abs(want[k]))]
        check(f"{name}.equals_ref_base", not bad and got["rewards/accuracies"] == want["rewards/accuracies"],
              f"differ: {bad}: {got} vs {want}")
        check(f"{name}.moved", got["rewards/margins"] != 0.0, "the run did not move the policy")


def check_max_batches(pref, ref_file, pol, ref):
    """--max-batches on pairs: N micro-batches of --batch / 2 pairs per rank, the file's first N x P x ranks
    pairs: 2 forwards of 1 pair on each of 2 ranks score pairs 0-3 (rank 0: 0 and 2, rank 1: 1 and 3)."""
    got = eval_json("max_batches", [POLICY_DIR, "--data", pref, "--ref-log-probs", ref_file, "--batch", "2",
                                    "--max-batches", "2"], N=2)
    compare("max_batches", got, trl_metrics(pol, ref, n_pairs=4), n_pairs=4)
    if got:
        check("max_batches.pairs_in_file", got["pairs_in_file"] == N_PAIRS, str(got))


def check_ref_seq_len(base, policy, pref, samples):
    """A version-2 reference file records the data.seq_len its samples were cut to: eval cuts at it by default
    (values computed by torch on samples cut to 10 tokens), takes any length when neither cuts a sample, and
    refuses --seq-len that cuts otherwise in one line naming both."""
    cut = [(t[:10], tr[:10]) for t, tr in samples]
    assert any(len(t) > 10 for t, _ in samples)
    ref10 = os.path.join(TMP, "cut10.ref-logps.h5")
    write_ref_file(ref10, pref, seq_logps(base, cut), seq_len=10)
    got = eval_json("seq_len_cut", [POLICY_DIR, "--data", pref, "--ref-log-probs", ref10])
    compare("seq_len_cut", got, trl_metrics(seq_logps(policy, cut), seq_logps(base, cut)))
    ref64 = os.path.join(TMP, "long64.ref-logps.h5")
    write_ref_file(ref64, pref, seq_logps(base, samples), seq_len=64)
    compare("seq_len_long", eval_json("seq_len_long", [POLICY_DIR, "--data", pref, "--ref-log-probs", ref64,
                                                       "--seq-len", "40"]),
            trl_metrics(seq_logps(policy, samples), seq_logps(base, samples)))
    expect_bad("bad.ref_seq_len", [POLICY_DIR, "--data", pref, "--ref-log-probs", ref64, "--seq-len", "10"],
               [ref64, "data.seq_len 64", "length is 10", "--seq-len 64"])


def check_reader(base_dir, pref):
    """The preference file is read by data/samples.c, with training's checks: another tokenizer (its recorded
    tokenizer.json checksum), another version, a truncated file, a token outside the vocabulary."""
    tok = os.path.join(TMP, "tok", "tokenizer.json")
    os.makedirs(os.path.dirname(tok), exist_ok=True)
    Tokenizer(models.BPE(vocab={chr(0x100 + i): i for i in range(V)}, merges=[])).save(tok)

    def variant(name, edit):
        path = os.path.join(TMP, name + ".h5")
        shutil.copy(pref, path)
        with h5py.File(path, "a") as f:
            edit(f)
        return path

    def tokens(f):
        t = f["tokens"][:]
        t[5] = V + 3
        f["tokens"][:] = t
    other_tok = variant("other_tok", lambda f: f.attrs.__setitem__("tokenizer_sha256", np.bytes_("ab" * 32)))
    expect_bad("bad.other_tokenizer", [POLICY_DIR, "--data", other_tok, "--ref", base_dir, "--tokenizer", tok],
               [other_tok, "another tokenizer", "data.allow_tokenizer_mismatch"])
    v2 = variant("v2", lambda f: f.attrs.__setitem__("version", np.int64(2)))
    expect_bad("bad.version", [POLICY_DIR, "--data", v2, "--ref", base_dir], [v2, "version 2"])
    oov = variant("oov", tokens)
    expect_bad("bad.token_outside_vocab", [POLICY_DIR, "--data", oov, "--ref", base_dir],
               [oov, "outside the model's vocabulary"])
    cut = os.path.join(TMP, "truncated.h5")
    with open(pref, "rb") as f, open(cut, "wb") as g:
        g.write(f.read()[:1500])
    expect_bad("bad.truncated", [POLICY_DIR, "--data", cut, "--ref", base_dir, "--preferences"],
               [cut, "truncated or damaged"])


def main():
    global POLICY_DIR
    base, base_dir, policy, policy_dir = make_models()
    POLICY_DIR = policy_dir
    pref = os.path.join(TMP, "pairs.h5")
    samples = make_pairs(pref)
    ref, pol = seq_logps(base, samples), seq_logps(policy, samples)
    margins = [0.1 * ((pol[2 * i][0] - pol[2 * i + 1][0]) - (ref[2 * i][0] - ref[2 * i + 1][0])) for i in range(N_PAIRS)]
    note(f"torch per-pair margins {margins}")
    check("fixture.margins_clear", min(abs(m) for m in margins) > 1e-3 and 0 < sum(m > 0 for m in margins) < N_PAIRS,
          f"margins {margins}: the accuracy check needs clear signs of both kinds")
    want = trl_metrics(pol, ref)

    compare("full", eval_json("full", [policy_dir, "--data", pref, "--ref", base_dir, "--batch", "2"], N=2), want)
    ref_file = os.path.join(TMP, "pairs.h5.ref-logps.h5")
    write_ref_file(ref_file, pref, ref)
    got = eval_json("file", [policy_dir, "--data", pref, "--ref-log-probs", ref_file])
    compare("file", got, want)
    if got:
        check("file.reference_named", ref_file in got["reference"], got["reference"])
    compare("ipo", eval_json("ipo", [policy_dir, "--data", pref, "--ref", base_dir, "--set", "dpo.loss_type=ipo",
                                     "--set", "dpo.beta=0.5"]), trl_metrics(pol, ref, 0.5, "ipo"))
    got = eval_json("equal", [base_dir, "--data", pref, "--ref", base_dir])
    if got:
        check("equal.margins_zero", got["rewards/margins"] == 0.0 and got["rewards/rejected"] == 0.0,
              f"{got['rewards/margins']} {got['rewards/rejected']}")
        check("equal.accuracy_zero", got["rewards/accuracies"] == 0.0, str(got["rewards/accuracies"]))
        check("equal.loss_ln2", abs(got["loss"] - math.log(2)) < 1e-12, repr(got["loss"]))
    r = run(["eval", policy_dir, "--data", pref, "--ref", base_dir])
    check("text.line", r.returncode == 0 and "rewards/accuracies" in r.stdout and "rewards/margins" in r.stdout,
          r.stdout + r.stderr[-300:])

    check_max_batches(pref, ref_file, pol, ref)
    check_ref_seq_len(base, policy, pref, samples)
    check_reader(base_dir, pref)
    lora_case(base, base_dir, pref, samples, ref)
    trained_case(base_dir, pref)

    sft = os.path.join(TMP, "sft.h5")
    with h5py.File(sft, "w") as f:
        f.attrs["format"] = np.bytes_("shardlm-samples")
        f.create_dataset("tokens", data=np.arange(4, dtype=np.int32))
    expect_bad("bad.sft_as_preferences", [policy_dir, "--data", sft, "--preferences", "--ref", base_dir],
               [sft, "not a preference file"])
    expect_bad("bad.no_reference", [policy_dir, "--data", pref], ["needs a reference", "--ref"])
    other = os.path.join(TMP, "other.h5")
    shutil.copy(pref, other)
    with h5py.File(other, "a") as f:
        f.attrs["n_truncated_pairs"] = np.int64(0)
    expect_bad("bad.ref_of_other_file", [policy_dir, "--data", other, "--ref-log-probs", ref_file],
               [ref_file, "another preference file"])
    expect_bad("bad.missing_ref_file", [policy_dir, "--data", pref, "--ref-log-probs", ref_file + ".nope"],
               ["does not exist"])
    bin_data = os.path.join(TMP, "train.bin")
    expect_bad("bad.ref_without_pairs", [policy_dir, "--data", bin_data, "--ref", base_dir], ["not one"])
    expect_bad("bad.bin_as_preferences", [policy_dir, "--data", bin_data, "--preferences", "--ref", base_dir],
               [bin_data, "not a preference file (not a sample file)"])
    finish_bad()


if __name__ == "__main__":
    run_main("t_dpo_eval", main)
