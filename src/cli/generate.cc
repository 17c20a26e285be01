// `diffucoder generate`: prompts in (text, file, ids or JSONL), completions out (text or JSON lines),
// with progress on stderr and, with --visual, the canvas redrawn as it unmasks.
#include <CLI/CLI.hpp>
#include <diffucoder/diffucoder.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unistd.h>

#include "api/status_convert.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/decoding_flags.h"
#include "cli/progress.h"
#include "core/clock.h"
#include "io/mapped_file.h"
#include "ops/device.h"
#include "sampler/generate.h"

namespace dc::cli {
namespace {

struct GenerateArgs {
  std::string model_dir, tokenizer_path;
  std::string prompt, prompt_file, prompt_ids, prompts_jsonl;
  bool chat = false, json = false, visual = false, quiet = false;
  int64_t max_new_tokens = 256;
  int64_t max_length = 0;  // 0 = unset
  int steps = 0;           // unset (given_steps false) = max_new_tokens
  int num_return_sequences = 1;
  DecodingFlags decoding;
  // Whether the flag was given (an empty --prompt "" is a prompt, and --steps 0 an error).
  bool given_prompt = false, given_prompt_file = false, given_prompt_ids = false, given_prompts_jsonl = false;
  bool given_steps = false;
};

// One prompt line of --prompts-jsonl: {"prompt": "..."} | {"prompt_ids": [...]} | {"messages": [...]},
// optionally with "chat": true|false (default: --chat).
Result<std::vector<int32_t>> jsonl_prompt(const diffucoder::Model& model, const std::string& line, size_t line_no, bool chat) {
  const std::string where = "--prompts-jsonl line " + std::to_string(line_no);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    return parse_error(where + ": not valid JSON (" + e.what() + ")");
  }
  if (line.find('\0') != std::string::npos) return parse_error(where + ": not valid JSON (a NUL byte)");
  if (!j.is_object()) return parse_error(where + ": must be a JSON object {...}, got " + std::string(j.type_name()));
  const int sources = j.contains("prompt") + j.contains("prompt_ids") + j.contains("messages");
  if (sources > 1) return invalid_argument(where + ": give exactly one of \"prompt\", \"prompt_ids\", \"messages\"");
  if (j.contains("chat")) {
    if (!j["chat"].is_boolean()) return invalid_argument(where + ": \"chat\" must be true or false");
    chat = j["chat"].get<bool>();
  }
  if (j.contains("prompt_ids")) {
    if (!j["prompt_ids"].is_array()) return invalid_argument(where + ": \"prompt_ids\" must be an array of ids");
    std::vector<int32_t> ids;
    for (const auto& v : j["prompt_ids"]) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
        return invalid_argument(where + ": \"prompt_ids\" holds a non-id value " + v.dump());
      ids.push_back(v.get<int32_t>());
    }
    return ids;
  }
  if (j.contains("messages")) {
    if (!j["messages"].is_array()) return invalid_argument(where + ": \"messages\" must be an array");
    std::vector<diffucoder::Model::Message> messages;
    for (const auto& m : j["messages"]) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
          !m["content"].is_string())
        return invalid_argument(where + ": each message needs string \"role\" and \"content\"");
      messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    Result<std::string> text =
        api::to_internal(diffucoder::Model::apply_chat_template(messages, /*add_generation_prompt=*/true));
    if (!text.ok()) return text.status().with_context(where);
    auto ids = api::to_internal(model.encode_prompt(*text, false));
    if (!ids.ok()) return ids.status().with_context(where);
    return ids;
  }
  if (j.contains("prompt")) {
    if (!j["prompt"].is_string()) return invalid_argument(where + ": \"prompt\" must be a string");
    auto ids = api::to_internal(model.encode_prompt(j["prompt"].get<std::string>(), chat));
    if (!ids.ok()) return ids.status().with_context(where);
    return ids;
  }
  return invalid_argument(where + ": needs \"prompt\", \"prompt_ids\" or \"messages\"");
}

// Usage checks that need no model: one prompt source, the precision, the sizes (exit code 2).
Status check_usage(const GenerateArgs& a) {
  const int given = a.given_prompt + a.given_prompt_file + a.given_prompt_ids + a.given_prompts_jsonl;
  if (given != 1)
    return invalid_argument("give exactly one of --prompt, --prompt-file, --prompt-ids, --prompts-jsonl (got " +
                            std::to_string(given) + ")");
  DC_RETURN_IF_ERROR(parse_matmul_precision(a.decoding.precision).status());
  DC_RETURN_IF_ERROR(parse_device(a.decoding.device).status());
  DC_RETURN_IF_ERROR(parse_lora_mode(a.decoding.lora_mode).status());
  if (a.given_steps && a.steps < 1)
    return invalid_argument("--steps: must be >= 1 (got " + std::to_string(a.steps) + "); leave it out for one step per token");
  if (a.given_steps && a.max_length == 0 && a.steps > a.max_new_tokens)
    return invalid_argument("--steps " + std::to_string(a.steps) + " is more than --max-new-tokens " +
                            std::to_string(a.max_new_tokens) + ": a step unmasks at least one token, so use at most " +
                            std::to_string(a.max_new_tokens));
  return Status::ok_status();
}

Result<std::vector<std::vector<int32_t>>> collect_prompts(const diffucoder::Model& model, const GenerateArgs& a) {
  std::vector<std::vector<int32_t>> prompts;
  if (a.given_prompt_ids) {
    DC_ASSIGN_OR_RETURN(auto ids, parse_id_list(a.prompt_ids, "--prompt-ids"));
    prompts.push_back(std::move(ids));
  } else if (a.given_prompts_jsonl) {
    Result<std::string> file = read_text_file(a.prompts_jsonl);
    if (!file.ok()) return file.status().with_context("--prompts-jsonl");
    const std::string& text = *file;
    std::istringstream in(text);
    std::string line;
    for (size_t no = 1; std::getline(in, line); ++no) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      DC_ASSIGN_OR_RETURN(auto ids, jsonl_prompt(model, line, no, a.chat));
      prompts.push_back(std::move(ids));
    }
    if (prompts.empty()) return invalid_argument("--prompts-jsonl " + a.prompts_jsonl + " holds no prompts");
  } else {
    std::string text = a.prompt;
    if (a.given_prompt_file) {
      Result<std::string> file = read_text_file(a.prompt_file);
      if (!file.ok()) return file.status().with_context("--prompt-file");
      text = std::move(*file);
    }
    DC_ASSIGN_OR_RETURN(auto ids, api::to_internal(model.encode_prompt(text, a.chat)));
    if (ids.empty())
      return invalid_argument(std::string(a.given_prompt ? "--prompt" : "--prompt-file") +
                              ": the prompt encodes to no tokens (it is empty); the model needs at least one");
    prompts.push_back(std::move(ids));
  }
  return prompts;
}

// The sampler settings of the flags over `c` (the model's defaults, or the facade's before it loads).
diffucoder::GenerationConfig make_config(diffucoder::GenerationConfig c, const GenerateArgs& a) {
  c = apply_decoding_flags(std::move(c), a.decoding);
  if (a.max_length > 0) {
    c.max_length = a.max_length;
  } else {
    c.max_new_tokens = a.max_new_tokens;
  }
  // No --steps: one step per new token, or the reference default 512 with --max-length.
  // (capped at the sampler's limit: a canvas past the model's context is then the error reported)
  c.steps = a.given_steps ? a.steps
                          : (a.max_length > 0 ? 512 : static_cast<int>(std::min<int64_t>(a.max_new_tokens, kMaxSteps)));
  c.num_return_sequences = a.num_return_sequences;
  return c;
}

int run_generate(const GenerateArgs& a) {
  if (Status st = check_usage(a); !st.ok()) return usage_error(st);
  // the sampling flags, before the model is loaded (the vocabulary and token ids are checked after)
  if (Status st = api::to_internal(diffucoder::check_config(make_config({}, a))); !st.ok()) return usage_error(st);
  const auto t_load = std::chrono::steady_clock::now();
  auto model_r = diffucoder::Model::load(load_options(a.decoding, a.model_dir, a.tokenizer_path));
  if (!model_r.ok()) return report(api::to_internal(model_r.status()));
  const diffucoder::Model& model = **model_r;
  const double load_ms = ms_since(t_load);
  if (!a.quiet) print_load_note(model.info().load_note, load_ms);
  const diffucoder::GenerationConfig config = make_config(model.default_config(), a);
  auto prompts = collect_prompts(model, a);
  if (!prompts.ok()) return report(prompts.status());

  Progress progress(model, a.quiet, a.visual);
  diffucoder::Hooks hooks;
  hooks.on_step = [&](const diffucoder::StepEvent& s) { progress.on_step(s); return true; };
  auto out = model.generate(*prompts, config, hooks);
  progress.finish();
  if (!out.ok()) return report(api::to_internal(out.status()));

  for (int64_t r = 0; r < out->n_rows; ++r) {
    const std::vector<int32_t> gen = out->generated(r);
    const std::vector<int32_t> kept = truncate_at_stop(gen, model.stop_ids());
    std::string text;
    if (model.tokenizer() != nullptr) {
      auto t = model.completion_text(gen);
      if (!t.ok()) return report(api::to_internal(t.status()));
      text = *t;
    }
    if (a.json) {
      const double secs = out->total_ms / 1000.0;
      nlohmann::json j = {
          {"index", r},
          {"prompt_index", r / config.num_return_sequences},
          {"text", text},
          {"token_ids", gen},
          {"completion_tokens", kept.size()},
          {"prompt_tokens", out->prompt_lengths[r]},
          {"timings",
           {{"load_ms", load_ms}, {"total_ms", out->total_ms}, {"forward_ms", out->forward_ms},
            {"sampling_ms", out->sampling_ms}, {"steps", out->steps_run},
            {"tokens_per_second", secs > 0 ? out->n_rows * gen.size() / secs : 0.0}}}};
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      if (out->n_rows > 1) std::printf("=== completion %lld ===\n", static_cast<long long>(r));
      if (model.tokenizer() != nullptr) {
        std::printf("%s\n", text.c_str());
      } else {
        for (size_t i = 0; i < kept.size(); ++i) std::printf("%s%d", i ? "," : "", kept[i]);
        std::printf("\n");
      }
    }
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

RunFn add_generate_command(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Diffusion-generate completions for one or more prompts");
  cmd->add_option("--model", a->model_dir, "Hugging Face checkpoint directory, or a dream FILE.gguf")->required();
  cmd->add_option("--tokenizer", a->tokenizer_path, "tokenizer.json (default: the model's)");
  cmd->add_option("--prompt", a->prompt, "Prompt text");
  cmd->add_option("--prompt-file", a->prompt_file, "File holding the prompt text");
  cmd->add_option("--prompt-ids", a->prompt_ids, "Prompt token ids, e.g. 1,2,3");
  cmd->add_option("--prompts-jsonl", a->prompts_jsonl,
                  "JSONL file, one prompt a line: {\"prompt\"|\"prompt_ids\"|\"messages\", \"chat\"?}; decoded as one batch");
  cmd->add_flag("--chat", a->chat, "Wrap the prompt in the Instruct chat format");
  cmd->add_option("--max-new-tokens", a->max_new_tokens, "Tokens to generate")->capture_default_str();
  cmd->add_option("--max-length", a->max_length, "Total length (prompt + new); overrides --max-new-tokens");
  cmd->add_option("--steps", a->steps, "Diffusion steps (default: = --max-new-tokens)");
  cmd->add_option("--num-return-sequences", a->num_return_sequences, "Completions per prompt")->capture_default_str();
  add_decoding_flags(cmd, &a->decoding);
  cmd->add_flag("--json", a->json, "Print one JSON object per completion");
  cmd->add_flag("--visual", a->visual, "Redraw the canvas on stderr as it unmasks");
  cmd->add_flag("--quiet", a->quiet, "No progress on stderr");
  require_finite_floats(cmd);
  return [a, cmd] {
    a->given_prompt = cmd->count("--prompt") > 0;
    a->given_prompt_file = cmd->count("--prompt-file") > 0;
    a->given_prompt_ids = cmd->count("--prompt-ids") > 0;
    a->given_prompts_jsonl = cmd->count("--prompts-jsonl") > 0;
    a->given_steps = cmd->count("--steps") > 0;
    return run_generate(*a);
  };
}

}  // namespace dc::cli
