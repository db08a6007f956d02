# Finds Kokkos (and Kokkos Kernels when present) and provides two targets:
#   Kokkos::kokkos                 the core library
#   ShardTensor::kokkoskernels     Kokkos Kernels (BLAS wrappers), if found
#
# An upstream Kokkos 4.x install exports correct targets and this file leaves them alone.
# Debian 12's Trilinos packaging (Kokkos 3.4.1) is broken in two ways, repaired here:
#   - Kokkos::kokkos carries INTERFACE_INCLUDE_DIRECTORIES /usr/lib/include, which does
#     not exist; the headers are in /usr/include/trilinos (Kokkos_INCLUDE_DIRS says so);
#   - Kokkos Kernels exports `trilinos_kokkoskernels`, not `Kokkos::kokkoskernels`.
#
# The build includes this file from CMakeLists.txt; the installed package config includes
# its installed copy (lib/cmake/ShardTensor) with SHARDTENSOR_KOKKOS_FROM_PACKAGE_CONFIG set,
# so a missing Kokkos makes find_package(ShardTensor) fail politely instead of stopping
# CMake, and SHARDTENSOR_KOKKOS_HINTS / SHARDTENSOR_KOKKOSKERNELS_HINTS name the directories
# the build found them in (searched last). Including it twice is harmless.

if(SHARDTENSOR_KOKKOS_FROM_PACKAGE_CONFIG)
  include(CMakeFindDependencyMacro)
  if(SHARDTENSOR_KOKKOS_HINTS)
    find_dependency(Kokkos HINTS ${SHARDTENSOR_KOKKOS_HINTS})
  else()
    find_dependency(Kokkos)  # returns from this file on failure, with a message
  endif()
else()
  find_package(Kokkos REQUIRED)
endif()

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
    if(NOT SHARDTENSOR_KOKKOS_FROM_PACKAGE_CONFIG)
      message(STATUS "ShardTensor: repairing Kokkos::kokkos include directory -> ${_st_kokkos_real_include}")
    endif()
    set_target_properties(Kokkos::kokkos PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${_st_kokkos_real_include}"
      # The Trilinos export smuggles "-DKOKKOS_DEPENDENCE" into the link line.
      INTERFACE_LINK_LIBRARIES "trilinos_kokkosalgorithms;trilinos_kokkoscontainers;trilinos_kokkoscore")
  endif()
endif()

if(SHARDTENSOR_KOKKOSKERNELS_HINTS)
  find_package(KokkosKernels QUIET HINTS ${SHARDTENSOR_KOKKOSKERNELS_HINTS})
else()
  find_package(KokkosKernels QUIET)
endif()
if(TARGET ShardTensor::kokkoskernels)
  # already made (this file was included before in this directory)
elseif(TARGET Kokkos::kokkoskernels)
  add_library(ShardTensor::kokkoskernels INTERFACE IMPORTED)
  target_link_libraries(ShardTensor::kokkoskernels INTERFACE Kokkos::kokkoskernels)
elseif(TARGET trilinos_kokkoskernels)
  add_library(ShardTensor::kokkoskernels INTERFACE IMPORTED)
  target_link_libraries(ShardTensor::kokkoskernels INTERFACE trilinos_kokkoskernels Kokkos::kokkos)
endif()

# The backend that kernels run on: Kokkos' default execution space (CUDA before OpenMP before
# Serial). Tests are labelled with it and get its environment (threads per rank).
string(TOUPPER "${Kokkos_DEVICES}" _st_kokkos_devices)
if(_st_kokkos_devices MATCHES "CUDA")
  set(SHARDTENSOR_KOKKOS_BACKEND cuda)
elseif(_st_kokkos_devices MATCHES "OPENMP")
  set(SHARDTENSOR_KOKKOS_BACKEND openmp)
else()
  set(SHARDTENSOR_KOKKOS_BACKEND serial)
endif()

if(DEFINED Kokkos_VERSION AND NOT SHARDTENSOR_KOKKOS_FROM_PACKAGE_CONFIG)
  message(STATUS "ShardTensor: Kokkos ${Kokkos_VERSION}, devices: ${Kokkos_DEVICES}, "
                 "kernels run on: ${SHARDTENSOR_KOKKOS_BACKEND}")
endif()
