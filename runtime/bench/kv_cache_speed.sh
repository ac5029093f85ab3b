#!/usr/bin/env bash
# Decode speed at depth 4,096 with each K/V cache type against f16, CPU backend, 2 threads,
# and the bytes each cache takes at 4,096 positions: docs/kv-cache-formats.md's speed and memory tables.
#
#   runtime/bench/kv_cache_speed.sh            # SmolLM2-135M and the reference DIFF model
#   ROUNDS=3 runtime/bench/kv_cache_speed.sh   # rounds of the alternation (default 2)
#
# `duet bench -c 4128 -d 4096 -p 0 -n 32 -r 3 -t 2 --device cpu` per cache type; the types
# alternate within each round so they share the machine's noise; the table gives the
# median over rounds of each run's median tokens/s and the ratio to f16. The cache bytes
# come from `duet bench -c 4096` (everything included: scales, offsets, the f16 window).
set -euo pipefail
cd "$(dirname "$0")/../.."
source runtime/bench/common.sh

duet=$(bench_duet kv-speed)
smol=$(bench_smollm2)
[ -s "$BENCH/diff-ref.f16.gguf" ] || "$duet" convert models/diff-ref --type f16 -o "$BENCH/diff-ref.f16.gguf" -q
rounds=${ROUNDS:-2}
configs=("f16 f16" "q8 q8" "q8c q8r" "q6c q6r" "q4 q4" "q4c q4r")

tps() { # model k v -> median t/s of one `duet bench` run
  "$duet" bench -m "$1" -c 4128 -d 4096 -p 0 -n 32 -r 3 -t 2 --device cpu --cache-type-k "$2" --cache-type-v "$3" 2>/dev/null \
    | bench_duet_cell "t/s" "^tg32"
}
kv_bytes() { # model k v -> "MiB (ratio× f16)" at 4,096 positions
  "$duet" bench -m "$1" -c 4096 -p 1 -n 0 -r 1 -t 2 --device cpu --cache-type-k "$2" --cache-type-v "$3" 2>/dev/null \
    | bench_duet_cell "KV cache" "^pp1$" | sed 's/^.*, //'
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "Machine: $(bench_machine). duet $(bench_duet_label)."
echo
echo "| model | K / V cache | KV cache at 4,096 positions | tg32 @ d4096 (t/s) | vs f16 |"
echo "|---|---|---|---|---|"
for model in "$smol" "$BENCH/diff-ref.f16.gguf"; do
  declare -A runs=()
  for ((r = 0; r < rounds; r++)); do
    for c in "${configs[@]}"; do
      set -- $c
      runs[$c]="${runs[$c]:-} $(tps "$model" "$1" "$2")"
    done
  done
  base=$(echo "${runs["f16 f16"]}" | tr ' ' '\n' | grep . | median)
  for c in "${configs[@]}"; do
    set -- $c
    m=$(echo "${runs[$c]}" | tr ' ' '\n' | grep . | median)
    ratio=$(awk -v a="$m" -v b="$base" 'BEGIN { printf "%.2f×", a / b }')
    echo "| $(basename "$model" .gguf) | $1 / $2 | $(kv_bytes "$model" "$1" "$2") | $m (runs:${runs[$c]}) | $ratio |"
  done
  unset runs
done
