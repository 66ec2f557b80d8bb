#!/usr/bin/env bash
# Write, here, the build script a GPU machine without `make` runs instead
# (issue 35, item 4): a plain bash script that needs only gcc and nvcc.
#
#   bash tools/gpu-nomake.sh OUT          (tools/gpu-bins.sh and tools/gpu-kit.sh
#                                          write gpu-bins/ and gpu-kit/build-nomake.sh)
#
# Nothing in it is written by hand: the compile and link commands are the
# Makefile's own recipes for bin/shardlm and bin/shardlm-cuda as
# `make -n -B CUDA=1 WERROR=` prints them (CUDA code for sm_90 only, as the
# session's make fallback; no -Werror, so a newer compiler's warnings do not
# stop it), with each flag variable's value replaced by a shell variable.
# The flags are printed three times, for the three ways the machine may have
# the libraries: the system's (pkg-config here), the kit's (KIT=gpu-kit) with
# liburing and without; the three command lists must come out the same after
# the replacement, or this script fails (the Makefile changed in a way it
# does not know). check_kernels and time_kernels are then linked by
# tests/gpu/session.sh --link-checkers with those flags.
#
# The script it writes refuses to run (exit 2, naming the file) when a .c or
# .cu file under src/ has no compile command in it, or it names one that is
# not there: regenerate it from the tree that travels.
set -euo pipefail
cd "$(dirname "$0")/.."
OUTFILE=${1:?usage: tools/gpu-nomake.sh OUT}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/kitu/include" "$T/kitn/include"
: >"$T/kitu/include/liburing.h" # the Makefile only asks whether the kit has this header

# make_n NAME [MAKE ARGS]: the recipes and the flag values of one variant into $T/NAME.*
make_n() {
  local name=$1 v
  shift
  local args=(CUDA=1 WERROR= BUILD=__B__ BIN=__BIN__ CUDA_HOME=__CUDA_HOME__ NCCL_HOME=__NCCL_HOME__
    "CUDA_ARCH=-gencode=arch=compute_90,code=sm_90" "$@")
  make -n -B --no-print-directory "${args[@]}" __BIN__/shardlm __BIN__/shardlm-cuda >"$T/$name.n"
  for v in CC NVCC CFLAGS NVCCFLAGS LDLIBS CUDA_LIBS; do
    make -s --no-print-directory "${args[@]}" --eval 'print-%: ; @echo "=$* $($*)"' "print-$v"
  done >"$T/$name.vars"
}
make_n system
SHARDLM_KIT_LIBS=__KIT_LIBS__ make_n kitu "KIT=$T/kitu"
SHARDLM_KIT_LIBS=__KIT_LIBS__ make_n kitn "KIT=$T/kitn"

/usr/bin/python3 - "$T" "$OUTFILE" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" <<'EOF'
import os, re, shlex, sys
t, outfile, commit = sys.argv[1:4]
names = ["CC", "NVCC", "CFLAGS", "NVCCFLAGS", "LDLIBS", "CUDA_LIBS"]
SUBST = {"__B__": "${B}", "__BIN__": "${BIN}", "__CUDA_HOME__": "${CUDA_HOME}", "__NCCL_HOME__": "${NCCL_HOME}",
         "__KIT_LIBS__": "${SHARDLM_KIT_LIBS}", f"{t}/kitu": "${KIT}", f"{t}/kitn": "${KIT}"}

def die(msg):
    sys.exit(f"gpu-nomake: {msg}")

def shell_value(s):
    """A make value as a double-quoted shell word, its placeholders as ${VAR}."""
    s = " ".join(s.split())
    if re.search(r'["`\\$]', s):
        die(f"a flag holds a shell special character, which this script does not quote: {s}")
    for k, v in SUBST.items():
        s = s.replace(k, v)
    if re.search(r"__[A-Z_]+__", s):
        die(f"a placeholder is left in {s}")
    return '"' + s + '"'

variants = {}
for name in ("system", "kitu", "kitn"):
    vals = {}
    for l in open(f"{t}/{name}.vars"):  # "=NAME value" (make's $(info) lines aside)
        if l.startswith("="):
            k, _, v = l[1:].partition(" ")
            vals[k] = " ".join(v.split())
    if len(vals) != len(names) or not all(vals[n] for n in names):
        die(f"make printed no value for one of {names} ({name})")
    compiles, links = [], []
    for line in open(f"{t}/{name}.n"):
        line = " ".join(line.split())
        if not line or line.startswith(("mkdir -p ", "echo ", "shardlm: ")):
            continue  # make's progress lines, its directories (made below), its $(info)
        line = f" {line} "
        for v in ("NVCCFLAGS", "CFLAGS", "CUDA_LIBS", "LDLIBS"):  # the longer first
            line = line.replace(f" {vals[v]} ", f" ${v} ")
        line = line.strip()
        if line.startswith(vals["NVCC"] + " "):
            line = "$NVCC" + line[len(vals["NVCC"]):]
        elif line.startswith(vals["CC"] + " "):
            line = "$CC" + line[len(vals["CC"]):]
        else:
            die(f"a recipe line this script does not know (the Makefile changed?): {line[:200]}")
        if "'" in line or re.search(r"-[IL]/|-[IL]\S*kit[un]/", line):
            die(f"a flag was not replaced by its variable in: {line[:300]}")
        for k, v in SUBST.items():
            line = line.replace(k, v)
        if re.search(r"__[A-Z_]+__", line):
            die(f"a placeholder is left in {line[:300]}")
        (compiles if " -c " in line else links).append(line)
    variants[name] = (vals, compiles, links)
_, compiles, links = variants["system"]
for name in ("kitu", "kitn"):
    if variants[name][1:] != (compiles, links):
        die(f"the commands of the {name} variant differ from the system's beyond the flag variables")
compiles = sorted(compiles, key=lambda c: not c.startswith("$NVCC "))  # nvcc's take longest: first
srcs = [re.search(r" -c (\S+)", c).group(1) for c in compiles]
outs = {re.search(r" -o (\S+)", c).group(1) for c in compiles}
if len(set(srcs)) != len(srcs) or len(links) != 2:
    die(f"expected one compile per source and two links, got {len(compiles)} compiles, {len(links)} links")
for l in links:
    for w in l.split():
        if w.endswith(".o") and w not in outs:
            die(f"the link needs {w}, which no compile makes")

def assign(vals, indent):
    return "\n".join(f"{indent}{v}={shell_value(vals[v])}" for v in ("CFLAGS", "NVCCFLAGS", "LDLIBS", "CUDA_LIBS"))

q = lambda c: "  " + shlex.quote(c)
vals_cc = variants["system"][0]["CC"]
script = f"""#!/usr/bin/env bash
# Written by tools/gpu-nomake.sh from the Makefile at commit {commit} (make -n -B
# CUDA=1 WERROR=, CUDA for sm_90): do not edit, regenerate. It builds, with
# only gcc and nvcc (no make), what tests/gpu/session.sh's build stage needs:
# $BIN/shardlm, $BIN/shardlm-cuda, $CHECKERS/check_kernels, $CHECKERS/time_kernels.
# From the repository root:
#   CUDA_HOME=DIR NCCL_HOME=DIR [KIT=gpu-kit [SHARDLM_KIT_LIBS=DIR]] [B=build] [BIN=bin]
#   [CHECKERS=DIR] [JOBS=N] [CC=gcc] [NVCC=DIR/bin/nvcc] bash build-nomake.sh
# Warnings are never errors. Exit 2: a source under src/ is not the ones
# listed here (regenerate); 1: a compile or link failed.
set -u
: "${{CUDA_HOME:?set CUDA_HOME}}" "${{NCCL_HOME:?set NCCL_HOME}}"
CC=${{CC:-{vals_cc}}} NVCC=${{NVCC:-$CUDA_HOME/bin/nvcc}}
B=${{B:-build}} BIN=${{BIN:-bin}} CHECKERS=${{CHECKERS:-$BIN}} JOBS=${{JOBS:-$(nproc 2>/dev/null || echo 4)}}
if [ -z "${{KIT:-}}" ]; then # the system's libraries (pkg-config on the machine that wrote this)
{assign(variants["system"][0], "  ")}
elif [ -e "$KIT/include/liburing.h" ]; then
  SHARDLM_KIT_LIBS=${{SHARDLM_KIT_LIBS:-$KIT/lib}}
{assign(variants["kitu"][0], "  ")}
else
  SHARDLM_KIT_LIBS=${{SHARDLM_KIT_LIBS:-$KIT/lib}}
{assign(variants["kitn"][0], "  ")}
fi
# make's recipes for $(OBJS) and $(CUDA_OBJS) (nvcc's first: they take longest)
COMPILES=(
{chr(10).join(q(c) for c in compiles)}
)
# make's recipes for $(BIN)/shardlm and $(BIN)/shardlm-cuda
LINKS=(
{chr(10).join(q(c) for c in links)}
)
srcof() {{ local w=${{1#* -c }}; echo "${{w%% *}}"; }}
# every .c and .cu under src/ is compiled here, and nothing else (the tree that travels is the one this was written from)
listed=$(for c in "${{COMPILES[@]}}"; do srcof "$c"; done | sort)
tree=$(find src -name '*.c' -o -name '*.cu' | sort)
if [ "$listed" != "$tree" ]; then
  echo "build-nomake: the sources under src/ differ from the ones this script compiles;" \\
    "not compiled here: $(comm -13 <(echo "$listed") <(echo "$tree") | tr '\\n' ' ')" \\
    "not in src/: $(comm -23 <(echo "$listed") <(echo "$tree") | tr '\\n' ' ')" \\
    "(regenerate it: bash tools/gpu-nomake.sh FILE; tools/gpu-bins.sh and tools/gpu-kit.sh do)" >&2
  exit 2
fi
fails=0 running=0
reap() {{ wait -n || fails=$((fails + 1)); running=$((running - 1)); }}
for c in "${{COMPILES[@]}}"; do
  eval "o=${{c##* -o }}" && mkdir -p "$(dirname "$o")" || exit 1
  while [ "$running" -ge "$JOBS" ]; do reap; done
  echo "  COMPILE $(srcof "$c")"
  (eval "$c" || {{ echo "build-nomake: compiling $(srcof "$c") failed" >&2; exit 1; }}) &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do reap; done
[ "$fails" = 0 ] || {{ echo "build-nomake: $fails compiles failed" >&2; exit 1; }}
mkdir -p "$BIN" "$CHECKERS" || exit 1
for c in "${{LINKS[@]}}"; do
  o=${{c#* -o }} && eval "o=${{o%% *}}"
  echo "  LINK    $o"
  eval "$c" || {{ echo "build-nomake: linking $o failed" >&2; exit 1; }}
done
# check_kernels and time_kernels, linked as the session links them, with these flags
MK_CFLAGS=$CFLAGS MK_LDLIBS=$LDLIBS MK_CUDA_LIBS=$CUDA_LIBS CUDA_HOME=$CUDA_HOME \\
  bash tests/gpu/session.sh --link-checkers "$B" "$CHECKERS"
"""
tmp = outfile + ".tmp"
with open(tmp, "w") as f:
    f.write(script)
os.chmod(tmp, 0o755)
os.replace(tmp, outfile)
print(f"gpu-nomake: {outfile}: {len(compiles)} compiles, {len(links)} links, {os.path.getsize(outfile)} bytes")
EOF
