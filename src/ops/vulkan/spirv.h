// The SPIR-V modules compiled from shaders/*.comp at build time (glslc) and embedded in the library by
// cmake/embed_spirv.cmake.
#pragma once

#include <cstddef>
#include <string_view>

namespace dc::vk {

struct SpirvModule {
  const unsigned char* bytes = nullptr;  // 4-byte aligned SPIR-V words; nullptr: no module of that name
  size_t size = 0;                       // bytes
};

// The module compiled from shaders/<name>.comp.
SpirvModule embedded_spirv(std::string_view name);

}  // namespace dc::vk
