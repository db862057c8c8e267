#!/usr/bin/env bash
# The test command: formatting, lints, every test, and a compile check of the optional features.
# Cargo runs with --locked: the committed Cargo.lock is what is tested, never a fresh resolution.
# Installs what it needs on a fresh machine (Rust components; apt packages when a test needs them).
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step prints the seconds since the start, so a slow step shows in the log (CI's limit is 30 minutes).
start=$(date +%s)
step() { printf '\n== [%4d s] %s\n' "$(( $(date +%s) - start ))" "$*"; }

if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  step "installing rustfmt and clippy"
  rustup component add rustfmt clippy
fi

# apt packages: Open MPI (found through pkg-config) and clang (bindgen) for the `mpi` feature and its
# multi-process tests (sweeps under mpirun among them); Mesa's software Vulkan device (llvmpipe) and the Vulkan loader for the `wgpu`
# backend's tests on a machine without a GPU. The SVG figures need no font packages: their text is SVG text.
missing=()
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
command -v mpirun >/dev/null 2>&1 && pkg-config --exists ompi 2>/dev/null || missing+=(libopenmpi-dev openmpi-bin)
command -v clang >/dev/null 2>&1 && ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || missing+=(clang libclang-dev)
ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || missing+=(mesa-vulkan-drivers)
# grep reads all of ldconfig's list: with -q it would stop early, and under pipefail ldconfig's
# SIGPIPE made the check fail at random (a run reinstalled libvulkan1).
ldconfig -p | grep 'libvulkan.so.1 ' >/dev/null || missing+=(libvulkan1)
# SLURM and munge: a real one-node cluster (scripts/slurm-local.sh) for the srun launcher and a job array.
command -v slurmctld >/dev/null 2>&1 && command -v munged >/dev/null 2>&1 || missing+=(slurm-wlm munge)
if [ ${#missing[@]} -gt 0 ]; then
  step "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # As root (CI) directly; otherwise through sudo when it is there, else one line saying what to install.
  as_root=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      as_root=(sudo env DEBIAN_FRONTEND=noninteractive)
    else
      echo "scripts/test.sh needs these Debian packages, and root or sudo to install them: ${missing[*]}" >&2
      echo "(without features, cargo test --workspace needs none of them)" >&2
      exit 1
    fi
  fi
  "${as_root[@]}" apt-get update -qq
  "${as_root[@]}" apt-get install -y -qq "${missing[@]}"
fi

step "import directions and circles of each library crate (scripts/check_imports.py)"
python3 scripts/check_imports.py --self-test
python3 scripts/check_imports.py

step "cargo fmt --check"
cargo fmt --all -- --check

# Every feature at once: mpi, nccl, wgpu and cuda (the CUDA backend compiles without a GPU: its
# libraries load at run time). This is the compile check of the cuda and nccl features too.
all_features=experiments/mpi,experiments/nccl,experiments/wgpu,experiments/cuda,ringbench-tests/wgpu,ringbench-tests/cuda
step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --locked --workspace --all-targets -- -D warnings
step "cargo clippy with every feature ($all_features)"
cargo clippy --locked --workspace --all-targets --features "$all_features" -- -D warnings

step "cargo doc --workspace --no-deps, warnings as errors (broken links, stray HTML)"
RUSTDOCFLAGS="-D warnings" cargo doc --locked --workspace --no-deps --quiet

status=0
# The tests' features. The use-it-from-your-own-model example (workbench/examples/own_model.rs) is a
# test target too (`test = true`): 4 ranks must give the 1-rank losses, built with these features.
test_features=experiments/mpi,experiments/nccl,experiments/wgpu,ringbench-tests/wgpu
step "cargo test --workspace with the mpi, nccl and wgpu features (MPI tests start 4 processes with
mpirun; the NCCL test checks that a machine without CUDA gets an error, not a panic; the wgpu tests run
on Mesa's software Vulkan device)"
# As root, mpirun needs --allow-run-as-root; the tests pass it and --oversubscribe (4 ranks, 2 cores).
# Without a session, Vulkan's loader warns that XDG_RUNTIME_DIR is unset; give it a directory.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
# A check that cannot run here (a CPU feature, root for the SLURM cluster) appends a line to this
# file (tests/src/skips.rs, scripts/cluster-check.sh); the closing line counts them.
export RINGBENCH_SKIPPED="$PWD/target/skipped.txt"
mkdir -p target && : >"$RINGBENCH_SKIPPED"
# The wide-head check on the software device (~2 minutes) runs once, in the GPU check's dry run below.
cargo test --locked --workspace --no-fail-fast --features "$test_features" \
  -- --skip wgpu_wide_heads_forward_and_backward 2>&1 | tee target/test.log || status=$?

step "the exactness tests and the kernels' unit tests again with each SIMD path forced (RINGBENCH_SIMD=avx512, avx2,
portable: a path this CPU lacks is refused by name, and counted as skipped)"
for level in avx512 avx2 portable; do
  if refused=$(RINGBENCH_SIMD=$level target/debug/ringbench run --kinds 2>&1 >/dev/null); then
    # The same packages and features as the run above, so nothing is built again. The sub-tile
    # crossing test (~1 minute, S up to 1,024 at opt-level 0) runs once, above: the tables run the
    # same row loops.
    RINGBENCH_SIMD=$level cargo test --locked --workspace --no-fail-fast --features "$test_features" \
      --test exactness --test precision -- --skip fused_kernel_across_sub_tiles 2>&1 \
      | tee -a target/test.log || status=1
    RINGBENCH_SIMD=$level cargo test --locked --workspace --no-fail-fast --features "$test_features" \
      --lib -- kernels:: model::elementwise simd:: 2>&1 | tee -a target/test.log || status=1
  else
    echo "$refused"
    echo "exactness with RINGBENCH_SIMD=$level: $refused" >>"$RINGBENCH_SKIPPED"
  fi
done

step "sweeps on a real one-node SLURM cluster: the srun launcher, and sbatch --array=1-3 merged (scripts/cluster-check.sh)"
bash scripts/cluster-check.sh target/debug/ringbench 2>&1 | tee target/cluster-check.log || status=1

step "the GPU check's dry run: its stages, files and comparisons on wgpu at tiny sizes (scripts/gpu-check.sh)"
bash scripts/gpu-check.sh dry-run 2>&1 | tee target/gpu-check-dry-run.log || status=1
grep -h "^test result:" target/gpu-check-dry-run/gpu/*.log >>target/test.log || true

step "the docs: every relative link resolves, README.md within 200 lines, every guide's quick path runs (scripts/check_docs.py)"
python3 scripts/check_docs.py --links || status=1
# With the debug ringbench just built; own-model's quick path is its example, which cargo test ran
# above, and gpu.md's is the dry run above.
python3 scripts/check_docs.py --quick-paths --bin target/debug/ringbench --skip own-model.md,gpu.md || status=1
# Each test binary prints its own summary; add them up into one closing line. A binary that failed to
# build or crashed prints no summary: the exit status still fails the run.
step "done"
skipped=$(sort -u "$RINGBENCH_SKIPPED" | grep -c . || true)
if [ "$skipped" -gt 0 ]; then
  echo "skipped on this machine:"
  sort -u "$RINGBENCH_SKIPPED" | sed 's/^/  /'
fi
awk -v k="$skipped" '/^test result:/ { p += $4; f += $6 } END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, k }' target/test.log
exit "$status"
