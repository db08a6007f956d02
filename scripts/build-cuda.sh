#!/usr/bin/env bash
# The CUDA build (compile and link; running it needs a GPU): builds upstream Kokkos 4.6 with
# CUDA for the GPU's arch (cached, scripts/build-kokkos.sh) and the whole project against it
# (library, CLI, tests, benchmarks, examples) into ./build-cuda (or $CUDA_BUILD_DIR).
#
#   scripts/build-cuda.sh [cmake --build arguments...]
#
# CUDA_BUILD_TIME_LIMIT_S (unset: none) bounds the script's time, Kokkos' build (when not
# cached) included, for CI on two cores: the project's library, the CLI and the C and Fortran APIs first (every CUDA-specific source is in them),
# then the rest (tests, benchmarks, examples) in what time is left. A compile error fails
# either way; running out of time ends the script with a message saying what was compiled.
#
# CUDA_HOME (default /usr/local/cuda) names the toolkit, KOKKOS_CUDA_ARCH the GPU (default
# HOPPER90: H100, H200). The Kokkos sources come from ../shared/deps (or
# $SHARDTENSOR_KOKKOS_SOURCES); the built Kokkos is kept in $SHARDTENSOR_DEPS_CACHE (default
# /var/cache/shardtensor, or ~/.cache/shardtensor when that is not writable). To run the
# tests on a GPU machine without Debian's packages: scripts/device/bundle.sh, then
# scripts/device/run.sh there (docs/install.md, "GPU build").
set -euo pipefail
deadline=$(( $(date +%s) + ${CUDA_BUILD_TIME_LIMIT_S:-0} ))  # Kokkos' build counts too
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${CUDA_BUILD_DIR:-$root/build-cuda}"
sources="${SHARDTENSOR_KOKKOS_SOURCES:-$root/../shared/deps}"
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
arch="${KOKKOS_CUDA_ARCH:-HOPPER90}"
source "$root/scripts/env.sh"

if [ ! -x "$cuda_home/bin/nvcc" ]; then
  echo "build-cuda: skipped: no CUDA toolkit in $cuda_home (set CUDA_HOME)"
  exit 0
fi
if [ ! -f "$sources/kokkos-4.6.01.tar.gz" ] || [ ! -f "$sources/kokkos-kernels-4.6.02.tar.gz" ]; then
  echo "build-cuda: skipped: no Kokkos 4.6 sources in $sources (see docs/install.md)"
  exit 0
fi
cache="${SHARDTENSOR_DEPS_CACHE:-/var/cache/shardtensor}"
if ! mkdir -p "$cache" 2>/dev/null || [ ! -w "$cache" ]; then cache="$HOME/.cache/shardtensor"; fi
prefix="$cache/kokkos-4.6.01-cuda"  # the default arch's; another arch gets its own prefix
[ "$arch" = HOPPER90 ] || prefix="$prefix-$(echo "$arch" | tr '[:upper:]' '[:lower:]')"

bash "$root/scripts/install-deps.sh"
CUDA_HOME="$cuda_home" KOKKOS_CUDA_ARCH="$arch" bash "$root/scripts/build-kokkos.sh" "$prefix" cuda \
  "$sources/kokkos-4.6.01.tar.gz" "$sources/kokkos-kernels-4.6.02.tar.gz"
# cuDNN FrontEnd (header-only, MIT): cuDNN's graph API. Unpacked once into the cache.
frontend=""
frontend_tarball="$sources/cudnn-frontend-1.23.0.tar.gz"
if [ -f "$frontend_tarball" ]; then
  frontend="$cache/cudnn-frontend-1.23.0"
  if [ ! -f "$frontend/include/cudnn_frontend.h" ]; then
    if [ -f "$sources/SHA256SUMS" ] && grep -q cudnn-frontend "$sources/SHA256SUMS"; then
      (cd "$sources" && grep cudnn-frontend SHA256SUMS | sha256sum -c --quiet -)
    fi
    rm -rf "$frontend.tmp" && mkdir -p "$frontend.tmp"
    tar -C "$frontend.tmp" -xzf "$frontend_tarball" --strip-components=1
    rm -rf "$frontend" && mv "$frontend.tmp" "$frontend"
  fi
fi
export PATH="$cuda_home/bin:$PATH"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$prefix/bin/nvcc_wrapper" \
  -DKokkos_ROOT="$prefix" -DKokkosKernels_ROOT="$prefix" -DCUDAToolkit_ROOT="$cuda_home" \
  -DSHARDTENSOR_CUDNN_FRONTEND_DIR="${frontend:+$frontend/include}"
if [ -z "${CUDA_BUILD_TIME_LIMIT_S:-}" ]; then
  cmake --build "$build" -j "$(nproc)" "$@"
  echo "build-cuda: built $build (Kokkos CUDA, $arch)"
  exit 0
fi
# Builds within the time left; returns 124 when the time ran out, the build's status else.
build_until_deadline() {
  local left=$(( deadline - $(date +%s) ))
  [ "$left" -gt 0 ] || return 124
  local status=0
  timeout "$left" cmake --build "$build" -j "$(nproc)" "$@" || status=$?
  return "$status"
}
status=0
build_until_deadline --target shardtensor_cli shardtensor_capi shardtensor_fortran \
  shardtensor_kernel_timer || status=$?
if [ "$status" = 124 ]; then
  echo "build-cuda: the ${CUDA_BUILD_TIME_LIMIT_S} s limit ran out inside the library; what was compiled compiled"
  exit 0
fi
[ "$status" = 0 ] || exit "$status"
echo "build-cuda: built the library, CLI and C/Fortran APIs (Kokkos CUDA, $arch)"
build_until_deadline "$@" || status=$?
if [ "$status" = 124 ]; then
  echo "build-cuda: the ${CUDA_BUILD_TIME_LIMIT_S} s limit ran out in the tests, benchmarks and examples; what was compiled compiled"
  exit 0
fi
[ "$status" = 0 ] || exit "$status"
echo "build-cuda: built $build (Kokkos CUDA, $arch)"
