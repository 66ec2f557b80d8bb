"""Fault injection (issue 14), in the spirit of SQLite's: every integer key at its
extremes, a stop signal at every phase of a run, outputs that alias inputs, a full
disk under every file shardlm writes, inputs replaced and pointer files damaged
while or before a run reads them, a precision change on resume, and errors that
every rank of a job meets. Each case asserts the exit status, the one message line
(or the documented behaviour) and that no file that existed before was changed.

Signals come from SHARDLM_INJECT_SIGNAL=PHASE:SIG (src/run/train.c), which raises the
signal in the process when it reaches PHASE, so every phase is hit exactly and no
case depends on timing; tests/t_resume.py and t_slurm.py send real signals from
outside. The cases run one process each (MPI singleton), except those about ranks.
"""
import json
import os
import shutil
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor

import harness
from harness import BIN, ENV, check, note, write_shard

import numpy as np

TMP = harness.scratch_dir("faults")
V, T = 64, 16
DATA = os.path.join(TMP, "train.bin")
write_shard(DATA, np.random.default_rng(14).integers(0, V, size=64 * T + 1))
SIGTERM, SIGUSR1 = int(signal.SIGTERM), int(signal.SIGUSR1)


def make_config(name, ckdir=None, steps=3, **top):
    cfg = {
        "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": T, "vocab_size": V},
        "data": {"train": DATA, "seq_len": T},
        "train": {"steps": steps, "eval_every": 0, "sample_tokens": 0, "metrics": os.path.join(TMP, name + ".jsonl")},
        "train_micro_batch_size_per_gpu": 2,
        "zero_optimization": {"stage": 3},
    }
    if ckdir:
        cfg["checkpoint"] = {"dir": ckdir}
    cfg.update(top)
    path = os.path.join(TMP, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def files_state(root=TMP):
    """{path: sha256} of every file under ROOT."""
    return harness.files_state(root)


def changed(before, after, allowed=()):
    """Files of BEFORE that AFTER lacks or holds with other bytes, except ALLOWED."""
    # (a checkpoint.dir's .shardlm.lock records the run that last held the directory: a run refused after
    # taking it rewrites that record, its own bookkeeping, and nothing else)
    return sorted(p for p in before if p not in allowed and not p.endswith("/.shardlm.lock") and
                  after.get(p) != before[p])


def error_lines(text):
    return [line for line in text.splitlines() if line.startswith("shardlm") and "error" in line]


def sanitizer_report(text):
    return "runtime error:" in text or "AddressSanitizer" in text or "LeakSanitizer" in text


def run(args, env=None, timeout=300, ranks=0):
    """Runs `shardlm ARGS` (under mpirun -np RANKS when RANKS); returns (status, stdout + stderr)."""
    cmd = ([BIN] if not ranks else ["mpirun", "-np", str(ranks), "--oversubscribe", BIN]) + list(args)
    e = dict(ENV, **(env or {}))
    try:
        r = subprocess.run(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        return r.returncode, r.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired:
        return None, f"still running after {timeout} s"


def tail(text, n=3):
    return " | ".join(text.strip().splitlines()[-n:])


def one_error(name, rc, out, words, want_rc=2, before=None, after=None, allowed=()):
    """check NAME: exit WANT_RC, exactly one error line holding every word, no sanitizer report,
    and (when given) no file of BEFORE changed."""
    lines = error_lines(out)
    bad = changed(before, after, allowed) if before is not None else []
    ok = rc == want_rc and len(lines) == 1 and all(w in lines[0] for w in words) and not sanitizer_report(out) \
        and not bad
    check(name, ok, f"exit {rc} (want {want_rc}); error lines {lines[:2]} (want one naming {words}); "
          f"changed files {bad}; {tail(out) if not lines else ''}")
    return ok


# ---- 1: every integer key at its extremes ----------------------------------------------------------------------
INT_KEYS = [
    "model.n_layer", "model.n_head", "model.n_kv_head", "model.ffn_dim", "model.n_embd", "model.n_positions",
    "model.vocab_size", "model.init_seed", "data.seq_len", "train.steps", "train.seed", "train.eval_every",
    "train.eval_batches", "train.sample_tokens", "train.threads", "checkpoint.every", "checkpoint.keep",
    "scheduler.params.warmup_num_steps", "scheduler.params.total_num_steps",
    "scheduler.params.last_batch_iteration", "fp16.initial_scale_power", "fp16.loss_scale_window",
    "fp16.hysteresis", "zero_optimization.stage", "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_max_live_parameters", "zero_optimization.stage3_param_persistence_threshold",
    "zero_optimization.reduce_bucket_size", "activation_checkpointing.interval", "train_batch_size",
    "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "steps_per_print", "lora.r",
]
EXTREMES = ["-1", "0", str(2**31 - 1), str(2**31), str(2**63 - 1), "1e300", "1.5"]


def size_case(key, value, base):
    """One key at one value, in a run stopped by an injected SIGTERM inside step 1 (so that
    valid extremes such as train.steps = 2^31 - 1 end at once): exit 2 with one line naming
    the key, or 128 + 15 after the step; never a crash, an internal error or a sanitizer report."""
    extra = ["--set", f"{key}={value}"]
    if key.startswith("fp16."):
        extra += ["--set", "fp16.enabled=true"]
    if key.startswith("activation_checkpointing."):
        extra += ["--set", "activation_checkpointing.enabled=true"]
    if key.startswith("checkpoint."):
        extra += ["--set", f"checkpoint.dir={os.path.join(TMP, 'ck_sizes_' + key + value)}"]
    if key.startswith("scheduler."):
        extra += ["--set", "scheduler.type=WarmupLR"]
    if key == "train.eval_batches":
        extra += ["--set", f"data.val={DATA}", "--set", "train.eval_every=1"]
    rc, out = run(["train", base, "--quiet"] + extra, env={"SHARDLM_INJECT_SIGNAL": "step:TERM"}, timeout=120)
    return key, value, rc, out


def sizes():
    base = make_config("sizes", steps=3)
    before = files_state()
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda kv: size_case(*kv, base), [(k, v) for k in INT_KEYS for v in EXTREMES]))
    bad = []
    counts = {2: 0, 128 + SIGTERM: 0, 3: 0}
    for key, value, rc, out in results:
        lines = error_lines(out)
        leaf = key.rsplit(".", 1)[-1]
        if rc == 2:  # refused naming the key, or a plan larger than this node's memory
            ok = len(lines) == 1 and (leaf in lines[0] or "of host memory per rank" in lines[0]) \
                and "internal error" not in out
        elif rc in (128 + SIGTERM, 3):  # valid: stopped after step 1 (3: a checkpoint.dir was set)
            ok = not lines and "stopped by SIGTERM" in out
        else:
            ok = False
        ok = ok and not sanitizer_report(out)
        counts[rc] = counts.get(rc, 0) + 1
        if not ok:
            bad.append(f"{key}={value}: exit {rc}, {lines[:1] or tail(out, 2)}")
    check("sizes.every_int_key_at_extremes", not bad, f"{len(bad)} of {len(results)} cases: {bad[:4]}")
    note(f"sizes: {len(results)} cases, exit statuses {counts}")
    # both the refused and the accepted extremes occur (the sweep is not vacuous)
    check("sizes.some_refused_some_run", counts.get(2, 0) > 50 and counts.get(128 + SIGTERM, 0) > 20,
          f"exit statuses {counts}")
    products = [  # the size products the issue found wrapping, and their neighbours
        ("n_layer_1e8", ["--set", "model.n_layer=100000000"], ["model.n_layer", "65536"]),
        ("n_embd_1e9", ["--set", "model.n_embd=1000000000", "--set", "model.n_head=1"], ["model.n_embd"]),
        ("embedding", ["--set", "model.vocab_size=2000000000", "--set", "model.n_embd=1024"],
         ["token embedding", "model.vocab_size"]),
        ("mlp", ["--set", "model.type=llama", "--set", "model.ffn_dim=2000000000", "--set", "model.n_embd=1024"],
         ["MLP", "model.ffn_dim"]),
        ("tokens", ["--set", "train_micro_batch_size_per_gpu=202443395"],
         ["train_micro_batch_size_per_gpu", "data.seq_len", "tokens per micro-batch"]),
        ("logits", ["--set", "train_micro_batch_size_per_gpu=100000000", "--set", "model.vocab_size=100000"],
         ["logits", "model.vocab_size"]),
        ("attention", ["--set", "model.n_positions=1000000", "--set", "data.seq_len=1000000",
                       "--set", "model.n_head=16", "--set", "train_micro_batch_size_per_gpu=2"],
         ["attention scores", "data.seq_len"]),
        ("all_layers", ["--set", "model.n_layer=60000", "--set", "model.n_embd=256", "--set", "model.n_head=4",
                        "--set", "model.n_positions=4096", "--set", "data.seq_len=4096",
                        "--set", "train_micro_batch_size_per_gpu=64"], ["activations of all layers", "model.n_layer"]),
        ("host_memory", ["--set", "model.n_layer=4000", "--set", "model.n_embd=1024", "--set", "model.n_head=8"],
         ["of host memory per rank", "available on this node"]),
    ]
    for name, args, words in products:
        # the T x T scores exist only in the CPU's materialized attention (the tiled one keeps row statistics)
        rc, out = run(["train", base, "--quiet"] + args,
                      env={"SHARDLM_ATTENTION": "materialized"} if name == "attention" else None)
        one_error(f"sizes.product_{name}", rc, out, words, before=before, after=files_state())
    rc, out = run(["plan", "--preset", "llama2-70b", "--set", "train_micro_batch_size_per_gpu=202443395",
                   "--gpu-mem", "80GB"])
    one_error("sizes.plan_wrapping_sum", rc, out, ["train_micro_batch_size_per_gpu", "tokens per micro-batch"])


# ---- 2: a stop signal at every phase ---------------------------------------------------------------------------
def latest_of(d):
    p = os.path.join(d, "latest")
    return open(p).read().strip() if os.path.exists(p) else None


def fresh_dir(name):
    d = os.path.join(TMP, "ck_" + name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def signals():
    # before the first step (start-up, config, set-up): the run still trains its first step and
    # saves it, so a job signalled before every first step progresses through its requeues; exit 3
    for phase in ("start", "config", "setup"):
        for sig in ("TERM", "INT", "USR1"):
            d = fresh_dir(f"sig_{phase}_{sig}")
            cfg = make_config(f"sig_{phase}_{sig}", ckdir=d)
            rc, out = run(["train", cfg, "--quiet", "--resume", "auto"], env={"SHARDLM_INJECT_SIGNAL": f"{phase}:{sig}"})
            check(f"signal.{phase}_{sig}.first_step_saved_exit_3",
                  rc == 3 and f"step     1 | stopped by SIG{sig} after saving a checkpoint" in out
                  and latest_of(d) == "step_000001.h5" and not error_lines(out),
                  f"exit {rc}, latest {latest_of(d)!r}: {tail(out)}")
    # no checkpoint.dir: the signal's own status, never 3
    for phase, sig, num in (("start", "TERM", SIGTERM), ("step", "USR1", SIGUSR1)):
        cfg = make_config(f"sig_nodir_{phase}")
        rc, out = run(["train", cfg, "--quiet"], env={"SHARDLM_INJECT_SIGNAL": f"{phase}:{sig}"})
        check(f"signal.no_checkpoint_dir_{phase}_{sig}", rc == 128 + num and "exit status 3" not in out
              and "no checkpoint.dir" in out, f"exit {rc}: {tail(out)}")
    # inside a step, and as a save begins (checkpoint.every 1): the step ends, a checkpoint of it
    # is saved, exit 3; --resume auto then finishes the run
    for phase, sig, want_step in (("step", "TERM", 1), ("step", "INT", 1), ("step", "USR1", 1), ("save", "TERM", 2)):
        name = f"sig_{phase}_{sig}"
        d = fresh_dir(name)
        cfg = make_config(name, ckdir=d, steps=4)
        if phase == "save":
            with open(cfg) as f:
                c = json.load(f)
            c["checkpoint"]["every"] = 1
            with open(cfg, "w") as f:
                json.dump(c, f)
        rc, out = run(["train", cfg, "--quiet", "--resume", "auto"], env={"SHARDLM_INJECT_SIGNAL": f"{phase}:{sig}"})
        want = f"step_{want_step:06d}.h5"
        check(f"signal.{phase}_{sig}.saved_exit_3", rc == 3 and latest_of(d) == want
              and f"stopped by SIG{sig} after saving a checkpoint" in out, f"exit {rc}, latest {latest_of(d)!r} "
              f"(want {want}): {tail(out)}")
        rc, out = run(["train", cfg, "--quiet", "--resume", "auto"])
        check(f"signal.{phase}_{sig}.resumes", rc == 0 and f"at step {want_step}" in out
              and latest_of(d) == "step_000004.h5", f"exit {rc}, latest {latest_of(d)!r}: {tail(out)}")
    # while resuming: one step after the checkpoint read, saved; the checkpoint read unchanged
    d = os.path.join(TMP, "ck_sig_step_TERM")  # holds step 1 and step 4 from above
    read = os.path.join(d, "step_000004.h5")
    before = files_state(d)
    cfg = make_config("sig_resume", ckdir=d, steps=8)
    rc, out = run(["train", cfg, "--quiet", "--resume", "auto"], env={"SHARDLM_INJECT_SIGNAL": "resume:TERM"})
    check("signal.resume_TERM.next_step_saved", rc == 3 and "resumed from" in out and latest_of(d) == "step_000005.h5"
          and files_state(d).get(read) == before.get(read), f"exit {rc}, latest {latest_of(d)!r}: {tail(out)}")
    # after the last step (during the sample): the run is complete: exit 0, the sample cut short
    d = fresh_dir("sig_exit")
    cfg = make_config("sig_exit", ckdir=d, steps=2)
    rc, out = run(["train", cfg, "--quiet", "--set", "train.sample_tokens=1000"],
                  env={"SHARDLM_INJECT_SIGNAL": "exit:TERM"})
    check("signal.exit_TERM.completes", rc == 0 and latest_of(d) == "step_000002.h5"
          and "the sample stops at 1 tokens" in out, f"exit {rc}, latest {latest_of(d)!r}: {tail(out)}")
    # two ranks, both signalled inside step 1: they agree, save once and exit 3
    d = fresh_dir("sig_ranks")
    cfg = make_config("sig_ranks", ckdir=d, steps=4)
    rc, out = run(["train", cfg, "--quiet"], env={"SHARDLM_INJECT_SIGNAL": "step:TERM"}, ranks=2)
    check("signal.two_ranks_step", rc == 3 and latest_of(d) == "step_000001.h5", f"exit {rc}: {tail(out)}")


# ---- 3: errors every rank meets are printed once ----------------------------------------------------------------
def once_per_job():
    cases = [
        ("config", ["--set", "model.n_head=3"], ["model.n_head"]),
        ("data", ["--set", f"data.train={os.path.join(TMP, 'missing.bin')}"], ["missing.bin"]),
    ]
    for name, args, words in cases:
        cfg = make_config("once_" + name)
        rc, out = run(["train", cfg, "--quiet"] + args, ranks=2)
        one_error(f"once.{name}", rc, out, words + ["rank 0"])
        check(f"once.{name}_no_abort_banner", "MPI_ABORT" not in out, tail(out, 6))


# ---- 4: outputs aliasing inputs --------------------------------------------------------------------------------
def aliases():
    d = fresh_dir("alias")
    cfg = make_config("alias", ckdir=d, steps=2)
    rc, out = run(["train", cfg, "--quiet"])
    if not (rc == 0 and latest_of(d) == "step_000002.h5"):
        check("alias.setup", False, f"exit {rc}: {tail(out)}")
        return
    ds = os.path.join(TMP, "alias_ds.json")
    with open(ds, "w") as f:
        json.dump({"train_micro_batch_size_per_gpu": 2}, f)
    ck = os.path.join(d, "step_000002.h5")
    link = os.path.join(TMP, "alias_link.jsonl")
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(cfg, link)
    cases = [  # name, extra arguments, words of the one error line
        ("metrics_is_config", ["--set", f"train.metrics={cfg}"], ["train.metrics", "config file"]),
        ("metrics_links_to_config", ["--set", f"train.metrics={link}"], ["train.metrics", "config file"]),
        ("metrics_is_deepspeed", ["--deepspeed", ds, "--set", f"train.metrics={ds}"], ["DeepSpeed config file"]),
        ("metrics_is_latest", ["--set", f"train.metrics={os.path.join(d, 'latest')}"], ["file of checkpoint.dir"]),
        ("metrics_is_checkpoint", ["--set", f"train.metrics={ck}"], ["file of checkpoint.dir"]),
        ("metrics_is_resumed", ["--resume", ck, "--set", f"checkpoint.dir={fresh_dir('alias2')}",
                                "--set", f"train.metrics={ck}"], ["checkpoint to resume from"]),
        ("dump_final_is_data", ["--dump-final", DATA], ["--dump-final", "train data"]),
        ("dump_is_config", ["--dump", cfg], ["--dump", "config file"]),
    ]
    for name, args, words in cases:
        before = files_state()
        # a fresh start over D's checkpoints, as asked for (else refused as one: t_resume fresh_start.*)
        fresh = [] if "--resume" in args else ["--resume", "none", "--overwrite"]
        rc, out = run(["train", cfg, "--quiet", "--set", "train.steps=3"] + fresh + args)
        one_error(f"alias.{name}", rc, out, words, before=before, after=files_state())
    for name, out_path, words in (("export_over_checkpoint", os.path.join(d, "step_000001.h5"), ["training checkpoint"]),
                                  ("export_onto_itself", ck, ["the checkpoint being exported"])):
        shutil.copy(ck, os.path.join(d, "step_000001.h5")) if name.endswith("checkpoint") else None
        before = files_state()
        rc, out = run(["export", ck, out_path])
        one_error(f"alias.{name}", rc, out, words, before=before, after=files_state())


# ---- 5: a full disk under every file shardlm writes --------------------------------------------------------------
def full_disk():
    mnt = os.path.join(TMP, "full")
    if not harness.mount_full_disk(mnt, "full.mount"):
        return
    try:
        src = os.path.join(TMP, "ck_full_src")
        shutil.rmtree(src, ignore_errors=True)
        cfg = make_config("full_src", ckdir=src, steps=1, model={"n_layer": 2, "n_head": 2, "n_embd": 32,
                                                                 "n_positions": T, "vocab_size": V})
        rc, out = run(["train", cfg, "--quiet"])
        ck = os.path.join(src, "step_000001.h5")
        if rc != 0 or not os.path.exists(ck):
            check("full.setup", False, f"exit {rc}: {tail(out)}")
            return
        old = b"an older file that a failed write must leave as it was\n"
        cases = [  # name, arguments, the output on the full disk, words
            ("export_h5", ["export", ck, os.path.join(mnt, "model.h5"), "--overwrite"], "model.h5", ["model.h5.tmp"]),
            ("export_safetensors", ["export", ck, os.path.join(mnt, "model.safetensors"), "--overwrite"],
             "model.safetensors",
             ["model.safetensors.tmp", "No space left"]),
            ("dump_final", ["train", cfg, "--quiet", "--set", "checkpoint.dir=" + fresh_dir("full_dump"),
                            "--dump-final", os.path.join(mnt, "final.dump")], "final.dump", ["No space left"]),
            ("checkpoint", ["train", cfg, "--quiet", "--set", f"checkpoint.dir={os.path.join(mnt, 'ck')}"],
             "ck/latest", ["No space left"]),
            ("metrics", ["train", cfg, "--quiet", "--set", "checkpoint.dir=" + fresh_dir("full_metrics"),
                         "--set", "train.steps=400", "--set", f"train.metrics={os.path.join(mnt, 'm.jsonl')}"],
             "m.jsonl", ["m.jsonl", "No space left"]),
        ]
        for name, args, target, words in cases:
            for p in os.listdir(mnt):
                shutil.rmtree(os.path.join(mnt, p)) if os.path.isdir(os.path.join(mnt, p)) else \
                    os.remove(os.path.join(mnt, p))
            path = os.path.join(mnt, target)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if name == "checkpoint":  # an older checkpoint pointer stays
                with open(path, "w") as f:
                    f.write("step_000000.h5\n")
            elif name != "metrics":
                with open(path, "wb") as f:
                    f.write(old)
            before = files_state(TMP)
            rc, out = run(args)
            metrics = os.path.join(TMP, "full_src.jsonl")
            ok = one_error(f"full.{name}", rc, out, words, before=before, after=files_state(TMP),
                           allowed=(path, metrics) if name == "metrics" else (metrics,))
            left = sorted(os.path.relpath(os.path.join(dp, n), mnt) for dp, _, ns in os.walk(mnt) for n in ns)
            check(f"full.{name}.no_partial_files", not any(n.endswith(".tmp") for n in left) and ok,
                  f"left on the full disk: {left}")
    finally:
        subprocess.run(["umount", mnt])


# ---- 6: inputs replaced or damaged ------------------------------------------------------------------------------
def inputs():
    # the data file replaced (a new file renamed over it) while a run reads it: the run keeps the
    # file it opened and finishes, as documented
    path = os.path.join(TMP, "replaced.bin")
    shutil.copy(DATA, path)
    cfg = make_config("replaced", steps=100000)
    with open(cfg) as f:
        c = json.load(f)
    c["data"]["train"] = path
    with open(cfg, "w") as f:
        json.dump(c, f)
    mpath = os.path.join(TMP, "replaced.jsonl")
    p = subprocess.Popen([BIN, "train", cfg, "--quiet"], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        steps = harness.wait_for_steps(p, mpath, 3)
        other = os.path.join(TMP, "replacement.bin")
        write_shard(other, np.zeros(10, dtype=np.int64))
        os.rename(other, path)
        n0 = steps
        steps = harness.wait_for_steps(p, mpath, n0 + 3)
        p.send_signal(signal.SIGTERM)
        out = p.communicate(timeout=120)[0].decode(errors="replace")
        check("inputs.data_replaced_while_running", steps >= n0 + 3 and p.returncode == 128 + SIGTERM
              and not error_lines(out), f"{n0} then {steps} steps, exit {p.returncode}: {tail(out)}")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    # damaged pointer files given to inspect and export (what users type: DIR/latest)
    d = fresh_dir("ptr")
    cfg = make_config("ptr", ckdir=d, steps=1)
    rc, out = run(["train", cfg, "--quiet"])
    latest = os.path.join(d, "latest")
    for name, content, words in (("garbage", b"garbage\n", ["latest"]), ("dot", b".\n", ["latest"]),
                                 ("missing", b"step_000009.h5\n", ["step_000009.h5"]), ("empty", b"", ["latest"])):
        with open(latest, "wb") as f:
            f.write(content)
        for cmd in (["inspect", latest], ["export", latest, os.path.join(TMP, "ptr_out.h5")]):
            before = files_state()
            rc, out = run(cmd)
            one_error(f"inputs.pointer_{name}_{cmd[0]}", rc, out, words, before=before, after=files_state())
    # a truncated checkpoint given to --resume: refused before any step, the directory unchanged
    d = fresh_dir("trunc")
    cfg = make_config("trunc", ckdir=d, steps=2)
    run(["train", cfg, "--quiet"])
    ck = os.path.join(d, "step_000002.h5")
    if os.path.exists(ck):
        os.truncate(ck, os.path.getsize(ck) // 2)
        before = files_state(d)
        rc, out = run(["train", cfg, "--quiet", "--resume", "auto", "--set", "train.steps=4"])
        one_error("inputs.truncated_checkpoint", rc, out, ["step_000002.h5"], before=before, after=files_state(d))
    else:
        check("inputs.truncated_checkpoint", False, "the run saved no step_000002.h5")


# ---- 7: a precision change on resume -----------------------------------------------------------------------------
def precision_change():
    d = fresh_dir("prec")
    cfg = make_config("prec", ckdir=d, steps=2)
    rc, out = run(["train", cfg, "--quiet"])
    rc, out = run(["train", cfg, "--quiet", "--resume", "auto", "--set", "train.steps=4",
                   "--set", "fp16.enabled=true"])
    check("precision.fp32_to_fp16_resumes", rc == 0 and "trained in fp32, this run in fp16" in out
          and "the fp16 loss scaler starts fresh" in out and latest_of(d) == "step_000004.h5",
          f"exit {rc}: {tail(out)}")


def main():
    if not os.access(BIN, os.X_OK):
        check("binary", False, f"{BIN} is not an executable")
        return
    sizes()
    signals()
    once_per_job()
    aliases()
    full_disk()
    inputs()
    precision_change()


if __name__ == "__main__":
    harness.run_main("t_faults", main)
