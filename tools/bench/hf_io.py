#!/usr/bin/env python3
"""hf_io — Hugging Face import and export bandwidth of a ~1B-parameter Llama
(issue 17) against a plain sequential read and a plain sequential write +
fsync of the same bytes, on the same file system, in the same run.

Shape (default; about 0.94 B parameters, 1.88 GB of bf16 weights): Llama, 16
layers, hidden 2048, 16 heads, 16 KV heads, FFN 5504, vocab 32000, untied head.

  0. the model directory is made here without transformers: config.json
     (LlamaForCausalLM, torch_dtype bfloat16) and random bf16 weights in
     model-0000K-of-0000N.safetensors files with an index, laid out as
     transformers 4.40's save_pretrained lays them out (the state-dict order
     cut into files of at most --file-size bytes, each file's tensors sorted by
     name as the safetensors library sorts them; default 1 GB: 2 files).
  1. shardlm train, N ranks (default 2, mpirun --oversubscribe), ZeRO stage 3,
     bf16, 1 step of micro batch 1 x seq_len 16, model.from_pretrained DIR,
     checkpoint.dir with export_hf:
       import = the log line "from_pretrained DIR: B weight bytes ... read in
                X s" (hf_source_open + zero_init reading each rank's shards,
                bf16 -> fp32, into the master and parameter buffers);
       export = the log line "Hugging Face export D/hf (bf16, X s)" (every rank
                converting its fp32 master range to bf16 and writing it at its
                offset in the pre-sized file, fsync, rename, config.json). It
                runs right after the 12-bytes-per-parameter HDF5 checkpoint
                save (~11 GB at the default shape), whose time is printed too.
  2. shardlm export CKPT OUT --dtype bf16 under mpirun -np N: its printed
     seconds (which include reading the fp32 master weights, 4 bytes per
     parameter, from the HDF5 checkpoint as well as writing and fsyncing the
     2-byte files).
  3. plain read: the model's .safetensors files, one after the other, in
     16 MiB read() requests (one process); plain write: as many bytes as the
     export's .safetensors files hold, to a new file in 16 MiB write()
     requests, then fsync (one process; the time includes the fsync).

Cache policy, the same on both sides: the page cache is dropped (sync; echo 3
> /proc/sys/vm/drop_caches, when allowed) before each measurement; shardlm and
the plain reference both read and write through the page cache (pread/pwrite
and read/write), reads start cold, writes are timed to the end of their fsync.

Page state: this project's VMs report free pages to the host (virtio_balloon
free page reporting, a few seconds after a page is freed); the first touch of
such a page costs a host fault. A buffered transfer into page-cache pages
taken from that pool runs at ~0.3-0.5 GB/s, CPU-bound in the kernel's copy,
against ~1.4 GB/s into pages freed a moment ago. The trainer's import meets the
first kind (it starts a minute after the drop, once the ranks have touched
their ~20 GB of buffers); its export, with ~1 GB left free, takes those pages
and then reclaims the import's clean page cache.
So each plain transfer is measured in both states, 'settled' (--settle
seconds idle after the drop, default 6) and 'fresh' (right after dropping the
pages the settled run filled), and the faster is the reference (the strict
choice); the ratio to each is printed, as is the same transfer with O_DIRECT
(comparison only; the page cache is not in its path). Prints bytes, seconds
and GB/s (10^9 bytes/s) of each side and the ratios import/plain-read and
export/plain-write; target >= 0.70. Each round measures all of it once; with
--rounds R > 1 (default 3) the medians are printed. The share of the CPUs
other processes took during each round is printed: the import and export are
CPU-bound on a 2-core machine, so a busy neighbour slows them.

Memory: the trainer's memory plan is ~10 GiB per rank at the default shape
(about 23 bytes per parameter over both ranks: fp32 master, Adam m and v, fp32
gradient shard, bf16 parameter shard, unit gradient buffers, fp32 compute
copies); the script refuses to start when MemAvailable is smaller and says
which --layers fits. Disk: about 20 bytes per parameter in --dir (model,
checkpoint, two exports, the plain file). About 2.7 minutes per round on a
2-core machine (~8.5 minutes with the default 3 rounds), most of it the
trainer's start-up.

Usage: tools/bench/hf_io.py [--dir DIR] [--ranks N] [--layers L] [--rounds R] [--settle S] [--keep]
"""
import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ckpt_io import drop_caches, timed_read, timed_write  # noqa: E402  (the plain side, as ckpt_io times it)
from datafiles import write_shard  # noqa: E402  (tools/)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("SHARDLM_BIN") or os.path.join(ROOT, "bin", "shardlm")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")

GEN_CHUNK = 32 << 20      # elements generated and written at a time when making the model
# Bytes per parameter of host memory over all ranks: fp32 master, Adam m and v,
# fp32 gradient shard (16), bf16 parameter shard, unit gradient buffers and fp32
# compute copies; the memory plan prints 10.01 GiB per rank for 0.94 B at N = 2.
BYTES_PER_PARAM_RAM = 23
BYTES_PER_PARAM_DISK = 20  # model 2 + checkpoint 12 + two exports 4 + plain file 2
TARGET = 0.70             # issue 17: import and export at >= 70% of the plain figure
OTHER_CPU_WARN = 0.10     # as train_throughput.py: above this share of the CPUs taken by others, say so


# ---- the model directory -------------------------------------------------------------------

def llama_tensors(a):
    """(name, shape) in LlamaForCausalLM's state-dict order."""
    C, F, V, hd = a.hidden, a.ffn, a.vocab, a.hidden // a.heads
    out = [("model.embed_tokens.weight", (V, C))]
    for i in range(a.layers):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (C, C)), (p + "self_attn.k_proj.weight", (a.kv_heads * hd, C)),
                (p + "self_attn.v_proj.weight", (a.kv_heads * hd, C)), (p + "self_attn.o_proj.weight", (C, C)),
                (p + "mlp.gate_proj.weight", (F, C)), (p + "mlp.up_proj.weight", (F, C)),
                (p + "mlp.down_proj.weight", (C, F)),
                (p + "input_layernorm.weight", (C,)), (p + "post_attention_layernorm.weight", (C,))]
    return out + [("model.norm.weight", (C,)), ("lm_head.weight", (V, C))]


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def write_safetensors(path, tensors, rng):
    """One bf16 .safetensors file: tensors sorted by name (the safetensors
    library's order for one dtype), random values of magnitude 2^-7..2^-6 with
    random signs, norm weights 1.0."""
    tensors = sorted(tensors)
    header, at = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in tensors:
        n = numel(shape) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [at, at + n]}
        at += n
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(len(hb).to_bytes(8, "little") + hb)
        for name, shape in tensors:
            left = numel(shape)
            while left:
                n = min(left, GEN_CHUNK)
                if name.endswith("norm.weight"):
                    bits = np.full(n, 0x3F80, dtype="<u2")  # 1.0
                else:
                    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
                    bits &= 0x807F  # sign and mantissa
                    bits |= 0x3C00  # exponent 120: |x| in [2^-7, 2^-6)
                f.write(bits.tobytes())
                left -= n
        f.flush()
        os.fsync(f.fileno())
    return at


def make_model(d, a):
    """config.json and the weight files as save_pretrained(max_shard_size=a.file_size) cuts them."""
    os.makedirs(d)
    files, size = [[]], 0
    for name, shape in llama_tensors(a):
        n = numel(shape) * 2
        if files[-1] and size + n > a.file_size:
            files.append([])
            size = 0
        files[-1].append((name, shape))
        size += n
    rng = np.random.default_rng(1)
    weight_map, total = {}, 0
    for k, ts in enumerate(files):
        fname = "model.safetensors" if len(files) == 1 else f"model-{k + 1:05d}-of-{len(files):05d}.safetensors"
        total += write_safetensors(os.path.join(d, fname), ts, rng)
        weight_map.update({name: fname for name, _ in ts})
    if len(files) > 1:
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": a.hidden,
           "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
           "intermediate_size": a.ffn, "vocab_size": a.vocab, "max_position_embeddings": 2048,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
           "attention_bias": False, "torch_dtype": "bfloat16"}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return total, len(files)


def weight_files(d):
    return [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(".safetensors")]


# ---- shardlm --------------------------------------------------------------------------------

def run(cmd, what):
    t0 = time.time()
    r = subprocess.run(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1800)
    out = r.stdout.decode(errors="replace")
    if r.returncode != 0:
        sys.exit(f"hf_io: {what}: {' '.join(cmd)} failed ({r.returncode}):\n{out[-3000:]}")
    return out, time.time() - t0


def grab(pattern, out, what):
    m = re.search(pattern, out)
    if not m:
        sys.exit(f"hf_io: no '{what}' line in:\n{out[-2000:]}")
    return m


def train_config(a, model, data, ck):
    return {
        "model": {"from_pretrained": model},
        "data": {"train": data, "seq_len": 16, "shuffle": False},
        "train": {"steps": 1, "seed": 1, "eval_every": 0, "sample_tokens": 0},
        "train_batch_size": a.ranks,
        "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "weight_decay": 0.0}},
        "zero_optimization": {"stage": 3},
        "checkpoint": {"dir": ck, "every": 0, "keep": 1, "export_hf": True},
    }


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def plain_side(a, t, files, plain_path, nbytes):
    """The plain transfers, each in two page states (module docstring): after
    the drop and --settle idle seconds, then right after a drop of the pages
    the first one just filled; and with O_DIRECT."""
    drop_caches(a.settle)
    t["read_settled"] = timed_read(files, direct=False)
    drop_caches(0)
    t["read_fresh"] = timed_read(files, direct=False)
    drop_caches(a.settle)
    t["read_direct"] = timed_read(files, direct=True)
    drop_caches(a.settle)
    t["write_settled"] = timed_write(plain_path, nbytes, direct=False)
    drop_caches(0)
    os.unlink(plain_path)
    t["write_fresh"] = timed_write(plain_path, nbytes, direct=False)
    os.unlink(plain_path)
    drop_caches(a.settle)
    t["write_direct"] = timed_write(plain_path, nbytes, direct=True)
    os.unlink(plain_path)


def cpu_busy_seconds():
    """Busy CPU seconds of the whole machine so far (/proc/stat: user nice system irq softirq steal)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds():
    """CPU seconds of this process and its finished children (mpirun, the ranks)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def one_round(a, model, cfg_path, ck, model_bytes):
    """Every measurement once; also the share of the CPUs that other processes
    (and kernel threads: writeback, reclaim) took meanwhile."""
    t = {}
    busy0, own0, wall0 = cpu_busy_seconds(), own_cpu_seconds(), time.monotonic()
    files = weight_files(model)
    t["file_bytes"] = sum(os.path.getsize(p) for p in files)
    shutil.rmtree(ck, ignore_errors=True)
    t["dropped"] = drop_caches(a.settle)
    out, t["train_wall"] = run(["mpirun", "-np", str(a.ranks), "--oversubscribe", BIN, "train", cfg_path, "--quiet"],
                               "train")
    m = grab(r"from_pretrained \S+: (\d+) weight bytes in (\d+) files? read in ([\d.]+) s; bytes read per rank: "
             r"([\d ]+)", out, "from_pretrained ... read in X s")
    t["import"], t["import_bytes"] = float(m.group(3)), int(m.group(1))
    t["import_per_rank"] = m.group(4).strip()
    if t["import_bytes"] != model_bytes:
        sys.exit(f"hf_io: the trainer read {t['import_bytes']} weight bytes; the model holds {model_bytes}")
    t["ckpt_save"] = float(grab(r"checkpoint \S+ \(([\d.]+) s\)", out, "checkpoint PATH (X s)").group(1))
    t["export"] = float(grab(r"Hugging Face export \S+ \(bf16, ([\d.]+) s\)", out,
                             "Hugging Face export D/hf (bf16, X s)").group(1))
    hf = os.path.join(ck, "hf")
    t["export_bytes"] = sum(os.path.getsize(p) for p in weight_files(hf))
    t["export_files"] = len(weight_files(hf))
    shutil.rmtree(hf, ignore_errors=True)

    cli = os.path.join(a.dir, "cli_export")
    shutil.rmtree(cli, ignore_errors=True)
    drop_caches(a.settle)
    cmd = ["mpirun", "-np", str(a.ranks), "--oversubscribe", BIN, "export", ck, cli, "--dtype", "bf16"]
    out, _ = run(cmd, "export")
    m = grab(r"exported .*, ([\d.]+) s; bytes written per rank: ([\d ]+)", out, "exported ... X s")
    t["cli_export"], t["cli_per_rank"] = float(m.group(1)), m.group(2).strip()
    t["cli_bytes"] = sum(os.path.getsize(p) for p in weight_files(cli))
    shutil.rmtree(cli, ignore_errors=True)
    shutil.rmtree(ck, ignore_errors=True)

    plain_side(a, t, files, os.path.join(a.dir, "plain.bin"), t["export_bytes"])
    t["read"] = min(t["read_settled"], t["read_fresh"])
    t["write"] = min(t["write_settled"], t["write_fresh"])
    wall = time.monotonic() - wall0
    t["other_cpu"] = max(0.0, cpu_busy_seconds() - busy0 - (own_cpu_seconds() - own0)) / (wall * (os.cpu_count() or 1))
    return t


def gbs(nbytes, s):
    return nbytes / s / 1e9 if s > 0 else float("inf")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def disk_of(path):
    try:
        dev = os.stat(path).st_dev
        with open("/proc/self/mountinfo") as f:
            for line in f:
                parts = line.split()
                major, minor = parts[2].split(":")
                if os.makedev(int(major), int(minor)) == dev:
                    sep = parts.index("-")
                    return f"{parts[sep + 2]} ({parts[sep + 1]}, mounted at {parts[4]})"
    except (OSError, ValueError, IndexError):
        pass
    return "unknown device"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/tmp/shardlm-hf-io", help="scratch directory (removed first)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=16)
    ap.add_argument("--ffn", type=int, default=5504)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--file-size", type=float, default=1e9,
                    help="bytes per .safetensors file of the model made (save_pretrained's max_shard_size)")
    ap.add_argument("--settle", type=float, default=6.0,
                    help="idle seconds after dropping the page cache, before each measurement")
    ap.add_argument("--rounds", type=int, default=3, help="measure everything this many times; medians")
    ap.add_argument("--keep", action="store_true", help="keep DIR afterwards")
    ap.add_argument("--check-only", action="store_true", help="check the arguments and the machine, then exit")
    a = ap.parse_args()
    a.file_size = int(a.file_size)
    if a.rounds < 1 or a.ranks < 1 or a.layers < 1 or a.settle < 0:
        sys.exit("hf_io: --rounds, --ranks and --layers must be >= 1 and --settle >= 0")

    n_params = sum(numel(s) for _, s in llama_tensors(a))
    need_ram = n_params * BYTES_PER_PARAM_RAM
    if need_ram > mem_available():
        per_layer = n_params - 2 * a.vocab * a.hidden
        per_layer //= a.layers
        fit = max(1, int((mem_available() * 0.9 / BYTES_PER_PARAM_RAM - 2 * a.vocab * a.hidden) // per_layer))
        sys.exit(f"hf_io: {n_params / 1e9:.2f} B parameters need ~{need_ram / 2**30:.1f} GiB across the ranks; "
                 f"{mem_available() / 2**30:.1f} GiB is available: pass --layers {fit} (or fewer)")
    parent = os.path.dirname(os.path.abspath(a.dir)) or "/"
    free = shutil.disk_usage(parent).free
    if n_params * BYTES_PER_PARAM_DISK > free:
        sys.exit(f"hf_io: {a.dir} needs ~{n_params * BYTES_PER_PARAM_DISK / 1e9:.0f} GB free; {parent} has "
                 f"{free / 1e9:.0f} GB: pass --dir on a larger file system or fewer --layers")
    if not os.access(BIN, os.X_OK):
        sys.exit(f"hf_io: {BIN} missing; run make all (or tools/bench/hf_io.sh, which builds it)")
    if a.check_only:
        return

    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    model, ck = os.path.join(a.dir, "model"), os.path.join(a.dir, "ck")
    t0 = time.time()
    model_bytes, n_files = make_model(model, a)
    print(f"model: Llama {a.layers} layers, hidden {a.hidden}, {a.heads} heads / {a.kv_heads} KV heads, FFN {a.ffn}, "
          f"vocab {a.vocab}: {n_params} parameters, {model_bytes} bf16 weight bytes in {n_files} file"
          f"{'s' if n_files > 1 else ''} (made in {time.time() - t0:.0f} s)", flush=True)
    data = os.path.join(a.dir, "train.bin")
    write_shard(data, np.random.default_rng(2).integers(0, a.vocab, 16 * a.ranks * 4 + 1))
    cfg_path = os.path.join(a.dir, "llama_1b.json")
    with open(cfg_path, "w") as f:
        json.dump(train_config(a, model, data, ck), f, indent=1)

    rounds = []
    for r in range(a.rounds):
        t = one_round(a, model, cfg_path, ck, model_bytes)
        rounds.append(t)
        print(f"round {r + 1}: import {t['import']:.2f} s (bytes per rank {t['import_per_rank']}); export "
              f"{t['export']:.2f} s in training, {t['cli_export']:.2f} s shardlm export; checkpoint save "
              f"{t['ckpt_save']:.2f} s; train run {t['train_wall']:.0f} s wall | plain read {t['read_settled']:.2f} s "
              f"settled, {t['read_fresh']:.2f} s fresh, {t['read_direct']:.2f} s O_DIRECT; plain write+fsync "
              f"{t['write_settled']:.2f} s settled, {t['write_fresh']:.2f} s fresh, {t['write_direct']:.2f} s "
              f"O_DIRECT; other processes {100 * t['other_cpu']:.0f}% of the CPUs", flush=True)

    def med(key):
        return statistics.median(t[key] for t in rounds)

    t = rounds[-1]
    print()
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; disk: {disk_of(a.dir)}; N = {a.ranks} ranks; "
          f"{a.rounds} round{'s' if a.rounds > 1 else ''}{' (medians)' if a.rounds > 1 else ''}")
    print(f"cache policy: page cache {'dropped' if t['dropped'] else 'NOT dropped (no permission)'} before each "
          f"measurement; shardlm and the plain reference both read and write through the page cache, reads start "
          f"cold, writes are timed to the end of fsync. Plain figures in two page states: 'settled' ({a.settle:g} s "
          f"idle after the drop) and 'fresh' (right after the drop); the reference is the faster. O_DIRECT for "
          f"comparison only.")
    sides = [
        ("import: model.from_pretrained (trainer log)", t["import_bytes"], med("import"), "read", t["file_bytes"]),
        ("export: checkpoint.export_hf (trainer log)", t["export_bytes"], med("export"), "write", t["export_bytes"]),
        ("export: shardlm export CKPT (its print; includes reading the fp32 master)", t["cli_bytes"],
         med("cli_export"), "write", t["export_bytes"]),
    ]
    for name, b, sec, ref, rb in sides:
        rate = gbs(b, sec)
        print(f"{name}: {b} B in {sec:.2f} s = {rate:.3f} GB/s")
        what = "read" if ref == "read" else "write+fsync"
        for state, label in (("settled", "page cache, settled"), ("fresh", "page cache, fresh pages"),
                             ("direct", "O_DIRECT (comparison only)")):
            rs = med(f"{ref}_{state}")
            print(f"    plain {what:11} {label:27} {rb} B in {rs:6.2f} s = {gbs(rb, rs):.3f} GB/s; ratio "
                  f"{rate / gbs(rb, rs):.2f}")
        ratio = rate / gbs(rb, med(ref))
        print(f"    => ratio to the plain {what} (faster page-cache figure): {ratio:.2f} "
              f"{'(target met)' if ratio >= TARGET else f'BELOW the {TARGET:.2f} target'}")
    print(f"HDF5 checkpoint save (12 bytes per parameter, {n_params * 12 / 1e9:.1f} GB, O_DIRECT): "
          f"{med('ckpt_save'):.2f} s = {gbs(n_params * 12, med('ckpt_save')):.3f} GB/s")
    print(f"target: import and export >= {TARGET:.2f} of the plain figure")
    busiest = max(t["other_cpu"] for t in rounds)
    if busiest > OTHER_CPU_WARN:
        print(f"warning: other processes took up to {100 * busiest:.0f}% of the CPUs during a round; shardlm's "
              f"import and export are CPU-bound here, so those figures are contended: rerun on a quiet machine")
    if not a.keep:
        shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
