#!/usr/bin/env bash
# `make run-tiny`: the default job on a tiny model (`make run` runs it on a real one,
# tools/run_real.sh): the path shardlm exists for, on the CPU, from
# this checkout's own text, with nothing downloaded, every command printed
# before it runs:
#   1. a byte-level BPE tokenizer trained on the user pages of docs/ (tokenizers)
#      and those pages tokenized for pre-training (CORPUS below);
#   2. a small Llama (4 layers, 1 M parameters) pre-trained on it by shardlm,
#      exported as a Hugging Face directory: the "released" base model;
#   3. instruction data: one question per key of docs/configuration.md
#      ("What does `train.steps` do?" -> its description), some held back,
#      made into sample files by tools/prepare_data.py;
#   4. a fine-tune of the base with mpirun at ZeRO stage 3, and a LoRA one;
#   5. shardlm eval of the base and both fine-tunes on the held-back pairs,
#      shardlm generate answering two held-back questions;
#   6. the fine-tune exported as a Hugging Face directory (and LoRA's PEFT
#      adapter directory), plots of the loss and of the memory plan.
#
# Environment: SHARDLM_RUN_DIR (default build/run) holds everything;
# SHARDLM_RUN_PRETRAIN_STEPS (300), SHARDLM_RUN_FINETUNE_STEPS (60) shorten
# the run (tests/t_run_default.py); SHARDLM_RANKS (2); SHARDLM_BIN (bin/shardlm:
# tests/run.sh sets it to the build under test).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${SHARDLM_RUN_DIR:-build/run}
pretrain_steps=${SHARDLM_RUN_PRETRAIN_STEPS:-300}
finetune_steps=${SHARDLM_RUN_FINETUNE_STEPS:-60}
ranks=${SHARDLM_RANKS:-2}
for n in "$pretrain_steps" "$finetune_steps" "$ranks"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || {
    echo "run_default: '$n' is not a positive count; set SHARDLM_RUN_PRETRAIN_STEPS," \
         "SHARDLM_RUN_FINETUNE_STEPS and SHARDLM_RANKS to integers >= 1" >&2
    exit 2
  }
done
# shellcheck source=tools/run_env.sh
. tools/run_env.sh
data=$out/data
# A run's directories are made anew: export refuses a directory that holds another model.
rm -rf "$data" "$out/base" "$out/pretrain" "$out/finetune" "$out/lora" "$out/finetuned" "$out/lora-adapter"
mkdir -p "$data"
start=$(date +%s)

# The pre-training text: the user pages (not the README, whose prose may change freely, nor
# docs/configuration.md, whose meanings are the questions the base must not have seen)
corpus=(docs/getting-started.md docs/models.md docs/data.md docs/methods.md docs/memory.md docs/checkpoints.md)
section "1/6 the base model's tokenizer: byte-level BPE trained on the user pages of docs/"
show python3 tools/default_job.py tokenizer --vocab-size 1024 --out "$out/base-tokenizer" --shards "$data" "${corpus[@]}"

section "2/6 pre-train the base: a 1 M-parameter Llama, $pretrain_steps steps on $ranks ranks, ZeRO stage 3"
show "${mpi[@]}" "$shardlm" train input/run_pretrain.json --set train.steps="$pretrain_steps" \
  --set scheduler.params.total_num_steps="$pretrain_steps" --set train.eval_every=$(( (pretrain_steps + 2) / 3 )) \
  --set data.train="$data/corpus_train.bin" --set data.val="$data/corpus_val.bin" \
  --set checkpoint.dir="$out/pretrain" --set train.metrics="$out/pretrain/metrics.jsonl"
show "${mpi[@]}" "$shardlm" export "$out/pretrain" "$out/base"
cp "$out"/base-tokenizer/* "$out/base/"
echo "base model (Hugging Face layout): $out/base"

section "3/6 instruction data: a question per key of the configuration reference"
show python3 tools/default_job.py instructions docs/configuration.md --out "$data"
show python3 tools/prepare_data.py --tokenizer "$out/base" -o "$data/train.h5" "$data/train.jsonl"
show python3 tools/prepare_data.py --tokenizer "$out/base" -o "$data/held.h5" "$data/held.jsonl"

finetune() {  # finetune CONFIG DIR: CONFIG from the base on the instruction data into DIR
  show "${mpi[@]}" "$shardlm" train "$1" --set model.from_pretrained="$out/base" \
    --set train.steps="$finetune_steps" --set scheduler.params.total_num_steps="$finetune_steps" \
    --set train.eval_every=$(( (finetune_steps + 2) / 3 )) --set data.train="$data/train.h5" \
    --set data.val="$data/held.h5" --set checkpoint.dir="$2" --set train.metrics="$2/metrics.jsonl"
}
section "4/6 fine-tune the base on $ranks ranks at ZeRO stage 3: all weights, then LoRA"
finetune input/run_finetune.json "$out/finetune"
finetune input/run_lora.json "$out/lora"

section "5/6 the held-back questions: loss of the base and of the fine-tunes, and two answers"
for model in "$out/base" "$out/finetune" "$out/lora"; do
  show "${mpi[@]}" "$shardlm" eval "$model" --data "$data/held.h5"
done
for model in base finetune; do
  ask=("${mpi[@]}" "$shardlm" generate "$out/$model" --prompt-file "$data/questions.jsonl" --max-new-tokens 40)
  printf '$ %s > %s\n' "${ask[*]}" "$out/answers_$model.jsonl"
  "${ask[@]}" >"$out/answers_$model.jsonl"
done
python3 tools/default_job.py answers "$data/questions.jsonl" "$out/answers_base.jsonl" "$out/answers_finetune.jsonl"

section "6/6 the results: Hugging Face directories and plots"
show "${mpi[@]}" "$shardlm" export "$out/finetune" "$out/finetuned"
show "${mpi[@]}" "$shardlm" export "$out/lora" "$out/lora-adapter"
show /usr/bin/python3 tools/plot_metrics.py "$out/pretrain/metrics.jsonl" -o "$out/pretrain_loss.png"
show /usr/bin/python3 tools/plot_metrics.py "$out/finetune/metrics.jsonl" -o "$out/finetune_loss.png" \
  --memory "$out/finetune_memory.png"
cat <<EOF

The fine-tuned model, a Hugging Face directory: $out/finetuned
  (transformers: LlamaForCausalLM.from_pretrained("$out/finetuned"); shardlm generate $out/finetuned --prompt ...)
The LoRA adapters (PEFT): $out/lora-adapter, over the base $out/base
Plots: $out/pretrain_loss.png, $out/finetune_loss.png, $out/finetune_memory.png
Done in $(( $(date +%s) - start )) s.
EOF
