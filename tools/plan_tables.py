#!/usr/bin/env python3
"""The planner tables of docs/memory.md and docs/methods.md, produced by `shardlm plan --json`.

    python3 tools/plan_tables.py [--bin bin/shardlm]

Prints three Markdown tables: model states per GPU of a 7.5 B-parameter model on
64 GPUs at ZeRO stages 0-3 beside the ZeRO paper's figures, the Llama-2-70B
ladder on one node of 8 x 80 GB GPUs at sequence length 4096, and Llama-2-70B
LoRA (r 16, all seven linear layers of every block, bf16 base) on 8 x 80 GB
and on 2 x 24 GB (base and optimizer offloaded) at sequence lengths 2048 and
4096, and long sequences: Llama-2-70B and Llama-3-8B on 8 x 80 GB (2 TB of
host memory per node, bf16, ZeRO stage 3) at 4K to 32K tokens with the
settings `--fit` picks, and the Llama-2-70B fine-tune config on one 8 x 80 GB
node with CPU offload beside offload to NVMe (issue 36): the optimizer state,
then the parameters too, with the disk bytes and the optimizer phase at 6 and
25 GB/s of node disk bandwidth (under NVMe offload the fp32 gradient shard
is in device memory). Every number comes from the command each row shows.
"""
import argparse
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GB = 1e9

PAPER_SHAPE = ["--set", "model.n_layer=36", "--set", "model.n_embd=4096", "--set", "model.n_head=32",
               "--set", "model.n_positions=2048", "--set", "fp16.enabled=true", "--ranks", "64"]
PAPER_GB = {0: 120, 1: 31.4, 2: 16.6, 3: 1.9}

L70 = ["--preset", "llama2-70b", "--ranks", "8", "--gpu-mem", "80GB"]
CKPT = ["--set", "activation_checkpointing.enabled=true"]
OFF_OPT = ["--set", "zero_optimization.offload_optimizer.device=cpu"]
OFF_PARAM = ["--set", "zero_optimization.offload_param.device=cpu"]
CPU_CKPT = ["--set", "activation_checkpointing.cpu_checkpointing=true"]
FP16 = ["--set", "fp16.enabled=true"]
LADDER = [
    ("fp32, stage 0 (baseline)", []),
    ("fp16 + stage 2", FP16 + ["--set", "zero_optimization.stage=2"]),
    ("fp16 + stage 3", FP16 + ["--set", "zero_optimization.stage=3"]),
    ("+ activation checkpointing (every block)", FP16 + ["--set", "zero_optimization.stage=3"] + CKPT),
    ("+ optimizer offload", FP16 + ["--set", "zero_optimization.stage=3"] + CKPT + OFF_OPT),
    ("+ parameter offload", FP16 + ["--set", "zero_optimization.stage=3"] + CKPT + OFF_OPT + OFF_PARAM),
    ("+ cpu_checkpointing", FP16 + ["--set", "zero_optimization.stage=3"] + CKPT + OFF_OPT + OFF_PARAM + CPU_CKPT),
]


def plan(binary, args):
    r = subprocess.run([binary, "plan", *args, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if r.returncode not in (0, 4):
        raise SystemExit(f"shardlm plan {' '.join(args)}: exit {r.returncode}: {r.stderr.decode()}")
    return json.loads(r.stdout.decode().strip().splitlines()[-1])


def short(args):
    return " ".join(a.replace("zero_optimization.", "").replace("activation_checkpointing.", "ckpt.")
                    for a in args if a != "--set")


def paper_table(binary):
    print("| stage | ZeRO paper | shardlm model states | parameters | gradients (fp16 + fp32 accumulators) "
          "| master + Adam m, v | device total (micro-batch 1 x 2048) |")
    print("|---|---|---|---|---|---|---|")
    for stage in range(4):
        j = plan(binary, PAPER_SHAPE + ["--set", f"zero_optimization.stage={stage}"])
        m = j["memory"]
        grads = m["gradient shard"]["bytes"] + m["fp32 gradient shard"]["bytes"]
        opt = m["fp32 master weights"]["bytes"] + m["Adam m"]["bytes"] + m["Adam v"]["bytes"]
        print(f"| {stage} | {PAPER_GB[stage]} GB | **{j['model_states'] / GB:.1f} GB** | "
              f"{m['parameter shard']['bytes'] / GB:.2f} GB | {grads / GB:.2f} GB | {opt / GB:.2f} GB | "
              f"{j['space_total']['device'] / GB:.1f} GB |")
    print(f"\n({j['n_params'] / 1e9:.2f} B parameters.)")


def ladder_table(binary):
    print("| rung | device per GPU | pinned host per GPU | host per node (8 GPUs) | fits 80 GB |")
    print("|---|---|---|---|---|")
    for label, args in LADDER:
        j = plan(binary, L70 + args)
        host = j["space_total"]["pinned host"] + j["space_total"]["host"]
        print(f"| {label} | {j['space_total']['device'] / GB:.1f} GB | {host / GB:.1f} GB | "
              f"{j['host_per_node'] / GB:.0f} GB | {'yes' if j['fits'] else 'no'} |")


LORA = ["--preset", "llama2-70b", "--set", "bf16.enabled=true", "--set", "zero_optimization.stage=3",
        "--set", "lora.r=16", "--set", "lora.alpha=32",
        "--set", 'lora.target_modules=["q_proj","k_proj","v_proj","o_proj","gate_proj","up_proj","down_proj"]'] + CKPT
LORA_ROWS = [
    ("8 x 80 GB", ["--ranks", "8", "--gpu-mem", "80GB"]),
    ("2 x 24 GB, base + optimizer offloaded", ["--ranks", "2", "--gpu-mem", "24GB"] + OFF_OPT + OFF_PARAM),
    ("2 x 24 GB, + cpu_checkpointing", ["--ranks", "2", "--gpu-mem", "24GB"] + OFF_OPT + OFF_PARAM + CPU_CKPT),
]


def lora_table(binary):
    print("| GPUs | sequence | device per GPU | of which model states | pinned host per GPU | host per node "
          "| fits |")
    print("|---|---|---|---|---|---|---|")
    for label, args in LORA_ROWS:
        for seq in (2048, 4096):
            j = plan(binary, LORA + args + ["--set", f"data.seq_len={seq}"])
            host = j["space_total"]["pinned host"] + j["space_total"]["host"]
            m = j["memory"]
            states = sum(m[k]["bytes"] for k in ("parameter shard", "gradient shard", "fp32 gradient shard",
                                                 "fp32 master weights", "Adam m", "Adam v")
                         if m[k]["space"] == "device")
            print(f"| {label} | {seq} | {j['space_total']['device'] / GB:.1f} GB | {states / GB:.2f} GB | "
                  f"{host / GB:.1f} GB | {j['host_per_node'] / GB:.0f} GB | {'yes' if j['fits'] else 'no'} |")


LONG_MODELS = [("Llama-2-70B", ["--preset", "llama2-70b"]), ("Llama-3-8B", ["--preset", "llama3-8b"])]
LONG = ["--ranks", "8", "--gpu-mem", "80GB", "--host-mem", "2TB", "--set", "bf16.enabled=true",
        "--set", "zero_optimization.stage=3", "--set", "model.n_positions=32768", "--fit"]


def long_table(binary):
    print("| model | sequence | micro-batch | checkpointing | offload | device per GPU | of which activations "
          "and logits | host per node |")
    print("|---|---|---|---|---|---|---|---|")
    for name, model in LONG_MODELS:
        for seq in (4096, 8192, 16384, 32768):
            args = model + LONG + ["--set", f"data.seq_len={seq}"]
            r = subprocess.run([binary, "plan", *args, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
            if r.returncode not in (0, 4):
                raise SystemExit(f"shardlm plan {' '.join(args)}: exit {r.returncode}: {r.stderr}")
            keys = dict(line.strip()[len("--set "):].split("=", 1) for line in r.stdout.splitlines()
                        if line.strip().startswith("--set "))
            j = json.loads(r.stdout.strip().splitlines()[-1])
            m = j["memory"]
            acts = sum(m[k]["bytes"] for k in ("activation checkpoints", "block activations",
                                               "logits and loss") if m[k]["space"] == "device")
            if "fit: nothing fits" in r.stdout:
                print(f"| {name} | {seq} | - | - | - | does not fit | | |")
                continue
            ckpt = (f"every {keys['activation_checkpointing.interval']}"
                    + (" to host" if keys.get("activation_checkpointing.cpu_checkpointing") == "true" else "")
                    if keys.get("activation_checkpointing.enabled") == "true" else "off")
            off = [w for w, k in (("optimizer", "zero_optimization.offload_optimizer.device"),
                                  ("parameters", "zero_optimization.offload_param.device")) if keys.get(k) == "cpu"]
            print(f"| {name} | {seq} | {keys['train_micro_batch_size_per_gpu']} | {ckpt} | "
                  f"{', '.join(off) or 'none'} | {j['space_total']['device'] / GB:.1f} GB | {acts / GB:.1f} GB | "
                  f"{j['host_per_node'] / GB:.0f} GB |")


CFG70 = os.path.join(ROOT, "input", "llama2_70b_finetune.json")
NVME_BASE = ["--ranks", "8", "--gpu-mem", "80GB"]
NVME_OPT = ["--set", "zero_optimization.offload_optimizer.device=nvme",
            "--set", "zero_optimization.offload_optimizer.nvme_path=/nvme"]
NVME_PARAM = ["--set", "zero_optimization.offload_param.device=nvme",
              "--set", "zero_optimization.offload_param.nvme_path=/nvme",
              "--set", "zero_optimization.offload_param.buffer_size=106956800"]
NVME_ROWS = [("CPU offload (the config as it is)", [], None),
             ("optimizer on NVMe", NVME_OPT, 256),
             ("optimizer + parameters on NVMe", NVME_OPT + NVME_PARAM, 128)]


def nvme_table(binary):
    """Llama-2-70B on one 8 x 80 GB node: CPU offload beside offload to NVMe (the fp32 gradient shard in device
    memory under NVMe, pinned host memory under CPU offload)."""
    print("| plan | device per GPU | host per node | NVMe files per node | read + written per step, per node "
          "| optimizer phase at 6 GB/s | at 25 GB/s | parameter reads per step at 6 / 25 GB/s | host target |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, args, target in NVME_ROWS:
        j = {bw: plan(binary, [CFG70] + NVME_BASE + args + ["--nvme-bw", bw]) for bw in ("6GB/s", "25GB/s")}
        a, b = j["6GB/s"], j["25GB/s"]
        nv = a["nvme"]
        per_node = 8
        moved = (nv["read_per_step"] + nv["written_per_step"]) * per_node
        host, dev = a["host_per_node"], a["space_total"]["device"]
        fits = f"{dev / GB:.1f} GB ({'fits' if a['fits'] else 'does not fit'} 80 GB)"
        verdict = "" if target is None else f"<= {target} GB: **{'yes' if host <= target * GB else 'no'}**"
        if nv["disk_per_node"]:
            reads = (f"{a['nvme']['param_read_seconds']:.0f} s / {b['nvme']['param_read_seconds']:.0f} s"
                     if nv["param_file"] else "-")
            print(f"| {label} | {fits} | {host / GB:.1f} GB | {nv['disk_per_node'] / GB:.0f} GB | "
                  f"{moved / 1e12:.2f} TB | {nv['optimizer_seconds']:.0f} s | {b['nvme']['optimizer_seconds']:.0f} s | "
                  f"{reads} | {verdict} |")
        else:
            print(f"| {label} | {fits} | {host / GB:.1f} GB | - | - | - (AdamW on the host) | - | - | |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "bin", "shardlm"))
    a = ap.parse_args()
    paper_table(a.bin)
    print()
    ladder_table(a.bin)
    print()
    lora_table(a.bin)
    print()
    long_table(a.bin)
    print()
    nvme_table(a.bin)


if __name__ == "__main__":
    main()
