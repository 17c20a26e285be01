// The subcommands of the `diffucoder` binary. Each registers its options on a CLI11 subcommand and
// returns the function that runs it; main() calls the one the user chose and exits with its code.
#pragma once

#include <functional>

namespace CLI {
class App;
}

namespace dc::cli {

using RunFn = std::function<int()>;

RunFn add_generate_command(CLI::App& app);
RunFn add_tokenize_command(CLI::App& app);
RunFn add_inspect_command(CLI::App& app);
RunFn add_bench_command(CLI::App& app);
RunFn add_convert_command(CLI::App& app);
RunFn add_serve_command(CLI::App& app);
RunFn add_train_command(CLI::App& app);

}  // namespace dc::cli
