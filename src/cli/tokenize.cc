// `diffucoder tokenize`: text → JSON array of ids, or with --decode, ids → text.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "gguf/model_source.h"
#include "gguf/tokenizer_gguf.h"
#include "io/mapped_file.h"
#include "tokenizer/tokenizer.h"

namespace dc::cli {
namespace {

struct TokenizeArgs {
  std::string model_dir, tokenizer_path, text, text_file;
  bool decode = false, skip_special = false;
  bool given_text = false, given_text_file = false;  // --text "" is an (empty) text
};

int run_tokenize(const TokenizeArgs& a) {
  if (a.model_dir.empty() == a.tokenizer_path.empty())
    return usage_error(invalid_argument("give exactly one of --model DIR|FILE.gguf or --tokenizer FILE"));
  if (a.given_text == a.given_text_file) return usage_error(invalid_argument("give exactly one of --text or --text-file"));
  // --tokenizer FILE.gguf reads the GGUF's tokenizer.ggml metadata, as --model FILE.gguf does.
  auto tok = a.model_dir.empty() ? load_tokenizer_file(a.tokenizer_path) : model_source_tokenizer(a.model_dir);
  if (!tok.ok()) return report(tok.status());
  std::string text = a.text;
  if (a.given_text_file) {
    auto t = read_text_file(a.text_file);
    if (!t.ok()) return report(t.status().with_context("--text-file"));
    text = *t;
  }
  if (a.decode) {
    auto ids = parse_id_list(text, a.given_text_file ? "--text-file" : "--text");
    if (!ids.ok()) return report(ids.status());
    auto out = tok->decode(*ids, a.skip_special);
    if (!out.ok()) return report(out.status());
    std::printf("%s\n", out->c_str());
    return 0;
  }
  auto ids = tok->encode(text);
  if (!ids.ok()) return report(ids.status());
  std::printf("%s\n", nlohmann::json(*ids).dump().c_str());
  return 0;
}

}  // namespace

RunFn add_tokenize_command(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Encode text to token ids (JSON array), or decode ids to text");
  cmd->add_option("--model", a->model_dir, "Checkpoint directory holding tokenizer.json, or a dream FILE.gguf");
  cmd->add_option("--tokenizer", a->tokenizer_path, "A tokenizer.json file, or a FILE.gguf (its tokenizer.ggml metadata)");
  cmd->add_option("--text", a->text, "The text (with --decode: ids such as 1,2,3 or [1, 2, 3])");
  cmd->add_option("--text-file", a->text_file, "File holding the text (or the ids, with --decode)");
  cmd->add_flag("--decode", a->decode, "Decode ids to text");
  cmd->add_flag("--skip-special-tokens", a->skip_special, "With --decode: leave special tokens out");
  return [a, cmd] {
    a->given_text = cmd->count("--text") > 0;
    a->given_text_file = cmd->count("--text-file") > 0;
    return run_tokenize(*a);
  };
}

}  // namespace dc::cli
