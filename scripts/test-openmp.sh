#!/usr/bin/env bash
# The test suite on CPU threads: builds upstream Kokkos 4.6 with the OpenMP backend (cached,
# scripts/build-kokkos.sh), builds the project against it into ./build-openmp (or
# $OPENMP_BUILD_DIR) and runs the tests with OMP_NUM_THREADS threads per rank (default 2).
# A kernel that is only right when its iterations run one after another fails here. The
# header check (every public header on its own) is left to the Serial build: it does not
# depend on the backend.
# test_backend_layers compares every layer with the Serial build's results
# ($SERIAL_BUILD_DIR/backend_layers.h5, default ./build, written by scripts/test.sh) when
# they exist.
#
#   scripts/test-openmp.sh [ctest arguments...]   e.g. -L 'np[123]$' for the 1-3 rank entries
#
# The Kokkos sources come from ../shared/deps (or $SHARDTENSOR_KOKKOS_SOURCES); the built
# Kokkos is kept in $SHARDTENSOR_DEPS_CACHE (default /var/cache/shardtensor, or
# ~/.cache/shardtensor when that is not writable).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${OPENMP_BUILD_DIR:-$root/build-openmp}"
sources="${SHARDTENSOR_KOKKOS_SOURCES:-$root/../shared/deps}"
source "$root/scripts/env.sh"

if [ ! -f "$sources/kokkos-4.6.01.tar.gz" ] || [ ! -f "$sources/kokkos-kernels-4.6.02.tar.gz" ]; then
  echo "test-openmp: skipped: no Kokkos 4.6 sources in $sources (see docs/install.md)"
  exit 0
fi
cache="${SHARDTENSOR_DEPS_CACHE:-/var/cache/shardtensor}"
if ! mkdir -p "$cache" 2>/dev/null || [ ! -w "$cache" ]; then cache="$HOME/.cache/shardtensor"; fi
prefix="$cache/kokkos-4.6.01-openmp"

bash "$root/scripts/install-deps.sh"
bash "$root/scripts/build-kokkos.sh" "$prefix" openmp \
  "$sources/kokkos-4.6.01.tar.gz" "$sources/kokkos-kernels-4.6.02.tar.gz"
reference="${SERIAL_BUILD_DIR:-$root/build}/backend_layers.h5"
if [ -f "$reference" ]; then
  echo "test-openmp: test_backend_layers compares with the Serial build's $reference"
else
  echo "test-openmp: no Serial results at $reference: test_backend_layers compares runs only"
  reference=""
fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKokkos_ROOT="$prefix" \
  -DKokkosKernels_ROOT="$prefix" -DSHARDTENSOR_TEST_THREADS="${OMP_NUM_THREADS:-2}" \
  -DSHARDTENSOR_HEADER_CHECK=OFF \
  -DSHARDTENSOR_BACKEND_REFERENCE="$reference"
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" --output-on-failure --timeout 900 "$@"
