#!/usr/bin/env bash
# The GPU check, in two halves, so that the GPU machine runs prebuilt binaries and nothing else:
#
#   bash scripts/gpu-check.sh build   # here, no GPU needed: ringbench with the cuda and nccl features,
#                                     # the CUDA exactness test and the NCCL transport's GPU test,
#                                     # stripped and packed into target/gpu-check/binaries.tar.xz
#   bash scripts/gpu-check.sh run     # on the GPU machine, from the repository root (the device tool:
#                                     # carry target/gpu-check): writes results/gpu/ (or $OUT/gpu/)
#
# `run` records the GPU's name and driver, runs the exactness subset on CUDA (the fused CubeCL kernel
# and the generic one, every strategy x direction x scheme x N in {1, 2, 4}, causal and not, MHA and
# GQA, within 1e-5 of float64; bf16 with each kernel within the bf16 bound), `bench attn --backend
# cuda` (both kernels, zig-zag, causal and not, S up to 64K beside the same run's CUDA matmul;
# gathered into bench_attn.csv and bench_attn.md), the NCCL transport's one-rank test (CUDA tensors
# sent to the rank itself from their own memory, only the header through the host; a tensor
# all-reduced in place), and with two or more GPUs, under mpirun over NCCL on the cuda backend:
# `attn`, its outputs compared with the NumPy fixture, and 5 training steps (gradients all-reduced in
# GPU memory), their losses compared with the same spec trained on the CPU's threads.
# Unattended: each step has a timeout, under 10 minutes in all. Without a GPU it says so in one line and
# exits 2.
set -uo pipefail
cd "$(dirname "$0")/.."
stage=target/gpu-check
bins=target/gpu-check-bin

build() {
  set -e
  # No debuginfo: the binaries travel to the GPU machine (64 MiB for everything carried).
  export CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols
  cargo build --locked --release --bin ringbench --features experiments/cuda,experiments/nccl
  local test_bin
  test_bin=$(cargo test --locked --release -p ringbench-tests --features cuda --test cuda --no-run \
    --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cuda":
        print(m["executable"])')
  local nccl_bin
  nccl_bin=$(cargo test --locked --release -p workbench --features cuda,nccl --lib --no-run \
    --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "workbench":
        print(m["executable"])')
  rm -rf "$stage" "$bins" && mkdir -p "$stage" "$bins"
  cp target/release/ringbench "$bins/ringbench"
  cp "$test_bin" "$bins/cuda-exactness"
  cp "$nccl_bin" "$bins/workbench-lib"
  tar -C "$bins" -cf - ringbench cuda-exactness workbench-lib | xz -T0 -6 >"$stage/binaries.tar.xz"
  du -sh "$stage"/*
  echo "staged in $stage: carry it, then run 'bash scripts/gpu-check.sh run' on the GPU machine"
}

# A 5-step line-retrieval training spec on $1 zig-zag ranks, with clipping and a replica checksum every
# step, writing into $2.
train_spec() {
  cat <<SPEC
[model]
d_model = 32
layers = 1
heads = 2
kv_heads = 1
ffn_multiple_of = 16
rope_theta = 10000.0
ffn_chunk = 64

[ring]
ranks = $1
strategy = "zigzag"
forward = "cw"
backward = "kv"
kernel = "fused"

[train]
steps = 5
batch = 2
lr = 1e-3
warmup_steps = 2
min_lr_ratio = 0.1
weight_decay = 0.01
grad_clip = 1.0
seed = 3
lm_weight = 0.1
min_lines = 1
num_lines = 3
checksum_every = 1
out = "$2"
stop_loss = 0.0
max_minutes = 0.0
SPEC
}

# Whether two metrics.csv files hold the same number of steps and losses within 1e-4 of each other
# (relative; the rule the wgpu training test applies between backends); NaN or inf is a failure.
same_losses() {
  python3 - "$1" "$2" <<'PY'
import csv, math, sys
def losses(path):
    with open(path) as f:
        return [float(row["loss"]) for row in csv.DictReader(f)]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
bad = [(i, x, y) for i, (x, y) in enumerate(zip(a, b))
       if not (math.isfinite(x) and math.isfinite(y) and abs(x - y) <= 1e-4 * abs(x))]
if len(a) != len(b) or not a or bad:
    print(f"FAILED: {len(a)} and {len(b)} steps; differing (step, cpu, gpu): {bad}")
    sys.exit(1)
print(f"losses agree over {len(a)} steps (last {a[-1]:.6f} vs {b[-1]:.6f})")
PY
}

# The bench runs under $1 (bench_<kernel>_<seq>/bench_attn.csv) gathered into $1/bench_attn.csv and
# $1/bench_attn.md, the latter headed by the GPU's name, driver and memory ($1/gpu.csv).
gather_bench() {
  python3 - "$1" <<'PY'
import csv, glob, os, sys
out = sys.argv[1]
rows, header = [], None
for path in glob.glob(os.path.join(out, "bench_*_*", "bench_attn.csv")):
    with open(path) as f:
        reader = csv.DictReader(f)
        header = header or reader.fieldnames
        rows += list(reader)
if not rows:
    print("FAILED: no bench_attn.csv under", out)
    sys.exit(1)
rows.sort(key=lambda r: (int(r["seq"]), r["causal"], r["kernel"]))
with open(os.path.join(out, "bench_attn.csv"), "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=header)
    writer.writeheader()
    writer.writerows(rows)
with open(os.path.join(out, "gpu.csv")) as f:
    gpu = f.read().strip().splitlines()[1:]
columns = ["seq", "ranks", "strategy", "causal", "kernel", "kernel_impl", "fwd_bwd_seconds",
           "fwd_bwd_gflops", "matmul_gflops", "fwd_bwd_over_matmul"]
lines = ["# bench attn on CUDA (scripts/gpu-check.sh run)", "",
         "GPU (name, driver, memory): " + "; ".join(gpu), "",
         "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
def cell(value):
    try:
        return value if value.isdigit() else f"{float(value):.4g}"
    except ValueError:
        return value
lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
with open(os.path.join(out, "bench_attn.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
print(f"{len(rows)} bench rows in {out}/bench_attn.csv and bench_attn.md")
PY
}

run() {
  local out="${OUT:-results}/gpu"
  local bin="$bins/ringbench"
  if [ ! -f "$stage/binaries.tar.xz" ]; then
    echo "gpu-check: $stage holds no build; run 'bash scripts/gpu-check.sh build' first" >&2
    exit 1
  fi
  mkdir -p "$bins" && tar -C "$bins" -xJf "$stage/binaries.tar.xz" || exit 1
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu-check: no NVIDIA GPU here (nvidia-smi finds none): nothing to check" >&2
    exit 2
  fi
  mkdir -p "$out"
  local gpus
  gpus=$(nvidia-smi -L | wc -l)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/gpu.csv"
  echo "== $(date -u +%FT%TZ): $gpus GPU(s): $(tail -n +2 "$out/gpu.csv" | head -1)"
  local status=0
  echo "== exactness subset on CUDA (tests/tests/cuda.rs)"
  timeout 160 "$bins/cuda-exactness" --test-threads 1 2>&1 | tee "$out/exactness.log" | tail -5
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  echo "== bench attn on CUDA (fused CubeCL and generic kernels, zig-zag)"
  # Tiles of at most 8K x 8K per rank (the generic kernel materializes a tile's scores, 2 GiB at 8
  # heads): N = S / 8K ranks, all on GPU 0. Each kernel and length under its own timeout.
  for seq in 4096 16384 65536; do
    local ranks=$(( seq > 8192 ? seq / 8192 : 1 ))
    for kernel in fused generic; do
      timeout 45 "$bin" bench attn --backend cuda --kernels "$kernel" --strategies zigzag \
        --seq "$seq" --ranks "$ranks" --heads 8 --head-dim 128 --repeats 2 \
        --out "$out/bench_${kernel}_$seq" 2>&1 | tail -3
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    done
  done
  gather_bench "$out" || status=1
  echo "== NCCL on one GPU: exchange with itself (staged and in place), all-reduces, barrier"
  timeout 20 "$bins/workbench-lib" --ignored --exact \
    transport::nccl::tests::one_rank_exchanges_with_itself_reduces_and_meets_at_the_barrier \
    2>&1 | tee "$out/nccl_one_rank.log" | tail -3
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  if [ "$gpus" -ge 2 ]; then
    echo "== NCCL: ringbench attn under mpirun on $gpus GPUs, cuda backend (blocks sent in place)"
    local fixture=experiments/tests/fixtures/attn_gqa
    timeout 60 mpirun --allow-run-as-root --oversubscribe -n "$gpus" "$bin" attn \
      --q "$fixture/q.npy" --k "$fixture/k.npy" --v "$fixture/v.npy" --do "$fixture/do.npy" \
      --ranks "$gpus" --causal --backend cuda --nccl-id-file "$out/nccl.id" --out "$out/nccl" \
      2>&1 | tail -3
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    python3 scripts/npy_close.py "$out/nccl" "$fixture" 1e-5 || status=1
    echo "== NCCL: ringbench train under mpirun on $gpus GPUs, cuda backend, against flex threads"
    train_spec "$gpus" "$out/train_flex" >"$out/train_flex.toml"
    train_spec "$gpus" "$out/train_nccl" >"$out/train_nccl.toml"
    timeout 30 "$bin" train --config "$out/train_flex.toml" 2>&1 | tail -2
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    timeout 40 mpirun --allow-run-as-root --oversubscribe -n "$gpus" "$bin" train \
      --config "$out/train_nccl.toml" --backend cuda --nccl-id-file "$out/nccl_train.id" 2>&1 | tail -2
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    same_losses "$out/train_flex/metrics.csv" "$out/train_nccl/metrics.csv" || status=1
  else
    echo "== NCCL across GPUs: skipped (one GPU)"
  fi
  echo "== gpu-check: $( [ $status -eq 0 ] && echo passed || echo FAILED ); results in $out"
  exit $status
}

case "${1:-}" in
  build) build ;;
  run) run ;;
  *) echo "usage: bash scripts/gpu-check.sh build|run" >&2; exit 2 ;;
esac
