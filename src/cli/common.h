// Helpers shared by the subcommands: reporting a Status, reading a file, parsing id lists.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <diffucoder/diffucoder.h>

#include "core/context.h"
#include "core/peak_rss.h"
#include "core/status.h"
#include "dist/comm.h"
#include "engine/engine.h"

namespace CLI {
class App;
}

namespace dc::cli {

// Limits on what the command line hands in (README "Limits"): threads of any subcommand (0 = all
// hardware threads) up to kMaxThreads (core/thread_pool.h). Files read whole (a prompt, --prompts-jsonl,
// tokenize --text-file) go through dc::read_text_file (io/mapped_file.h) and its limit, kMaxTextFileBytes.

// Every real-number option of `cmd` (CLI11 type FLOAT, float or double) refuses NaN, infinities and
// magnitudes beyond 3.4e38 (an f32 infinity) with a usage error naming the flag (exit 2): CLI11's Range,
// NonNegativeNumber and PositiveNumber let NaN through (every comparison with it is false). Each add_*_command
// calls it last, over its own subcommand.
void require_finite_floats(CLI::App* cmd);

// Every --model option of app's subcommands that names "ORG/NAME[@REVISION]" rather than an existing path
// becomes that model's snapshot directory in Hugging Face's local cache (io/hub_cache.h). A failed lookup
// leaves the value and is kept in *error (the first one) for main to report after parsing: exit 1, as for a
// missing model directory.
void resolve_hub_models(CLI::App& app, Status* error);

// A JSON number for printf-built JSON: the value with %.*g, or null when it is not finite (so printed JSON
// never holds nan / inf, which are not JSON).
std::string json_number(double value, int precision = 9);
// A JSON string literal (quoted, escaped) of text, for printf-built JSON.
std::string json_string(const std::string& text);

// Prints "error: <message>" to stderr and returns exit code 1 (a runtime error).
int report(const Status& status);
// Prints "error: <message>" to stderr and returns exit code 2 (a usage error: bad or conflicting flags).
int usage_error(const Status& status);
// The same for the public API's Status (the commands built on include/diffucoder/diffucoder.h).
int report(const diffucoder::Status& status);
int usage_error(const diffucoder::Status& status);

// "1,2,3" or "[1, 2, 3]" → ids; errors name the offending entry and the option.
Result<std::vector<int32_t>> parse_id_list(const std::string& text, const std::string& option);

// "auto" (nullopt: follow the checkpoint), "f32" or "bf16" (--precision); the error names the option
// and the valid values.
Result<std::optional<MatmulPrecision>> parse_matmul_precision(const std::string& name);

// One line on stderr: the load time and `note` (Engine::load_note(): the matmul precision and what happened
// to the packed-weight cache).
void print_load_note(const std::string& note, double load_ms);
inline void print_load_note(const Engine& engine, double load_ms) { print_load_note(engine.load_note(), load_ms); }

// Runs body over this process's communicator (dist::world_comm: MPI's world under mpirun, else one
// process) and returns its exit code; a rank whose body fails ends the job on every rank (the others
// would wait for it in their next collective).
int run_on_ranks(double timeout_s, const std::function<int(dist::Comm&)>& body);
// The same over the public API's Ranks (diffucoder::Ranks::join), for the commands built on it (train).
int run_on_ranks(double timeout_s, const std::function<int(diffucoder::Ranks&)>& body);

// The end of a training run (bench --train; train and grpo gather through their facade trainer and report
// with report_rank_numbers): every rank's peak memory, f32 master-weight, optimizer-state and gradient bytes
// (OptimizerCore's master_weight_bytes, optimizer_state_bytes, gradient_bytes) and bytes sent
// per step (over `steps` steps run here) gathered; on rank 0 a line per rank on stderr (unless quiet) and
// `json` = "\"peak_rss_bytes\": [..], \"master_weight_bytes\": [..], \"optimizer_state_bytes\": [..],
// \"gradient_bytes\": [..], \"bytes_sent_per_step\": [..]" (one value per rank) for its result line, and the
// numbers in `ranks`. ok false after a failed gather (reported).
struct RankNumbers {
  struct Rank {
    double peak_rss_bytes = 0, master_weight_bytes = 0, optimizer_state_bytes = 0, gradient_bytes = 0,
           bytes_sent_per_step = 0;
  };
  bool ok = false;
  std::vector<Rank> ranks;  // on rank 0: one per rank
  std::string json;
};
RankNumbers gather_rank_numbers(dist::Comm& comm, int64_t master_weight_bytes, int64_t optimizer_state_bytes,
                                int64_t gradient_bytes, int64_t steps, bool quiet);
// The part after the gathering: on rank 0 (`rank`), the lines and `json` of `ranks` (one per rank, e.g.
// from diffucoder::Trainer::gather_rank_stats); on the other ranks nothing. ok is true.
RankNumbers report_rank_numbers(int rank, std::vector<RankNumbers::Rank> ranks, bool quiet);
// The same of a facade trainer's gather_rank_stats() (train, grpo).
RankNumbers report_rank_numbers(int rank, const std::vector<diffucoder::TrainRankStats>& ranks, bool quiet);

}  // namespace dc::cli
