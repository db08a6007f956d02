#!/usr/bin/env bash
# Builds upstream Kokkos and Kokkos Kernels into PREFIX, for the backends Debian's Kokkos 3.4.1
# lacks. Nothing is downloaded: the sources come from tarballs (or unpacked directories) given
# on the command line or found in ../shared/deps beside the project.
#
#   scripts/build-kokkos.sh PREFIX [openmp|cuda] [KOKKOS_SRC] [KERNELS_SRC]
#
#   openmp   Serial + OpenMP host backends, Kokkos Kernels with OpenBLAS (the default)
#   cuda     Serial + CUDA (KOKKOS_CUDA_ARCH, default HOPPER90, lambdas on), compiled with
#            nvcc_wrapper over g++; Kokkos Kernels with cuBLAS (device) and OpenBLAS (host).
#            Needs the CUDA toolkit ($CUDA_HOME, default /usr/local/cuda); no GPU.
#
# The result is cached: PREFIX/.shardtensor-build-id records the sources' checksums and the
# options, and a second call with the same inputs returns at once. Point the project at it
# with -DKokkos_ROOT=PREFIX -DKokkosKernels_ROOT=PREFIX (docs/install.md).
set -euo pipefail

if [ $# -lt 1 ]; then
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
prefix="$1"
backend="${2:-openmp}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="$root/../shared/deps"
kokkos_src="${3:-$deps/kokkos-4.6.01.tar.gz}"
kernels_src="${4:-$deps/kokkos-kernels-4.6.02.tar.gz}"
jobs="${JOBS:-$(nproc)}"

case "$backend" in
  openmp)
    backend_options=(-DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_OPENMP=ON)
    compiler="${CXX:-g++}"
    compiler_id="$($compiler --version | head -1)"
    kernels_tpls=(-DKokkosKernels_ENABLE_TPL_BLAS=ON)
    ;;
  cuda)
    cuda_home="${CUDA_HOME:-/usr/local/cuda}"
    cuda_arch="${KOKKOS_CUDA_ARCH:-HOPPER90}"
    if [ ! -x "$cuda_home/bin/nvcc" ]; then
      echo "build-kokkos: no nvcc in '$cuda_home/bin' (set CUDA_HOME)" >&2
      exit 2
    fi
    export PATH="$cuda_home/bin:$PATH"
    backend_options=(-DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_CUDA=ON
      "-DKokkos_ARCH_$cuda_arch=ON" -DKokkos_ENABLE_CUDA_LAMBDA=ON
      "-DCUDAToolkit_ROOT=$cuda_home")
    compiler=""  # nvcc_wrapper from the unpacked sources, set below
    compiler_id="$(nvcc --version | tail -1) host $(${NVCC_WRAPPER_DEFAULT_COMPILER:-g++} --version | head -1)"
    kernels_tpls=(-DKokkosKernels_ENABLE_TPL_BLAS=ON -DKokkosKernels_ENABLE_TPL_CUBLAS=ON
      "-DCUDAToolkit_ROOT=$cuda_home")
    ;;
  *)
    echo "build-kokkos: unknown backend '$backend' (expected: openmp or cuda)" >&2
    exit 2
    ;;
esac

for src in "$kokkos_src" "$kernels_src"; do
  if [ ! -e "$src" ]; then
    echo "build-kokkos: source '$src' not found (a .tar.gz or an unpacked directory)" >&2
    exit 2
  fi
done

# The identity of a build: the sources' contents, the backend options and this script.
fingerprint() {
  if [ -d "$1" ]; then
    # every file of a checkout (names and contents), its .git excepted
    (cd "$1" && find . -path ./.git -prune -o -type f -print0 | LC_ALL=C sort -z |
      xargs -0 sha256sum | sha256sum)
  else
    sha256sum < "$1"
  fi | cut -d' ' -f1
}
build_id="kokkos=$(fingerprint "$kokkos_src") kernels=$(fingerprint "$kernels_src")"
build_id+=" backend=$backend options=${backend_options[*]} compiler=$compiler_id"
build_id+=" script=$(cat "$0" "$root"/scripts/patches/* | sha256sum | cut -d' ' -f1)"
if [ -f "$prefix/.shardtensor-build-id" ] && [ "$(cat "$prefix/.shardtensor-build-id")" = "$build_id" ]; then
  echo "build-kokkos: $prefix is up to date ($backend)"
  exit 0
fi

# Check the tarballs against the checksums shipped beside them, when there are any.
for src in "$kokkos_src" "$kernels_src"; do
  sums="$(dirname "$src")/SHA256SUMS"
  if [ -f "$src" ] && [ -f "$sums" ] && grep -q " $(basename "$src")\$" "$sums"; then
    (cd "$(dirname "$src")" && grep " $(basename "$src")\$" SHA256SUMS | sha256sum -c --quiet -) ||
      { echo "build-kokkos: $src does not match its SHA256SUMS" >&2; exit 1; }
  fi
done

work="$(mktemp -d "${TMPDIR:-/tmp}/shardtensor-kokkos.XXXXXX")"
trap 'rm -rf "$work"' EXIT
unpack() {  # unpack SRC into $work/NAME, return the source directory
  if [ -d "$1" ]; then echo "$1"; return; fi
  mkdir -p "$work/$2"
  tar xzf "$1" -C "$work/$2" --strip-components=1
  echo "$work/$2"
}
kokkos_dir="$(unpack "$kokkos_src" kokkos)"
kernels_dir="$(unpack "$kernels_src" kernels)"
if [ "$backend" = cuda ]; then
  # nvcc_wrapper's built-in default arch (sm_70, used when a compile names none, as CMake's
  # compiler checks do) is refused by CUDA 13: the wrapper, installed with Kokkos, defaults
  # to the arch we build for instead.
  case "$cuda_arch" in
    HOPPER90) default_arch=sm_90 ;;
    AMPERE80) default_arch=sm_80 ;;
    ADA89) default_arch=sm_89 ;;
    BLACKWELL100) default_arch=sm_100 ;;
    *) echo "build-kokkos: KOKKOS_CUDA_ARCH '$cuda_arch' has no sm_ number here" >&2; exit 2 ;;
  esac
  if [ -d "$kokkos_src" ]; then  # never edit a user's checkout: patch a copy
    cp -r "$kokkos_src" "$work/kokkos" && kokkos_dir="$work/kokkos"
  fi
  compiler="$kokkos_dir/bin/nvcc_wrapper"
  # Kokkos 4.6 predates CUDA 13's runtime API (three calls changed signature).
  cuda_major="$(nvcc --version | sed -n 's/.*release \([0-9]*\).*/\1/p')"
  if [ "$cuda_major" -ge 13 ] && grep -q '^set(Kokkos_VERSION_MINOR 6)' "$kokkos_dir/CMakeLists.txt"; then
    patch -s -p1 -d "$kokkos_dir" < "$root/scripts/patches/kokkos-4.6.01-cuda13.patch"
  fi
  sed -i "s/^default_arch=\"sm_70\"/default_arch=\"$default_arch\"/" "$compiler"
  grep -q "^default_arch=\"$default_arch\"" "$compiler" ||
    { echo "build-kokkos: could not set nvcc_wrapper's default arch" >&2; exit 1; }
fi

# The build id is written last: an interrupted build leaves a prefix that the next call
# rebuilds instead of trusting. Static libraries: nothing to find at run time.
rm -rf "$prefix"
echo "build-kokkos: building Kokkos ($backend) into $prefix with $jobs jobs"
cmake -S "$kokkos_dir" -B "$work/build-kokkos" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$compiler" -DCMAKE_CXX_STANDARD=17 -DCMAKE_INSTALL_PREFIX="$prefix" \
  -DBUILD_SHARED_LIBS=OFF -DKokkos_ENABLE_TESTS=OFF -DKokkos_ENABLE_EXAMPLES=OFF \
  "${backend_options[@]}" > "$work/kokkos-configure.log"
cmake --build "$work/build-kokkos" -j "$jobs" > "$work/kokkos-build.log" ||
  { tail -50 "$work/kokkos-build.log" >&2; exit 1; }
cmake --install "$work/build-kokkos" > /dev/null

# Kokkos Kernels: only the BLAS component, with OpenBLAS (and cuBLAS) as its TPL, and no pre-instantiated
# kernels (ShardTensor calls gemm, which goes to the TPL; instantiating the rest costs
# an hour on two cores for nothing).
echo "build-kokkos: building Kokkos Kernels (BLAS; TPLs: ${kernels_tpls[*]})"
cmake -S "$kernels_dir" -B "$work/build-kernels" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$compiler" -DCMAKE_INSTALL_PREFIX="$prefix" -DBUILD_SHARED_LIBS=OFF \
  -DKokkos_ROOT="$prefix" \
  -DKokkosKernels_ENABLE_ALL_COMPONENTS=OFF -DKokkosKernels_ENABLE_COMPONENT_BLAS=ON \
  "${kernels_tpls[@]}" \
  -DKokkosKernels_INST_DOUBLE=OFF -DKokkosKernels_INST_FLOAT=OFF \
  -DKokkosKernels_INST_COMPLEX_DOUBLE=OFF -DKokkosKernels_INST_COMPLEX_FLOAT=OFF \
  -DKokkosKernels_INST_LAYOUTLEFT=OFF -DKokkosKernels_INST_LAYOUTRIGHT=OFF \
  -DKokkosKernels_ENABLE_TESTS=OFF -DKokkosKernels_ENABLE_EXAMPLES=OFF > "$work/kernels-configure.log" ||
  { tail -50 "$work/kernels-configure.log" >&2; exit 1; }
cmake --build "$work/build-kernels" -j "$jobs" > "$work/kernels-build.log" ||
  { tail -50 "$work/kernels-build.log" >&2; exit 1; }
cmake --install "$work/build-kernels" > /dev/null

echo "$build_id" > "$prefix/.shardtensor-build-id"
echo "build-kokkos: done: -DKokkos_ROOT=$prefix -DKokkosKernels_ROOT=$prefix"
