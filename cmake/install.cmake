# `cmake --install build [--prefix P]`: the public API as a library for programs outside the tree.
#   P/include/diffucoder/diffucoder.h, batch.h  the public headers (standard library only)
#   P/lib/libdiffucoder.a                       one static archive: the objects of every layer the facade needs
#   P/lib/cmake/diffucoder/                      find_package(diffucoder CONFIG) → diffucoder::diffucoder
#   P/lib/pkgconfig/diffucoder.pc               pkg-config --cflags --libs diffucoder
#   P/bin/diffucoder                            the CLI
# One archive rather than the layers' (dc_core, dc_io, ...): consumers link one name, the layer graph stays
# internal, and the layers' build-tree include paths and imported dependencies (nlohmann_json, the pkg-config
# targets) never reach an export. What the archive's objects call outside it is linked by name: Threads, MPI
# when the build has it, and the system libraries of the layers (pcre2-8, utf8proc, seccomp, dl).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The dc_ layers dc_api links, directly or through other layers (static or header-only).
function(dc_collect_layers target out_var)
  set(seen ${${out_var}})
  get_target_property(deps ${target} INTERFACE_LINK_LIBRARIES)
  foreach(dep IN LISTS deps)
    string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" dep "${dep}")
    if(dep MATCHES "^dc_[a-z_0-9]+$" AND TARGET ${dep} AND NOT dep IN_LIST seen)
      list(APPEND seen ${dep})
      dc_collect_layers(${dep} seen)
    endif()
  endforeach()
  set(${out_var} ${seen} PARENT_SCOPE)
endfunction()
set(dc_install_layers dc_api)
dc_collect_layers(dc_api dc_install_layers)
set(dc_install_objects)
foreach(layer IN LISTS dc_install_layers)
  get_target_property(type ${layer} TYPE)
  if(type STREQUAL "STATIC_LIBRARY")
    list(APPEND dc_install_objects $<TARGET_OBJECTS:${layer}>)
  endif()
endforeach()

# `diffucoder` is the CLI's target name: the library is diffucoder_library, libdiffucoder.a, exported as
# diffucoder::diffucoder.
add_library(diffucoder_library STATIC ${dc_install_objects})
set_target_properties(diffucoder_library PROPERTIES OUTPUT_NAME diffucoder EXPORT_NAME diffucoder LINKER_LANGUAGE CXX)
target_include_directories(diffucoder_library INTERFACE
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(diffucoder_library INTERFACE cxx_std_20)  # the header uses std::span

# What the objects need at link time, for CMake consumers (the target) and pkg-config ones (Libs).
set(dc_system_libs)
foreach(pkg PCRE2 UTF8PROC SECCOMP)
  list(APPEND dc_system_libs ${${pkg}_LIBRARIES})
endforeach()
list(APPEND dc_system_libs ${CMAKE_DL_LIBS})  # the Vulkan loader, opened at run time
set(dc_link_options)
if(DC_SANITIZE)  # an instrumented archive needs the sanitizers' runtimes in the program
  list(APPEND dc_link_options -fsanitize=address,undefined)
endif()
if(DC_SANITIZE_THREAD)
  list(APPEND dc_link_options -fsanitize=thread)
endif()
target_link_libraries(diffucoder_library INTERFACE Threads::Threads ${dc_system_libs})
target_link_options(diffucoder_library INTERFACE ${dc_link_options})
set(dc_pc_libs "-pthread")
foreach(lib IN LISTS dc_system_libs)
  string(APPEND dc_pc_libs " -l${lib}")
endforeach()
set(dc_lib_dirs)  # where pkg-config found them, unless the linker looks there anyway
foreach(pkg PCRE2 UTF8PROC SECCOMP)
  list(APPEND dc_lib_dirs ${${pkg}_LIBRARY_DIRS})
endforeach()
list(REMOVE_DUPLICATES dc_lib_dirs)
if(dc_lib_dirs AND CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES)
  list(REMOVE_ITEM dc_lib_dirs ${CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES})
endif()
foreach(dir IN LISTS dc_lib_dirs)
  target_link_directories(diffucoder_library INTERFACE ${dir})
  string(APPEND dc_pc_libs " -L${dir}")
endforeach()
set(dc_install_mpi OFF)
if(MPI_CXX_FOUND)  # dc_dist's MPI Comm (data-parallel training)
  set(dc_install_mpi ON)
  target_link_libraries(diffucoder_library INTERFACE MPI::MPI_CXX)
  foreach(lib IN LISTS MPI_CXX_LIBRARIES)
    string(APPEND dc_pc_libs " ${lib}")
  endforeach()
endif()
foreach(option IN LISTS dc_link_options)
  string(APPEND dc_pc_libs " ${option}")
endforeach()

install(TARGETS diffucoder_library EXPORT diffucoderTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${PROJECT_SOURCE_DIR}/include/diffucoder/diffucoder.h ${PROJECT_SOURCE_DIR}/include/diffucoder/batch.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/diffucoder)
if(TARGET diffucoder)
  install(TARGETS diffucoder RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

set(dc_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/diffucoder)
install(EXPORT diffucoderTargets NAMESPACE diffucoder:: DESTINATION ${dc_cmake_dir})
file(CONFIGURE OUTPUT ${CMAKE_BINARY_DIR}/install/diffucoderConfig.cmake @ONLY CONTENT [=[
# find_package(diffucoder CONFIG): the target diffucoder::diffucoder (include/diffucoder/diffucoder.h and
# libdiffucoder.a, C++20) with what its objects link.
include(CMakeFindDependencyMacro)
find_dependency(Threads)
if(@dc_install_mpi@)
  set(MPI_CXX_SKIP_MPICXX ON)
  find_dependency(MPI COMPONENTS CXX)
endif()
include("${CMAKE_CURRENT_LIST_DIR}/diffucoderTargets.cmake")
]=])
write_basic_package_version_file(${CMAKE_BINARY_DIR}/install/diffucoderConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)  # 0.x: a minor version may change the API
install(FILES ${CMAKE_BINARY_DIR}/install/diffucoderConfig.cmake ${CMAKE_BINARY_DIR}/install/diffucoderConfigVersion.cmake
  DESTINATION ${dc_cmake_dir})

# pkg-config: relocatable (the prefix is found from the .pc file's own place, so `--prefix P` at install time
# holds). The system libraries are in Libs, not Libs.private: there is no shared library, so every program
# links them, and a plain `pkg-config --libs diffucoder` must be enough.
file(RELATIVE_PATH dc_pc_to_prefix /root/${CMAKE_INSTALL_LIBDIR}/pkgconfig /root)
string(REGEX REPLACE "/$" "" dc_pc_to_prefix "${dc_pc_to_prefix}")
file(CONFIGURE OUTPUT ${CMAKE_BINARY_DIR}/install/diffucoder.pc @ONLY CONTENT [=[
prefix=${pcfiledir}/@dc_pc_to_prefix@
includedir=${prefix}/@CMAKE_INSTALL_INCLUDEDIR@
libdir=${prefix}/@CMAKE_INSTALL_LIBDIR@

Name: diffucoder
Description: diffucoder.cpp: run and fine-tune masked-diffusion code models (DiffuCoder, Dream); C++20
Version: @PROJECT_VERSION@
Cflags: -I${includedir}
Libs: -L${libdir} -ldiffucoder @dc_pc_libs@
]=])
install(FILES ${CMAKE_BINARY_DIR}/install/diffucoder.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
