# shardtensor_add_mpi_test(<name> SOURCES <files...> [RANKS <counts...>] [TIMEOUT <s>])
#
# Builds one test executable (with the project's MPI + Kokkos Catch2 main) and registers
# it with ctest once per rank count, as <name>_np<R>. Rank counts above the number of
# cores run oversubscribed, with ranks yielding when idle so they do not spin.

set(SHARDTENSOR_TEST_RANKS 1 2 3 4 8 CACHE STRING "Rank counts every MPI test runs at")

function(shardtensor_add_mpi_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;RANKS" ${ARGN})
  if(NOT ARG_RANKS)
    set(ARG_RANKS ${SHARDTENSOR_TEST_RANKS})
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE shardtensor_test_main)
  foreach(ranks IN LISTS ARG_RANKS)
    add_test(NAME ${name}_np${ranks}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks}
                     --oversubscribe --bind-to none
                     ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${name}> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${name}_np${ranks} PROPERTIES
      TIMEOUT ${ARG_TIMEOUT}
      PROCESSORS ${ranks}
      LABELS "mpi;np${ranks}"
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_mpi_yield_when_idle=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1")
  endforeach()
endfunction()
