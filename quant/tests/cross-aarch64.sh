#!/usr/bin/env bash
# Runs the duet-quant tests built for aarch64 under qemu-user, so the NEON dot kernels
# (quant/src/dot/neon/) are tested on an x86-64 machine:
#
#   bash quant/tests/cross-aarch64.sh [extra `cargo test` arguments, e.g. --lib dot::]
#
# It runs the tests once per emulated CPU, because the kernel set is chosen at run time:
#   QEMU_CPU=max         has dotprod: simd_kernels() is "neon+dotprod"; the tests that go
#                        through dot::neon::paths() check the baseline "neon" set as well.
#   QEMU_CPU=cortex-a72  Armv8.0, no dotprod (nor fp16): simd_kernels() is "neon".
#
# Setup, idempotent: the rustup target aarch64-unknown-linux-gnu, and the apt packages
# qemu-user, gcc-aarch64-linux-gnu (the linker) and libc6-dev-arm64-cross (the target's libc,
# also the sysroot qemu loads from), installed only when missing and only as root. When the
# target cannot be added or a package cannot be had, it prints "SKIPPED cross-aarch64: why",
# appends the reason to $DUET_SKIP_LOG if that is set (as tests/run-all.sh's skips do), and
# exits 0 — unless $DUET_REQUIRE_ORACLES is set (the test command sets it), when it fails.
# A test failure exits non-zero.
#
# It builds into its own target directory ($DUET_CROSS_TARGET_DIR, default
# target/cross-aarch64), so it never waits on, or invalidates, a native build.
# On an aarch64 host it simply runs the tests natively.
set -euo pipefail

cd "$(dirname "$0")/../.."
root=$(pwd)
triple=aarch64-unknown-linux-gnu
note() { printf '\n== %s\n' "$*"; }
source "$root/tests/support/skip.sh"
skip() { skip_script cross-aarch64 "the NEON kernels must be tested" "$@"; }

if [ "$(uname -m)" = aarch64 ] || [ "$(uname -m)" = arm64 ]; then
  note "aarch64 host: cargo test --release -p duet-quant $*"
  exec cargo test --release -p duet-quant "$@"
fi

# --- Rust target ---------------------------------------------------------------------------
command -v rustup >/dev/null || skip "rustup not found, cannot add the $triple target"
if ! rustup target list --installed 2>/dev/null | grep -qx "$triple"; then
  note "rustup target add $triple"
  rustup target add "$triple" || skip "rustup cannot add the $triple target"
fi

# --- cross linker, target libc, qemu ---------------------------------------------------------
sysroot=/usr/aarch64-linux-gnu
find_qemu() { command -v qemu-aarch64 || command -v qemu-aarch64-static || true; }
missing=()
[ -n "$(find_qemu)" ] || missing+=(qemu-user)
command -v aarch64-linux-gnu-gcc >/dev/null || missing+=(gcc-aarch64-linux-gnu)
[ -e "$sysroot/lib/libc.so" ] && [ -e "$sysroot/lib/ld-linux-aarch64.so.1" ] || missing+=(libc6-dev-arm64-cross)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    skip "missing ${missing[*]} and cannot install them (needs root and apt-get)"
  fi
  note "apt-get install ${missing[*]}"
  # Wait for a concurrent apt/dpkg run rather than failing on its lock.
  apt_opts=(-qq -o DPkg::Lock::Timeout=600)
  if ! { apt-get "${apt_opts[@]}" update && DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y \
           --no-install-recommends "${missing[@]}" >/dev/null; }; then
    skip "apt-get could not install ${missing[*]}"
  fi
fi
qemu=$(find_qemu)
[ -n "$qemu" ] || skip "no qemu-aarch64 after installing qemu-user"

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER="${CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER:-aarch64-linux-gnu-gcc}"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="${CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER:-$qemu -L $sysroot}"
export CC_aarch64_unknown_linux_gnu="${CC_aarch64_unknown_linux_gnu:-aarch64-linux-gnu-gcc}"
export CARGO_TARGET_DIR="${DUET_CROSS_TARGET_DIR:-$root/target/cross-aarch64}"

# --- the tests, once per CPU model -----------------------------------------------------------
for cpu in max cortex-a72; do
  note "QEMU_CPU=$cpu cargo test --release -p duet-quant --target $triple $*"
  QEMU_CPU=$cpu cargo test --release -p duet-quant --target "$triple" "$@"
done
