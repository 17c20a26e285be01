// --help's examples and the nearest-name suggestions after a parse error (help.h).
#include "cli/help.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <numeric>

namespace dc::cli {

const std::vector<std::pair<std::string, std::string>>& help_examples() {
  static const std::vector<std::pair<std::string, std::string>> examples = {
      {"generate", "generate --model apple/DiffuCoder-7B-cpGRPO --chat --prompt \"Write a function that reverses a "
                   "string.\" --max-new-tokens 256 --fast"},
      {"generate", "generate --model DIR --prompt \"def fib(n):\" --max-new-tokens 64 --steps 64 --alg entropy "
                   "--temperature 0 --json"},
      {"generate", "generate --model model-q4_k.gguf --prompt \"def fib(n):\" --device vulkan --fast --visual"},
      {"tokenize", "tokenize --model DIR --text \"def add(a, b):\""},
      {"tokenize", "tokenize --model DIR --decode --text \"755 912 25\""},
      {"inspect", "inspect --model DIR"},
      {"inspect", "inspect --model model-q8_0.gguf --json"},
      {"bench", "bench --shape diffucoder-7b --weights q4 --cache dual --block-length 32 --threads 2 --max-steps 32"},
      {"bench", "bench --model DIR --fast --profile"},
      {"bench", "bench --train --shape qwen2.5-0.5b --seq-len 256 --steps 3 --profile"},
      {"convert", "convert --model DIR --out DIR-q8 --weights q8"},
      {"convert", "convert --model DIR --out model-q4_k.gguf --weights q4_k"},
      {"convert", "convert --model DIR --lora runs/lora/checkpoint-000500 --out DIR-merged"},
      {"serve", "serve --model DIR --port 8080 --fast"},
      {"serve", "serve --model DIR --lora sql=runs/sql-adapter --max-tokens 1024"},
      {"train", "train --model DIR --data sft.jsonl --out runs/sft --steps 1000 --seq-len 512 --batch-size 4 --lr 1e-5"},
      {"train", "train --model DIR --data sft.jsonl --out runs/lora --lora-r 16 --grad-checkpointing"},
      {"train", "train --model DIR --data sft.jsonl --out runs/sft --resume"},
      {"eval", "eval --model DIR --benchmark humaneval+ --out results.jsonl --fast"},
      {"eval", "eval --benchmark mbpp --completions samples.jsonl --out results.jsonl"},
      {"grpo", "grpo --model DIR --data tasks.jsonl --out runs/grpo --num-generations 10 --lora-r 16"},
      {"grpo", "grpo --model DIR --data tasks.jsonl --out runs/grpo --resume"},
      {"grpo-loss", "grpo-loss --model DIR --batch batch.json --json"},
      {"grpo-loss", "grpo-loss --model runs/grpo/checkpoint-000010 --ref-model DIR --batch batch.json --threads 2"},
      {"devices", "devices"},
      {"devices", "devices --json"},
  };
  return examples;
}

void add_help_examples(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    std::string footer;
    for (const auto& [name, line] : help_examples())
      if (name == sub->get_name()) footer += "  diffucoder " + line + "\n";
    if (!footer.empty()) sub->footer("\nExamples:\n" + footer + "\nDocumentation: docs/ (one page per task).");
  }
}

int edit_distance(std::string_view a, std::string_view b) {
  std::vector<int> row(b.size() + 1);  // row[j]: the distance of a's prefix so far and b[0, j)
  std::iota(row.begin(), row.end(), 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    int diagonal = row[0];
    row[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      const int substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      diagonal = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitute});
    }
  }
  return row[b.size()];
}

namespace {

// The candidate nearest to `word` when it is near enough to be a typo (at most a third of its length, at least
// 2, apart), else "".
std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  int best_distance = std::max(2, static_cast<int>(word.size()) / 3) + 1;
  for (const std::string& c : candidates) {
    const int d = edit_distance(word, c);
    if (d < best_distance) best = c, best_distance = d;
  }
  return best;
}

}  // namespace

std::string suggest_nearest(const CLI::App& app) {
  std::string out;
  const std::vector<CLI::App*> given = app.get_subcommands();  // the ones parsed
  if (given.empty()) {  // the first word is not a subcommand
    const std::vector<std::string> rest = app.remaining();
    if (rest.empty() || rest[0].empty() || rest[0][0] == '-') return out;
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) names.push_back(sub->get_name());
    const std::string near = nearest(rest[0], names);
    if (!near.empty()) out += "error: unknown command '" + rest[0] + "'; did you mean '" + near + "'?\n";
    return out;
  }
  const CLI::App* sub = given.front();
  std::vector<std::string> flags;
  for (const CLI::Option* opt : sub->get_options())
    for (const std::string& name : opt->get_lnames()) flags.push_back("--" + name);
  for (const std::string& arg : sub->remaining()) {
    if (arg.size() < 3 || arg.rfind("--", 0) != 0) continue;  // a value, or a short flag
    const std::string flag = arg.substr(0, arg.find('='));    // --name=value
    const std::string near = nearest(flag, flags);
    out += "error: unknown flag '" + flag + "' for " + sub->get_name() +
           (near.empty() ? std::string("; see --help") : "; did you mean '" + near + "'?") + "\n";
  }
  return out;
}

}  // namespace dc::cli
