#!/usr/bin/env bash
# shardlm inspect and shardlm export: a tiny run saves a checkpoint; inspect
# prints its step and verifies every dataset; export writes the master weights
# as safetensors (fp32, bf16, fp16) and HDF5, checked against the checkpoint
# with h5py and a hand-written safetensors parser (no safetensors package
# needed); a corrupted checkpoint and a bad --dtype exit with status 2.
set -u
cd "$(dirname "$0")/.."
BIN=${SHARDLM_BIN:-bin/shardlm}
PY=/usr/bin/python3
TMP=$(mktemp -d "${SHARDLM_TEST_TMP:-/tmp}/ckpt_tools.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

ok() { echo "ok $1"; }
fail() { echo "FAIL $1: $2"; }

$PY - "$TMP/data.bin" <<'PY'
import struct, sys
n = 4000
toks = [(i * 7) % 50 for i in range(n)]
hdr = [0] * 256
hdr[0], hdr[1], hdr[2] = 20240520, 1, n
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *hdr))
    f.write(struct.pack(f"<{n}H", *toks))
PY
# vocab 100: wte is stored padded to 128 rows, exported with 100
cat > "$TMP/c.json" <<JSON
{
  "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 32, "vocab_size": 100},
  "data": {"train": "$TMP/data.bin", "val": "$TMP/data.bin"},
  "train": {"steps": 6, "eval_every": 0, "sample_tokens": 0},
  "checkpoint": {"dir": "$TMP/ck", "every": 3},
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}
}
JSON

if "$BIN" train "$TMP/c.json" --quiet >"$TMP/train.out" 2>"$TMP/train.err"; then
  ok "setup.train_saves_checkpoint"
else
  fail "setup.train_saves_checkpoint" "status $?: $(head -3 "$TMP/train.err")"
  exit 1
fi
CK=$(ls "$TMP"/ck/step_*.h5 2>/dev/null | sort | tail -1)
[ -n "$CK" ] || { fail "setup.checkpoint_file" "no step_*.h5 in $TMP/ck"; exit 1; }

# --- inspect
if "$BIN" inspect "$TMP/ck" >"$TMP/inspect.out" 2>"$TMP/inspect.err"; then
  ok "inspect.exit_0"
else
  fail "inspect.exit_0" "status $?: $(head -3 "$TMP/inspect.err")"
fi
grep -q '^step: 6$' "$TMP/inspect.out" && ok "inspect.step" || fail "inspect.step" "$(grep step "$TMP/inspect.out")"
grep -q '^checksum status: all [0-9]* datasets verified$' "$TMP/inspect.out" && ok "inspect.verified" ||
  fail "inspect.verified" "$(tail -1 "$TMP/inspect.out")"
grep -q '^world size at save: 1$' "$TMP/inspect.out" && ok "inspect.world" || fail "inspect.world" "no world line"
grep -q "vocab_size 100" "$TMP/inspect.out" && ok "inspect.model_shape" || fail "inspect.model_shape" "no vocab_size 100"
"$BIN" inspect --help | grep -q "CRC-32C" && ok "inspect.help" || fail "inspect.help" "no help text"
"$BIN" export --help | grep -q "trimmed" && ok "export.help" || fail "export.help" "no help text"

# --- export
for dt in fp32 bf16 fp16; do
  if "$BIN" export "$CK" --dtype $dt "$TMP/w_$dt.safetensors" >"$TMP/exp.out" 2>"$TMP/exp.err"; then
    ok "export.safetensors_$dt"
  else
    fail "export.safetensors_$dt" "status $?: $(head -3 "$TMP/exp.err")"
  fi
  if "$BIN" export "$CK" --dtype $dt "$TMP/w_$dt.h5" >"$TMP/exp.out" 2>"$TMP/exp.err"; then
    ok "export.h5_$dt"
  else
    fail "export.h5_$dt" "status $?: $(head -3 "$TMP/exp.err")"
  fi
done

$PY - "$CK" "$TMP" <<'PY'
import json, struct, sys
import h5py, numpy as np
ck, tmp = sys.argv[1], sys.argv[2]

def check(name, cond, why):
    print(f"ok {name}" if cond else f"FAIL {name}: {why}")

with h5py.File(ck, "r") as f:
    vocab = int(f.attrs["vocab_size"])
    master = {k: f["master"][k][()] for k in f["master"]}
master["wte.weight"] = master["wte.weight"][:vocab]

def bf16_bits(x):
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r

def expected_bits(x, dt):
    if dt == "fp32":
        return x.astype(np.float32).view(np.uint32)
    if dt == "fp16":
        return x.astype(np.float16).view(np.uint16)
    return bf16_bits(x)

def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    return header, data

st_dtype = {"fp32": ("F32", "<u4"), "fp16": ("F16", "<u2"), "bf16": ("BF16", "<u2")}
for dt in ("fp32", "bf16", "fp16"):
    name = f"safetensors_{dt}"
    try:
        header, data = read_safetensors(f"{tmp}/w_{dt}.safetensors")
    except Exception as e:
        check(name + "_parse", False, repr(e)); continue
    meta = header.pop("__metadata__", None)
    check(name + "_metadata", meta == {"format": "pt"}, repr(meta))
    check(name + "_names", set(header) == set(master), f"{sorted(set(header) ^ set(master))}")
    bad, end, offsets = [], 0, sorted((v["data_offsets"], k) for k, v in header.items())
    for (b, e), k in offsets:
        if b != end: bad.append(f"{k}: gap at {end}..{b}")
        end = e
    if end != len(data): bad.append(f"data ends at {end}, file has {len(data)}")
    for k, v in header.items():
        if k not in master: continue
        want = master[k]
        if v["dtype"] != st_dtype[dt][0]: bad.append(f"{k}: dtype {v['dtype']}"); continue
        if tuple(v["shape"]) != want.shape: bad.append(f"{k}: shape {v['shape']} want {want.shape}"); continue
        b, e = v["data_offsets"]
        got = np.frombuffer(data[b:e], dtype=st_dtype[dt][1]).reshape(want.shape)
        if not np.array_equal(got, expected_bits(want, dt)): bad.append(f"{k}: values differ")
    check(name + "_values", not bad, "; ".join(bad[:5]))
    check(name + "_wte_trimmed", tuple(header["wte.weight"]["shape"]) == (vocab, master["wte.weight"].shape[1]),
          repr(header["wte.weight"]["shape"]))

for dt in ("fp32", "bf16", "fp16"):
    name = f"h5_{dt}"
    bad = []
    try:
        with h5py.File(f"{tmp}/w_{dt}.h5", "r") as f:
            check(name + "_names", set(f) == set(master), f"{sorted(set(f) ^ set(master))}")
            for k, want in master.items():
                ds = f[k]
                if ds.shape != want.shape: bad.append(f"{k}: shape {ds.shape} want {want.shape}"); continue
                a = ds.attrs["dtype"]
                a = a.decode() if isinstance(a, bytes) else a
                if a != dt: bad.append(f"{k}: dtype attribute {a}")
                got = ds[()]
                if dt == "fp32" and got.dtype != np.float32: bad.append(f"{k}: element type {got.dtype}")
                if dt == "fp16" and got.dtype != np.float16: bad.append(f"{k}: element type {got.dtype}")
                if dt == "bf16" and got.dtype != np.uint16: bad.append(f"{k}: element type {got.dtype}")
                bits = got.view(np.uint32 if dt == "fp32" else np.uint16)
                if not np.array_equal(bits, expected_bits(want, dt)): bad.append(f"{k}: values differ")
    except Exception as e:
        bad.append(repr(e))
    check(name + "_values", not bad, "; ".join(bad[:5]))
PY

# --- bad input: status 2, one line naming the problem
# expect_error NAME PATTERN ARGS...
expect_error() {
  local name=$1 pattern=$2
  shift 2
  "$BIN" "$@" >"$TMP/out" 2>"$TMP/err"
  local status=$?
  if [ "$status" -ne 2 ]; then
    fail "$name" "exit status $status, want 2; stderr: $(head -3 "$TMP/err")"
  elif ! grep -q -- "$pattern" "$TMP/err"; then
    fail "$name" "message lacks '$pattern': $(head -3 "$TMP/err")"
  else
    ok "$name"
  fi
}
expect_error "bad.export_dtype" "--dtype 'fp8'" export "$CK" --dtype fp8 "$TMP/x.safetensors"
# OUT without .safetensors or .h5 is a Hugging Face directory: an existing file there is refused, untouched
echo "not a model" >"$TMP/x.bin"
expect_error "bad.export_dir_is_a_file" "is not a directory" export "$CK" --dtype fp32 "$TMP/x.bin"
if [ "$(cat "$TMP/x.bin")" = "not a model" ]; then ok "bad.export_dir_is_a_file.untouched"; else fail "bad.export_dir_is_a_file.untouched" "the file changed"; fi
expect_error "bad.inspect_missing" "$TMP/nope.h5" inspect "$TMP/nope.h5"
# OUT = the checkpoint itself (by its name, through a link, through DIR/latest):
# refused, and the checkpoint keeps every byte
sum_before=$(sha256sum "$CK" | cut -d' ' -f1)
expect_error "bad.export_onto_itself" "is the checkpoint being exported" export "$CK" --dtype fp32 "$CK"
ln -sf "$CK" "$TMP/link.h5"
expect_error "bad.export_onto_link" "is the checkpoint being exported" export "$CK" --dtype fp32 "$TMP/link.h5"
expect_error "bad.export_latest_onto_itself" "is the checkpoint being exported" export "$(dirname "$CK")/latest" --dtype fp32 "$CK"
[ "$(sha256sum "$CK" | cut -d' ' -f1)" = "$sum_before" ] && ok "bad.export_left_checkpoint_unchanged" ||
  fail "bad.export_left_checkpoint_unchanged" "$CK changed"

cp "$CK" "$TMP/corrupt.h5"
off=$($PY - "$TMP/corrupt.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    ds = f["adam_v"]["h.1.mlp.c_fc.weight"]
    print(ds.id.get_offset() + ds.size * ds.dtype.itemsize // 2)
PY
)
if [ -n "$off" ]; then
  $PY - "$TMP/corrupt.h5" "$off" <<'PY'
import sys
path, off = sys.argv[1], int(sys.argv[2])
with open(path, "r+b") as f:
    f.seek(off); b = f.read(1); f.seek(off); f.write(bytes([b[0] ^ 0xFF]))
PY
  expect_error "bad.inspect_corrupted" "/adam_v/h.1.mlp.c_fc.weight" inspect "$TMP/corrupt.h5"
else
  fail "bad.inspect_corrupted" "could not find the dataset offset"
fi
