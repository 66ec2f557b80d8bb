#!/usr/bin/env python3
"""t_dpo_torch — the DPO pair losses of src/engine/dpo.c (through build/tests/dpo_tool)
against PyTorch autograd over TRL's formulas (trl DPOTrainer.dpo_loss):
z = (pi_c - pi_r) - (ref_c - ref_r); "sigmoid": -(1 - e) logsigmoid(beta z) -
e logsigmoid(-beta z) (cDPO when e > 0); "ipo": (z - 1/(2 beta))^2; rewards
beta (pi - ref), detached. float64 throughout, so the tolerance is tight.

Checks: torch.{sigmoid,cdpo,ipo}.{loss,d_chosen,d_rejected,rewards} over random
pairs (small and large margins, both signs).
"""
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, check, run_main  # noqa: E402

TOOL = os.path.join(ROOT, os.environ.get("BUILD", "build"), "tests", "dpo_tool")
CASES = [("sigmoid", 0.1, 0.0), ("sigmoid", 0.5, 0.0), ("cdpo", 0.1, 0.25), ("cdpo", 2.0, 0.1), ("ipo", 0.1, 0.0),
         ("ipo", 0.7, 0.0)]


def torch_loss(kind, beta, eps, logps):
    """TRL's dpo_loss on one pair; returns (loss, d pi_c, d pi_r, reward_c, reward_r)."""
    pi = logps[:2].clone().requires_grad_(True)
    ref = logps[2:]
    logits = (pi[0] - pi[1]) - (ref[0] - ref[1])
    if kind == "ipo":
        loss = (logits - 1 / (2 * beta)) ** 2
    else:
        loss = -F.logsigmoid(beta * logits) * (1 - eps) - F.logsigmoid(-beta * logits) * eps
    loss.backward()
    rewards = beta * (pi - ref).detach()
    return loss.item(), pi.grad[0].item(), pi.grad[1].item(), rewards[0].item(), rewards[1].item()


def main():
    gen = torch.Generator().manual_seed(37)
    pairs = []
    for scale in (0.5, 5.0, 60.0):
        for _ in range(4):
            ref = -torch.rand(2, generator=gen, dtype=torch.float64) * 100
            pi = ref + torch.randn(2, generator=gen, dtype=torch.float64) * scale
            pairs.append(torch.cat([pi, ref]))
    lines, want = [], []
    for kind, beta, eps in CASES:
        for logps in pairs:
            lines.append(f"{beta!r} {'ipo' if kind == 'ipo' else 'sigmoid'} {eps!r} "
                         + " ".join(repr(v) for v in logps.tolist()))
            want.append((kind, beta, torch_loss(kind, beta, eps, logps)))
    proc = subprocess.run([TOOL, "-"], input="\n".join(lines) + "\n", capture_output=True, text=True)
    check("tool.exit", proc.returncode == 0, f"{proc.returncode}: {proc.stderr}")
    got = [list(map(float, line.split())) for line in proc.stdout.splitlines()]
    check("tool.lines", len(got) == len(want), f"{len(got)} lines for {len(want)} pairs")
    worst = {}
    for (kind, beta, ref_values), values in zip(want, got):
        scale = max(1.0, abs(ref_values[0]))
        for k, name in enumerate(("loss", "d_chosen", "d_rejected", "rewards", "rewards")):
            err = abs(values[k] - ref_values[k]) / max(1e-3, abs(ref_values[k]) if k else scale)
            worst[(kind, name)] = max(worst.get((kind, name), 0.0), err)
    for (kind, name), err in sorted(worst.items()):
        check(f"torch.{kind}.{name}", err <= 1e-12, f"relative error {err:.3g}")


if __name__ == "__main__":
    run_main("dpo_torch", main)
