#!/usr/bin/env python3
"""t_tokenizer — shardlm's tokenizer.json reader (src/tokenizer/tokenizer*.c, through
`shardlm tokenize`) against Python's tokenizers 0.23.3, what transformers 5.25
runs (build/ref5-venv; this script re-executes itself there; issue 44 moved it
from 0.19). Nothing is downloaded: the tokenizers are trained here on the
repository's own sources and documentation.

Tokenizers:
  gpt2       byte-level BPE (ByteLevel pre-tokenizer, post-processor and
             decoder), vocabulary 2000, special tokens <|endoftext|>, <mask>
             (lstrip) and [SEP] (rstrip), added tokens ZeRO (single_word,
             normalized) and ckpt_ (not normalized)
             (its merges as ["a", "b"] pairs, as tokenizers >= 0.20 writes them)
  gpt2_strings the same with its merges written as "a b" strings (the format
             of tokenizers < 0.20 and of older released files: compared with
             gpt2's ids)
  llama3     Split on Llama 3's regex + ByteLevel(use_regex=False),
             ignore_merges with whole words in the vocabulary that the merges
             would cut (llama3_merged: the same without ignore_merges, whose
             ids must differ, and without a decoder), TemplateProcessing
             <|begin_of_text|> $A inside a post-processor Sequence, Llama 3's
             special tokens
  llama2     Prepend "▁" + Replace " " -> "▁", no pre-tokenizer (the whole
             text is one word for BPE), byte_fallback with <0x00>..<0xFF>,
             unk <unk>, fuse_unk, decoder Replace + ByteFallback + Fuse +
             Strip, TemplateProcessing <s> $A, added tokens ZeRO (normalized:
             matched as "▁ZeRO", and decoded from "▁ZeRO" as tokenizers >= 0.20
             does: "<s> ZeRO", where 0.19 gave "<s>ZeRO") and ckpt_; llama2_unk: the same without
             byte_fallback (unknown characters become fused <unk>)
  metaspace  the llama2 vocabulary with Metaspace(prepend_scheme "first",
             split false) and no normalizer; metaspace_split: Metaspace
             (prepend_scheme "always", split true) with the Metaspace decoder
  splits_*   the gpt2 vocabulary behind Split pre-tokenizers with every
             behavior, invert, a String pattern, and patterns where Oniguruma
             and PCRE2 differ (\\w, \\h, \\s, \\uHHHH, $ at every line end,
             . matching a newline only under Ruby's (?m), empty matches, an
             empty lookahead match)
  smollm2    the gpt2 vocabulary behind SmolLM2's (and StarCoder's)
             Digits(individual_digits=true) + ByteLevel; digits_contiguous:
             Digits(individual_digits=false)
  qwen2      the gpt2 vocabulary behind Qwen2's NFC normalizer and Split on
             its regex + ByteLevel(use_regex=false)
  whitespace, whitespace_split, punctuation_<behavior>  those pre-tokenizers
  norm_*     NFD, NFKC, NFKD, Lowercase, Strip (both ends, then Prepend; left
             only) normalizers
  gemma      llama2's vocabulary with Gemma's normalizer (Replace without
             Prepend), decoder (Replace + ByteFallback + Fuse, no Strip) and
             the special <start_of_turn>, <end_of_turn> (gemma.differs_from_llama2)
  qwen2_file Qwen2/Qwen2.5's tokenizer.json as released (tests/hf_tokenizers.py):
             NFC, Split on its regex + ByteLevel, ByteLevel post-processor
             and decoder, the model's affixes "" (not null), ChatML's
             special tokens and the non-special <tool_call>
  phi3_file  Phi-3's (Llama 2's SentencePiece-converted layout: Prepend +
             Replace, byte_fallback, fuse_unk, <s> $A) with its chat tokens
             after the vocabulary, rstrip true (the newline after <|user|>
             is part of the token); both built with tokenizers' own API
  (Mistral's shape, Metaspace(prepend_scheme "first", split false) over a
  byte_fallback BPE, is metaspace above.) Each of these is also checked to
  give other ids than gpt2's on the multilingual text (*.differs_from_gpt2),
  so that a component left out would show. smollm2 and qwen2 run every check
  on 12 of the src files, the docs, the multilingual text and the edge cases;
  the others compare ids on 4 src files, the multilingual text and the edge
  cases; qwen2_file and phi3_file run every check (ids, decode, stream) on
  those.

Checks, for each tokenizer:
  *.encode.{src,docs,multilingual,edge}[.no_special]
      ids of every file of src/, every *.md of the repository, a text in many
      scripts (CJK, emoji with ZWJ and skin tones, combining marks, Arabic,
      Hebrew, long digit runs, runs of spaces, tabs, newlines and CRLF, the
      special tokens) and short edge cases (empty, spaces only, a lone
      special token ...) equal tokenizers' encode(text).ids, with and without
      add_special_tokens
  *.decode.*  our decode of those ids equals tokenizers' decode (with and
              without skip_special_tokens), and equals the text where
              tokenizers' does; random id sequences decode as tokenizers does
  *.stream.*  the streaming decoder's pieces (shardlm tokenize --decode
              --stream), joined, equal what decode(ids) adds to decoding the
              first 0, 3 or 50 ids (the context)
  llama3.ignore_merges_matters  the ids with and without ignore_merges differ
classes.*  Digits and \\w on characters where PCRE2's classes and Oniguruma's differ
newer_unicode.*  code points newer than PCRE2 10.42's Unicode 14 tables (Unicode 15's
            emoji joined by ZWJ under \\p{So}+, Cyrillic Extended-D, Kawi, Kaktovik
            numerals; Unicode 16's Cyrillic Extended-C, Arabic Extended-B, Balinese, Garay,
            outlined digits and emoji) under Llama 3's pattern, \\p{So}+, \\w+, Digits,
            Punctuation and \\p{Alphabetic}+: exactly the recorded texts differ from
            tokenizers 0.23 (Other_Alphabetic marks, Punctuation's Unicode 8);
            newer_unicode.table_generated: src/tokenizer/unicode_newer.h is what
            tools/gen_unicode_newer.py makes of the pinned unicodedata2 16.0.0
unicode_16.*  every run of Unicode 15's and 16's code points (unicodedata2 16.0.0
            assigns them, Python's Unicode 14 does not) splits as tokenizers 0.23 does under the general
            categories in and out of classes, negated, by long name, \\w \\W \\d \\D,
            Llama 3's pattern, Digits, Punctuation and Whitespace
bad.*: a WordPiece and a Unigram tokenizer.json, a BertNormalizer, a
BertPreTokenizer, a WordPiece decoder, BPE dropout, a merge of tokens
not in the vocabulary, malformed JSON, a missing tokenizer or text, an
out-of-range id and an object for --decode, text that is not UTF-8: one line
on stderr naming the problem, exit status 2.

shardlm tokenize runs once per tokenizer and check with every file (one line
of ids each), so that the comparisons, not process starts, take the time.
"""
import glob
import json
import os
import random
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import use_ref5_venv  # noqa: E402

use_ref5_venv("tokenizer.env")

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors,  # noqa: E402
                        trainers)

from harness import BIN, ROOT, check, failures, note, scratch_dir  # noqa: E402
from hf_tokenizers import QWEN2_PATTERN, phi3_tokenizer, qwen2_tokenizer  # noqa: E402

TMP = scratch_dir("t_tokenizer")
# Llama 3's pre-tokenization regex (its tokenizer.json's Split pattern).
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")
VOCAB = 2000
# Random id sequences decoded per tokenizer, and their length.
RANDOM_DECODES, RANDOM_LEN = 40, 24
# Ids of context before the streamed ones (--stream --context N).
STREAM_CONTEXTS = (0, 3, 50)

MULTILINGUAL = "\n".join([
    "English: It's a test; we'll see what they've done, I'd say. IT'S LOUD! 'S 'ſx 'REx",
    "Français : l'élève a reçu « 3 » prix — façade, cœur, naïveté.",
    "Deutsch: Größenwahn, Straße, ÄÖÜ äöü ß ẞ.",
    "Русский: Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ελληνικά: Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. ς σ Σ",
    "日本語: 私はガラスを食べられます。それは私を傷つけません。ｶﾀｶﾅ",
    "中文：我能吞下玻璃而不伤身体。繁體字與簡体字。",
    "한국어: 나는 유리를 먹을 수 있어요. 그래도 아프지 않아요",
    "العربية: أنا قادر على أكل الزجاج و هذا لا يؤلمني. مَرْحَبًا",
    "עברית: אני יכול לאכול זכוכית וזה לא מזיק לי. שָׁלוֹם",
    "हिन्दी: मैं काँच खा सकता हूँ और मुझे उससे कोई चोट नहीं पहुंचती. क्षत्रिय",
    "ไทย: ฉันกินกระจกได้ แต่มันไม่ทำให้ฉันเจ็บ",
    "Emoji: 👍 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷🇩🇪 ❤️ 1️⃣ 🤷🏾‍♀️ 😀😃😄",
    "Combining: e\u0301 a\u0308\u0304 Z\u0335\u0321\u0322 n\u0303",
    "Digits: 1234567890123456789 3.14159 1,000,000 ٠١٢٣٤٥ १२३ ①②③ ½",
    "Spaces:   three\t\ttabs  \u00a0nbsp\u3000ideographic\u2003em\u180emongolian\u200bzwsp\ufeffbom",
    "Lines:\r\nCRLF\r\n\r\nand\n\n\nblank\r\rCR only   \n   \n",
    "Code: for (int i = 0; i < n; i++) { x += a[i] * b[i]; } // done",
    "Special: <|endoftext|>after <|endoftext|> spaced<mask> [SEP] ZeRO ZeROs ckpt_dir <s> </s> <unk> <0x41>",
    "Llama 3: <|begin_of_text|>hello<|end_of_text|><|eot_id|>",
    "Marker ▁ in text ▁▁ and __ underscores",
    "Long: " + "a" * 3000 + " " + "9" * 200 + " " * 500 + "end",
    "Math: ∀x∈ℝ, x² ≥ 0; ∑ᵢ aᵢ ≠ ∞; ﬁnal ﬂow",
    "Case: İstanbul ΑΘΗΝΑ ǅ Ǆ ẞ ΣΑΣ Ⅻ ＡＢＣ Å Ω K",
    "Chat: <|user|>\nHi there<|end|>\n<|assistant|>\n  Yes.<|end|>\n<|im_start|>user\nNFC: e\u0301 A\u030a<|im_end|>\n"
    "<tool_call>\n{\"name\": 1}</tool_call><|system|> <|placeholder1|>",
]) + "\n   "

EDGE = ["", " ", "  ", "\n", "\r\n", "\t", " leading", "trailing ", "  both  ", "a", "<|endoftext|>",
        "a<|endoftext|>b", " <|endoftext|> ", "<mask>", "x <mask> y", "[SEP]  z", "ZeRO", "aZeROb", "ZeRO!",
        "ckpt_x", "<s>", "<s> hello", "hello </s>", "<unk>", "<0x41>", "▁", "▁x", "\x00", "\x00a\x00",
        "\u180e", "'ſx", "ab\u0301", "é", "   \n\n   x", "<|begin_of_text|>", "hi<|eot_id|>"]


def shardlm(*args, stdin=None):
    out = subprocess.run([BIN, "tokenize", *args], input=stdin, capture_output=True)
    return out.returncode, out.stdout, out.stderr.decode("utf-8", "replace")


def read_text(path):
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def write_text(name, text):
    path = os.path.join(TMP, name)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    return path


def write_json(name, obj):
    path = os.path.join(TMP, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False)
    return path


# ---- inputs -------------------------------------------------------------

_CORPUS = []


def corpus_files():
    """The sources and Markdown pages, copied once into TMP (the corpus stays the same while the tree is edited
    during the run): (src paths, docs paths), each copy under its path relative to the checkout."""
    if not _CORPUS:
        src = sorted(glob.glob(os.path.join(ROOT, "src", "**", "*.[ch]"), recursive=True), key=os.path.basename)
        docs = sorted(subprocess.run(["git", "-C", ROOT, "ls-files", "*.md"], capture_output=True, text=True)
                      .stdout.split())
        for group, paths in (("src", src), ("docs", [os.path.join(ROOT, d) for d in docs])):
            copies = []
            for path in paths:
                copy = os.path.join(TMP, "corpus", os.path.relpath(path, ROOT))
                os.makedirs(os.path.dirname(copy), exist_ok=True)
                shutil.copyfile(path, copy)
                copies.append(copy)
            _CORPUS.append(copies)
    return _CORPUS[0], _CORPUS[1]


def input_groups():
    """{group: [(name, path, text)]}"""
    src, docs = corpus_files()
    groups = {
        "src": [(os.path.basename(p), p, read_text(p)) for p in src],
        "docs": [(os.path.relpath(p, os.path.join(TMP, "corpus")), p, read_text(p)) for p in docs],
        "multilingual": [("multilingual", write_text("multilingual.txt", MULTILINGUAL), MULTILINGUAL)],
        "edge": [(repr(t), write_text(f"edge{i}.txt", t), t) for i, t in enumerate(EDGE)],
    }
    return groups


# ---- tokenizers -----------------------------------------------------------

def train_byte_level(files):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(files, trainer)
    return tok


def make_gpt2(files):
    tok = train_byte_level(files)
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True, normalized=False),
                            AddedToken("[SEP]", rstrip=True, special=True, normalized=False)])
    tok.add_tokens([AddedToken("ZeRO", single_word=True, normalized=True),
                    AddedToken("ckpt_", normalized=False)])
    return tok


def strings_json(tok):
    """tok's file with its merges as "a b" strings, as tokenizers < 0.20 wrote them (0.23 writes pairs)."""
    j = json.loads(tok.to_str())
    assert all(isinstance(m, list) and len(m) == 2 for m in j["model"]["merges"]), "tokenizers no longer writes pairs"
    j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
    return j


def make_llama3(files):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|eot_id|>"]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(files, trainer)
    j = json.loads(tok.to_str())
    # Whole words the merges would cut differently: only ignore_merges emits them whole.
    vocab = j["model"]["vocab"]
    for word in ["Ġtokenizer", "Ġshardlm", "Ġgradient", "Ġcheckpoint", "Ġthe", "Ġconfiguration", "Ġfunction"]:
        if word not in vocab:
            vocab[word] = len(vocab)
    for t in j["added_tokens"]:
        t["id"] = vocab[t["content"]]
    j["model"]["ignore_merges"] = True
    bos = vocab["<|begin_of_text|>"]
    j["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                  {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bos],
                                                  "tokens": ["<|begin_of_text|>"]}}}]}
    merged = json.loads(json.dumps(j))
    merged["model"]["ignore_merges"] = False
    merged["decoder"] = None  # tokenizers then joins the tokens with spaces
    return j, merged


LLAMA2_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}


def make_llama2(files):
    """Llama 2's layout: <unk> <s> </s>, the 256 byte tokens, then the merged pieces (trained with a Metaspace
    pre-tokenizer so that they look like SentencePiece's; the file then has none, as Llama 2's)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=120,
                                  show_progress=False)
    tok.train(files, trainer)
    j = json.loads(tok.to_str())
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for t, _ in sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(t, len(vocab))
    j["model"].update(vocab=vocab, byte_fallback=True, fuse_unk=True, unk_token="<unk>")
    # Added tokens that are not special: one matched in the normalized text ("▁ZeRO" after Prepend and
    # Replace), one in the raw text.
    for content, normalized in (("ZeRO", True), ("ckpt_", False)):
        j["added_tokens"].append({"id": len(vocab) + len(j["added_tokens"]) - 3, "content": content,
                                  "single_word": False, "lstrip": False, "rstrip": False,
                                  "normalized": normalized, "special": False})
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    j["pre_tokenizer"] = None
    j["decoder"] = LLAMA2_DECODER
    j["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    unk = json.loads(json.dumps(j))
    unk["model"]["byte_fallback"] = False
    meta = json.loads(json.dumps(j))
    meta["normalizer"] = None
    meta["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
    meta_split = json.loads(json.dumps(meta))
    meta_split["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                                   "split": True}
    meta_split["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"}, {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                                   "split": True}]}
    return j, unk, meta, meta_split


def make_gemma(llama2):
    """Gemma's layout over llama2's vocabulary: Replace " " -> "▁" without Prepend (Gemma's SentencePiece has no
    dummy prefix), byte_fallback, decoder Replace + ByteFallback + Fuse (no Strip), <bos> $A, and the special
    <start_of_turn> / <end_of_turn> of its chat template."""
    j = json.loads(json.dumps(llama2))
    j["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}]}
    n = len(j["model"]["vocab"]) + len(j["added_tokens"]) - 3
    for k, content in enumerate(("<start_of_turn>", "<end_of_turn>")):
        j["added_tokens"].append({"id": n + k, "content": content, "single_word": False, "lstrip": False,
                                  "rstrip": False, "normalized": False, "special": True})
    return j


def split_variants(gpt2):
    """The gpt2 vocabulary behind Split pre-tokenizers (ByteLevel without its regex maps the bytes)."""
    base = json.loads(gpt2.to_str())
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    cases = {
        "isolated_w": (r"\w+", "Isolated", False),
        "removed_s": (r"\s+", "Removed", False),
        "prev_punct": (r"[.,;:!?]", "MergedWithPrevious", False),
        "next_h": (r"\h+", "MergedWithNext", False),
        "contiguous_d": (r"\d", "Contiguous", False),
        "invert_w": (r"\w+", "Isolated", True),
        "dot_newline": (r"a.b|$", "Isolated", False),
        "empty_matches": (r"x*", "Isolated", False),
        "string": ({"String": "the"}, "MergedWithNext", False),
        "lookahead": (r"a|(?=c)", "Isolated", False),
        "dotall_option": (r"(?m:a.b)|e.", "Isolated", False),
        "u_escape": (r"\u00e9|\u4e2d", "Isolated", False),
    }
    out = {}
    for name, (pattern, behavior, invert) in cases.items():
        j = json.loads(json.dumps(base))
        pat = pattern if isinstance(pattern, dict) else {"Regex": pattern}
        j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": pat, "behavior": behavior, "invert": invert}, byte_level]}
        out["splits_" + name] = j
    return out


def pretok_variants(gpt2):
    """The gpt2 vocabulary behind the pre-tokenizers that are fixed splits in tokenizers, as released
    families use them: SmolLM2 / StarCoder's Digits(individual_digits=true) + ByteLevel, Digits without
    individual digits, Punctuation with every behavior, Whitespace, WhitespaceSplit (each before
    ByteLevel(use_regex=false), which maps the bytes)."""
    base = json.loads(gpt2.to_str())
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    plain_bytes = dict(byte_level, use_regex=False)
    cases = {
        "smollm2": [{"type": "Digits", "individual_digits": True}, byte_level],
        "digits_contiguous": [{"type": "Digits", "individual_digits": False}, byte_level],
        "whitespace": [{"type": "Whitespace"}, plain_bytes],
        "whitespace_split": [{"type": "WhitespaceSplit"}, plain_bytes],
        "qwen2": [{"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated", "invert": False},
                  plain_bytes],
    }
    for behavior in ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"):
        cases["punctuation_" + behavior.lower()] = [{"type": "Punctuation", "behavior": behavior}, plain_bytes]
    out = {}
    for name, members in cases.items():
        j = json.loads(json.dumps(base))
        j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": members}
        out[name] = j
    out["qwen2"]["normalizer"] = {"type": "NFC"}
    normalizers = {
        "nfd": {"type": "NFD"}, "nfkc": {"type": "NFKC"}, "nfkd": {"type": "NFKD"},
        "lowercase": {"type": "Lowercase"},
        "strip": {"type": "Sequence", "normalizers": [{"type": "Strip", "strip_left": True, "strip_right": True},
                                                      {"type": "Prepend", "prepend": "<"}]},
        "strip_left": {"type": "Strip", "strip_left": True, "strip_right": False},
    }
    for name, normalizer in normalizers.items():
        j = json.loads(json.dumps(base))
        j["normalizer"] = normalizer
        out["norm_" + name] = j
    return out


# ---- comparisons ----------------------------------------------------------

def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def output_lines(out):
    """shardlm tokenize's lines: split at "\n" alone (a decoded text may hold U+2028, U+0085 ..., which JSON
    leaves unescaped and str.splitlines would split at)."""
    lines = out.decode("utf-8").split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def run_lines(name, *args):
    """shardlm tokenize's output lines, each parsed as JSON; None and a message when it failed."""
    rc, out, err = shardlm(*args)
    if rc != 0:
        return None, f"{name}: exit {rc}: {err.strip()[:300]}"
    return [json.loads(line) for line in output_lines(out)], ""


def write_ids(tag, id_lists):
    paths = []
    for k, ids in enumerate(id_lists):
        paths.append(os.path.join(TMP, f"ids_{tag}_{k}.json"))
        with open(paths[-1], "w") as f:
            json.dump(ids, f)
    return paths


def encode_check(name, path, ref, groups):
    """Checks the ids of every group with and without special tokens; returns [(input name, special, text, ids)]."""
    cases = []
    items = [item for members in groups.values() for item in members]
    for special in (True, False):
        got, err = run_lines(name, path, *([] if special else ["--no-special"]), *[p for _, p, _ in items])
        k = 0
        for group, members in groups.items():
            bad = [err] if got is None else []
            for iname, _, text in members:
                want = ref.encode(text, add_special_tokens=special).ids
                cases.append((iname, special, text, want))
                mine = got[k] if got is not None else None
                k += 1
                if got is not None and mine != want:
                    i = first_difference(mine, want)
                    bad.append(f"{iname}: {len(mine)} ids vs {len(want)}, first difference at {i}: "
                               f"{mine[i:i + 5]} vs {want[i:i + 5]}")
            check(f"{name}.encode.{group}{'' if special else '.no_special'}", not bad, "; ".join(bad[:3]))
    return cases


def decode_lines(name, path, id_lists, *flags):
    got, err = run_lines(name, path, "--decode", "--json", *flags, *write_ids(name, id_lists))
    return got if got is not None else [f"<{err}>"] * len(id_lists)


def decode_check(name, path, ref, cases, round_trips_expected):
    bad, not_text = [], []
    for skip in (False, True):
        flags = ["--skip-special"] if skip else []
        got = decode_lines(name, path, [ids for _, _, _, ids in cases], *flags)
        for (iname, special, text, ids), mine in zip(cases, got):
            want = ref.decode(ids, skip_special_tokens=skip)
            if mine != want:
                i = first_difference(mine, want)
                bad.append(f"{iname} special={special} skip={skip}: at {i}: {mine[i:i + 20]!r} vs {want[i:i + 20]!r}")
            if skip and want == text and mine != text:
                not_text.append(iname)
    check(f"{name}.decode.equals_tokenizers", not bad, "; ".join(bad[:3]))
    round_trips = sum(1 for _, special, text, ids in cases if ref.decode(ids, skip_special_tokens=True) == text)
    check(f"{name}.decode.round_trip", not not_text and (round_trips > len(cases) // 2 or not round_trips_expected),
          f"{round_trips} of {len(cases)} texts round-trip in tokenizers; ours differs for {not_text[:3]}")
    rng = random.Random(name)
    vocab_size = ref.get_vocab_size(with_added_tokens=True)
    random_ids = [[rng.randrange(vocab_size) for _ in range(RANDOM_LEN)] for _ in range(RANDOM_DECODES)]
    bad = []
    for skip in (False, True):
        got = decode_lines(name, path, random_ids, *(["--skip-special"] if skip else []))
        for ids, mine in zip(random_ids, got):
            want = ref.decode(ids, skip_special_tokens=skip)
            if mine != want:
                bad.append(f"{ids}: {mine!r} vs {want!r}")
    check(f"{name}.decode.random_ids", not bad, "; ".join(bad[:2]))


def stream_check(name, path, ref, cases):
    """The stream's pieces, joined, are what decoding all the ids adds to decoding the context's."""
    cases = [c for c in cases if c[1]]
    bad, compared = [], 0
    for context in STREAM_CONTEXTS:
        got, err = run_lines(name, path, "--decode", "--stream", "--context", str(context),
                             *write_ids(name, [ids for _, _, _, ids in cases]))
        if got is None:
            bad.append(err)
            continue
        for (iname, _, _, ids), pieces in zip(cases, got):
            whole = ref.decode(ids, skip_special_tokens=False)
            before = ref.decode(ids[:context], skip_special_tokens=False)
            if "\ufffd" in whole or not whole.startswith(before):
                continue
            compared += 1
            if "".join(pieces) != whole[len(before):]:
                bad.append(f"{iname} context {context}: {''.join(pieces)[:60]!r} vs {whole[len(before):][:60]!r}")
    check(f"{name}.stream.joined_equals_decode", not bad and compared > len(cases), "; ".join(bad[:3]))


def compare(name, path, ref, groups, full=True, round_trips=True):
    """The checks of one tokenizer; full: decode and stream too; round_trips: most texts decode back to
    themselves in tokenizers (not without a decoder)."""
    start = time.time()
    cases = encode_check(name, path, ref, groups)
    if full:
        decode_check(name, path, ref, cases, round_trips)
        stream_check(name, path, ref, cases)
    note(f"{name}: {time.time() - start:.1f} s")
    return [ids for _, _, _, ids in cases]


# ---- bad inputs -------------------------------------------------------------

def expect_refusal(name, args, *needles, stdin=None):
    rc, out, err = shardlm(*args, stdin=stdin)
    lines = err.strip().splitlines()
    ok = rc == 2 and len(lines) == 1 and all(n.lower() in err.lower() for n in needles)
    check(f"bad.{name}", ok, f"exit {rc}, stderr {err.strip()!r} (want one line naming {needles})")


def bad_inputs(gpt2_path, gpt2_json):
    text = write_text("a.txt", "ab")
    wordpiece = os.path.join(TMP, "wordpiece.json")
    Tokenizer(models.WordPiece(vocab={"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]")).save(wordpiece)
    expect_refusal("wordpiece", [wordpiece, text], "model type WordPiece")
    unigram = os.path.join(TMP, "unigram.json")
    Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0), ("b", -2.0)], 0, False)).save(unigram)
    expect_refusal("unigram", [unigram, text], "model type Unigram")
    for field, value, needle in [
            ("normalizer", {"type": "BertNormalizer"}, "normalizer BertNormalizer"),
            ("pre_tokenizer", {"type": "BertPreTokenizer"}, "pre_tokenizer BertPreTokenizer"),
            ("decoder", {"type": "WordPiece", "prefix": "##", "cleanup": True}, "decoder WordPiece")]:
        j = json.loads(json.dumps(gpt2_json))
        j[field] = value
        expect_refusal(field + "_" + value["type"].lower(), [write_json(f"bad_{field}.json", j),
                                                               text], needle)
    j = json.loads(json.dumps(gpt2_json))
    j["model"]["dropout"] = 0.1
    expect_refusal("bpe_dropout", [write_json("bad_dropout.json", j), text], "dropout")
    j = json.loads(json.dumps(gpt2_json))
    j["model"]["merges"][5] = "nothere alsonot"
    expect_refusal("merge_out_of_vocab", [write_json("bad_merge.json", j), text],
                   "merges[5]", "nothere")
    with open(os.path.join(TMP, "malformed.json"), "w") as f:
        f.write('{"model": {"type": "BPE", "vocab": {"a": 0,}')
    expect_refusal("malformed_json", [os.path.join(TMP, "malformed.json"), text],
                   "malformed.json", "not valid JSON")
    expect_refusal("missing_tokenizer", [os.path.join(TMP, "nope.json"), text], "nope.json")
    expect_refusal("missing_text", [gpt2_path, os.path.join(TMP, "nope.txt")], "nope.txt")
    expect_refusal("decode_out_of_range", [gpt2_path, "--decode"], "out of range", stdin=b"[1, 2, 999999]")
    expect_refusal("decode_not_ids", [gpt2_path, "--decode"], "JSON array", stdin=b'{"ids": [1]}')
    expect_refusal("not_utf8", [gpt2_path], "UTF-8", "offset 3", stdin=b"abc\xff\xfe")


def byte_to_char():
    """GPT-2's byte-level alphabet: the printable bytes stand for themselves, the others for 256 + n."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


BYTE_TO_CHAR = byte_to_char()


def piece_tokenizer(name, texts, pre):
    """A byte-level tokenizer without a vocabulary to speak of behind pre-tokenizer PRE, whose merges join each
    whole text of TEXTS, left to right: the ids then show every piece boundary PRE makes, whatever the corpus.
    Returns (tokens, path of its file)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab, merges = {c: i for i, c in enumerate(alphabet)}, []
    for t in texts:
        chars = [BYTE_TO_CHAR[b] for b in t.encode("utf-8")]
        word = chars[0]
        for c in chars[1:]:
            if word + c not in vocab:
                merges.append((word, c))
                vocab[word + c] = len(vocab)
            word += c
    tok = Tokenizer(models.BPE(vocab=dict(vocab), merges=list(merges)))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre, pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                use_regex=False)])
    path = os.path.join(TMP, f"pieces_{name}.json")
    tok.save(path)
    return tok, path


def differing_pieces(name, texts, pre):
    """The texts of TEXTS that shardlm tokenize splits otherwise than tokenizers under PRE (one run for all)."""
    tok, path = piece_tokenizer(name, texts, pre)
    files = []
    for k, t in enumerate(texts):
        files.append(os.path.join(TMP, f"pieces_{name}_{k}.txt"))
        with open(files[-1], "w", encoding="utf-8", newline="") as f:
            f.write(t)
    r = subprocess.run([BIN, "tokenize", path, *files], capture_output=True)
    lines = output_lines(r.stdout) if r.returncode == 0 else []
    if len(lines) != len(texts):
        return list(texts)
    return [t for t, line in zip(texts, lines) if json.loads(line) != tok.encode(t).ids]


def character_classes():
    """Which characters Digits (Rust's char::is_numeric) and Oniguruma's \\w take, on characters where PCRE2's
    classes differ (numbers of the No and Nl categories, Latin-1 superscripts and fractions, marks, Join_Control),
    through byte-level tokenizers without merges: the ids are the pre-tokenizer's pieces, whatever the corpus."""
    texts = [" ①② x", " ² ", " Ⅻ ", " ३٣ ", " ½¾ ", "a_b é", "x\u200dy", " · ", "e\u0301 ", " 𝟙𝟚 ", "¹²³ 12"]
    for name, pre in (("digits", pre_tokenizers.Digits(individual_digits=True)),
                      ("word", pre_tokenizers.Split(Regex(r"\w"), "isolated"))):
        bad = differing_pieces("classes_" + name, texts, pre)
        check(f"classes.{name}", not bad, f"pieces differ from tokenizers' on {bad}")


# Code points that Unicode assigned after PCRE2 10.42's tables (Unicode 14; Debian 12): tokenizers 0.23's
# Oniguruma and Rust know Unicode 16. utf8proc 2.8 (Unicode 15.0) moves Unicode 15's into their categories
# (src/tokenizer/tokenizer_unicode.c); Unicode 16's stay unassigned here and fall into other classes (issue 44).
# {name: (text, the pre-tokenizers under which shardlm splits it otherwise, as measured)}; the old scripts and
# the old emoji around them split alike under every one.
NEWER_UNICODE = {
    "emoji_15_zwj": ("a\U0001FACE\u200d\U0001FACF b\U0001FAE8c", set()),     # moose ZWJ donkey, shaking face
    "cyrillic_ext_d_15": ("x\U0001E030\U0001E031y", set()),
    # U+11F00, a Kawi sign, is Other_Alphabetic, which utf8proc does not know: \p{Alphabetic} misses it (\w has
    # it as a mark)
    "kawi_15": ("x\U00011F00\U00011F04 1", {"alpha"}),
    # Kawi's digits and punctuation: Digits and \d take the digits; Punctuation (Unicode 8's tables) takes
    # neither the punctuation nor U+2E52 (Unicode 13), which PCRE2's \p{P} (Unicode 14) has
    "kawi_digits_15": ("x\U00011F50\U00011F51\U00011F43y", set()),
    "punctuation_13": ("a\u2E52b", {"punctuation"}),
    "kaktovik_15": ("x\U0001D2C0\U0001D2C1", set()),
    "cyrillic_ext_c_16": ("\u0416\u1C89\u1C8A!", set()),
    # U+0897, Arabic Pepet (a mark), is Other_Alphabetic, which neither utf8proc nor unicode_newer.h has
    "arabic_ext_b_16": ("\u0628\u0897\u0628", {"alpha"}),
    "balinese_16": ("\u1B05\u1B4E\u1B7F\u1B05", set()),
    # Garay (Unicode 16): capital and small letters, a digit; Legacy Computing Supplement's outlined digits (Nd)
    "garay_16": ("x\U00010D50\U00010D70 \U00010D40\U00010D41 1", set()),
    "outlined_digits_16": ("a\U0001CCF0\U0001CCF1b", set()),
    # Unicode 16's emoji: face with bags under eyes, fingerprint, leafless tree, harp, shovel, splatter
    "emoji_16": ("a\U0001FAE9\U0001FAC6 \U0001FABE\U0001FA89b \U0001FA8F\U0001FADF", set()),
    "old_scripts": ("\u0416\u0438\u0437\u043d\u044c \u0628 \u1B05 a\U0001F468\u200d\U0001F469 b\U0001F44D\U0001F3FDc 12",
                    set()),
}


def newer_unicode():
    """The splits of NEWER_UNICODE's texts under Llama 3's pattern, \\p{So}+ (the emoji), \\w+, Digits,
    Punctuation and \\p{Alphabetic}+: the texts that differ from tokenizers 0.23 are exactly the recorded ones (a
    library with newer tables, or a regression, changes the set and this check says which)."""
    texts = [t for t, _ in NEWER_UNICODE.values()]
    for pre_name, pre in (("llama3", pre_tokenizers.Split(Regex(LLAMA3_PATTERN), "isolated")),
                          ("so", pre_tokenizers.Split(Regex(r"\p{So}+"), "isolated")),
                          ("word", pre_tokenizers.Split(Regex(r"\w+"), "isolated")),
                          ("digits", pre_tokenizers.Digits(individual_digits=True)),
                          ("punctuation", pre_tokenizers.Punctuation()),
                          ("alpha", pre_tokenizers.Split(Regex(r"\p{Alphabetic}+"), "isolated"))):
        bad = set(differing_pieces("newer_" + pre_name, texts, pre))
        want = {t for t, pres in NEWER_UNICODE.values() if pre_name in pres}
        names = {n for n, (t, _) in NEWER_UNICODE.items() if t in bad ^ want}
        check(f"newer_unicode.{pre_name}", bad == want, f"differs from the record on {sorted(names)}")


def unicode_table_generated():
    """src/tokenizer/unicode_newer.h is what tools/gen_unicode_newer.py writes from the pinned unicodedata2."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_unicode_newer.py")], capture_output=True,
                       text=True)
    with open(os.path.join(ROOT, "src", "tokenizer", "unicode_newer.h"), encoding="utf-8") as f:
        committed = f.read()
    check("newer_unicode.table_generated", r.returncode == 0 and r.stdout == committed,
          f"tools/gen_unicode_newer.py gives another table (rc {r.returncode}: {r.stderr.strip()[:200]}); regenerate "
          "src/tokenizer/unicode_newer.h")


def unicode_16_runs():
    """Every run of code points (one category) that Unicode 16 assigns and Python's unicodedata (Unicode 14, as
    PCRE2 10.42) does not, as tools/gen_unicode_newer.py lists them from unicodedata2 16.0.0: Unicode 15's
    additions (utf8proc knows them) and 15.1's and 16.0's (unicode_newer.h). [(first, last, category)]."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import gen_unicode_newer
    return gen_unicode_newer.runs()


def unicode_16_classes():
    """Each run of Unicode 15's and 16's code points (its first and last, between Latin letters and spaces) splits as in
    tokenizers 0.23 under the general categories, inside and outside classes, negated, by long name, \\w \\W \\d
    \\D, Llama 3's pattern, Digits, Punctuation and Whitespace."""
    runs = unicode_16_runs()
    count = sum(last - first + 1 for first, last, _ in runs)
    check("unicode_16.code_points", count > 10000, f"{count} code points of Unicode 15 and 16 found: "
          f"unicodedata {__import__('unicodedata').unidata_version} is not Unicode 14")
    texts = [f"a{chr(first)}{chr(last)}b {chr(first)}1" for first, last, _ in runs]
    patterns = [r"\p{L}+", r"\p{Lm}+", r"\p{N}+", r"\p{So}+", r"\p{P}+", r"\p{M}+", r"\p{Cf}+", r"\p{Cn}+",
                r"\p{C}+", r"\P{L}+", r"\p{^N}+", r"[\P{L}b]+", r"[^\P{So}]+", r"\p{Letter}+", r"\w+", r"\W+",
                r"\d+", r"[\Da]+"]
    pres = [(p, pre_tokenizers.Split(Regex(p), "isolated")) for p in patterns]
    pres += [("llama3", pre_tokenizers.Split(Regex(LLAMA3_PATTERN), "isolated")),
             ("digits", pre_tokenizers.Digits(individual_digits=True)),
             ("punctuation", pre_tokenizers.Punctuation()), ("whitespace", pre_tokenizers.Whitespace())]
    for k, (name, pre) in enumerate(pres):
        bad = differing_pieces(f"unicode_16_{k}", texts, pre)
        runs_bad = [f"{runs[texts.index(t)][0]:X}" for t in bad]
        check(f"unicode_16.{name}", not bad, f"pieces differ from tokenizers' on the runs at {runs_bad}")


def main():
    character_classes()
    newer_unicode()
    unicode_table_generated()
    unicode_16_classes()
    groups = input_groups()
    src, docs = corpus_files()
    train_files = src + docs
    note(f"{sum(len(v) for v in groups.values())} inputs: {', '.join(f'{k} {len(v)}' for k, v in groups.items())}")

    gpt2 = make_gpt2(train_files)
    gpt2_path = os.path.join(TMP, "gpt2.json")
    gpt2.save(gpt2_path)
    compare("gpt2", gpt2_path, gpt2, groups)
    compare("gpt2_strings", write_json("gpt2_strings.json", strings_json(gpt2)), gpt2, groups, full=False)

    llama3, llama3_merged = make_llama3(train_files)
    ref3 = Tokenizer.from_str(json.dumps(llama3))
    ids3 = compare("llama3", write_json("llama3.json", llama3), ref3, groups)
    ref3m = Tokenizer.from_str(json.dumps(llama3_merged))
    ids3m = compare("llama3_merged", write_json("llama3_merged.json", llama3_merged), ref3m, groups,
                    round_trips=False)
    check("llama3.ignore_merges_matters", ids3 != ids3m, "the same ids with and without ignore_merges")

    llama2 = make_llama2(train_files)
    for name, j in zip(("llama2", "llama2_unk", "metaspace", "metaspace_split"), llama2):
        ref = Tokenizer.from_str(json.dumps(j))
        compare(name, write_json(name + ".json", j), ref, groups)
    gemma = make_gemma(llama2[0])
    ref = Tokenizer.from_str(json.dumps(gemma))
    compare("gemma", write_json("gemma.json", gemma), ref,
            {"src": groups["src"][:4], "multilingual": groups["multilingual"], "edge": groups["edge"]})
    check("gemma.differs_from_llama2", ref.encode(MULTILINGUAL).ids != Tokenizer.from_str(
        json.dumps(llama2[0])).encode(MULTILINGUAL).ids, "the same ids as llama2's: Prepend would not show")

    small = {k: v if k != "src" else v[:12] for k, v in groups.items()}
    for name, j in split_variants(gpt2).items():
        compare(name, write_json(name + ".json", j), Tokenizer.from_str(json.dumps(j)), small, full=False)

    # the components one at a time: the texts where they act (the many scripts, the edge cases, some C)
    tiny = {"src": groups["src"][:4], "multilingual": groups["multilingual"], "edge": groups["edge"]}
    for name, j in pretok_variants(gpt2).items():
        full = name in ("smollm2", "qwen2")
        ref = Tokenizer.from_str(json.dumps(j))
        compare(name, write_json(name + ".json", j), ref, small if full else tiny, full=full)
        # the component acts on the text: without it the ids would be gpt2's
        check(f"{name}.differs_from_gpt2", ref.encode(MULTILINGUAL).ids != gpt2.encode(MULTILINGUAL).ids,
              "the same ids as the gpt2 tokenizer: the test would not see the component")

    # released families' files, built in their structure with tokenizers' API (tests/hf_tokenizers.py)
    texts = [read_text(p) for p in train_files]
    for name, ref in (("qwen2_file", qwen2_tokenizer(texts, VOCAB)), ("phi3_file", phi3_tokenizer(texts, VOCAB))):
        path = os.path.join(TMP, name + ".json")
        ref.save(path)
        compare(name, path, ref, tiny)

    bad_inputs(gpt2_path, json.loads(gpt2.to_str()))


main()
sys.exit(1 if failures() else 0)
