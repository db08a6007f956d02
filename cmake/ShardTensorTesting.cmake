# MPI tests: every test program, example and benchmark smoke run is started under mpirun at
# one or more rank counts, as <name>_np<R>. Rank counts above the number of cores run
# oversubscribed, with ranks yielding when idle so they do not spin. Every test carries the
# label of the backend its kernels ran on (serial, openmp, cuda); on OpenMP each rank runs
# SHARDTENSOR_TEST_THREADS threads that sleep, not spin, while they wait (ranks x threads
# oversubscribe the cores).

set(SHARDTENSOR_TEST_RANKS 1 2 3 4 8 CACHE STRING "Rank counts every MPI test runs at")
set(SHARDTENSOR_MPI_TEST_ENVIRONMENT
    "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_mpi_yield_when_idle=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1")
set(SHARDTENSOR_TEST_THREADS 2 CACHE STRING "OpenMP threads per rank in tests (OpenMP backend)")
if(SHARDTENSOR_KOKKOS_BACKEND STREQUAL "openmp")
  list(APPEND SHARDTENSOR_MPI_TEST_ENVIRONMENT "OMP_NUM_THREADS=${SHARDTENSOR_TEST_THREADS}"
       "OMP_WAIT_POLICY=passive" "OMP_PROC_BIND=false" "KOKKOS_DISABLE_WARNINGS=1")
endif()

# shardtensor_add_mpi_runs(<target> RANKS <counts...> [NAME <name>] [TIMEOUT <s>]
#                          [LABEL <label>] [PASS_REGULAR_EXPRESSION <re>] [ARGS <args...>]
#                          [ENVIRONMENT <VAR=value...>])
#
# Registers <name>_np<R> (name defaults to the target's) running the built <target> with
# <args> on R ranks, with ENVIRONMENT added to the tests' own. Without
# PASS_REGULAR_EXPRESSION the exit code decides.
function(shardtensor_add_mpi_runs target)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT;LABEL;PASS_REGULAR_EXPRESSION" "RANKS;ARGS;ENVIRONMENT"
                        ${ARGN})
  if(NOT ARG_NAME)
    set(ARG_NAME ${target})
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  if(NOT ARG_LABEL)
    set(ARG_LABEL mpi)
  endif()
  foreach(ranks IN LISTS ARG_RANKS)
    add_test(NAME ${ARG_NAME}_np${ranks}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks}
                     --oversubscribe --bind-to none
                     ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${target}> ${MPIEXEC_POSTFLAGS} ${ARG_ARGS})
    set_tests_properties(${ARG_NAME}_np${ranks} PROPERTIES
      TIMEOUT ${ARG_TIMEOUT}
      PROCESSORS ${ranks}
      LABELS "${ARG_LABEL};np${ranks};${SHARDTENSOR_KOKKOS_BACKEND}"
      ENVIRONMENT "${SHARDTENSOR_MPI_TEST_ENVIRONMENT};${ARG_ENVIRONMENT}")
    if(ARG_PASS_REGULAR_EXPRESSION)
      set_tests_properties(${ARG_NAME}_np${ranks} PROPERTIES
        PASS_REGULAR_EXPRESSION "${ARG_PASS_REGULAR_EXPRESSION}")
    endif()
  endforeach()
endfunction()

# shardtensor_add_mpi_test(<name> SOURCES <files...> [RANKS <counts...>] [TIMEOUT <s>])
#
# Builds one Catch2 test executable (with the project's MPI + Kokkos main) and registers it
# at each rank count (default SHARDTENSOR_TEST_RANKS).
function(shardtensor_add_mpi_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;RANKS" ${ARGN})
  if(NOT ARG_RANKS)
    set(ARG_RANKS ${SHARDTENSOR_TEST_RANKS})
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE shardtensor_test_main)
  shardtensor_add_mpi_runs(${name} RANKS ${ARG_RANKS} TIMEOUT ${ARG_TIMEOUT})
endfunction()
