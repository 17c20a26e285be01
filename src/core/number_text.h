// A number in an error message: printf's %g with `digits` significant digits (9: a float read back exactly).
#pragma once

#include <cstdio>
#include <string>

namespace dc {

inline std::string number_text(double value, int digits = 9) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.*g", digits, value);
  return buf;
}

}  // namespace dc
