// diffucoder: one binary with subcommands (generate, tokenize, inspect, bench, convert, serve, train,
// eval, grpo, grpo-loss, devices).
// Exit codes: 0 ok, 1 runtime error (bad model, bad input), 2 usage error.
#include <CLI/CLI.hpp>
#include <diffucoder/diffucoder.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <new>
#include <string>
#include <string_view>
#include <system_error>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/help.h"
#include "core/cpu_level.h"

int main(int argc, char** argv) {
  // The library's messages (weights left unpacked, training in f32, the packed-weight cache): one line each on
  // stderr, "note: ..." for warnings, written whole so that lines of several threads do not interleave.
  diffucoder::set_log_callback([](diffucoder::LogLevel level, std::string_view message) {
    const char* prefix = level == diffucoder::LogLevel::kWarning ? "note: "
                         : level == diffucoder::LogLevel::kError ? "error: " : "";
    const std::string line = prefix + std::string(message) + "\n";
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
  });
  CLI::App app{"diffucoder: run DiffuCoder / Dream masked-diffusion code models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "diffucoder 0.1.0");
  std::map<std::string, dc::cli::RunFn> commands;
  commands["generate"] = dc::cli::add_generate_command(app);
  commands["tokenize"] = dc::cli::add_tokenize_command(app);
  commands["inspect"] = dc::cli::add_inspect_command(app);
  commands["bench"] = dc::cli::add_bench_command(app);
  commands["convert"] = dc::cli::add_convert_command(app);
  commands["serve"] = dc::cli::add_serve_command(app);
  commands["train"] = dc::cli::add_train_command(app);
  commands["eval"] = dc::cli::add_eval_command(app);
  commands["grpo"] = dc::cli::add_grpo_command(app);
  commands["grpo-loss"] = dc::cli::add_grpo_loss_command(app);
  commands["devices"] = dc::cli::add_devices_command(app);
  dc::cli::add_help_examples(app);
  dc::Status hub_error;  // --model ORG/NAME not in Hugging Face's cache (cli/common.h)
  dc::cli::resolve_hub_models(app, &hub_error);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::fputs(dc::cli::suggest_nearest(app).c_str(), stderr);  // a typo first: it may be why --model is "missing"
    return app.exit(e) == 0 ? 0 : 2;
  }
  // DIFFUCODER_PARSE_ONLY=1: the command line parsed (flags, values, subcommand), nothing run: how the tests
  // check the examples of --help and of the docs.
  if (const char* parse_only = std::getenv("DIFFUCODER_PARSE_ONLY"); parse_only != nullptr && std::string(parse_only) == "1")
    return 0;
  if (!hub_error.ok()) return dc::cli::report(hub_error);
  // DC_CPU_LEVEL (the kernels' cap) misspelt: a usage error before any work, not a silent baseline run.
  if (dc::Status s = dc::check_cpu_level_env(); !s.ok()) return dc::cli::usage_error(s);
  // Last resort at the process boundary: every size from outside is checked against a limit first, so
  // these mean the machine itself ran out (memory, threads) and must not end in an abort.
  try {
    for (const auto* sub : app.get_subcommands()) return commands.at(sub->get_name())();
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory; lower the sizes (tokens, rows, batch) or free memory\n");
    return 1;
  } catch (const std::system_error& e) {
    std::fprintf(stderr, "error: %s (the system refused a thread or resource; try fewer --threads)\n", e.what());
    return 1;
  }
  return 2;
}
