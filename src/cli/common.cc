// Helpers shared by the subcommands.
#include "cli/common.h"

#include <CLI/CLI.hpp>

#include <cfloat>
#include <cmath>
#include <nlohmann/json.hpp>

#include "io/hub_cache.h"
#include "io/mapped_file.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>

namespace dc::cli {

void require_finite_floats(CLI::App* cmd) {
  // The same parse as CLI11's own conversion (strtold), so that what is checked is what the flag receives.
  const CLI::Validator finite(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        const long double v = std::strtold(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size()) return "";  // not a number: the conversion says so
        if (std::isfinite(v) && std::fabs(v) <= FLT_MAX) return "";
        return "must be a finite number (got " + text + ")";
      },
      "", "finite");
  for (CLI::Option* opt : cmd->get_options())
    if (opt->get_type_name().rfind("FLOAT", 0) == 0) opt->check(finite);
}

// Hub models (io/hub_cache.h; README "With a downloaded model").
void resolve_hub_models(CLI::App& app, Status* error) {
  const CLI::Validator hub(
      [error](std::string& value) -> std::string {
        auto path = resolve_model_path(value);
        if (path.ok()) value = *path;
        else if (error->ok()) *error = path.status();
        return "";
      },
      "", "hub");
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    if (CLI::Option* opt = sub->get_option_no_throw("--model")) opt->transform(hub);
}

std::string json_number(double value, int precision) {
  if (!std::isfinite(value)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*g", precision, value);
  return buf;
}

std::string json_string(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

int report(const Status& status) {
  std::fprintf(stderr, "error: %s\n", status.message().c_str());
  return 1;
}

int usage_error(const Status& status) {
  std::fprintf(stderr, "error: %s\n", status.message().c_str());
  return 2;
}

int report(const diffucoder::Status& status) {
  std::fprintf(stderr, "error: %s\n", status.message().c_str());
  return 1;
}

int usage_error(const diffucoder::Status& status) {
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

namespace {

// run_on_ranks over a dist::Comm or a diffucoder::Ranks (both: size(), abort(code, message)).
template <typename Group, typename Body>
int run_on_group(Group& group, const Body& body) {
  int code = 1;
  try {
    code = body(group);
  } catch (const std::bad_alloc&) {  // a rank out of memory stops the others, which would wait in a collective
    if (group.size() > 1) group.abort(1, "out of memory; stopping every rank (fewer ranks per host, or a smaller model)");
    throw;  // one process: main's message
  }
  if (code != 0 && group.size() > 1) group.abort(code, "failed (see the message above); stopping every rank");
  return code;
}

}  // namespace

int run_on_ranks(double timeout_s, const std::function<int(dist::Comm&)>& body) {
  auto comm = dist::world_comm(timeout_s);
  if (!comm.ok()) return report(comm.status());
  return run_on_group(**comm, body);
}

int run_on_ranks(double timeout_s, const std::function<int(diffucoder::Ranks&)>& body) {
  auto ranks = diffucoder::Ranks::join(timeout_s);
  if (!ranks.ok()) return report(ranks.status());
  return run_on_group(**ranks, body);
}

namespace {

// Every rank's `values` gathered (rank r's at r·values.size()); on an error, empty (reported).
std::vector<double> gather_per_rank(dist::Comm& comm, const std::vector<double>& values) {
  std::vector<double> all(values.size() * static_cast<size_t>(comm.size()));
  const Status s = comm.all_gather_doubles(values.data(), static_cast<int64_t>(values.size()), all.data());
  if (!s.ok()) {
    report(s);
    return {};
  }
  return all;
}

}  // namespace

RankNumbers gather_rank_numbers(dist::Comm& comm, int64_t master_weight_bytes, int64_t optimizer_state_bytes,
                                int64_t gradient_bytes, int64_t steps, bool quiet) {
  constexpr int kFields = 5;
  const std::vector<double> all = gather_per_rank(
      comm, {static_cast<double>(peak_rss_bytes()), static_cast<double>(master_weight_bytes),
             static_cast<double>(optimizer_state_bytes),
             static_cast<double>(gradient_bytes),
             static_cast<double>(comm.bytes_sent()) / static_cast<double>(std::max<int64_t>(1, steps))});
  if (all.empty()) return {};
  std::vector<RankNumbers::Rank> ranks;
  for (int r = 0; r < comm.size(); ++r) {
    const double* v = &all[kFields * r];
    ranks.push_back({v[0], v[1], v[2], v[3], v[4]});
  }
  return report_rank_numbers(comm.rank(), std::move(ranks), quiet);
}

RankNumbers report_rank_numbers(int rank, const std::vector<diffucoder::TrainRankStats>& ranks, bool quiet) {
  std::vector<RankNumbers::Rank> per_rank;
  for (const diffucoder::TrainRankStats& r : ranks)
    per_rank.push_back({static_cast<double>(r.peak_rss_bytes), static_cast<double>(r.master_weight_bytes),
                        static_cast<double>(r.optimizer_state_bytes), static_cast<double>(r.gradient_bytes),
                        r.bytes_sent_per_step});
  return report_rank_numbers(rank, std::move(per_rank), quiet);
}

RankNumbers report_rank_numbers(int rank, std::vector<RankNumbers::Rank> ranks, bool quiet) {
  RankNumbers n;
  n.ok = true;
  if (rank != 0) return n;
  std::string lists[5];
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankNumbers::Rank& k = ranks[r];
    const double v[5] = {k.peak_rss_bytes, k.master_weight_bytes, k.optimizer_state_bytes, k.gradient_bytes,
                         k.bytes_sent_per_step};
    for (int f = 0; f < 5; ++f) {
      if (r > 0) lists[f] += ", ";
      lists[f] += std::to_string(static_cast<int64_t>(v[f]));
    }
    if (!quiet)
      std::fprintf(stderr, "rank %zu: peak memory %.1f MiB, f32 master weights %.1f MiB, optimizer state %.1f MiB, "
                   "gradients %.1f MiB, %.2f MiB sent per step\n", r, v[0] / 1048576.0, v[1] / 1048576.0,
                   v[2] / 1048576.0, v[3] / 1048576.0, v[4] / 1048576.0);
  }
  n.ranks = std::move(ranks);
  n.json = "\"peak_rss_bytes\": [" + lists[0] + "], \"master_weight_bytes\": [" + lists[1] +
           "], \"optimizer_state_bytes\": [" + lists[2] + "], \"gradient_bytes\": [" + lists[3] +
           "], \"bytes_sent_per_step\": [" + lists[4] + "]";
  return n;
}

}  // namespace dc::cli
