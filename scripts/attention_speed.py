"""Times attention forward + backward in ringbench (`ringbench bench attn`, one rank) and in PyTorch's CPU
scaled_dot_product_attention on the same shapes, in alternating rounds, and writes the ratios.

Not part of CI. Needs torch and numpy (e.g. the venv at /work/pyenv):

    /work/pyenv/bin/python scripts/attention_speed.py --ringbench target/release/ringbench \\
        --seq 4096,8192 --heads 4 --head-dim 64 --out results/model_speed/attention_vs_pytorch
    RINGBENCH_SIMD=avx2 /work/pyenv/bin/python scripts/attention_speed.py ...   # a forced SIMD path

What is timed, on both sides with the same thread count (torch.set_num_threads; RAYON_NUM_THREADS for
ringbench), f32, batch 1: one forward and one backward of exact attention over `seq` tokens, `heads`
heads of `head-dim`, causal and not. PyTorch: `F.scaled_dot_product_attention(q, k, v, is_causal=...)`
on [1, heads, seq, head_dim] tensors that require gradients, then `out.backward(d_out)`; ringbench: the
`fwd_bwd_seconds` of `bench attn --ranks 1 --kernels fused` (its own timing: the fastest of its
repeats). Each side: the best of --repeats after a warm-up, over --rounds rounds that alternate the two
sides; the best of all rounds is kept per side. `ringbench_over_pytorch` = PyTorch's seconds over
ringbench's (> 1: ringbench is faster). Writes attention_speed.csv and attention_speed.md into --out,
naming the CPU, the SIMD path ringbench ran and both versions.
"""
import argparse
import csv
import os
import shlex
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ringbench", required=True, help="path to the ringbench binary (a release build)")
    p.add_argument("--seq", default="4096,8192", help="sequence lengths, comma-separated")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", required=True, help="directory for attention_speed.csv and .md")
    return p.parse_args()


def ringbench_rows(args, seq, tmp):
    """ringbench's rows for one length (causal and not): {causal: row}."""
    cmd = [args.ringbench, "bench", "attn", "--seq", str(seq), "--ranks", "1", "--strategies", "zigzag",
           "--kernels", "fused", "--heads", str(args.heads), "--head-dim", str(args.head_dim),
           "--repeats", str(args.repeats), "--out", tmp]
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    with open(os.path.join(tmp, "bench_attn.csv")) as f:
        return {r["causal"] == "true": r for r in csv.DictReader(f)}


def pytorch_seconds(args, seq, causal):
    """The best fwd+bwd seconds of PyTorch's SDPA after a warm-up."""
    g = torch.Generator().manual_seed(0)
    shape = (1, args.heads, seq, args.head_dim)
    q, k, v = (torch.randn(shape, generator=g).requires_grad_() for _ in range(3))
    d_out = torch.randn(shape, generator=g)

    def once():
        for t in (q, k, v):
            t.grad = None
        t0 = time.perf_counter()
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        out.backward(d_out)
        return time.perf_counter() - t0

    once()
    return min(once() for _ in range(args.repeats))


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    lengths = [int(s) for s in args.seq.split(",")]
    best_rb, best_pt, any_row = {}, {}, None
    for round_ in range(args.rounds):
        for seq in lengths:
            with tempfile.TemporaryDirectory() as tmp:
                for causal, row in ringbench_rows(args, seq, tmp).items():
                    any_row = row
                    key = (seq, causal)
                    if key not in best_rb or float(row["fwd_bwd_seconds"]) < float(best_rb[key]["fwd_bwd_seconds"]):
                        best_rb[key] = row
            for causal in (False, True):
                seconds = pytorch_seconds(args, seq, causal)
                best_pt[(seq, causal)] = min(seconds, best_pt.get((seq, causal), float("inf")))
        print(f"round {round_ + 1} of {args.rounds} done", flush=True)
    columns = ["seq", "causal", "heads", "head_dim", "ringbench_seconds", "pytorch_seconds",
               "ringbench_over_pytorch", "ringbench_gflops", "matmul_gflops", "ringbench_over_matmul",
               "threads", "cpu", "simd", "torch"]
    table = []
    for (seq, causal), row in sorted(best_rb.items()):
        rb, pt = float(row["fwd_bwd_seconds"]), best_pt[(seq, causal)]
        table.append(dict(seq=seq, causal=str(causal).lower(), heads=args.heads, head_dim=args.head_dim,
                          ringbench_seconds=f"{rb:.4g}", pytorch_seconds=f"{pt:.4g}",
                          ringbench_over_pytorch=f"{pt / rb:.3f}",
                          ringbench_gflops=f"{float(row['fwd_bwd_gflops']):.4g}",
                          matmul_gflops=f"{float(row['matmul_gflops']):.4g}",
                          ringbench_over_matmul=f"{float(row['fwd_bwd_over_matmul']):.3f}",
                          threads=args.threads, cpu=row.get("cpu", "-"), simd=row.get("simd", "-"),
                          torch=torch.__version__))
    with open(os.path.join(args.out, "attention_speed.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(table)
    command = ((f"RINGBENCH_SIMD={os.environ['RINGBENCH_SIMD']} " if os.environ.get("RINGBENCH_SIMD") else "")
               + "/work/pyenv/bin/python scripts/attention_speed.py "
               + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    shown = ["seq", "causal", "ringbench_seconds", "pytorch_seconds", "ringbench_over_pytorch",
             "ringbench_gflops", "ringbench_over_matmul"]
    md = ["# Attention forward + backward: ringbench against PyTorch's CPU SDPA", "",
          f"Regenerate: `{command}`", "",
          f"Batch 1, {args.heads} heads of {args.head_dim}, f32, {args.threads} threads on both sides; CPU: "
          f"{any_row.get('cpu', '-')}, SIMD path {any_row.get('simd', '-')}; torch {torch.__version__}. Best of "
          f"{args.repeats} after a warm-up, over {args.rounds} alternating rounds. `ringbench_over_pytorch` > 1: "
          f"ringbench is faster. `ringbench_over_matmul`: ringbench's GFLOP/s over a 1024³ f32 matmul's "
          f"measured in the same `bench attn` run (FLOPs: 4·d forward + 10·d backward per visible pair and "
          f"head).", "",
          "| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    md += ["| " + " | ".join(str(r[c]) for c in shown) + " |" for r in table]
    with open(os.path.join(args.out, "attention_speed.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
