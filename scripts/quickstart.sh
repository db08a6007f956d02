#!/usr/bin/env bash
# The main job: install dependencies, build, and run the halo example on 2 ranks.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
source "$root/scripts/env.sh"
bash "$root/scripts/build.sh"
echo
echo "== examples/01_halo on 2 ranks =="
mpirun -n 2 --oversubscribe "$build/examples/01_halo/example_01_halo" "$@"
