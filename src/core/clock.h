// The layers' wall-clock timings: milliseconds on the steady clock.
#pragma once

#include <chrono>

namespace dc {

// Milliseconds from t0 to now.
inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace dc
