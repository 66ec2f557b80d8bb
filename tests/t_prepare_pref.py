#!/usr/bin/env python3
"""t_prepare_pref — tools/prepare_data.py on preference pairs (DPO, issue 37).

Uses t_prepare_data's tokenizers (its byte-level BPE with the "chatml",
"llama2" and "bare" directories) and runs under build/ref-venv (transformers
4.40.2) for the references.

Checks:
  strings.*      a {"prompt","chosen","rejected"} pair is two samples, chosen then
                 rejected: BOS + prompt untrained, completion + EOS trained, the
                 tokens the tokenizer's own encoding of each part; prompt_lengths
  conv.*         message-list pairs under ChatML and Llama 2: the prompt tokens are
                 transformers' apply_chat_template(prompt, add_generation_prompt=True),
                 the whole sample apply_chat_template(prompt + chosen), the trained
                 tokens decode to exactly the assistant content + end-of-turn text
  file.*         format "shardlm-preferences", n_pairs, n_samples = 2 n_pairs,
                 pair_formats, no max lengths without truncation
  trunc.*        TRL's rule: a long prompt keeps BOS and its last P - 1 tokens,
                 completions their first L - P; short pairs untouched; counts
  bad.*          every bad preference input: exit 2, one line naming FILE:LINE (or
                 the option), nothing written; issue 46: a pair without "rejected"
                 (or "chosen") names the key, an empty prompt is named as such (not as
                 a chat-template problem), --max-seq-length 0 / -5 as itself, an input
                 directory or FIFO as what it is, an earlier preference file as one
  overwrite.*    --overwrite replaces an earlier preference file
  trainer.*      shardlm train without a dpo section refuses a preference file by name
                 (add a dpo section), rather than training SFT on both completions
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import use_ref_venv  # noqa: E402

use_ref_venv("transformers", "prepare_pref.env")

import t_prepare_data as base  # noqa: E402
from harness import BIN, ENV, check, run_main, scratch_dir, write_config  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

base.TMP = scratch_dir("t_prepare_pref")
same, convert, write_jsonl, trained_runs = base.same, base.convert, base.write_jsonl, base.trained_runs

STRING_PAIRS = [
    {"prompt": "Hello there, how are you? ", "chosen": "The quick brown fox.", "rejected": "The lazy dog."},
    {"prompt": "Translate: caf\u00e9\n", "chosen": "Caf\u00e9 cr\u00e8me \U0001F600", "rejected": "12345 numbers"},
]
USER = {"role": "user", "content": "Hello there, how are you?"}
CONV_PAIRS = [
    {"prompt": [USER], "chosen": [{"role": "assistant", "content": "The quick brown fox."}],
     "rejected": [{"role": "assistant", "content": "The lazy dog."}]},
    {"prompt": [USER, {"role": "assistant", "content": "Fine."}, {"role": "user", "content": "Translate: caf\u00e9"}],
     "chosen": [{"role": "assistant", "content": "Caf\u00e9 cr\u00e8me"}],
     "rejected": [{"role": "assistant", "content": "12345 \U0001F600"}]},
]


def check_strings(paths, tok):
    enc = lambda s: tok.encode(s, add_special_tokens=False).ids  # noqa: E731
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    path = write_jsonl("strings.jsonl", STRING_PAIRS)
    _, samples, attrs, facts = convert("strings", ["--tokenizer", paths["chatml"]], [path])
    same("strings.n_samples", len(samples), 2 * len(STRING_PAIRS))
    for k, pair in enumerate(STRING_PAIRS):
        prompt = [bos] + enc(pair["prompt"])
        for j, key in enumerate(("chosen", "rejected")):
            ids, trained = samples[2 * k + j] if len(samples) > 2 * k + j else ([], [])
            completion = enc(pair[key]) + [eos]
            same(f"strings.{k}.{key}.tokens", ids, prompt + completion)
            same(f"strings.{k}.{key}.trained", trained, [0] * len(prompt) + [1] * len(completion))
    lengths = read_prompt_lengths("strings")
    same("strings.prompt_lengths", lengths, [1 + len(enc(p["prompt"])) for p in STRING_PAIRS])
    same("file.format", attrs.get("format"), "shardlm-preferences")
    same("file.counts", (attrs.get("n_pairs"), attrs.get("n_samples"), attrs.get("n_truncated_pairs")),
         (len(STRING_PAIRS), 2 * len(STRING_PAIRS), 0))
    same("file.pair_formats", json.loads(attrs.get("pair_formats", "{}")), {"strings": 2, "conversational": 0})
    same("file.not_cut", (attrs.get("max_seq_length"), attrs.get("max_prompt_length")), (0, 0))
    same("file.names", facts.get("names"), ["offsets", "prompt_lengths", "tokens", "trained"])


def read_prompt_lengths(name):
    with base.h5py.File(os.path.join(base.TMP, name + ".h5"), "r") as f:
        return f["prompt_lengths"][:].tolist() if "prompt_lengths" in f else None


def check_conversational(paths, tok):
    path = write_jsonl("conv.jsonl", CONV_PAIRS)
    for tname, end_of_turn in (("chatml", "<|im_end|>\n"), ("llama2", " </s>")):
        hf = PreTrainedTokenizerFast.from_pretrained(paths[tname])
        _, samples, attrs, _ = convert(f"conv_{tname}", ["--tokenizer", paths[tname]], [path])
        lengths = read_prompt_lengths(f"conv_{tname}") or []
        for k, pair in enumerate(CONV_PAIRS):
            prompt_text = hf.apply_chat_template(pair["prompt"], tokenize=False, add_generation_prompt=True)
            prompt = tok.encode(prompt_text, add_special_tokens=False).ids
            same(f"conv.{tname}.{k}.prompt_length", lengths[k] if k < len(lengths) else None, len(prompt))
            for j, key in enumerate(("chosen", "rejected")):
                ids, trained = samples[2 * k + j] if len(samples) > 2 * k + j else ([], [])
                full = hf.apply_chat_template(pair["prompt"] + pair[key], tokenize=False)
                same(f"conv.{tname}.{k}.{key}.prompt_tokens", ids[:len(prompt)], prompt)
                same(f"conv.{tname}.{k}.{key}.text", tok.decode(ids, skip_special_tokens=False),
                     tok.decode(tok.encode(full, add_special_tokens=False).ids, skip_special_tokens=False))
                content = pair[key][0]["content"]
                want = content + end_of_turn if tname == "chatml" else f" {content.strip()}{end_of_turn}"
                same(f"conv.{tname}.{k}.{key}.trained", trained_runs(tok, ids, trained), [want])
        same(f"conv.{tname}.pair_formats", json.loads(attrs.get("pair_formats", "{}")),
             {"strings": 0, "conversational": 2})


def check_truncation(paths, tok):
    enc = lambda s: tok.encode(s, add_special_tokens=False).ids  # noqa: E731
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 4
    pairs = [{"prompt": long_prompt, "chosen": "Hello there, how are you today? " * 3, "rejected": "The lazy dog."},
             STRING_PAIRS[0]]
    limit, keep = 24, 10
    path = write_jsonl("trunc.jsonl", pairs)
    _, samples, attrs, _ = convert("trunc", ["--tokenizer", paths["chatml"], "--max-seq-length", str(limit),
                                             "--max-prompt-length", str(keep)], [path])
    prompt = [bos] + enc(long_prompt)
    cut_prompt = [bos] + prompt[-(keep - 1):]
    for j, key in enumerate(("chosen", "rejected")):
        completion = (enc(pairs[0][key]) + [eos])[:limit - keep]
        ids, trained = samples[j] if len(samples) > j else ([], [])
        same(f"trunc.long.{key}.tokens", ids, cut_prompt + completion)
        same(f"trunc.long.{key}.trained", trained, [0] * keep + [1] * len(completion))
        ids, _ = samples[2 + j] if len(samples) > 2 + j else ([], [])
        same(f"trunc.short.{key}.untouched", ids, [bos] + enc(pairs[1]["prompt"]) + enc(pairs[1][key]) + [eos])
    same("trunc.long_enough", len(prompt) > keep and len(enc(pairs[0]["chosen"])) > limit - keep, True)
    same("trunc.prompt_lengths", read_prompt_lengths("trunc"), [keep, 1 + len(enc(pairs[1]["prompt"]))])
    same("trunc.attrs", (attrs.get("max_seq_length"), attrs.get("max_prompt_length"), attrs.get("n_truncated_pairs")),
         (limit, keep, 1))
    # the default prompt budget is half the length
    _, _, attrs, _ = convert("trunc_default", ["--tokenizer", paths["chatml"], "--max-seq-length", str(limit)], [path])
    same("trunc.default_prompt_length", attrs.get("max_prompt_length"), limit // 2)


def check_bad(paths):
    tok = ["--tokenizer", paths["chatml"]]
    good = STRING_PAIRS[0]
    assistant = {"role": "assistant", "content": "x"}
    cases = [
        ("no_rejected_field", ["--format", "preference"], [good, {"prompt": "a", "chosen": "b"}], 2),
        ("no_prompt", [], [good, {"chosen": "b", "rejected": "c"}], 2),
        ("mixed_types", [], [good, {"prompt": "a", "chosen": [assistant], "rejected": "c"}], 2),
        ("same_completions", [], [good, {"prompt": "a", "chosen": "b", "rejected": "b"}], 2),
        ("empty_completion", [], [good, {"prompt": "a", "chosen": "b", "rejected": ""}], 2),
        ("sft_among_pairs", [], [good, {"text": "Hello"}], 2),
        ("pair_among_sft", [], [{"text": "Hello"}, good], 2),
        ("prompt_ends_with_assistant", [], [good, {"prompt": [USER, assistant], "chosen": [assistant],
                                                   "rejected": [dict(assistant, content="y")]}], 2),
        ("completion_not_assistant", [], [good, {"prompt": [USER], "chosen": [USER], "rejected": [assistant]}], 2),
        ("bad_role", [], [good, {"prompt": [{"role": "robot", "content": "x"}], "chosen": [assistant],
                                 "rejected": [dict(assistant, content="y")]}], 2),
        ("empty_prompt_list", [], [good, {"prompt": [], "chosen": [assistant], "rejected": [USER]}], 2),
        ("max_seq_length_on_sft", ["--max-seq-length", "8"], [{"text": "Hello"}], 1),
    ]
    for name, args, lines, number in cases:
        path = write_jsonl(os.path.join("bad", name + ".jsonl"), lines)
        base.expect_failure(name, tok + args, [path], f"{path}:{number}: ")
    path = write_jsonl("bad/no_template.jsonl", [CONV_PAIRS[0]])
    base.expect_failure("no_chat_template", ["--tokenizer", paths["bare"]], [path], f"{path}:1: ")
    path = write_jsonl("bad/no_tokenizer.jsonl", [good])
    base.expect_failure("no_tokenizer", ["--vocab-size", "500"], [path], f"{path}:1: ")
    good_path = write_jsonl("bad/good.jsonl", [good])
    base.expect_failure("prompt_length_alone", tok + ["--max-prompt-length", "4"], [good_path], "--max-prompt-length")
    base.expect_failure("prompt_length_too_big", tok + ["--max-seq-length", "8", "--max-prompt-length", "8"],
                        [good_path], "--max-prompt-length")
    # issue 46: each named as what it is
    bare = ["--tokenizer", paths["bare"]]
    named = [  # name, tokenizer args, lines, line number, text after FILE:LINE:
        ("auto_no_rejected", tok, [good, {"prompt": "a", "chosen": "b"}], 2,
         'a preference pair has no "rejected" field'),
        ("auto_no_chosen", tok, [good, {"prompt": "a", "rejected": "b"}], 2, 'a preference pair has no "chosen" field'),
        ("empty_prompt_no_bos", bare, [{"prompt": "", "chosen": "b", "rejected": "c"}], 1,
         '"prompt" is empty and the tokenizer adds no BOS token'),
        ("empty_prompt_list_no_template", bare,
         [{"prompt": [], "chosen": [assistant], "rejected": [dict(assistant, content="y")]}], 1,
         '"prompt" is an empty list'),
    ]
    for name, args, lines, number, text in named:
        path = write_jsonl(os.path.join("bad", name + ".jsonl"), lines)
        base.expect_failure(name, args, [path], f"{path}:{number}: {text}")
    for length in ("0", "-5"):
        base.expect_failure(f"max_seq_length_{length}", tok + ["--max-seq-length", length], [good_path],
                            f"--max-seq-length {length}: want at least 2")
    folder = os.path.join(base.TMP, "bad", "input_dir")
    os.makedirs(folder, exist_ok=True)
    fifo = os.path.join(base.TMP, "bad", "input_fifo")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    base.expect_failure("input_directory", tok, [folder], f"{folder}: is a directory")
    base.expect_failure("input_fifo", tok, [fifo], f"{fifo}: is a FIFO")
    # an earlier preference file: refused without --overwrite (naming it as one, unchanged), replaced with it
    out = os.path.join(base.TMP, "bad", "again.h5")
    first = base.run_tool(tok + ["-o", out, good_path])
    before = open(out, "rb").read() if first.returncode == 0 else b""
    again = base.run_tool(tok + ["-o", out, write_jsonl("bad/two.jsonl", STRING_PAIRS)])
    check("bad.preference_output_exists", first.returncode == 0 and again.returncode == 2
          and "replace that preference file" in again.stderr and open(out, "rb").read() == before,
          f"exit {first.returncode}, {again.returncode}: {again.stderr.strip()}")
    again = base.run_tool(tok + ["--overwrite", "-o", out, os.path.join(base.TMP, "bad", "two.jsonl")])
    samples, attrs, _ = base.read_samples(out)
    same("overwrite.preference_file_replaced", (again.returncode, attrs.get("n_pairs"), len(samples)), (0, 2, 4))
    # --skip-bad keeps the good pairs and counts the bad lines
    path = write_jsonl("bad/skip.jsonl", [good, {"prompt": "a", "chosen": "b", "rejected": "b"}, {"text": "x"},
                                          STRING_PAIRS[1]])
    _, samples, attrs, _ = convert("skip", tok + ["--skip-bad"], [path])
    same("bad.skip.counts", (attrs.get("n_pairs"), len(samples), attrs.get("n_skipped_lines")), (2, 4, 2))


def check_trainer_refuses(tok):
    """Without a dpo section a preference file is refused by name (add one), not trained as SFT."""
    data = os.path.join(base.TMP, "strings.h5")
    model = {"type": "llama", "n_layer": 1, "n_head": 2, "n_kv_head": 2, "n_embd": 16, "ffn_dim": 32,
             "vocab_size": tok.get_vocab_size(with_added_tokens=True), "n_positions": 64}
    cfg = write_config(os.path.join(base.TMP, "refuse.json"), {
        "model": model, "data": {"train": data, "max_seq_length": 64},
        "train": {"steps": 1, "eval_every": 0, "sample_tokens": 0},
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 3}})
    r = subprocess.run([BIN, "train", cfg], env=ENV, capture_output=True, text=True,
                       timeout=300)
    lines = [x for x in r.stderr.splitlines() if "error" in x]
    check("trainer.refuses_preference_file", r.returncode == 2 and len(lines) == 1
          and "a preference file" in lines[0] and "add a dpo section" in lines[0] and "strings.h5" in lines[0], f"exit {r.returncode}: {r.stderr[-300:]}")


def main():
    paths, tok = base.make_tokenizers()
    check_strings(paths, tok)
    check_conversational(paths, tok)
    check_truncation(paths, tok)
    check_bad(paths)
    check_trainer_refuses(tok)


if __name__ == "__main__":
    run_main("prepare_pref", main)
