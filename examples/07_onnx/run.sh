#!/usr/bin/env bash
# Example 07: bring your own model. A network written in PyTorch (tools/onnx_heat_model.py: a
# small U-shaped CNN with circular padding for the heat-equation data) is exported to ONNX,
# run split over 2 ranks by `shardtensor infer --model`, compared with PyTorch on the same
# samples, trained further from its own weights (`model: {type: onnx}`) and exported back.
#
#   bash examples/07_onnx/run.sh            (after scripts/build.sh; RANKS=4 for 4 ranks)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$root/examples/07_onnx"
bin="${BUILD_DIR:-$root/build}/bin/shardtensor"
work="${WORK_DIR:-${BUILD_DIR:-$root/build}/examples/07_onnx}"
ranks="${RANKS:-2}"
python=/usr/bin/python3
source "$root/scripts/env.sh"
mkdir -p "$work"
cd "$work"
run() { mpirun -n "$ranks" --oversubscribe --bind-to none "$bin" "$@"; }

echo "== 1. export the PyTorch network to ONNX"
"$python" "$root/tools/onnx_heat_model.py" export heat.onnx 2>&1 | grep -v -i warn || true
echo "== 2. data: 8 samples of the 2-D heat equation, 32x32"
run generate heat --dims 2 --size 32 --samples 8 --seed 3 --output data.h5 --overwrite
echo "== 3. run the ONNX network on $ranks ranks"
run infer --model heat.onnx --input data.h5 --output prediction.h5
echo "== 4. the same samples in PyTorch"
"$python" "$root/tools/onnx_heat_model.py" compare heat.onnx data.h5 prediction.h5
echo "== 5. train it further on $ranks ranks, from the file's weights"
run train --config "$here/train.yaml"
echo "== 6. and back to ONNX"
run export --checkpoint runs/heat_onnx --output trained.onnx
run infer --model trained.onnx --input data.h5 --output trained_prediction.h5
