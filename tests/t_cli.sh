#!/usr/bin/env bash
# End-to-end checks of the command line: a tiny run trains, and every kind of
# bad input gets one line on stderr naming the problem, exit status 2, no crash.
set -u
cd "$(dirname "$0")/.."
BIN=${SHARDLM_BIN:-bin/shardlm}
TMP=$(mktemp -d "${SHARDLM_TEST_TMP:-/tmp}/cli.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

ok() { echo "ok $1"; }
fail() { echo "FAIL $1: $2"; }

# write_bin PATH MAGIC VERSION HEADER_COUNT N_TOKENS [BAD_TOKEN]: llm.c shard of a period-50 sequence
write_bin() {
  python3 - "$@" <<'PY'
import struct, sys
path, magic, version, count, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
toks = [(i * 7) % 50 for i in range(n)]
if len(sys.argv) > 6:
    toks[n // 2] = int(sys.argv[6])
hdr = [0] * 256
hdr[0], hdr[1], hdr[2] = magic, version, count
with open(path, "wb") as f:
    f.write(struct.pack("<256i", *hdr))
    f.write(struct.pack(f"<{n}H", *toks))
PY
}

write_bin "$TMP/good.bin" 20240520 1 4000 4000
cat > "$TMP/good.json" <<JSON
{
  "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 32, "vocab_size": 64},
  "data": {"train": "$TMP/good.bin", "val": "$TMP/good.bin"},
  "train": {"steps": 30, "metrics": "$TMP/metrics.jsonl", "eval_every": 10, "sample_tokens": 20},
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}
}
JSON

# --- a run that works
if "$BIN" train "$TMP/good.json" >"$TMP/out" 2>"$TMP/err"; then
  ok "train.tiny_run_exits_0"
else
  fail "train.tiny_run_exits_0" "status $?: $(head -3 "$TMP/err")"
fi
if python3 - "$TMP/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
first, last = rows[0]["loss"], rows[-1]["loss"]
assert len(rows) == 30, len(rows)
# a period-50 sequence: a working model learns it quickly
assert last < 0.5 * first, (first, last)
PY
then ok "train.loss_falls"; else fail "train.loss_falls" "see the metrics above"; fi
grep -q '"val_loss"' "$TMP/metrics.jsonl" && ok "train.validation_logged" || fail "train.validation_logged" "no val_loss line"
grep -q -- "---- sample" "$TMP/out" && ok "train.sample_printed" || fail "train.sample_printed" "no sample"
grep -q "memory per rank at the end" "$TMP/out" && ok "train.memory_table" || fail "train.memory_table" "no table"
"$BIN" train --help | grep -q -- "--deepspeed" && ok "cli.train_help" || fail "cli.train_help" "no help text"

# expect_error NAME PATTERN ARGS...: status 2, one stderr line containing PATTERN
expect_error() {
  local name=$1 pattern=$2
  shift 2
  "$BIN" "$@" >"$TMP/out" 2>"$TMP/err"
  local status=$? lines
  lines=$(grep -c . "$TMP/err")
  if [ "$status" -ne 2 ]; then
    fail "$name" "exit status $status, want 2; stderr: $(head -3 "$TMP/err")"
  elif [ "$lines" -ne 1 ]; then
    fail "$name" "$lines stderr lines, want 1: $(head -5 "$TMP/err" | tr '\n' '|')"
  elif ! grep -q -- "$pattern" "$TMP/err"; then
    fail "$name" "message lacks '$pattern': $(cat "$TMP/err")"
  else
    ok "$name"
  fi
}

# config_with SED_EXPR: $TMP/c.json is good.json with one substitution
config_with() { sed "$1" "$TMP/good.json" >"$TMP/c.json"; }

expect_error "bad.no_command" "usage"
expect_error "bad.unknown_command" "unknown command 'trian'" trian
expect_error "bad.train_without_config" "exactly one CONFIG" train
expect_error "bad.missing_config" "$TMP/nope.json" train "$TMP/nope.json"
printf '{\n  "model": {"n_layer": 2,,}\n}\n' >"$TMP/c.json"
expect_error "bad.malformed_json_line_column" "c.json:2:" train "$TMP/c.json"
config_with 's/"n_layer": 2/"n_layers": 2/'
expect_error "bad.unknown_key" "model.n_layers" train "$TMP/c.json"
config_with 's/"n_layer": 2/"n_layer": "two"/'
expect_error "bad.wrong_type" "model.n_layer" train "$TMP/c.json"
config_with 's/"n_layer": 2/"n_layer": 0/'
expect_error "bad.zero_layers" "model.n_layer" train "$TMP/c.json"
config_with 's/"n_embd": 32/"n_embd": -32/'
expect_error "bad.negative_embd" "model.n_embd" train "$TMP/c.json"
config_with 's/"train_micro_batch_size_per_gpu": 4/"train_micro_batch_size_per_gpu": 0/'
expect_error "bad.zero_micro_batch" "train_micro_batch_size_per_gpu" train "$TMP/c.json"
config_with 's/"n_head": 2/"n_head": 3/'
expect_error "bad.embd_not_divisible_by_heads" "n_head" train "$TMP/c.json"
config_with 's/"val": /"seq_len": 64, "val": /'
expect_error "bad.sequence_longer_than_context" "data.seq_len" train "$TMP/c.json"
expect_error "bad.batch_triple" "train_batch_size" train "$TMP/good.json" --set train_batch_size=12
expect_error "bad.set_without_value" "train.steps" train "$TMP/good.json" --set train.steps
expect_error "bad.missing_data" "$TMP/missing.bin" train "$TMP/good.json" --set "data.train=$TMP/missing.bin"
: >"$TMP/empty.bin"
expect_error "bad.empty_data" "empty.bin" train "$TMP/good.json" --set "data.train=$TMP/empty.bin"
write_bin "$TMP/trunc.bin" 20240520 1 5000 4000
expect_error "bad.truncated_data" "trunc.bin" train "$TMP/good.json" --set "data.train=$TMP/trunc.bin"
write_bin "$TMP/magic.bin" 12345 1 4000 4000
expect_error "bad.bad_magic" "magic" train "$TMP/good.json" --set "data.train=$TMP/magic.bin"
write_bin "$TMP/vocab.bin" 20240520 1 4000 4000 64
expect_error "bad.token_out_of_vocab" "vocab" train "$TMP/good.json" --set "data.train=$TMP/vocab.bin"
expect_error "bad.bad_val_data" "magic" train "$TMP/good.json" --set "data.val=$TMP/magic.bin"
expect_error "bad.lora_r_zero" "lora.r" train "$TMP/good.json" --set lora.r=0
expect_error "bad.lora_r_negative" "lora.r" train "$TMP/good.json" --set lora.r=-4
expect_error "bad.lora_alpha_zero" "lora.alpha" train "$TMP/good.json" --set lora.alpha=0
expect_error "bad.lora_alpha_negative" "lora.lora_alpha" train "$TMP/good.json" --set lora.lora_alpha=-1
expect_error "bad.lora_dropout_one" "lora.dropout" train "$TMP/good.json" --set lora.dropout=1
expect_error "bad.lora_dropout_negative" "lora.dropout" train "$TMP/good.json" --set lora.dropout=-0.1
expect_error "bad.lora_modules_to_save_missing" "lora.modules_to_save" train "$TMP/good.json" --set 'lora.modules_to_save=["lm_head"]'
expect_error "bad.lora_init_unknown" "lora.init" train "$TMP/good.json" --set 'lora.init="pissa"'
expect_error "bad.lora_target_matches_nothing" "lora.target_modules" train "$TMP/good.json" --set 'lora.target_modules=["q_proj"]'
expect_error "bad.offload_at_stage_0" "offload_optimizer" train "$TMP/good.json" --set zero_optimization.offload_optimizer.device=cpu

# offload_optimizer.pin_memory false: the optimizer state in ordinary host memory, not pinned
"$BIN" train "$TMP/good.json" --set train.steps=2 --set zero_optimization.stage=2 \
  --set zero_optimization.offload_optimizer.device=cpu --set zero_optimization.offload_optimizer.pin_memory=false \
  --set "train.metrics=$TMP/pin.jsonl" >"$TMP/out" 2>"$TMP/err"
if python3 - "$TMP/pin.jsonl" <<'PY'
import json, sys
mem = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["memory"]
for c in ("fp32 master weights", "Adam m", "Adam v", "fp32 gradient shard"):
    assert mem[c]["space"] == "host" and mem[c]["planned"] > 0 and mem[c]["planned"] == mem[c]["peak"], (c, mem[c])
PY
then ok "offload.pin_memory_false_uses_host"; else fail "offload.pin_memory_false_uses_host" "see above"; fi
