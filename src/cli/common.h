// Helpers shared by the subcommands: reporting a Status, reading a file, parsing id lists.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/status.h"

namespace dc::cli {

// Prints "error: <message>" to stderr and returns exit code 1.
int report(const Status& status);

// "1,2,3" or "[1, 2, 3]" → ids; errors name the offending entry and the option.
Result<std::vector<int32_t>> parse_id_list(const std::string& text, const std::string& option);

// "f32" or "bf16" (--precision); the error names the option and the valid values.
Result<MatmulPrecision> parse_matmul_precision(const std::string& name);

// Peak resident set size of this process in bytes (VmHWM of /proc/self/status; 0 if unreadable).
int64_t peak_rss_bytes();

}  // namespace dc::cli
