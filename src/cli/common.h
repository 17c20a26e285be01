// Helpers shared by the subcommands: reporting a Status, reading a file, parsing id lists.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/status.h"

namespace dc::cli {

// Limits on what the command line hands in (README "Limits"): threads of any subcommand (0 = all
// hardware threads) and the size of a file read whole (a prompt, --prompts-jsonl, tokenize --text-file).
inline constexpr int kMaxThreads = 1024;
inline constexpr int64_t kMaxInputFileBytes = int64_t{64} << 20;

// Prints "error: <message>" to stderr and returns exit code 1 (a runtime error).
int report(const Status& status);
// Prints "error: <message>" to stderr and returns exit code 2 (a usage error: bad or conflicting flags).
int usage_error(const Status& status);

// Reads a regular file of at most `max_bytes` (directories, FIFOs and devices are refused at once);
// errors name the path.
Result<std::string> read_text_file(const std::string& path, int64_t max_bytes = kMaxInputFileBytes);

// "1,2,3" or "[1, 2, 3]" → ids; errors name the offending entry and the option.
Result<std::vector<int32_t>> parse_id_list(const std::string& text, const std::string& option);

// "f32" or "bf16" (--precision); the error names the option and the valid values.
Result<MatmulPrecision> parse_matmul_precision(const std::string& name);

// Peak resident set size of this process in bytes (VmHWM of /proc/self/status; 0 if unreadable).
int64_t peak_rss_bytes();

}  // namespace dc::cli
