#!/usr/bin/env bash
# Packs what a GPU machine without Debian's packages needs to run the CUDA build's tests and
# benchmarks: the executables of BUILD_DIR, the Debian runtime libraries they load (Open MPI,
# parallel HDF5, yaml-cpp, OpenBLAS, ... as found by ldd; glibc and the CUDA libraries are
# the machine's own), Open MPI's launcher and plugins, and the list of ctest entries with their
# commands. The result is one compressed file, .device/bundle.tar.xz (an ignored folder, under
# the device tool's 64 MiB), that scripts/device/run.sh unpacks and runs there.
#
#   scripts/device/bundle.sh [BUILD_DIR]      (default: build-cuda)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${1:-$root/build-cuda}" && pwd)"
out="$root/.device"
stage="$(mktemp -d "${TMPDIR:-/tmp}/shardtensor-bundle.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$out" "$stage/bin" "$stage/lib" "$stage/sys"

# The executables, under the paths ctest knows them by (relative to the build directory).
(cd "$build" && find tests bin bench apps examples -maxdepth 2 -type f -perm -u+x \
  -not -path '*/CMakeFiles/*' -not -name '*.sh' 2>/dev/null) |
  while read -r exe; do
    mkdir -p "$stage/build/$(dirname "$exe")"
    cp "$build/$exe" "$stage/build/$exe"
  done
find "$build/bench" -maxdepth 1 -name '*.so' -exec cp {} "$stage/build/bench/" \;

# Open MPI's launcher, daemon, plugins and help texts, and PMIx's plugins, under their Debian
# paths (run.sh points Open MPI's relocation variables at them).
multiarch=/usr/lib/x86_64-linux-gnu
for path in /usr/bin/orterun /usr/bin/orted "$multiarch/openmpi" "$multiarch/pmix2" \
  /usr/share/openmpi /usr/share/pmix /etc/openmpi; do
  [ -e "$path" ] || continue
  mkdir -p "$stage/sys$(dirname "$path")"
  cp -a "$path" "$stage/sys$path"
done

# The shared libraries all of it loads, except the C and C++ runtimes (the machine's are as
# new or newer, and its Python needs its own) and the GPU's (the machine has the driver and
# CUDA's libraries, matching its GPU).
system_libs='^(linux-vdso|ld-linux|libc\.so|libstdc\+\+\.so|libgcc_s\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libcuda\.so|libcudart|libcublas|libcufft|libcusparse|libcusolver|libcurand|libnvJitLink|libnccl|libcudnn|libnvrtc)'
find "$stage/build" "$stage/sys" -type f \( -perm -u+x -o -name '*.so*' \) -print0 |
  xargs -0 ldd 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    [[ "$name" =~ $system_libs ]] && continue
    [ -e "$stage/lib/$name" ] || cp -L "$path" "$stage/lib/$name"
  done

# The CPU results test_backend_layers compares the GPU's with: the Serial build's
# ($REFERENCE, default build/backend_layers.h5, written by its test run), when there.
reference="${REFERENCE:-$root/build/backend_layers.h5}"
if [ -f "$reference" ]; then
  mkdir -p "$stage/build" && cp "$reference" "$stage/build/cpu_backend_layers.h5"
  echo "bundle: test_backend_layers will compare with $reference"
else
  echo "bundle: no $reference (run the Serial tests first): test_backend_layers compares runs only"
fi

# The ctest entries: name, working directory and command, with this machine's paths
# replaced by placeholders run.sh fills in (@BUILD@: the unpacked build, @SOURCE@: the
# checkout there).
ctest --test-dir "$build" --show-only=json-v1 > "$stage/tests.json"
/usr/bin/python3 - "$stage/tests.json" "$build" "$root" "$stage/build/cpu_backend_layers.h5" \
  > "$stage/tests.tsv" <<'PY'
import json, os, sys
tests, build, source = json.load(open(sys.argv[1]))["tests"], sys.argv[2], sys.argv[3]
cpu_reference = os.path.exists(sys.argv[4])
def local(text):
    return text.replace(build, "@BUILD@").replace(source, "@SOURCE@").replace("/usr/bin/mpiexec", "mpiexec")
def with_reference(e):
    if cpu_reference and e == "SHARDTENSOR_BACKEND_REFERENCE=":
        return "SHARDTENSOR_BACKEND_REFERENCE=@BUILD@/cpu_backend_layers.h5"
    return e
for t in tests:
    if "command" not in t:  # its program is not built
        continue
    props = {p["name"]: p["value"] for p in t.get("properties", [])}
    env = [with_reference(e) for e in props.get("ENVIRONMENT", []) if not e.startswith("OMPI_")]
    print("\t".join([t["name"], local(props.get("WORKING_DIRECTORY", build)),
                     local(" ".join(env)), local(" ".join(t["command"]))]))
PY
rm "$stage/tests.json"

rm -f "$out/bundle.tar.xz"
# One 256 MiB dictionary: the programs share most of their (static) code, which a smaller
# window or independent threads would compress once per program (62 MiB instead of 32).
XZ_OPT="-T1 --lzma2=preset=6,dict=256MiB" tar -C "$stage" -cJf "$out/bundle.tar.xz" .
echo "bundle: $(du -h "$out/bundle.tar.xz" | cut -f1) in $out/bundle.tar.xz" \
  "($(find "$stage/build" -type f | wc -l) programs, $(ls "$stage/lib" | wc -l) libraries," \
  "$(wc -l < "$stage/tests.tsv") ctest entries)"
