#!/usr/bin/env python3
"""t_run_default — the default job of `make run` (tools/run_default.sh), with
fewer steps (150 of pre-training, 30 of each fine-tune), into a scratch
directory, and what it prints and leaves behind. Runs in build/ref-venv
(transformers 4.40.2, PEFT 0.10.0; the script re-executes itself there).

Checks:
  run.exit            exit status 0, the six sections in order
  run.plan            each of the three trainings prints the memory plan, and
                      its metrics' memory table has every class's peak equal
                      to the plan
  run.loss.*          the pre-training's and the fine-tune's losses fall (the
                      mean of the last 10 steps at least 0.5 below the first
                      10's); the fine-tune's log lines show padding
  run.sent            the bytes sent per step printed in the fine-tune's log
                      are the metrics' all-gather + reduce-scatter bytes
  run.eval.*          three eval lines (base, fine-tune, LoRA) on the 8
                      held-back pairs; both fine-tunes' losses below the
                      base's; the fine-tune's equals its last validation loss
  run.answers         both held-back questions, each with the reference's, the
                      base's and the fine-tune's answers
  run.hf.*            the exported fine-tune loads in transformers
                      (LlamaForCausalLM) and its loss on the held-back samples
                      is eval's (1e-4); the LoRA adapter directory loads in
                      PEFT over the base and gives the LoRA eval's loss
  run.plots           the three PNGs, real PNGs of more than 5 KB, and the
                      paths printed
  run.bad_env         a step count that is not a positive integer: one line,
                      exit status 2
  run.bad_tool.*      tools/default_job.py: a page without the configuration
                      table, a vocabulary under 300, answers that are not JSON
                      lines: one line, exit status 2
"""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import use_ref_venv  # noqa: E402

use_ref_venv("peft", "run.env")

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from peft import PeftModel  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

from harness import ENV, ROOT, check, note, run_main, scratch_dir  # noqa: E402

TMP = scratch_dir("t_run_default")
OUT = os.path.join(TMP, "run")
PRETRAIN_STEPS, FINETUNE_STEPS = 150, 30  # 60 left LoRA 0.05 below the base: an edit of the pages could flip it
MAX_SEQ = 128  # input/run_finetune.json's data.max_seq_length: longer samples are cut to it
SECTIONS = 6
HF_TOLERANCE = 1e-4  # relative, fp32 on both sides (t_generate measures ~1e-7)
MIN_PNG_BYTES = 5000


def run_job(extra_env):
    env = dict(ENV, SHARDLM_RUN_DIR=OUT, **extra_env)
    for key in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.pop(key, None)  # the script sets them from the cores and ranks, as make run does
    return subprocess.run(["bash", os.path.join(ROOT, "tools", "run_default.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True)


def read_metrics(name):
    with open(os.path.join(OUT, name, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def losses(rows):
    return [r["loss"] for r in rows if "loss" in r]


def eval_losses(log):
    """{model dir's last name: loss} from the eval lines."""
    found = {}
    for m in re.finditer(r"^eval (\S+) on \S+: loss ([0-9.]+) \| perplexity [0-9.]+ \| (\d+) tokens in (\d+) "
                         r"sequences$", log, re.M):
        found[os.path.basename(m.group(1))] = (float(m.group(2)), int(m.group(3)), int(m.group(4)))
    return found


def held_samples():
    """[(ids, trained)] of the held-back sample file, cut to the fine-tune's max_seq_length."""
    with h5py.File(os.path.join(OUT, "data", "held.h5"), "r") as f:
        tokens, trained, offsets = f["tokens"][:], f["trained"][:], f["offsets"][:]
    return [(tokens[a:b][:MAX_SEQ], trained[a:b][:MAX_SEQ]) for a, b in zip(offsets[:-1], offsets[1:])]


def hf_loss(model, samples):
    """The mean cross-entropy over every trained target, as shardlm eval sums it."""
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, trained in samples:
            logits = model(torch.tensor(ids[None, :], dtype=torch.long)).logits[0].double()
            logp = torch.log_softmax(logits[:-1], dim=-1)
            targets = torch.tensor(ids[1:], dtype=torch.long)
            nll = -logp.gather(1, targets[:, None])[:, 0]
            mask = torch.tensor(trained[1:] == 1)
            total += float(nll[mask].sum())
            count += int(mask.sum())
    return total / count, count


def check_trainings(log):
    check("run.plan", log.count("memory plan per rank:") == 3, f"{log.count('memory plan per rank:')} plans")
    for name in ("pretrain", "finetune", "lora"):
        rows = read_metrics(name)
        memory = [r["memory"] for r in rows if "memory" in r]
        unequal = [k for k, v in memory[-1].items() if v["planned"] != v["peak"]] if memory else ["no table"]
        check(f"run.plan.{name}_peak", not unequal, f"classes whose peak is not the plan: {unequal}")
    for name, steps in (("pretrain", PRETRAIN_STEPS), ("finetune", FINETUNE_STEPS)):
        loss = losses(read_metrics(name))
        first, last = np.mean(loss[:10]), np.mean(loss[-10:])
        note(f"{name}: {len(loss)} steps, loss {first:.3f} (first 10) -> {last:.3f} (last 10)")
        check(f"run.loss.{name}", len(loss) == steps and last < first - 0.5, f"{len(loss)} steps, {first} -> {last}")
    ft_lines = re.findall(r"^step +\d+/%d \| .*$" % FINETUNE_STEPS, log, re.M)
    check("run.loss.padding", len(ft_lines) >= 2 and all(re.search(r"\| padding \d+\.\d%", s) for s in ft_lines),
          f"{ft_lines[:2]}")
    rows = [r for r in read_metrics("finetune") if "loss" in r]
    sent = re.search(r"^step +%d/%d \|.* \| sent ([0-9.]+) MiB$" % (FINETUNE_STEPS, FINETUNE_STEPS), log, re.M)
    total = rows[-1]["bytes_allgather"] + rows[-1]["bytes_reduce_scatter"] + rows[-1]["bytes_allreduce"]
    check("run.sent", sent is not None and total > 0 and f"{total / 2**20:.2f}" == sent.group(1),
          f"printed {sent and sent.group(1)} MiB, metrics {total} bytes")


def check_eval(log):
    found = eval_losses(log)
    note(f"eval: {found}")
    check("run.eval.lines", set(found) == {"base", "finetune", "lora"} and all(v[2] == 8 for v in found.values()),
          f"{found}")
    if len(found) != 3:
        return None
    base, ft, lora = found["base"][0], found["finetune"][0], found["lora"][0]
    check("run.eval.finetune_below_base", ft < base, f"fine-tune {ft} vs base {base}")
    check("run.eval.lora_below_base", lora < base, f"LoRA {lora} vs base {base}")
    val = [r["val_loss"] for r in read_metrics("finetune") if "val_loss" in r]
    check("run.eval.matches_validation", val and abs(val[-1] - ft) <= 1e-5 * ft, f"eval {ft}, validation {val}")
    return found


def check_exports(found):
    samples = held_samples()
    model = LlamaForCausalLM.from_pretrained(os.path.join(OUT, "finetuned"), torch_dtype=torch.float32).eval()
    loss, count = hf_loss(model, samples)
    want, want_count = found["finetune"][0], found["finetune"][1]
    check("run.hf.finetuned", count == want_count and abs(loss - want) <= HF_TOLERANCE * want,
          f"transformers {loss} over {count} targets, shardlm eval {want} over {want_count}")
    base = LlamaForCausalLM.from_pretrained(os.path.join(OUT, "base"), torch_dtype=torch.float32)
    peft = PeftModel.from_pretrained(base, os.path.join(OUT, "lora-adapter")).eval()
    loss, count = hf_loss(peft, samples)
    want = found["lora"][0]
    check("run.hf.lora_adapter", abs(loss - want) <= HF_TOLERANCE * want, f"PEFT {loss}, shardlm eval {want}")


def is_png(path):
    try:
        with open(path, "rb") as f:
            return f.read(8) == b"\x89PNG\r\n\x1a\n"
    except OSError:
        return False


def check_outputs(log):
    questions = re.findall(r"^Question: .*\n  reference: +.+\n  base: +.+\n  fine-tuned: +.+$", log, re.M)
    check("run.answers", len(questions) == 2, f"{len(questions)} answered questions")
    plots = [os.path.join(OUT, p) for p in ("pretrain_loss.png", "finetune_loss.png", "finetune_memory.png")]
    bad = [p for p in plots if not is_png(p) or os.path.getsize(p) < MIN_PNG_BYTES or p not in log]
    check("run.plots", not bad, f"missing, small or not printed: {bad}")
    check("run.exported_path", f"Hugging Face directory: {os.path.join(OUT, 'finetuned')}" in log, log[-600:])


def main():
    p = run_job({"SHARDLM_RUN_PRETRAIN_STEPS": str(PRETRAIN_STEPS), "SHARDLM_RUN_FINETUNE_STEPS": str(FINETUNE_STEPS)})
    # The two streams apart: mpirun forwards the ranks' stdout and stderr separately, so in one pipe a line of
    # one could land inside a line of the other (the eval lines are stdout, the trainers' logs stderr).
    log = p.stdout + "\n" + p.stderr
    with open(os.path.join(TMP, "run.log"), "w") as f:  # for a failure's details (SHARDLM_TEST_TMP keeps it)
        f.write(log)
    heads = [int(m) for m in re.findall(r"^== (\d)/%d " % SECTIONS, log, re.M)]
    check("run.exit", p.returncode == 0 and heads == list(range(1, SECTIONS + 1)),
          f"rc {p.returncode}, sections {heads}; output: {log[-800:]}")
    if p.returncode != 0:
        return
    check_trainings(log)
    found = check_eval(log)
    if found:
        check_exports(found)
    check_outputs(log)
    check_bad_input()


def check_bad_input():
    """A bad step count, a page without the configuration table, a vocabulary too small: one line, exit 2."""
    p = run_job({"SHARDLM_RUN_FINETUNE_STEPS": "ten"})
    check("run.bad_env", p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "'ten'" in p.stderr
          and not p.stdout, f"rc {p.returncode}, stdout {p.stdout!r}, stderr {p.stderr!r}")
    tool = os.path.join(ROOT, "tools", "default_job.py")
    no_table = os.path.join(TMP, "no_table.md")
    with open(no_table, "w") as f:
        f.write("# a page\n\n| key | meaning |\n|---|---|\n| `a.b` | c |\n")
    for name, args, expect in (
            ("no_table", ["instructions", no_table, "--out", TMP], "no configuration table"),
            ("vocab", ["tokenizer", "--vocab-size", "100", "--out", TMP, "--shards", TMP, no_table],
             "--vocab-size 100"),
            ("answers", ["answers", no_table, no_table, no_table], "cannot read JSON lines")):
        p = subprocess.run([sys.executable, tool] + args, capture_output=True, text=True)
        one_line = len(p.stderr.strip().splitlines()) == 1
        check(f"run.bad_tool.{name}", p.returncode == 2 and one_line and expect in p.stderr,
              f"rc {p.returncode}, stderr {p.stderr!r}")


if __name__ == "__main__":
    run_main("run.crash", main)
