// Progress of a generation on stderr: a step / tokens-per-second / ETA line, and with --visual the
// canvas of every row redrawn after each step, masks drawn as ░.
#pragma once

#include <diffucoder/diffucoder.h>

#include <chrono>
#include <string>

namespace dc::cli {

class Progress {
 public:
  Progress(const diffucoder::Model& model, bool quiet, bool visual);
  void on_step(const diffucoder::StepEvent& step);
  void finish();

 private:
  std::string render_row(const diffucoder::StepEvent& step, int64_t row) const;

  const diffucoder::Tokenizer* tokenizer_;  // nullptr: ids are drawn as numbers
  int32_t mask_id_;
  bool quiet_, visual_, tty_;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace dc::cli
