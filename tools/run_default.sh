#!/usr/bin/env bash
# The default job of `make run`: a small GPT-2 trained on the CPU on the
# project's own sources, with a text sample at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/make_corpus.sh
exec bin/shardlm train input/default.json "$@"
