#!/usr/bin/env bash
# t_text_to_bin — tools/text_to_bin.py: header bytes, token counts, the
# train/val split, decoding back to the original text, and bad input exit 2.
set -u
cd "$(dirname "$0")/.."
tool=tools/text_to_bin.py
tmp=$(mktemp -d "${SHARDLM_TEST_TMP:-/tmp}/t_text_to_bin.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

failures=0
check() { # NAME CONDITION-STATUS WHY
  if [ "$2" -eq 0 ]; then echo "ok $1"; else echo "FAIL $1: $3"; failures=$((failures + 1)); fi
}

# Reads the first three little-endian int32 of the header: magic version count.
header() { od -A n -t d4 -N 12 --endian=little "$1" | tr -s ' ' | sed 's/^ //'; }

# Two inputs, one of them with non-ASCII bytes, 100 bytes in all.
printf 'hello, world\n' >"$tmp/a.txt"                            # 13 bytes
printf 'caf\xc3\xa9 %s\n' "$(printf 'x%.0s' $(seq 1 80))" >"$tmp/b.txt" # 87 bytes
cat "$tmp/a.txt" "$tmp/b.txt" >"$tmp/all.txt"
total=$(wc -c <"$tmp/all.txt")
check input_size "$([ "$total" -eq 100 ]; echo $?)" "test input has $total bytes, want 100"

out=$(python3 "$tool" "$tmp/a.txt" "$tmp/b.txt" --out-dir "$tmp/out" --val-fraction 0.1 --name tiny 2>&1)
check encode_exit_0 $? "$out"
echo "$out" | grep -q "tiny_train.bin: 90 tokens"
check prints_train_count $? "output: $out"
echo "$out" | grep -q "tiny_val.bin: 10 tokens"
check prints_val_count $? "output: $out"

train=$tmp/out/tiny_train.bin val=$tmp/out/tiny_val.bin
h=$(header "$train")
check train_header "$([ "$h" = "20240520 1 90" ]; echo $?)" "header '$h', want '20240520 1 90'"
h=$(header "$val")
check val_header "$([ "$h" = "20240520 1 10" ]; echo $?)" "header '$h', want '20240520 1 10'"
size=$(wc -c <"$train")
check train_size "$([ "$size" -eq $((1024 + 90 * 2)) ]; echo $?)" "size $size, want 1204"
# The rest of the header is zero.
rest=$(od -v -A n -t d4 -j 12 -N 1012 "$train" | tr -s ' \n' '\n' | grep -v '^$' | sort -u | tr '\n' ' ')
check header_rest_zero "$([ "$rest" = "0 " ]; echo $?)" "header ints 3..255: '$rest'"
# First token is 'h' = 104 as little-endian uint16.
tok=$(od -A n -t u2 -j 1024 -N 2 --endian=little "$train" | tr -d ' ')
check first_token "$([ "$tok" = 104 ]; echo $?)" "first token $tok, want 104"

python3 "$tool" --decode "$train" >"$tmp/train.txt" && python3 "$tool" --decode "$val" >"$tmp/val.txt"
check decode_exit_0 $? "decode failed"
cat "$tmp/train.txt" "$tmp/val.txt" | cmp -s - "$tmp/all.txt"
check decode_roundtrip $? "train+val decoded differs from the input"
head -c 90 "$tmp/all.txt" | cmp -s - "$tmp/train.txt"
check train_is_prefix $? "train shard is not the first 90 bytes"

# Default name: the first input's name without extension; no val file at fraction 0.
python3 "$tool" "$tmp/a.txt" --out-dir "$tmp/out2" --val-fraction 0 >/dev/null 2>&1
check fraction_0_exit_0 $? "encode with --val-fraction 0 failed"
check default_name "$([ -f "$tmp/out2/a_train.bin" ] && [ ! -e "$tmp/out2/a_val.bin" ]; echo $?)" \
  "$(ls "$tmp/out2")"

# Bad input: exit 2 and one line naming the problem.
bad() { # NAME EXPECTED-SUBSTRING ARGS...
  local name=$1 want=$2; shift 2
  local err rc
  err=$(python3 "$tool" "$@" 2>&1 >/dev/null); rc=$?
  check "${name}_exit_2" "$([ "$rc" -eq 2 ]; echo $?)" "exit status $rc, stderr: $err"
  echo "$err" | grep -q -- "$want"
  check "${name}_message" $? "want '$want' in: $err"
}
bad missing_input "missing.txt" "$tmp/missing.txt" --out-dir "$tmp/out3"
bad missing_input_one_line "^text_to_bin: error: cannot read input" "$tmp/missing.txt" --out-dir "$tmp/out3"
: >"$tmp/empty.txt"
bad empty_input "is empty" "$tmp/empty.txt" --out-dir "$tmp/out3"
bad no_out_dir "out-dir" "$tmp/a.txt"
bad bad_fraction "val-fraction" "$tmp/a.txt" --out-dir "$tmp/out3" --val-fraction 1.5
bad decode_missing "nope.bin" --decode "$tmp/nope.bin"
head -c 500 "$train" >"$tmp/short.bin"
bad decode_short "shorter than" --decode "$tmp/short.bin"
# A uint32 (version 2) shard with a token over 255 is not byte-level text.
python3 -c 'import struct,sys; h=[20240520,2,3]+[0]*253; open(sys.argv[1],"wb").write(struct.pack("<256i",*h)+struct.pack("<3I",104,300,105))' "$tmp/wide.bin"
bad decode_not_bytes "token 300 at position 1" --decode "$tmp/wide.bin"
check no_partial_output "$([ ! -e "$tmp/out3/empty_train.bin" ]; echo $?)" "a shard was written for bad input"
[ "$failures" -eq 0 ]
