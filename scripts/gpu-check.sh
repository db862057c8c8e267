#!/usr/bin/env bash
# The GPU check: what a lent GPU machine runs in its few minutes, and the same script run here on
# Mesa's software Vulkan device so that CI tests the script itself.
#
#   bash scripts/gpu-check.sh build     # here, no GPU needed: ringbench with the cuda and nccl
#                                       # features, the CUDA exactness tests and the NCCL transport's
#                                       # tests, stripped, and NVRTC 12.6's libraries from PyPI's
#                                       # nvidia-cuda-nvrtc-cu12 wheel (CubeCL compiles its kernels at
#                                       # run time with NVRTC, which a bare driver lacks), all packed
#                                       # into target/gpu-check/ (~45 MB: the device tool carries 64 MiB)
#   bash scripts/gpu-check.sh run       # on the GPU machine, from the repository root (the device
#                                       # tool: carry target/gpu-check): writes results/gpu/ (or $OUT/gpu/)
#   bash scripts/gpu-check.sh dry-run   # here and in CI: the same stages, file layout and comparisons
#                                       # on wgpu (llvmpipe) at tiny sizes, with the debug build of the
#                                       # test command; writes target/gpu-check-dry-run/gpu/, never results/
#
# Stages (run: cuda; dry-run: wgpu), each under its own timeout, at most 8 minutes in all on a GPU
# including first-call kernel compilation, sized to finish even at 1 TFLOP/s:
#  1. what the machine has, one line each: the GPU(s) and driver; NVRTC (carried); NCCL (NCCL's
#     wheel is 158-335 MiB, more than the device tool carries: its stages run only where the machine
#     has libnccl.so.2, and say so otherwise); mpirun (only with 2+ GPUs).
#  2. exactness (160 s): the exactness subset, every strategy x direction x scheme x N in {1, 2, 4},
#     causal and not, MHA and GQA, both kernels, within 1e-5 of float64; heads 64 and 128 wide,
#     forward and backward, within their derived bound; bf16 within its bound. f32 matmuls run in
#     full f32 (the generic kernel asks CubeCL for its unit matmul: tensor cores would compute f32
#     inputs in TF32, 2^-11).
#  3. bench attn (40 s per kernel and length): fused and generic kernels, zig-zag, causal and not,
#     S = 4K and 16K (8 heads of 128: at most ~2e13 FLOP a run), beside the same run's matmul;
#     gathered into bench_attn.csv and bench_attn.md.
#  4. NCCL on one GPU (30 s): an exchange with itself (staged and in place), all-reduces and the
#     barrier; and a rank whose peer never joins ends within its timeout with a typed error.
#  5. with 2+ GPUs, under mpirun over NCCL: `attn` on the cuda backend, compared with the NumPy
#     fixture; 5 training steps (gradients all-reduced in GPU memory) from the same host-seeded
#     weights as the same spec trained on the CPU's threads, losses compared. The dry run makes the
#     same comparisons with 2 in-process wgpu ranks. Then a small attn sweep with each point launched
#     under mpirun (`ringbench run --launcher mpirun`), one process a GPU by its local rank, its ring
#     over MPI (staged through the host; launched points do not use NCCL yet). Not in the dry run.
# Without a GPU, `run` says so in one line and exits 2.
set -uo pipefail
cd "$(dirname "$0")/.."
stage=target/gpu-check
bins=target/gpu-check-bin
nvrtc_version=12.6.85

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
  rm -rf "$stage" "$bins" && mkdir -p "$stage" "$bins/lib"
  cp target/release/ringbench "$bins/ringbench"
  cp "$test_bin" "$bins/cuda-exactness"
  cp "$nccl_bin" "$bins/workbench-lib"
  tar -C "$bins" -cf - ringbench cuda-exactness workbench-lib | xz -T0 -6 >"$stage/binaries.tar.xz"
  # NVRTC 12.6 (sm_90 and older; its wheel is 22 MiB where 12.8's is 83): libnvrtc.so.12 and its
  # builtins, packed apart so that a machine that has them can skip them.
  local wheels=target/gpu-check-wheels
  mkdir -p "$wheels"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
    "nvidia-cuda-nvrtc-cu12==$nvrtc_version" -d "$wheels"
  python3 - "$wheels" "$bins/lib" <<'PY'
import glob, os, sys, zipfile
wheel, = glob.glob(os.path.join(sys.argv[1], "nvidia_cuda_nvrtc_cu12-*.whl"))
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if "/lib/libnvrtc" in name:
            with open(os.path.join(sys.argv[2], os.path.basename(name)), "wb") as f:
                f.write(z.read(name))
PY
  tar -C "$bins" -cf - lib | xz -T0 -6 >"$stage/nvrtc.tar.xz"
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

# Whether the test log $1 reports at least one passed test (a filter that matches nothing passes
# with 0 tests run, which compares nothing); says so, naming the stage $2, when it does not.
ran_some() {
  grep -q "test result: ok. [1-9]" "$1" && return 0
  echo "FAILED: no $2 test ran ($1)"
  return 1
}

# The stages, shared by `run` (cuda, release binaries from the build) and `dry-run` (wgpu, the test
# command's debug build, tiny sizes). Globals: mode, backend, out, bin, exactness_bin, lib_bin, gpus.
stages() {
  local status=0
  mkdir -p "$out"
  echo "== exactness subset on $backend (tests/tests/$backend.rs)"
  local filter=()
  [ "$mode" = dry-run ] && filter=(wide_heads)  # CI's test command runs the rest of tests/tests/wgpu.rs
  timeout "$t_exact" "$exactness_bin" --test-threads 1 "${filter[@]}" 2>&1 | tee "$out/exactness.log" | tail -5
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  ran_some "$out/exactness.log" "exactness" || status=1
  echo "== bench attn on $backend (fused CubeCL and generic kernels, zig-zag)"
  local seq
  for seq in "${bench_seqs[@]}"; do
    for kernel in fused generic; do
      timeout "$t_bench" "$bin" bench attn --backend "$backend" --kernels "$kernel" --strategies zigzag \
        --seq "$seq" --ranks 1 --heads "$bench_heads" --head-dim "$bench_dim" --repeats "$bench_repeats" \
        --out "$out/bench_${kernel}_$seq" 2>&1 | tail -3
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    done
  done
  gather_bench "$out" || status=1
  echo "== NCCL's rendezvous and deadlines (no GPU needed: id file, never-written id, a join that never ends)"
  timeout 30 "$lib_bin" transport::nccl::rendezvous 2>&1 | tee "$out/nccl_rendezvous.log" | tail -2
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  ran_some "$out/nccl_rendezvous.log" "NCCL rendezvous" || status=1
  if [ "$mode" = run ] && [ "$have_nccl" = yes ]; then
    echo "== NCCL on one GPU: exchange with itself (staged and in place), all-reduces, barrier; a peer that never joins"
    timeout 30 "$lib_bin" --ignored --test-threads 1 transport::nccl::tests 2>&1 | tee "$out/nccl_one_rank.log" | tail -4
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    ran_some "$out/nccl_one_rank.log" "NCCL one-GPU" || status=1
  fi
  local fixture=experiments/tests/fixtures/attn_gqa
  local launch=() nccl_args=() train_args=()
  if [ "$mode" = run ]; then
    if [ "$gpus" -lt 2 ] || [ "$have_nccl" != yes ] || [ "$have_mpirun" != yes ]; then
      echo "== NCCL across GPUs: skipped ($gpus GPU(s), NCCL: $have_nccl, mpirun: $have_mpirun)"
      finish "$status"
      return
    fi
    export RINGBENCH_RUN_ID="gpu-check-$$-$(date +%s)"
    launch=(mpirun --allow-run-as-root --oversubscribe -n "$gpus")
    nccl_args=(--nccl-id-file "$out/nccl.id")
    train_args=(--nccl-id-file "$out/nccl_train.id")
    echo "== NCCL: ringbench attn under mpirun on $gpus GPUs, cuda backend (blocks sent in place)"
  else
    echo "== 2 in-process ranks on wgpu: ringbench attn against the NumPy fixture"
  fi
  local ranks=$(( gpus < 2 ? 2 : gpus ))
  timeout "$t_multi" "${launch[@]}" "$bin" attn \
    --q "$fixture/q.npy" --k "$fixture/k.npy" --v "$fixture/v.npy" --do "$fixture/do.npy" \
    --ranks "$ranks" --causal --backend "$backend" "${nccl_args[@]}" --out "$out/ranks_attn" \
    2>&1 | tail -3
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  python3 scripts/npy_close.py "$out/ranks_attn" "$fixture" 1e-5 || status=1
  echo "== training on $ranks $backend ranks against flex threads, from the same host-seeded weights"
  train_spec "$ranks" "$out/train_flex" >"$out/train_flex.toml"
  train_spec "$ranks" "$out/train_$backend" >"$out/train_$backend.toml"
  rm -rf "$out/train_flex" "$out/train_$backend"
  timeout "$t_multi" "$bin" train --config "$out/train_flex.toml" 2>&1 | tail -2
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  timeout "$t_multi" "${launch[@]}" "$bin" train --config "$out/train_$backend.toml" --backend "$backend" \
    "${train_args[@]}" 2>&1 | tail -2
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  same_losses "$out/train_flex/metrics.csv" "$out/train_$backend/metrics.csv" || status=1
  if [ "$mode" = run ]; then
    echo "== a sweep with each point launched under mpirun: attn on $backend, 1 and $gpus ranks, one process a GPU"
    printf 'kind = "attn"\n[sweep]\nstrategies = ["zigzag", "striped"]\nranks = [1, %s]\nseq_lens = [4096]\nkernels = ["fused", "generic"]\nbackends = ["%s"]\n[launcher]\nmpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "{ranks}"]\ndeadline_seconds = 300\n' \
      "$gpus" "$backend" >"$out/launched_sweep.toml"
    timeout "$t_multi" "$bin" run "$out/launched_sweep.toml" --launcher mpirun --results "$out" 2>&1 | tail -3
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  fi
  finish "$status"
}

finish() {
  echo "== gpu-check $mode: $( [ "$1" -eq 0 ] && echo passed || echo FAILED ); results in $out"
  exit "$1"
}

# Whether the dynamic loader finds library $1 (after LD_LIBRARY_PATH's folders).
have_lib() {
  local dir
  for dir in ${LD_LIBRARY_PATH//:/ }; do
    [ -e "$dir/$1" ] && return 0
  done
  ldconfig -p 2>/dev/null | grep -F "$1 " >/dev/null
}

run() {
  mode=run backend=cuda out="${OUT:-results}/gpu" bin="$bins/ringbench"
  exactness_bin="$bins/cuda-exactness" lib_bin="$bins/workbench-lib"
  t_exact=160 t_bench=40 t_multi=60
  bench_seqs=(4096 16384) bench_heads=8 bench_dim=128 bench_repeats=2
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
  gpus=$(nvidia-smi -L | wc -l)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/gpu.csv"
  echo "== $(date -u +%FT%TZ): $gpus GPU(s): $(tail -n +2 "$out/gpu.csv" | head -1)"
  if have_lib libnvrtc.so.12; then
    echo "== NVRTC: the machine's own"
  elif [ -f "$stage/nvrtc.tar.xz" ] && tar -C "$bins" -xJf "$stage/nvrtc.tar.xz"; then
    export LD_LIBRARY_PATH="$PWD/$bins/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "== NVRTC: carried ($nvrtc_version, $bins/lib)"
  else
    echo "== NVRTC: missing, and none carried: CubeCL cannot compile kernels; rebuild with network" >&2
    exit 1
  fi
  have_nccl=no; have_lib libnccl.so.2 && have_nccl=yes
  echo "== NCCL (libnccl.so.2): $have_nccl$( [ $have_nccl = no ] && echo ' (its wheel is too large to carry: NCCL stages skipped)')"
  have_mpirun=no; command -v mpirun >/dev/null 2>&1 && have_mpirun=yes
  [ "$gpus" -ge 2 ] && echo "== mpirun: $have_mpirun"
  stages
}

# The test command's debug executables (with its features; built if missing): ringbench, the wgpu
# exactness tests, workbench's library tests.
dry_run() {
  mode=dry-run backend=wgpu out="${DRY_RUN_OUT:-target/gpu-check-dry-run}/gpu"
  t_exact=900 t_bench=300 t_multi=300
  bench_seqs=(64 128) bench_heads=2 bench_dim=16 bench_repeats=1
  gpus=1 have_nccl=no have_mpirun=no
  local features=experiments/mpi,experiments/nccl,experiments/wgpu,ringbench-tests/wgpu
  local listing
  listing=$(cargo test --locked --workspace --features "$features" --no-run --message-format=json 2>/dev/null) || {
    echo "gpu-check dry-run: building the test command's executables failed" >&2; exit 1; }
  exe() {
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1] \
       and sys.argv[2] in m["target"]["kind"] and m["profile"]["test"] == (sys.argv[3] == "test"):
        print(m["executable"]); break' "$@" <<<"$listing"
  }
  bin=$(exe ringbench bin plain) exactness_bin=$(exe wgpu test test) lib_bin=$(exe workbench lib test)
  if [ -z "$bin" ] || [ -z "$exactness_bin" ] || [ -z "$lib_bin" ]; then
    echo "gpu-check dry-run: missing an executable (ringbench: '$bin', wgpu tests: '$exactness_bin', workbench lib: '$lib_bin')" >&2
    exit 1
  fi
  export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
  rm -rf "$out" && mkdir -p "$out"
  printf 'name, driver_version, memory.total [MiB]\nwgpu (dry run: Mesa llvmpipe), -, -\n' >"$out/gpu.csv"
  echo "== $(date -u +%FT%TZ): dry run on wgpu, results in $out"
  stages
}

case "${1:-}" in
  build) build ;;
  run) run ;;
  dry-run) dry_run ;;
  *) echo "usage: bash scripts/gpu-check.sh build|run|dry-run" >&2; exit 2 ;;
esac
