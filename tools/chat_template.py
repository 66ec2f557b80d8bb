#!/usr/bin/env python3
"""chat_template — renders conversations with a tokenizer's chat template, as
transformers' apply_chat_template(messages, tokenize=False,
add_generation_prompt=True) does; shardlm generate --chat runs it.

    tools/chat_template.py --tokenizer DIR_OR_tokenizer.json [--chat-template FILE] < IN > OUT

Each line of IN is a JSON list of {"role", "content"} messages; each line of
OUT is the rendered prompt as a JSON string, in the same order. The template
is compiled exactly as tools/prepare_data.py compiles it for chat samples
(the same code), so a fine-tune's training prompts and generate's prompts
agree. Errors: one line on stderr, exit status 2.
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from toolenv import use_venv  # noqa: E402

use_venv("chat_template", __file__, ("h5py", "jinja2", "tokenizers"))

import argparse  # noqa: E402

from prepare_data import ImagesInData, Tokenizer, fail, refuse_images  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--chat-template", metavar="FILE")
    a = ap.parse_args()
    tok = Tokenizer(a.tokenizer, a.chat_template)
    if tok.template is None:  # never the raw text instead: the caller asked for the template
        fail(f"chat_template: {tok.no_template}; drop --chat, or give --chat-template FILE")
    for number, line in enumerate(sys.stdin, 1):
        messages = json.loads(line)
        try:
            refuse_images(messages)
        except ImagesInData as e:
            fail(f"prompt {number}: {e}")
        try:
            text = tok.render(messages, True)
        except Exception as e:  # the template's raise_exception, or any error inside it
            fail(f"prompt {number}: the chat template failed ({type(e).__name__}: {e}); fix the messages")
        print(json.dumps(text), flush=False)


if __name__ == "__main__":
    main()
