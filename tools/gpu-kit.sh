#!/usr/bin/env bash
# Assemble gpu-kit/: everything a bare GPU machine needs to build and run
# shardlm that it lacks (issue 15, item 1). Run on a Debian development machine
# with the build dependencies installed (tools/deps.sh); the GPU machine has
# the CUDA toolkit, cuBLAS, NCCL, a compiler and glibc, but no Open MPI, HDF5,
# jansson, PCRE2, utf8proc, nettle or OpenBLAS, and the kit travels with the working tree
# (git-ignored).
#
#   bash tools/gpu-kit.sh [DIR]          (default: gpu-kit at the repo root)
#
# What it holds (MANIFEST lists every file, its size and its Debian package):
#   bin/              mpirun (Debian's orterun) and orted
#   lib/              Open MPI, PMIx, hwloc, libevent, parallel HDF5, jansson,
#                     PCRE2 (8-bit), utf8proc, nettle (SHA-256), OpenBLAS (see below), libgfortran, and
#                     every other library of their closure that is not a base
#                     library;
#                     libmpi.so etc. are one-line linker scripts (no symlinks)
#   lib/openmpi/      the MCA plugins a one-node run opens (MCA_PLUGINS)
#   lib/pmix/         PMIx's plugins;  share/openmpi, share/pmix: help texts
#   include/          the headers shardlm's sources include from those packages
#   env.sh            to source: PATH, LD_LIBRARY_PATH, OPAL_*/PMIX_* install
#                     directories (Open MPI relocated) and the MCA choices
#   build-nomake.sh   the Makefile's recipes for gcc and nvcc alone, for a GPU
#                     machine without make (tools/gpu-nomake.sh)
#
# Base libraries are not copied: glibc's (package libc6), libstdc++, libgcc_s,
# and libgomp, which must be the one of the compiler that builds shardlm on
# the GPU machine (an older copy first on LD_LIBRARY_PATH would hide the
# newer GOMP_* symbol versions its gcc emits). CUDA libraries are not copied.
#
# OpenBLAS: Debian's build carries kernels for every x86 core type in one
# 36 MB file, which does not fit the budget beside the rest; it travels
# xz-compressed (about 4 MB) as lib/libopenblas.so.0.xz and env.sh unpacks it
# on first use (xz, or Python's lzma module where xz is missing) into
# $SHARDLM_KIT_LIBS, outside the kit (issue 35: unpacked inside, the kit grew
# past the 64 MiB that travel). The
# reference BLAS (libblas3) would be 0.5 MB but 10-50x slower on the CPU
# reference runs the GPU checks compare against.
#
# The kit as assembled must stay under KIT_BUDGET_MIB (48 MiB; 64 MiB travel
# with the working tree in all); the script fails when it is over.
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=${1:-gpu-kit}
KIT_BUDGET_MIB=48
MULTIARCH=x86_64-linux-gnu
SYSLIB=/usr/lib/$MULTIARCH
OMPI_PKGLIB=$SYSLIB/openmpi/lib/openmpi3
PMIX_ROOT=$SYSLIB/pmix2

# Packages whose libraries the GPU machine has (see above).
BASE_PKGS_RE='^(libc6|libstdc\+\+6|libgcc-s1|libgomp1)(:amd64)?$'

# The MCA components a one-node mpirun with shardlm opens: process launch
# (odls, plm isolated/rsh, ess, state, errmgr, rmaps, routed, oob/rml over
# loopback TCP, PMIx), point-to-point over shared memory (btl vader/self, tcp
# kept as the fallback), collectives, one-sided windows over shared memory,
# and MPI-IO through OMPIO (parallel HDF5 writes checkpoints with it).
MCA_PLUGINS=(
  errmgr_default_app errmgr_default_hnp errmgr_default_orted
  ess_env ess_hnp ess_pmi ess_singleton
  filem_raw grpcomm_direct iof_hnp iof_orted odls_default oob_tcp
  plm_isolated plm_rsh pmix_ext3x
  regx_fwd regx_naive regx_reverse
  rmaps_ppr rmaps_rank_file rmaps_round_robin rmaps_seq
  rml_oob routed_binomial routed_direct routed_radix rtc_hwloc
  schizo_ompi schizo_orte state_app state_hnp state_orted
  allocator_basic allocator_bucket mpool_hugepage rcache_grdma patcher_overwrite
  pstat_linux reachable_weighted shmem_mmap shmem_posix shmem_sysv
  bml_r2 btl_self btl_vader btl_tcp pml_ob1
  coll_basic coll_inter coll_libnbc coll_self coll_sm coll_tuned
  osc_sm osc_rdma topo_basic op_avx
  io_ompio fbtl_posix fs_ufs fcoll_dynamic fcoll_dynamic_gen2 fcoll_individual
  fcoll_two_phase fcoll_vulcan sharedfp_individual sharedfp_lockedfile sharedfp_sm
)

die() { echo "gpu-kit: $*" >&2; exit 1; }

for tool in pkg-config dpkg strip xz gcc; do
  command -v "$tool" >/dev/null || die "$tool is missing; run 'bash tools/deps.sh' on a Debian machine"
done
pkg-config --exists ompi hdf5-openmpi openblas jansson libpcre2-8 libutf8proc nettle ||
  die "the build dependencies are missing; run 'bash tools/deps.sh'"
[ -d "$OMPI_PKGLIB" ] || die "$OMPI_PKGLIB not found: this script knows Debian 12's Open MPI 4.1 layout"

rm -rf "$KIT"
mkdir -p "$KIT"/{bin,lib/openmpi,lib/pmix,share/openmpi,share/pmix,etc,include}

SOURCES=$(mktemp)
trap 'rm -f "$SOURCES"' EXIT
# copy FILE DEST: FILE (symlinks resolved) as DEST, its origin noted for MANIFEST.
copy() {
  cp -L "$1" "$2"
  chmod u+w "$2"
  printf '%s\t%s\n' "${2#"$KIT"/}" "$1" >>"$SOURCES"
}
# copy_lib FILE DESTDIR: FILE as DESTDIR/<its name>, stripped (a no-op on most of
# Debian's libraries, which ship stripped).
copy_lib() {
  local dest=$2/$(basename "$1")
  [ -e "$dest" ] && return 0
  copy "$1" "$dest"
  strip --strip-unneeded "$dest" 2>/dev/null || true
}
# Which Debian package installed each file, asked of dpkg once per batch (one
# dpkg -S per file takes minutes): learn_owners FILE... fills OWNER under
# every name of each file (/lib is /usr/lib since the merged /usr), and
# pkg_owning FILE prints the owner or nothing.
declare -A OWNER=()
names_of() { printf '%s\n' "$1" "$(readlink -f "$1")" "/usr$1" "${1#/usr}"; }
learn_owners() {
  local f pkg path
  while IFS=$'\t' read -r pkg path; do OWNER[$path]=$pkg; done < <(
    for f in "$@"; do names_of "$f"; done | sort -u | xargs -d '\n' dpkg -S 2>/dev/null |
      sed -n 's/^\([^:, ]*\)[^ ]* \(\/.*\)$/\1\t\2/p')
}
pkg_owning() {
  local name
  while read -r name; do
    [ -n "${OWNER[$name]:-}" ] && { echo "${OWNER[$name]}"; return 0; }
  done < <(names_of "$1")
  return 0
}

# The programs and plugins that start the closure.
copy /usr/bin/orterun "$KIT/bin/mpirun"
copy /usr/bin/orted "$KIT/bin/orted"
roots=("$KIT/bin/mpirun" "$KIT/bin/orted")
for p in "${MCA_PLUGINS[@]}"; do
  [ -f "$OMPI_PKGLIB/mca_$p.so" ] || die "MCA plugin mca_$p.so missing from $OMPI_PKGLIB"
  copy_lib "$OMPI_PKGLIB/mca_$p.so" "$KIT/lib/openmpi"
  roots+=("$KIT/lib/openmpi/mca_$p.so")
done
for f in "$PMIX_ROOT"/lib/pmix/*.so; do
  case $f in *prm_slurm*) continue ;; esac # no Slurm on the GPU machine
  copy_lib "$f" "$KIT/lib/pmix"
  roots+=("$KIT/lib/pmix/$(basename "$f")")
done
hdf5_lib=$(readlink -f "$SYSLIB/hdf5/openmpi/libhdf5.so")
blas_lib=$(readlink -f "$(pkg-config --variable=libdir openblas)/libopenblas.so")
roots+=("$SYSLIB/libmpi.so.40" "$hdf5_lib" "$SYSLIB/libjansson.so.4" "$SYSLIB/libpcre2-8.so.0" "$SYSLIB/libutf8proc.so.2" "$SYSLIB/libnettle.so.8" "$blas_lib")
# liburing (offload "nvme"): optional; without it the KIT= build says it uses synchronous I/O
have_uring=0
[ -e "$SYSLIB/liburing.so.2" ] && pkg-config --exists liburing && have_uring=1 && roots+=("$SYSLIB/liburing.so.2")

# Every library those need (ldd: the whole transitive closure), less the base.
mapfile -t closure < <(ldd "${roots[@]}" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u)
learn_owners "${closure[@]#* }"
for entry in "${closure[@]}"; do
  path=${entry#* }
  pkg=$(pkg_owning "$path")
  [ -n "$pkg" ] || die "no Debian package owns $path"
  [[ $pkg =~ $BASE_PKGS_RE ]] && continue
  [ "$(readlink -f "$path")" = "$blas_lib" ] && continue # below
  copy_lib "$path" "$KIT/lib"
done
grep -q "not found" < <(ldd "${roots[@]}" 2>/dev/null) && die "a library of the closure is not installed here: $(ldd "${roots[@]}" | grep 'not found' | sort -u | head -3)"
# The roots that ldd lists only as arguments (libmpi needs none of them).
hdf5_soname=$(objdump -p "$hdf5_lib" | awk '$1 == "SONAME" {print $2}')
copy_lib "$SYSLIB/libmpi.so.40" "$KIT/lib"
copy_lib "$SYSLIB/libjansson.so.4" "$KIT/lib"
copy_lib "$SYSLIB/libpcre2-8.so.0" "$KIT/lib"
[ "$have_uring" = 1 ] && copy_lib "$SYSLIB/liburing.so.2" "$KIT/lib"
copy_lib "$SYSLIB/libutf8proc.so.2" "$KIT/lib"
copy_lib "$SYSLIB/libnettle.so.8" "$KIT/lib"
[ -e "$KIT/lib/$hdf5_soname" ] || copy "$hdf5_lib" "$KIT/lib/$hdf5_soname"
xz -6 -T1 -c "$blas_lib" >"$KIT/lib/libopenblas.so.0.xz"
printf 'lib/libopenblas.so.0.xz\t%s\n' "$blas_lib" >>"$SOURCES"

# Link-time names: a one-line linker script instead of a symlink, so that
# -lmpi -lhdf5 -lopenblas -ljansson -lpcre2-8 -lutf8proc -lnettle work with -L gpu-kit/lib.
printf 'INPUT(libmpi.so.40)\n' >"$KIT/lib/libmpi.so"
printf 'INPUT(%s)\n' "$hdf5_soname" >"$KIT/lib/libhdf5.so"
printf 'INPUT(libopenblas.so.0)\n' >"$KIT/lib/libopenblas.so"
printf 'INPUT(libjansson.so.4)\n' >"$KIT/lib/libjansson.so"
printf 'INPUT(libpcre2-8.so.0)\n' >"$KIT/lib/libpcre2-8.so"
[ "$have_uring" = 1 ] && printf 'INPUT(liburing.so.2)\n' >"$KIT/lib/liburing.so"
printf 'INPUT(libutf8proc.so.2)\n' >"$KIT/lib/libutf8proc.so"
printf 'INPUT(libnettle.so.8)\n' >"$KIT/lib/libnettle.so"

# Help texts, so that Open MPI's and PMIx's messages say something.
for f in /usr/share/openmpi/help-*.txt; do copy "$f" "$KIT/share/openmpi/${f##*/}"; done
for f in "$PMIX_ROOT"/share/pmix/help-*.txt; do copy "$f" "$KIT/share/pmix/${f##*/}"; done

# Headers: exactly those that shardlm's sources (and tests/gpu/check_kernels.c)
# include from those packages, found by the preprocessor, kept at the path
# relative to the -I directory (or /usr/include) that supplied them.
mapfile -t incdirs < <(pkg-config --cflags-only-I ompi hdf5-openmpi openblas jansson libpcre2-8 libutf8proc nettle | tr ' ' '\n' | sed -n 's/^-I//p' | sed 's:/*$::')
incdirs+=(/usr/include)
# shellcheck disable=SC2046
mapfile -t headers < <(gcc -std=gnu11 -M -fopenmp -iquote src $(pkg-config --cflags ompi hdf5-openmpi openblas jansson libpcre2-8 libutf8proc nettle) \
  -I/usr/local/cuda/include -iquote tests/gpu $(find src -name '*.c' | sort) tests/gpu/check_kernels.c 2>/dev/null |
  tr ' \\' '\n\n' | grep '\.h$' | xargs -d '\n' readlink -f | sort -u)
learn_owners "${headers[@]}"
for h in "${headers[@]}"; do
  case $(pkg_owning "$h") in
    libopenmpi-dev | libhdf5-*dev | libjansson-dev | libpcre2-dev | libopenblas*-dev | liburing-dev | libutf8proc-dev | nettle-dev) ;;
    *) continue ;;
  esac
  best=
  for d in "${incdirs[@]}"; do
    d=$(readlink -f "$d")
    [[ $h == "$d"/* ]] && [ ${#d} -gt ${#best} ] && best=$d
  done
  rel=${h#"$best"/}
  mkdir -p "$KIT/include/$(dirname "$rel")"
  copy "$h" "$KIT/include/$rel"
done
[ -f "$KIT/include/mpi.h" ] && [ -f "$KIT/include/hdf5.h" ] && [ -f "$KIT/include/jansson.h" ] &&
  [ -f "$KIT/include/cblas.h" ] && [ -f "$KIT/include/pcre2.h" ] && [ -f "$KIT/include/utf8proc.h" ] &&
  [ -f "$KIT/include/nettle/sha2.h" ] ||
  die "headers missing from $KIT/include (mpi.h, hdf5.h, jansson.h, cblas.h, pcre2.h, utf8proc.h, nettle/sha2.h)"

cat >"$KIT/env.sh" <<'EOF'
# Source this (bash): the gpu-kit's Open MPI, HDF5, jansson, PCRE2, utf8proc, nettle and OpenBLAS for
# building (make KIT=gpu-kit) and running shardlm on a machine without them.
# Written by tools/gpu-kit.sh.
KIT_DIR=${BASH_SOURCE[0]}
[[ $KIT_DIR == */* ]] || KIT_DIR=./$KIT_DIR
KIT_DIR=$(cd "${KIT_DIR%/*}" && pwd)
export SHARDLM_KIT=$KIT_DIR
# OpenBLAS travels compressed (tools/gpu-kit.sh says why); it is unpacked once
# into SHARDLM_KIT_LIBS (default: a folder under TMPDIR), never into the kit,
# which must stay within the size that travels with the working tree.
export SHARDLM_KIT_LIBS=${SHARDLM_KIT_LIBS:-${TMPDIR:-/tmp}/shardlm-kit-libs.$(id -u 2>/dev/null || echo 0)}
if [ ! -f "$SHARDLM_KIT_LIBS/libopenblas.so.0" ] || [ "$KIT_DIR/lib/libopenblas.so.0.xz" -nt "$SHARDLM_KIT_LIBS/libopenblas.so.0" ]; then
  mkdir -p "$SHARDLM_KIT_LIBS" && if command -v xz >/dev/null 2>&1; then
    xz -dc "$KIT_DIR/lib/libopenblas.so.0.xz" >"$SHARDLM_KIT_LIBS/libopenblas.so.0.part"
  else
    "${PYTHON:-python3}" -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1]) as src, open(sys.argv[2], "wb") as dst: shutil.copyfileobj(src, dst)' \
      "$KIT_DIR/lib/libopenblas.so.0.xz" "$SHARDLM_KIT_LIBS/libopenblas.so.0.part"
  fi && mv "$SHARDLM_KIT_LIBS/libopenblas.so.0.part" "$SHARDLM_KIT_LIBS/libopenblas.so.0" ||
    echo "gpu-kit: could not unpack $KIT_DIR/lib/libopenblas.so.0.xz into $SHARDLM_KIT_LIBS (needs xz or python3 with lzma)" >&2
fi
export PATH=$KIT_DIR/bin:$PATH
export LD_LIBRARY_PATH=$KIT_DIR/lib:$SHARDLM_KIT_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# Open MPI relocated: its configure-time directories are Debian's.
export OPAL_PREFIX=$KIT_DIR OPAL_EXEC_PREFIX=$KIT_DIR OPAL_BINDIR=$KIT_DIR/bin OPAL_LIBEXECDIR=$KIT_DIR/bin
export OPAL_LIBDIR=$KIT_DIR/lib OPAL_PKGLIBDIR=$KIT_DIR/lib/openmpi OPAL_INCLUDEDIR=$KIT_DIR/include
export OPAL_DATAROOTDIR=$KIT_DIR/share OPAL_DATADIR=$KIT_DIR/share OPAL_PKGDATADIR=$KIT_DIR/share/openmpi
export OPAL_SYSCONFDIR=$KIT_DIR/etc
export PMIX_PREFIX=$KIT_DIR PMIX_LIBDIR=$KIT_DIR/lib PMIX_PKGLIBDIR=$KIT_DIR/lib/pmix
export PMIX_DATADIR=$KIT_DIR/share PMIX_PKGDATADIR=$KIT_DIR/share/pmix PMIX_SYSCONFDIR=$KIT_DIR/etc
# One node: shared memory and self (TCP as the fallback), ob1, OMPIO, mpirun
# starting ranks itself (no ssh); only the plugins the kit carries.
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_pml=ob1 OMPI_MCA_osc=sm,rdma OMPI_MCA_io=ompio
export OMPI_MCA_plm=isolated OMPI_MCA_btl_base_warn_component_unused=0
export OMPI_MCA_mca_base_component_show_load_errors=0
EOF

# For a GPU machine without make: the Makefile's recipes as a script for gcc
# and nvcc alone (tests/gpu/session.sh runs it when no binaries were carried)
bash tools/gpu-nomake.sh "$KIT/build-nomake.sh"

# The budget, measured on the kit as it travels.
size_bytes=$(du -sb "$KIT" | cut -f1)
size_mib=$(awk -v b="$size_bytes" 'BEGIN {printf "%.1f", b / 1048576}')

{
  echo "# gpu-kit, assembled by tools/gpu-kit.sh on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "# total $size_bytes bytes ($size_mib MiB, without this file); columns: bytes path package"
  mapfile -t sources < <(cut -f2 "$SOURCES")
  learn_owners "${sources[@]}"
  (cd "$KIT" && find . -type f ! -path ./MANIFEST | sed 's:^\./::' | sort) | while read -r f; do
    src=$(awk -F'\t' -v f="$f" '$1 == f {print $2; exit}' "$SOURCES")
    pkg=
    [ -z "$src" ] || pkg=$(pkg_owning "$src")
    printf '%10d %s %s\n' "$(stat -c %s "$KIT/$f")" "$f" "${pkg:-written-by-tools/gpu-kit.sh}"
  done
} >"$KIT/MANIFEST"

echo "gpu-kit: $KIT holds $(find "$KIT" -type f | wc -l) files, $size_mib MiB (budget $KIT_BUDGET_MIB MiB)"
if [ "$size_bytes" -gt $((KIT_BUDGET_MIB * 1048576)) ]; then
  die "$KIT is $size_mib MiB, over the $KIT_BUDGET_MIB MiB budget; see the largest files in $KIT/MANIFEST"
fi
