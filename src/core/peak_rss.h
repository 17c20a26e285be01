// The peak memory of this process, for the end-of-run reports of training (the CLI's `train`, `grpo`,
// `bench` and the facade's Trainer::gather_rank_stats).
#pragma once

#include <cstdint>

namespace dc {

// Peak resident set size of this process in bytes (VmHWM of /proc/self/status; 0 if unreadable).
int64_t peak_rss_bytes();

}  // namespace dc
