# Sourced by the other scripts: MPI and BLAS settings for this project's runs.
# OpenMPI refuses to run as root without these; CI and containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# More ranks than cores: ranks yield instead of spinning while they wait.
export OMPI_MCA_mpi_yield_when_idle=1
# One BLAS thread per MPI rank.
export OPENBLAS_NUM_THREADS=1
