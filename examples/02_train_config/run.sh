#!/usr/bin/env bash
# Example 02, the main job: generate heat-equation data, train a U-Net surrogate on 2 ranks
# from heat2d.yaml, run inference on a held-out test set and print its error.
#
#   bash examples/02_train_config/run.sh            (after scripts/build.sh)
#   RANKS=4 bash examples/02_train_config/run.sh    (any rank count; same numbers)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${SHARDTENSOR_BIN:-${BUILD_DIR:-$root/build}/bin/shardtensor}"
work="${WORK_DIR:-${BUILD_DIR:-$root/build}/examples/02_train_config}"
ranks="${RANKS:-2}"
source "$root/scripts/env.sh"
run() { mpirun -n "$ranks" --oversubscribe --bind-to none "$bin" "$@"; }

mkdir -p "$work"
cd "$work"
echo "== generate: 160 training + 16 test samples of the 2-D heat equation ($work)"
run generate heat --dims 2 --size 32 --samples 160 --seed 1 --output heat2d.h5 --overwrite
run generate heat --dims 2 --size 32 --samples 16 --seed 2 --output heat2d_test.h5 --overwrite
echo "== train on $ranks ranks: $here/heat2d.yaml"
rm -rf runs/heat2d
run train --config "$here/heat2d.yaml" "$@"
echo "== infer on the test set"
run infer --config "$here/heat2d.yaml" --checkpoint runs/heat2d \
  --input heat2d_test.h5 --output prediction.h5
