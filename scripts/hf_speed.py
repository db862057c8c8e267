"""Times a CPU forward of a random LlamaForCausalLM in transformers against `ringbench hf logits` on the same checkpoint and compares the logits.

Not part of CI. Needs torch, transformers, safetensors and numpy, e.g. the venv at /work/pyenv:

    /work/pyenv/bin/python scripts/hf_speed.py --ringbench target/release/ringbench \
        [--hidden 512 --layers 8 --tokens 2048 --threads N]
    /work/pyenv/bin/python scripts/hf_speed.py --skip-ringbench --tokens 128   # transformers only

The model (random weights, float32, save_pretrained into a temporary directory) and the token ids
(int64 [1, tokens] .npy) are written once; transformers runs in float32 under torch.no_grad() with
torch.set_num_threads(threads), one warm-up then best of --repeats. ringbench is run as
`RINGBENCH hf logits --model DIR --tokens ids.npy --out logits.npy` (with RAYON_NUM_THREADS and
OMP_NUM_THREADS set to threads), timed by wall clock including its start-up and checkpoint load,
best of --repeats. Prints a Markdown table.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ringbench", help="path to the ringbench binary (required unless --skip-ringbench)")
    p.add_argument("--skip-ringbench", action="store_true", help="time transformers only")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--intermediate", type=int, default=1376)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"],
                   help="transformers attention implementation (default sdpa)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", help="write the checkpoint and .npy files here instead of a temporary directory")
    args = p.parse_args()
    if not args.skip_ringbench and not args.ringbench:
        p.error("--ringbench PATH is required unless --skip-ringbench is given")
    return args


def best_of(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    workdir = args.keep or tempfile.mkdtemp(prefix="hf_speed_")
    os.makedirs(workdir, exist_ok=True)
    model_dir = os.path.join(workdir, "model")
    ids_path = os.path.join(workdir, "ids.npy")
    out_path = os.path.join(workdir, "logits.npy")
    try:
        cfg = LlamaConfig(
            vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
            num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
            max_position_embeddings=max(2048, args.tokens), rms_norm_eps=1e-5, rope_theta=10000.0,
            tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        )
        model = LlamaForCausalLM(cfg).to(torch.float32)
        model.save_pretrained(model_dir)
        gen_cfg = os.path.join(model_dir, "generation_config.json")
        if os.path.exists(gen_cfg):
            os.remove(gen_cfg)
        rng = np.random.default_rng(args.seed)
        ids = rng.integers(0, args.vocab, size=(1, args.tokens), dtype=np.int64)
        np.save(ids_path, ids)

        # transformers: reload what was saved, so both sides read the same checkpoint.
        model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=args.attn).eval()
        input_ids = torch.from_numpy(ids)

        def hf_forward():
            with torch.no_grad():
                return model(input_ids=input_ids, use_cache=False).logits

        hf_forward()  # warm-up
        hf_s, hf_logits = best_of(hf_forward, args.repeats)
        hf_logits = hf_logits.numpy().astype(np.float64)
        print(f"transformers ({args.attn}, {args.threads} threads): best {hf_s:.3f} s, "
              f"logits {list(hf_logits.shape)}, max|logit| {np.abs(hf_logits).max():.4f}", file=sys.stderr)

        rb_s = rel = None
        if not args.skip_ringbench:
            cmd = [args.ringbench, "hf", "logits", "--model", model_dir, "--tokens", ids_path, "--out", out_path]
            env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads))

            def rb_run():
                subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)

            rb_s, _ = best_of(rb_run, args.repeats)
            rb_logits = np.load(out_path).astype(np.float64)
            if rb_logits.size != hf_logits.size:
                sys.exit(f"ringbench logits have shape {rb_logits.shape}, transformers {hf_logits.shape}")
            rb_logits = rb_logits.reshape(hf_logits.shape)
            if not (np.isfinite(rb_logits).all() and np.isfinite(hf_logits).all()):
                sys.exit("a NaN or infinite logit: the comparison would not mean anything")
            rel = float(np.abs(rb_logits - hf_logits).max() / np.abs(hf_logits).max())

        def fmt(x, spec):
            return "—" if x is None else format(x, spec)

        print(f"\nModel: hidden {args.hidden}, {args.layers} layers, {args.heads} heads / {args.kv_heads} KV heads, "
              f"intermediate {args.intermediate}, vocab {args.vocab}, float32, {args.threads} threads, "
              f"best of {args.repeats}.\n")
        print("| tokens | transformers (s) | ringbench (s) | ratio ringbench/transformers | max rel. diff |")
        print("| ---: | ---: | ---: | ---: | ---: |")
        print(f"| {args.tokens} | {hf_s:.3f} | {fmt(rb_s, '.3f')} | {fmt(None if rb_s is None else rb_s / hf_s, '.2f')} "
              f"| {fmt(rel, '.1e')} |")
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
