#!/usr/bin/env bash
# Runs the CUDA build's ctest entries on a GPU machine from the bundle that
# scripts/device/bundle.sh made (.device/bundle.tar.xz), with no Debian packages there: Open
# MPI runs relocated to the bundle (OPAL_PREFIX and friends), the libraries from a folder on
# LD_LIBRARY_PATH. Each entry runs with a time limit; a summary (PASS/FAIL/TIMEOUT, seconds)
# and one log (every entry's output, the last 80 lines of each) go to $OUT (or ./device-out):
# the device tool brings back 8 files at most. Afterwards, /tmp/shardtensor-device/env.sh
# holds the environment for running the unpacked programs by hand (benchmarks).
#
#   scripts/device/run.sh [REGEX [TIMEOUT_S [EXCLUDE]]]
#
# runs the entries whose name matches REGEX (default: all) and not EXCLUDE (default: none),
# each stopped after TIMEOUT_S seconds (default 300); with DEADLINE=S in the environment, no
# entry starts S seconds or more after the first (the rest are listed as SKIPPED); with JOBS=N,
# N programs' entries run at a time.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
filter="${1:-.}"
limit="${2:-300}"
exclude="${3:-}"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
unpacked=/tmp/shardtensor-device
rm -rf "$unpacked" && mkdir -p "$unpacked"
tar -C "$unpacked" -xJf "$root/.device/bundle.tar.xz"

# Open MPI (and its PMIx) relocated to the bundle: the machine may have an Open MPI of its own
# at Debian's paths, of another version, whose plugins must not mix with these libraries.
ompi="$unpacked/sys/usr"
multiarch="$ompi/lib/x86_64-linux-gnu"
export OPAL_PREFIX="$ompi" OPAL_BINDIR="$ompi/bin" OPAL_DATADIR="$ompi/share"
export OPAL_PKGDATADIR="$ompi/share/openmpi" OPAL_SYSCONFDIR="$unpacked/sys/etc/openmpi"
export OPAL_LIBDIR="$multiarch/openmpi/lib" OPAL_PKGLIBDIR="$multiarch/openmpi/lib/openmpi3"
export OMPI_MCA_mca_base_component_path="$multiarch/openmpi/lib/openmpi3"
export PMIX_PREFIX="$multiarch/pmix2" PMIX_PKGLIBDIR="$multiarch/pmix2/lib/pmix"
export PMIX_MCA_mca_base_component_path="$multiarch/pmix2/lib/pmix"
# hwloc's plugins (OpenCL, X11, ...) would come from the machine's hwloc: none are needed.
mkdir -p "$unpacked/no-plugins" && export HWLOC_PLUGINS_PATH="$unpacked/no-plugins"
mkdir -p "$unpacked/path"
ln -sf "$ompi/bin/orterun" "$unpacked/path/mpiexec"
ln -sf "$ompi/bin/orterun" "$unpacked/path/mpirun"

# CUDA's libraries: the toolkit's, or the ones PyTorch's wheels carry.
cuda_libs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
  $(python3 -c 'import nvidia, os; p = nvidia.__path__[0]; print(" ".join(os.path.join(p, d, "lib") for d in os.listdir(p)))' 2>/dev/null); do
  [ -d "$d" ] && cuda_libs="$cuda_libs:$d"
done
export LD_LIBRARY_PATH="$unpacked/lib$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$unpacked/path:$PATH"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_mca_base_component_show_load_errors=0
export OMPI_MCA_btl_vader_single_copy_mechanism=none  # no CMA in containers
# Ranks of programs run side by side (JOBS) share the cores: a waiting rank yields its core.
[ "${JOBS:-1}" -gt 1 ] && export OMPI_MCA_mpi_yield_when_idle=1
# The same settings for commands run after this script (benchmarks): source it.
export -p | grep -E ' (LD_LIBRARY_PATH|PATH|OMPI_[A-Za-z_]*|OPAL_[A-Z_]*|PMIX_[A-Za-z_]*|HWLOC_[A-Z_]*)=' > "$unpacked/env.sh"

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  echo "tests matching '$filter'${exclude:+ but not '$exclude'}, ${limit} s each"
  ldd "$unpacked"/build/bin/* "$unpacked"/build/tests/* 2>/dev/null | grep 'not found' | sort -u
} | tee -a "$out/summary.txt"
deadline="${DEADLINE:-0}"
jobs="${JOBS:-1}"
began=$(date +%s)
mkdir -p "$unpacked/logs"

# One entry: its verdict line to the summary, its output to logs/NAME.log.
run_entry() {
  local name="$1" workdir="$2" env="$3" command="$4"
  if [ "$deadline" -gt 0 ] && [ $(($(date +%s) - began)) -ge "$deadline" ]; then
    printf '%-40s SKIPPED (deadline)\n' "$name" | tee -a "$out/summary.txt"
    return
  fi
  workdir="${workdir//@BUILD@/$unpacked/build}"; workdir="${workdir//@SOURCE@/$root}"
  command="${command//@BUILD@/$unpacked/build}"; command="${command//@SOURCE@/$root}"
  env="${env//@BUILD@/$unpacked/build}"; env="${env//@SOURCE@/$root}"
  mkdir -p "$workdir"
  local start rc elapsed seconds verdict
  start=$(date +%s%N)
  (cd "$workdir" && env $env timeout -k 5 "$limit" bash -c "$command") > "$unpacked/logs/$name.out" 2>&1 < /dev/null
  rc=$?
  elapsed=$((($(date +%s%N) - start) / 100000000))
  seconds="$((elapsed / 10)).$((elapsed % 10))"
  if [ $rc -eq 0 ]; then verdict=PASS
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then verdict=TIMEOUT
  else verdict="FAIL($rc)"; fi
  printf '%-40s %-10s %6s s\n' "$name" "$verdict" "$seconds" | tee -a "$out/summary.txt"
  { echo "=== $name: $verdict ($seconds s): $command"; tail -80 "$unpacked/logs/$name.out"; } > "$unpacked/logs/$name.log"
}

# The entries of one program at several rank counts (NAME_np1, NAME_np2, ...) share a working
# directory and output files: they run one after another, in one group; with JOBS=N, N groups
# run at a time (each rank has its own CUDA context; the GPU and the cores are shared).
declare -A group_of
groups=()
names=()
while IFS=$'\t' read -r name workdir env command; do
  [[ "$name" =~ $filter ]] || continue
  [ -n "$exclude" ] && [[ "$name" =~ $exclude ]] && continue
  key="${name%_np[0-9]*}"
  [ -n "${group_of[$key]+x}" ] || groups+=("$key")
  group_of[$key]+="$name"$'\t'"$workdir"$'\t'"$env"$'\t'"$command"$'\n'
  names+=("$name")
done < "$unpacked/tests.tsv"
for key in "${groups[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  (while IFS=$'\t' read -r name workdir env command; do
     [ -n "$name" ] || continue
     run_entry "$name" "$workdir" "$env" "$command"
   done <<< "${group_of[$key]}") &
done
wait
for name in "${names[@]}"; do
  [ -f "$unpacked/logs/$name.log" ] && cat "$unpacked/logs/$name.log" >> "$out/log.txt"
done
passed=$(grep -c ' PASS ' "$out/summary.txt")
failed=$(grep -cE ' (FAIL|TIMEOUT)' "$out/summary.txt")
echo "passed $passed, failed $failed ($(($(date +%s) - began)) s)" | tee -a "$out/summary.txt"
