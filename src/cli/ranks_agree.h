// `train` and `grpo` under mpirun: before anything else, the ranks compare the run's options and data
// (dist/agree.h) and all stop together, exit code 2, when one differs (README "Training on several
// processes and machines").
#pragma once

#include <diffucoder/diffucoder.h>

#include <string>
#include <vector>

#include "dist/agree.h"
#include "dist/comm.h"

namespace CLI {
class App;
}

namespace dc::cli {

// The settings of a parsed subcommand that every rank must share: each option as "--name" and its value
// as given or defaulted, numbers in one spelling (1e-4 = 0.0001), flags "true" / "false", lists joined with
// spaces. Left out, as they may differ per rank: --help, --threads, --quiet, --dist-timeout,
// --reward-workers and the hidden testing options; --data's path is replaced by its contents' fingerprint
// (data_fingerprint), as "--data (its contents)".
std::vector<dist::Setting> run_settings(const CLI::App& command);

// "N bytes, hash H" of a file's whole contents (a 64-bit hash, splitmix64 over 8-byte words), or
// "unreadable (reason)".
std::string data_fingerprint(const std::string& path);

// Returns 0 when every rank runs with the same run_settings(command) (at once for one process); else
// prints this rank's message, waits for the other ranks' (a barrier) and returns the exit code 2 (1, with
// no barrier, when the communication itself failed).
int check_ranks_agree(dist::Comm& comm, const CLI::App& command);
// The same over the public API's Ranks (Ranks::check_same_settings), for the commands built on it (train).
int check_ranks_agree(diffucoder::Ranks& ranks, const CLI::App& command);

}  // namespace dc::cli
