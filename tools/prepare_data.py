#!/usr/bin/env python3
"""prepare_data — instruction and pre-training JSONL to a shardlm sample file (HDF5).

    tools/prepare_data.py [--tokenizer DIR_OR_tokenizer.json] [--format auto|text|completion|alpaca|chat|tokenized]
                          [--skip-bad] [--vocab-size N] [--chat-template FILE] -o OUT.h5 INPUT.jsonl [MORE or GLOB...]

Every non-blank line of every input (files and globs in the order given, the
files of a glob sorted) is one JSON object and becomes one sample. Its format
comes from its keys, or from --format for every line:

  text        {"text"}: continued pre-training, every token trained
  completion  {"prompt", "completion"} (or "response"): loss on the completion
  alpaca      {"instruction", "input" (optional), "output"}: the Alpaca prompt
              wording around instruction and input, loss on the output
  chat        {"messages": [{"role", "content"}, ...]}: the tokenizer's chat
              template (or --chat-template), loss on the assistant turns
  tokenized   {"input_ids", "labels" (optional, -100 = not trained)}
  preference  {"prompt", "chosen", "rejected"}: a DPO pair, strings or message
              lists (TRL's two formats); a file of pairs only, written as a
              preference file: see tools/prefdata.py

Tokenization (a Hugging Face directory: tokenizer.json, tokenizer_config.json,
special_tokens_map.json, chat_template.jinja, additional_chat_templates/; or a
tokenizer.json, whose directory is read for the others; transformers 5 writes
no special_tokens_map.json and keeps the chat template in chat_template.jinja,
see find_chat_template). Text is always encoded without the tokenizer's post-processor
(add_special_tokens=False): this tool adds BOS and EOS itself, so no sample
gets them twice.
  * BOS starts text, completion and Alpaca samples when the tokenizer adds it:
    tokenizer_config.json's add_bos_token when present (Llama sets it), else
    what the post-processor of tokenizer.json does to a probe text.
  * EOS ends text samples and completions (trained: the model learns to stop),
    whatever add_eos_token says, so it is never doubled.
  * A prompt and its completion are encoded separately and concatenated: the
    prompt tokens are then exactly those the model sees when it is given the
    prompt alone at inference, and the boundary is a token boundary, so the
    loss mask is exact. No separator is inserted; the prompt carries its own
    trailing space or newline (the Alpaca prompt ends in "### Response:\\n").
    With a SentencePiece-style tokenizer that marks the start of every encoded
    text with "\u2581" (Llama 2's normalizer), the completion starts with it.
  * A chat is rendered once, as transformers' apply_chat_template(messages,
    tokenize=False) does (jinja2 sandbox, trim_blocks, lstrip_blocks, the
    loopcontrols extension, raise_exception, the special tokens as
    bos_token, eos_token, ...), and encoded once with character offsets. The
    characters of assistant turn k are those between the rendering of
    messages[:k] with add_generation_prompt=True and the rendering of
    messages[:k+1]: the content and the end-of-turn text the template writes
    after it; where the template ends a conversation with more than a turn's
    end (Phi-3's eos_token after the last <|end|>), a middle turn ends where
    messages[:k+1]'s rendering leaves the whole one; where that leaves less than
    the turn's content (Qwen3 writes a <think> block only after the last user
    message and drops one that starts an earlier turn), the turn is the
    content it shows (after "</think>") found in the whole rendering, plus the
    end-of-turn text messages[:k+1]'s rendering writes after it. A token is trained when
    all its characters lie in such a span. The first rendering must be a
    prefix of the whole one and the turn must hold the message's content
    (stripped), else the line is bad.
    A chat gets no BOS or EOS beyond what its template writes (as with
    apply_chat_template(tokenize=True)).
  * Pre-tokenized ids are taken as they are (no BOS, EOS or template).

Sample file (the C trainer reads it; every sample at least 2 tokens):
  /tokens   int32 [n_tokens]       the samples' token ids, concatenated in order
  /trained  uint8 [n_tokens]       1 where the token is a training target (its
                                   prediction from the tokens before it counts);
                                   0 for the first token of every sample
  /offsets  int64 [n_samples + 1]  sample i is tokens[offsets[i]:offsets[i+1]]
  root attributes: format "shardlm-samples", version 1, vocab_size,
  tokenizer_sha256 (of tokenizer.json's bytes, "" without a tokenizer),
  bos_token_id / eos_token_id / pad_token_id (-1 when none), source (JSON list
  of the absolute input paths), n_samples, n_tokens, n_trained_tokens,
  n_skipped_lines (int64), formats (JSON object: format -> samples). Strings
  are scalar fixed-length NUL-terminated UTF-8, as in shardlm's checkpoints;
  integers int64. Datasets are chunked, without filters.

The file is written under a temporary name in OUT's directory and renamed
over OUT at the end: a failed run leaves OUT as it was. An existing OUT is
replaced only with --overwrite and only when it is a sample file (never a
checkpoint or any other file). A line longer than 16 MiB is bad (encoding
it would take gigabytes); a full disk is one line and exit status 2.

Bad input is one line "FILE:LINE: problem; what to do" on stderr and exit
status 2 with no output; --skip-bad skips bad lines instead, counts them and
prints the first few. tokenizers and jinja2 come from build/data-venv (made by
tools/deps.sh); run with a Python that lacks them, this script re-executes
itself with that environment's Python.
"""
import argparse
import glob
import hashlib
import json
import os
import pathlib
import stat
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXIT_BAD_INPUT = 2
# Environments that hold tokenizers and jinja2 over Debian's numpy and h5py, in
# order of preference: tools/deps.sh makes data-venv (and ref5-venv and ref-venv
# with --test). ref5-venv (tokenizers 0.23) before ref-venv, whose tokenizers
# 0.19 (held there by transformers 4.40) cannot read what transformers 5 writes.
VENVS = ("data-venv", "ref5-venv", "ref-venv")
REEXEC_MARK = "SHARDLM_PREPARE_DATA_VENV"


def fail(message):
    print(message.replace("\n", " "), file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


def use_data_venv():
    """Continues in build/data-venv (or build/ref-venv) when a module this tool
    needs is not importable here; re-executes at most once."""
    try:
        import h5py  # noqa: F401
        import jinja2  # noqa: F401
        import numpy  # noqa: F401
        import tokenizers  # noqa: F401
        return
    except ImportError as e:
        missing = e.name
    if not os.environ.get(REEXEC_MARK):
        for name in VENVS:
            py = os.path.join(ROOT, "build", name, "bin", "python")
            if os.path.exists(py):
                os.environ[REEXEC_MARK] = py
                os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])
    where = os.environ.get(REEXEC_MARK) or os.path.join(ROOT, "build", VENVS[0])
    fail(f"prepare_data: Python module {missing} is missing ({sys.executable}, {where}); "
         f"run tools/deps.sh (make deps) to make build/{VENVS[0]}")


use_data_venv()

import h5py  # noqa: E402
import jinja2  # noqa: E402
import jinja2.sandbox  # noqa: E402
import numpy as np  # noqa: E402
import tokenizers  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prefdata  # noqa: E402
from toolexit import fault_point, run_removing_on_signal  # noqa: E402

FORMATS = ("text", "completion", "alpaca", "chat", "tokenized")
ROLES = ("system", "user", "assistant", "tool")
IGNORE_LABEL = -100  # transformers' ignore_index: a label that is not trained
# Special-token attributes that transformers passes to a chat template
# (SPECIAL_TOKENS_ATTRIBUTES); they are also what tokenizer_config.json names.
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# Stanford Alpaca's prompt wording, with and without an input.
ALPACA_WITH_INPUT = ("Below is an instruction that describes a task, paired with an input that provides further "
                     "context. Write a response that appropriately completes the request.\n\n"
                     "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
ALPACA_NO_INPUT = ("Below is an instruction that describes a task. Write a response that appropriately completes "
                   "the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")
# Elements per HDF5 chunk (256 KiB of int32 tokens) and per buffered write.
CHUNK = 1 << 16
FLUSH_TOKENS = 1 << 20
# Lines whose texts are encoded in one encode_batch call (which spreads them
# over the cores), or fewer when they hold this many bytes.
BATCH_LINES = 1024
BATCH_BYTES = 16 << 20
# The progress bar shows on a terminal, or when the input is at least this
# large (a log of a long run then shows it was alive); updates at most this often.
PROGRESS_MIN_BYTES = 64 << 20
PROGRESS_EVERY_S = 0.5
SHOWN_SKIPS = 10  # --skip-bad prints this many bad lines, then only counts
MAX_LINE_BYTES = 16 << 20  # a longer line is bad: encoding it would take gigabytes (about 100 bytes a byte)


def turn_end(full, before, through, content):
    """Where the assistant turn that starts at len(before) in the whole conversation FULL ends. THROUGH is the
    conversation rendered up to that turn: the turn is what FULL and THROUGH share from len(before) on (a template
    that ends a conversation with more than a turn's end, Phi-3's eos_token after the last <|end|>, thus ends a
    middle turn at its own end). A template that renders a conversation's last turn otherwise than an earlier one
    (Qwen3's reasoning block only after the last user message) shares less than the content: then the turn ends
    after its content in FULL plus as much of the end-of-turn text THROUGH writes after the content as FULL has
    there. -1 when the content is not there."""
    end = len(os.path.commonprefix([full, through]))
    if content in full[len(before):end]:
        return end
    at, tail_at = full.find(content, len(before)), through.rfind(content)
    if not content or at < 0 or tail_at < 0:
        return -1
    stop = at + len(content)
    return stop + len(os.path.commonprefix([full[stop:], through[tail_at + len(content):]]))


class BadLine(Exception):
    """A line that cannot become a sample: str(e) is "problem; what to do"."""


class NoChatTemplate(BadLine):
    """A chat line, and the tokenizer has no chat template: the tokenizer's fault, not the line's, so it ends
    the run even with --skip-bad (skipping every chat line would drop the data without a word)."""


class ImagesInData(BadLine):
    """A line that carries images (Gemma 3's and other multimodal chat data): shardlm trains the language model on
    text alone, so such data ends the run even with --skip-bad (skipping would drop the images without a word)."""


IMAGE_KEYS = ("images", "image", "pixel_values", "image_url")
IMAGE_TYPES = ("image", "image_url", "input_image")


def refuse_images(obj):
    """Raises ImagesInData when OBJ (a line, or a list of messages) holds an image: a top-level images field, or a
    message content item of an image type ({"type": "image"}, as Gemma 3's chat template takes)."""
    if isinstance(obj, dict):
        for key in IMAGE_KEYS:
            if obj.get(key):
                raise ImagesInData(f"the line carries images (\"{key}\"); shardlm trains the language model on text "
                                   "only (a Gemma 3 vision model's tower is not trained); remove the images")
        obj = [m for key in ("messages", "prompt", "chosen", "rejected") if isinstance(obj.get(key), list)
               for m in obj[key]]
    for m in obj if isinstance(obj, list) else ():
        content = m.get("content") if isinstance(m, dict) else None
        for item in content if isinstance(content, list) else ():
            if isinstance(item, dict) and (item.get("type") in IMAGE_TYPES or any(k in item for k in IMAGE_KEYS)):
                raise ImagesInData("a message's content holds an image item; shardlm trains the language model on "
                                   "text only (a Gemma 3 vision model's tower is not trained); remove the images")


class Tokenizer:
    """tokenizer.json with the special tokens, BOS rule and chat template of its
    directory's tokenizer_config.json and special_tokens_map.json."""

    def __init__(self, path, chat_template_file):
        path = os.path.abspath(path)
        json_path = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        folder = os.path.dirname(json_path)
        try:
            with open(json_path, "rb") as f:
                raw = f.read()
            self.tok = tokenizers.Tokenizer.from_str(raw.decode("utf-8"))
        except Exception as e:  # OSError, UnicodeDecodeError, the tokenizers library's parse errors
            old = tuple(int(x) for x in tokenizers.__version__.split(".")[:2]) < (0, 20)
            fail(f"{json_path}: cannot read the tokenizer ({type(e).__name__}: {e}); " +
                 (f"tokenizers {tokenizers.__version__} ({sys.executable}) cannot read what tokenizers >= 0.20 "
                  "writes: run tools/deps.sh, which makes build/data-venv with a current one" if old else
                  "give --tokenizer a Hugging Face model directory or its tokenizer.json"))
        self.sha256 = hashlib.sha256(raw).hexdigest()
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        config = read_json_object(os.path.join(folder, "tokenizer_config.json"))
        # transformers lets special_tokens_map.json override tokenizer_config.json
        config.update(read_json_object(os.path.join(folder, "special_tokens_map.json")))
        self.special = {}  # attribute -> token text
        self.ids = {}  # attribute -> token id
        for name in SPECIAL_TOKENS:
            value = config.get(name)
            if isinstance(value, dict):
                value = value.get("content")
            if not value:
                continue
            if not isinstance(value, str) or self.tok.token_to_id(value) is None:
                fail(f"{folder}: {name} {value!r} (tokenizer_config.json, special_tokens_map.json) is not a token "
                     f"of {json_path}; fix the directory's tokenizer files")
            self.special[name] = value
            self.ids[name] = self.tok.token_to_id(value)
        self.bos = self.ids.get("bos_token")
        self.eos = self.ids.get("eos_token")
        self.pad = self.ids.get("pad_token")
        add_bos = config.get("add_bos_token")
        if not isinstance(add_bos, bool):
            add_bos = self.post_processor_adds_bos()
        self.add_bos = add_bos and self.bos is not None
        self.template, self.template_source, self.no_template = None, None, None
        if chat_template_file:
            template = read_template(chat_template_file, "give a jinja2 template file")
            self.template_source = chat_template_file
        else:
            template, self.template_source, self.no_template = find_chat_template(folder, config)
        if template is not None:
            self.template = compile_template(template, self.template_source)

    def post_processor_adds_bos(self):
        probe = "a"
        plain = self.tok.encode(probe, add_special_tokens=False).ids
        full = self.tok.encode(probe, add_special_tokens=True).ids
        return self.bos is not None and len(full) > len(plain) and full[0] == self.bos

    def render(self, messages, add_generation_prompt):
        return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt, **self.special)


# transformers 5's names (transformers.utils.hub): the template beside tokenizer.json, and the folder of named ones.
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"
PROCESSOR_CHAT_TEMPLATE_FILE = "chat_template.json"


def read_template(path, hint):
    try:
        return pathlib.Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        fail(f"{path}: cannot read the chat template ({e}); {hint}")


def find_chat_template(folder, config):
    """The chat template that transformers 5.25's tokenizer renders (AutoTokenizer.from_pretrained,
    tokenization_utils_base._from_pretrained, then get_chat_template with no tools): returns
    (source, where it came from, None), or (None, None, why there is none: a clause, the caller adds what to do).

    chat_template.jinja is the "default" template and additional_chat_templates/NAME.jinja the named ones;
    when either exists they replace tokenizer_config.json's chat_template (transformers 4 wrote it there: a
    string, or a list of {"name", "template"}). Of several named templates, "default" is rendered;
    without one transformers refuses, and so does this. chat_template.json is a processor's file
    (AutoProcessor reads it, AutoTokenizer does not), so it is not read here either: only named in the
    error, since a model directory that holds it most likely wants it."""
    templates, where = {}, {}
    jinja = os.path.join(folder, CHAT_TEMPLATE_FILE)
    if os.path.isfile(jinja):
        templates["default"], where["default"] = read_template(jinja, "fix or remove the file"), jinja
    named_dir = os.path.join(folder, CHAT_TEMPLATE_DIR)
    if os.path.isdir(named_dir):
        for name in sorted(os.listdir(named_dir)):
            path = os.path.join(named_dir, name)
            if name.endswith(".jinja") and os.path.isfile(path):
                templates[name[:-len(".jinja")]] = read_template(path, "fix or remove the file")
                where[name[:-len(".jinja")]] = path
    if not templates:
        value = config.get("chat_template")
        config_path = os.path.join(folder, "tokenizer_config.json")
        if isinstance(value, str) and value:
            templates["default"], where["default"] = value, config_path
        elif isinstance(value, list):
            for t in value:
                if isinstance(t, dict) and isinstance(t.get("template"), str):
                    templates[t.get("name")], where[t.get("name")] = t["template"], config_path
    if "default" in templates:
        return templates["default"], where["default"], None
    if templates:
        return None, None, (f"{folder}'s chat templates ({', '.join(sorted(map(str, templates)))}) have no "
                            "\"default\" one")
    processor = os.path.join(folder, PROCESSOR_CHAT_TEMPLATE_FILE)
    note = (f"; its {PROCESSOR_CHAT_TEMPLATE_FILE} is a processor's, which transformers' tokenizer does not read"
            if os.path.isfile(processor) else "")
    return None, None, (f"{folder} has no chat template ({CHAT_TEMPLATE_FILE}, {CHAT_TEMPLATE_DIR}/default.jinja "
                        f"or tokenizer_config.json's chat_template){note}")


def read_json_object(path):
    """A JSON object file's contents; {} when there is no such file."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        fail(f"{path}: cannot read it ({e}); fix or remove the file")
    if not isinstance(value, dict):
        fail(f"{path}: not a JSON object; fix or remove the file")
    return value


def compile_template(source, where):
    """The chat template compiled as transformers compiles it (4.40:
    ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, a
    raise_exception global, its tojson filter; later releases add the
    loopcontrols extension)."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers' own (chat_template_utils._compile_jinja_template): jinja2's escapes <, >, &, ' and
        # non-ASCII characters, which Qwen2.5's tool calls ("arguments": {...} | tojson) would then carry
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = tojson
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateError as e:
        fail(f"{where}: the chat template does not compile ({e}); fix the template")


def json_type(value):
    """What a parsed JSON value is, in JSON's words."""
    kinds = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
             dict: "an object", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def string_field(obj, key, allow_empty=True):
    value = obj.get(key)
    if value is None:
        raise BadLine(f"no \"{key}\" field; add it, or give the line's format with --format")
    if not isinstance(value, str):
        raise BadLine(f"\"{key}\" is {json_type(value)}, not a string; make it a string")
    if not allow_empty and not value:
        raise BadLine(f"\"{key}\" is empty; a sample needs a completion to train on")
    return value


def detect_format(obj):
    if "messages" in obj:
        return "chat"
    if "input_ids" in obj:
        return "tokenized"
    if "instruction" in obj and "output" in obj:
        return "alpaca"
    if "prompt" in obj and ("completion" in obj or "response" in obj):
        return "completion"
    if "text" in obj:
        return "text"
    keys = ", ".join(sorted(obj)) or "none"
    raise BadLine(f"no known format (keys: {keys}); give \"text\", \"prompt\"+\"completion\", "
                  "\"instruction\"+\"output\", \"messages\" or \"input_ids\", or force one with --format")


class SampleBuilder:
    """Turns a line's JSON object into a plan of pieces, and pieces with their
    encodings into (token ids, trained flags). The texts of many lines are
    encoded together in between (the tokenizers library then uses every core).

    A piece is (content, trained): content is a text to encode or a list of
    token ids; trained is 0 or 1 for all its tokens, or, for a text, a list of
    character spans whose tokens are trained (chat), or, for ids, a list of
    flags, one per id (labels)."""

    def __init__(self, tokenizer, vocab_size):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size

    def outside_vocabulary(self, token_id, position):
        return BadLine(f"token id {token_id} at position {position} is outside the vocabulary "
                       f"(size {self.vocab_size}); check --vocab-size or the tokenizer the ids came from")

    def need_tokenizer(self, fmt):
        if self.tokenizer is None:
            raise BadLine(f"a {fmt} line needs a tokenizer; give --tokenizer")
        return self.tokenizer

    def bos(self):
        return [([self.tokenizer.bos], 0)] if self.tokenizer.add_bos else []

    def eos(self):
        return [([self.tokenizer.eos], 1)] if self.tokenizer.eos is not None else []

    def text(self, obj):
        self.need_tokenizer("text")
        return self.bos() + [(string_field(obj, "text"), 1)] + self.eos()

    def prompt_completion(self, prompt, completion):
        # Encoded apart, then concatenated: see the module's docstring.
        return self.bos() + [(prompt, 0), (completion, 1)] + self.eos()

    def completion(self, obj):
        self.need_tokenizer("completion")
        key = "completion" if "completion" in obj or "response" not in obj else "response"
        return self.prompt_completion(string_field(obj, "prompt"), string_field(obj, key, allow_empty=False))

    def alpaca(self, obj):
        self.need_tokenizer("alpaca")
        instruction = string_field(obj, "instruction")
        extra = obj.get("input") or ""
        if not isinstance(extra, str):
            raise BadLine(f"\"input\" is {json_type(extra)}, not a string; make it a string or leave it out")
        wording = ALPACA_WITH_INPUT if extra else ALPACA_NO_INPUT
        prompt = wording.format(instruction=instruction, input=extra)
        return self.prompt_completion(prompt, string_field(obj, "output", allow_empty=False))

    def chat(self, obj):
        tok = self.need_tokenizer("chat")
        if tok.template is None:
            raise NoChatTemplate(tok.no_template + "; give one with --chat-template FILE")
        messages = obj.get("messages")
        check_messages(messages)
        full = render(tok, messages, False)
        spans = []
        for k, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = render(tok, messages[:k], True)
            through = render(tok, messages[:k + 1], False)
            # what the turn shows: reasoning templates (Qwen3's, DeepSeek-R1's) drop a <think> block that starts the
            # content from the turns before the last user message
            shown = message["content"].split("</think>")[-1].strip()
            end = turn_end(full, before, through, shown)
            turn = full[len(before):end]
            if not (full.startswith(before) and len(before) <= end and shown in turn):
                raise BadLine(f"the chat template does not render messages[:{k}] as the start of the whole "
                              "conversation, so assistant turns cannot be found; use a template that renders "
                              "each turn independently of the later ones")
            spans.append((len(before), end))
        return [(full, spans)]

    def tokenized(self, obj):
        ids = obj.get("input_ids")
        if not isinstance(ids, list) or not all(type(i) is int for i in ids):
            raise BadLine("\"input_ids\" is not a list of integers; give token ids as a JSON list of integers")
        bad = next((pos for pos, i in enumerate(ids) if not 0 <= i < self.vocab_size), None)
        if bad is not None:  # before numpy, which cannot hold an id beyond int64
            raise self.outside_vocabulary(ids[bad], bad)
        labels = obj.get("labels")
        if labels is None:
            return [(ids, 1)]
        if not isinstance(labels, list) or not all(type(i) is int for i in labels) or len(labels) != len(ids):
            raise BadLine(f"\"labels\" is not a list of {len(ids)} integers (one per input id); "
                          f"give the input id or {IGNORE_LABEL} at each position")
        for pos, (i, label) in enumerate(zip(ids, labels)):
            if label != IGNORE_LABEL and label != i:
                raise BadLine(f"label {label} at position {pos} is neither {IGNORE_LABEL} nor the input id {i}; "
                              "labels here are unshifted (labels[i] is the target at position i)")
        return [(ids, [int(label != IGNORE_LABEL) for label in labels])]

    def plan(self, obj, fmt):
        """(format, pieces) of a line's object; BadLine when it cannot be a sample."""
        if not isinstance(obj, dict):
            raise BadLine(f"the line is {json_type(obj)}, not an object; write one JSON object a line")
        fmt = detect_format(obj) if fmt == "auto" else fmt
        return fmt, getattr(self, fmt)(obj)

    def assemble(self, pieces, encodings):
        """(int32 ids, uint8 trained) of a plan, taking its texts' encodings in order from the iterator
        ENCODINGS; BadLine when the sample is too short, has no trained token or an id outside the vocabulary."""
        all_ids, all_trained = [], []
        for content, trained in pieces:
            if isinstance(content, str):
                encoding = next(encodings)
                ids = np.asarray(encoding.ids, dtype=np.int64)
                if isinstance(trained, list):
                    flags = spans_mask(np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2), trained)
                else:
                    flags = np.full(len(ids), trained, dtype=np.uint8)
            else:
                ids = np.asarray(content, dtype=np.int64)
                flags = np.asarray(trained if isinstance(trained, list) else [trained] * len(ids), dtype=np.uint8)
            all_ids.append(ids)
            all_trained.append(flags)
        ids = np.concatenate(all_ids) if all_ids else np.zeros(0, dtype=np.int64)
        trained = np.concatenate(all_trained) if all_trained else np.zeros(0, dtype=np.uint8)
        if len(ids) < 2:
            raise BadLine(f"the sample has {len(ids)} token(s); a sample needs at least 2 (a context and a target)")
        bad = np.flatnonzero((ids < 0) | (ids >= self.vocab_size))
        if bad.size:
            raise self.outside_vocabulary(ids[bad[0]], bad[0])
        trained[0] = 0  # nothing comes before it to predict it from
        if not trained.any():
            raise BadLine("no token of the sample is trained; give it a target (completion, assistant turn "
                          f"or labels other than {IGNORE_LABEL})")
        return ids.astype(np.int32), trained


def spans_mask(offsets, spans):
    """1 for each token (character offsets [start, end), one row a token) that lies entirely in one of SPANS."""
    mask = np.zeros(len(offsets), dtype=np.uint8)
    for start, end in spans:
        mask |= (offsets[:, 0] >= start) & (offsets[:, 1] <= end)
    return mask


def check_messages(messages):
    if not isinstance(messages, list) or not messages:
        raise BadLine("\"messages\" is not a non-empty list; give a list of {\"role\", \"content\"} objects")
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise BadLine(f"messages[{k}] is not an object with a string \"content\"; give each message "
                          "\"role\" and \"content\" strings")
        if m.get("role") not in ROLES:
            raise BadLine(f"messages[{k}] has role {m.get('role')!r}; roles are {', '.join(ROLES)}")
    if not any(m["role"] == "assistant" for m in messages):
        raise BadLine("no assistant turn; a chat sample trains on assistant turns only, so it needs one")


def render(tok, messages, add_generation_prompt):
    try:
        return tok.render(messages, add_generation_prompt)
    except Exception as e:  # the template's raise_exception, or any error inside the template
        raise BadLine(f"the chat template failed ({type(e).__name__}: {e}); fix the messages or the template")


class SampleWriter:
    """Appends samples to a temporary HDF5 file in the output's directory;
    commit() renames it over the output, abort() removes it."""

    def __init__(self, out):
        self.out = out
        folder = os.path.dirname(out) or "."
        try:
            fd, self.tmp = tempfile.mkstemp(prefix="." + os.path.basename(out) + ".", suffix=".tmp", dir=folder)
            os.close(fd)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(self.tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide the data from the job's other users
            self.file = h5py.File(self.tmp, "w")
        except OSError as e:
            fail(f"{out}: cannot write in {folder} ({e}); check the directory and its permissions")
        growing = dict(shape=(0,), maxshape=(None,), chunks=(CHUNK,))
        self.tokens = self.file.create_dataset("tokens", dtype="<i4", **growing)
        self.trained = self.file.create_dataset("trained", dtype="u1", **growing)
        self.offsets = self.file.create_dataset("offsets", dtype="<i8", **growing)
        self.pending = []  # (ids, trained) not yet written
        self.pending_tokens = 0
        self.n_tokens = 0
        self.n_samples = 0
        self.n_trained = 0
        self.offset_list = [0]

    def add(self, ids, trained):
        self.pending.append((ids, trained))
        self.pending_tokens += len(ids)
        self.n_tokens += len(ids)
        self.n_samples += 1
        self.n_trained += int(trained.sum())
        self.offset_list.append(self.n_tokens)
        if self.pending_tokens >= FLUSH_TOKENS:
            self.flush()

    def flush(self):
        if self.pending:
            append(self.tokens, np.concatenate([p[0] for p in self.pending]))
            append(self.trained, np.concatenate([p[1] for p in self.pending]))
        append(self.offsets, np.asarray(self.offset_list, dtype=np.int64))
        self.pending, self.pending_tokens, self.offset_list = [], 0, []

    def commit(self, attrs):
        self.flush()
        for name, value in attrs.items():
            set_attr(self.file, name, value)
        self.file.close()
        with open(self.tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(self.tmp, self.out)

    def abort(self, close=True):
        try:
            if close:
                self.file.close()
        except Exception:
            pass
        try:
            os.unlink(self.tmp)
        except OSError:
            pass


def refuse_existing_output(output, overwrite):
    """An existing OUT is replaced only with --overwrite, and only when it is a sample file: never a checkpoint
    or another file, a directory or a FIFO."""
    if not os.path.lexists(output):
        return
    if not os.path.isfile(output):
        fail(f"{output}: the output exists and is not a regular file; name another file")
    kind = None
    if h5py.is_hdf5(output):
        try:
            with h5py.File(output, "r") as f:
                kind = f.attrs.get("format")
        except OSError:
            pass
    kind = kind.decode(errors="replace") if isinstance(kind, bytes) else kind
    if kind not in ("shardlm-samples", prefdata.FILE_FORMAT):  # what this tool writes, SFT or preference
        what = ("an HDF5 file that is neither a sample file nor a preference file (a checkpoint?)"
                if h5py.is_hdf5(output) else "not a sample file")
        fail(f"{output}: the output exists and is {what}; it is never replaced: name another file")
    if not overwrite:
        what = "preference file" if kind == prefdata.FILE_FORMAT else "sample file"
        fail(f"{output}: the output exists; give --overwrite to replace that {what}, or name another file")


def append(dataset, values):
    n = dataset.shape[0]
    dataset.resize((n + len(values),))
    dataset[n:] = values


def set_attr(file, name, value):
    """int -> int64 scalar; str -> scalar fixed-length NUL-terminated UTF-8 (what src/io/ckpt_write.c writes and
    ckpt_attr_str reads: a variable-length string would need another read path in C)."""
    if isinstance(value, int):
        file.attrs.create(name, np.int64(value), dtype="<i8")
        return
    data = value.encode("utf-8") + b"\0"
    string_type = h5py.h5t.C_S1.copy()
    string_type.set_size(len(data))
    string_type.set_strpad(h5py.h5t.STR_NULLTERM)
    string_type.set_cset(h5py.h5t.CSET_UTF8)
    space = h5py.h5s.create(h5py.h5s.SCALAR)
    attr = h5py.h5a.create(file.id, name.encode(), string_type, space)
    attr.write(np.array(data, dtype=f"S{len(data)}"), mtype=string_type)


class Progress:
    """A one-line progress bar on stderr, rewritten with \\r."""

    def __init__(self, total_bytes):
        self.total = max(total_bytes, 1)
        self.enabled = sys.stderr.isatty() or total_bytes >= PROGRESS_MIN_BYTES
        self.last = 0.0
        self.shown = False

    def update(self, done_bytes, samples, tokens, force=False):
        now = time.monotonic()
        if not self.enabled or (not force and now - self.last < PROGRESS_EVERY_S):
            return
        self.last = now
        self.shown = True
        print(f"\rprepare_data: {100.0 * done_bytes / self.total:5.1f}% of {self.total / 2**20:.1f} MiB, "
              f"{samples} samples, {tokens} tokens", end="", file=sys.stderr, flush=True)

    def finish(self):
        """Ends the bar's line, so that a message can follow it."""
        if self.shown:
            print(file=sys.stderr, flush=True)
            self.shown = False


def input_kind(path):
    """What a path that is no regular file is ("is a directory", ...), or None when there is nothing there."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    if stat.S_ISFIFO(mode):
        return "is a FIFO (named pipe), not a regular file; write its lines to a file first"
    return "is not a regular file (a device or socket)"


def expand_inputs(patterns):
    """Input files in the order given, each glob's matches sorted; exits on a glob that matches nothing."""
    paths = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
            if not matches:
                fail(f"{pattern}: the pattern matches no file; check the path (quote globs for this tool)")
            paths += matches
        elif not os.path.isfile(pattern):
            kind = input_kind(pattern)
            fail(f"{pattern}: {kind}" + ("" if "; " in kind else "; give a JSONL file") if kind
                 else f"{pattern}: no such file; check the path")
        else:
            paths.append(pattern)
    return paths


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit status 2, like bad input
        fail(f"prepare_data: {message}; see tools/prepare_data.py --help")


def parse_args():
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="JSONL files or globs, in order")
    parser.add_argument("-o", "--output", required=True, metavar="OUT.h5", help="the sample file to write")
    parser.add_argument("--tokenizer", metavar="DIR_OR_JSON",
                        help="a Hugging Face model directory (tokenizer.json, tokenizer_config.json) "
                             "or a tokenizer.json")
    parser.add_argument("--format", default="auto", choices=("auto",) + FORMATS + (prefdata.FORMAT,),
                        help="the format of every line (default: from each line's keys)")
    parser.add_argument("--skip-bad", action="store_true", help="skip and count bad lines instead of stopping")
    parser.add_argument("--vocab-size", type=int, metavar="N", help="vocabulary size of pre-tokenized input "
                                                                    "without --tokenizer")
    parser.add_argument("--chat-template", metavar="FILE", help="a jinja2 chat template in place of the tokenizer's")
    parser.add_argument("--max-seq-length", type=int, metavar="L", help="preference pairs: cut a pair longer "
                        "than L tokens (TRL's rule, see tools/prefdata.py)")
    parser.add_argument("--max-prompt-length", type=int, metavar="P", help="preference pairs: the prompt tokens a "
                        "cut pair keeps (default L // 2)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing OUT.h5 sample file (never another kind of HDF5 file)")
    args = parser.parse_args()
    if args.max_prompt_length is not None and args.max_seq_length is None:
        parser.error("--max-prompt-length needs --max-seq-length")
    if args.max_seq_length is not None and args.max_seq_length < 2:
        parser.error(f"--max-seq-length {args.max_seq_length}: want at least 2 (a pair keeps a prompt token and a "
                     "completion token)")
    if args.max_seq_length is not None and not 0 < (args.max_prompt_length or 1) < args.max_seq_length:
        parser.error("--max-prompt-length must be positive and below --max-seq-length")
    if args.tokenizer and args.vocab_size is not None:
        parser.error("--vocab-size is for pre-tokenized input without --tokenizer; the tokenizer fixes the size")
    if not args.tokenizer:
        if args.vocab_size is None:
            parser.error("give --tokenizer, or --vocab-size for pre-tokenized input")
        if args.vocab_size < 1:
            parser.error("--vocab-size must be positive")
        if args.chat_template:
            parser.error("--chat-template needs --tokenizer")
        if args.format not in ("auto", "tokenized"):
            parser.error(f"--format {args.format} needs --tokenizer")
    return args


def parse_line(raw):
    try:
        obj = json.loads(raw.decode("utf-8").strip())
    except UnicodeDecodeError:
        raise BadLine("not UTF-8 text; convert the file to UTF-8")
    except json.JSONDecodeError as e:
        raise BadLine(f"not JSON ({e.msg} at character {e.pos + 1}); write one JSON object a line")
    except RecursionError:
        raise BadLine("JSON nested too deeply to read; write one flat JSON object a line")
    if b"\\ud" in raw.lower():  # an escaped surrogate: a lone one is no text (the tokenizer could not take it)
        try:
            json.dumps(obj, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise BadLine("a string holds a lone surrogate escape (\\ud800-\\udfff without its pair); fix the "
                          "text's encoding")
    return obj


class Conversion:
    """Lines to samples in the writer, a batch of lines at a time: the texts of
    a batch are encoded in one call. Bad lines are reported in line order."""

    def __init__(self, args, tokenizer, writer, total_bytes):
        self.builder = SampleBuilder(tokenizer, tokenizer.vocab_size if tokenizer else args.vocab_size)
        self.pairs = prefdata.PairBuilder(sys.modules[__name__], self.builder, args.max_seq_length,
                                          args.max_prompt_length)
        self.kind = None  # True for a file of preference pairs, False for SFT samples (its first line decides)
        self.tokenizer = tokenizer
        self.format = args.format
        self.skip_bad = args.skip_bad
        self.writer = writer
        self.counts = dict.fromkeys(FORMATS + (prefdata.FORMAT,), 0)
        self.skipped = 0
        self.progress = Progress(total_bytes)
        self.done_bytes = 0
        self.batch = []  # (FILE:LINE, format, pieces), or (FILE:LINE, None, BadLine)
        self.batch_bytes = 0

    def add_line(self, where, raw):
        self.done_bytes += len(raw)
        if not raw.strip():
            return
        try:
            obj = parse_line(raw)
            refuse_images(obj)
            if isinstance(obj, dict) and (self.format == prefdata.FORMAT
                                          or self.format == "auto" and prefdata.is_pair(obj)):
                fmt, pieces = prefdata.FORMAT, self.pairs.plan(obj)
            else:
                fmt, pieces = self.builder.plan(obj, self.format)
            self.check_kind(where, fmt == prefdata.FORMAT)
            self.batch.append((where, fmt, pieces))
        except BadLine as e:
            self.batch.append((where, None, e))
        self.batch_bytes += len(raw)
        if len(self.batch) >= BATCH_LINES or self.batch_bytes >= BATCH_BYTES:
            self.flush()

    def flush(self):
        texts = [content for _, fmt, pieces in self.batch if fmt for content, _ in pieces if isinstance(content, str)]
        encodings = self.tokenizer.tok.encode_batch(texts, add_special_tokens=False) if texts else []
        used = 0
        for where, fmt, pieces in self.batch:
            if fmt is None:
                self.bad_line(where, pieces)
                continue
            n_texts = sum(isinstance(content, str) for content, _ in pieces)
            try:
                texts = iter(encodings[used:used + n_texts])
                if fmt == prefdata.FORMAT:
                    samples = self.pairs.assemble(pieces, texts)
                else:
                    samples = [self.builder.assemble(pieces, texts)]
            except BadLine as e:
                self.bad_line(where, e)
                continue
            finally:
                used += n_texts
            for ids, trained in samples:
                self.writer.add(ids, trained)
            self.counts[fmt] += 1
        self.batch, self.batch_bytes = [], 0
        self.progress.update(self.done_bytes, self.writer.n_samples, self.writer.n_tokens)

    def check_kind(self, where, pair):
        """A file holds preference pairs only or SFT samples only: its first planned line decides."""
        if self.kind is None:
            self.kind = pair
            if not pair and self.pairs.max_seq_length:
                fail(f"{where}: --max-seq-length is for preference pairs and this is an SFT sample; "
                     "leave it out (the trainer cuts SFT samples)")
        elif pair != self.kind:
            what = "a preference pair among SFT samples" if pair else "an SFT sample among preference pairs"
            raise BadLine(what + "; put preference pairs and SFT samples in separate files")

    def bad_line(self, where, error):
        message = f"{where}: {error}".replace("\n", " ")
        if not self.skip_bad or isinstance(error, (NoChatTemplate, ImagesInData)):
            self.progress.finish()
            fail(message)
        self.skipped += 1
        if self.skipped <= SHOWN_SKIPS:
            self.progress.finish()
            print(f"skipped {message}", file=sys.stderr)

    def run(self, paths):
        """Reads every line of PATHS; returns (per-format counts, skipped lines)."""
        for path in paths:
            try:
                f = open(path, "rb")
            except OSError as e:
                fail(f"{path}: cannot read it ({e.strerror}); check the path and its permissions")
            with f:
                number = 0
                while True:
                    raw = f.readline(MAX_LINE_BYTES + 1)
                    if not raw:
                        break
                    number += 1
                    if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                        while raw and not raw.endswith(b"\n"):  # the rest of the line, a bounded piece at a time
                            self.done_bytes += len(raw)
                            raw = f.readline(MAX_LINE_BYTES)
                        self.done_bytes += len(raw)
                        self.batch.append((f"{path}:{number}", None, BadLine(
                            f"the line is longer than {MAX_LINE_BYTES >> 20} MiB (the limit a line); split the text "
                            "into several samples")))
                        continue
                    self.add_line(f"{path}:{number}", raw)
        self.flush()
        self.progress.update(self.done_bytes, self.writer.n_samples, self.writer.n_tokens, force=True)
        self.progress.finish()
        if self.skipped > SHOWN_SKIPS:
            print(f"skipped {self.skipped} bad lines in all, the first {SHOWN_SKIPS} listed above", file=sys.stderr)
        return self.counts, self.skipped


def main():
    args = parse_args()
    paths = expand_inputs(args.inputs)
    out = os.path.abspath(args.output)
    if out in map(os.path.abspath, paths):
        fail(f"{args.output}: the output is also an input; write the sample file elsewhere")
    tokenizer = Tokenizer(args.tokenizer, args.chat_template) if args.tokenizer else None
    writer = SampleWriter(out)
    try:
        conversion = Conversion(args, tokenizer, writer, sum(os.path.getsize(p) for p in paths))
        counts, skipped = conversion.run(paths)
        if writer.n_samples == 0:
            fail(f"{args.output}: no sample in {len(paths)} input file(s) ({skipped} bad lines skipped); "
                 "give JSONL with at least one good line")
        attrs = {
            "format": "shardlm-samples", "version": 1,
            "vocab_size": tokenizer.vocab_size if tokenizer else args.vocab_size,
            "tokenizer_sha256": tokenizer.sha256 if tokenizer else "",
            "bos_token_id": -1 if tokenizer is None or tokenizer.bos is None else tokenizer.bos,
            "eos_token_id": -1 if tokenizer is None or tokenizer.eos is None else tokenizer.eos,
            "pad_token_id": -1 if tokenizer is None or tokenizer.pad is None else tokenizer.pad,
            "source": json.dumps([os.path.abspath(p) for p in paths]),
            "n_samples": writer.n_samples, "n_tokens": writer.n_tokens, "n_trained_tokens": writer.n_trained,
            "n_skipped_lines": skipped,
            "formats": json.dumps({name: n for name, n in counts.items() if name in FORMATS}),
        }
        if counts[prefdata.FORMAT]:
            attrs.update(conversion.pairs.write(writer))
        fault_point("write")  # the hidden .tmp written, not yet renamed
        refuse_existing_output(args.output, args.overwrite)  # after the input's own errors, before the rename
        writer.commit(attrs)
    except (OSError, RuntimeError) as e:
        # a full disk (HDF5 says so as a RuntimeError when a dataset is closed): HDF5's stack would follow,
        # and closing the file or its clean-up at exit may crash; other errors go on as they are
        text = str(e)
        if isinstance(e, RuntimeError) and "write failed" not in text and "No space" not in text:
            writer.abort()
            raise
        writer.abort(close=False)
        reason = e.strerror if isinstance(e, OSError) and e.strerror else text.split("(")[-1].split(",")[0]
        if "errno = 28" in text or "No space" in text:
            reason = "no space left on the device"
        print(f"{args.output}: cannot write the sample file ({reason}); free space or write elsewhere "
              "(nothing was written)", file=sys.stderr)
        sys.stderr.flush()
        os._exit(EXIT_BAD_INPUT)
    except BaseException:
        writer.abort()
        raise
    per_format = ", ".join(f"{name} {n}" for name, n in counts.items() if n)
    print(f"{args.output}: {writer.n_samples} samples ({per_format}), {writer.n_tokens} tokens, "
          f"{writer.n_trained} trained, {skipped} bad lines skipped")


if __name__ == "__main__":
    # a stop signal unwinds main, whose writer.abort() removes the hidden .tmp; then one line, 128 + the signal
    run_removing_on_signal("prepare_data", main, [])
