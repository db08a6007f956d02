#!/usr/bin/env bash
# The house's rules that a grep can check (docs/architecture.md, "Two checks"): run by ctest
# (architecture_checks) and so by CI. Prints each broken rule with the lines that break it;
# exits 1 if any.
#
#   bash scripts/check-architecture.sh [SOURCE_DIR]
set -uo pipefail
root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
cd "$root" || exit 2

# The library's folders and the programs beside it (build trees and third-party code are not
# the house's).
library=(core comm io config kernels autograd layers optim data spectral models train embed capi apps)
programs=(tests examples bench)
failed=0

# Lines of `grep -rn PATTERN` over FOLDERS that are not in an allowed file.
offenders() {
  local pattern="$1" allowed="$2"
  shift 2
  grep -rnE "$pattern" --include=*.cpp --include=*.hpp --include=*.h --include=*.c "$@" 2>/dev/null |
    grep -vE "$allowed"
}

rule() {
  local name="$1" lines="$2"
  if [ -n "$lines" ]; then
    echo "architecture check failed: $name"
    echo "$lines" | sed 's/^/  /'
    failed=1
  else
    echo "architecture check passed: $name"
  fi
}

# MPI is called only in comm/ (tests, examples and benchmarks are programs of their own).
rule "MPI is called only in comm/" \
  "$(offenders 'MPI_[A-Z][a-z_]*\(' '^comm/' "${library[@]}")"

# No raw vector intrinsics: the host vector kernels are written once on Highway. The two
# exceptions are what Highway does not offer: AMX tiles, and AVX512-BF16 dot products.
rule "raw vector intrinsics only in the AMX tiles and the bf16 dot products" \
  "$(offenders 'immintrin|arm_neon\.h|_mm512_|_mm256_' \
       '^kernels/backends/host/(amx/amx_tiles|vector_kernels)\.cpp:' "${library[@]}" "${programs[@]}")"

# Highway is named only in the host backend.
rule "Highway only in kernels/backends/host/" \
  "$(offenders '[<"]hwy/' '^kernels/backends/host/' "${library[@]}" "${programs[@]}")"

# NCCL and cuDNN are named only in their backends' folders.
rule "NCCL only in comm/" \
  "$(offenders '[<"]nccl\.h' '^comm/' "${library[@]}")"
rule "cuDNN only in kernels/backends/cuda/" \
  "$(offenders '[<"]cudnn' '^kernels/backends/cuda/' "${library[@]}")"

# Reference pages say what is, not how it came to be: dated history lives in docs/history/.
docs_lines="$(grep -nEi 'stop [0-9]+|this session' README.md docs/*.md 2>/dev/null)"
rule "no 'stop N' or 'this session' in README.md and docs/*.md (history goes to docs/history/)" \
  "$docs_lines"

exit "$failed"
