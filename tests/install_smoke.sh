#!/usr/bin/env bash
# Installs a built ShardTensor into a temporary prefix and uses it the way an outside project
# would: find_package(ShardTensor) in examples/external_project (built, run on 2 ranks and
# checked against a single-rank run) and `pkg-config --cflags --libs shardtensor` on a tiny
# C++ program; find_package(ShardTensor) against the build tree too. Any failing step fails the
# test with the step's name. The prefix is removed, and the build tree is left as it was.
#   tests/install_smoke.sh <build dir> <source dir>
set -Eeuo pipefail
build="$(cd "$1" && pwd)"
source_dir="$(cd "$2" && pwd)"
# shellcheck source=../scripts/env.sh
source "$source_dir/scripts/env.sh"

work="$(mktemp -d "${TMPDIR:-/tmp}/shardtensor_install_XXXXXX")"
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
step="start"
trap 'echo "FAIL: install smoke test, step \"$step\" (exit status $?)" >&2' ERR
begin() { step="$1"; echo "== $1"; }
mpi_run() { mpirun -n 2 --oversubscribe --bind-to none "$@"; }

begin "find_package(ShardTensor) against the build tree"
cmake -S "$source_dir/examples/external_project" -B "$work/external_build_tree" \
      -DCMAKE_BUILD_TYPE=Release -DShardTensor_DIR="$build" > "$work/configure_build_tree.log" ||
  { cat "$work/configure_build_tree.log"; false; }
cmake --build "$work/external_build_tree" -j 2 > "$work/build_build_tree.log" ||
  { cat "$work/build_build_tree.log"; false; }
mpi_run "$work/external_build_tree/external_unet" | tee "$work/external_build_tree.log"
grep -q "2 rank(s).*(match)$" "$work/external_build_tree.log"

begin "cmake --install"
# CMake writes install_manifest.txt into the build tree on every install: keep the build
# tree as it was (a user's own manifest from an earlier install stays).
manifest="$build/install_manifest.txt"
if [ -f "$manifest" ]; then cp -p "$manifest" "$work/manifest.saved"; fi
restore_manifest() {
  if [ -f "$work/manifest.saved" ]; then cp -p "$work/manifest.saved" "$manifest"; else rm -f "$manifest"; fi
}
cmake --install "$build" --prefix "$prefix" > "$work/install.log" ||
  { restore_manifest; cat "$work/install.log"; false; }
restore_manifest
echo "installed $(grep -c '^-- \(Installing\|Up-to-date\)' "$work/install.log") files into $prefix"

begin "installed files"
for f in include/shardtensor/core.hpp include/shardtensor/comm.hpp include/shardtensor/layers.hpp \
         include/shardtensor/optim.hpp include/shardtensor/kernels/conv.hpp \
         include/shardtensor/io.hpp include/shardtensor/models.hpp \
         include/shardtensor/train/trainer.hpp bin/shardtensor; do
  test -e "$prefix/$f" || { echo "missing: $prefix/$f"; false; }
done
# Every header of every module's include/ directory (modules added later included).
for include_dir in "$source_dir"/*/include; do
  case "$(basename "$(dirname "$include_dir")")" in build*) continue ;; esac
  while IFS= read -r header; do
    test -e "$prefix/include/$header" || { echo "missing: $prefix/include/$header"; false; }
  done < <(cd "$include_dir" && find . -type f | sed 's|^\./||')
done
config="$(find "$prefix" -name ShardTensorConfig.cmake | head -1)"
pc="$(find "$prefix" -name shardtensor.pc | head -1)"
library="$(find "$prefix" -name 'libshardtensor.*' | head -1)"
for f in "$config" "$pc" "$library"; do test -n "$f" || { echo "missing config, .pc or library"; false; }; done
config_dir="$(dirname "$config")"
for f in ShardTensorConfigVersion.cmake ShardTensorTargets.cmake ShardTensorKokkos.cmake; do
  test -f "$config_dir/$f" || { echo "missing: $config_dir/$f"; false; }
done
if find "$prefix" -name '*.cpp' | grep -q .; then echo "sources were installed"; false; fi

begin "installed shardtensor --version"
"$prefix/bin/shardtensor" --version | tee "$work/version.log"
grep -q "^shardtensor [0-9]" "$work/version.log"

begin "configure examples/external_project against the prefix"
cmake -S "$source_dir/examples/external_project" -B "$work/external" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$prefix" > "$work/configure.log" || { cat "$work/configure.log"; false; }
found="$(sed -n 's/^ShardTensor_DIR:PATH=//p' "$work/external/CMakeCache.txt")"
echo "ShardTensor_DIR = $found"
[ "$found" = "$config_dir" ] || { echo "found ShardTensor outside the prefix"; false; }

begin "build examples/external_project"
cmake --build "$work/external" -j 2 > "$work/build.log" || { cat "$work/build.log"; false; }

begin "run examples/external_project on 2 ranks"
mpi_run "$work/external/external_unet" | tee "$work/external.log"
grep -q "2 rank(s).*(match)$" "$work/external.log"

begin "pkg-config --cflags --libs shardtensor"
export PKG_CONFIG_PATH="$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
pkg-config --modversion shardtensor
flags="$(pkg-config --cflags --libs shardtensor)"
echo "$flags"
cat > "$work/pkg_config_user.cpp" <<'CPP'
// Built with nothing but `pkg-config --cflags --libs shardtensor`.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdio>

#include "shardtensor/comm.hpp"
#include "shardtensor/core.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    const shardtensor::Communicator comm;
    const auto d = shardtensor::Decomposition::automatic({24, 20}, comm.size());
    shardtensor::ShardTensor<double> field(d, comm.rank(), 1, 1);
    long long mine = field.local_extent(0) * field.local_extent(1), total = 0;
    MPI_Allreduce(&mine, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    status = total == d.global_cells() ? 0 : 1;
    if (comm.rank() == 0)
      std::printf("pkg-config program: %lld cells on %d rank(s), %s %s\n", total, comm.size(),
                  d.describe().c_str(), status == 0 ? "(match)" : "(MISMATCH)");
  }
  MPI_Finalize();
  return status;
}
CPP
begin "compile a program with pkg-config flags"
# shellcheck disable=SC2086
"${CXX:-c++}" -std=c++17 -O1 "$work/pkg_config_user.cpp" -o "$work/pkg_config_user" $flags

begin "run the pkg-config program on 2 ranks"
mpi_run "$work/pkg_config_user" | tee "$work/pkg_config_user.log"
grep -q "480 cells on 2 rank(s).*(match)$" "$work/pkg_config_user.log"

if [ -f "$prefix/include/shardtensor.h" ]; then
  begin "compile and run a C program with pkg-config flags (C API)"
  cat > "$work/c_user.c" <<'C'
#include <mpi.h>
#include <stdio.h>

#include "shardtensor.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  shardtensor_options options;
  shardtensor_options_default(&options);
  printf("C program linked with pkg-config flags (match)\n");
  MPI_Finalize();
  return 0;
}
C
  # shellcheck disable=SC2086
  "${CC:-cc}" -std=c11 "$work/c_user.c" -o "$work/c_user" $flags
  "$work/c_user" | tee "$work/c_user.log"
  grep -q "(match)$" "$work/c_user.log"
fi

step="done"
echo "install smoke test passed"
