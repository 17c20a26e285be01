# The Vulkan compute backend (src/ops/vulkan/, layer ops_vulkan). DIFFUCODER_VULKAN: AUTO (on when the
# Vulkan headers and glslc are found), ON (fail without them), OFF. The shaders are compiled by glslc at
# build time and embedded in the library as SPIR-V byte arrays (cmake/embed_spirv.cmake). The loader
# (libvulkan.so.1) is opened at run time, so a binary built with the backend still starts without it.
# Sets DC_VULKAN_ENABLED and configures the target dc_ops_vulkan that CMakeLists.txt declared.
set(DIFFUCODER_VULKAN AUTO CACHE STRING "Vulkan compute backend: AUTO (on when Vulkan headers and glslc are found), ON, OFF")
set_property(CACHE DIFFUCODER_VULKAN PROPERTY STRINGS AUTO ON OFF)
set(DC_VULKAN_ENABLED OFF)
if(NOT DIFFUCODER_VULKAN STREQUAL "OFF")
  find_path(DC_VULKAN_INCLUDE_DIR vulkan/vulkan.h)
  find_program(DC_GLSLC glslc)
  if(DC_VULKAN_INCLUDE_DIR AND DC_GLSLC)
    set(DC_VULKAN_ENABLED ON)
  elseif(DIFFUCODER_VULKAN STREQUAL "ON")
    message(FATAL_ERROR "DIFFUCODER_VULKAN=ON but the Vulkan headers or glslc are missing: install libvulkan-dev and glslc")
  endif()
endif()

set(dc_vulkan_dir ${PROJECT_SOURCE_DIR}/src/ops/vulkan)
if(DC_VULKAN_ENABLED)
  message(STATUS "Vulkan backend: on (glslc ${DC_GLSLC})")
  file(GLOB shaders CONFIGURE_DEPENDS ${dc_vulkan_dir}/shaders/*.comp)
  file(GLOB shader_includes CONFIGURE_DEPENDS ${dc_vulkan_dir}/shaders/*.glsl)
  file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/shaders)
  set(spvs "")
  foreach(shader IN LISTS shaders)
    get_filename_component(stem ${shader} NAME_WE)
    set(spv ${CMAKE_BINARY_DIR}/shaders/${stem}.spv)
    # Debian 12's glslc (shaderc 2023.2) crashes optimizing arrays of cooperative matrices: those shaders
    # go to the driver unoptimized (its own compiler optimizes them).
    set(optimize -O)
    if(stem MATCHES "_coop$")
      set(optimize -O0)
    endif()
    add_custom_command(OUTPUT ${spv}
      COMMAND ${DC_GLSLC} --target-env=vulkan1.2 ${optimize} -Werror -o ${spv} ${shader}
      DEPENDS ${shader} ${shader_includes} COMMENT "glslc ${stem}.comp" VERBATIM)
    list(APPEND spvs ${spv})
  endforeach()
  set(embedded ${CMAKE_BINARY_DIR}/shaders/spirv_embedded.cc)
  add_custom_command(OUTPUT ${embedded}
    COMMAND ${CMAKE_COMMAND} -DOUT=${embedded} "-DSPV_FILES=${spvs}" -P ${PROJECT_SOURCE_DIR}/cmake/embed_spirv.cmake
    DEPENDS ${spvs} ${PROJECT_SOURCE_DIR}/cmake/embed_spirv.cmake COMMENT "embedding SPIR-V" VERBATIM)
  get_target_property(srcs dc_ops_vulkan SOURCES)
  list(FILTER srcs EXCLUDE REGEX "/disabled\\.cc$")
  set_property(TARGET dc_ops_vulkan PROPERTY SOURCES ${srcs} ${embedded})
  target_include_directories(dc_ops_vulkan PRIVATE ${DC_VULKAN_INCLUDE_DIR})
  # Vulkan's idiom `VkXxxInfo info{VK_STRUCTURE_TYPE_XXX};` value-initialises the other members on purpose.
  target_compile_options(dc_ops_vulkan PRIVATE -Wno-missing-field-initializers)
  target_link_libraries(dc_ops_vulkan PUBLIC ${CMAKE_DL_LIBS})
else()
  message(STATUS "Vulkan backend: off (DIFFUCODER_VULKAN=${DIFFUCODER_VULKAN}; needs libvulkan-dev and glslc)")
  set_property(TARGET dc_ops_vulkan PROPERTY SOURCES ${dc_vulkan_dir}/disabled.cc)
endif()
