#!/usr/bin/env python3
"""ckpt_io — checkpoint save and load bandwidth of a GPT-2 124M-sized training
state (fp32 master weights + Adam m and v, ~1.5 GB) against a plain sequential
write and read of the same number of bytes on the same file system, in the same
run.

  1. shardlm train, 1 step, GPT-2 124M shape (12 layers, 12 heads, C=768, context
     1024, vocab 50257), micro batch 1, seq_len 64, N ranks (default 2), ZeRO
     stage 3: the save time is the log line "checkpoint PATH (X s)" (the whole
     ckpt_save: HDF5 collective writes, flush, fsync, rename, latest).
  2. shardlm train --resume auto with train.steps 1: the load time is the log
     line "resumed from ... (X s)" (open, attribute checks, every rank reading
     its shards and verifying their CRC-32C pieces).
  3. plain write of the checkpoint's size in 16 MiB requests + fsync (Python,
     one process), then a plain read of it back; both once through the page
     cache and once with O_DIRECT. The faster of the two is the reference.
Before each of the four, the page cache is dropped (echo 3 >
/proc/sys/vm/drop_caches, when allowed) and the machine left idle for
--settle seconds (default 6): on a virtual machine whose balloon driver hands
free pages back to the host (this project's development machines do), the
first use of such a page costs a host page fault, and a write into the page
cache right after pages were freed is 4x faster than one into memory that
has been free for a few seconds. The trainer's save always meets the latter
(it starts seconds after the process did), so the plain side is measured in
the same state. Prints bytes/s of each and the ratios save/plain-write and
load/plain-read (target >= 0.70). Whether the cache could be dropped is
printed: if not, both reads come from the page cache.

Each round measures all of it once; the medians over --rounds (default 3)
are printed, with the ratios' range (the development VM's disk varies by
+-30% from one minute to the next).

Usage: tools/bench/ckpt_io.py [--dir DIR] [--ranks N] [--rounds R] [--settle S] [--keep]
DIR (default /tmp/shardlm-ckpt-io) must have ~3.5 GB free.
"""
import argparse
import json
import mmap
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("SHARDLM_BIN") or os.path.join(ROOT, "bin", "shardlm")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")


def drop_caches(settle):
    """Drops the page cache and waits settle seconds; False when not allowed."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        dropped = True
    except OSError:
        dropped = False
    time.sleep(settle)
    return dropped


def write_shard(path, n_tokens, vocab):
    import random
    rnd = random.Random(1)
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, n_tokens
    with open(path, "wb") as f:
        f.write(b"".join(x.to_bytes(4, "little", signed=True) for x in header))
        f.write(b"".join(rnd.randrange(vocab).to_bytes(2, "little") for _ in range(n_tokens)))


def shardlm(cfg, ranks, *extra):
    cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", BIN, "train", cfg] + list(extra)
    r = subprocess.run(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1800)
    out = r.stdout.decode(errors="replace")
    if r.returncode != 0:
        sys.exit(f"ckpt_io: {' '.join(cmd)} failed ({r.returncode}):\n{out[-3000:]}")
    return out


BLOCK = 16 << 20  # plain I/O request size


def timed_write(path, nbytes, direct):
    """Seconds to write nbytes in BLOCK requests and fsync, from a page-aligned
    buffer (an anonymous mmap), through the page cache or with O_DIRECT."""
    buf = mmap.mmap(-1, BLOCK)
    buf.write(os.urandom(BLOCK))
    t0 = time.time()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0), 0o644)
    left = nbytes
    while left >= BLOCK or (left > 0 and not direct):
        n = min(left, BLOCK)
        os.write(fd, buf if n == BLOCK else buf[:n])
        left -= n
    os.close(fd)
    if left:  # O_DIRECT needs whole blocks: the last partial one through the page cache
        with open(path, "ab") as f:
            f.write(buf[:left])
    fd = os.open(path, os.O_WRONLY)
    os.fsync(fd)
    os.close(fd)
    return time.time() - t0


def plain_write(path, nbytes, direct, settle):
    """timed_write after dropping the page cache and settle idle seconds."""
    drop_caches(settle)
    return timed_write(path, nbytes, direct)


def timed_read(paths, direct):
    """Seconds to read the files one after the other in BLOCK requests into a
    page-aligned buffer, through the page cache or with O_DIRECT."""
    buf = mmap.mmap(-1, BLOCK)
    t0 = time.time()
    for p in paths:
        fd = os.open(p, os.O_RDONLY | (os.O_DIRECT if direct else 0))
        while os.readv(fd, [buf]) == BLOCK:
            pass
        os.close(fd)
    return time.time() - t0


def plain_read(path, direct, settle):
    """timed_read of path after dropping the page cache and settle idle seconds."""
    drop_caches(settle)
    return timed_read([path], direct)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/shardlm-ckpt-io")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--settle", type=float, default=6.0,
                    help="idle seconds after dropping the page cache, before each measurement")
    ap.add_argument("--rounds", type=int, default=3, help="measure everything this many times; medians")
    ap.add_argument("--keep", action="store_true", help="keep DIR afterwards")
    a = ap.parse_args()
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    ck = os.path.join(a.dir, "ck")
    data = os.path.join(a.dir, "train.bin")
    write_shard(data, 64 * 8 + 1, 50257)
    cfg = {
        "model": {"n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024, "vocab_size": 50257},
        "data": {"train": data, "seq_len": 64, "shuffle": False},
        "train": {"steps": 1, "seed": 1, "eval_every": 0, "sample_tokens": 0},
        "train_batch_size": a.ranks,
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": 3},
        "checkpoint": {"dir": ck, "every": 0, "keep": 1},
    }
    cfg_path = os.path.join(a.dir, "gpt2_124m.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=1)

    rounds = []
    for r in range(a.rounds):
        shutil.rmtree(ck, ignore_errors=True)
        drop_caches(a.settle)
        out = shardlm(cfg_path, a.ranks, "--quiet")
        m = re.search(r"checkpoint (\S+) \(([\d.]+) s\)", out)
        if not m:
            sys.exit("ckpt_io: no 'checkpoint PATH (X s)' line in:\n" + out[-2000:])
        path, save_s = m.group(1), float(m.group(2))
        nbytes = os.path.getsize(path)
        dropped = drop_caches(a.settle)
        out = shardlm(cfg_path, a.ranks, "--quiet", "--resume", "auto")
        m = re.search(r"resumed from \S+ at step \d+ .*\(([\d.]+) s\)", out)
        if not m:
            sys.exit("ckpt_io: no 'resumed from ... (X s)' line in:\n" + out[-2000:])
        load_s = float(m.group(1))
        plain = os.path.join(a.dir, "plain.bin")
        t = {"save": save_s, "load": load_s,
             "write_buffered": plain_write(plain, nbytes, direct=False, settle=a.settle),
             "read_buffered": plain_read(plain, direct=False, settle=a.settle)}
        os.unlink(plain)
        t["write_direct"] = plain_write(plain, nbytes, direct=True, settle=a.settle)
        t["read_direct"] = plain_read(plain, direct=True, settle=a.settle)
        os.unlink(plain)
        t["write"], t["read"] = min(t["write_buffered"], t["write_direct"]), min(t["read_buffered"], t["read_direct"])
        rounds.append(t)
        print(f"round {r + 1}: save {save_s:.2f} s, load {load_s:.2f} s; plain write {t['write_buffered']:.2f} s "
              f"buffered, {t['write_direct']:.2f} s O_DIRECT; plain read {t['read_buffered']:.2f} s buffered, "
              f"{t['read_direct']:.2f} s O_DIRECT; ratios save {t['write'] / save_s:.2f}, load "
              f"{t['read'] / load_s:.2f}", flush=True)

    def median(key):
        return statistics.median(t[key] for t in rounds)

    def gbs(s):
        return nbytes / s / 1e9 if s > 0 else float("inf")

    print(f"checkpoint of {nbytes} bytes, {a.ranks} ranks, {a.rounds} rounds, medians; page cache dropped before "
          f"each measurement: {'yes' if dropped else 'no (reads may come from the page cache)'}")
    for side, ref, what in (("save", "write", "write+fsync"), ("load", "read", "read")):
        ratio = statistics.median(t[ref] / t[side] for t in rounds)
        print(f"{side}   {median(side):6.2f} s  {gbs(median(side)):5.2f} GB/s | best plain {what:11} "
              f"{median(ref):6.2f} s  {gbs(median(ref)):5.2f} GB/s | ratio {ratio:5.2f} (rounds "
              f"{min(t[ref] / t[side] for t in rounds):.2f}-{max(t[ref] / t[side] for t in rounds):.2f}); "
              f"{median(ref + '_buffered') / median(side):.1f}x the page-cache {what}")
    print("target: ratio >= 0.70")
    if not a.keep:
        shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
