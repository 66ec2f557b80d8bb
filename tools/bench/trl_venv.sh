#!/usr/bin/env bash
# Makes a private venv with TRL 0.8.6 for tools/bench/dpo.sh's reference:
#
#   bash tools/bench/trl_venv.sh DIR        (e.g. /tmp/shardlm-trl-venv)
#
# Over Debian's /usr/bin/python3 (torch 1.13, numpy) with --system-site-packages,
# seeing build/ref-venv's transformers 4.40.2, tokenizers, PEFT 0.10.0 and
# accelerate through a .pth file (build/ref-venv itself is left as it is), it
# installs TRL 0.8.6 and the packages its DPOTrainer imports (datasets 2.19 and
# its data stack), each with --no-deps so that PyPI's torch never comes in.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: bash tools/bench/trl_venv.sh DIR}
ref=$PWD/build/ref-venv
[ -x "$ref/bin/python" ] || { echo "build/ref-venv missing: make it with bash tools/deps.sh --test" >&2; exit 1; }
/usr/bin/python3 -m venv --system-site-packages "$dir"
site=$("$dir/bin/python" -c 'import site; print(site.getsitepackages()[0])')
"$ref/bin/python" -c 'import site; print(site.getsitepackages()[0])' >"$site/zz_shardlm_ref_venv.pth"
"$dir/bin/pip" install --no-deps trl==0.8.6 datasets==2.19.1 pyarrow==15.0.2 pyarrow-hotfix dill==0.3.8 \
    multiprocess==0.70.16 xxhash pandas==2.1.4 tzdata pytz python-dateutil aiohttp aiohappyeyeballs aiosignal \
    multidict yarl propcache frozenlist attrs rich markdown-it-py mdurl pygments
"$dir/bin/python" -c 'from trl import DPOTrainer; import trl, transformers, peft, torch; print("trl", trl.__version__, "transformers", transformers.__version__, "peft", peft.__version__, "torch", torch.__version__)'
