#!/usr/bin/env bash
# Regenerates quant/tests/golden/golden.bin from nothing: downloads llama.cpp (vendored in the
# PyPI sdist of llama-cpp-python 0.3.36, llama.cpp commit 0c1e57098), builds only the
# ggml-base library with cmake from a venv, compiles harness.c against it and runs
# make_golden.py. See README.md.
#
#   bash quant/tests/golden/make_golden.sh
#
# Optional environment, to reuse what is already on a machine:
#   GOLDEN_WORK  scratch folder (default <repo>/target/golden-work, ignored by git)
#   PYTHON       a python3 that has gguf==0.19.0 and numpy (and cmake next to it or on PATH)
#   LLAMA_CPP    a llama.cpp tree from that sdist; its build-base/ is reused if it already
#                holds libggml-base.so built with acceptable flags (checked below)
#   GOLDEN_OUT   where to write (default: golden.bin next to this script)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
work=${GOLDEN_WORK:-$repo/target/golden-work}
mkdir -p "$work"
work=$(cd "$work" && pwd)
say() { printf '== %s\n' "$*"; }

# --- 1. Python with cmake, gguf-py and numpy -------------------------------------------------
if [ -z "${PYTHON:-}" ]; then
  if [ ! -x "$work/venv/bin/python" ]; then
    say "creating $work/venv (cmake, gguf==0.19.0, numpy)"
    python3 -m venv "$work/venv"
  fi
  "$work/venv/bin/pip" install -q --disable-pip-version-check cmake gguf==0.19.0 numpy
  PYTHON=$work/venv/bin/python
fi
CMAKE=$(dirname "$PYTHON")/cmake
[ -x "$CMAKE" ] || CMAKE=$(command -v cmake) || { echo "no cmake (pip install cmake)" >&2; exit 1; }
"$PYTHON" -c 'import gguf, numpy' || { echo "$PYTHON lacks gguf/numpy" >&2; exit 1; }

# --- 2. llama.cpp source ----------------------------------------------------------------------
if [ -z "${LLAMA_CPP:-}" ]; then
  sdist=$work/llama_cpp_python-0.3.36.tar.gz
  if [ ! -s "$sdist" ]; then
    say "downloading the llama-cpp-python 0.3.36 sdist"
    "$PYTHON" -m pip download -q --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
      llama-cpp-python==0.3.36 -d "$work"
  fi
  if [ ! -d "$work/llama_cpp_python-0.3.36/vendor/llama.cpp/ggml" ]; then
    tar -xzf "$sdist" -C "$work"
  fi
  LLAMA_CPP=$work/llama_cpp_python-0.3.36/vendor/llama.cpp
fi
commit=0c1e57098
if command -v git >/dev/null && git -C "$LLAMA_CPP" rev-parse HEAD >/dev/null 2>&1; then
  commit=$(git -C "$LLAMA_CPP" rev-parse HEAD)
  case $commit in 0c1e57098*) ;; *) echo "llama.cpp is at $commit, expected 0c1e57098" >&2; exit 1 ;; esac
fi

# --- 3. ggml-base ---------------------------------------------------------------------------
# GGML_NATIVE=OFF: no -march=native. -ffp-contract=off: no fused multiply-add even where the
# baseline ISA has one (aarch64); duet's Rust never fuses, and neither must the oracle.
build=$LLAMA_CPP/build-base
lib=$build/bin/libggml-base.so
if [ ! -e "$lib" ]; then
  say "building ggml-base in $build"
  "$CMAKE" -S "$LLAMA_CPP" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
    -DCMAKE_C_FLAGS=-ffp-contract=off -DCMAKE_CXX_FLAGS=-ffp-contract=off \
    -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF >/dev/null
  "$CMAKE" --build "$build" --target ggml-base -j "$(nproc)" >/dev/null
fi
flags=$build/ggml/src/CMakeFiles/ggml-base.dir/flags.make
c_flags=$(sed -n 's/^C_FLAGS = //p' "$flags")
# Refuse an oracle compiled for a specific CPU or with value-changing float options.
if grep -Eq -- '-march=|-mcpu=|-mfma|-mavx|-mf16c|-ffast-math|-Ofast|-funsafe-math|-ffp-contract=fast' <<<"$c_flags"; then
  echo "ggml-base was built with $c_flags: rebuild it with GGML_NATIVE=OFF and no -march/-mfma/-ffast-math" >&2
  exit 1
fi
fma=unchecked
if command -v objdump >/dev/null; then
  fma=$(objdump -d "$lib" | grep -cE $'\t(vfn?m(add|sub)[0-9]{3}[sp][sd]|fn?m(add|sub))[ \t]' || true)
  if [ "$fma" != 0 ]; then
    echo "libggml-base.so contains $fma fused multiply-add instructions: rebuild with -ffp-contract=off" >&2
    exit 1
  fi
fi

# --- 4. harness -------------------------------------------------------------------------------
say "compiling harness.c"
cc -std=c11 -O2 -Wall -Wextra -I"$LLAMA_CPP/ggml/include" -I"$LLAMA_CPP/ggml/src" "$here/harness.c" \
  -o "$work/harness" -L"$build/bin" -lggml-base -Wl,-rpath,"$build/bin"

# --- 5. vectors -------------------------------------------------------------------------------
out=${GOLDEN_OUT:-$here/golden.bin}
say "generating $out"
"$PYTHON" "$here/make_golden.py" --harness "$work/harness" --out "$out" \
  --meta "llama_cpp=ggml-org/llama.cpp $commit (vendored in llama-cpp-python 0.3.36 sdist)" \
  --meta "ggml_base_c_flags=$c_flags" \
  --meta "ggml_base_fma_instructions=$fma" \
  --meta "compiler=$(cc --version | head -n1)" \
  --meta "machine=$(uname -m)"
