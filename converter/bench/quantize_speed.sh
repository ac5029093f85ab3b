#!/usr/bin/env bash
# `duet convert` beside `llama-quantize` re-quantizing the same F16 GGUF, same run: a
# random-weight 1.1B Llama (TinyLlama shape, converter/bench/make_random_llama.py, the file
# runtime/bench/cpu_speed.sh makes) to Q4_0, Q4_K_M, Q6_K and Q8_0. The two tools alternate
# within each round (llama-quantize with as many threads as cores, duet with its default,
# all cores); wall time and peak RSS from /usr/bin/time -v, medians over rounds. The two
# outputs' tensors are compared byte for byte with gguf-py (the metadata differ).
#
#   converter/bench/quantize_speed.sh              # 2 rounds
#   ROUNDS=3 TYPES="q6_k" converter/bench/quantize_speed.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source runtime/bench/common.sh
[ -x /usr/bin/time ] || { echo "needs /usr/bin/time: apt-get install -y time" >&2; exit 1; }

duet=$(bench_duet quantize-speed)
bin=$(bench_llama_cpp llama-quantize)
rounds=${ROUNDS:-2}
types=(${TYPES:-q4_0 q4_k_m q6_k q8_0})
rand=$BENCH/random-llama-1.1b
if [ ! -s "$rand.f16.gguf" ]; then
  [ -f "$rand/config.json" ] || bench_random_llama "$rand" --dtype f16 >&2
  "$duet" convert "$rand" --type f16 -o "$rand.f16.gguf" -q
fi
threads=$(nproc)
py=${DUET_PYTHON:-$PWD/target/oracle-venv/bin/python}  # gguf-py, as tests/run-all.sh installs it

# run LOG CMD... -> "wall_seconds peak_rss_mib"
run() {
  local log=$1
  shift
  sync
  /usr/bin/time -v "$@" > /dev/null 2> "$log" || { tail -20 "$log" >&2; exit 1; }
  awk -F': ' '/Elapsed \(wall clock\)/ { n = split($2, t, ":"); w = 0; for (i = 1; i <= n; i++) w = w * 60 + t[i] }
    /Maximum resident set size/ { r = $2 / 1024 } END { printf "%.2f %.0f\n", w, r }' "$log"
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "Machine: $(bench_machine). duet $(git rev-parse --short HEAD), llama.cpp 0c1e57098; $(basename "$rand.f16.gguf"), $rounds rounds, $threads threads."
echo
echo "| type | llama-quantize s | duet s | duet speed / llama-quantize | llama-quantize peak RSS MiB | duet peak RSS MiB | tensor data identical |"
echo "|---|---|---|---|---|---|---|"
for t in "${types[@]}"; do
  lw="" dw="" lr="" dr=""
  for ((r = 0; r < rounds; r++)); do
    read -r w m < <(run "$BENCH/time-lq-$t.txt" "$bin/llama-quantize" "$rand.f16.gguf" "$BENCH/lq-$t.gguf" "${t^^}" "$threads")
    lw="$lw $w" lr="$lr $m"
    read -r w m < <(run "$BENCH/time-duet-$t.txt" "$duet" convert "$rand.f16.gguf" --type "$t" -q -o "$BENCH/duet-$t.gguf")
    dw="$dw $w" dr="$dr $m"
  done
  same=$("$py" - "$BENCH/lq-$t.gguf" "$BENCH/duet-$t.gguf" <<'PY'
import sys
from gguf import GGUFReader
a, b = (GGUFReader(p) for p in sys.argv[1:3])
ta = {t.name: t for t in a.tensors}
tb = {t.name: t for t in b.tensors}
diff = [n for n in ta if n not in tb or ta[n].tensor_type != tb[n].tensor_type
        or ta[n].data.tobytes() != tb[n].data.tobytes()]
print("yes" if not diff and len(ta) == len(tb) else f"no ({len(diff)} tensors differ, e.g. {diff[:2]})")
PY
)
  lw=$(echo "$lw" | median) dw=$(echo "$dw" | median) lr=$(echo "$lr" | median) dr=$(echo "$dr" | median)
  echo "| $t | $lw | $dw | $(awk -v a="$lw" -v b="$dw" 'BEGIN { printf "%.2f×", a / b }') | $lr | $dr | $same |"
  rm -f "$BENCH/lq-$t.gguf" "$BENCH/duet-$t.gguf"
done
