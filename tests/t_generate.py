#!/usr/bin/env python3
"""t_generate — `shardlm generate` and `shardlm eval` (issue 20) against
transformers 4.40 and PEFT 0.10.0 (build/ref-venv; this script re-executes
itself there).

The test makes everything itself: a byte-level BPE tokenizer.json trained
with `tokenizers` on the project's README, and two random models saved by
transformers with it: a Llama with grouped-query attention (untied head) and
a GPT-2, vocabulary 320 > the tokenizer's 300.

Checks:
  greedy.MODEL.N*    `generate --prompt-file` (five prompts of 1 to ~60 tokens,
                     24 new tokens, --batch 2) gives transformers'
                     generate(do_sample=False) tokens for each prompt, token
                     for token (the end-of-sequence id, when produced, ends
                     both), at N = 1, 2 (batch 2) and 3 (batch 1); the
                     completion text is tokenizers' decode of the ids
  prompt.*           `--prompt TEXT` prints the completion of the first prompt
  sample.*           sampling (temperature, top-k, top-p, seed) repeats at
                     the same seed, at N = 1 and 2, and changes with the seed
  ckpt.*             a whole-model checkpoint (3 steps at N = 2, ZeRO 3)
                     generates what transformers generates from its exported
                     Hugging Face directory, from the file and from the run's
                     checkpoint.dir
  lora.*             a LoRA checkpoint (its base found through the run's
                     from_pretrained) generates what PEFT's model generates
                     with the exported adapters; with another base (--base)
                     it is refused
  eval.*             `eval CKPT --data val.bin` equals the trainer's last
                     validation loss (rel 1e-6) at N = 1 and 2; with partial
                     last batches (13 windows) every window counts once and
                     N = 1 and 2 agree
  saved_tokenizer.*  the Llama directory with its tokenizer saved by transformers'
                     PreTrainedTokenizerFast.save_pretrained (model_max_length
                     int(1e30), added_tokens_decoder, named chat templates):
                     generate prints what it prints with the bare
                     tokenizer.json, eval gives the same loss (issue 33)
  bad.*              one line on stderr, exit status 2: a missing MODEL, an
                     empty prompt, a prompt longer than the context (and
                     --truncate-prompt then works), a tokenizer with more
                     tokens than the model's vocabulary, a WordPiece
                     tokenizer.json, a --prompt-file line that is not JSON;
                     (issue 46) a generation_config.json that is not JSON or
                     whose eos_token_id is a string, a fraction, an object,
                     1e20, outside the vocabulary or -1, naming the file,
                     the directory unchanged (checksums); one error line (the
                     log's notes on config.json's defaults are not errors)
  generation_config.list_accepted  a list of valid ids still generates
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import use_ref_venv  # noqa: E402

use_ref_venv("peft", "generate.env")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from peft import PeftModel  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402

from harness import BIN, ENV, ROOT, check, files_state, note, run_main, scratch_dir, write_config, write_shard  # noqa: E402

TMP = scratch_dir("t_generate")
torch.manual_seed(11)
torch.set_num_threads(1)
V, CTX, NEW = 320, 128, 24
EOS_TOKEN = "<|endoftext|>"
PROMPTS = ["The", "ZeRO stage 3 shards the weights,", "def main():\n    return 0\n",
           "Checkpoints resume at any world size; the planner's memory plan equals the measured peak, and "
           "preemption requeues the job on Slurm.",
           "héllo wörld — ünïcode"]


def make_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[EOS_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([open(os.path.join(ROOT, "docs", "getting-started.md"), encoding="utf-8").read()], trainer)
    return tok


def make_models(tok):
    eos = tok.token_to_id(EOS_TOKEN)
    out = {}
    lc = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=CTX, rms_norm_eps=1e-5, initializer_range=0.2,
                     tie_word_embeddings=False, eos_token_id=eos, bos_token_id=eos)
    gc = GPT2Config(vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=CTX, initializer_range=0.2,
                    eos_token_id=eos, bos_token_id=eos)
    for name, model in (("llama", LlamaForCausalLM(lc)), ("gpt2", GPT2LMHeadModel(gc))):
        d = os.path.join(TMP, "base_" + name)
        model.float().save_pretrained(d, safe_serialization=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        out[name] = d
    return out


def run(args, N=1, timeout=300):
    cmd = (["mpirun", "-np", str(N), "--oversubscribe"] if N > 1 else []) + [BIN] + args
    return subprocess.run(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)


def prompt_file(name, prompts):
    path = os.path.join(TMP, name + ".jsonl")
    with open(path, "w") as f:
        for i, p in enumerate(prompts):
            f.write(json.dumps(p if i % 2 else {"prompt": p}) + "\n")
    return path


PROMPT_FILE = None


def generate(name, model, extra=(), N=1, batch=2):
    r = run(["generate", model, "--prompt-file", PROMPT_FILE, "--max-new-tokens", str(NEW), "--batch", str(batch)]
            + list(extra), N=N)
    check(f"{name}.run", r.returncode == 0, f"exit {r.returncode}: {r.stderr[-800:]}")
    if r.returncode != 0:
        return None
    rows = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    check(f"{name}.rows", [x["index"] for x in rows] == list(range(len(PROMPTS))), f"{r.stdout[:400]}")
    return rows


@torch.no_grad()
def hf_greedy(model, tok, eos):
    outs = []
    for p in PROMPTS:
        ids = tok.encode(p).ids
        y = model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, eos_token_id=eos,
                           pad_token_id=eos, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        outs.append(y[0, len(ids):].tolist())
    return outs


def same_ids(name, rows, want, tok=None):
    if rows is None:
        return
    got = [x["ids"] for x in rows]
    bad = [i for i in range(len(want)) if got[i] != want[i]]
    check(name, not bad, "; ".join(f"prompt {i}: got {got[i]} want {want[i]}" for i in bad[:2]))
    if tok is not None:
        texts = [tok.decode(w, skip_special_tokens=True) for w in want]
        bad = [i for i in range(len(want)) if rows[i]["completion"] != texts[i] and EOS_TOKEN not in texts[i]]
        check(name + ".text", not bad, "; ".join(f"{rows[i]['completion']!r} vs {texts[i]!r}" for i in bad[:2]))


def check_greedy(bases, tok):
    eos = tok.token_to_id(EOS_TOKEN)
    for kind, cls in (("llama", LlamaForCausalLM), ("gpt2", GPT2LMHeadModel)):
        note(f"greedy {kind}")
        want = hf_greedy(cls.from_pretrained(bases[kind]).eval(), tok, eos)
        for N, batch in ((1, 2), (2, 2), (3, 1)):
            same_ids(f"greedy.{kind}.N{N}", generate(f"greedy.{kind}.N{N}", bases[kind], N=N, batch=batch), want,
                     tok if N == 1 else None)
        if kind == "llama":
            r = run(["generate", bases[kind], "--prompt", PROMPTS[1], "--max-new-tokens", str(NEW)])
            text = tok.decode(want[1], skip_special_tokens=True)
            check("prompt.text", r.returncode == 0 and r.stdout == text + "\n", f"exit {r.returncode}: "
                  f"{r.stdout!r} vs {text!r} {r.stderr[-300:]}")


def check_sampling(bases):
    base = bases["llama"]
    args = ["--temperature", "0.9", "--top-k", "40", "--top-p", "0.95", "--seed", "3"]
    a = generate("sample.a", base, args)
    b = generate("sample.b", base, args)
    c = generate("sample.N2", base, args, N=2)
    d = generate("sample.seed4", base, args[:-1] + ["4"])
    if a and b and c and d:
        ids = lambda rows: [x["ids"] for x in rows]  # noqa: E731
        check("sample.repeats", ids(a) == ids(b), f"{ids(a)[:1]} vs {ids(b)[:1]}")
        check("sample.same_at_N2", ids(a) == ids(c), f"{ids(a)[:1]} vs {ids(c)[:1]}")
        check("sample.seed_changes", ids(a) != ids(d), "seed 3 and seed 4 drew the same tokens")


TOKENS = np.random.default_rng(5).integers(0, 300, 60 * 16 + 1)
VAL = np.random.default_rng(6).integers(0, 300, 13 * 16 + 1)
DATA, VAL_DATA, VAL13_DATA = (os.path.join(TMP, f) for f in ("train.bin", "val.bin", "val13.bin"))


def train(name, base, lora=None, steps=3, val=False):
    ck = os.path.join(TMP, name)
    shutil.rmtree(ck, ignore_errors=True)
    cfg = {"model": {"from_pretrained": base},
           "data": {"train": DATA, "seq_len": 16, "shuffle": False},
           "train": {"steps": steps, "eval_every": 0, "sample_tokens": 0},
           "train_micro_batch_size_per_gpu": 2,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
           "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
           "checkpoint": {"dir": ck, "export_hf": True}}
    if lora:
        cfg["lora"] = {"r": 4, "alpha": 8, "init": False, "target_modules": "all-linear"}
    if val:
        cfg["data"]["val"] = VAL_DATA
        cfg["train"].update({"eval_every": steps, "eval_batches": 100, "metrics": os.path.join(TMP, name + ".jsonl")})
    path = write_config(os.path.join(TMP, name + ".json"), cfg)
    r = run(["train", path], N=2)
    check(f"{name}.train", r.returncode == 0, f"exit {r.returncode}: {r.stderr[-600:]}")
    return ck if r.returncode == 0 else None


def check_checkpoints(bases, tok):
    eos = tok.token_to_id(EOS_TOKEN)
    ck = train("ckpt_run", bases["llama"])
    if ck:
        want = hf_greedy(LlamaForCausalLM.from_pretrained(os.path.join(ck, "hf")).eval(), tok, eos)
        same_ids("ckpt.dir", generate("ckpt.dir", ck), want)
        latest = os.path.join(ck, open(os.path.join(ck, "latest")).read().strip())
        same_ids("ckpt.file_N2", generate("ckpt.file_N2", latest, N=2), want)
    lk = train("lora_run", bases["llama"], lora=True)
    if lk:
        base = LlamaForCausalLM.from_pretrained(bases["llama"]).eval()
        peft = PeftModel.from_pretrained(base, os.path.join(lk, "hf")).eval()
        want = hf_greedy(peft, tok, eos)
        same_ids("lora.generate", generate("lora.generate", lk), want)
        same_ids("lora.generate_N2", generate("lora.generate_N2", lk, N=2), want)
        expect_bad("lora_other_base", ["generate", lk, "--base", bases["gpt2"], "--prompt", "x"], ["another"])


def eval_json(name, ck, data, N, batch):
    r = run(["eval", ck, "--data", data, "--batch", str(batch), "--json"], N=N)
    check(f"{name}.run", r.returncode == 0, f"exit {r.returncode}: {r.stderr[-600:]}")
    return json.loads(r.stdout.splitlines()[-1]) if r.returncode == 0 else None


def check_eval(bases):
    ck = train("eval_run", bases["llama"], steps=2, val=True)
    if not ck:
        return
    vals = [json.loads(x) for x in open(os.path.join(TMP, "eval_run.jsonl")) if "val_loss" in x]
    want = vals[-1]["val_loss"] if vals else float("nan")
    # 12 windows: the trainer (N = 2, micro-batch 2) reads them all
    for N in (1, 2):
        got = eval_json(f"eval.N{N}", ck, VAL_DATA, N, 2)
        if got:
            check(f"eval.N{N}.equals_trainer", abs(got["loss"] - want) <= 1e-6 * abs(want), f"{got['loss']} vs {want}")
            check(f"eval.N{N}.tokens", got["tokens"] == 12 * 16 and got["sequences"] == 12, f"{got}")
    # 13 windows: partial last batches, every window counted once
    a, b = eval_json("eval.partial_N1", ck, VAL13_DATA, 1, 2), eval_json("eval.partial_N2", ck, VAL13_DATA, 2, 3)
    if a and b:
        check("eval.partial.tokens", a["tokens"] == b["tokens"] == 13 * 16 and a["sequences"] == b["sequences"] == 13,
              f"{a} {b}")
        check("eval.partial.same_loss", abs(a["loss"] - b["loss"]) <= 1e-6 * abs(a["loss"]), f"{a} {b}")


def expect_bad(name, args, words, N=1):
    r = run(args, N=N)
    # the error lines (the log's notes, such as a default taken for a key config.json lacks, are not errors)
    lines = [x for x in r.stderr.splitlines() if "error" in x]
    ok = r.returncode == 2 and len(lines) == 1 and all(w in lines[0] for w in words)
    check(f"bad.{name}", ok, f"exit {r.returncode}, stderr {lines[:3]} (want one line naming {words})")


def check_bad(bases, tok):
    base = bases["llama"]
    expect_bad("missing_model", ["generate", os.path.join(TMP, "nothing"), "--prompt", "x"], ["does not exist"])
    expect_bad("empty_prompt", ["generate", base, "--prompt", ""], ["prompt 1 is empty"])
    long = " ".join(["word"] * 200)
    expect_bad("long_prompt", ["generate", base, "--prompt", long], ["context", "--truncate-prompt"])
    r = run(["generate", base, "--prompt", long, "--truncate-prompt", "--max-new-tokens", "4", "--json"])
    row = json.loads(r.stdout) if r.returncode == 0 else {}
    check("bad.long_prompt_truncated", r.returncode == 0 and row.get("truncated", 0) > 0 and
          row.get("prompt_tokens", 0) + 4 <= CTX, f"exit {r.returncode}: {r.stdout[:300]} {r.stderr[-300:]}")
    big = Tokenizer(models.BPE())
    big.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    big.train_from_iterator([open(os.path.join(ROOT, "docs", "getting-started.md"), encoding="utf-8").read()], trainer)
    big_path = os.path.join(TMP, "big_tokenizer.json")
    big.save(big_path)
    expect_bad("tokenizer_vocab", ["generate", base, "--tokenizer", big_path, "--prompt", "x"],
               ["not this model's tokenizer"])
    wp = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    wp_path = os.path.join(TMP, "wordpiece.json")
    wp.save(wp_path)
    expect_bad("tokenizer_wordpiece", ["generate", base, "--tokenizer", wp_path, "--prompt", "x"], ["WordPiece"])
    check_generation_config(base, tok)
    bad_file = os.path.join(TMP, "bad_prompts.jsonl")
    open(bad_file, "w").write('"fine"\n{not json\n')
    expect_bad("prompt_file_line", ["generate", base, "--prompt-file", bad_file], ["line 2"])


def check_generation_config(base, tok):
    """Issue 46: a generation_config.json that is not JSON, or whose eos_token_id is no token id of the model (a
    string, a fraction, an object, 1e20, the vocabulary's size, -1, which would never stop a sequence), is refused
    in one line naming the file; the directory is left as it was. A valid list still stops generation."""
    eos = tok.token_to_id(EOS_TOKEN)
    cases = [("not_json", '{"eos_token_id": 2,'), ("string", '{"eos_token_id": "2"}'),
             ("fraction", '{"eos_token_id": 2.5}'), ("object", '{"eos_token_id": {"id": 2}}'),
             ("huge", '{"eos_token_id": 1e20}'), ("outside_vocabulary", f'{{"eos_token_id": {V}}}'),
             ("minus_one", '{"eos_token_id": -1}'), ("list_with_bad", f'{{"eos_token_id": [{eos}, -1]}}')]
    for name, text in cases:
        d = os.path.join(TMP, "gen_" + name)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(base, d)
        path = os.path.join(d, "generation_config.json")
        with open(path, "w") as f:
            f.write(text)
        before = files_state(d)
        expect_bad(f"generation_config.{name}", ["generate", d, "--prompt", "x"],
                   [path, "not valid JSON" if name == "not_json" else "eos_token_id"])
        check(f"bad.generation_config.{name}.unchanged", files_state(d) == before, d)
    d = os.path.join(TMP, "gen_list")
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(base, d)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        f.write(f'{{"eos_token_id": [{V - 1}, {eos}]}}')
    r = run(["generate", d, "--prompt", "x", "--max-new-tokens", "4", "--json"])
    check("generation_config.list_accepted", r.returncode == 0, f"exit {r.returncode}: {r.stderr[-300:]}")


def check_saved_tokenizer(bases, tok):
    """A directory whose tokenizer transformers' PreTrainedTokenizerFast.save_pretrained wrote: its
    tokenizer_config.json carries model_max_length int(1e30) (no limit set), added_tokens_decoder and a
    list of named chat templates, which jansson alone refuses (issue 33). generate and eval read it and
    give what they give with the bare tokenizer.json."""
    from transformers import PreTrainedTokenizerFast
    d = os.path.join(TMP, "saved_tokenizer")
    shutil.copytree(bases["llama"], d)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN)
    fast.chat_template = {"default": "{{ messages[0]['content'] }}", "rag": "R {{ messages[0]['content'] }}"}
    fast.save_pretrained(d)
    text = open(os.path.join(d, "tokenizer_config.json")).read()
    check("saved_tokenizer.config_as_transformers_writes",
          '"model_max_length": 1000000000000000019884624838656' in text and "added_tokens_decoder" in text and
          '"name": "rag"' in text, text[:400])
    ref = run(["generate", bases["llama"], "--prompt", PROMPTS[1], "--max-new-tokens", str(NEW)])
    r = run(["generate", d, "--prompt", PROMPTS[1], "--max-new-tokens", str(NEW)])
    check("saved_tokenizer.generate", r.returncode == 0 and ref.returncode == 0 and r.stdout == ref.stdout and
          r.stdout.strip(), f"exit {r.returncode}: {r.stdout!r} vs {ref.stdout!r} {r.stderr[-300:]}")
    a, b = eval_json("saved_tokenizer.eval", d, VAL_DATA, 1, 4), eval_json("saved_tokenizer.eval_bare", bases["llama"],
                                                                        VAL_DATA, 1, 4)
    check("saved_tokenizer.eval_equals_bare", a and b and a["loss"] == b["loss"] and a["tokens"] == b["tokens"] > 0,
          f"{a} vs {b}")


def main():
    global PROMPT_FILE
    tok = make_tokenizer()
    bases = make_models(tok)
    PROMPT_FILE = prompt_file("prompts", PROMPTS)
    write_shard(DATA, TOKENS)
    write_shard(VAL_DATA, VAL[:12 * 16 + 1])
    write_shard(VAL13_DATA, VAL)
    check_greedy(bases, tok)
    check_sampling(bases)
    check_checkpoints(bases, tok)
    check_eval(bases)
    check_bad(bases, tok)
    check_saved_tokenizer(bases, tok)


if __name__ == "__main__":
    run_main("generate.main", main)
