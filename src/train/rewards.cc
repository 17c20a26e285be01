// The code_format and code rewards (spec §4.3) over the sandbox pool, and their weighted sum with a
// user's reward program.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "train/rewards.h"

#include <pcre2.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <thread>

#include "core/check.h"
#include "sandbox/pool.h"
#include "train/code_reward_runner.h"

namespace dc::train {
namespace {

// kCodeFormatPattern compiled once, anchored at both ends (Python's re.fullmatch), on bytes.
struct CompiledFormat {
  pcre2_code* code = nullptr;
  CompiledFormat() {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kCodeFormatPattern.data()), kCodeFormatPattern.size(),
                         PCRE2_ANCHORED | PCRE2_ENDANCHORED, &error, &offset, nullptr);
    DC_CHECK(code != nullptr, "the code_format pattern does not compile");
  }
  ~CompiledFormat() { pcre2_code_free(code); }
};

// Parses stdin (the block, bytes) with ast.parse after Python's str.strip(); exit 0 when it parses, 3 when
// it does not (a SyntaxError, or anything else the parse raises, e.g. on a null byte).
constexpr const char* kAstCheck =
    "import ast, sys\n"
    "src = sys.stdin.buffer.read().decode('utf-8', 'surrogateescape')\n"
    "try:\n"
    "    ast.parse(src.strip())\n"
    "except BaseException:\n"
    "    sys.exit(3)\n";

// The reference runs each test through `subprocess.run(["python3", "-c", program])`, which raises (and its
// evaluation script then prints no pass rate: reward 0) for a null byte in the program or an argument
// longer than the kernel's MAX_ARG_STRLEN.
constexpr size_t kMaxArgBytes = 131072;

sandbox::Limits limits_of(const CodeRewardOptions& o) {
  sandbox::Limits l;
  l.wall_seconds = o.timeout_seconds;
  l.cpu_seconds = o.timeout_seconds + 1;
  l.address_space_bytes = o.memory_bytes;  // one process may use the whole budget (cgroup mode)
  l.memory_bytes = o.memory_bytes;         // the run's whole budget: processes x address space
  l.max_processes = o.max_processes;
  return l;
}

// A fresh random marker the code-reward runner prints when the program ran to its end.
std::string make_nonce() {
  std::random_device rd;
  char buf[33];
  for (int i = 0; i < 4; ++i) std::snprintf(buf + 8 * i, 9, "%08x", static_cast<unsigned>(rd()));
  return std::string("DC_DONE_") + buf;
}

int workers_of(const CodeRewardOptions& o) {
  return o.workers > 0 ? o.workers : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

Status check_options(const CodeRewardOptions& o) {
  if (!(o.timeout_seconds > 0) || o.timeout_seconds > 3600)
    return invalid_argument("code reward timeout: must be in (0, 3600] seconds, got " + std::to_string(o.timeout_seconds));
  if (o.memory_bytes < 0 || o.max_processes < 0) return invalid_argument("code reward limits: must be >= 0");
  return Status();
}

}  // namespace

bool matches_code_format(std::string_view text) {
  static const CompiledFormat compiled;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(compiled.code, nullptr);
  if (md == nullptr) throw std::bad_alloc();
  const int rc = pcre2_match(compiled.code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, 0, md, nullptr);
  pcre2_match_data_free(md);
  // rc < 0 other than NOMATCH would be a PCRE2 resource limit; the pattern's lazy groups cannot cross a
  // fence, so matching is linear in the text and that does not happen at completion sizes (tested at 1 MiB).
  return rc >= 0;
}

std::optional<std::string> extract_python_block(std::string_view text) {
  constexpr std::string_view kOpen = "```python\n";
  const size_t open = text.find(kOpen);
  if (open == std::string_view::npos) return std::nullopt;
  const size_t begin = open + kOpen.size();
  const size_t close = text.find("```", begin);
  return std::string(text.substr(begin, close == std::string_view::npos ? std::string_view::npos : close - begin));
}

Result<std::vector<RewardInput>> reward_inputs(const RolloutBatch& batch, const std::vector<const GrpoExample*>& examples) {
  if (static_cast<int64_t>(examples.size()) != batch.n_prompts)
    return invalid_argument("rewards: " + std::to_string(examples.size()) + " examples for a rollout batch of " +
                            std::to_string(batch.n_prompts) + " prompts");
  std::vector<RewardInput> inputs;
  inputs.reserve(batch.texts.size());
  for (int64_t r = 0; r < batch.n_rows; ++r) {
    const GrpoExample* ex = examples[r / batch.group_size];
    if (ex == nullptr) return invalid_argument("rewards: example " + std::to_string(r / batch.group_size) + " is null");
    inputs.push_back({ex, ex->prompt_text, batch.texts[r]});
  }
  return inputs;
}

Result<std::vector<double>> code_format_rewards(const std::vector<RewardInput>& inputs, const CodeRewardOptions& o) {
  DC_RETURN_IF_ERROR(check_options(o));
  std::vector<double> rewards(inputs.size(), 0.0);
  std::vector<sandbox::RunSpec> specs;
  std::vector<size_t> owner;  // the input of each spec
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!matches_code_format(inputs[i].completion)) continue;
    sandbox::RunSpec s;
    s.argv = {"python3", "-I", "-c", kAstCheck};
    s.stdin_data = *extract_python_block(inputs[i].completion);  // the pattern guarantees one block
    s.limits = limits_of(o);
    specs.push_back(std::move(s));
    owner.push_back(i);
  }
  const std::vector<Result<sandbox::RunResult>> runs = sandbox::run_all(specs, workers_of(o));
  for (size_t k = 0; k < runs.size(); ++k) {
    if (!runs[k].ok()) return runs[k].status().with_context("code_format reward: the sandbox failed");
    rewards[owner[k]] = runs[k]->ok() ? 1.0 : 0.5;
  }
  return rewards;
}

Result<std::vector<CodeResult>> code_rewards(const std::vector<RewardInput>& inputs,
                                             const std::vector<double>& format_rewards, const CodeRewardOptions& o) {
  DC_RETURN_IF_ERROR(check_options(o));
  if (format_rewards.size() != inputs.size())
    return invalid_argument("code reward: " + std::to_string(format_rewards.size()) + " format rewards for " +
                            std::to_string(inputs.size()) + " completions");
  std::vector<CodeResult> results(inputs.size());
  std::vector<sandbox::RunSpec> specs;
  std::vector<size_t> owner;
  std::vector<std::string> nonces;  // one per spec
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].example == nullptr) return invalid_argument("code reward: completion " + std::to_string(i) + " has no example");
    const std::vector<std::string>& tests = inputs[i].example->tests;
    CodeResult& r = results[i];
    r.total = static_cast<int64_t>(tests.size());
    if (format_rewards[i] < 1.0 || tests.empty()) continue;
    r.ran = true;
    const std::string code = *extract_python_block(inputs[i].completion);
    std::vector<std::string> programs;
    for (const std::string& test : tests) programs.push_back(code + "\n" + test);
    bool raises = false;  // what the reference's subprocess.run refuses to start
    for (const std::string& p : programs) raises |= p.find('\0') != std::string::npos || p.size() >= kMaxArgBytes;
    if (raises) continue;  // reward 0, as the reference's script dies without a pass rate
    for (std::string& p : programs) {
      sandbox::RunSpec s;
      s.argv = {"python3", "-I", "/tmp/runner.py"};
      s.files["program.py"] = std::move(p);
      s.files["runner.py"] = kCodeRewardRunner;
      nonces.push_back(make_nonce());
      s.stdin_data = nonces.back() + "\n";
      s.limits = limits_of(o);
      specs.push_back(std::move(s));
      owner.push_back(i);
    }
  }
  const std::vector<Result<sandbox::RunResult>> runs = sandbox::run_all(specs, workers_of(o));
  for (size_t k = 0; k < runs.size(); ++k) {
    if (!runs[k].ok()) return runs[k].status().with_context("code reward: the sandbox failed");
    const sandbox::RunResult& run = *runs[k];
    CodeResult& r = results[owner[k]];
    const std::string tail = "\n" + nonces[k] + "\n";
    const std::string& out = run.stdout_data;
    if (run.timed_out || run.limit == sandbox::LimitHit::kWallTime || run.limit == sandbox::LimitHit::kCpuTime)
      r.timed_out = true;
    else if (run.exited && run.exit_code == 0 && out.size() >= tail.size() &&
             out.compare(out.size() - tail.size(), tail.size(), tail) == 0)
      ++r.passed;  // the program ran to its end (its test included) and exited 0: code_reward_runner.h
  }
  for (CodeResult& r : results)
    if (r.ran && !r.timed_out) r.reward = static_cast<double>(r.passed) / static_cast<double>(r.total);
  return results;
}

double RewardBatch::format_rate() const {
  if (code_format.empty()) return 0.0;
  double n = 0;
  for (double x : code_format) n += x >= 1.0 ? 1.0 : 0.0;
  return n / static_cast<double>(code_format.size());
}

double RewardBatch::pass_rate() const {
  if (code.empty()) return 0.0;
  double sum = 0;
  for (const CodeResult& r : code) sum += r.reward;
  return sum / static_cast<double>(code.size());
}

Result<RewardBatch> score_completions(const std::vector<RewardInput>& inputs, const RewardOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].example == nullptr) return invalid_argument("rewards: completion " + std::to_string(i) + " has no example");
    if (o.code_weight != 0 && inputs[i].example->tests.empty())
      return invalid_argument("rewards: the example of line " + std::to_string(inputs[i].example->line) +
                              " has no tests, which the code reward runs (give it \"tests\", or turn the code reward off)");
  }
  RewardBatch b;
  if (o.code_weight != 0 || o.format_weight != 0) {
    DC_ASSIGN_OR_RETURN(b.code_format, code_format_rewards(inputs, o.code));
  }
  if (o.code_weight != 0) {
    DC_ASSIGN_OR_RETURN(b.code, code_rewards(inputs, b.code_format, o.code));
  }
  if (!o.user.argv.empty()) {
    std::vector<UserRewardItem> items;
    for (const RewardInput& in : inputs) items.push_back({in.prompt, in.completion, &in.example->fields});
    DC_ASSIGN_OR_RETURN(b.user, run_user_reward(items, o.user));
  }
  // nansum(weights · rewards), as the reference (TRL) sums the reward functions.
  auto add = [](double& total, double weight, double reward) {
    const double term = weight * reward;
    if (!std::isnan(term)) total += term;
  };
  b.total.assign(inputs.size(), 0.0);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (o.format_weight != 0) add(b.total[i], o.format_weight, b.code_format[i]);
    if (o.code_weight != 0) add(b.total[i], o.code_weight, b.code[i].reward);
    if (!b.user.empty()) add(b.total[i], o.user_weight, b.user[i]);
  }
  b.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return b;
}

}  // namespace dc::train
