#!/usr/bin/env bash
# The host vector kernels on Arm: cross-compiles kernels/backends/host/vector_kernels.cpp and
# normalization_rows.cpp (the one source of the AVX2, AVX-512 and NEON paths) with their test
# (tests/test_vector_kernels.cpp, no MPI, no Kokkos) for aarch64 and runs the test under qemu,
# so that the NEON path (and its BF16 dot-product tiles: qemu's CPU has BFDOT) cannot break
# unseen on x86 machines. Installs what it needs from Debian (the arm64 architecture
# for libhwy-dev:arm64, crossbuild-essential-arm64, qemu-user-static); idempotent.
#
#   bash scripts/test-arm64.sh            (build dir: build-arm64, or $ARM64_BUILD_DIR)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ARM64_BUILD_DIR:-$root/build-arm64}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=()
for p in crossbuild-essential-arm64 qemu-user-static libhwy-dev:arm64 catch2; do
  installed "$p" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "test-arm64: installing ${missing[*]}"
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    $sudo dpkg --add-architecture arm64
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

mkdir -p "$build"
echo "test-arm64: building the vector kernels and their test for aarch64"
# The per-file flags of the CMake build: the normalization rows and the test's scalar
# references round each product and sum (aarch64 has fused multiply-adds everywhere).
compile() {
  aarch64-linux-gnu-g++ -std=c++17 -O2 -Wall -Wextra -Werror -DSHARDTENSOR_HOST_VECTOR_KERNELS \
    -I "$root/kernels/backends" -I "$root/kernels/include" -I "$root/core/include" -c "$@"
}
compile "$root/kernels/backends/host/vector_kernels.cpp" -o "$build/vector_kernels.o"
compile -ffp-contract=off "$root/kernels/backends/host/normalization_rows.cpp" \
  -o "$build/normalization_rows.o"
compile -ffp-contract=off "$root/tests/test_vector_kernels.cpp" -o "$build/test_vector_kernels.o"
aarch64-linux-gnu-g++ "$build/vector_kernels.o" "$build/normalization_rows.o" \
  "$build/test_vector_kernels.o" -lhwy -o "$build/test_vector_kernels"

# The arm64 loader and libraries are installed through multiarch (libhwy1:arm64 and its
# dependencies); the cross toolchain's libstdc++ lies under /usr/aarch64-linux-gnu. The test
# prints the paths it ran: NEON must be among them.
echo "test-arm64: running it under qemu-aarch64"
QEMU_LD_PREFIX=/usr/aarch64-linux-gnu LD_LIBRARY_PATH=/usr/lib/aarch64-linux-gnu \
  qemu-aarch64-static "$build/test_vector_kernels" | tee "$build/test_vector_kernels.log"
grep -q "paths on this CPU: neon" "$build/test_vector_kernels.log" ||
  { echo "test-arm64: FAILED: the NEON path did not run"; exit 1; }
# qemu's default CPU has BF16: the BFDOT tiles must have run too.
grep -q "bf16 dot products on the best path: yes" "$build/test_vector_kernels.log" ||
  { echo "test-arm64: FAILED: the BFDOT tiles did not run"; exit 1; }
echo "test-arm64: the NEON path passed, with its BFDOT tiles"
