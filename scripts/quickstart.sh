#!/usr/bin/env bash
# The main job: install dependencies, build, then generate heat-equation data, train a
# U-Net surrogate on 2 ranks from examples/02_train_config/heat2d.yaml, run inference on
# held-out samples and print their error. Extra arguments go to `shardtensor train`
# (e.g. --set training.epochs=5).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export BUILD_DIR="${BUILD_DIR:-$root/build}"
source "$root/scripts/env.sh"
bash "$root/scripts/build.sh"
echo
bash "$root/examples/02_train_config/run.sh" "$@"
