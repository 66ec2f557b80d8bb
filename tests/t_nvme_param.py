#!/usr/bin/env python3
"""t_nvme_param — offload_param "device": "nvme" at stage 3 (issue 36 item 2): each rank's parameter
shards in its file under nvme_path, read ahead of the gathers through param_buffer_count pinned buffers,
trained shards written back after each step.

Checks:
  same.fp32.N1, same.bf16.N2, same.fp32.N3
                              3 steps with offload_param nvme: losses (metrics) and final parameters
                              (--dump-final) bitwise equal to the same run with offload_param cpu (fp32 with
                              offload_optimizer cpu, bf16 without: both have an fp32 master, so every unit's
                              shard lives in the file and is written back after each step); the log names the
                              file, its bytes and the buffers' (each unit's shard at 4 KiB, buffers of the
                              largest shard: computed here from the model's units); every gather found its shard read ahead (the end-of-run line); the file is
                              gone after the run
  emu.bf16.N2                 the same under device emulation (SHARDLM_EMULATE_DEVICE, fp32 activations): shards
                              copied from the buffers into device memory, the master in device memory
  same.fp16.N2                the same in fp16 (with its loss scaler)
  same.actckpt.bf16.N2        the same with activation checkpointing every block (recompute passes)
  ckpt.bf16.N2, ckpt.fp32.N3  those pairs save a checkpoint every step: every dataset at step 3 bitwise equal between
                              nvme and cpu; a resume under nvme from the nvme run's step-2 checkpoint to step 3
                              ends bitwise equal to that run (the resume writes the shards into the file)
  both.fp32.N2, both.bf16.N3, both.emu.bf16.N2
                              offload_optimizer nvme as well (against offload_optimizer cpu + offload_param cpu):
                              the trained shards are narrowed from the optimizer's file after each step; the same
                              checks; ckpt.both.fp32.N2 its checkpoint, ckpt.resume.both a resume under both
  lora.N2                     a LoRA run (frozen base on NVMe, adapters in memory): losses and adapters bitwise
                              equal to offload_param cpu
  rss                         LoRA on a base that dominates host memory: the peak RSS with the base on NVMe is
                              lower than with offload_param cpu by at least half the base's bytes
  bad.notdir                  nvme_path is a file: exit 2, one line naming the path
  bad.locked                  the rank's file locked by another holder (a second job): exit 2, "in use by
                              another job"
  bad.full                    nvme_path on a disk without room for the file (a 48 KiB tmpfs): exit 2, the line
                              names the path and the bytes needed
  bad.buffer_size             offload_param.buffer_size below the largest unit shard: exit 2, the line names the
                              unit and the size needed
  bad.stale_swept             a killed job's .param file (not locked, 2 minutes old) is removed with one warning
                              naming it; a new one is kept
"""
import fcntl
import json
import os
import re
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (BIN, ENV, check, failures, mount_full_disk, read_dump, round_up, scratch_dir,  # noqa: E402
                     write_shard)

try:
    import h5py
except ImportError:  # pragma: no cover
    h5py = None

TMP = scratch_dir("t_nvme_param")
V, T = 100, 16
MODEL = {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": T, "vocab_size": V}
ASAN = "build-asan" in os.environ.get("SHARDLM_BIN", "")

rng = np.random.default_rng(36)
DATA = os.path.join(TMP, "train.bin")
write_shard(DATA, rng.integers(0, V, size=60 * T + 1))


def config(name, device, dtype="fp32", offload_opt=False, steps=3, model=None, lora=None, ckdir=None, nvme=None,
           param_extra=None, extra=None):
    cfg = {
        "model": dict(model or MODEL),
        "data": {"train": DATA, "seq_len": T, "shuffle": False},
        "train": {"steps": steps, "seed": 7, "eval_every": 0, "sample_tokens": 0,
                  "metrics": os.path.join(TMP, name + ".jsonl")},
        "train_batch_size": 12, "train_micro_batch_size_per_gpu": 2,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": 0.1}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                              "offload_param": {"device": device}},
    }
    if device == "nvme":
        cfg["zero_optimization"]["offload_param"]["nvme_path"] = nvme or os.path.join(TMP, "nvme", name)
        cfg["zero_optimization"]["offload_param"]["buffer_count"] = 3
    cfg["zero_optimization"]["offload_param"].update(param_extra or {})
    if offload_opt == "nvme":  # the optimizer's file beside the parameters' (in the same nvme_path)
        cfg["zero_optimization"]["offload_optimizer"] = {
            "device": "nvme", "nvme_path": nvme or os.path.join(TMP, "nvme", name)}
    elif offload_opt:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    if dtype in ("bf16", "fp16"):
        cfg[dtype] = {"enabled": True}
    cfg.update(extra or {})
    if lora:
        cfg["lora"] = lora
    if ckdir:
        cfg["checkpoint"] = {"dir": ckdir, "every": 1, "keep": 5}
    path = os.path.join(TMP, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def run(name, N, cfg, *args, final=True, env=None):
    """(exit status, output, losses, final dump or None)."""
    mpath = os.path.join(TMP, name + ".jsonl")
    if os.path.exists(mpath) and "--resume" not in args:
        os.remove(mpath)
    fin = os.path.join(TMP, name + ".final")
    cmd = [BIN, "train", cfg, "--quiet", *args] + (["--dump-final", fin] if final else [])
    if N > 1:
        cmd = ["mpirun", "-q", "-np", str(N), "--oversubscribe"] + cmd
    r = subprocess.run(cmd, env=dict(ENV, **(env or {})), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=300)
    out = r.stdout.decode(errors="replace")
    losses = []
    if os.path.exists(mpath):
        with open(mpath) as f:
            losses = [json.loads(line)["loss"] for line in f if '"loss"' in line]
    dump = read_dump(fin) if final and r.returncode == 0 and os.path.exists(fin) else None
    return r.returncode, out, losses, dump


def differ(a, b):
    """Names of the tensors that are not bitwise equal (or missing)."""
    if a is None or b is None:
        return ["<no dump>"]
    return [n for n in set(a) | set(b)
            if n not in a or n not in b or np.asarray(a[n]).tobytes() != np.asarray(b[n]).tobytes()]


def h5_differ(pa, pb):
    """Dataset paths whose bytes differ between two HDF5 files (or that one lacks)."""
    da, db = {}, {}
    for path, d in ((pa, da), (pb, db)):
        with h5py.File(path, "r") as f:
            f.visititems(lambda n, o, d=d: d.__setitem__(n, o[()].tobytes()) if isinstance(o, h5py.Dataset)
                         else None)
    return [n for n in set(da) | set(db) if da.get(n) != db.get(n)]


def tail(out, n=3):
    return " | ".join(out.strip().splitlines()[-n:])


def unit_sizes(model):
    """Elements of each unit of the GPT-2 MODEL as model.c lays it out (tensors at 16-element offsets; the
    vocabulary padded to 128)."""
    C, L, VP, ALIGN = model["n_embd"], model["n_layer"], round_up(model["vocab_size"], 128), 16
    block = [C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C]
    return ([round_up(VP * C, ALIGN) + round_up(T * C, ALIGN)] + [sum(round_up(n, ALIGN) for n in block)] * L
            + [2 * round_up(C, ALIGN)])


def file_layout(N, esize, buffers):
    """(file bytes, bytes per buffer) of a rank at N when every unit of MODEL is on NVMe."""
    shards = [round_up(n, N * 16) // N for n in unit_sizes(MODEL)]
    return sum(round_up(s * esize, 4096) for s in shards), round_up(max(shards) * esize, 4096)


def layout_line(out):
    m = re.search(r"offload_param nvme: '[^']*' \((\d+) bytes, [A-Za-z_]+\), (\d+) buffers of (\d+) bytes", out)
    return (int(m.group(1)), int(m.group(3))) if m else None


def read_ahead(out):
    """(gathers read ahead, gathers) from the run's last log line of the parameter file, None when missing."""
    m = re.search(r"offload_param nvme: [0-9.]+ MiB read, [0-9.]+ MiB written; (\d+) of (\d+) gathers", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def same(tag, N, dtype, offload_opt, ckpt=False, env=None, extra=None):
    res = {}
    for dev in ("cpu", "nvme"):
        name = f"{tag}.{dev}"
        ckdir = os.path.join(TMP, name + ".ckpt") if ckpt else None
        # the reference keeps the optimizer state in memory (offload "cpu" where the nvme run has it on NVMe)
        opt = offload_opt if dev == "nvme" else bool(offload_opt)
        res[dev] = run(name, N, config(name, dev, dtype, opt, ckdir=ckdir, extra=extra), final=True, env=env)
    (rc_c, out_c, loss_c, dump_c), (rc_n, out_n, loss_n, dump_n) = res["cpu"], res["nvme"]
    ok = rc_c == 0 and rc_n == 0
    nvme_dir = os.path.join(TMP, "nvme", f"{tag}.nvme")
    ahead = read_ahead(out_n)
    layout, want = layout_line(out_n), file_layout(N, 4 if dtype == "fp32" else 2, 3)
    check(tag, ok and len(loss_n) == 3 and loss_n == loss_c and not differ(dump_n, dump_c)
          and layout == want and os.path.isdir(nvme_dir) and not os.listdir(nvme_dir)
          and ahead is not None and ahead[1] > 0 and ahead[0] == ahead[1],
          f"exit {rc_c}/{rc_n}; losses {loss_c} vs {loss_n}; differ {differ(dump_n, dump_c)[:4]}; read ahead {ahead}; "
          f"file and buffer bytes {layout}, expected {want}; "
          f"left {os.listdir(nvme_dir) if os.path.isdir(nvme_dir) else None}; {tail(out_n)}")
    return ok


def main():
    # N = 1, 2, 3 and both dtypes with a master in memory (both.bf16.N3 below adds bf16 at N=3)
    matrix = [(1, "fp32"), (2, "bf16")] if ASAN else [(1, "fp32"), (2, "bf16"), (3, "fp32")]
    if ASAN:
        print("# under build-asan: N=1 fp32 and N=2 bf16 of the bitwise matrix, no RSS check (ASan's shadow "
              "memory)", flush=True)
    for N, dtype in matrix:
        same(f"same.{dtype}.N{N}", N, dtype, offload_opt=dtype == "fp32",
             ckpt=(N, dtype) in ((2, "bf16"), (3, "fp32")))
    if not ASAN:
        # fp16 with its loss scaler; activation checkpointing every block: the backward's recompute passes
        # (the read-ahead follows them too)
        same("same.fp16.N2", 2, "fp16", offload_opt=False)
        same("same.actckpt.bf16.N2", 2, "bf16", offload_opt=False,
             extra={"activation_checkpointing": {"enabled": True, "interval": 1}})

    # the device paths (tests/t_device_emu.py): shards copied from the buffers into device memory, a master in
    # device memory (bf16 without offload_optimizer) narrowed through host memory for the write-back
    same("emu.bf16.N2", 2, "bf16", offload_opt=False, env={"SHARDLM_EMULATE_DEVICE": "1",
                                                         "SHARDLM_FP32_ACTIVATIONS": "1"})

    # checkpoints: the N=2 bf16 pair saved every step
    if h5py is None:
        check("ckpt.h5py", False, "h5py is missing (Debian's python3-h5py)")
    else:
        for tag in ("same.bf16.N2",) + (() if ASAN else ("same.fp32.N3",)):
            a = os.path.join(TMP, f"{tag}.nvme.ckpt", "step_000003.h5")
            b = os.path.join(TMP, f"{tag}.cpu.ckpt", "step_000003.h5")
            d = h5_differ(a, b) if os.path.exists(a) and os.path.exists(b) else ["<missing>"]
            check(f"ckpt.{tag[5:]}", not d, f"datasets differ: {d[:5]}")
    # with offload_optimizer nvme too: the trained shards narrowed from the optimizer's file after each step
    same("both.fp32.N2", 2, "fp32", offload_opt="nvme", ckpt=True)
    if not ASAN:
        same("both.bf16.N3", 3, "bf16", offload_opt="nvme")
        same("both.emu.bf16.N2", 2, "bf16", offload_opt="nvme", env={"SHARDLM_EMULATE_DEVICE": "1",
                                                                     "SHARDLM_FP32_ACTIVATIONS": "1"})
    if h5py is not None:
        a, b = (os.path.join(TMP, f"both.fp32.N2.{dev}.ckpt", "step_000003.h5") for dev in ("nvme", "cpu"))
        d = h5_differ(a, b) if os.path.exists(a) and os.path.exists(b) else ["<missing>"]
        check("ckpt.both.fp32.N2", not d, f"datasets differ: {d[:5]}")
    # resume: from the step-2 checkpoint of the nvme run of a pair saved every step to step 3, against that
    # run's end (the resume writes the shards into the file)
    for check_name, tag, dtype, opt in (("ckpt.resume.both", "both.fp32.N2", "fp32", "nvme"),
                                        ("ckpt.resume", "same.bf16.N2", "bf16", False)):
        name = check_name.replace("ckpt.", "")
        step2 = os.path.join(TMP, f"{tag}.nvme.ckpt", "step_000002.h5")
        rc, out, loss, dump = run(name, 2, config(name, "nvme", dtype, opt, ckdir=os.path.join(TMP, name + ".ckpt")),
                                  "--resume", step2)
        ref = read_dump(os.path.join(TMP, f"{tag}.nvme.final"))
        check(check_name, rc == 0 and len(loss) == 1 and not differ(dump, ref),
              f"exit {rc}; losses {loss}; differ {differ(dump, ref)[:4]}; {tail(out)}")

    # LoRA: the frozen base on NVMe
    lora = {"r": 4, "alpha": 8.0}
    res = {dev: run(f"lora.{dev}", 2, config(f"lora.{dev}", dev, lora=lora)) for dev in ("cpu", "nvme")}
    (rc_c, _, loss_c, dump_c), (rc_n, out_n, loss_n, dump_n) = res["cpu"], res["nvme"]
    check("lora.N2", rc_c == 0 and rc_n == 0 and len(loss_n) == 3 and loss_n == loss_c
          and not differ(dump_n, dump_c), f"exit {rc_c}/{rc_n}; {loss_c} vs {loss_n}; {tail(out_n)}")

    if not ASAN:
        rss_check()
    bad_inputs()
    return 1 if failures() else 0


def max_rss_kib(cmd):
    """Peak RSS (KiB) of one command, run under a fresh Python so RUSAGE_CHILDREN holds it alone."""
    code = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, "
            "stderr=subprocess.DEVNULL); print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code] + cmd, env=ENV, stdout=subprocess.PIPE, timeout=300)
    rc, kib = out.stdout.decode().split()
    return int(rc), int(kib)


def rss_check():
    # many blocks, a small vocabulary: the blocks (12 x 192^2 each) dominate, the largest unit (a block,
    # 1.7 MiB fp32) sizes the two buffers; the base is 12 x 12 x 192^2 fp32 = 20.3 MiB; adapters r=2: a few KiB
    big = {"n_layer": 12, "n_head": 4, "n_embd": 192, "n_positions": T, "vocab_size": 256}
    base_bytes = 4 * 12 * 12 * 192 * 192
    got = {}
    for dev in ("cpu", "nvme"):
        cfg = config(f"rss.{dev}", dev, model=big, steps=1, lora={"r": 2, "alpha": 4.0},
                     param_extra={"buffer_count": 2} if dev == "nvme" else None)
        got[dev] = max_rss_kib([BIN, "train", cfg, "--quiet"])
    (rc_c, kib_c), (rc_n, kib_n) = got["cpu"], got["nvme"]
    check("rss", rc_c == 0 and rc_n == 0 and (kib_c - kib_n) * 1024 >= base_bytes // 2,
          f"exit {rc_c}/{rc_n}; peak RSS cpu {kib_c} KiB, nvme {kib_n} KiB; the base is {base_bytes >> 10} KiB")
    print(f"# rss: offload_param cpu {kib_c} KiB, nvme {kib_n} KiB (base {base_bytes >> 10} KiB)", flush=True)


def bad_inputs():
    afile = os.path.join(TMP, "a_file")
    with open(afile, "w") as f:
        f.write("x")
    rc, out, _, _ = run("bad.notdir", 1, config("bad.notdir", "nvme", offload_opt=True, nvme=afile), final=False)
    check("bad.notdir", rc == 2 and "is not a directory" in out and afile in out, f"exit {rc}: {tail(out)}")

    d = os.path.join(TMP, "nvme", "locked")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "shardlm-36778-rank0.param")  # the job name is $SLURM_JOB_ID (else a pid)
    with open(path, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        rc, out, _, _ = run("bad.locked", 1, config("bad.locked", "nvme", offload_opt=True, nvme=d), final=False,
                            env={"SLURM_JOB_ID": "36778"})
    check("bad.locked", rc == 2 and "in use by another job" in out and path in out, f"exit {rc}: {tail(out)}")

    # a disk without room for the file (a 48 KiB tmpfs; the file of MODEL in fp32 at N=1 is 128 KiB)
    mnt = os.path.join(TMP, "full")
    if mount_full_disk(mnt, "bad.full.mount"):
        try:
            rc, out, _, _ = run("bad.full", 1, config("bad.full", "nvme", offload_opt=True, nvme=mnt), final=False)
        finally:
            subprocess.run(["umount", mnt])
        check("bad.full", rc == 2 and f"nvme_path '{mnt}' has" in out and "the offloaded state needs" in out,
              f"exit {rc}: {tail(out)}")

    rc, out, _, _ = run("bad.bufsize", 1, config("bad.bufsize", "nvme", offload_opt=True,
                                                      param_extra={"buffer_size": 1000}),
                        final=False)
    check("bad.buffer_size", rc == 2 and "buffer_size 1000 is smaller than the shard of unit" in out
          and "set buffer_size to at least" in out, f"exit {rc}: {tail(out)}")

    # a killed job's parameter file (unlocked, 2 minutes old) is removed with a warning, a new one is kept: the
    # leftover rule of the optimizer's files (t_nvme bad.stale_swept) covers both kinds
    d = os.path.join(TMP, "nvme", "stale")
    os.makedirs(d, exist_ok=True)
    killed, new = (os.path.join(d, f"shardlm-{k}-rank0.param") for k in ("killed", "new"))
    for path in (killed, new):
        with open(path, "wb") as f:
            f.write(b"\0" * 8192)
    os.utime(killed, (os.path.getmtime(killed) - 120,) * 2)
    rc, out, _, _ = run("stale", 1, config("stale", "nvme", offload_opt=True, nvme=d), final=False)
    warned = [line for line in out.splitlines() if "warning" in line and "removed" in line]
    check("bad.stale_swept", rc == 0 and not os.path.exists(killed) and os.path.exists(new) and len(warned) == 1
          and killed in warned[0], f"exit {rc}, files {sorted(os.listdir(d))}, warnings {warned}")


if __name__ == "__main__":
    sys.exit(main())
