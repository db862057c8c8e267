"""Times the whole model in ringbench (`ringbench bench model`) and in PyTorch / transformers on the same shapes, in one run, and writes the ratios.

Not part of CI. Needs torch, transformers, safetensors and numpy (e.g. the venv at /work/pyenv):

    /work/pyenv/bin/python scripts/model_speed.py --ringbench target/release/ringbench \\
        --preset smollm2 --prefill 1024,4096 --decode 64 --out results/model_speed/smollm2
    /work/pyenv/bin/python scripts/model_speed.py --ringbench target/release/ringbench \\
        --preset line-retrieval --prefill 1931 --train-seq 1931 --train-batch 16 --decode 0 \\
        --out results/model_speed/line_retrieval

Presets: `smollm2` is a LlamaForCausalLM of SmolLM2-135M's shape (30 layers, width 576, 9 query and 3
KV heads, feed-forward 1536, vocabulary 49152, tied embeddings) with random weights, written once with
save_pretrained into --cache; both sides load that directory. `line-retrieval` is ringbench's own
line-retrieval model (width 128, 4 layers, 4 / 2 heads; its sizes are read from ringbench's own rows),
built in transformers with the same sizes (the parameter counts must agree, or the script stops).
`--model DIR` times an existing Hugging Face directory instead.

What is timed, on both sides, with the same thread count (torch.set_num_threads; RAYON_NUM_THREADS
for ringbench), f32 (or, with --weights bf16, ringbench's bf16 weights against PyTorch's model cast
to bfloat16 for prefill and decoding), the fastest of --repeats after one warm-up, in --rounds rounds that alternate
ringbench and PyTorch (the best of all rounds is kept per side):
- prefill: one prompt of N random tokens and the logits after its last token (transformers:
  `model(ids, use_cache=True, logits_to_keep=1)` under no_grad, what generate's prefill runs);
- decode: --decode tokens after a prompt of --decode-prompt tokens, each step one token through the
  KV cache; the steps after the prefill are timed;
- train: one step of --train-batch sequences of --train-seq random tokens: forward, cross-entropy
  over every next token, backward, AdamW (lr 1e-4, weight decay 0.1);
- train-lora (--train-lora R): the same step with LoRA adapters of rank R (alpha 2R) on every linear
  map and the base frozen (PyTorch: peft's `get_peft_model` on the same model).
- load (--with-load, a model directory): reading the directory into a model, ringbench's `load_seconds`
  (bench model) against transformers' `from_pretrained`;
- prefill+load (--with-load): the whole of a user's first answer, load counted on both sides: ringbench's
  whole command `hf generate --model DIR --tokens IDS --max-new 1` (process start to exit) against
  `from_pretrained` + the prefill + the argmax in a fresh Python process (its imports not counted).
ringbench's rows are its own (`bench model --out`); tokens/s = tokens / seconds on both sides.
Writes model_speed.csv and model_speed.md into --out (the command, the CPU, both versions).
"""
import argparse
import copy
import csv
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

SMOLLM2 = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
               intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0,
               max_position_embeddings=8192, rms_norm_eps=1e-5)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ringbench", required=True, help="path to the ringbench binary (a release build)")
    p.add_argument("--preset", choices=["smollm2", "line-retrieval"], help="the model (else --model)")
    p.add_argument("--model", help="a Hugging Face model directory")
    p.add_argument("--cache", default=os.path.expanduser("~/.cache/ringbench/model_speed"),
                   help="where the smollm2 preset's random checkpoint is written once")
    p.add_argument("--prefill", default="1024", help="prefill lengths, comma-separated")
    p.add_argument("--decode", type=int, default=64, help="tokens decoded (0: none)")
    p.add_argument("--decode-prompt", type=int, default=1024)
    p.add_argument("--train-seq", type=int, default=0, help="tokens a training sequence (0: none)")
    p.add_argument("--train-batch", type=int, default=1)
    p.add_argument("--train-lora", type=int, default=0,
                   help="also a LoRA fine-tuning row: adapters of this rank (alpha 2r) on every linear map, "
                        "the base frozen (PyTorch: peft's LoraConfig on the same model; 0: none)")
    p.add_argument("--with-load", action="store_true",
                   help="also the load and prefill+load rows (a model directory: --preset smollm2 or --model)")
    p.add_argument("--ranks", default="1", help="ringbench's rank counts, comma-separated")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--weights", choices=["f32", "bf16"], default="f32",
                   help="what prefill and decoding multiply by: ringbench's --weights; PyTorch's model "
                        "cast to that dtype for them (training stays f32 on both sides)")
    p.add_argument("--out", required=True, help="directory for model_speed.csv and model_speed.md")
    args = p.parse_args()
    if (args.preset is None) == (args.model is None):
        p.error("give exactly one of --preset and --model")
    return args


def smollm2_dir(cache):
    """The random SmolLM2-shaped checkpoint, written once."""
    directory = os.path.join(cache, "smollm2-135m-random")
    if not os.path.exists(os.path.join(directory, "config.json")):
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**SMOLLM2, bos_token_id=None, eos_token_id=None,
                                             pad_token_id=None)).eval()
        model.save_pretrained(directory)
    return directory


def run_ringbench(args, model_args, out):
    cmd = [args.ringbench, "bench", "model", *model_args, "--prefill", args.prefill,
           "--decode", str(args.decode), "--decode-prompt", str(args.decode_prompt),
           "--train-seq", str(args.train_seq), "--train-batch", str(args.train_batch),
           "--train-lora", str(args.train_lora),
           "--ranks", args.ranks, "--repeats", str(args.repeats), "--weights", args.weights, "--out", out]
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "bench_model.csv")) as f:
        return list(csv.DictReader(f))


def torch_model(args, directory, rows):
    """The PyTorch model: the directory's, or the own model's sizes from ringbench's rows."""
    if directory is not None:
        return LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="sdpa")
    r = rows[0]
    d, heads = int(r["d_model"]), int(r["heads"])
    config = LlamaConfig(hidden_size=d, num_hidden_layers=int(r["layers"]), num_attention_heads=heads,
                         num_key_value_heads=int(r["kv_heads"]), intermediate_size=int(r["ffn_hidden"]),
                         vocab_size=int(r["vocab"]), tie_word_embeddings=False, rope_theta=10000.0,
                         max_position_embeddings=65536, rms_norm_eps=1e-5, head_dim=d // heads,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    params = sum(p.numel() for p in model.parameters())
    if params != int(r["params"]):
        sys.exit(f"the PyTorch model has {params} parameters, ringbench's {r['params']}: not the same shape")
    return model


def best(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def torch_rows(args, model, vocab):
    rng = np.random.default_rng(0)
    ids = lambda n, b=1: torch.from_numpy(rng.integers(0, vocab, size=(b, n), dtype=np.int64))
    out = []
    model.eval()
    # Prefill and decoding run on a copy cast to --weights' dtype; training on the f32 model.
    infer = model if args.weights == "f32" else copy.deepcopy(model).to(torch.bfloat16)
    with torch.no_grad():
        for n in [int(x) for x in args.prefill.split(",")]:
            prompt = ids(n)
            seconds = best(lambda: infer(prompt, use_cache=True, logits_to_keep=1), args.repeats)
            out.append(("prefill", n, 1, n, seconds))
        if args.decode > 0:
            prompt = ids(args.decode_prompt)

            def steps():
                first = infer(prompt, use_cache=True, logits_to_keep=1)
                cache, token = first.past_key_values, first.logits[:, -1].argmax(-1, keepdim=True)
                t0 = time.perf_counter()
                for _ in range(args.decode):
                    step = infer(token, past_key_values=cache, use_cache=True)
                    cache, token = step.past_key_values, step.logits[:, -1].argmax(-1, keepdim=True)
                return time.perf_counter() - t0

            steps()
            seconds = min(steps() for _ in range(args.repeats))
            out.append(("decode", args.decode_prompt, 1, args.decode, seconds))
    if args.train_seq > 0:
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
        batch = ids(args.train_seq + 1, args.train_batch)

        inputs, targets = batch[:, :-1], batch[:, 1:].reshape(-1)

        def step():
            logits = model(inputs).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        seconds = best(step, args.repeats)
        out.append(("train", args.train_seq, args.train_batch, args.train_seq * args.train_batch, seconds))
        if args.train_lora > 0:
            out.append(("train-lora", args.train_seq, args.train_batch, args.train_seq * args.train_batch,
                        lora_seconds(args, model, inputs, targets)))
    return out


def lora_seconds(args, model, inputs, targets):
    """A LoRA step on `model` with peft (rank --train-lora, alpha 2r, every linear map, PEFT's init, the
    base frozen, AdamW over the adapters): forward, cross-entropy, backward, step."""
    from peft import LoraConfig, get_peft_model
    r = args.train_lora
    config = LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    adapted = get_peft_model(copy.deepcopy(model), config)
    adapted.train()
    optimizer = torch.optim.AdamW([p for p in adapted.parameters() if p.requires_grad], lr=1e-4,
                                  weight_decay=0.1)

    def step():
        logits = adapted(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return best(step, args.repeats)


PT_WHOLE = """
import sys, time
import numpy as np
import torch
from transformers import LlamaForCausalLM
torch.set_num_threads(int(sys.argv[3]))
ids = torch.from_numpy(np.load(sys.argv[2]))
t0 = time.perf_counter()
model = LlamaForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32, attn_implementation="sdpa").eval()
t1 = time.perf_counter()
with torch.no_grad():
    model(ids, use_cache=True, logits_to_keep=1).logits[:, -1].argmax(-1)
t2 = time.perf_counter()
print(t1 - t0, t2 - t0)
"""


def whole_rows(args, directory, vocab, tmp):
    """(ringbench, pytorch) seconds of load and of each prefill+load, the best of --repeats each,
    alternating sides; ringbench's load is bench model's `load_seconds` (filled in by the caller)."""
    rng = np.random.default_rng(1)
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    out, loads = {}, []
    for n in [int(x) for x in args.prefill.split(",")]:
        path = os.path.join(tmp, f"ids-{n}.npy")
        np.save(path, rng.integers(0, vocab, size=(1, n), dtype=np.int64))
        rb, pt_load, pt_whole = [], [], []
        cmd = [args.ringbench, "hf", "generate", "--model", directory, "--tokens", path, "--max-new", "1"]
        print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
        for _ in range(args.repeats + 1):
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
            rb.append(time.perf_counter() - t0)
            done = subprocess.run([sys.executable, "-c", PT_WHOLE, directory, path, str(args.threads)],
                                  check=True, capture_output=True, text=True)
            load, whole = (float(x) for x in done.stdout.split())
            pt_load.append(load)
            pt_whole.append(whole)
        # The first of each side warms the page cache.
        out[("prefill+load", n)] = (min(rb[1:]), min(pt_whole[1:]))
        loads += pt_load[1:]
    out[("load", 0)] = (None, min(loads))
    return out


def weights_said(args):
    """What the rows multiplied by, in words."""
    if args.weights == "f32":
        return "f32"
    return ("prefill and decoding with bf16 weights (ringbench: bf16 copies of the projections and head, "
            "f32 accumulation; PyTorch: the model cast to bfloat16), training f32")


def fmt(value):
    """A CSV cell of ringbench's as 4 significant digits, or '-' where the row has none."""
    return f"{float(value):.4g}" if value not in (None, "") else "-"


def decode_rate(rows):
    """The read rate of ringbench's decode row, if there is one."""
    return next((fmt(r["read_gb_per_s"]) for r in rows.values() if r.get("read_gb_per_s")), "-")


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    directory = smollm2_dir(args.cache) if args.preset == "smollm2" else args.model
    model_args = ["--model", directory] if directory else []
    best_rb, best_pt, rows = {}, {}, None
    best_whole = {}
    model = None
    if args.with_load and not directory:
        sys.exit("--with-load needs a model directory (--preset smollm2 or --model)")
    for round_ in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            rows = run_ringbench(args, model_args, tmp)
            if args.with_load:
                for key, (rb, pt) in whole_rows(args, directory, int(rows[0]["vocab"]), tmp).items():
                    if key == ("load", 0):
                        rb = min(float(r["load_seconds"]) for r in rows)
                    old = best_whole.get(key, (float("inf"), float("inf")))
                    best_whole[key] = (min(old[0], rb), min(old[1], pt))
        for r in rows:
            key = (r["work"], int(r["seq"]), int(r["batch"]), int(r["ranks"]))
            if key not in best_rb or float(r["seconds"]) < float(best_rb[key]["seconds"]):
                best_rb[key] = r
        if model is None:
            model = torch_model(args, directory, rows)
        for work, seq, batch, tokens, seconds in torch_rows(args, model, int(rows[0]["vocab"])):
            key = (work, seq, batch)
            if key not in best_pt or seconds < best_pt[key][1]:
                best_pt[key] = (tokens, seconds)
        print(f"round {round_ + 1} of {args.rounds} done", flush=True)
    first = rows[0]
    columns = ["work", "model", "params", "seq", "batch", "tokens", "ranks", "ringbench_seconds",
               "pytorch_seconds", "ringbench_tokens_per_s", "pytorch_tokens_per_s", "ringbench_over_pytorch",
               "ringbench_cores_busy", "read_gb_per_s", "bandwidth_bound_tokens_per_s",
               "ringbench_of_bandwidth_bound", "threads", "cpu", "cpu_features", "simd", "torch", "transformers"]
    table = []
    for (work, seq, batch, ranks), r in sorted(best_rb.items(), key=lambda kv: (["prefill", "decode", "train", "train-lora"].index(kv[0][0]), kv[0][1], kv[0][3])):
        tokens, pt = best_pt[(work, seq, batch)]
        rb_rate, pt_rate = float(r["tokens_per_s"]), tokens / pt
        table.append(dict(work=work, model=r["model"], params=r["params"], seq=seq, batch=batch, tokens=tokens,
                          ranks=ranks, ringbench_seconds=f"{float(r['seconds']):.4g}", pytorch_seconds=f"{pt:.4g}",
                          ringbench_tokens_per_s=f"{rb_rate:.4g}", pytorch_tokens_per_s=f"{pt_rate:.4g}",
                          ringbench_over_pytorch=f"{rb_rate / pt_rate:.3f}",
                          ringbench_cores_busy=f"{float(r['cores_busy']):.2f}",
                          # Decode rows: the machine's read rate over the weights' bytes (ringbench's).
                          read_gb_per_s=fmt(r.get("read_gb_per_s")),
                          bandwidth_bound_tokens_per_s=fmt(r.get("bandwidth_bound_tokens_per_s")),
                          ringbench_of_bandwidth_bound=fmt(r.get("of_bandwidth_bound")), threads=args.threads,
                          cpu=first["cpu"], cpu_features=first["cpu_features"], simd=first.get("simd", "-"),
                          torch=torch.__version__, transformers=transformers.__version__))
    for (work, n), (rb, pt) in sorted(best_whole.items(), key=lambda kv: kv[0][1]):
        rate = lambda s: f"{n / s:.4g}" if n else "-"
        table.append(dict(work=work, model=first["model"], params=first["params"], seq=n, batch=1, tokens=n,
                          ranks=1, ringbench_seconds=f"{rb:.4g}", pytorch_seconds=f"{pt:.4g}",
                          ringbench_tokens_per_s=rate(rb), pytorch_tokens_per_s=rate(pt),
                          ringbench_over_pytorch=f"{pt / rb:.3f}", ringbench_cores_busy="-",
                          read_gb_per_s="-", bandwidth_bound_tokens_per_s="-", ringbench_of_bandwidth_bound="-",
                          threads=args.threads, cpu=first["cpu"], cpu_features=first["cpu_features"],
                          simd=first.get("simd", "-"), torch=torch.__version__,
                          transformers=transformers.__version__))
    with open(os.path.join(args.out, "model_speed.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(table)
    command = "/work/pyenv/bin/python scripts/model_speed.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    shown = ["work", "seq", "batch", "ranks", "ringbench_seconds", "pytorch_seconds", "ringbench_tokens_per_s",
             "pytorch_tokens_per_s",
             "ringbench_over_pytorch", "ringbench_cores_busy", "bandwidth_bound_tokens_per_s",
             "ringbench_of_bandwidth_bound"]
    md = [f"# The whole model: ringbench against PyTorch on the same CPU", "",
          f"Regenerate: `{command}`", "",
          f"{first['model']} ({first['params']} parameters), {weights_said(args)}, {args.threads} threads on "
          f"both sides; CPU: "
          f"{first['cpu']} ({first['cpu_features']}), SIMD path {first.get('simd', '-')} "
          f"(`RINGBENCH_SIMD`: {os.environ.get('RINGBENCH_SIMD') or 'unset, the best detected'}); "
          f"torch {torch.__version__}, transformers "
          f"{transformers.__version__} (sdpa attention). Best of {args.repeats} after a warm-up, over "
          f"{args.rounds} alternating rounds. `ringbench_over_pytorch` > 1: ringbench is faster (load rows: "
          f"PyTorch's seconds over ringbench's)."
          + (f" Decode rows: `bandwidth_bound_tokens_per_s` is the memory read rate ringbench measured in "
             f"the same run ({decode_rate(best_rb)} GB/s) over the bytes of the weights a step reads (f32, or "
             f"bf16 with --weights bf16); "
             f"`ringbench_of_bandwidth_bound` how close ringbench's decode comes to it."
             if args.decode > 0 else ""), "",
          "| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    md += ["| " + " | ".join(str(row[c]) for c in shown) + " |" for row in table]
    with open(os.path.join(args.out, "model_speed.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
