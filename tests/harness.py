"""Shared pieces of the Python tests: where the binary and scratch space are,
the MPI environment, and the "ok NAME" / "FAIL NAME: why" lines that
tests/run.sh counts.
"""
import atexit
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from dumpfile import read_dump  # noqa: E402,F401  (re-exported for the tests)
from datafiles import write_shard  # noqa: E402,F401  (re-exported for the tests)
from toolenv import REF5_VENV, ref5_env  # noqa: E402,F401  (re-exported for the tests)

BIN = os.environ.get("SHARDLM_BIN") or os.path.join(ROOT, "bin", "shardlm")

# mpirun as root, more ranks than cores, one OpenMP thread per rank.
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")
ENV.pop("SHARDLM_INJECT_INF_STEP", None)
ENV.pop("SHARDLM_TEST_FREEZE", None)
ENV.pop("SHARDLM_ATTENTION", None)  # the CPU's default attention kernel (tiled), which the tests' sizes assume

_failures = 0


def use_ref_venv(module, check_name):
    """Continues in build/ref-venv (transformers, tokenizers, safetensors over Debian's torch; tools/deps.sh
    --test makes it) when `module` is not importable here: re-executes the script with the venv's Python, or
    prints a FAIL line and exits 1 when there is no venv."""
    try:
        __import__(module)
        return
    except ImportError:
        pass
    venv = os.path.join(ROOT, "build", "ref-venv")
    py = os.path.join(venv, "bin", "python")
    if os.path.exists(py) and os.path.realpath(sys.prefix) != os.path.realpath(venv):
        os.execv(py, [py] + sys.argv)
    print(f"FAIL {check_name}: {module} is missing and {py} does not exist; run tools/deps.sh --test")
    sys.exit(1)


def use_ref5_venv(check_name):
    """Continues in build/ref5-venv (transformers 5.25, tokenizers 0.23, PEFT 0.21 over PyPI's torch 2.11; tools/deps.sh
    --test makes it): re-executes the script with the venv's Python and its library path, or prints a FAIL line
    and exits 1 when there is no venv."""
    py = os.path.join(REF5_VENV, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(REF5_VENV):
        return
    if not os.path.exists(py):
        print(f"FAIL {check_name}: {py} does not exist; run tools/deps.sh --test")
        sys.exit(1)
    os.execve(py, [py] + sys.argv, ref5_env())


def byte_bpe_tokenizer(path, vocab_size):
    """A byte-level BPE tokenizer.json of vocab_size tokens trained with `tokenizers` on docs/DESIGN.md, saved at
    path (returned): a tokenizer for tests whose prompts are token ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([open(os.path.join(ROOT, "docs", "DESIGN.md"), encoding="utf-8").read()], trainer)
    tok.save(path)
    return path


def check_greedy(name, model_dir, model, prompts, new, tokenizer, scratch):
    """`shardlm generate` on model_dir from token-id prompts, greedy, new tokens past the end of sequence, against
    the transformers model's generate(do_sample=False) on the same prompts: a check per prompt."""
    import torch
    path = os.path.join(scratch, name + "_prompts.jsonl")
    with open(path, "w") as f:
        for p in prompts:
            f.write(json.dumps({"ids": p}) + "\n")
    r = subprocess.run([BIN, "generate", model_dir, "--prompt-file", path, "--max-new-tokens", str(new),
                        "--ignore-eos", "--no-chat", "--tokenizer", tokenizer], env=ENV, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=300)
    check(f"{name}.run", r.returncode == 0, r.stderr[-600:])
    if r.returncode != 0:
        return
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    for i, p in enumerate(prompts):
        with torch.no_grad():
            y = model.generate(torch.tensor([p]), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                               attention_mask=torch.ones(1, len(p), dtype=torch.long), pad_token_id=0)
        want = y[0, len(p):].tolist()
        got = rows[i]["ids"] if i < len(rows) else None
        check(f"{name}.greedy_{i}", got == want, f"shardlm {got} vs transformers {want}")


def memory_binary():
    """The binary whose memory is measured: under AddressSanitizer (make test-asan sets ASAN_OPTIONS) the
    resident set is the sanitizer allocator's (redzones, a quarantine that keeps freed blocks), not shardlm's, so
    the same check runs the regular build, which make test-asan's suite runs after make test built it."""
    if "ASAN_OPTIONS" not in os.environ:
        return BIN
    return os.path.join(ROOT, "bin", "shardlm")


def write_config(path, cfg, extra=None):
    """Writes cfg, with extra's sections merged into it (a dict updates the section, another value replaces it),
    as JSON to path; returns path."""
    for k, v in (extra or {}).items():
        cfg.setdefault(k, {}).update(v) if isinstance(v, dict) else cfg.__setitem__(k, v)
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def scratch_dir(name):
    """A directory for one test: under SHARDLM_TEST_TMP, else a fresh temporary
    one removed when the test exits."""
    base = os.environ.get("SHARDLM_TEST_TMP")
    if not base:
        base = tempfile.mkdtemp(prefix=f"shardlm-{name}.")
        atexit.register(shutil.rmtree, base, True)
    path = os.path.join(base, name)
    os.makedirs(path, exist_ok=True)
    return path


def files_state(*roots):
    """{path: sha256} of every file under ROOTS (None for one that cannot be read)."""
    state = {}
    for root in roots:
        for d, _, names in os.walk(root):
            for n in names:
                p = os.path.join(d, n)
                try:
                    with open(p, "rb") as f:
                        state[p] = hashlib.sha256(f.read()).hexdigest()
                except OSError:
                    state[p] = None
    return state


def mount_full_disk(path, check_name):
    """Mounts a 48 KiB tmpfs at PATH (a disk that fills at once; root); False, with a FAIL line, when it cannot.
    The caller unmounts it (umount PATH)."""
    os.makedirs(path, exist_ok=True)
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", path], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if m.returncode != 0:
        check(check_name, False, m.stdout.strip())
    return m.returncode == 0


def write_preferences(path, pairs, vocab_size, fmt="shardlm-preferences", max_prompt_length=8):
    """A preference file of pairs [((ids, trained), (ids, trained)), ...] (chosen, rejected; the prompt the
    untrained head of each), as tools/prepare_data.py writes one; fmt other than shardlm-preferences: a sample
    file that claims another format (for refusals)."""
    import h5py
    from datafiles import set_str, write_samples
    toks, tr, off = [], [], [0]
    for pair in pairs:
        for ids, trained in pair:
            toks += ids
            tr += trained
            off.append(len(toks))
    write_samples(path, toks, tr, off, vocab_size)
    with h5py.File(path, "r+") as f:
        del f.attrs["format"]
        set_str(f, "format", fmt)
        if fmt == "shardlm-preferences":
            f["prompt_lengths"] = np.array([p[0][1].index(1) for p in pairs], np.int64)
            f.attrs["max_prompt_length"] = np.int64(max_prompt_length)  # above every prompt
    return path


def peft_set_adapters(pm, dump):
    """Copies a shardlm dump's LoRA tensors into PEFT model pm's adapters: {PEFT parameter name: shardlm name}."""
    import torch
    params, ours = dict(pm.named_parameters()), {}
    for n, w in dump.items():
        if ".lora_" in n and not n.startswith("grad."):
            module, kind = n.rsplit(".lora_", 1)
            pname = f"base_model.model.{module}.lora_{kind[0]}.default.weight"
            with torch.no_grad():
                params[pname].copy_(torch.as_tensor(w, dtype=params[pname].dtype))
            ours[pname] = n
    return ours


def check(name, cond, details=""):
    global _failures
    if cond:
        print(f"ok {name}", flush=True)
    else:
        _failures += 1
        print(f"FAIL {name}: {details}", flush=True)


def note(msg):
    print(f"# {msg}", flush=True)


def failures():
    return _failures


def rel(a, b):
    """max |a - b| / max |b|, inf for different shapes or non-finite values."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    if not a.size:
        return 0.0
    e = float(np.max(np.abs(a - b))) / max(float(np.max(np.abs(b))), 1e-30)
    return e if math.isfinite(e) else float("inf")


def round_up(x, m):
    return (x + m - 1) // m * m


def arena_round(nbytes):
    """Every arena buffer is rounded up to 64 bytes (src/backend/arena.h)."""
    return round_up(nbytes, 64)


def text_of(path):
    """The contents of PATH; "" when it cannot be read (a log not written yet)."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def crash_summary(log, tail=800):
    """One line for a FAIL message about a job's LOG: where it reports a sanitizer error or a crash, that report's
    first line, its first stack frames and its summary (the runner shows a FAIL message's first line only);
    otherwise the last TAIL characters, lines joined with " | "."""
    lines = log.splitlines()
    at = next((i for i, line in enumerate(lines) if "ERROR: AddressSanitizer" in line or "runtime error:" in line
               or "Segmentation fault" in line), None)
    if at is None:
        return log[-tail:].replace("\n", " | ")
    frames = [line.strip() for line in lines[at + 1:] if line.strip().startswith("#")][:8]
    summary = next((line for line in lines[at:] if line.startswith("SUMMARY:")), "")
    return " | ".join([lines[at].strip()] + frames + [summary])


def alive(pid):
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def slurm_job_config(tmp, name, steps, batch, checkpoint=None):
    """The Slurm tests' tiny model (2 layers, C=64, vocab 100) on TMP/train.bin, ZeRO stage 3,
    lr 1e-3, a line per step; its metrics (TMP/NAME.metrics.jsonl) and checkpoints
    (TMP/NAME.ckpt, with CHECKPOINT's keys) named after NAME. Returns the config (a dict)."""
    return {
        "model": {"n_layer": 2, "n_head": 2, "n_embd": 64, "n_positions": 64, "vocab_size": 100},
        "data": {"train": os.path.join(tmp, "train.bin")},
        "train": {"steps": steps, "metrics": os.path.join(tmp, f"{name}.metrics.jsonl")},
        "checkpoint": dict({"dir": os.path.join(tmp, f"{name}.ckpt")}, **(checkpoint or {})),
        "train_batch_size": batch,
        "train_micro_batch_size_per_gpu": 2,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "steps_per_print": 1,
    }


def rank_pids(cfg_path, parent):
    """{rank: pid} of the shardlm processes that mpirun (pid parent) started with cfg_path
    on their command line, found through /proc."""
    found = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if cfg_path.encode() not in argv or not argv[0].endswith(b"shardlm"):
                continue
            with open(f"/proc/{d}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if ppid == parent and b"OMPI_COMM_WORLD_RANK" in env:
            found[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(d)
    return found


# A run being watched for its first steps fails when its metrics file goes this long
# without a new step: a fixed deadline from the launch measured how busy the machine
# was (steps of these runs take 20-300 ms alone; MPI start-up a second or two).
STEPS_STALL = 60


def wait_for_steps(proc, metrics, n, poll=0.02):
    """Waits until the metrics file METRICS (JSON lines) holds N steps with a loss or the
    process PROC has exited, or the file has gained no step for STEPS_STALL seconds;
    returns the number of steps it holds."""
    steps, since = 0, time.time()
    while proc.poll() is None and time.time() - since < STEPS_STALL:
        try:
            with open(metrics) as f:
                now = sum(1 for line in f if '"loss"' in line)
        except OSError:
            now = 0
        if now >= n:
            return now
        if now != steps:
            steps, since = now, time.time()
        time.sleep(poll)
    return steps


def run_main(name, main):
    """Runs a test's main(); a crash is a failure with its reason, never a silent
    pass. Exits non-zero when any check failed."""
    try:
        main()
    except Exception as e:
        import traceback
        traceback.print_exc()
        check(name, False, f"{type(e).__name__}: {e}")
    sys.exit(1 if failures() else 0)


def run_main_with_cluster(name, main, stop_cluster):
    """run_main for a test that starts a Slurm cluster (as root): STOP_CLUSTER() runs on the
    way out whatever happened, also on SIGTERM (run.sh's timeout); the total time is noted."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    t0 = time.time()
    try:
        run_main(name, main)
    finally:
        if os.geteuid() == 0:
            stop_cluster()
        note(f"{name} took {time.time() - t0:.0f} s")
        sys.exit(1 if failures() else 0)
