#!/usr/bin/env bash
# Times the ablation spec on threads and with every point a job of processes under mpirun, in one
# run on this machine, and writes results/cluster/threads_vs_mpirun.{csv,md}: per point, both
# fwd+bwd times and their ratio, and whether every exact column agrees.
#
#   bash scripts/threads-vs-mpirun.sh     # ~1 minute on 2 cores; builds ringbench with --features mpi
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --features experiments/mpi --bin ringbench
bin=target/release/ringbench
spec=experiments/ablation_quick.toml
out=results/cluster
rm -rf "$out/threads" "$out/mpirun" && mkdir -p "$out"
t0=$(date +%s.%N)
"$bin" run "$spec" --results "$out/threads" --force >/dev/null
t1=$(date +%s.%N)
"$bin" run "$spec" --results "$out/mpirun" --launcher mpirun --force >/dev/null
t2=$(date +%s.%N)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
python3 scripts/threads_vs_mpirun.py "$out" "$cpu" "$(nproc)" "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t1" | bc)"
