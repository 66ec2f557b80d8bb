#!/usr/bin/env bash
# Install what shardlm needs to build and test, only where it is missing.
#
# On a cluster with environment modules (pkg-config already finds MPI, HDF5,
# OpenBLAS and jansson) this does nothing.  On Debian/Ubuntu it installs the
# missing Debian packages with apt-get.  With --test it also makes sure the
# reference-test tools (Debian's python3-torch, numpy, h5py, crc32c) are present.
set -euo pipefail

want_test=0
[ "${1:-}" = "--test" ] && want_test=1

# pkg-config module -> Debian package that provides it
declare -A pc_pkg=(
  [ompi]=libopenmpi-dev
  [hdf5-openmpi]=libhdf5-openmpi-dev
  [openblas]=libopenblas-openmp-dev
  [jansson]=libjansson-dev
)
missing=()
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
for mod in "${!pc_pkg[@]}"; do
  if ! pkg-config --exists "$mod" 2>/dev/null; then
    missing+=("${pc_pkg[$mod]}")
  fi
done
command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)
command -v h5dump >/dev/null 2>&1 || missing+=(hdf5-tools)
if [ "$want_test" = 1 ]; then
  /usr/bin/python3 -c 'import torch' 2>/dev/null || missing+=(python3-torch)
  /usr/bin/python3 -c 'import numpy' 2>/dev/null || missing+=(python3-numpy)
  /usr/bin/python3 -c 'import h5py' 2>/dev/null || missing+=(python3-h5py)
  /usr/bin/python3 -c 'import crc32c' 2>/dev/null || missing+=(python3-crc32c)
fi

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "shardlm deps: missing ${missing[*]} and no apt-get here;" \
       "load the MPI, parallel HDF5, OpenBLAS and jansson modules (pkg-config must find them)" >&2
  exit 2
fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "shardlm deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt_install() {
  $SUDO apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=300 "$@"
}
if ! apt_install "${missing[@]}" >/tmp/shardlm-deps.log 2>&1; then
  $SUDO apt-get update >>/tmp/shardlm-deps.log 2>&1 || true
  apt_install "${missing[@]}" >>/tmp/shardlm-deps.log 2>&1 || {
    tail -20 /tmp/shardlm-deps.log >&2
    echo "shardlm deps: apt-get install failed; see /tmp/shardlm-deps.log" >&2
    exit 2
  }
fi
