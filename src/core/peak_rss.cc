// peak_rss_bytes from Linux's /proc/self/status.
#include "core/peak_rss.h"

#include <fstream>
#include <string>

namespace dc {

int64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return 0;
}

}  // namespace dc
