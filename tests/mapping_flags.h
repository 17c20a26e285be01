// The kernel's flags of the mapping that holds an address (the VmFlags line of /proc/self/smaps, e.g. "rd wr
// mr mw me ac dc"), for tests of where memory lives and what a fork carries ("dc": MADV_DONTFORK).
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

namespace dc::test {

// The VmFlags of the mapping holding `p`, or "" when no mapping holds it.
inline std::string mapping_flags(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {  // a mapping's first line
      inside = addr >= lo && addr < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line.substr(8);
    }
  }
  return "";
}

// Whether the flags hold the two-letter flag `flag` ("dc", "hg").
inline bool has_flag(const std::string& flags, const std::string& flag) {
  return (" " + flags + " ").find(" " + flag + " ") != std::string::npos;
}

}  // namespace dc::test
