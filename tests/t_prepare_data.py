#!/usr/bin/env python3
"""t_prepare_data — tools/prepare_data.py: JSONL to the HDF5 sample file (issue 18).

The test trains its own byte-level BPE tokenizer with `tokenizers` (ByteLevel
pre-tokenizer and decoder, <s> </s> <pad> <|im_start|> <|im_end|>, a
post-processor that adds <s> as Llama's does) and writes three directories
around it: "chatml" (tokenizer_config.json with add_bos_token and a ChatML
template as the "default" of named templates), "llama2" (a multi-line Llama-2 template that needs trim_blocks and
lstrip_blocks and raises on roles out of turn, pad_token only in
special_tokens_map.json, BOS from the post-processor) and "bare" (a
tokenizer.json alone, no post-processor). Runs under build/ref-venv
(transformers 4.40.2), re-executing itself there.

Checks:
  text.*, completion.*, alpaca.*  tokens equal the tokenizer's encoding (BOS once,
              where transformers' own encoding has it, EOS appended), prompt and
              completion encoded apart, the loss mask on completion and EOS only
  chat.*      tokens equal the encoding of transformers' apply_chat_template
              rendering; the trained tokens decode to exactly the assistant
              contents with their end-of-turn text; --chat-template with a
              template that uses loopcontrols
  tokenized.* ids as given, labels as the mask, --vocab-size
  file.*      dtypes, offsets, no filters, every attribute (hash, vocabulary
              size, special ids, counts, sources, per-format counts), strings
              fixed-length
  inputs.*    several files and a glob in order (globs sorted), --format forcing
  bad.*       every bad input: exit status 2, one stderr line with FILE:LINE (or
              the path), no output file, an existing output left as it was, no
              temporary file left; --skip-bad counts and skips them
  env.*       run by Debian's python3 it re-executes itself into the venv; with
              no venv it names tools/deps.sh; the progress bar on a terminal
"""
import glob
import hashlib
import json
import os
import pty
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import use_ref_venv  # noqa: E402

use_ref_venv("transformers", "prepare_data.env")
os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")  # nothing may be downloaded

import h5py  # noqa: E402
import numpy as np  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

from harness import ROOT, check, note, run_main, scratch_dir  # noqa: E402

TOOL = os.path.join(ROOT, "tools", "prepare_data.py")
TMP = scratch_dir("t_prepare_data")
IGNORE = -100
# A special token as transformers saves it (with "__type": "AddedToken" in tokenizer_config.json)
ADDED_TOKEN = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
SPECIALS = ["<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
CORPUS = ["The quick brown fox jumps over the lazy dog.", "Hello there, how are you today?",
          "Below is an instruction that describes a task. Write a response.",
          "user assistant system: translate, summarize, answer the question.",
          "Caf\u00e9 cr\u00e8me, na\u00efve r\u00e9sum\u00e9 \u2014 \U0001F600 emoji and 12345 numbers."]
CHATML = ("{{ bos_token }}{% for message in messages %}"
          "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# Llama-2's template spread over lines: without trim_blocks the newlines after
# the block tags would stay in the text, without lstrip_blocks the indentation.
LLAMA2 = """{% if messages[0]['role'] == 'system' %}
    {% set loop_messages = messages[1:] %}
    {% set system_message = '<<SYS>>\\n' + messages[0]['content'] + '\\n<</SYS>>\\n\\n' %}
{% else %}
    {% set loop_messages = messages %}
    {% set system_message = '' %}
{% endif %}
{% for message in loop_messages %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% set content = system_message + message['content'] if loop.first else message['content'] %}
    {% if message['role'] == 'user' %}
{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}
{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}
{% endfor %}
"""
# transformers 4.40 has no loopcontrols; this one is checked against its known rendering.
LOOPCONTROLS = ("{% for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}"
                "<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
ALPACA_INPUT = ("Below is an instruction that describes a task, paired with an input that provides further "
                "context. Write a response that appropriately completes the request.\n\n"
                "### Instruction:\n{}\n\n### Input:\n{}\n\n### Response:\n")
ALPACA_PLAIN = ("Below is an instruction that describes a task. Write a response that appropriately completes "
                "the request.\n\n### Instruction:\n{}\n\n### Response:\n")

CHATS = [
    [{"role": "user", "content": "Hello there, how are you?"},
     {"role": "assistant", "content": "The quick brown fox."}],
    [{"role": "system", "content": "You answer the question."},
     {"role": "user", "content": "Translate: caf\u00e9"},
     {"role": "assistant", "content": " Caf\u00e9 cr\u00e8me \U0001F600"},
     {"role": "user", "content": "and the dog?"},
     {"role": "assistant", "content": "The lazy dog.\n12345"}],
]


def make_tokenizers():
    """{name: directory or tokenizer.json path} of the three tokenizers, and the trained Tokenizer."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    paths = {}
    bare = os.path.join(TMP, "bare")
    os.makedirs(bare, exist_ok=True)
    tok.save(os.path.join(bare, "tokenizer.json"))
    paths["bare"] = os.path.join(bare, "tokenizer.json")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    configs = {
        "chatml": ({"bos_token": "<s>", "eos_token": dict(ADDED_TOKEN, __type="AddedToken", content="</s>"),
                    "pad_token": "<pad>",
                    "add_bos_token": True, "add_eos_token": False,
                    "chat_template": [{"name": "tool_use", "template": "{% not compiled"},
                                      {"name": "default", "template": CHATML}]}, None),
        "llama2": ({"bos_token": "<s>", "eos_token": "</s>", "chat_template": LLAMA2},
                   {"pad_token": dict(ADDED_TOKEN, content="<pad>")}),
    }
    for name, (config, special_map) in configs.items():
        d = os.path.join(TMP, name)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(config, f)
        if special_map:
            with open(os.path.join(d, "special_tokens_map.json"), "w") as f:
                json.dump(special_map, f)
        paths[name] = d
    return paths, tok


def write_jsonl(name, lines):
    """A JSONL file of objects (dumped) or raw lines (str or bytes); returns its path."""
    path = os.path.join(TMP, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        for line in lines:
            if isinstance(line, str):
                line = line.encode()
            elif not isinstance(line, bytes):
                line = json.dumps(line).encode()
            f.write(line + b"\n")
    return path


def run_tool(args, python=None, **kw):
    return subprocess.run([python or sys.executable, TOOL] + args, capture_output=True, text=True, **kw)


def read_samples(path):
    """(list of (ids, trained) per sample, attributes with strings decoded, the open-file facts)."""
    with h5py.File(path, "r") as f:
        tokens, trained, offsets = f["tokens"][:], f["trained"][:], f["offsets"][:]
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        facts = {"dtypes": (f["tokens"].dtype.str, f["trained"].dtype.str, f["offsets"].dtype.str),
                 "filters": [f[k].compression for k in ("tokens", "trained", "offsets")],
                 "names": sorted(f.keys()),
                 "vlen_strings": [k for k in f.attrs if f.attrs.get_id(k).get_type().get_class() == h5py.h5t.STRING
                                  and f.attrs.get_id(k).get_type().is_variable_str()],
                 "tokens": tokens, "trained": trained, "offsets": offsets}
    samples = [(tokens[a:b].tolist(), trained[a:b].tolist()) for a, b in zip(offsets[:-1], offsets[1:])]
    return samples, attrs, facts


def convert(name, args, inputs):
    """Runs the tool into TMP/NAME.h5; returns (completed process, samples, attrs, facts) (None for a failure)."""
    out = os.path.join(TMP, name + ".h5")
    proc = run_tool(args + ["-o", out] + inputs)
    if proc.returncode != 0:
        check(name + ".exit", False, f"exit status {proc.returncode}: {proc.stderr.strip()}")
        return proc, [], {}, {}
    return (proc,) + read_samples(out)


def trained_runs(tok, ids, trained):
    """The text of each maximal run of trained tokens."""
    runs, current = [], []
    for i, t in zip(ids + [None], trained + [0]):
        if t:
            current.append(i)
        elif current:
            runs.append(tok.decode(current, skip_special_tokens=False))
            current = []
    return runs


def same(name, got, want):
    check(name, got == want, f"got {got!r}, want {want!r}")


def check_text_completion_alpaca(paths, tok):
    enc = lambda s: tok.encode(s, add_special_tokens=False).ids  # noqa: E731
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    texts = ["The quick brown fox jumps over the lazy dog.", "Caf\u00e9 \U0001F600 12345", "Hi"]
    pairs = [("Hello there, ", "how are you?", "completion"), ("Question: the dog?\n", "The lazy dog.", "response")]
    alpaca = [("Translate the text.", "caf\u00e9 cr\u00e8me", "Coffee with cream."),
              ("Answer the question.", "", "Yes."), ("Summarize.", None, "A fox.")]
    lines = [{"text": t} for t in texts] + [{"prompt": p, key: c} for p, c, key in pairs]
    lines += [{"instruction": i, "output": o, **({} if x is None else {"input": x})} for i, x, o in alpaca]
    path = write_jsonl("plain.jsonl", lines)
    for tname in ("chatml", "llama2", "bare"):
        hf = (PreTrainedTokenizerFast(tokenizer_file=paths[tname]) if tname == "bare"
              else PreTrainedTokenizerFast.from_pretrained(paths[tname]))
        proc, samples, attrs, _ = convert(f"plain_{tname}", ["--tokenizer", paths[tname]], [path])
        if not samples:
            continue
        tail = [] if tname == "bare" else [eos]
        head = [] if tname == "bare" else [bos]
        want = []
        for t in texts:
            ids = hf(t)["input_ids"] + tail  # transformers' own encoding: BOS from the post-processor
            want.append((ids, [0] + [1] * (len(ids) - 1)))
        for prompt, completion in [(p, c) for p, c, _ in pairs] + [
                ((ALPACA_INPUT.format(i, x) if x else ALPACA_PLAIN.format(i)), o) for i, x, o in alpaca]:
            context, target = head + enc(prompt), enc(completion) + tail
            want.append((context + target, [0] * len(context) + [1] * len(target)))
        for k, kind in enumerate(["text"] * 3 + ["completion"] * 2 + ["alpaca"] * 3):
            same(f"{kind}.{tname}.{k}", samples[k] if k < len(samples) else None, want[k])
        same(f"text.{tname}.bos_once", [s[0][:2].count(bos) for s in samples], [len(head)] * len(samples))
        same(f"text.{tname}.formats", json.loads(attrs["formats"]),
             {"text": 3, "completion": 2, "alpaca": 3, "chat": 0, "tokenized": 0})
        same(f"text.{tname}.special_ids", [attrs[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")],
             [-1, -1, -1] if tname == "bare" else [bos, eos, tok.token_to_id("<pad>")])
        check(f"text.{tname}.summary", proc.stdout.startswith(os.path.join(TMP, f"plain_{tname}.h5") + ": 8 samples")
              and "text 3, completion 2, alpaca 3" in proc.stdout, proc.stdout)


def check_chat(paths, tok):
    path = write_jsonl("chat.jsonl", [{"messages": m} for m in CHATS])
    for tname, end_of_turn in (("chatml", "<|im_end|>\n"), ("llama2", None)):
        hf = PreTrainedTokenizerFast.from_pretrained(paths[tname])
        _, samples, attrs, _ = convert(f"chat_{tname}", ["--tokenizer", paths[tname]], [path])
        for k, (messages, sample) in enumerate(zip(CHATS, samples)):
            rendering = hf.apply_chat_template(messages, tokenize=False)
            want = tok.encode(rendering, add_special_tokens=False).ids
            same(f"chat.{tname}.{k}.tokens", sample[0], want)
            same(f"chat.{tname}.{k}.hf_ids", sample[0], hf.apply_chat_template(messages))
            contents = [m["content"] for m in messages if m["role"] == "assistant"]
            runs = [c + end_of_turn for c in contents] if end_of_turn else [f" {c.strip()} </s>" for c in contents]
            same(f"chat.{tname}.{k}.trained", trained_runs(tok, sample[0], sample[1]), runs)
        same(f"chat.{tname}.pad_from_special_tokens_map", attrs.get("pad_token_id"), tok.token_to_id("<pad>"))
    # --chat-template over a bare tokenizer.json; {% continue %} skips the system turn
    template = os.path.join(TMP, "loop.jinja")
    with open(template, "w") as f:
        f.write(LOOPCONTROLS)
    _, samples, _, _ = convert("chat_loop", ["--tokenizer", paths["bare"], "--chat-template", template], [path])
    if len(samples) == 2:
        rendering = ("<user>Translate: caf\u00e9<assistant> Caf\u00e9 cr\u00e8me \U0001F600"
                     "<user>and the dog?<assistant>The lazy dog.\n12345")
        same("chat.loopcontrols.tokens", samples[1][0], tok.encode(rendering, add_special_tokens=False).ids)
        same("chat.loopcontrols.trained", trained_runs(tok, *samples[1]),
             [" Caf\u00e9 cr\u00e8me \U0001F600", "The lazy dog.\n12345"])


def check_tokenized():
    lines = [{"input_ids": [5, 6, 7, 8], "labels": [5, IGNORE, 7, 8]},
             {"input_ids": [499, 0, 1]},
             {"input_ids": [9, 9], "labels": [IGNORE, 9], "text": "ignored"}]
    path = write_jsonl("ids.jsonl", lines)
    _, samples, attrs, _ = convert("ids", ["--vocab-size", "500"], [path])
    same("tokenized.samples", samples, [([5, 6, 7, 8], [0, 0, 1, 1]), ([499, 0, 1], [0, 1, 1]), ([9, 9], [0, 1])])
    same("tokenized.attrs", [attrs.get(k) for k in ("vocab_size", "tokenizer_sha256", "bos_token_id",
                                                    "eos_token_id", "pad_token_id", "n_trained_tokens")],
         [500, "", -1, -1, -1, 5])


def check_file(paths, tok):
    """The layout and every attribute, on a file of every format but tokenized (and that one)."""
    path = write_jsonl("mixed.jsonl", [{"text": "Hello there"}, "", {"messages": CHATS[0]},
                                       {"prompt": "a ", "completion": "b"}, {"input_ids": [3, 4], "labels": [3, 4]}])
    _, samples, attrs, facts = convert("mixed", ["--tokenizer", paths["chatml"]], [path])
    if not facts:
        return
    with open(os.path.join(paths["chatml"], "tokenizer.json"), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    tokens, trained, offsets = facts["tokens"], facts["trained"], facts["offsets"]
    same("file.datasets", facts["names"], ["offsets", "tokens", "trained"])
    same("file.dtypes", facts["dtypes"], ("<i4", "|u1", "<i8"))
    same("file.no_filters", facts["filters"], [None, None, None])
    check("file.offsets", offsets[0] == 0 and offsets[-1] == len(tokens) == len(trained)
          and bool(np.all(np.diff(offsets) >= 2)), f"offsets {offsets.tolist()}, {len(tokens)} tokens")
    same("file.first_untrained", [s[1][0] for s in samples], [0] * 4)
    same("file.strings_fixed_length", facts["vlen_strings"], [])
    umask = os.umask(0)
    os.umask(umask)
    same("file.mode", oct(os.stat(os.path.join(TMP, "mixed.h5")).st_mode & 0o777), oct(0o666 & ~umask))
    want = {"format": "shardlm-samples", "version": 1, "vocab_size": tok.get_vocab_size(with_added_tokens=True),
            "tokenizer_sha256": digest, "bos_token_id": tok.token_to_id("<s>"),
            "eos_token_id": tok.token_to_id("</s>"), "pad_token_id": tok.token_to_id("<pad>"),
            "source": json.dumps([path]), "n_samples": 4, "n_tokens": len(tokens),
            "n_trained_tokens": int(trained.sum()), "n_skipped_lines": 0,
            "formats": {"text": 1, "completion": 1, "alpaca": 0, "chat": 1, "tokenized": 1}}
    got = dict(attrs, formats=json.loads(attrs.get("formats", "{}")))
    for key in want:
        same(f"file.attr.{key}", got.get(key), want[key])
    same("file.attr.names", sorted(attrs), sorted(want))
    same("file.int64", sorted(k for k, v in attrs.items() if isinstance(v, np.int64)),
         sorted(k for k, v in want.items() if isinstance(v, int)))


def check_inputs(paths, tok):
    """Files and globs in the order given, globs sorted, relative paths made absolute; --format forcing."""
    words = {}
    for name in ("a.jsonl", "parts/p-2.jsonl", "parts/p-1.jsonl", "parts/p-10.jsonl", "z.jsonl"):
        words[name] = "fox " + name.split("/")[-1].split(".")[0]
        write_jsonl(os.path.join("many", name), [{"text": words[name]}])
    order = ["a.jsonl", "parts/p-1.jsonl", "parts/p-10.jsonl", "parts/p-2.jsonl", "z.jsonl"]
    out = os.path.join(TMP, "many.h5")
    proc = run_tool(["--tokenizer", paths["bare"], "-o", out, "a.jsonl", "parts/p-*.jsonl", "z.jsonl"],
                    cwd=os.path.join(TMP, "many"))
    check("inputs.many.exit", proc.returncode == 0, proc.stderr)
    if proc.returncode == 0:
        samples, attrs, _ = read_samples(out)
        same("inputs.many.order", [tok.decode(s[0]) for s in samples], [words[n] for n in order])
        same("inputs.many.source", json.loads(attrs["source"]), [os.path.join(TMP, "many", n) for n in order])
    both = write_jsonl("both.jsonl", [{"text": "lazy dog", "prompt": "Hello ", "completion": "there"}])
    enc = lambda s: tok.encode(s, add_special_tokens=False).ids  # noqa: E731
    _, samples, attrs, _ = convert("forced_auto", ["--tokenizer", paths["bare"]], [both])
    context, target = enc("Hello "), enc("there")
    same("inputs.auto_prefers_completion", samples, [(context + target, [0] * len(context) + [1] * len(target))])
    _, samples, attrs, _ = convert("forced_text", ["--tokenizer", paths["bare"], "--format", "text"], [both])
    same("inputs.format_text", samples, [(enc("lazy dog"), [0] + [1] * (len(enc("lazy dog")) - 1))])
    same("inputs.format_text.counts", json.loads(attrs.get("formats", "{}")).get("text"), 1)


def bad_cases(paths, vocab_size):
    """(name, tool arguments, lines of the input, line number the message names or None for PATH only)."""
    good = {"text": "The quick brown fox."}
    tok = ["--tokenizer", paths["chatml"]]
    user = {"role": "user", "content": "Hello"}
    return [
        ("not_json", tok, [good, '{"text": "a"'], 2),
        ("not_object", tok, [good, "", "[1, 2]"], 3),
        ("not_utf8", tok, [good, b'{"text": "\xff\xfe"}'], 2),
        ("unknown_format", tok, [good, {"foo": 1}], 2),
        ("text_not_string", tok, [good, {"text": 5}], 2),
        ("missing_forced_field", tok + ["--format", "completion"], [{"prompt": "a", "completion": "b"}, good], 2),
        ("empty_completion", tok, [good, {"prompt": "Hello", "completion": ""}], 2),
        ("empty_alpaca_output", tok, [good, {"instruction": "Hello", "output": ""}], 2),
        ("no_assistant", tok, [good, {"messages": [user]}], 2),
        ("bad_role", tok, [good, {"messages": [user, {"role": "robot", "content": "x"}]}], 2),
        ("no_content", tok, [good, {"messages": [user, {"role": "assistant"}]}], 2),
        ("template_raises", ["--tokenizer", paths["llama2"]],
         [good, {"messages": [user, user, {"role": "assistant", "content": "x"}]}], 2),
        ("no_chat_template", ["--tokenizer", paths["bare"]], [good, {"messages": [user, {"role": "assistant",
                                                                                          "content": "x"}]}], 2),
        ("id_too_large", tok, [good, {"input_ids": [1, vocab_size]}], 2),
        ("id_negative", tok, [good, {"input_ids": [1, -1]}], 2),
        ("label_not_id", tok, [good, {"input_ids": [5, 6], "labels": [IGNORE, 7]}], 2),
        ("labels_length", tok, [good, {"input_ids": [5, 6], "labels": [IGNORE]}], 2),
        ("ids_not_ints", tok, [good, {"input_ids": [5, 6.5]}], 2),
        ("no_trained_token", tok, [good, {"input_ids": [5, 6], "labels": [IGNORE, IGNORE]}], 2),
        ("one_token", tok, [good, {"input_ids": [5]}], 2),
        ("empty_text", ["--tokenizer", paths["bare"]], [good, {"text": ""}], 2),
        ("text_without_tokenizer", ["--vocab-size", "500"], [{"input_ids": [5, 6]}, good], 2),
    ]


def expect_failure(name, args, inputs, where):
    """The tool must exit 2 with one stderr line naming WHERE (after the lines --skip-bad lists), writing nothing
    and leaving OUT as it was."""
    out = os.path.join(TMP, "bad_out", name + ".h5")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        f.write("the previous file")
    proc = run_tool(args + ["-o", out] + inputs)
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("skipped ")]
    check(f"bad.{name}", proc.returncode == 2 and len(lines) == 1 and where in lines[0] and "; " in lines[0],
          f"exit status {proc.returncode}, stderr {proc.stderr!r}, want one line with {where!r}")
    with open(out) as f:
        kept = f.read() == "the previous file"
    left = [n for n in os.listdir(os.path.dirname(out)) if n != os.path.basename(out) and name in n]
    check(f"bad.{name}.nothing_written", kept and not left, f"output replaced: {not kept}, left behind: {left}")
    os.unlink(out)


def check_bad(paths, vocab_size):
    all_lines, n_good, n_bad = [], 0, 0
    for name, args, lines, number in bad_cases(paths, vocab_size):
        path = write_jsonl(os.path.join("bad", name + ".jsonl"), lines)
        expect_failure(name, args, [path], f"{path}:{number}: ")
        if args[:2] == ["--tokenizer", paths["chatml"]] and len(args) == 2:
            all_lines += lines
            n_good += sum(1 for line in lines if line == lines[0])
            n_bad += 1
    unreadable = os.path.join(TMP, "bad", "broken_tokenizer")
    os.makedirs(unreadable, exist_ok=True)
    with open(os.path.join(unreadable, "tokenizer.json"), "w") as f:
        f.write('{"not": "a tokenizer"')
    good = write_jsonl("bad/good.jsonl", [{"text": "Hello"}])
    expect_failure("unreadable_tokenizer", ["--tokenizer", unreadable], [good], unreadable)
    missing = os.path.join(TMP, "bad", "no_such_dir")
    expect_failure("missing_tokenizer", ["--tokenizer", missing], [good], missing)
    pattern = os.path.join(TMP, "bad", "nothing-*.jsonl")
    expect_failure("glob_matches_nothing", ["--tokenizer", paths["chatml"]], [good, pattern], pattern)
    absent = os.path.join(TMP, "bad", "absent.jsonl")
    expect_failure("missing_input", ["--tokenizer", paths["chatml"]], [good, absent], absent)
    expect_failure("no_vocab_size", [], [good], "--vocab-size")

    skip = write_jsonl("bad/skip.jsonl", all_lines)
    out = os.path.join(TMP, "skip.h5")
    proc = run_tool(["--tokenizer", paths["chatml"], "--skip-bad", "-o", out, skip])
    check("bad.skip.exit", proc.returncode == 0, proc.stderr)
    if proc.returncode == 0:
        samples, attrs, _ = read_samples(out)
        same("bad.skip.counts", (attrs["n_samples"], attrs["n_skipped_lines"]), (n_good, n_bad))
        check("bad.skip.summary", f"{n_bad} bad lines skipped" in proc.stdout, proc.stdout)
        shown = [line for line in proc.stderr.splitlines() if line.startswith(f"skipped {skip}:")]
        same("bad.skip.listed", len(shown), min(n_bad, 10))
    expect_failure("all_skipped", ["--tokenizer", paths["chatml"], "--skip-bad"],
                   [write_jsonl("bad/all_bad.jsonl", ["[1]", "{}"])], "no sample")


def check_env(paths):
    """Debian's python3 (no tokenizers) re-executes the tool in build/data-venv or build/ref-venv; a copy of the
    tool in a tree without them names tools/deps.sh; a terminal gets the progress bar."""
    good = write_jsonl("env.jsonl", [{"text": "Hello there"}] * 3)
    debian_lacks = subprocess.run(["/usr/bin/python3", "-c", "import tokenizers, jinja2"],
                                  capture_output=True).returncode != 0
    if not debian_lacks:
        note("Debian's python3 imports tokenizers and jinja2: the re-execution is not exercised")
    out = os.path.join(TMP, "env.h5")
    proc = run_tool(["--tokenizer", paths["chatml"], "-o", out, good], python="/usr/bin/python3")
    check("env.reexec", proc.returncode == 0 and os.path.exists(out), proc.stderr)
    fake = os.path.join(TMP, "fakeroot", "tools")
    os.makedirs(fake, exist_ok=True)
    shutil.copy(TOOL, fake)
    env = {k: v for k, v in os.environ.items() if k != "SHARDLM_PREPARE_DATA_VENV"}
    proc = subprocess.run(["/usr/bin/python3", os.path.join(fake, "prepare_data.py"), "--tokenizer", paths["chatml"],
                           "-o", os.path.join(TMP, "fake.h5"), good], capture_output=True, text=True, env=env)
    if debian_lacks:
        check("env.no_venv", proc.returncode == 2 and "tools/deps.sh" in proc.stderr
              and len(proc.stderr.strip().splitlines()) == 1, f"{proc.returncode}: {proc.stderr!r}")
    master, slave = pty.openpty()
    proc = subprocess.run([sys.executable, TOOL, "--tokenizer", paths["chatml"], "-o", out, good, "--overwrite"],
                          stdout=subprocess.PIPE, stderr=slave)  # OUT was written above
    os.close(slave)
    shown = b""
    try:
        while True:
            chunk = os.read(master, 4096)
            if not chunk:
                break
            shown += chunk
    except OSError:  # EIO once the terminal's other end is closed
        pass
    os.close(master)
    check("env.progress_on_tty", proc.returncode == 0 and b"\rprepare_data: 100.0%" in shown
          and b"3 samples" in shown, repr(shown))


def main():
    paths, tok = make_tokenizers()
    check_text_completion_alpaca(paths, tok)
    check_chat(paths, tok)
    check_tokenized()
    check_file(paths, tok)
    check_inputs(paths, tok)
    check_bad(paths, tok.get_vocab_size(with_added_tokens=True))
    check_env(paths)
    same("file.executable", os.access(TOOL, os.X_OK), True)
    leftovers = glob.glob(os.path.join(TMP, "**", ".*.tmp"), recursive=True)
    same("file.no_temporary_files", leftovers, [])


if __name__ == "__main__":
    run_main("prepare_data", main)
