#!/usr/bin/env bash
# The GPU kit (tools/gpu-kit.sh, issue 15) is complete: assembled into a bare
# root that holds only the base libraries (glibc, libstdc++, libgcc_s, libgomp;
# bash to source env.sh) and the kit, so every system copy of Open MPI, PMIx,
# HDF5, jansson, PCRE2, utf8proc, nettle and OpenBLAS is out of reach, it
#   * stays within its 48 MiB budget, with a MANIFEST naming every file's package;
#   * supplies the headers and libraries to build bin/shardlm and (CUDA=1)
#     bin/shardlm-cuda with make KIT=... (objects of the normal build, relinked);
#   * resolves every library of mpirun, orted, shardlm and each carried plugin
#     inside the kit or the base set (shardlm-cuda: all but the CUDA libraries);
#   * runs `mpirun -np 2 shardlm train` with a checkpoint.dir (parallel HDF5
#     over MPI-IO) to exit 0, with no plugin failing to load.
# Needs root (unshare -m, chroot), as the rest of the suite runs.
set -u
cd "$(dirname "$0")/.."
REPO=$PWD
TMP=$(mktemp -d "${SHARDLM_TEST_TMP:-/tmp}/t_gpu_kit.XXXXXX")
trap '[ -n "${KEEP_TMP:-}" ] && echo "kept $TMP" || rm -rf "$TMP"' EXIT
ROOT=$TMP/root
KIT=$ROOT/kit
KIT_BUDGET=$((48 * 1048576))

ok() { echo "ok $1"; }
fail() { echo "FAIL $1: $2"; }

# --- the kit, assembled where the bare root will see it as /kit
if bash tools/gpu-kit.sh "$KIT" >"$TMP/assemble.log" 2>&1; then
  ok assemble
else
  fail assemble "tools/gpu-kit.sh: $(tail -3 "$TMP/assemble.log" | tr '\n' ' ')"
  exit 1
fi
total=$(sed -n 's/^# total \([0-9]*\) bytes.*/\1/p' "$KIT/MANIFEST")
if [ -n "$total" ] && [ "$total" -le "$KIT_BUDGET" ] && [ "$(du -sb "$KIT" | cut -f1)" -le "$KIT_BUDGET" ]; then
  ok "kit_budget ($total bytes)"
else
  fail kit_budget "MANIFEST says '${total:-?}' bytes, du says $(du -sb "$KIT" | cut -f1); budget $KIT_BUDGET"
fi
listed=$(grep -vc '^#' "$KIT/MANIFEST")
files=$(find "$KIT" -type f ! -name MANIFEST | wc -l)
unowned=$(awk '!/^#/ && $3 == "written-by-tools/gpu-kit.sh" {print $2}' "$KIT/MANIFEST" | grep -v -e '^env.sh$' -e '^build-nomake.sh$' -e '^lib/lib[a-z0-9-]*\.so$')
if [ "$listed" -eq "$files" ] && [ -z "$unowned" ] && grep -q ' lib/libmpi.so.40 libopenmpi3$' "$KIT/MANIFEST"; then
  ok manifest
else
  fail manifest "$listed lines for $files files; without a package: ${unowned:-none}"
fi
base=$(cd "$KIT" && find . \( -name 'libc.so*' -o -name 'libm.so*' -o -name 'libstdc++*' -o -name 'libgcc_s*' \
  -o -name 'libgomp*' -o -name 'libcuda*' -o -name 'libcublas*' -o -name 'libnccl*' -o -name 'ld-linux*' \) | tr '\n' ' ')
[ -z "$base" ] && ok no_base_or_cuda_libs || fail no_base_or_cuda_libs "the kit carries $base"

# env.sh unpacks OpenBLAS outside the kit (on the host here: the root has no
# xz), and the kit stays within its budget after it (issue 35: unpacked inside,
# the kit grew to 72 MiB, over the 64 MiB that travel)
export SHARDLM_KIT_LIBS=$ROOT/kitlibs # /kitlibs inside the root
if (unset LD_LIBRARY_PATH; . "$KIT/env.sh" && [ -f "$SHARDLM_KIT_LIBS/libopenblas.so.0" ] &&
  [[ ":$LD_LIBRARY_PATH:" == *":$SHARDLM_KIT_LIBS:"* ]]) 2>"$TMP/env.err"; then
  ok env_sh_unpacks_openblas
else
  fail env_sh_unpacks_openblas "$(head -2 "$TMP/env.err")"
fi
after=$(du -sb "$KIT" | cut -f1)
if [ "$after" -le "$KIT_BUDGET" ] && [ ! -e "$KIT/lib/libopenblas.so.0" ]; then
  ok "kit_budget_after_env_sh ($after bytes)"
else
  fail kit_budget_after_env_sh "$after bytes after sourcing env.sh (budget $KIT_BUDGET); $(ls "$KIT/lib" | grep -c openblas) openblas files in the kit"
fi

# --- the carried binaries (tools/gpu-bins.sh): sm_90, portable -march, their
# glibc recorded; the tree, the kit and they fit the 64 MiB that travel
if GPU_BINS_REFS=0 GPU_KIT_DIR=$KIT bash tools/gpu-bins.sh "$TMP/bins" >"$TMP/bins.log" 2>&1; then
  ok gpu_bins_build
else
  fail gpu_bins_build "tools/gpu-bins.sh: $(tail -3 "$TMP/bins.log" | tr '\n' ' ')"
fi
tree=$( (git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s -- 2>/dev/null || true) |
  awk '{s += $1} END {print s + 0}')
travel=$((tree + $(du -sb "$KIT" | cut -f1) + $(du -sb "$TMP/bins" 2>/dev/null | cut -f1)))
if [ -f "$TMP/bins/shardlm-cuda" ] && [ "$travel" -le $((64 * 1048576)) ]; then
  ok "travel_under_64_mib ($travel bytes: tree $tree, kit, binaries)"
else
  fail travel_under_64_mib "$travel bytes (tree $tree) with the kit and $(ls "$TMP/bins" 2>/dev/null | tr '\n' ' ')"
fi
/usr/bin/python3 - "$TMP/bins" "$(git rev-parse HEAD)" <<'PY'
import json, os, subprocess, sys
d = sys.argv[1]
try:
    info = json.load(open(os.path.join(d, "INFO.json")))
except (OSError, ValueError) as e:
    info = {}
progs = info.get("programs", {})
good = (sorted(progs) == ["check_kernels", "shardlm", "shardlm-cuda", "time_kernels"] and info["commit"].startswith(sys.argv[2])
        and info["cuda_arch"] == "sm_90" and "native" not in info["march"]
        and all(p["glibc_needed"].startswith("2.") and p["bytes"] == os.path.getsize(os.path.join(d, n))
                for n, p in progs.items()))
print("ok gpu_bins_info" if good else f"FAIL gpu_bins_info: {info}")
# sm_90 device code only (no sm_80, no PTX to JIT), in the trainer that runs on the H200: the entries of the
# embedded fatbinary (.nv_fatbin; no cuobjdump here), read from their headers, as the fatbins are compressed
# (tools/gpu-bins.sh: nvcc --compress-mode=size): outer header magic 0xBA55ED50, u16 version, u16 header size, u64
# size; each entry u16 kind (1 PTX, 2 ELF), u16, u32 header size, u64 payload size, the SM number at byte 0x1C
import struct, tempfile
def fatbin_entries(path):
    with tempfile.NamedTemporaryFile() as fb:
        subprocess.run(["objcopy", "-O", "binary", "--only-section=.nv_fatbin", path, fb.name], check=False)
        blob = open(fb.name, "rb").read()
    out, at = [], 0
    while at + 16 <= len(blob):
        magic, _, hsize, size = struct.unpack_from("<IHHQ", blob, at)
        if magic != 0xBA55ED50:
            at += 8
            continue
        e, end = at + hsize, at + hsize + size
        while e + 0x20 <= end:
            kind, _, eh, payload = struct.unpack_from("<HHIQ", blob, e)
            out.append(({1: "ptx", 2: "elf"}.get(kind, str(kind)), struct.unpack_from("<I", blob, e + 0x1C)[0]))
            if eh == 0:
                break
            e += eh + payload
        at = end
    return sorted(set(out))
arches = fatbin_entries(os.path.join(d, "shardlm-cuda")) if os.path.exists(os.path.join(d, "shardlm-cuda")) else []
print("ok gpu_bins_sm90_only" if arches == [("elf", 90)] else f"FAIL gpu_bins_sm90_only: {arches}")
PY
# the no-make fallback (tools/gpu-nomake.sh) travels in both folders: the same script, valid bash, no -Werror
# (tests/t_gpu_session.sh runs it)
# (their second line names the commit each was written at)
if cmp -s <(sed 1,2d "$KIT/build-nomake.sh") <(sed 1,2d "$TMP/bins/build-nomake.sh") && bash -n "$KIT/build-nomake.sh" &&
  grep -q "^  '\$NVCC \$NVCCFLAGS -c src/backend/cuda/" "$KIT/build-nomake.sh" && ! grep -q Werror "$KIT/build-nomake.sh"; then
  ok nomake_script_carried
else
  fail nomake_script_carried "$(ls -l "$KIT/build-nomake.sh" "$TMP/bins/build-nomake.sh" 2>&1 | tr '\n' ' ')"
fi

# --- the bare root: base libraries, bash, the kit; nothing else of /usr/lib
mkdir -p "$ROOT"/{bin,etc,proc,sys,dev,tmp,work/bin}
chmod 1777 "$ROOT/tmp"
dpkg -L libc6 libstdc++6 libgcc-s1 libgomp1 libtinfo6 |
  grep -E '^/(usr/)?lib(64)?/(x86_64-linux-gnu/)?[^/]*\.so[.0-9]*$|/ld-linux' | while read -r f; do
  mkdir -p "$ROOT$(dirname "$f")"
  cp -a "$f" "$ROOT$f"
done
cp /bin/bash "$ROOT/bin/bash"
grep '^root:' /etc/passwd >"$ROOT/etc/passwd"
grep '^root:' /etc/group >"$ROOT/etc/group"
printf '127.0.0.1 localhost %s\n' "$(hostname)" >"$ROOT/etc/hosts"
printf 'passwd: files\ngroup: files\nhosts: files\n' >"$ROOT/etc/nsswitch.conf"

# --- shardlm relinked against the kit, in a copy of the tree (the objects of
# the normal build; the headers are checked by the preprocessor below)
TREE=$TMP/tree
mkdir -p "$TREE/build"
cp -a Makefile src "$TREE/"
cp -a build/src "$TREE/build/"
[ -d build/cuda ] && cp -a build/cuda "$TREE/build/"
find "$TREE/build" -name '*.o' -exec touch {} +
if make -C "$TREE" KIT="$KIT" check-deps bin/shardlm >"$TMP/make.log" 2>&1; then
  ok build_with_kit
  cp "$TREE/bin/shardlm" "$ROOT/work/bin/"
else
  fail build_with_kit "$(tail -3 "$TMP/make.log" | tr '\n' ' ')"
fi
if make -C "$TREE" KIT="$KIT" CUDA=1 check-deps bin/shardlm-cuda >"$TMP/make-cuda.log" 2>&1; then
  ok build_cuda_with_kit
  cp "$TREE/bin/shardlm-cuda" "$ROOT/work/bin/"
else
  fail build_cuda_with_kit "$(tail -3 "$TMP/make-cuda.log" | tr '\n' ' ')"
fi
# Every header of those packages that the sources include comes from the kit.
strays=$(gcc -std=gnu11 -M -fopenmp -iquote src -I"$KIT/include" -I/usr/local/cuda/include -iquote tests/gpu \
  $(find src -name '*.c' | sort) tests/gpu/check_kernels.c 2>"$TMP/deps.err" | tr ' \\' '\n\n' | grep '\.h$' | sort -u |
  grep -E '/(mpi[^/]*|H5[^/]*|hdf5[^/]*|jansson[^/]*|pcre2[^/]*|utf8proc|cblas|openblas_config|nettle/[^/]*)\.h$' | grep -v "^$KIT/include/")
if [ ! -s "$TMP/deps.err" ] && [ -z "$strays" ]; then
  ok headers_from_kit
else
  fail headers_from_kit "outside the kit: ${strays:-none}; $(head -2 "$TMP/deps.err")"
fi

# --- data and a tiny GPT-2 run with a checkpoint.dir, written into the root
/usr/bin/python3 - "$ROOT/work/train.bin" <<'PY'
import sys
import numpy as np
tokens = np.random.default_rng(15).integers(0, 64, size=4000)
header = np.zeros(256, dtype="<i4")
header[:3] = 20240520, 1, len(tokens)
with open(sys.argv[1], "wb") as f:
    f.write(header.tobytes())
    f.write(tokens.astype("<u2").tobytes())
PY
cat >"$ROOT/work/config.json" <<'JSON'
{
  "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 32, "vocab_size": 64},
  "data": {"train": "/work/train.bin", "val": "/work/train.bin"},
  "train": {"steps": 4, "eval_every": 0, "sample_tokens": 0, "metrics": "/work/metrics.jsonl"},
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
  "zero_optimization": {"stage": 3},
  "checkpoint": {"dir": "/work/ckpt", "every": 2, "keep": 2}
}
JSON

# in_root SCRIPT: bash SCRIPT inside the root, with only env.sh's environment
# (plus the suite's root-permission and thread settings).
# in_root SCRIPT [MOUNTS]: bash SCRIPT inside the root, with env.sh's
# environment only (plus the suite's root-permission and thread settings);
# MOUNTS, a command run first in the mount namespace ($1 is the root).
in_root() {
  timeout 300 env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/work OMP_NUM_THREADS=1 SHARDLM_KIT_LIBS=/kitlibs OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
    unshare -m --propagation private bash -c '
      set -e
      mount --rbind /dev "$1/dev"; mount -t proc proc "$1/proc"; mount --rbind /sys "$1/sys"
      '"${2:-}"'
      exec chroot "$1" /bin/bash -c "PATH=/bin; cd /work && . /kit/env.sh && $2"' in_root "$ROOT" "$1"
}

# Libraries: every one resolves in the kit or the base set. The CUDA toolkit
# is bound into the root for the CUDA build alone: its runtime, cuBLAS and NCCL
# are the GPU machine's, and only they may resolve there.
mkdir -p "$ROOT/usr/local/cuda"
# shellcheck disable=SC2016
in_root 'for f in /kit/bin/mpirun /kit/bin/orted /kit/lib/openmpi/*.so /kit/lib/pmix/*.so /kit/lib/*.so.*[0-9] /kitlibs/*.so.*[0-9] /work/bin/shardlm; do
  echo "== $f"; /lib64/ld-linux-x86-64.so.2 --list "$f" || echo "LIST-FAILED"; done' >"$TMP/ldd.log" 2>&1
# shellcheck disable=SC2016
in_root 'f=/work/bin/shardlm-cuda; echo "== $f"; /lib64/ld-linux-x86-64.so.2 --list "$f" || echo "LIST-FAILED"' \
  "mount --bind $(readlink -f /usr/local/cuda) \"\$1/usr/local/cuda\"" >>"$TMP/ldd.log" 2>&1
check_ldd() { # NAME FILE-PATTERN [ALLOWED-OUTSIDE-REGEX]
  local out missing outside
  out=$(awk -v pat="$2" '/^== /{cur = ($2 ~ pat)} cur' "$TMP/ldd.log")
  missing=$(echo "$out" | grep -E 'not found|LIST-FAILED|error' | sort -u | tr '\n' ' ')
  outside=$(echo "$out" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
    grep -vE '^(/kit/lib/|/kitlibs/|/lib/x86_64-linux-gnu/|/usr/lib/x86_64-linux-gnu/|/lib64/)' | sort -u)
  [ -n "${3:-}" ] && outside=$(echo "$outside" | grep -vE "$3")
  outside=$(echo "$outside" | tr '\n' ' ' | sed 's/ *$//')
  if [ "$(echo "$out" | grep -c '=>')" -gt 0 ] && [ -z "$missing" ] && [ -z "$outside" ]; then
    ok "$1"
  else
    fail "$1" "missing: ${missing:-none}; outside: ${outside:-none}"
  fi
}
check_ldd ldd_mpirun_orted '^/kit/bin/'
check_ldd ldd_kit_libs_and_plugins '^/kit/lib/|^/kitlibs/'
check_ldd ldd_shardlm '^/work/bin/shardlm$'
check_ldd ldd_shardlm_cuda_all_but_cuda '^/work/bin/shardlm-cuda$' \
  '^/usr/local/cuda/lib64/lib(cudart|cublas|cublasLt|nccl)\.so\.[0-9]+$'

# Two ranks train and checkpoint; plugin load errors shown, and none allowed.
in_root 'OMPI_MCA_mca_base_component_show_load_errors=1 mpirun -np 2 /work/bin/shardlm train /work/config.json' \
  >"$TMP/train.out" 2>"$TMP/train.err"
rc=$?
if [ "$rc" -eq 0 ]; then
  ok mpirun_np2_train
else
  fail mpirun_np2_train "exit status $rc; stderr: $(tail -5 "$TMP/train.err" | tr '\n' ' ')"
fi
steps=$(grep -c '"loss"' "$ROOT/work/metrics.jsonl" 2>/dev/null)
ckpts=$(find "$ROOT/work/ckpt" -name '*.h5' 2>/dev/null | wc -l)
if [ "${steps:-0}" -ge 4 ] && [ "$ckpts" -ge 1 ]; then
  ok "trained_and_checkpointed ($steps metric rows, $ckpts .h5 files)"
else
  fail trained_and_checkpointed "${steps:-0} metric rows with a loss, $ckpts .h5 files under checkpoint.dir"
fi
if [ "$rc" -ne 0 ]; then
  fail mpirun_quiet "no run to judge"
elif grep -qiE 'component .*(failed|unable)|cannot open shared object|help file|No components were' "$TMP/train.err"; then
  fail mpirun_quiet "$(grep -iE 'component|shared object|help file' "$TMP/train.err" | head -3 | tr '\n' ' ')"
else
  ok mpirun_quiet
fi
