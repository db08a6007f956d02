#!/usr/bin/env bash
# The test command: install dependencies if missing, configure, build, run every test.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
source "$root/scripts/env.sh"
bash "$root/scripts/build.sh"
# Tests use up to 8 ranks each; run them one at a time on a small machine.
ctest --test-dir "$build" --output-on-failure --timeout 600 "$@"
