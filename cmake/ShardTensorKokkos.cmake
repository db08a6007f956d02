# Finds Kokkos (and Kokkos Kernels when present) and provides two targets:
#   Kokkos::kokkos                 the core library
#   ShardTensor::kokkoskernels     Kokkos Kernels (BLAS wrappers), if found
#
# An upstream Kokkos 4.x install exports correct targets and this file leaves them alone.
# Debian 12's Trilinos packaging (Kokkos 3.4.1) is broken in two ways, repaired here:
#   - Kokkos::kokkos carries INTERFACE_INCLUDE_DIRECTORIES /usr/lib/include, which does
#     not exist; the headers are in /usr/include/trilinos (Kokkos_INCLUDE_DIRS says so);
#   - Kokkos Kernels exports `trilinos_kokkoskernels`, not `Kokkos::kokkoskernels`.

find_package(Kokkos REQUIRED)

if(TARGET Kokkos::kokkos AND Kokkos_INCLUDE_DIRS)
  get_target_property(_st_kokkos_includes Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
  set(_st_kokkos_broken FALSE)
  foreach(_dir IN LISTS _st_kokkos_includes)
    if(NOT _dir MATCHES "^\\$<" AND NOT EXISTS "${_dir}")
      set(_st_kokkos_broken TRUE)
    endif()
  endforeach()
  if(_st_kokkos_broken)
    get_filename_component(_st_kokkos_real_include "${Kokkos_INCLUDE_DIRS}" REALPATH)
    message(STATUS "ShardTensor: repairing Kokkos::kokkos include directory -> ${_st_kokkos_real_include}")
    set_target_properties(Kokkos::kokkos PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${_st_kokkos_real_include}"
      # The Trilinos export smuggles "-DKOKKOS_DEPENDENCE" into the link line.
      INTERFACE_LINK_LIBRARIES "trilinos_kokkosalgorithms;trilinos_kokkoscontainers;trilinos_kokkoscore")
  endif()
endif()

find_package(KokkosKernels QUIET)
if(TARGET Kokkos::kokkoskernels)
  add_library(ShardTensor::kokkoskernels INTERFACE IMPORTED)
  target_link_libraries(ShardTensor::kokkoskernels INTERFACE Kokkos::kokkoskernels)
elseif(TARGET trilinos_kokkoskernels)
  add_library(ShardTensor::kokkoskernels INTERFACE IMPORTED)
  target_link_libraries(ShardTensor::kokkoskernels INTERFACE trilinos_kokkoskernels Kokkos::kokkos)
endif()

if(DEFINED Kokkos_VERSION)
  message(STATUS "ShardTensor: Kokkos ${Kokkos_VERSION}, devices: ${Kokkos_DEVICES}")
endif()
