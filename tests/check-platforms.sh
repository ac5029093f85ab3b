#!/usr/bin/env bash
# Compiles duet (every crate, library and program) for the platforms the CI
# machine cannot run: macOS on Apple silicon (the Metal backend) and Windows (DX12), and the
# runtime for WebAssembly (wasm32-unknown-unknown, wgpu's WebGPU backend: the browser build's
# base), with warnings as errors, so that code which only builds on Linux (a Unix-only API,
# a C dependency, a platform's dead code) fails here rather than on a user's machine:
#
#   bash tests/check-platforms.sh
#
# `cargo check` needs the targets' standard libraries (rustup target add) but no linker or
# SDK; nothing is linked or run. Oniguruma, the tokenizer's regex library in the native
# program and its one C dependency, is left out (the default "onig" feature off): the
# regexes then come from fancy-regex, as in the browser. The kernels themselves are translated for Metal and DX12 by
# shaders/tests/backends.rs. It builds into its own target directory
# ($DUET_PLATFORMS_TARGET_DIR, default target/check-platforms), so it never invalidates the
# native build. When rustup is missing or cannot add a target it prints
# "SKIPPED check-platforms: why", appends the reason to $DUET_SKIP_LOG if that is set, and
# exits 0 — unless $DUET_REQUIRE_ORACLES is set (the test command sets it), when it fails.
set -euo pipefail

cd "$(dirname "$0")/.."
targets=(aarch64-apple-darwin x86_64-pc-windows-msvc wasm32-unknown-unknown)
note() { printf '\n== %s\n' "$*"; }
source tests/support/skip.sh
skip() { skip_script check-platforms "macOS, Windows and WebAssembly must be checked" "$@"; }

command -v rustup >/dev/null || skip "rustup not found, cannot add the ${targets[*]} targets"
# (The list is read whole first: `grep -q` would stop reading early, and under pipefail
# rustup's broken pipe would count as "not installed".)
installed=$(rustup target list --installed 2>/dev/null || true)
for t in "${targets[@]}"; do
  if ! grep -x "$t" <<<"$installed" >/dev/null; then
    note "rustup target add $t"
    rustup target add "$t" || skip "rustup cannot add the $t target"
  fi
done

export CARGO_TARGET_DIR="${DUET_PLATFORMS_TARGET_DIR:-$(pwd)/target/check-platforms}"
# Without the default "onig" feature (Oniguruma is C, and there is no C cross-compiler for
# these targets here): the tokenizer's regexes then use fancy-regex, the only difference.
for t in aarch64-apple-darwin x86_64-pc-windows-msvc; do
  note "cargo check --target $t --workspace --no-default-features --features gpu (warnings are errors)"
  RUSTFLAGS="-D warnings" cargo check --release --locked --target "$t" --workspace --no-default-features \
    --features duet-runtime/gpu
done
# In a browser: the runtime and its wasm-bindgen entry points (the CLI, its server and the
# converter stay native).
note "cargo check --target wasm32-unknown-unknown -p duet-runtime -p duet-web --no-default-features --features gpu (warnings are errors)"
RUSTFLAGS="-D warnings" cargo check --release --locked --target wasm32-unknown-unknown -p duet-runtime -p duet-web \
  --no-default-features --features duet-runtime/gpu
