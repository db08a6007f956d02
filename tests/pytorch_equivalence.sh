#!/usr/bin/env bash
# PyTorch interop: models built in PyTorch, exported with tools/export_pytorch.py, give the
# same outputs in `shardtensor infer` on 1 and 2 ranks (tests/pytorch_equivalence.py).
#   tests/pytorch_equivalence.sh <path to shardtensor> <repository root>
# Exits 77 (ctest: skipped) with "SKIPPED: ..." when python3-torch or python3-h5py is missing.
# SHARDTENSOR_PYTHON picks the interpreter (default /usr/bin/python3, Debian's, which has
# python3-torch; a pyenv or venv python3 earlier on PATH usually does not).
set -euo pipefail
bin="$1"
source_dir="$2"
skip_code=77

python="${SHARDTENSOR_PYTHON:-/usr/bin/python3}"
if [ ! -x "$python" ]; then python="$(command -v python3 || true)"; fi
if [ -z "$python" ]; then
  echo "SKIPPED: python3-torch not installed (no python3)"
  exit $skip_code
fi
if ! "$python" -c "import torch" > /dev/null 2>&1; then
  echo "SKIPPED: python3-torch not installed (for $python)"
  exit $skip_code
fi
for module in h5py yaml numpy; do
  if ! "$python" -c "import $module" > /dev/null 2>&1; then
    echo "SKIPPED: python3-$module not installed (for $python)"
    exit $skip_code
  fi
done

# shellcheck source=/dev/null
source "$source_dir/scripts/env.sh"
# One torch thread: the test runs next to MPI ranks and other tests.
export OMP_NUM_THREADS=1
# Leave no __pycache__ in the source tree.
export PYTHONDONTWRITEBYTECODE=1
exec "$python" "$source_dir/tests/pytorch_equivalence.py" --cli "$bin" --source "$source_dir"
