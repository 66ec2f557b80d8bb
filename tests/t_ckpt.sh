#!/usr/bin/env bash
# Parallel HDF5 checkpoints under MPI: build/tests/test_ckpt at 2 and 3 ranks
# (its "ok"/"FAIL" lines, printed by rank 0, pass through with the world size
# prefixed), then the saved files seen without shardlm: h5dump -H -p shows
# every tensor under its Hugging Face name at full shape with its CRC-32C
# table, and h5py reads tensors and attributes with the expected values and
# Python's crc32c package agrees with every stored checksum.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
TEST_BIN=$BUILD/tests/test_ckpt
TMP=$(mktemp -d "${SHARDLM_TEST_TMP:-/tmp}/t_ckpt.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

ok() { echo "ok $1"; }
fail() { echo "FAIL $1: $2"; }

if [ ! -x "$TEST_BIN" ]; then
  fail build "$TEST_BIN is missing; run 'make all'"
  exit 1
fi

for np in 2 3; do
  mkdir -p "$TMP/np$np"
  SHARDLM_TEST_TMP=$TMP/np$np SHARDLM_CKPT_KEEP=1 timeout 300 \
    mpirun -np "$np" --oversubscribe "$TEST_BIN" >"$TMP/np$np.log" 2>&1
  rc=$?
  sed -n 's/^ok /ok np'"$np"'_/p; s/^FAIL /FAIL np'"$np"'_/p' "$TMP/np$np.log"
  if [ "$rc" -eq 0 ] && grep -q '^ok ' "$TMP/np$np.log"; then
    ok "np${np}_exit_status"
  else
    fail "np${np}_exit_status" "mpirun -np $np $TEST_BIN exited with $rc; last lines: $(tail -3 "$TMP/np$np.log" | tr '\n' ' ')"
  fi
done

# Several ranks fail together: a corrupted piece read by both ranks, and ranks
# that pass different tensors to ckpt_save. mpirun must end with the status of
# the failing ranks and their one-line message.
# expect_mpi NAME STATUS PHRASE ARGS...
expect_mpi() {
  local name=$1 want=$2 phrase=$3
  shift 3
  timeout 120 mpirun -np 2 --oversubscribe "$TEST_BIN" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
  local rc=$?
  if [ "$rc" -eq "$want" ] && grep -qF -- "$phrase" "$TMP/$name.err"; then
    ok "$name"
  else
    fail "$name" "exit status $rc (want $want), stderr: $(grep shardlm "$TMP/$name.err" | head -2 | tr '\n' ' ')"
  fi
}
flipped=$(ls "$TMP"/np2/test_ckpt.*/flipped.h5 2>/dev/null | head -1)
if [ -n "$flipped" ]; then
  expect_mpi np2_flipped_byte_all_ranks 2 "dataset '/master/wte.weight' fails its CRC32C check" --read "$flipped" master 0
else
  fail np2_flipped_byte_all_ranks "no flipped.h5 under $TMP/np2"
fi
expect_mpi np2_layout_mismatch 1 "the ranks passed different tensors" --save-mismatch "$TMP/mismatch"

for np in 2 3; do
  file=$(ls "$TMP"/np$np/test_ckpt.*/step_000030.h5 2>/dev/null | head -1)
  if [ -z "$file" ]; then
    fail "np${np}_file_kept" "no step_000030.h5 under $TMP/np$np"
    continue
  fi
  ok "np${np}_file_kept"

  header=$(h5dump -H -p "$file" 2>&1)
  for spec in 'wte.weight|( 7, 5 )' 'h.0.ln_1.weight|( 13 )' 'h.0.attn.c_attn.weight|( 5, 15 )' \
              'h.0.mlp.c_fc.weight|( 1100, 2048 )'; do
    name=${spec%%|*} shape=${spec#*|}
    block=$(printf '%s\n' "$header" | awk -v want="DATASET \"$name\"" \
            'index($0, want) { on = 1 } on { print } on && /^      }$/ { exit }')
    if printf '%s\n' "$block" | grep -qF "SIMPLE { $shape / $shape }" &&
       printf '%s\n' "$block" | grep -q 'ATTRIBUTE "crc32c"' &&
       printf '%s\n' "$block" | grep -q 'ATTRIBUTE "crc32c_ends"' &&
       printf '%s\n' "$block" | grep -q 'CONTIGUOUS'; then
      ok "np${np}_h5dump_$name"
    else
      fail "np${np}_h5dump_$name" "want contiguous dataset $name of shape $shape with crc32c attributes in h5dump -H -p $file"
    fi
  done
  groups=$(printf '%s\n' "$header" | grep -c -E 'GROUP "(master|adam_m|adam_v|rank_state)"')
  [ "$groups" -eq 4 ] && ok "np${np}_h5dump_groups" || fail "np${np}_h5dump_groups" "found $groups of 4 groups"

  # h5py, independent of shardlm: the values are those test_ckpt.c's value_at makes.
  /usr/bin/python3 - "$file" "$np" <<'PY'
import sys
import crc32c
import h5py
import numpy as np

path, world = sys.argv[1], int(sys.argv[2])
prefix = f"np{world}_h5py"

def splitmix64(state):
    z = state + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))

def values(step, group, tensor, numel):
    i = np.arange(numel, dtype=np.uint64)
    state = np.uint64(step * 1000003 + group * 10007 + tensor * 101) + i
    r = splitmix64(state)
    exponent = np.uint64(100) + (r >> np.uint64(40)) % np.uint64(50)
    bits = (r & np.uint64(0x807FFFFF)) | (exponent << np.uint64(23))
    return bits.astype(np.uint32).view(np.float32)

def check(name, cond, why):
    print(f"ok {prefix}_{name}" if cond else f"FAIL {prefix}_{name}: {why}")

with h5py.File(path, "r") as f:
    for group_index, group in enumerate(["master", "adam_m", "adam_v"]):
        # (name, index in test_ckpt.c's g_tensors, shape)
        for name, tensor_index, shape in [("wte.weight", 0, (7, 5)), ("h.0.mlp.c_fc.weight", 3, (1100, 2048))]:
            ds = f[group][name]
            want = values(30, group_index, tensor_index, int(np.prod(shape))).reshape(shape)
            got = ds[()]
            check(f"{group}_{name}", ds.shape == shape and ds.dtype == np.float32 and
                  np.array_equal(got.view(np.uint32), want.view(np.uint32)),
                  f"shape {ds.shape} dtype {ds.dtype}, {np.count_nonzero(got != want)} values differ")
    check("attrs", int(f.attrs["step"]) == 30 and int(f.attrs["world_size"]) == world and
          f.attrs["format"] == b"shardlm-checkpoint" and float(f.attrs["loss_scale"]) == 32768.0,
          f"step {f.attrs['step']} world {f.attrs['world_size']} format {f.attrs['format']!r}")
    # Every dataset's CRC-32C pieces, recomputed from its bytes with Python's
    # crc32c package: contiguous pieces covering the dataset, none longer than
    # CKPT_PIECE_ELEMS, each with the stored checksum.
    piece_elems = 1 << 18
    n_sets = n_pieces = 0
    bad = []
    def visit(name, obj):
        global n_sets, n_pieces
        if not isinstance(obj, h5py.Dataset):
            return
        n_sets += 1
        flat = obj[()].reshape(-1)
        raw = flat.astype(flat.dtype.newbyteorder("<"), copy=False).tobytes()
        crcs, ends = obj.attrs["crc32c"], obj.attrs["crc32c_ends"]
        start = 0
        for crc, end in zip(crcs.tolist(), ends.tolist()):
            n_pieces += 1
            if end <= start and flat.size or end - start > piece_elems:
                bad.append(f"{name}: piece [{start}, {end})")
            elif crc32c.crc32c(raw[start * flat.itemsize:end * flat.itemsize]) != crc:
                bad.append(f"{name}: crc of [{start}, {end})")
            start = end
        if start != flat.size:
            bad.append(f"{name}: pieces end at {start}, dataset has {flat.size}")
    f.visititems(visit)
    check("crc32c_matches_python", n_sets == 14 and not bad and n_pieces >= 13 + 3 * 8,
          f"{n_sets} datasets, {n_pieces} pieces; {bad[:3]}")
    rows = f["rank_state/data_position"][()]
    check("rank_state", rows.shape == (world, 2) and
          all(int(rows[r, 0]) == 1000 + 7 * r + 30 for r in range(world)), f"data_position {rows.tolist()}")
PY
  [ $? -eq 0 ] || fail "np${np}_h5py_exit_status" "python exited non-zero"
done
