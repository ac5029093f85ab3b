#!/usr/bin/env bash
# Peak memory and throughput of `duet convert` on a random-weight 1.1 B-parameter Llama
# (TinyLlama-1.1B shape, 2.2 GB of BF16 safetensors), measured with /usr/bin/time -v.
# A measurement for the release notes, not a CI test (acceptance #5: peak RSS < 1.5 GB).
#
#   converter/bench/measure_rss.sh
#       duet convert DIR --type q4_k_m (TYPE=q8_0 … to change the preset)
#   LLAMA_CPP=/path/to/llama.cpp REF_PYTHON=/path/to/python converter/bench/measure_rss.sh
#       also llama.cpp's route, measured the same way: convert_hf_to_gguf.py --outtype f16
#       (REF_PYTHON needs torch, transformers, numpy, safetensors), then llama-quantize
#       Q4_K_M, built from LLAMA_CPP under target/bench/llama-build (never committed)
#
# Needs /usr/bin/time (apt-get install -y time) and a python3 with numpy ($PYTHON, else
# $DUET_PYTHON, else python3) to make the checkpoint. Everything lands in target/bench/.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
bench=$root/target/bench
py=${PYTHON:-${DUET_PYTHON:-python3}}
type=${TYPE:-q4_k_m}
model=$bench/random-llama-1b
mkdir -p "$bench"

[ -x /usr/bin/time ] || { echo "needs /usr/bin/time: apt-get install -y time" >&2; exit 1; }
[ -s "$model/config.json" ] || "$py" converter/bench/make_random_llama.py "$model"
cargo build --release --bin duet -q

bytes() { stat -c %s "$@" | awk '{s += $1} END {printf "%.0f\n", s}'; }
in_bytes=$(bytes "$model"/*.safetensors)

# measure LABEL OUTPUT INPUT_BYTES CMD...: runs CMD under /usr/bin/time -v, prints one line.
measure() {
  local label=$1 out=$2 inb=$3 log=$bench/time-$1.txt
  shift 3
  rm -f "$out"
  sync
  if ! /usr/bin/time -v "$@" > "$bench/stdout-$label.txt" 2> "$log"; then
    tail -20 "$log" >&2
    echo "$label failed (log: $log)" >&2
    exit 1
  fi
  local outb
  outb=$(bytes "$out")
  awk -v label="$label" -v inb="$inb" -v outb="$outb" -F': ' '
    /Maximum resident set size/ { rss = $2 }
    /Elapsed \(wall clock\)/ { n = split($2, t, ":"); wall = 0; for (i = 1; i <= n; i++) wall = wall * 60 + t[i] }
    /User time/ { user = $2 }
    /System time/ { sys = $2 }
    END {
      printf "%-26s peak RSS %6.0f MiB   wall %6.1f s (user %.1f s, sys %.1f s)   in %6.1f MB/s   out %6.1f MB/s (%.0f MB)\n",
        label, rss / 1024, wall, user, sys, inb / 1e6 / wall, outb / 1e6 / wall, outb / 1e6
    }' "$log"
}

echo "input: $model ($((in_bytes / 1000000)) MB of safetensors), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
out=$bench/random-llama-1b-$type.gguf
measure "duet-$type" "$out" "$in_bytes" "$root/target/release/duet" convert "$model" --type "$type" -q -o "$out"

if [ -n "${LLAMA_CPP:-}" ]; then
  ref_py=${REF_PYTHON:?set REF_PYTHON to a python with torch and transformers for convert_hf_to_gguf.py}
  build=$bench/llama-build
  if [ ! -x "$build/bin/llama-quantize" ]; then
    cmake -S "$LLAMA_CPP" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF > "$bench/llama-cmake.log"
    cmake --build "$build" --target llama-quantize -j"$(nproc)" > "$bench/llama-build.log"
  fi
  f16=$bench/random-llama-1b-llamacpp-f16.gguf
  # convert_hf_to_gguf.py names BPE pre-tokenizers by hashing how they split a test string;
  # it does not know the fixtures' tiny tokenizer, so it is told "gpt-2" (the tokenizer does
  # not change the time or memory of converting the weights).
  measure "llama.cpp-convert-f16" "$f16" "$in_bytes" "$ref_py" -c '
import runpy, sys
ll, model, out = sys.argv[1:4]
sys.path[:0] = [ll, ll + "/gguf-py"]
import conversion.base
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv = ["convert_hf_to_gguf.py", model, "--outtype", "f16", "--outfile", out]
runpy.run_path(ll + "/convert_hf_to_gguf.py", run_name="__main__")
' "$LLAMA_CPP" "$model" "$f16"
  lq=$bench/random-llama-1b-llamacpp-$type.gguf
  measure "llama-quantize-$type" "$lq" "$(bytes "$f16")" "$build/bin/llama-quantize" "$f16" "$lq" "${type^^}" "$(nproc)"
fi
