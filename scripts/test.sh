#!/usr/bin/env bash
# The test command: formatting, lints, every test, and a compile check of the optional features.
# Installs what it needs on a fresh machine (Rust components; apt packages when a test needs them).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  step "installing rustfmt and clippy"
  rustup component add rustfmt clippy
fi

# apt packages: Open MPI (found through pkg-config) and clang (bindgen) for the `mpi` feature and its
# multi-process tests. The SVG figures need no font packages: their text is SVG text.
missing=()
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
command -v mpirun >/dev/null 2>&1 && pkg-config --exists ompi 2>/dev/null || missing+=(libopenmpi-dev openmpi-bin)
command -v clang >/dev/null 2>&1 && ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || missing+=(clang libclang-dev)
if [ ${#missing[@]} -gt 0 ]; then
  step "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}"
fi

step "import circles between the files of each library crate (scripts/import_cycles.py)"
python3 scripts/import_cycles.py

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
step "cargo clippy with the mpi and nccl features"
cargo clippy --workspace --all-targets --features experiments/mpi,experiments/nccl -- -D warnings

step "cargo doc --workspace --no-deps, warnings as errors (broken links, stray HTML)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

step "cargo check --features cuda and --features nccl (need no GPU: CUDA libraries load at run time)"
cargo check -p experiments --features cuda --target-dir target/cuda-check
cargo check -p experiments --features nccl

status=0
step "the use-it-from-your-own-model example (workbench/examples/own_model.rs): 4 ranks must give the
1-rank losses"
cargo run -q -p workbench --example own_model || status=$?

step "cargo test --workspace with the mpi and nccl features (MPI tests start 4 processes with mpirun;
the NCCL test checks that a machine without CUDA gets an error, not a panic)"
# As root, mpirun needs --allow-run-as-root; the tests pass it and --oversubscribe (4 ranks, 2 cores).
cargo test --workspace --no-fail-fast --features experiments/mpi,experiments/nccl 2>&1 | tee target/test.log \
  || status=$?
# Each test binary prints its own summary; add them up into one closing line. A binary that failed to
# build or crashed prints no summary: the exit status still fails the run.
awk '/^test result:/ { p += $4; f += $6 } END { printf "tests: %d passed, %d failed\n", p, f }' target/test.log
exit "$status"
