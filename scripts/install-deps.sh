#!/usr/bin/env bash
# Installs ShardTensor's build and test dependencies from Debian 12 packages.
# Idempotent: packages already installed are not touched, and apt is not called at all
# when everything is present.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libtrilinos-kokkos-dev libtrilinos-kokkos-kernels-dev
  libopenblas-dev
  libopenmpi-dev openmpi-bin
  libhdf5-openmpi-dev
  catch2
  libyaml-cpp-dev libcli11-dev
  libfftw3-dev
  libhwy-dev                              # the host vector kernels (Google Highway)
  gfortran                                # the Fortran embedding module and example
  petsc-dev                               # examples/06_petsc and its tests (a PETSc solver)
  libonnx-dev libprotobuf-dev             # ONNX import (models/onnx_import.hpp)
  python3-onnx python3-torchvision        # the ONNX tests export PyTorch models at test time
  python3-torch python3-h5py python3-yaml  # PyTorch interop (tools/, its equivalence test)
  python3-matplotlib                      # plots of tools/scaling.py and tools/accuracy_curves.py
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
