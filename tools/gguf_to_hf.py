#!/usr/bin/env python3
"""gguf_to_hf — a llama.cpp GGUF file to a Hugging Face model directory.

    tools/gguf_to_hf.py [--dtype float32|float16] [--overwrite] MODEL.gguf OUT_DIR

Reads the GGUF file with the `gguf` package (llama.cpp's own reader and
dequantizer) and writes what transformers' LlamaForCausalLM.from_pretrained and
shardlm's model.from_pretrained read:

  model.safetensors        every tensor under transformers' name, dequantized
                           (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and
                           the K-quants the package dequantizes) and stored as
                           --dtype (float32 by default: a quantized value is
                           d*q+m in fp32, which float32 holds exactly). The
                           rows of q_proj and k_proj are put back in
                           transformers' rotary order: llama.cpp's converter
                           interleaves the two halves of each head.
  config.json              from the GGUF metadata (llama.*): sizes, heads,
                           rms_norm_eps, rope_theta, context length, and
                           tie_word_embeddings when there is no output tensor
  tokenizer.json           a byte-level BPE tokenizer built with `tokenizers`
                           from tokenizer.ggml.tokens / merges / token_type and
                           the pre-tokenizer named by tokenizer.ggml.pre
  tokenizer_config.json    the chat template, special tokens, add_bos_token
  special_tokens_map.json, generation_config.json

Only the llama architecture with a "gpt2" (byte-level BPE) tokenizer is
converted; anything else (another architecture, a SentencePiece "llama"
tokenizer, a pre-tokenizer it does not know, a quant type the package cannot
dequantize, a file that is not GGUF or is truncated) ends with one line on
stderr and exit status 2, and nothing is written: the directory is assembled
under a temporary name beside OUT_DIR and renamed into place at the end.
An OUT_DIR that exists and is not empty is refused unless --overwrite; one
that holds the GGUF file (at any depth, through any link) or is a shardlm
checkpoint directory (latest, step_N.h5) is refused even with it.
"""
import argparse
import json
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXIT_BAD_INPUT = 2
sys.path.insert(0, os.path.join(ROOT, "tools"))
from toolenv import use_venv  # noqa: E402
from toolexit import fault_point, run_removing_on_signal, uninterrupted  # noqa: E402

TEMPORARY = []  # the directory being assembled, while it is (toolexit removes it on a signal)


def fail(message):
    print("gguf_to_hf: " + message.replace("\n", " "), file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


use_venv("gguf_to_hf", __file__, ("gguf", "safetensors", "tokenizers"))

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import safetensors.numpy  # noqa: E402
import tokenizers  # noqa: E402
from tokenizers import Regex, decoders, pre_tokenizers, processors  # noqa: E402

# GGUF tensor names (blk.N.*) to transformers' LlamaForCausalLM names.
GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                "output_norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight"}
BLOCK_NAMES = {"attn_norm.weight": "input_layernorm.weight",
               "ffn_norm.weight": "post_attention_layernorm.weight",
               "attn_q.weight": "self_attn.q_proj.weight",
               "attn_k.weight": "self_attn.k_proj.weight",
               "attn_v.weight": "self_attn.v_proj.weight",
               "attn_output.weight": "self_attn.o_proj.weight",
               "ffn_gate.weight": "mlp.gate_proj.weight",
               "ffn_up.weight": "mlp.up_proj.weight",
               "ffn_down.weight": "mlp.down_proj.weight"}

# The split patterns of the byte-level BPE families, by llama.cpp's
# tokenizer.ggml.pre name (the same patterns the families' tokenizer.json use).
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def byte_level(use_regex):
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)


def split_then_bytes(pattern):
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                                    byte_level(False)])


# pre name -> (pre-tokenizer factory, NFC normalizer or not)
PRE_TOKENIZERS = {
    "default": (lambda: byte_level(True), False),
    "gpt-2": (lambda: byte_level(True), False),
    "smollm": (lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level(True)]),
               False),
    "starcoder": (lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                   byte_level(True)]), False),
    "llama-bpe": (lambda: split_then_bytes(LLAMA3_SPLIT), False),
    "llama3": (lambda: split_then_bytes(LLAMA3_SPLIT), False),
    "qwen2": (lambda: split_then_bytes(QWEN2_SPLIT), True),
}

TOKEN_CONTROL, TOKEN_USER_DEFINED = 3, 4


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def save_tokenizer(tok, path):
    """tokenizer.json as every `tokenizers` release reads it: 0.20 and later write BPE merges as pairs, which
    0.19 (transformers 4.x's pin) cannot read; where no piece of a merge holds a space (byte-level BPE's never
    do), the pairs are written as the "a b" strings both read, else left as pairs."""
    doc = json.loads(tok.to_str())
    merges = doc.get("model", {}).get("merges")
    if isinstance(merges, list) and all(isinstance(m, list) and len(m) == 2 and " " not in m[0] + m[1]
                                        for m in merges):
        doc["model"]["merges"] = [f"{a} {b}" for a, b in merges]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)

def read_gguf(path):
    if not os.path.isfile(path):
        fail(f"'{path}' is not a regular file; give the path of a .gguf file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        fail(f"'{path}' is not a GGUF file (it starts with {magic!r}, not b'GGUF'); give a llama.cpp .gguf file")
    try:
        return gguf.GGUFReader(path, "r")
    except Exception as e:  # the reader raises ValueError/IndexError/... on a damaged or truncated file
        fail(f"cannot read '{path}' ({type(e).__name__}: {e}); the file is damaged or truncated: download it again")


def model_config(r, path, tied):
    arch = field(r, "general.architecture")
    if arch != "llama":
        fail(f"'{path}' holds a '{arch}' model; only the llama architecture (LlamaForCausalLM) is converted")

    def need(key):
        v = field(r, f"llama.{key}")
        if v is None:
            fail(f"'{path}' has no llama.{key} in its metadata; the file is not a complete llama model")
        return v
    n_embd, n_head = int(need("embedding_length")), int(need("attention.head_count"))
    n_kv = int(field(r, "llama.attention.head_count_kv", n_head))
    head_dim = n_embd // n_head
    rot = field(r, "llama.rope.dimension_count")
    if rot is not None and int(rot) != head_dim:
        fail(f"'{path}': rotary dimension {rot} is not the head size {head_dim} (partial rotary); not supported")
    if field(r, "llama.rope.scaling.type") not in (None, "none"):
        fail(f"'{path}': rope scaling '{field(r, 'llama.rope.scaling.type')}' is not supported")
    vocab = len(r.fields["tokenizer.ggml.tokens"].data) if "tokenizer.ggml.tokens" in r.fields else None
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": n_embd,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "max_position_embeddings": int(field(r, "llama.context_length", 2048)),
        "rms_norm_eps": float(np.float32(field(r, "llama.attention.layer_norm_rms_epsilon", 1e-6))),
        "rope_theta": float(field(r, "llama.rope.freq_base", 10000.0)),
        "vocab_size": int(field(r, "llama.vocab_size", vocab or 0)),
        "tie_word_embeddings": tied,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "use_cache": True,
    }
    for key, name in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id")):
        v = field(r, f"tokenizer.ggml.{key}")
        if v is not None:
            cfg[name] = int(v)
    return cfg


def unpermute(w, n_head):
    """Undoes llama.cpp's rotary permutation of q/k rows: it stores each head's
    rows as (dim/2, 2) pairs where transformers keeps (2, dim/2) halves."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_tensors(r, path, cfg, dtype):
    out = {}
    for t in r.tensors:
        name = GLOBAL_NAMES.get(t.name)
        if name is None and t.name.startswith("blk."):
            _, layer, rest = t.name.split(".", 2)
            if rest in BLOCK_NAMES and layer.isdigit() and int(layer) < cfg["num_hidden_layers"]:
                name = f"model.layers.{int(layer)}.{BLOCK_NAMES[rest]}"
        if name is None:
            if t.name == "rope_freqs.weight":
                fail(f"'{path}' carries rope_freqs (scaled rotary frequencies); not supported")
            fail(f"'{path}': tensor '{t.name}' has no place in a LlamaForCausalLM; not converted")
        shape = tuple(int(d) for d in reversed(t.shape))
        try:
            w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        except NotImplementedError:
            fail(f"'{path}': tensor '{t.name}' is {t.tensor_type.name}, which the gguf package cannot dequantize; "
                 f"convert from a file quantized otherwise (F32, F16, BF16, Q8_0, Q4_0, Q4_1, K-quants)")
        except (ValueError, IndexError) as e:
            fail(f"'{path}': tensor '{t.name}' cannot be read ({e}); the file is damaged or truncated")
        if not np.all(np.isfinite(w)):
            fail(f"'{path}': tensor '{t.name}' holds NaN or Inf values; the file is damaged")
        if name.endswith("q_proj.weight"):
            w = unpermute(w, cfg["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            w = unpermute(w, cfg["num_key_value_heads"])
        out[name] = np.ascontiguousarray(w.astype(dtype))
    want = {"model.embed_tokens.weight", "model.norm.weight"} | {
        f"model.layers.{i}.{n}" for i in range(cfg["num_hidden_layers"]) for n in BLOCK_NAMES.values()}
    missing = sorted(want - out.keys())
    if missing:
        fail(f"'{path}' lacks {len(missing)} tensor(s) of the model, first {missing[0]}; the file is incomplete")
    return out


def build_tokenizer(r, path):
    kind = field(r, "tokenizer.ggml.model")
    if kind != "gpt2":
        fail(f"'{path}' has a '{kind}' tokenizer; only byte-level BPE ('gpt2' in GGUF) is converted")
    pre = field(r, "tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        fail(f"'{path}': pre-tokenizer '{pre}' is not known here (known: {', '.join(sorted(PRE_TOKENIZERS))})")
    tokens = field(r, "tokenizer.ggml.tokens")
    merges = field(r, "tokenizer.ggml.merges") or []
    types = field(r, "tokenizer.ggml.token_type") or [1] * len(tokens)
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        fail(f"'{path}': the token list repeats a token; the tokenizer cannot be rebuilt")
    pairs = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if not sep:
            fail(f"'{path}': merge '{m}' is not two tokens")
        pairs.append((a, b))
    make_pre, nfc = PRE_TOKENIZERS[pre]
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False))
    if nfc:
        tok.normalizer = tokenizers.normalizers.NFC()
    tok.pre_tokenizer = make_pre()
    tok.decoder = decoders.ByteLevel()
    specials = [tokenizers.AddedToken(t, special=True, normalized=False)
                for t, ty in zip(tokens, types) if ty == TOKEN_CONTROL]
    user = [tokenizers.AddedToken(t, special=False, normalized=False)
            for t, ty in zip(tokens, types) if ty == TOKEN_USER_DEFINED]
    tok.add_special_tokens(specials)
    tok.add_tokens(user)
    add_bos = bool(field(r, "tokenizer.ggml.add_bos_token", False))
    bos_id = field(r, "tokenizer.ggml.bos_token_id")
    if add_bos and bos_id is not None:
        bos = tokens[int(bos_id)]
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                           special_tokens=[(bos, int(bos_id))])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok, tokens, types, add_bos


def tokenizer_files(r, tokens, types, add_bos, context):
    def tok_name(key):
        v = field(r, f"tokenizer.ggml.{key}")
        return tokens[int(v)] if v is not None and 0 <= int(v) < len(tokens) else None
    special = {k: tok_name(g) for k, g in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                                           ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id"))}
    special = {k: v for k, v in special.items() if v is not None}
    decoder = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                        "special": ty == TOKEN_CONTROL}
               for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED)}
    tcfg = dict(special, add_bos_token=add_bos, add_eos_token=False, clean_up_tokenization_spaces=False,
                model_max_length=context, tokenizer_class="PreTrainedTokenizerFast", added_tokens_decoder=decoder)
    template = field(r, "tokenizer.chat_template")
    if template:
        tcfg["chat_template"] = template
    return tcfg, special


def checkpoint_files(d):
    """The names in directory D that a shardlm checkpoint directory holds (latest, step_N.h5, its lock)."""
    return sorted(n for n in os.listdir(d) if n in ("latest", ".shardlm.lock") or
                  (n.startswith("step_") and n.endswith((".h5", ".h5.tmp"))))


def refuse_output_dir(out, gguf_path):
    """OUT is replaced as a whole (--overwrite removes it): never when it holds the GGUF file being converted, at
    any depth or through a link (its removal would delete the input), nor when it is a shardlm checkpoint
    directory (its step files and latest would go), --overwrite or not."""
    if not os.path.isdir(out):
        return
    real_out, real_in = os.path.realpath(out), os.path.realpath(gguf_path)
    if os.path.commonpath([real_out, real_in]) == real_out:
        fail(f"'{out}' holds the GGUF file being converted ('{gguf_path}'); replacing it would delete the input: "
             "name another directory")
    ckpt = checkpoint_files(out)
    if ckpt:
        fail(f"'{out}' is a shardlm checkpoint directory (it holds {', '.join(ckpt[:3])}); it is never replaced, "
             "even with --overwrite: name another directory")


def main():
    ap = argparse.ArgumentParser(description="a llama.cpp GGUF file to a Hugging Face model directory")
    ap.add_argument("gguf")
    ap.add_argument("out")
    ap.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    ap.add_argument("--overwrite", action="store_true", help="replace OUT_DIR when it exists and is not empty")
    a = ap.parse_args()
    out = a.out.rstrip("/") or "/"
    if os.path.lexists(out) and not os.path.isdir(out):
        fail(f"'{out}' exists and is not a directory; name a new directory")
    refuse_output_dir(out, a.gguf)
    if os.path.isdir(out) and os.listdir(out) and not a.overwrite:
        fail(f"'{out}' exists and is not empty; name a new directory or give --overwrite")
    r = read_gguf(a.gguf)
    fault_point("read")
    names = {t.name for t in r.tensors}
    tied = "output.weight" not in names
    cfg = model_config(r, a.gguf, tied)
    tok, tokens, types, add_bos = build_tokenizer(r, a.gguf)
    if cfg["vocab_size"] != len(tokens):
        fail(f"'{a.gguf}': vocab_size {cfg['vocab_size']} differs from the {len(tokens)} tokens of its tokenizer")
    tensors = read_tensors(r, a.gguf, cfg, np.float32 if a.dtype == "float32" else np.float16)
    if tensors["model.embed_tokens.weight"].shape != (cfg["vocab_size"], cfg["hidden_size"]):
        fail(f"'{a.gguf}': token_embd is {tensors['model.embed_tokens.weight'].shape}, not "
             f"(vocab_size, hidden_size) = ({cfg['vocab_size']}, {cfg['hidden_size']})")
    cfg["torch_dtype"] = a.dtype
    cfg["transformers_version"] = "4.40.2"
    tcfg, special = tokenizer_files(r, tokens, types, add_bos, cfg["max_position_embeddings"])
    gen = {"bos_token_id": cfg.get("bos_token_id"), "eos_token_id": cfg.get("eos_token_id")}
    pad = field(r, "tokenizer.ggml.padding_token_id")
    if pad is not None:
        gen["pad_token_id"] = int(pad)
    gen = {k: v for k, v in gen.items() if v is not None}

    parent = os.path.dirname(os.path.abspath(out))
    tmp = os.path.join(parent, f".{os.path.basename(os.path.abspath(out))}.gguf_to_hf.{os.getpid()}")
    TEMPORARY.append(tmp)  # removed should a signal stop the conversion (toolexit)
    try:
        os.makedirs(tmp)
        safetensors.numpy.save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        os.chmod(os.path.join(tmp, "model.safetensors"), 0o644)
        fault_point("write")
        save_tokenizer(tok, os.path.join(tmp, "tokenizer.json"))
        for name, doc in (("config.json", cfg), ("tokenizer_config.json", tcfg),
                          ("special_tokens_map.json", special), ("generation_config.json", gen)):
            with open(os.path.join(tmp, name), "w") as f:
                json.dump(doc, f, indent=2, ensure_ascii=False)
                f.write("\n")
        with uninterrupted():
            if os.path.isdir(out):
                shutil.rmtree(out)
            os.rename(tmp, out)
            TEMPORARY.remove(tmp)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        fail(f"cannot write '{out}': {e.strerror or e}; free space or name another directory")
    n = sum(v.size for v in tensors.values())
    print(f"gguf_to_hf: {a.gguf} -> {out}: {len(tensors)} tensors, {n} parameters ({a.dtype}), "
          f"{cfg['num_hidden_layers']} layers, vocab {cfg['vocab_size']}, tied embeddings {tied}", file=sys.stderr)


if __name__ == "__main__":
    run_removing_on_signal("gguf_to_hf", main, TEMPORARY)
