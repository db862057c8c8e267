#!/usr/bin/env bash
# eval-lines with the KV cache and without it (the whole sequence recomputed per token), on 1 and 4
# ranks, every registered strategy (`ringbench run --strategies`): the replies must be the same, case
# for case. Prints one line a run (its
# seconds and its replies' MD5) and exits 1 if any run's replies differ from the first's.
#   bash scripts/check-decode-replies.sh CHECKPOINT CASES.jsonl [PER_LINE_COUNT]
# PER_LINE_COUNT (default 10): the first that many cases of each line count are decoded.
set -euo pipefail
cd "$(dirname "$0")/.."
checkpoint=${1:?checkpoint directory}
cases=${2:?cases JSONL}
per=${3:-10}
bin=target/release/ringbench
[ -x "$bin" ] || cargo build --release --locked --bin ringbench
work=$(mktemp -d)
python3 - "$cases" "$per" > "$work/cases.jsonl" <<'PY'
import json, sys, collections
seen = collections.Counter()
for line in open(sys.argv[1]):
    n = json.loads(line)["num_lines"]
    if seen[n] < int(sys.argv[2]):
        seen[n] += 1
        sys.stdout.write(line)
PY
echo "$(wc -l < "$work/cases.jsonl") cases ($per per line count) of $cases, checkpoint $checkpoint"
first=""
status=0
[ -n "$("$bin" run --strategies)" ] || { echo "ringbench run --strategies listed none" >&2; exit 1; }
for ranks in 1 4; do
  for strategy in $("$bin" run --strategies); do
    for mode in cache no-cache; do
      flag=()
      [ "$mode" = no-cache ] && flag=(--no-cache)
      name="$ranks-$strategy-$mode"
      start=$(date +%s.%N)
      "$bin" eval-lines --checkpoint "$checkpoint" --cases "$work/cases.jsonl" --ranks "$ranks" \
        --strategy "$strategy" "${flag[@]}" --out "$work/$name.csv" --replies "$work/$name.jsonl" \
        > "$work/$name.log" 2>&1
      seconds=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$(date +%s.%N)")
      sum=$(md5sum < "$work/$name.jsonl" | cut -d' ' -f1)
      first=${first:-$sum}
      same=$([ "$sum" = "$first" ] && echo same || echo DIFFERENT)
      [ "$same" = same ] || status=1
      printf '%-28s %7s s  replies %s  %s\n' "ranks=$ranks $strategy $mode" "$seconds" "$sum" "$same"
    done
  done
done
rm -rf "$work"
exit "$status"
