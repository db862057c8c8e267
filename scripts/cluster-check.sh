#!/usr/bin/env bash
# Runs a sweep on a real one-node SLURM cluster: the srun launcher, then a 3-task job array of
# scripts/slurm-sweep.sbatch merged with --merge, each checked against the same sweep on threads.
#
#   bash scripts/cluster-check.sh [RINGBENCH]    # default target/release/ringbench (built with --features mpi)
#
# Starts the cluster (scripts/slurm-local.sh) and stops it on exit. Needs root and the Debian packages
# slurm-wlm and munge (scripts/test.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
if ((EUID != 0)); then
  why="the one-node cluster's daemons run as root (SlurmUser=root); run as root"
  echo "cluster check: skipped: $why" >&2
  # Counted where the test command adds up its total (tests/src/skips.rs keeps the same list).
  if [ -n "${RINGBENCH_SKIPPED:-}" ]; then echo "scripts/cluster-check.sh: $why" >>"$RINGBENCH_SKIPPED"; fi
  exit 0
fi
ringbench=$(realpath "${1:-target/release/ringbench}")
spec=experiments/cluster_check.toml
out=$(realpath -m target/cluster-check)
rm -rf "$out" && mkdir -p "$out"

bash scripts/slurm-local.sh start "$out/slurm" >/dev/null
trap 'bash scripts/slurm-local.sh stop "$out/slurm" >/dev/null' EXIT
source "$out/slurm/env.sh"

echo "== the sweep on threads"
"$ringbench" run "$spec" --results "$out/threads" >/dev/null
echo "== the sweep under srun (each point a job of its ranks' processes)"
"$ringbench" run "$spec" --results "$out/srun" --launcher srun >/dev/null
echo "== sbatch --array=1-3 scripts/slurm-sweep.sbatch, then --merge"
SPEC=$spec OUT=$out/array RINGBENCH=$ringbench \
  sbatch --wait --array=1-3 --output="$out/array-%a.log" scripts/slurm-sweep.sbatch
"$ringbench" run "$spec" --merge "$out"/array/cluster_check.shard-{1,2,3}-of-3 --results "$out/merged" >/dev/null

# Every table has the thread run's keys in order and its exact columns; transport says mpi.
python3 - "$out" <<'PY'
import csv, sys
out = sys.argv[1]
read = lambda d: list(csv.DictReader(open(f"{out}/{d}/cluster_check/results.csv")))
exact = ["strategy", "forward", "backward", "ranks", "seq_len", "causal", "kv_heads", "kernel",
         "status", "padded_len", "bytes_per_rank", "messages_per_rank", "host_device_bytes_per_call"]
threads = read("threads")
assert len(threads) == 6, len(threads)
for name in ["srun", "merged"]:
    rows = read(name)
    assert len(rows) == len(threads), (name, len(rows))
    for a, b in zip(threads, rows):
        for c in exact:
            assert a[c] == b[c], (name, c, a[c], b[c])
        assert b["transport"] == "mpi", (name, b["transport"])
        assert float(b["max_rel_error"]) <= 1e-5, (name, b["max_rel_error"])
    print(f"{name}: {len(rows)} rows, the thread run's exact columns, transport mpi")
PY
echo "cluster check: ok"
