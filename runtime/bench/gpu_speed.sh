#!/usr/bin/env bash
# duet's GPU backend beside llama.cpp's Vulkan backend on the same card and the same GGUF
# files, and the GPU tests on that card (not lavapipe). In two steps, because the machines
# with a GPU that this project borrows have no Rust toolchain and no network:
#
#   runtime/bench/gpu_speed.sh prepare   # here: builds into .gpu-carry/ (git-ignored, < 64 MiB)
#   runtime/bench/gpu_speed.sh run       # on the GPU machine, from the repository root
#
# prepare (x86-64 Debian/Ubuntu with cargo; ~40 min on 2 cores the first time):
#   * duet (release) and the test binaries that use the GPU, stripped;
#   * llama-bench with the Vulkan backend, from the PyPI sdist of llama-cpp-python 0.3.36
#     (llama.cpp 0c1e57098, runtime/bench/common.sh), CPU part AVX2 so that it runs on any
#     x86-64 host. Its shaders are compiled with glslc 2025.2 and the Vulkan 1.4.309 headers
#     of Debian 13 (unpacked under target/bench/vulkan-tools and run through their own
#     loader): an older glslc (Debian 12's 2023.2) lacks GL_KHR_cooperative_matrix,
#     GL_NV_cooperative_matrix2 and GL_EXT_integer_dot_product, and llama.cpp would then
#     build its slow fallback kernels;
#   * the Vulkan loader (libvulkan1 and the GL dispatch libraries the NVIDIA driver's ICD
#     needs) as .deb files, for a machine image without one.
# run (the GPU machine; python3 with numpy, nvidia-smi and torch are used if present): the
#   steps in gpu_speed_run.sh's header, most telling first, each only while RUN_BUDGET
#   seconds (default 540) last — the kernel tests, the matvec kernel sweep, llama.cpp beside
#   duet on random 1.1B Llama files (Q4_0, Q4_K_M, Q8_0) and the same-shape DiffLlama,
#   decode under each --gpu-tune variant, decode at depth 4,096 (f16 and 4-bit caches),
#   other carried builds, DIFF V2, kernel profiles, the remaining GPU tests.
# Results go to $OUT (the device tool's folder) or target/gpu-speed: gpu-speed.md (the tables
# and the machine), kernels.md (the matvec sweep), gpu-tests.log, profiles.md, run.log.
#
#   DUET_BASE="path/to/duet-<commit> …" runtime/bench/gpu_speed.sh prepare
# also carries other duet binaries (named for their commit or change); `run` then adds their
# decode rows beside this build's, on the same card in the same run (device time is short:
# one run measures a change).
#
#   MODELS=small TESTS=0 runtime/bench/gpu_speed.sh run   # a dry run (lavapipe): the 10M
#                                   # reference models instead of the 1.1B ones, depth 256, no tests
set -euo pipefail
cd "$(dirname "$0")/../.."
source runtime/bench/common.sh
carry=$PWD/.gpu-carry
# The test binaries that use the GPU (package:test): those whose source opens a GpuBackend,
# records a no-GPU skip or runs `--device gpu`.
gpu_tests=()
for f in $(grep -l 'no_gpu\|GpuBackend\|"gpu"\|device gpu' tests/*.rs runtime/tests/*.rs); do
  t=$(basename "$f" .rs)
  case $f in runtime/*) gpu_tests+=("duet-runtime:$t") ;; *) gpu_tests+=("duet:$t") ;; esac
done

vulkan_tools() {
  local vk=$BENCH/vulkan-tools
  if [ ! -x "$vk/glslc" ]; then
    bench_say "fetching glslc, the Vulkan headers and the loader of Debian 13 into $vk"
    local lists=$vk/apt o
    mkdir -p "$lists/lists/partial" "$lists/cache/archives/partial" "$vk/debs"
    echo "deb [trusted=yes] http://deb.debian.org/debian trixie main" >"$lists/sources.list"
    o=(-oDir::Etc::SourceList="$lists/sources.list" -oDir::Etc::SourceParts=/dev/null -oDir::State::Lists="$lists/lists"
      -oDir::Cache="$lists/cache" -oAPT::Get::AllowUnauthenticated=true)
    apt-get "${o[@]}" update -qq >&2
    (cd "$vk/debs" && apt-get "${o[@]}" download -qq glslc libshaderc1 libc6 libgcc-s1 libstdc++6 libvulkan1 \
      libvulkan-dev spirv-headers >&2)
    rm -rf "$vk/root" && mkdir -p "$vk/root"
    for f in "$vk"/debs/*.deb; do dpkg -x "$f" "$vk/root"; done
    local lib=$vk/root/usr/lib/x86_64-linux-gnu
    printf '#!/bin/sh\nexec %s/ld-linux-x86-64.so.2 --library-path %s %s/usr/bin/glslc "$@"\n' "$lib" "$lib" "$vk/root" >"$vk/glslc"
    chmod +x "$vk/glslc"
  fi
  # (sed reads all of it: head would leave glslc a broken pipe, which pipefail makes fatal)
  "$vk/glslc" --version | sed -n 1p >&2
  VK=$vk
}

# The loader llama-bench links against: this machine's own where it has one (Debian 13's
# needs glibc 2.38, which Debian 12 lacks; the GPU machine gets this machine's loader
# package anyway), else Debian 13's.
vulkan_link_library() {
  local sys
  sys=$(ldconfig -p | sed -n 's/.*libvulkan\.so\.1 (libc6,x86-64) => //p' | head -1)
  if [ -n "$sys" ]; then echo "$sys"; else echo "$VK/root/usr/lib/x86_64-linux-gnu/libvulkan.so.1"; fi
}

prepare() {
  command -v apt-get >/dev/null && command -v dpkg >/dev/null \
    || { echo "error: prepare needs apt-get and dpkg (Debian or Ubuntu)" >&2; exit 1; }
  vulkan_tools
  LLAMA_FLAGS=(-DGGML_VULKAN=ON -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DBUILD_SHARED_LIBS=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
    -DVulkan_INCLUDE_DIR="$VK/root/usr/include" -DVulkan_GLSLC_EXECUTABLE="$VK/glslc"
    -DVulkan_LIBRARY="$(vulkan_link_library)"
    -DSPIRV-Headers_DIR="$VK/root/usr/share/cmake/SPIRV-Headers")
  local lbin
  lbin=$(bench_llama_build build-vulkan llama-bench)
  grep -E 'GL_.* supported by glslc' "$BENCH/llama.cpp/build-vulkan.cmake.log" >&2 || true

  bench_say "building duet and its GPU tests (release)"
  cargo build --release --bin duet -q
  local t pkg name exe stage=$carry/stage
  rm -rf "$carry" && mkdir -p "$stage/target/release/deps" "$stage/llama" "$carry/loader"
  for t in "${gpu_tests[@]}"; do
    pkg=${t%%:*} name=${t#*:}
    exe=$(cargo test --release -p "$pkg" --test "$name" --no-run 2>&1 | sed -n "s/.*Executable .*(\(.*\/deps\/$name-[0-9a-f]*\)).*/\1/p")
    [ -x "$exe" ] || { echo "error: no test binary for $t" >&2; exit 1; }
    strip -o "$stage/target/release/deps/$name" "$exe"
  done
  strip -o "$stage/target/release/duet" target/release/duet
  strip -o "$stage/llama/llama-bench" "$lbin/llama-bench"
  local b i=0
  for b in ${DUET_BASE:-}; do
    i=$((i + 1))
    mkdir -p "$stage/base/$i"
    strip -o "$stage/base/$i/duet" "$b"
    basename "$b" >"$stage/base/$i/name"
  done
  echo "$PWD" >"$stage/build-root"
  git describe --always --dirty=+changes >"$stage/commit"
  tar -C "$stage" -cf - . | xz -T0 -6 >"$carry/bin.tar.xz"
  rm -rf "$stage"
  bench_say "fetching the Vulkan loader for the GPU machine"
  (cd "$carry/loader" && apt-get download -qq libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 >&2)
  du -sh "$carry" >&2
  local bytes
  bytes=$(du -sb "$carry" | cut -f1)
  [ "$bytes" -lt $((60 << 20)) ] || { echo "error: $carry is $bytes bytes, over the 60 MiB the device tool carries" >&2; exit 1; }
  echo "ready: carry .gpu-carry and run 'runtime/bench/gpu_speed.sh run' there"
}

source runtime/bench/gpu_speed_run.sh

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: $0 prepare|run (see the comment at the top)" >&2; exit 2 ;;
esac
