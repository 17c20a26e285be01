// Ranks that must agree: every rank of a data-parallel run has to run with the same options and data (ranks
// that differ train with mixed settings, wait for each other in mismatched collectives until --dist-timeout,
// or fail inside MPI with truncated messages). At the start rank 0 broadcasts its settings, every rank
// compares them with its own, and the verdict is gathered, so that every rank stops together, before the
// first collective of the run, with a message naming the first setting that differs.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "dist/comm.h"

namespace dc::dist {

// One setting of the run as text, compared byte for byte: {"--lr", "0.0001"}.
struct Setting {
  std::string name, value;
};

// Length-prefixed, so any bytes survive: "<name bytes>:<name><value bytes>:<value>" per setting.
std::string encode_settings(const std::vector<Setting>& settings);
Result<std::vector<Setting>> decode_settings(const std::string& text);

// The first setting of `mine` that is not the same in `root`'s (rank 0's) list, or one rank 0 has that
// `mine` lacks: its index in `root` (root.size() when only `mine` has it) and a sentence for this rank,
// "--lr is 0.0002 here but 0.0001 on rank 0". nullopt when the lists are the same.
struct Difference {
  size_t root_index = 0;
  std::string text;
};
std::optional<Difference> first_difference(const std::vector<Setting>& root, const std::vector<Setting>& mine);

// Every rank calls it, with its own settings, before the run's first other collective (one broadcast of
// rank 0's encoded list, its length first, then one all-gather of each rank's verdict). OK on every rank
// when all agree (and at once for one rank); else an error on EVERY rank: on a rank that differs,
// "rank R: --lr is 0.0002 here but 0.0001 on rank 0: every rank must run with the same options and data";
// on the others, which ranks differ and in which setting. The caller prints it and should barrier() before
// ending the job, so that every rank's message is out first.
Status check_ranks_agree(Comm& comm, const std::vector<Setting>& mine);

}  // namespace dc::dist
