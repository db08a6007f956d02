#!/usr/bin/env bash
# A network written in PyTorch, exported to ONNX, through the `shardtensor` command on 2 ranks:
# `infer --model` equals PyTorch's predictions (1e-5); `train` with `model: {type: onnx}`
# trains it further (the initializers are the starting parameters), `infer --checkpoint`
# runs the trained graph and `export` writes it back to ONNX, which predicts the same; bf16
# training runs the graph's convs in bf16; a file
# that is not ONNX stops every rank with one message.
#   tests/onnx_cli.sh <path to shardtensor> <source dir>
# Exit 77 (skipped) without PyTorch, ONNX or h5py.
set -euo pipefail
bin="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
source_dir="$(cd "$2" && pwd)"
python="${SHARDTENSOR_PYTHON:-/usr/bin/python3}"
work="$(mktemp -d /tmp/shardtensor_onnx_XXXXXX)"
trap 'rm -rf "$work"' EXIT
cd "$work"
run() { mpirun -n 2 --oversubscribe --bind-to none "$bin" "$@"; }
expect() {  # expect <pattern> <file>
  grep -q -- "$1" "$2" || { echo "FAIL: '$1' not in $2:"; cat "$2"; exit 1; }
}

set +e
"$python" "$source_dir/tools/onnx_heat_model.py" export heat.onnx > export.log 2>&1
status=$?
set -e
[ "$status" -eq 77 ] && { cat export.log; exit 77; }
[ "$status" -eq 0 ] || { cat export.log; exit 1; }

run generate heat --dims 2 --size 32 --samples 6 --steps 10 --output data.h5 > gen.log

echo "== infer --model heat.onnx: PyTorch's predictions"
run infer --model heat.onnx --input data.h5 --output onnx_out.h5 > infer.log
expect "infer: 6 samples -> onnx_out.h5" infer.log
"$python" "$source_dir/tools/onnx_heat_model.py" compare heat.onnx data.h5 onnx_out.h5

echo "== infer --model with a classifier: [samples, scores] once"
"$python" "$source_dir/tools/onnx_heat_model.py" export-classifier classifier.onnx > /dev/null 2>&1
run infer --model classifier.onnx --input data.h5 --output scores.h5 > classify.log
expect "infer: 6 samples -> scores.h5" classify.log
"$python" "$source_dir/tools/onnx_heat_model.py" compare classifier.onnx data.h5 scores.h5

echo "== train model: {type: onnx}, then infer --checkpoint"
cat > run.yaml <<YAML
run_dir: run
data: {path: data.h5, validation_samples: 2, periodic: true, normalize: false}
model: {type: onnx, path: heat.onnx, train_initializers: [scale]}
optimizer: {type: adam, lr: 1.0e-3}
training: {epochs: 2, batch_size: 2, loss: mse}
YAML
run train --config run.yaml > train.log
expect "epoch 2/2" train.log
expect "validation relative L2 error" train.log
run infer --checkpoint run --input data.h5 --output trained_out.h5 > infer_trained.log
expect "relative L2 error vs target" infer_trained.log

echo "== export the trained graph back to ONNX: it predicts what the checkpoint predicts"
run export --checkpoint run --output trained.onnx > export.log
expect "export: .* -> trained.onnx" export.log
run infer --model trained.onnx --input data.h5 --output exported_out.h5 > infer_exported.log
"$python" - <<'PY'
import sys
import h5py
import numpy as np
import onnx
onnx.checker.check_model("trained.onnx")
a = np.asarray(h5py.File("trained_out.h5", "r")["prediction"])
b = np.asarray(h5py.File("exported_out.h5", "r")["prediction"])
c = np.asarray(h5py.File("onnx_out.h5", "r")["prediction"])
error = np.abs(a - b).max() / np.abs(a).max()
changed = np.abs(a - c).max() / np.abs(c).max()
print(f"onnx_cli: exported graph vs checkpoint {error:.2e}; trained vs untrained {changed:.2e}")
sys.exit(0 if error <= 1e-6 and changed > 1e-4 else 1)
PY

echo "== training.precision: bf16 trains the graph's convs in bf16, its loss near float's"
sed -e 's/^run_dir: run$/run_dir: run_bf16/' -e 's/loss: mse}/loss: mse, precision: bf16}/' \
  run.yaml > run_bf16.yaml
run train --config run_bf16.yaml > train_bf16.log
expect "steps per epoch, bf16" train_bf16.log
"$python" - <<'PY'
import re
import sys
loss = lambda f: float(re.search(r"train: .* loss ([0-9.e+-]+),", open(f).read()).group(1))
a, b = loss("train.log"), loss("train_bf16.log")
print(f"onnx_cli: final loss float {a:.4e}, bf16 {b:.4e}")
sys.exit(0 if a != b and abs(a - b) <= 0.05 * a else 1)
PY

echo "== a file that is not ONNX"
head -c 300 heat.onnx > cut.onnx
set +e
run infer --model cut.onnx --input data.h5 --output never.h5 > cut.log 2>&1
status=$?
set -e
[ "$status" -ne 0 ] || { echo "FAIL: a truncated ONNX file was accepted"; cat cut.log; exit 1; }
expect "is not an ONNX model" cut.log
test ! -e never.h5 || { echo "FAIL: never.h5 was written"; exit 1; }
echo "onnx_cli: passed"
