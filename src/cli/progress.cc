// Progress and the live canvas view (ANSI redraw on a terminal, one frame per step otherwise).
#include "cli/progress.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <unistd.h>
#include <vector>

namespace dc::cli {

Progress::Progress(const diffucoder::Model& model, bool quiet, bool visual)
    : tokenizer_(model.tokenizer()),
      mask_id_(model.info().mask_token_id),
      quiet_(quiet),
      visual_(visual),
      tty_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()) {}

std::string Progress::render_row(const diffucoder::StepEvent& s, int64_t row) const {
  const int32_t* tokens = s.canvas.data() + row * s.n_seq;
  const int64_t begin = s.pad_counts[row] + s.prompt_lengths[row];  // the generated part
  std::string out;
  std::vector<int32_t> run;
  auto flush = [&] {
    if (run.empty()) return;
    if (tokenizer_ != nullptr) {
      auto text = tokenizer_->decode(run);
      out += text.ok() ? *text : "?";
    } else {
      for (int32_t id : run) out += std::to_string(id) + " ";
    }
    run.clear();
  };
  for (int64_t i = begin; i < s.n_seq; ++i) {
    if (tokens[i] == mask_id_) {
      flush();
      out += "\u2591";
    } else {
      run.push_back(tokens[i]);
    }
  }
  flush();
  return out;
}

void Progress::on_step(const diffucoder::StepEvent& s) {
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int done = s.step + 1;
  const double per_step = secs / done;
  const double eta = per_step * (s.n_steps - done);
  const double tok_s = secs > 0 ? s.n_rows * (s.n_seq - (s.pad_counts[0] + s.prompt_lengths[0])) * done /
                                      static_cast<double>(s.n_steps) / secs
                                : 0.0;
  if (visual_) {
    if (tty_) std::fprintf(stderr, "\033[H\033[2J");
    std::fprintf(stderr, "--- step %d/%d ---\n", done, s.n_steps);
    for (int64_t r = 0; r < s.n_rows; ++r) {
      if (s.n_rows > 1) std::fprintf(stderr, "[%lld] ", static_cast<long long>(r));
      std::fprintf(stderr, "%s\n", render_row(s, r).c_str());
    }
  }
  if (quiet_) return;
  // Rates over less than 10 ms of work (a first step that ran no forward) would be noise: leave them out.
  char rates[96] = "";
  if (secs >= 0.01)
    std::snprintf(rates, sizeof(rates), "  %.1f ms/step  %.1f tok/s  ETA %.1fs", per_step * 1e3, tok_s, eta);
  if (tty_) {
    std::fprintf(stderr, "\rstep %d/%d%s   ", done, s.n_steps, rates);
  } else if (const int decile = done * 10 / s.n_steps; decile != last_decile_) {
    last_decile_ = decile;
    std::fprintf(stderr, "step %d/%d%s\n", done, s.n_steps, rates);
  }
  std::fflush(stderr);
}

void Progress::finish() {
  if (!quiet_ && tty_) std::fprintf(stderr, "\n");
}

}  // namespace dc::cli
