"""Rough edges of issue 32's fault sweep beside tests/t_faults_hf.py (which checks a NaN weight):

  import.nonfinite_inf    an infinity in the weights of model.from_pretrained is an error naming the tensor
                          (exit 2), not a step-1 loss advising a lower learning rate; the model's files unchanged
  tokenizer_sha256.*      a sample file made with another tokenizer of the same size (its recorded
                          tokenizer_sha256 is not that of the model's tokenizer.json): train and eval refuse it
                          in one line naming both files and data.allow_tokenizer_mismatch; with that set, one
                          warning and the run goes on; the same tokenizer is accepted (.same_tokenizer, a control)
  message.line_unknown.*  a JSON file that opens but cannot be read (a link to /proc/self/mem: EIO), or an index
                          that is a directory: one error line naming it and the reason, without "line -1"
  tokenizer.dup.*         ids given twice in a tokenizer.json, each as Python's tokenizers (build/ref-venv) takes
                          it: two vocabulary strings with one id, two added tokens with one id, one added token
                          twice with two ids, an added token's id that a vocabulary token has, an added token
                          whose content is a vocabulary token: `shardlm tokenize` gives tokenizers' ids and one
                          warning naming the id and the file (tokenizers warns too; or decodes at random)
  tokenizer.added_id.*    an added token's "id" missing, negative or a string: tokenizers refuses it, and so does
                          shardlm, in one line naming the token and the file
  ids.*                   a token id of 2e9 or more: in tokenizer.json's vocabulary (one line at once, not 8 GB
                          and an out-of-memory error), in generate's {"ids"} (4e9 was "a negative id"), in
                          tokenize --decode, in prepare_data's input_ids (2**70 was a traceback): each names the
                          id, its position and the vocabulary
"""
import hashlib
import json
import os
import shutil
import struct
import subprocess

import harness
from harness import BIN, ENV, check, write_shard

import numpy as np

TMP = harness.scratch_dir("faults_rough")
V, T = 64, 16
DATA = os.path.join(TMP, "train.bin")
write_shard(DATA, np.random.default_rng(32).integers(0, V, size=64 * T + 1))
MODEL = {"n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": T, "vocab_size": V}


def config(name, model, **top):
    cfg = {"model": model, "data": {"train": DATA, "seq_len": T},
           "train": {"steps": 1, "eval_every": 0, "sample_tokens": 0}, "train_micro_batch_size_per_gpu": 2}
    cfg.update(top)
    path = os.path.join(TMP, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def run(args):
    p = subprocess.run([BIN] + args, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    return p.returncode, p.stdout


def tree_sums(root):
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            with open(os.path.join(d, n), "rb") as f:
                out[os.path.join(d, n)] = hashlib.sha256(f.read()).hexdigest()
    return out


def poke(path, tensor, value):
    """Writes VALUE (fp32) over element 3 of TENSOR in the safetensors file PATH."""
    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        assert header[tensor]["dtype"] == "F32", header[tensor]
        f.seek(8 + n + header[tensor]["data_offsets"][0] + 3 * 4)
        f.write(struct.pack("<f", value))


def nonfinite():
    ck, base = os.path.join(TMP, "ck"), os.path.join(TMP, "base")
    rc, out = run(["train", config("pre", MODEL, checkpoint={"dir": ck}), "--quiet"])
    rc2, out2 = run(["export", ck, base])
    if rc or rc2:
        check("import.nonfinite_inf", False, f"setup: train exit {rc}, export exit {rc2}: {out[-300:]} {out2[-300:]}")
        return
    with open(os.path.join(base, "model.safetensors"), "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        names = [k for k in json.loads(f.read(n)) if k != "__metadata__"]
    tensor = next((k for k in names if k.endswith("mlp.c_fc.weight")), names[0])
    for name, value in (("import.nonfinite_inf", float("-inf")),):
        d = os.path.join(TMP, name)
        shutil.copytree(base, d)
        poke(os.path.join(d, "model.safetensors"), tensor, value)
        before = tree_sums(d)
        rc, out = run(["train", config(name, {"from_pretrained": d}), "--quiet"])
        line = out.strip().splitlines()[-1] if out.strip() else ""
        check(name, rc == 2 and tensor in line and "NaN or Inf" in line
              and tree_sums(d) == before, f"exit {rc}: {out[-400:]}")


# 64 one-character tokens: a tokenizer.json of exactly V ids, written here (no tokenizers library needed)
CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ."
assert len(CHARS) == V


def write_tokenizer(path, chars):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
                   "pre_tokenizer": None, "post_processor": None, "decoder": None,
                   "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                             "vocab": {c: i for i, c in enumerate(chars)}, "merges": []}}, f)


PREPARE_DATA = os.environ.get("SHARDLM_PREPARE_DATA") or os.path.join(harness.ROOT, "tools", "prepare_data.py")


def prepare(jobs):
    """Runs tools/prepare_data.py --tokenizer TOK -o OUT JSONL for each (OUT, TOK, JSONL) at once; their
    (exit status, output)."""
    procs = [subprocess.Popen(["/usr/bin/python3", PREPARE_DATA, "--tokenizer", tok, "-o", out, jsonl], env=ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for out, tok, jsonl in jobs]
    return [(p.wait(timeout=300), p.stdout.read()) for p in procs]


def tokenizer_checksum():
    """Item tokenizer_sha256 of issue 32: another tokenizer of the same size is caught by its checksum."""
    """Returns the model directory (a tiny GPT-2 with a tokenizer.json) or None."""
    ck, model = os.path.join(TMP, "tok_ck"), os.path.join(TMP, "tok_model")
    rc, out = run(["train", config("tok_pre", MODEL, checkpoint={"dir": ck}), "--quiet"])
    rc2, out2 = run(["export", ck, model])
    write_tokenizer(os.path.join(model, "tokenizer.json"), CHARS)
    other = os.path.join(TMP, "tok_other")
    write_tokenizer(os.path.join(other, "tokenizer.json"), CHARS[1::-1] + CHARS[2:])  # 'a' and 'b' swapped
    jsonl = os.path.join(TMP, "tok.jsonl")
    with open(jsonl, "w") as f:
        for k in range(12):
            f.write(json.dumps({"text": CHARS[k:k + 12]}) + "\n")
    mine, theirs = os.path.join(TMP, "tok_mine.h5"), os.path.join(TMP, "tok_other.h5")
    (rc3, out3), (rc4, out4) = prepare([(mine, model, jsonl), (theirs, other, jsonl)])
    if rc or rc2 or rc3 or rc4:
        check("tokenizer_sha256.setup", False, f"exits {rc}, {rc2}, {rc3}, {rc4}: {out2[-300:]} {out3[-300:]} "
              f"{out4[-300:]}")
        return None
    tok_json = os.path.join(model, "tokenizer.json")

    def train(data, *sets):
        args = ["train", config("tok_" + os.path.basename(data), {"from_pretrained": model}), "--quiet",
                "--set", f"data.train={data}"]
        return run(args + [a for kv in sets for a in ("--set", kv)])

    def errors(out):
        return [line for line in out.splitlines() if "error" in line]

    def state():
        with open(theirs, "rb") as f:
            return harness.files_state(model), hashlib.sha256(f.read()).hexdigest()
    before = state()
    for name, (rc, out) in (("train", train(theirs)), ("eval", run(["eval", model, "--data", theirs]))):
        lines = errors(out)
        same = state() == before
        check(f"tokenizer_sha256.{name}_refused", rc == 2 and len(lines) == 1 and theirs in lines[0] and same
              and tok_json in lines[0] and "data.allow_tokenizer_mismatch" in lines[0],
              f"exit {rc}; files unchanged {same}: {out[-400:]}")
    rc, out = train(mine)
    check("tokenizer_sha256.same_tokenizer", rc == 0, f"exit {rc}: {out[-400:]}")
    for name, (rc, out) in (("train", train(theirs, "data.allow_tokenizer_mismatch=true")),
                            ("eval", run(["eval", model, "--data", theirs, "--set",
                                          "data.allow_tokenizer_mismatch=true"]))):
        warned = [line for line in out.splitlines() if "warning" in line and "tokenizer" in line]
        check(f"tokenizer_sha256.{name}_override", rc == 0 and len(warned) == 1 and tok_json in warned[0],
              f"exit {rc}; warnings {warned}: {out[-400:]}")
    return model


def line_unknown(model):
    """Messages that said "(line -1)" for a JSON file jansson could not read: the reason alone now."""
    cases = []
    for tag, name in (("config_json", "config.json"), ("tokenizer_json", "tokenizer.json"),
                      ("tokenizer_config", "tokenizer_config.json"), ("index_dir", "model.safetensors.index.json")):
        d = os.path.join(TMP, "unreadable_" + tag)
        shutil.copytree(model, d)
        path = os.path.join(d, name)
        if tag == "index_dir":
            os.remove(os.path.join(d, "model.safetensors"))
            os.mkdir(path)
        else:
            if os.path.exists(path):
                os.remove(path)
            os.symlink("/proc/self/mem", path)  # a regular file that no read can get: EIO
        args = (["tokenize", os.path.join(d, "tokenizer.json"), "--decode", "-"] if tag.startswith("tokenizer")
                else ["eval", d, "--data", DATA])
        cases.append((tag, path, args))
    for tag, path, args in cases:
        p = subprocess.run([BIN] + args, env=ENV, input="[1]", stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=300)
        lines = [line for line in p.stdout.splitlines() if "error" in line]
        check(f"message.line_unknown.{tag}", p.returncode == 2 and len(lines) == 1 and path in lines[0]
              and "line -1" not in lines[0] and ("Input/output error" in lines[0] or "Is a directory" in lines[0]),
              f"exit {p.returncode}: {p.stdout[-400:]}")


REF_PY = os.path.join(harness.ROOT, "build", "ref-venv", "bin", "python")
# Python's tokenizers on each (tokenizer.json, text): its ids, or the reason it refuses the file
REF_ENCODE = """
import json, sys
from tokenizers import Tokenizer
out = []
for path, text in json.load(sys.stdin):
    try:
        out.append(Tokenizer.from_file(path).encode(text).ids)
    except Exception as e:
        out.append(str(e))
print(json.dumps(out))
"""


def added(content, token_id):
    return {"id": token_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def tokenizer_duplicates():
    """Item "duplicate token ids in a tokenizer" of issue 32, against tokenizers itself."""
    def variant(name, vocab_extra=None, tokens=()):
        path = os.path.join(TMP, "dup", name + ".json")
        write_tokenizer(path, CHARS)
        with open(path) as f:
            doc = json.load(f)
        doc["model"]["vocab"].update(vocab_extra or {})
        doc["added_tokens"] = list(tokens)
        with open(path, "w") as f:
            json.dump(doc, f)
        return path
    # name -> (tokenizer.json, what the warning must name)
    dups = {"vocab_two_strings": (variant("vocab_two_strings", {"~": 3}), "id 3"),
            "added_same_id": (variant("added_same_id", tokens=[added("<s>", V), added("</s>", V)]), "says id 64"),
            "added_twice": (variant("added_twice", tokens=[added("<s>", V), added("<s>", V + 1)]), "says id 65"),
            "added_vocab_id": (variant("added_vocab_id", tokens=[added("<s>", 3)]), "says id 3"),
            "added_vocab_text": (variant("added_vocab_text", tokens=[added("a", V)]), "says id 64")}
    bad = {"missing": variant("id_missing", tokens=[{k: v for k, v in added("<s>", 0).items() if k != "id"}]),
           "negative": variant("id_negative", tokens=[added("<s>", -1)]),
           "string": variant("id_string", tokens=[added("<s>", "64")])}
    text = "ab~cd<s>e</s>a"
    cases = [(path, text) for path, _ in dups.values()] + [(path, text) for path in bad.values()]
    ref = subprocess.run([REF_PY, "-c", REF_ENCODE], input=json.dumps(cases), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, timeout=300)
    if ref.returncode:
        check("tokenizer.dup.reference", False, f"{REF_PY}: exit {ref.returncode}: {ref.stderr[-300:]}")
        return
    want = json.loads(ref.stdout)
    for (name, (path, words)), ids in zip(dups.items(), want):
        p = subprocess.run([BIN, "tokenize", path, "-"], env=ENV, input=text, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=300)
        warned = [line for line in p.stderr.splitlines() if "warning" in line]
        got = p.stdout.strip()
        check(f"tokenizer.dup.{name}", p.returncode == 0 and isinstance(ids, list) and got == json.dumps(ids)
              and len(warned) == 1 and path in warned[0] and words in warned[0],
              f"exit {p.returncode}; ids {got} (tokenizers: {ids}); warnings {warned}: {p.stderr[-300:]}")
    for (name, path), why in zip(bad.items(), want[len(dups):]):
        rc, out = run(["tokenize", path, "--decode", "/dev/null"])
        lines = [line for line in out.splitlines() if "error" in line]
        check(f"tokenizer.added_id.{name}", isinstance(why, str) and rc == 2 and len(lines) == 1
              and path in lines[0] and "added_tokens[0]" in lines[0] and '"id"' in lines[0],
              f"tokenizers: {why}; exit {rc}: {out[-300:]}")


def huge_ids(model):
    """Item "a token id of 2e9" of issue 32: every place that takes token ids names the id, its position and
    the vocabulary."""
    big = 2_000_000_000
    path = os.path.join(TMP, "dup", "vocab_2e9.json")
    write_tokenizer(path, CHARS)
    with open(path) as f:
        doc = json.load(f)
    doc["model"]["vocab"]["~"] = big
    with open(path, "w") as f:
        json.dump(doc, f)
    rc, out = run(["tokenize", path, "--decode", "/dev/null"])
    lines = [line for line in out.splitlines() if "error" in line]
    check("ids.tokenizer_vocab_2e9", rc == 2 and len(lines) == 1 and path in lines[0] and str(big) in lines[0]
          and "'~'" in lines[0], f"exit {rc}: {out[-300:]}")
    for name, ids, words in (("generate_4e9", [1, 2 * big], ["4000000000", '"ids"[1]']),
                             ("generate_2e9", [1, 2, big], [str(big), "position 2", f"vocabulary of {V}"])):
        prompts = os.path.join(TMP, name + ".jsonl")
        with open(prompts, "w") as f:
            f.write(json.dumps({"ids": ids}) + "\n")
        rc, out = run(["generate", model, "--prompt-file", prompts, "--max-new-tokens", "1"])
        lines = [line for line in out.splitlines() if "error" in line]
        check(f"ids.{name}", rc == 2 and len(lines) == 1 and all(w in lines[0] for w in words) and
              "negative" not in lines[0], f"exit {rc}: {out[-300:]}")
    p = subprocess.run([BIN, "tokenize", os.path.join(model, "tokenizer.json"), "--decode"], env=ENV,
                       input=json.dumps([1, big]), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=300)
    check("ids.decode_2e9", p.returncode == 2 and str(big) in p.stdout and "element 1" in p.stdout
          and f"{V} tokens" in p.stdout, f"exit {p.returncode}: {p.stdout[-300:]}")
    jsonl = os.path.join(TMP, "huge_ids.jsonl")
    with open(jsonl, "w") as f:
        f.write(json.dumps({"input_ids": [1, 2, 2 ** 70]}) + "\n")
    p = subprocess.run(["/usr/bin/python3", PREPARE_DATA, "--vocab-size", str(V), "-o", os.path.join(TMP, "huge.h5"),
                        jsonl], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    check("ids.prepare_2e70", p.returncode == 2 and len(lines) == 1 and str(2 ** 70) in lines[0]
          and "position 2" in lines[0] and f"size {V}" in lines[0], f"exit {p.returncode}: {p.stdout[-300:]}")


def main():
    nonfinite()
    model = tokenizer_checksum()
    if model:
        line_unknown(model)
        huge_ids(model)
    tokenizer_duplicates()


if __name__ == "__main__":
    harness.run_main("t_faults_rough", main)
