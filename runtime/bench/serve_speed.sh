#!/usr/bin/env bash
# duet serve against llama-server (llama.cpp 0c1e57098, built from the same PyPI sdist as the
# other benchmarks) under the same load, runtime/bench/serve_load.py: SmolLM2-135M-Instruct
# Q4_1, CPU, THREADS threads, STREAMS slots of CTX tokens each; greedy, ignore_eos, TOKENS
# tokens per reply. The two servers alternate for PAIRS rounds (each runs the load's ROUNDS
# rounds); the table shows the medians over all of them.
#
#   runtime/bench/serve_speed.sh                      # STREAMS=8 TOKENS=128 THREADS=2
#   DUET_ARGS='--cpu-acts q8' runtime/bench/serve_speed.sh   # extra flags for duet serve
#
# Columns: one stream alone; STREAMS concurrent streams (aggregate tokens/s) and their ratio
# to one stream; time to first token on an idle server and while STREAMS-1 others stream.
# llama-server keeps its defaults (continuous batching, prompt cache on: it reuses the
# identical prompt's cached prefix, which duet does not yet).
set -euo pipefail
cd "$(dirname "$0")/../.."
source runtime/bench/common.sh
STREAMS=${STREAMS:-8}
TOKENS=${TOKENS:-128}
ROUNDS=${ROUNDS:-3}
PAIRS=${PAIRS:-2}
THREADS=${THREADS:-2}
CTX=${CTX:-1024}
PORT=${PORT:-18190}
DUET_ARGS=${DUET_ARGS:-}
smol=$(bench_smollm2)
duet=$(bench_duet serve)
bin=$(bench_llama_cpp llama-server)
url=http://127.0.0.1:$PORT
results=$(mktemp)
trap 'rm -f "$results"; kill $(jobs -p) 2>/dev/null || true' EXIT

measure() { # NAME COMMAND...
  local name=$1
  shift
  "$@" >"$BENCH/serve-$name.log" 2>&1 &
  local pid=$! line
  # (Waits up to 2 minutes for the server; set -e ends the script if it never comes up.)
  line=$(python3 runtime/bench/serve_load.py "$url" --wait 120 --streams "$STREAMS" --tokens "$TOKENS" --rounds "$ROUNDS")
  echo "$name $line" >>"$results"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}

for _ in $(seq 1 "$PAIRS"); do
  measure duet "$duet" serve -m "$smol" --device cpu -t "$THREADS" -c "$CTX" --parallel "$STREAMS" \
    --max-queue 64 --port "$PORT" -q $DUET_ARGS
  measure llama.cpp "$bin/llama-server" -m "$smol" -t "$THREADS" -np "$STREAMS" -c $((CTX * STREAMS)) \
    --host 127.0.0.1 --port "$PORT"
done

echo "Machine: $(bench_machine). duet $(bench_duet_label), llama.cpp 0c1e57098."
echo "duet serve flags: ${DUET_ARGS:-(defaults)}."
echo "SmolLM2-135M-Instruct Q4_1, CPU, $THREADS threads, $STREAMS slots × $CTX tokens, $TOKENS tokens per reply, greedy; medians of $PAIRS × $ROUNDS rounds."
echo
python3 - "$results" "$STREAMS" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, js = line.split(" ", 1)
    rows.setdefault(name, []).append(json.loads(js))
n = sys.argv[2]
print(f"| server | 1 stream t/s | {n} streams t/s (aggregate) | {n} / 1 | TTFT idle ms | TTFT with {int(n) - 1} streaming ms | busy / idle |")
print("|---|---|---|---|---|---|---|")
med = {}
for name, runs in rows.items():
    m = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    med[name] = m
    print(f"| {name} | {m['single_tps']:.1f} | {m['aggregate_tps']:.1f} | {m['aggregate_tps'] / m['single_tps']:.2f}× | "
          f"{m['ttft_idle_ms']:.0f} | {m['ttft_busy_ms']:.0f} | {m['ttft_busy_ms'] / m['ttft_idle_ms']:.2f}× |")
if "duet" in med and "llama.cpp" in med:
    print(f"\nduet / llama-server aggregate: {med['duet']['aggregate_tps'] / med['llama.cpp']['aggregate_tps']:.2f}×")
PY
