#!/usr/bin/env bash
# Builds the default corpus from the project's own text (README, sources,
# scripts, configs) and tokenizes it byte by byte into llm.c shards:
#   build/data/corpus_train.bin, build/data/corpus_val.bin
# Nothing is downloaded; the corpus is whatever this checkout holds.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/data
mkdir -p "$out"
mapfile -t files < <(find README.md src jobs tools input tests -type f \
  \( -name '*.md' -o -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.sh' -o -name '*.py' -o -name '*.json' \) \
  2>/dev/null | LC_ALL=C sort)
python3 tools/text_to_bin.py "${files[@]}" --out-dir "$out" --name corpus --val-fraction 0.1 >/dev/null
