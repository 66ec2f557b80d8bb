#!/usr/bin/env python3
"""ckpt_io — checkpoint save and load bandwidth of a GPT-2 124M-sized training
state (fp32 master weights + Adam m and v, ~1.5 GB) against a plain sequential
write and read of the same number of bytes on the same file system, in the same
run.

  1. shardlm train, 1 step, GPT-2 124M shape (12 layers, 12 heads, C=768, context
     1024, vocab 50257), micro batch 1, seq_len 64, N ranks (default 2), ZeRO
     stage 3: the save time is the log line "checkpoint PATH (X s)" (the whole
     ckpt_save: HDF5 collective writes, flush, fsync, rename, latest).
  2. page cache dropped (echo 3 > /proc/sys/vm/drop_caches, when allowed), then
     shardlm train --resume auto with train.steps 1: the load time is the log
     line "resumed from ... (X s)" (open, attribute checks, every rank reading
     its shards with Fletcher32 verification).
  3. plain write of the checkpoint's size in 64 MiB blocks + fsync (Python,
     one process), then cache dropped again and a plain read of it back.
Prints bytes/s of each and the ratios save/plain-write and load/plain-read
(target >= 0.70). Whether the cache could be dropped is printed: if not, both
reads come from the page cache.

Usage: tools/bench/ckpt_io.py [--dir DIR] [--ranks N] [--keep]
DIR (default /tmp/shardlm-ckpt-io) must have ~3.5 GB free.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("SHARDLM_BIN") or os.path.join(ROOT, "bin", "shardlm")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/shardlm-ckpt-io")
    ap.add_argument("--ranks", type=int, default=2)
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

    out = shardlm(cfg_path, a.ranks, "--quiet")
    m = re.search(r"checkpoint (\S+) \(([\d.]+) s\)", out)
    if not m:
        sys.exit("ckpt_io: no 'checkpoint PATH (X s)' line in:\n" + out[-2000:])
    path, save_s = m.group(1), float(m.group(2))
    nbytes = os.path.getsize(path)

    dropped = drop_caches()
    out = shardlm(cfg_path, a.ranks, "--quiet", "--resume", "auto")
    m = re.search(r"resumed from \S+ at step \d+ .*\(([\d.]+) s\)", out)
    if not m:
        sys.exit("ckpt_io: no 'resumed from ... (X s)' line in:\n" + out[-2000:])
    load_s = float(m.group(1))

    plain = os.path.join(a.dir, "plain.bin")
    block = os.urandom(64 << 20)
    t0 = time.time()
    with open(plain, "wb") as f:
        left = nbytes
        while left > 0:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n
        f.flush()
        os.fsync(f.fileno())
    write_s = time.time() - t0
    drop_caches()
    t0 = time.time()
    with open(plain, "rb", buffering=0) as f:
        while f.read(64 << 20):
            pass
    read_s = time.time() - t0

    def gbs(s):
        return nbytes / s / 1e9 if s > 0 else float("inf")

    print(f"checkpoint {path}: {nbytes} bytes, {a.ranks} ranks; page cache dropped before reads: "
          f"{'yes' if dropped else 'no (reads may come from the page cache)'}")
    print(f"save   {save_s:8.2f} s  {gbs(save_s):6.2f} GB/s | plain write+fsync {write_s:8.2f} s  "
          f"{gbs(write_s):6.2f} GB/s | ratio {write_s / save_s:5.2f}")
    print(f"load   {load_s:8.2f} s  {gbs(load_s):6.2f} GB/s | plain read        {read_s:8.2f} s  "
          f"{gbs(read_s):6.2f} GB/s | ratio {read_s / load_s:5.2f}")
    print("target: ratio >= 0.70")
    if not a.keep:
        shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
