// A user's own reward (README "GRPO data and rewards"): an executable that reads one JSON line per
// completion on stdin and writes one score per line on stdout, so tasks other than code can be trained.
// It is the user's program and runs as the user, outside the sandbox (it reads completions as data; a
// reward that executes them must sandbox them itself).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace dc::train {

struct UserRewardOptions {
  std::vector<std::string> argv;               // argv[0]: the executable's path (not looked up in PATH)
  double timeout_seconds = 600;                // wall clock of one call (all completions of a round)
  int64_t max_output_bytes = int64_t{64} << 20;  // stdout; stderr keeps its last 64 KiB for messages
};

// One completion as the program sees it: one line {"prompt": s, "completion": s, "example": {...}} with
// `example` the data line's JSON object as read (grpo_data.h GrpoExample::fields).
struct UserRewardItem {
  std::string prompt;
  std::string completion;
  const nlohmann::json* example = nullptr;  // not owned; null: {}
};

// Runs the program once, in a process group of its own and with PR_SET_PDEATHSIG (it is killed when the
// calling thread, or the process, dies): writes one JSON line per item (in order) to its stdin and closes
// it, reads its stdout until it EXITS (not until the output closes: a child it left may hold it; what is in
// the pipe at its exit counts), then kills its process group, whatever it left running (also on a timeout
// or an error). It must exit with code 0 having written exactly items.size() lines, each a number (JSON
// number syntax, surrounding blanks allowed, or "nan", "NaN" — counted as 0 in the total as the
// reference's nansum does); infinities are refused. Errors name the program and say what went wrong, with
// the end of its stderr: not executable, exit code or signal, timeout, too much output, the wrong number of
// lines, a line that is not a number (its line number and text).
Result<std::vector<double>> run_user_reward(const std::vector<UserRewardItem>& items, const UserRewardOptions& options);

}  // namespace dc::train
