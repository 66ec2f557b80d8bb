#!/usr/bin/env bash
# tests/gpu/session.sh rehearsed without a GPU (issue 15): every stage runs
# through tests/cudaemu's CPU emulation of the CUDA sources, NCCL found the
# way the GPU machine has it (a nvidia-nccl wheel: libnccl.so.2 without a
# libnccl.so link, in a Python's site-packages), and results.json is checked:
# well-formed, every stage present with its status, all six passed here,
# the Llama throughput measured like GPT-2's, at most 8 files in OUT.
# Then a stage that hangs is killed at its time limit, reported as
# "timeout", and the next stage still runs. Time limits are generous: nothing
# here depends on how busy the machine is.
set -u
cd "$(dirname "$0")/.."
ok() { echo "ok $1"; }
fail() { echo "FAIL $1: $2"; }
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x "$CUDA_HOME/bin/nvcc" ]; then
  fail gpu_session.nvcc "no $CUDA_HOME/bin/nvcc: the session's build stage cannot be rehearsed"
  exit 1
fi
TMP=$(mktemp -d "${SHARDLM_TEST_TMP:-/tmp}/t_gpu_session.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
PY=/usr/bin/python3

# a wheel-like NCCL: site/nvidia/nccl/{lib/libnccl.so.2, include/nccl.h}, seen by one Python only
real=$(ldconfig -p | sed -n 's/.*libnccl\.so\.2 .*=> //p' | head -1)
real=${real:-$CUDA_HOME/lib64/libnccl.so.2}
mkdir -p "$TMP/site/nvidia/nccl/lib" "$TMP/site/nvidia/nccl/include"
ln -s "$(readlink -f "$real")" "$TMP/site/nvidia/nccl/lib/libnccl.so.2"
ln -s "$(readlink -f "$CUDA_HOME/include/nccl.h")" "$TMP/site/nvidia/nccl/include/nccl.h"
printf '#!/bin/sh\nPYTHONPATH=%s exec %s "$@"\n' "$TMP/site" "$PY" >"$TMP/python"
chmod +x "$TMP/python"

export SESSION_PYTHON=$TMP/python SESSION_WORK=$TMP/work SESSION_BUDGET=3000
export SESSION_LIMIT_PROBE=120 SESSION_LIMIT_BUILD=600 SESSION_LIMIT_KERNELS=300 SESSION_LIMIT_E2E=600
export SESSION_LIMIT_THROUGHPUT=600 SESSION_LIMIT_TIMINGS=300
export SESSION_E2E_CASES=n1_fp32,n2nccl_fp32,offload_bf16,llama_n1_bf16
OUT=$TMP/out bash tests/gpu/session.sh --rehearse >"$TMP/stdout" 2>&1
rc=$?
[ "$rc" = 0 ] && ok gpu_session.exit_0 || fail gpu_session.exit_0 "exit $rc: $(tail -12 "$TMP/stdout" | tr '\n' ' ')"
last=$(tail -1 "$TMP/stdout")
[ "$last" = "6 passed, 0 failed" ] && ok gpu_session.summary_line || fail gpu_session.summary_line "last line '$last'"
n=$(find "$TMP/out" -type f | wc -l)
[ "$n" -le 8 ] && ok gpu_session.at_most_8_files || fail gpu_session.at_most_8_files "$n files: $(ls "$TMP/out" | tr '\n' ' ')"

"$PY" - "$TMP/out/results.json" "$TMP/site" <<'PYEOF'
import json, sys
def check(name, cond, why=""):
    print(f"ok {name}" if cond else f"FAIL {name}: {why}")
try:
    res = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    check("gpu_session.results_json", False, str(e))
    sys.exit(0)
check("gpu_session.results_json", res.get("mode") == "rehearsal", f"mode {res.get('mode')}")
stages = {s["name"]: s for s in res["stages"]}
want = ["probe", "build", "kernels", "e2e", "throughput", "timings"]
check("gpu_session.every_stage", [s["name"] for s in res["stages"]] == want, f"stages {list(stages)}")
for name in want:
    s = stages.get(name, {})
    check(f"gpu_session.{name}.pass", s.get("status") == "pass" and s.get("passed", 0) > 0 and s.get("failed") == 0,
          f"status {s.get('status')}, {s.get('passed')} ok, failed {s.get('failed_checks')}, note {s.get('note')}")
    check(f"gpu_session.{name}.fields", all(k in s for k in ("seconds", "limit_s", "figures", "log"))
          and s.get("figures", {}).get("emulated") is True, f"keys {sorted(s)}")
probe = stages["probe"]["figures"]
check("gpu_session.probe.no_gpu_is_skip", any(x["name"] == "probe.gpu" for x in stages["probe"]["skipped"]),
      str(stages["probe"]["skipped"]))
check("gpu_session.probe.nccl_from_wheel", str(probe.get("nccl", "")).startswith(sys.argv[2]), f"nccl {probe.get('nccl')}")
check("gpu_session.kernels.count", stages["kernels"]["passed"] >= 100, f"{stages['kernels']['passed']} kernel checks")
worst = stages["e2e"]["figures"].get("worst_relative_loss_difference", {})
check("gpu_session.e2e.cases", sorted(worst) == ["llama_n1_bf16", "n1_fp32", "n2nccl_fp32", "offload_bf16"], str(worst))
tp = stages["throughput"]["figures"]
llama = tp.get("llama_12l", {}).get("shardlm", {})
check("gpu_session.throughput.llama_runs", llama.get("status") == "pass" and llama.get("tokens_per_s", 0) > 0,
      str(llama))
acc = [tp.get(f"gpt2_350m_acc{a}", {}) for a in (1, 8)]
check("gpu_session.throughput.figures", all(a.get("shardlm", {}).get("tokens_per_s", 0) > 0 and a.get("emulated")
                                            for a in acc) and tp.get("gemm", {}).get("tflops", 0) > 0, str(acc))
ops = stages["timings"]["figures"].get("kernels", {})
check("gpu_session.timings.ops", len(ops) >= 15 and all(v.get("ms", 0) > 0 for v in ops.values()), str(ops)[:300])
PYEOF

# a hanging stage: killed at its limit, "timeout", and the next stage still runs
SESSION_INJECT_HANG=probe SESSION_LIMIT_PROBE=3 OUT=$TMP/out2 bash tests/gpu/session.sh --rehearse \
  --stages probe,timings >"$TMP/stdout2" 2>&1
rc=$?
"$PY" - "$TMP/out2/results.json" "$rc" "$(tail -1 "$TMP/stdout2")" <<'PYEOF'
import json, sys
try:
    st = {s["name"]: s for s in json.load(open(sys.argv[1]))["stages"]}
except (OSError, ValueError) as e:
    st = {}
    print(f"FAIL gpu_session.hang.results_json: {e}")
p, t = st.get("probe", {}), st.get("timings", {})
ok = p.get("status") == "timeout" and p.get("seconds", 99) < 30 and t.get("status") == "pass"
print("ok gpu_session.hang_times_out" if ok else
      f"FAIL gpu_session.hang_times_out: probe {p.get('status')} in {p.get('seconds')} s, timings {t.get('status')}")
ok = sys.argv[2] != "0" and sys.argv[3] == "1 passed, 1 failed" and st.get("e2e", {}).get("status") == "skip"
print("ok gpu_session.hang_counts_as_failure" if ok else
      f"FAIL gpu_session.hang_counts_as_failure: exit {sys.argv[2]}, last line '{sys.argv[3]}'")
PYEOF
