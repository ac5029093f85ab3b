#!/usr/bin/env bash
# Builds the browser runtime (runtime/web: wasm32-unknown-unknown, wasm-bindgen) into
# target/web/pkg, or the folder given: duet_web.js and duet_web_bg.wasm, which `duet web
# --pkg` serves. Installs what it needs when missing: the wasm32 target (rustup) and
# wasm-bindgen-cli at the version of the wasm-bindgen crate (cargo install), and fails when
# it cannot.
#
#   bash runtime/web/build.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-target/web/pkg}
# The wasm-bindgen crate's version (runtime/web/Cargo.toml pins it with "="): the CLI must
# be the same version, or the JavaScript it writes does not match the module.
version=$(sed -n 's/^wasm-bindgen = "=\(.*\)"$/\1/p' runtime/web/Cargo.toml)
[ -n "$version" ] || { echo "error: no pinned wasm-bindgen version in runtime/web/Cargo.toml" >&2; exit 1; }
if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  echo "== rustup target add wasm32-unknown-unknown" >&2
  rustup target add wasm32-unknown-unknown
fi
bindgen=${CARGO_HOME:-$HOME/.cargo}/bin/wasm-bindgen
if [ "$("$bindgen" --version 2>/dev/null)" != "wasm-bindgen $version" ]; then
  echo "== cargo install wasm-bindgen-cli $version (a few minutes, once)" >&2
  cargo install --force wasm-bindgen-cli --version "$version"
fi
cargo build --release --locked --target wasm32-unknown-unknown -p duet-web
mkdir -p "$out"
"$bindgen" --target web --no-typescript --out-dir "$out" target/wasm32-unknown-unknown/release/duet_web.wasm
ls -l "$out"
