// Progress of a generation on stderr: a step / tokens-per-second / ETA line, and with --visual the
// canvas of every row redrawn after each step, masks drawn as ░.
#pragma once

#include <chrono>

#include "engine/engine.h"

namespace dc::cli {

class Progress {
 public:
  Progress(const Engine& engine, const SamplingParams& params, bool quiet, bool visual);
  void on_step(const StepInfo& step);
  void finish();

 private:
  std::string render_row(const StepInfo& step, int64_t row) const;

  const Engine& engine_;
  int32_t mask_id_;
  bool quiet_, visual_, tty_;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace dc::cli
