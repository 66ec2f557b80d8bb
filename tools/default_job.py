#!/usr/bin/env python3
"""default_job — the data of `make run` (tools/run_default.sh), made from this checkout's own text.

    tools/default_job.py tokenizer --out DIR --vocab-size N --shards DIR TEXT...
        Trains a byte-level BPE tokenizer (Python's tokenizers) on the texts, without the lines of the
        configuration table (the questions of `instructions` and their answers stay new to the base), and
        writes it as the tokenizer files of a Hugging Face model directory: tokenizer.json,
        tokenizer_config.json, special_tokens_map.json and generation_config.json (the end-of-text token
        ends a generation). The texts, encoded with it and each ended by that token, become llm.c token
        shards for pre-training: --shards DIR/corpus_train.bin and corpus_val.bin (the last tenth of every
        text).
    tools/default_job.py instructions REFERENCE --out DIR [--hold-every K]
        One prompt/completion pair per key of the configuration reference's table (docs/configuration.md, the
        table headed "| key | type | default | allowed | meaning |"): "What does `train.steps` do?" -> its
        meaning. Every K-th pair is held back (default: 8 pairs, evenly spaced): DIR/train.jsonl, DIR/held.jsonl, and
        DIR/questions.jsonl, the prompts of
        the two held-back pairs with the shortest answers among rows naming one key (for shardlm generate).
    tools/default_job.py answers QUESTIONS BASE.jsonl FINETUNED.jsonl
        Prints each question with the reference's answer and the completions of the two models (the JSON lines
        of shardlm generate --prompt-file).

Runs in build/data-venv (tokenizers; tools/deps.sh makes it), re-executing itself there when started by
another python3. Nothing is downloaded. Bad input is one line on stderr and exit status 2.
"""
import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

EXIT_BAD_INPUT = 2
EOS_TOKEN = "<|endoftext|>"
VAL_FRACTION = 0.1  # the tail of each text kept for validation, as tools/make_corpus.sh does
# 8 keys held back, evenly spaced (every len // 8-th, the first 8 of them): one optimizer step of 8 samples (2 ranks
# x micro-batch 4), so that the fine-tunes' validation (eval_batches 1) sees exactly what eval sees, however many
# keys the reference has
HELD = 8
CONFIG_TABLE_HEADER = "| key | type | default | allowed | meaning |"
# The prompt around a question; the completion starts with a space, as the reference's cells do after "|".
PROMPT_FORMAT = "Question: What does {key} do?\nAnswer:"
# make run's real instruct model (--chat): the question as a user turn, the reference's words as the answer
CHAT_QUESTION = "In shardlm's configuration, what does {key} do?"
# shardlm generate's finish_reason, in words
FINISH_REASONS = {"eos": "ended by the end-of-text token", "length": "cut at --max-new-tokens"}


def fail(message):
    print("default_job: error: " + message, file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


def use_data_venv():
    """Re-executes this script with build/data-venv's python when tokenizers is missing here."""
    try:
        import tokenizers  # noqa: F401
        return
    except ImportError:
        pass
    py = os.path.join(ROOT, "build", "data-venv", "bin", "python")
    venv = os.path.dirname(os.path.dirname(py))
    if not os.path.exists(py) or os.path.realpath(sys.prefix) == os.path.realpath(venv):
        fail(f"Python's tokenizers is missing and {py} does not exist; run tools/deps.sh (make deps)")
    os.execv(py, [py] + sys.argv)


def read_text(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        fail(f"{path}: cannot read it as UTF-8 text ({e}); give text files of this checkout")


def train_tokenizer(texts, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def write_tokenizer_dir(tok, out):
    """The tokenizer files of a Hugging Face model directory (transformers' PreTrainedTokenizerFast reads them)."""
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    eos_id = tok.token_to_id(EOS_TOKEN)
    write_json(os.path.join(out, "tokenizer_config.json"),
               {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False, "add_eos_token": False,
                "eos_token": EOS_TOKEN, "model_max_length": 128})
    write_json(os.path.join(out, "special_tokens_map.json"), {"eos_token": EOS_TOKEN})
    write_json(os.path.join(out, "generation_config.json"), {"eos_token_id": eos_id})
    return eos_id


def cmd_tokenizer(args):
    from datafiles import write_shard
    texts = [without_config_table(read_text(p)) for p in args.texts]
    if args.vocab_size < 300 or args.vocab_size > 65535:
        fail(f"--vocab-size {args.vocab_size} is outside [300, 65535]; the 256 bytes need room to merge and the "
             "shards hold uint16 ids")
    tok = train_tokenizer(texts, args.vocab_size)
    eos_id = write_tokenizer_dir(tok, args.out)
    train, val = [], []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids + [eos_id]
        cut = len(ids) - max(1, int(len(ids) * VAL_FRACTION))
        train += ids[:cut]
        val += ids[cut:]
    os.makedirs(args.shards, exist_ok=True)
    write_shard(os.path.join(args.shards, "corpus_train.bin"), train)
    write_shard(os.path.join(args.shards, "corpus_val.bin"), val)
    print(f"tokenizer: byte-level BPE, {tok.get_vocab_size()} tokens, trained on {len(texts)} file(s) without "
          f"the configuration table "
          f"({sum(len(t.encode()) for t in texts)} bytes) -> {args.out}/tokenizer.json; "
          f"{len(train)} training and {len(val)} validation tokens -> {args.shards}/corpus_{{train,val}}.bin")


def split_cells(row):
    """The cells of a Markdown table row, without the outer pipes; a pipe inside backticks stays in its cell."""
    cells, cell, code = [], "", False
    for ch in row.strip().strip("|"):
        if ch == "`":
            code = not code
        if ch == "|" and not code:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += ch
    cells.append(cell.strip())
    return cells


def config_table(lines):
    """(first, end): the lines of the configuration table, its header and separator included; None without one."""
    if CONFIG_TABLE_HEADER not in lines:
        return None
    first = end = lines.index(CONFIG_TABLE_HEADER)
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return first, end


def without_config_table(text):
    """The text with the configuration table's lines left out: the questions' answers are new to the base
    model, as a fine-tune's data is to a released model."""
    lines = text.splitlines(keepends=True)
    span = config_table([line.rstrip("\n") for line in lines])
    return text if span is None else "".join(lines[:span[0]] + lines[span[1]:])


def config_keys(reference_path):
    """[(key, meaning, whether the row names this key alone)] of the configuration reference's key table
    (docs/configuration.md, printed by `shardlm config --reference`), in its order; a section's own row (type
    object) asks nothing."""
    lines = read_text(reference_path).splitlines()
    span = config_table(lines)
    if span is None:
        fail(f"{reference_path}: no configuration table (a line '{CONFIG_TABLE_HEADER}'); "
             "give the project's docs/configuration.md")
    pairs = []
    for row in lines[span[0] + 2:span[1]]:
        cells = split_cells(row)
        if len(cells) != 5:
            fail(f"{reference_path}: a configuration row without 5 cells: {row[:60]!r}; regenerate it with "
                 "bin/shardlm config --reference")
        if cells[1].startswith("object"):
            continue
        pairs.append((cells[0], cells[4], True))
    if len(pairs) < 8:
        fail(f"{reference_path}: the configuration table has {len(pairs)} keys; at least 8 are needed to hold some "
             "back")
    return pairs


def cmd_instructions(args):
    pairs = config_keys(args.reference)
    if args.hold_every is not None and args.hold_every < 2:
        fail(f"--hold-every {args.hold_every}: give 2 or more (every K-th pair is held back)")
    every = args.hold_every or max(2, len(pairs) // HELD)
    os.makedirs(args.out, exist_ok=True)
    train, held, askable = [], [], []
    trained_askable = []
    # a key that two rows describe (alone and in a shared row) has two answers: never asked
    named = [key for key, _, _ in pairs]
    for i, (key, description, alone) in enumerate(pairs):
        alone = alone and named.count(key) == 1
        if args.chat:
            sample = {"messages": [{"role": "user", "content": CHAT_QUESTION.format(key=key)},
                                   {"role": "assistant", "content": description}],
                      "prompt": CHAT_QUESTION.format(key=key), "completion": description}
        else:
            sample = {"prompt": PROMPT_FORMAT.format(key=key), "completion": " " + description}
        is_held = i % every == every - 1 and (args.hold_every is not None or len(held) < HELD)
        (held if is_held else train).append(sample)
        if alone:
            (askable if is_held else trained_askable).append(sample)
    for name, samples in (("train", train), ("held", held)):
        with open(os.path.join(args.out, name + ".jsonl"), "w", encoding="utf-8") as f:
            for s in samples:
                f.write(json.dumps({"messages": s["messages"]} if args.chat else s) + "\n")
    # asked: the shortest answers whose row describes that key alone (not "shape" for n_layer, n_head, n_embd);
    # with --chat three trained questions too, after the held-back ones
    def shortest(rows, n):
        return sorted(rows, key=lambda s: len(s["completion"]))[:n]
    questions = [dict(s, held=True) for s in shortest(askable, 2)]
    if args.chat:
        questions += [dict(s, held=False) for s in shortest(trained_askable, 3)]
    with open(os.path.join(args.out, "questions.jsonl"), "w", encoding="utf-8") as f:
        for s in questions:
            f.write(json.dumps({"prompt": s["prompt"], "answer": s["completion"].strip(), "held": s["held"]}) + "\n")
    print(f"instructions: {len(pairs)} questions from the configuration table of {args.reference}: {len(train)} to "
          f"train on -> {args.out}/train.jsonl, {len(held)} held back -> {args.out}/held.jsonl")


def read_jsonl(path, key):
    """The JSON objects of a file, one a line, each with KEY."""
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        fail(f"{path}: cannot read JSON lines ({e}); give the files tools/run_default.sh writes")
    if not all(isinstance(r, dict) and isinstance(r.get(key), str) for r in rows):
        fail(f"{path}: a line without a \"{key}\" string; give the files tools/run_default.sh writes")
    return rows


def cmd_answers(args):
    questions = read_jsonl(args.questions, "answer")
    answers = [read_jsonl(args.base, "completion"), read_jsonl(args.finetuned, "completion")]
    for model, rows in zip(("base", "fine-tuned"), answers):
        if len(rows) != len(questions):
            fail(f"{model} answers: {len(rows)} lines for {len(questions)} questions; run shardlm generate on "
                 f"{args.questions} again")
    for q, base, tuned in zip(questions, *answers):
        print(q["prompt"].replace("\n", " ") + ("  [held back]" if q.get("held") else "  [trained on]"))
        print(f"  {'reference:':11} {q['answer']}")
        for name, row in (("base", base), ("fine-tuned", tuned)):
            end = FINISH_REASONS.get(row.get("finish_reason"), row.get("finish_reason"))
            print(f"  {name + ':':11} {row['completion'].strip()!r} ({end})")


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit status 2, like bad input
        fail(f"{message}; see tools/default_job.py --help")


def main():
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    p = sub.add_parser("tokenizer", help="train the tokenizer and tokenize the pre-training texts")
    p.add_argument("texts", nargs="+", metavar="TEXT")
    p.add_argument("--out", required=True, metavar="DIR", help="the model directory to hold the tokenizer files")
    p.add_argument("--vocab-size", type=int, default=1024)
    p.add_argument("--shards", required=True, metavar="DIR", help="where corpus_train.bin and corpus_val.bin go")
    p = sub.add_parser("instructions", help="question/answer pairs from the configuration reference's table")
    p.add_argument("reference", metavar="REFERENCE")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--hold-every", type=int, default=None)
    p.add_argument("--chat", action="store_true", help="chat samples ({\"messages\"}) for an instruct model")
    p = sub.add_parser("answers", help="the held-back questions with the base's and the fine-tune's answers")
    p.add_argument("questions", metavar="QUESTIONS")
    p.add_argument("base", metavar="BASE.jsonl")
    p.add_argument("finetuned", metavar="FINETUNED.jsonl")
    args = parser.parse_args()
    if args.command == "tokenizer":
        use_data_venv()
        cmd_tokenizer(args)
    elif args.command == "instructions":
        cmd_instructions(args)
    else:
        cmd_answers(args)


if __name__ == "__main__":
    main()
