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

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo check --features cuda (compiles the optional CUDA backend; needs no GPU)"
cargo check -p experiments --features cuda --target-dir target/cuda-check

step "cargo test --workspace"
cargo test --workspace 2>&1 | tee target/test.log
# Each test binary prints its own summary; add them up into one closing line.
awk '/^test result:/ { p += $4; f += $6 } END { printf "tests: %d passed, %d failed\n", p, f }' target/test.log
