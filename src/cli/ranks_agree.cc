// The settings of a run as text (from the parsed CLI11 subcommand) and the check that every rank shares them.
#include "cli/ranks_agree.h"

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include "api/status_convert.h"
#include "cli/common.h"
#include "core/splitmix64.h"

namespace dc::cli {
namespace {

// Options that may differ per rank: how many cores it uses, its display, its own watchdog, its sandboxes
// at once. (--data's path may differ too: its contents are compared instead.)
const std::set<std::string> kPerRank = {"--help", "--threads", "--quiet", "--dist-timeout", "--reward-workers"};

// One spelling per number: an integer as its digits (no '+', no leading zeros; any length, as --seed is
// 64-bit), another number as %g with the fewest digits that read back to the same double; anything else as is.
std::string normalized(const std::string& text) {
  const size_t sign = !text.empty() && (text[0] == '+' || text[0] == '-') ? 1 : 0;
  bool integer = sign < text.size();
  for (size_t i = sign; i < text.size(); ++i) integer = integer && text[i] >= '0' && text[i] <= '9';
  if (integer) {
    const bool negative = text[0] == '-';
    const size_t first = std::min(text.find_first_not_of('0', sign), text.size() - 1);
    const std::string magnitude = text.substr(first);
    return (negative && magnitude != "0" ? "-" : "") + magnitude;
  }
  if (text.empty() || text.find_first_not_of("0123456789+-.eE") != std::string::npos) return text;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || errno != 0) return text;
  char buf[64];
  for (int precision = 1; precision <= 17; ++precision) {  // the fewest digits that read back: 0.0001, 2e-05
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string flag_value(const std::string& text) {
  for (const char* yes : {"true", "1", "on", "yes", "y", "t", "+"})
    if (text == yes) return "true";
  return "false";
}

std::string option_value(const CLI::Option& opt) {
  const bool flag = opt.get_expected_max() == 0;
  if (opt.count() == 0) return flag ? "false" : normalized(opt.get_default_str());
  if (flag) return flag_value(opt.results().back());
  std::string value;
  for (const std::string& r : opt.results()) value += (value.empty() ? "" : " ") + normalized(r);
  return value;
}

}  // namespace

std::string data_fingerprint(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return std::string("unreadable (") + std::strerror(errno) + ")";
  std::vector<unsigned char> buf(size_t{1} << 20);
  uint64_t hash = 0, bytes = 0;
  size_t got = 0;
  while ((got = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
    for (size_t i = 0; i < got; i += 8) {  // the last word zero-padded; the length is mixed in at the end
      uint64_t word = 0;
      std::memcpy(&word, buf.data() + i, std::min<size_t>(8, got - i));
      hash = splitmix64_finalize(hash + word + 0x9E3779B97F4A7C15ull);
    }
    bytes += got;
  }
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return "unreadable (a read failed)";
  char text[64];
  std::snprintf(text, sizeof(text), "%llu bytes, hash %016llx", (unsigned long long)bytes,
                (unsigned long long)splitmix64_finalize(hash ^ bytes));
  return text;
}

std::vector<dist::Setting> run_settings(const CLI::App& command) {
  std::vector<dist::Setting> settings;
  for (const CLI::Option* opt : command.get_options()) {
    if (opt->get_group().empty()) continue;  // hidden: testing options
    const std::string name = opt->get_lnames().empty() ? opt->get_name() : "--" + opt->get_lnames()[0];
    if (kPerRank.count(name) != 0) continue;
    if (name == "--data")
      settings.push_back({"--data (its contents)", data_fingerprint(opt->results().empty() ? "" : opt->results()[0])});
    else
      settings.push_back({name, option_value(*opt)});
  }
  return settings;
}

namespace {

// check_ranks_agree's end: the message out on every rank, then exit code 2 after a barrier (1, without
// one, when the communication itself failed).
template <typename Group>
int stop_disagreeing(Group& group, const Status& agreed) {
  if (agreed.ok()) return 0;
  std::fprintf(stderr, "error: %s\n", agreed.message().c_str());
  std::fflush(stderr);
  if (agreed.code() != StatusCode::kInvalidArgument) return 1;  // the communication failed
  (void)group.barrier();  // every rank's message out before the job ends (every rank is here)
  return 2;
}

}  // namespace

int check_ranks_agree(dist::Comm& comm, const CLI::App& command) {
  if (comm.size() == 1) return 0;
  return stop_disagreeing(comm, dist::check_ranks_agree(comm, run_settings(command)));
}

int check_ranks_agree(diffucoder::Ranks& ranks, const CLI::App& command) {
  if (ranks.size() == 1) return 0;
  std::vector<std::pair<std::string, std::string>> settings;
  for (dist::Setting& s : run_settings(command)) settings.emplace_back(std::move(s.name), std::move(s.value));
  return stop_disagreeing(ranks, api::to_internal(ranks.check_same_settings(settings)));
}

}  // namespace dc::cli
