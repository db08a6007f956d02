# The CUDA libraries that are optional parts of a CUDA build (NCCL in comm/, cuDNN in kernels/).
#
#   shardtensor_find_cuda_library(<PREFIX> <header> <library> <home variable> <option>)
#
# finds <header> and lib<library> in the CUDA toolkit's folders or under $ENV{<home variable>}
# and sets the cache variables <PREFIX>_INCLUDE_DIR and <PREFIX>_LIBRARY; where either is
# missing, configuring stops with an error that names both ways out (the home variable, or
# -D<option>=OFF).

function(shardtensor_find_cuda_library prefix header library home option)
  find_package(CUDAToolkit REQUIRED)
  find_path(${prefix}_INCLUDE_DIR ${header} HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV ${home}
            PATH_SUFFIXES include)
  find_library(${prefix}_LIBRARY ${library} HINTS ${CUDAToolkit_LIBRARY_DIR}
               "${CUDAToolkit_LIBRARY_ROOT}/lib" "${CUDAToolkit_LIBRARY_ROOT}/lib64" ENV ${home}
               PATH_SUFFIXES lib lib64)
  if(NOT ${prefix}_INCLUDE_DIR OR NOT ${prefix}_LIBRARY)
    message(FATAL_ERROR "${option}: ${header} or lib${library} not found (set ${home}, or "
                        "configure with -D${option}=OFF)")
  endif()
endfunction()
