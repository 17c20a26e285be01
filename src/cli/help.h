// The help that teaches: every subcommand's --help ends with real examples, and a mistyped subcommand or flag
// is answered with the nearest one that exists.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace CLI {
class App;
}

namespace dc::cli {

// The examples of each subcommand, as {subcommand, command line after `diffucoder `} (tests parse each one).
const std::vector<std::pair<std::string, std::string>>& help_examples();

// Ends each subcommand's --help with its examples (a subcommand of `app` without any is left as it is).
void add_help_examples(CLI::App& app);

// After a failed parse of `app`: one line per argument it did not know that resembles a subcommand or a flag of
// the subcommand given — "error: unknown flag '--stepz' for generate; did you mean '--steps'?" —, or "" when
// there is none. (CLI11 reports a missing --model before an unknown flag: this names the typo first.)
std::string suggest_nearest(const CLI::App& app);

// The Levenshtein distance of a and b (insertions, deletions and substitutions of one character).
int edit_distance(std::string_view a, std::string_view b);

}  // namespace dc::cli
