# Install rules: `cmake --install <build> [--prefix <dir>]` puts into the prefix
#
#   include/shardtensor/...                      every module's public headers (<module>/include)
#   lib/libshardtensor.a (or .so)                the library
#   bin/shardtensor                              the command-line tool
#   lib/cmake/ShardTensor/                       package config: find_package(ShardTensor)
#       ShardTensorConfig.cmake, ShardTensorConfigVersion.cmake, ShardTensorTargets*.cmake,
#       ShardTensorKokkos.cmake                  (the same Kokkos repair the build uses)
#   lib/pkgconfig/shardtensor.pc                 pkg-config file
#
# The build directory itself is a package too (ShardTensorConfig.cmake, ShardTensorTargets.cmake
# and ShardTensorKokkos.cmake at its top): find_package(ShardTensor) works against it as well.
#
# (lib is GNUInstallDirs' CMAKE_INSTALL_LIBDIR, e.g. lib/x86_64-linux-gnu under /usr.)
# Included once at the end of the top-level CMakeLists.txt, after every target exists.
# Both the CMake package and the .pc file are relocatable: the prefix can move.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(SHARDTENSOR_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/ShardTensor"
    CACHE STRING "Where the CMake package config is installed, relative to the prefix")
set(SHARDTENSOR_INSTALL_PKGCONFIGDIR "${CMAKE_INSTALL_LIBDIR}/pkgconfig"
    CACHE STRING "Where shardtensor.pc is installed, relative to the prefix")

# Every module whose public headers go into the prefix; a module without an include/
# directory (yet) is skipped.
get_property(SHARDTENSOR_INSTALL_MODULES GLOBAL PROPERTY SHARDTENSOR_MODULES)

# ---- headers ------------------------------------------------------------------------------
foreach(_st_module IN LISTS SHARDTENSOR_INSTALL_MODULES)
  if(EXISTS "${PROJECT_SOURCE_DIR}/${_st_module}/include")
    install(DIRECTORY "${PROJECT_SOURCE_DIR}/${_st_module}/include/"
            DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" COMPONENT ShardTensor_Development)
  endif()
endforeach()

# Fortran module files (.mod) are compiled, so they live in the build tree: install those
# found, at install time, in the binary directories of the top level and of capi/ and in
# the Fortran_MODULE_DIRECTORY of any ShardTensor library target.
set(_st_fortran_module_dirs "${PROJECT_BINARY_DIR}" "${PROJECT_BINARY_DIR}/capi")
foreach(_st_target IN ITEMS shardtensor shardtensor_capi shardtensor_fortran)
  if(TARGET ${_st_target})
    get_target_property(_st_dir ${_st_target} Fortran_MODULE_DIRECTORY)
    if(_st_dir)
      list(APPEND _st_fortran_module_dirs "${_st_dir}")
    endif()
  endif()
endforeach()
install(CODE "
  foreach(_dir IN ITEMS ${_st_fortran_module_dirs})
    file(GLOB _mods \"\${_dir}/*.mod\")
    if(_mods)
      file(INSTALL DESTINATION \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_INCLUDEDIR}\"
           TYPE FILE FILES \${_mods})
    endif()
  endforeach()" COMPONENT ShardTensor_Development)

# ---- the library ----------------------------------------------------------------------------
# Include directories inside the source or build tree are only valid there. Modules spell
# them $<BUILD_INTERFACE:...>/$<INSTALL_INTERFACE:include>; a plain path that slipped in is
# wrapped here so that install(EXPORT) does not reject the target.
get_target_property(_st_includes shardtensor INTERFACE_INCLUDE_DIRECTORIES)
if(_st_includes)
  set(_st_fixed_includes "")
  set(_st_changed FALSE)
  foreach(_st_dir IN LISTS _st_includes)
    if(NOT _st_dir MATCHES "^\\$<" AND (_st_dir MATCHES "^${PROJECT_SOURCE_DIR}/" OR
                                        _st_dir MATCHES "^${PROJECT_BINARY_DIR}/"))
      set(_st_dir "$<BUILD_INTERFACE:${_st_dir}>")
      set(_st_changed TRUE)
    elseif(_st_dir STREQUAL "$<INSTALL_INTERFACE:include>" AND
           NOT CMAKE_INSTALL_INCLUDEDIR STREQUAL "include")
      set(_st_dir "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")
      set(_st_changed TRUE)
    endif()
    list(APPEND _st_fixed_includes "${_st_dir}")
  endforeach()
  if(_st_changed)
    set_target_properties(shardtensor PROPERTIES INTERFACE_INCLUDE_DIRECTORIES
                                                 "${_st_fixed_includes}")
  endif()
endif()

install(TARGETS shardtensor EXPORT ShardTensorTargets
        ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT ShardTensor_Development
        LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT ShardTensor_Runtime
        RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}" COMPONENT ShardTensor_Runtime)

# Further ShardTensor libraries a module may define as their own targets (e.g. the C API).
foreach(_st_module IN LISTS SHARDTENSOR_INSTALL_MODULES)
  if(TARGET shardtensor_${_st_module})
    get_target_property(_st_type shardtensor_${_st_module} TYPE)
    get_target_property(_st_imported shardtensor_${_st_module} IMPORTED)
    if(NOT _st_imported AND _st_type MATCHES "^(STATIC|SHARED)_LIBRARY$")
      install(TARGETS shardtensor_${_st_module} EXPORT ShardTensorTargets
              ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT ShardTensor_Development
              LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT ShardTensor_Runtime
              RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}" COMPONENT ShardTensor_Runtime)
    endif()
  endif()
endforeach()

# ---- the command-line tool ------------------------------------------------------------------
if(TARGET shardtensor_cli)
  # Keep the run paths of dependencies outside the system directories (an upstream Kokkos
  # in /opt, say), and find a shared libshardtensor next door.
  set_target_properties(shardtensor_cli PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE
                                                   EXPORT_NAME cli)
  get_target_property(_st_library_type shardtensor TYPE)
  if(_st_library_type STREQUAL "SHARED_LIBRARY")
    file(RELATIVE_PATH _st_bin_to_lib "/prefix/${CMAKE_INSTALL_BINDIR}"
         "/prefix/${CMAKE_INSTALL_LIBDIR}")
    set_property(TARGET shardtensor_cli APPEND PROPERTY INSTALL_RPATH "$ORIGIN/${_st_bin_to_lib}")
  endif()
  install(TARGETS shardtensor_cli EXPORT ShardTensorTargets
          RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}" COMPONENT ShardTensor_Runtime)
endif()

# ---- CMake package: find_package(ShardTensor) -> ShardTensor::shardtensor, ShardTensor::cli --
install(EXPORT ShardTensorTargets NAMESPACE ShardTensor::
        DESTINATION "${SHARDTENSOR_INSTALL_CMAKEDIR}" COMPONENT ShardTensor_Development)

# Where the build found its dependencies: the installed config searches there last, so a
# consumer needs no extra hints for the same machine (and can still override them).
set(SHARDTENSOR_KOKKOS_DIR_HINT "${Kokkos_DIR}")
set(SHARDTENSOR_KOKKOSKERNELS_DIR_HINT "${KokkosKernels_DIR}")
set(SHARDTENSOR_YAML_CPP_DIR_HINT "${yaml-cpp_DIR}")
configure_package_config_file(
  "${PROJECT_SOURCE_DIR}/cmake/ShardTensorConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/ShardTensorConfig.cmake"
  INSTALL_DESTINATION "${SHARDTENSOR_INSTALL_CMAKEDIR}")
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/ShardTensorConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}" COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/ShardTensorConfig.cmake"
              "${PROJECT_BINARY_DIR}/ShardTensorConfigVersion.cmake"
              "${PROJECT_SOURCE_DIR}/cmake/ShardTensorKokkos.cmake"
        DESTINATION "${SHARDTENSOR_INSTALL_CMAKEDIR}" COMPONENT ShardTensor_Development)

# ---- the same package in the build tree: find_package(ShardTensor) with ShardTensor_DIR (or
# CMAKE_PREFIX_PATH) pointing at the build directory, no install needed. The targets there
# use the build tree's headers and library; the Kokkos repair is copied beside the config.
export(EXPORT ShardTensorTargets NAMESPACE ShardTensor::
       FILE "${PROJECT_BINARY_DIR}/ShardTensorTargets.cmake")
configure_file("${PROJECT_SOURCE_DIR}/cmake/ShardTensorKokkos.cmake"
               "${PROJECT_BINARY_DIR}/ShardTensorKokkos.cmake" COPYONLY)

# ---- pkg-config: shardtensor.pc -------------------------------------------------------------
# Kokkos ships no .pc file, so `Requires:` cannot name it; instead the compile and link flags
# of every dependency are read from the same CMake targets the library links (Kokkos, Kokkos
# Kernels + BLAS, MPI, HDF5, yaml-cpp) and written out. The dependencies are public (the
# headers use Kokkos and MPI), so they go into Libs, not Libs.private. Their paths are
# absolute: the .pc file is for the machine the library was built on.

# Simplifies one entry of a usage-requirement property; sets `out` to "" to drop it.
function(_shardtensor_pc_simplify entry out)
  set(value "${entry}")
  if(value MATCHES "^\\$<LINK_ONLY:(.*)>$")
    set(value "${CMAKE_MATCH_1}")
  endif()
  if(value MATCHES "^\\$<\\$<COMPILE_LANGUAGE:([A-Za-z,]*)>:(.*)>$")
    set(languages "${CMAKE_MATCH_1}")
    set(option "${CMAKE_MATCH_2}")  # (the next MATCHES overwrites CMAKE_MATCH_*)
    if(languages MATCHES "(^|,)CXX(,|$)")
      set(value "${option}")
    else()
      set(value "")
    endif()
  endif()
  if(value MATCHES "^\\$<\\$<COMPILE_LANG_AND_ID:CXX,[^>]*>:(.*)>$")
    set(value "${CMAKE_MATCH_1}")
  endif()
  if(value MATCHES "^\\$<INSTALL_INTERFACE:")
    set(value "")
  endif()
  if(value MATCHES "^\\$<BUILD_INTERFACE:(.*)>$")
    set(value "${CMAKE_MATCH_1}")
  endif()
  if(value MATCHES "\\$<")
    message(VERBOSE "ShardTensor pkg-config: ignoring generator expression '${entry}'")
    set(value "")
  endif()
  string(REGEX REPLACE "^SHELL:" "" value "${value}")
  set(${out} "${value}" PARENT_SCOPE)
endfunction()

# The file an imported library target links, for the build's configuration.
function(_shardtensor_pc_imported_location target out)
  set(location "")
  string(TOUPPER "${CMAKE_BUILD_TYPE}" config)
  get_target_property(mapped ${target} MAP_IMPORTED_CONFIG_${config})
  get_target_property(configs ${target} IMPORTED_CONFIGURATIONS)
  set(candidates "")
  if(mapped)
    list(APPEND candidates ${mapped})
  endif()
  if(config)
    list(APPEND candidates ${config})
  endif()
  if(configs)
    list(APPEND candidates ${configs})
  endif()
  foreach(c IN LISTS candidates)
    string(TOUPPER "${c}" c)
    get_target_property(location ${target} IMPORTED_LOCATION_${c})
    if(location)
      break()
    endif()
  endforeach()
  if(NOT location)
    get_target_property(location ${target} IMPORTED_LOCATION)
  endif()
  if(NOT location)
    set(location "")
  endif()
  set(${out} "${location}" PARENT_SCOPE)
endfunction()

# Appends each usable entry of <target>'s <property> to global property <list> as
# <prefix><entry> (an entry already written with the prefix keeps one; "LINKER:" becomes
# "-Wl,"). Generator expressions are simplified first; unset or NOTFOUND entries are skipped.
function(_shardtensor_pc_append_property target property list prefix)
  get_target_property(values ${target} ${property})
  foreach(value IN LISTS values)
    _shardtensor_pc_simplify("${value}" value)
    if(value AND NOT value MATCHES "-NOTFOUND$")
      if(prefix)
        string(REGEX REPLACE "^${prefix}" "" value "${value}")
      endif()
      string(REGEX REPLACE "^LINKER:" "-Wl," value "${value}")
      set_property(GLOBAL APPEND PROPERTY ${list} "${prefix}${value}")
    endif()
  endforeach()
endfunction()

# Depth-first walk of a link item: appends to the global properties
# _ST_PC_CFLAGS (compile flags) and _ST_PC_LIBS (link items, every occurrence, in order).
function(_shardtensor_pc_walk item depth)
  if(depth GREATER 40)
    message(FATAL_ERROR "ShardTensor pkg-config: link dependencies nested too deep at ${item}")
  endif()
  _shardtensor_pc_simplify("${item}" item)
  if(item STREQUAL "" OR item MATCHES "^::@")
    return()  # nothing, or the directory markers target_link_libraries adds from other dirs
  endif()
  if(NOT TARGET "${item}")
    if(item MATCHES "^-D")
      return()  # a definition in a link interface (Debian's Kokkos had one): not a link flag
    elseif(item MATCHES "^-" OR IS_ABSOLUTE "${item}")
      set_property(GLOBAL APPEND PROPERTY _ST_PC_LIBS "${item}")
    elseif(item MATCHES "::")
      message(FATAL_ERROR "ShardTensor pkg-config: link target ${item} not found")
    else()
      set_property(GLOBAL APPEND PROPERTY _ST_PC_LIBS "-l${item}")
    endif()
    return()
  endif()
  get_target_property(aliased ${item} ALIASED_TARGET)
  if(aliased)
    set(item "${aliased}")
  endif()
  get_target_property(type ${item} TYPE)
  if(item STREQUAL "shardtensor")
    set_property(GLOBAL APPEND PROPERTY _ST_PC_LIBS "-lshardtensor")
  else()
    get_target_property(imported ${item} IMPORTED)
    if(imported AND NOT type STREQUAL "INTERFACE_LIBRARY")
      _shardtensor_pc_imported_location(${item} location)
      if(location)
        set_property(GLOBAL APPEND PROPERTY _ST_PC_LIBS "${location}")
      endif()
    elseif(NOT imported AND NOT type STREQUAL "INTERFACE_LIBRARY")
      message(FATAL_ERROR "ShardTensor pkg-config: cannot express the built target ${item}")
    endif()
    # Compile flags, once per target.
    get_property(seen GLOBAL PROPERTY _ST_PC_SEEN)
    if(NOT item IN_LIST seen)
      set_property(GLOBAL APPEND PROPERTY _ST_PC_SEEN "${item}")
      _shardtensor_pc_append_property(${item} INTERFACE_INCLUDE_DIRECTORIES _ST_PC_CFLAGS "-I")
      _shardtensor_pc_append_property(${item} INTERFACE_SYSTEM_INCLUDE_DIRECTORIES _ST_PC_CFLAGS "-I")
      _shardtensor_pc_append_property(${item} INTERFACE_COMPILE_DEFINITIONS _ST_PC_CFLAGS "-D")
      _shardtensor_pc_append_property(${item} INTERFACE_COMPILE_OPTIONS _ST_PC_CFLAGS "")
    endif()
  endif()
  # Link options and directories, then the dependencies (after the library: static order).
  _shardtensor_pc_append_property(${item} INTERFACE_LINK_OPTIONS _ST_PC_LIBS "")
  _shardtensor_pc_append_property(${item} INTERFACE_LINK_DIRECTORIES _ST_PC_LIBS "-L")
  get_target_property(dependencies ${item} INTERFACE_LINK_LIBRARIES)
  if(dependencies)
    math(EXPR next "${depth} + 1")
    foreach(dependency IN LISTS dependencies)
      _shardtensor_pc_walk("${dependency}" ${next})
    endforeach()
  endif()
endfunction()

set_property(GLOBAL PROPERTY _ST_PC_CFLAGS "")
set_property(GLOBAL PROPERTY _ST_PC_LIBS "")
set_property(GLOBAL PROPERTY _ST_PC_SEEN "")
_shardtensor_pc_walk(shardtensor 0)
get_property(_st_pc_cflags GLOBAL PROPERTY _ST_PC_CFLAGS)
get_property(_st_pc_libs GLOBAL PROPERTY _ST_PC_LIBS)
list(REMOVE_DUPLICATES _st_pc_cflags)
# Keep the last occurrence of each library: a dependency stays after everything needing it.
list(REVERSE _st_pc_libs)
list(REMOVE_DUPLICATES _st_pc_libs)
list(REVERSE _st_pc_libs)
list(REMOVE_ITEM _st_pc_libs "-lshardtensor")
list(REMOVE_ITEM _st_pc_cflags "-I/usr/include")  # pkg-config drops it anyway; keep it tidy
# Run paths for shared libraries outside the linker's own directories (as CMake adds them
# to the targets it links), so programs linked with these flags find them at run time.
set(_st_pc_extra "")
foreach(_st_lib IN LISTS _st_pc_libs)
  if(IS_ABSOLUTE "${_st_lib}" AND _st_lib MATCHES "\\.so(\\.[0-9]+)*$")
    get_filename_component(_st_dir "${_st_lib}" DIRECTORY)
    if(NOT _st_dir IN_LIST CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES AND
       NOT _st_dir IN_LIST CMAKE_PLATFORM_IMPLICIT_LINK_DIRECTORIES)
      list(APPEND _st_pc_extra "-Wl,-rpath,${_st_dir}")
    endif()
  endif()
endforeach()
list(REMOVE_DUPLICATES _st_pc_extra)
get_target_property(_st_library_type shardtensor TYPE)
if(_st_library_type STREQUAL "SHARED_LIBRARY")
  list(APPEND _st_pc_extra "-Wl,-rpath,\${libdir}")  # libshardtensor.so in the prefix
endif()
# A static libshardtensor.a linked by a C or Fortran program (the C API) needs the C++
# runtime, which the C++ compiler driver adds by itself but cc and gfortran do not.
if(_st_library_type STREQUAL "STATIC_LIBRARY" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  list(APPEND _st_pc_extra "-lstdc++")
endif()
list(APPEND _st_pc_libs ${_st_pc_extra})
list(JOIN _st_pc_cflags " " SHARDTENSOR_PC_DEPENDENCY_CFLAGS)
list(JOIN _st_pc_libs " " SHARDTENSOR_PC_DEPENDENCY_LIBS)

# The prefix relative to the .pc file's directory, so the installed tree can move.
file(RELATIVE_PATH _st_pc_to_prefix "/prefix/${SHARDTENSOR_INSTALL_PKGCONFIGDIR}" "/prefix")
string(REGEX REPLACE "/$" "" _st_pc_to_prefix "${_st_pc_to_prefix}")
set(SHARDTENSOR_PC_PREFIX "\${pcfiledir}/${_st_pc_to_prefix}")
configure_file("${PROJECT_SOURCE_DIR}/cmake/shardtensor.pc.in"
               "${PROJECT_BINARY_DIR}/shardtensor.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/shardtensor.pc"
        DESTINATION "${SHARDTENSOR_INSTALL_PKGCONFIGDIR}" COMPONENT ShardTensor_Development)
