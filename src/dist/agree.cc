// check_ranks_agree: rank 0's settings broadcast (length first), compared on every rank, verdicts gathered.
#include "dist/agree.h"

#include <cstdlib>

namespace dc::dist {
namespace {

constexpr const char* kSame = ": every rank must run with the same options and data";

// A field's text at `at`: "<bytes>:<bytes of text>"; advances at.
std::optional<std::string> take_field(const std::string& text, size_t& at) {
  const size_t colon = text.find(':', at);
  if (colon == std::string::npos || colon == at || colon - at > 12) return std::nullopt;
  size_t n = 0;
  for (size_t i = at; i < colon; ++i) {
    if (text[i] < '0' || text[i] > '9') return std::nullopt;
    n = n * 10 + static_cast<size_t>(text[i] - '0');
  }
  if (n > text.size() - colon - 1) return std::nullopt;
  at = colon + 1 + n;
  return text.substr(colon + 1, n);
}

std::string shown(const std::string& value) { return value.empty() ? "\"\"" : value; }

}  // namespace

std::string encode_settings(const std::vector<Setting>& settings) {
  std::string text;
  for (const Setting& s : settings)
    text += std::to_string(s.name.size()) + ":" + s.name + std::to_string(s.value.size()) + ":" + s.value;
  return text;
}

Result<std::vector<Setting>> decode_settings(const std::string& text) {
  std::vector<Setting> settings;
  for (size_t at = 0; at < text.size();) {
    std::optional<std::string> name = take_field(text, at);
    std::optional<std::string> value = name ? take_field(text, at) : std::nullopt;
    if (!value) return internal_error("rank 0's settings are garbled at byte " + std::to_string(at));
    settings.push_back({std::move(*name), std::move(*value)});
  }
  return settings;
}

std::optional<Difference> first_difference(const std::vector<Setting>& root, const std::vector<Setting>& mine) {
  const auto index_in_root = [&](const std::string& name) {
    size_t i = 0;
    while (i < root.size() && root[i].name != name) ++i;
    return i;
  };
  for (const Setting& s : mine) {
    const size_t i = index_in_root(s.name);
    if (i == root.size()) return Difference{i, s.name + " is " + shown(s.value) + " here but unknown to rank 0"};
    if (root[i].value != s.value)
      return Difference{i, s.name + " is " + shown(s.value) + " here but " + shown(root[i].value) + " on rank 0"};
  }
  for (size_t i = 0; i < root.size(); ++i) {
    bool found = false;
    for (const Setting& s : mine) found = found || s.name == root[i].name;
    if (!found) return Difference{i, root[i].name + " is unknown here but " + shown(root[i].value) + " on rank 0"};
  }
  return std::nullopt;
}

Status check_ranks_agree(Comm& comm, const std::vector<Setting>& mine) {
  if (comm.size() == 1) return Status();
  std::string text = comm.rank() == 0 ? encode_settings(mine) : std::string();
  DC_RETURN_IF_ERROR(comm.broadcast_string(text, 0));
  Result<std::vector<Setting>> decoded = decode_settings(text);
  const std::vector<Setting> root = decoded.ok() ? *decoded : std::vector<Setting>();
  // (a list that cannot be read still takes part in the gather below, which every rank waits in)
  const std::optional<Difference> differs =
      decoded.ok() ? first_difference(root, mine) : Difference{0, decoded.status().message()};
  // Each rank's verdict: −1 agrees, else the index in rank 0's list of the first setting that differs.
  const double verdict = differs ? static_cast<double>(differs->root_index) : -1.0;
  std::vector<double> all(static_cast<size_t>(comm.size()));
  DC_RETURN_IF_ERROR(comm.all_gather_doubles(&verdict, 1, all.data()));
  const std::string me = "rank " + std::to_string(comm.rank()) + ": ";
  if (differs) return invalid_argument(me + differs->text + kSame);
  std::string others;
  for (int r = 0; r < comm.size(); ++r) {
    if (all[r] < 0) continue;
    const size_t i = static_cast<size_t>(all[r]);
    others += (others.empty() ? "rank " : ", rank ") + std::to_string(r) + " (" +
              (i < root.size() ? root[i].name + ", " + shown(root[i].value) + " on rank 0" : "a setting rank 0 lacks") + ")";
  }
  if (others.empty()) return Status();
  return invalid_argument(me + "other settings on " + others + ", see its message" + kSame);
}

}  // namespace dc::dist
