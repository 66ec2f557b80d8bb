#!/usr/bin/env bash
# Hugging Face import and export of a ~1B-parameter Llama at N = 2 against a
# plain sequential read and a plain sequential write + fsync of the same bytes
# (issue 17). One run, about 8.5 minutes on a 2-core machine with the default 3
# rounds; needs ~22 GiB of memory and ~19 GB free in --dir (default
# /tmp/shardlm-hf-io). Arguments go to tools/bench/hf_io.py (see there for the
# shape, the cache policy and what each figure times); --no-build skips make.
#
#   bash tools/bench/hf_io.sh [--no-build] [--rounds R] [--layers L] [--dir DIR] [--settle S] [--keep]
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
args=()
build=1
for a in "$@"; do
    if [ "$a" = "--no-build" ]; then build=0; else args+=("$a"); fi
done
"$PY" tools/bench/hf_io.py --check-only "${args[@]}"
if [ "$build" = 1 ]; then
    mkdir -p build/bench
    make --no-print-directory all >build/bench/make.log 2>&1 || { tail -20 build/bench/make.log >&2; exit 1; }
    rm -f build/bench/make.log
fi
exec "$PY" tools/bench/hf_io.py "${args[@]}"
