# Sourced by the other scripts: MPI and BLAS settings for this project's runs.
# OpenMPI refuses to run as root without these; CI and containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# More ranks than cores: ranks yield instead of spinning while they wait.
export OMPI_MCA_mpi_yield_when_idle=1
# One BLAS thread per MPI rank.
export OPENBLAS_NUM_THREADS=1
# OpenBLAS's AVX-512 kernels where the CPU has them (about twice the Haswell kernels' sgemm
# rate); set SHARDTENSOR_KEEP_CORETYPE=1 to keep an OPENBLAS_CORETYPE chosen by the caller.
if [ -z "${SHARDTENSOR_KEEP_CORETYPE:-}" ] && [ -r /proc/cpuinfo ] &&
   grep -qw avx512f /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo &&
   grep -qw avx512dq /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo; then
  export OPENBLAS_CORETYPE=SkylakeX
fi
