// Helpers shared by the subcommands.
#include "cli/common.h"

#include "io/mapped_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>

namespace dc::cli {

int report(const Status& status) {
  std::fprintf(stderr, "error: %s\n", status.message().c_str());
  return 1;
}

int usage_error(const Status& status) {
  std::fprintf(stderr, "error: %s\n", status.message().c_str());
  return 2;
}

Result<std::vector<int32_t>> parse_id_list(const std::string& text, const std::string& option) {
  std::vector<int32_t> ids;
  std::string item;
  auto flush = [&]() -> Status {
    if (item.empty()) return Status();
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (*end != '\0' || errno != 0 || v < 0 || v > INT32_MAX)
      return invalid_argument(option + ": '" + item + "' is not a token id (a non-negative integer)");
    ids.push_back(static_cast<int32_t>(v));
    item.clear();
    return Status();
  };
  for (char ch : text) {
    if (ch == ',' || ch == ' ' || ch == '\n' || ch == '\t' || ch == '[' || ch == ']') {
      DC_RETURN_IF_ERROR(flush());
    } else {
      item.push_back(ch);
    }
  }
  DC_RETURN_IF_ERROR(flush());
  if (ids.empty()) return invalid_argument(option + ": no token ids given");
  return ids;
}

Result<std::optional<MatmulPrecision>> parse_matmul_precision(const std::string& name) {
  if (name == "auto") return std::optional<MatmulPrecision>();
  if (name == "f32") return std::optional<MatmulPrecision>(MatmulPrecision::kF32);
  if (name == "bf16") return std::optional<MatmulPrecision>(MatmulPrecision::kBF16);
  return invalid_argument("--precision '" + name +
                          "' is not one of auto (the checkpoint's dtype), f32 (the reference's arithmetic), bf16");
}

void print_load_note(const std::string& note, double load_ms) {
  std::fprintf(stderr, "loaded in %.1f s, %s\n", load_ms / 1000.0, note.c_str());
}

int64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return 0;
}

int run_on_ranks(double timeout_s, const std::function<int(dist::Comm&)>& body) {
  auto comm = dist::world_comm(timeout_s);
  if (!comm.ok()) return report(comm.status());
  int code = 1;
  try {
    code = body(**comm);
  } catch (const std::bad_alloc&) {  // a rank out of memory stops the others, which would wait in a collective
    if ((*comm)->size() > 1) (*comm)->abort(1, "out of memory; stopping every rank (fewer ranks per host, or a smaller model)");
    throw;  // one process: main's message
  }
  if (code != 0 && (*comm)->size() > 1) (*comm)->abort(code, "failed (see the message above); stopping every rank");
  return code;
}

std::vector<double> gather_per_rank(dist::Comm& comm, const std::vector<double>& values) {
  std::vector<double> all(values.size() * static_cast<size_t>(comm.size()));
  const Status s = comm.all_gather_doubles(values.data(), static_cast<int64_t>(values.size()), all.data());
  if (!s.ok()) {
    report(s);
    return {};
  }
  return all;
}

}  // namespace dc::cli
