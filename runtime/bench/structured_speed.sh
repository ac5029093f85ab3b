#!/usr/bin/env bash
# Structured output's cost: `duet run` decode speed with a JSON schema
# (runtime/bench/structured/story.schema.json, a long string field so that every one of the
# TOKENS tokens is drawn under the mask) against the same run unconstrained, on
# SmolLM2-135M-Instruct Q4_1, CPU, THREADS threads. The two alternate for PAIRS rounds, at
# temperature 0 and 0.8 (seed 1); the table shows the medians of the generation tokens/s that
# `duet run` prints and their ratio.
#
#   runtime/bench/structured_speed.sh          # PAIRS=7 TOKENS=256 THREADS=2
set -euo pipefail
cd "$(dirname "$0")/../.."
source runtime/bench/common.sh
PAIRS=${PAIRS:-7}
TOKENS=${TOKENS:-256}
THREADS=${THREADS:-2}
smol=$(bench_smollm2)
duet=$(bench_duet structured)
schema=runtime/bench/structured/story.schema.json
prompt='Once upon a time, there was a dragon who'

gen_rate() { # extra flags... -> generation tok/s of one run
  "$duet" run -m "$smol" --device cpu -t "$THREADS" -p "$prompt" -n "$TOKENS" --no-echo -s 1 "$@" 2>&1 >/dev/null |
    sed -n 's/.*generation: \([0-9]*\) tokens, \([0-9.]*\) tok\/s.*/\1 \2/p' | tail -1
}

echo "# Structured output: decode with a JSON schema against plain decode"
echo
bw=$("$duet" bench -m "$smol" -p 0 -n 1 -r 1 -t "$THREADS" --device cpu --bandwidth 2>/dev/null |
  sed -n 's/^memory read bandwidth: \([0-9.]*\) GB.*/\1/p')
echo "$(date -u +%Y-%m-%d), duet $(bench_duet_label); $(bench_machine); memory read bandwidth $bw GB/s"
echo "SmolLM2-135M-Instruct Q4_1, CPU, $THREADS threads, $TOKENS tokens a run, $PAIRS alternating pairs; medians of generation tok/s"
echo
echo "| temperature | plain tok/s | json_schema tok/s | ratio |"
echo "|---|---|---|---|"
for temp in 0 0.8; do
  plain=()
  constrained=()
  for _ in $(seq 1 "$PAIRS"); do
    read -r n rate <<<"$(gen_rate --temp "$temp")"
    [ "$n" = "$TOKENS" ] || { echo "error: the plain run made $n tokens, not $TOKENS" >&2; exit 1; }
    plain+=("$rate")
    read -r n rate <<<"$(gen_rate --temp "$temp" --json-schema "$schema")"
    [ "$n" = "$TOKENS" ] || { echo "error: the constrained run made $n tokens, not $TOKENS" >&2; exit 1; }
    constrained+=("$rate")
  done
  p=$(echo "${plain[*]}" | bench_median)
  c=$(echo "${constrained[*]}" | bench_median)
  echo "| $temp | $p | $c | $(bench_ratio "$c" "$p") |"
  echo "raw plain: ${plain[*]}; json_schema: ${constrained[*]}" >&2
done
