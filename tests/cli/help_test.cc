// The help that teaches (cli/help.h): every subcommand's --help ends with at least two examples, each of which
// parses (DIFFUCODER_PARSE_ONLY=1: the command line checked, nothing run), and a mistyped subcommand or flag is
// answered with the nearest one.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "process.h"

namespace dc {
namespace {

using testing::run_binary;
using testing::run_command;

// The lines of `text` after the line `header` up to the next empty line, each without its leading spaces.
std::vector<std::string> section(const std::string& text, const std::string& header) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    if (inside && line.empty()) break;
    if (inside) lines.push_back(line.substr(line.find_first_not_of(' ')));
    if (line == header) inside = true;
  }
  return lines;
}

TEST(Help, EverySubcommandEndsWithExamplesThatParse) {
  const auto top = run_binary("--help");
  ASSERT_EQ(top.exit_code, 0) << top.err;
  const std::vector<std::string> subcommands = section(top.out, "Subcommands:");
  ASSERT_GE(subcommands.size(), 11u) << top.out;
  for (const std::string& row : subcommands) {
    const std::string name = row.substr(0, row.find(' '));
    const auto help = run_binary(name + " --help");
    ASSERT_EQ(help.exit_code, 0) << name << ": " << help.err;
    const std::vector<std::string> examples = section(help.out, "Examples:");
    EXPECT_GE(examples.size(), 2u) << name << " --help:\n" << help.out;
    for (const std::string& example : examples) {
      ASSERT_EQ(example.rfind("diffucoder " + name + " ", 0) == 0 || example == "diffucoder " + name, true) << example;
      const auto parsed = run_command("DIFFUCODER_PARSE_ONLY=1 " + std::string(DC_BINARY_PATH) +
                                      example.substr(std::string("diffucoder").size()));
      EXPECT_EQ(parsed.exit_code, 0) << example << "\n" << parsed.err;
    }
  }
  // The check can fail: a flag that does not exist is a usage error under DIFFUCODER_PARSE_ONLY too.
  const auto bad = run_command("DIFFUCODER_PARSE_ONLY=1 " + std::string(DC_BINARY_PATH) + " generate --model DIR --stepz 3");
  EXPECT_EQ(bad.exit_code, 2);
}

TEST(Help, TyposGetTheNearestName) {
  const auto flag = run_binary("generate --stepz 3");  // (CLI11 would only say that --model is missing)
  EXPECT_EQ(flag.exit_code, 2);
  EXPECT_NE(flag.err.find("unknown flag '--stepz' for generate; did you mean '--steps'?"), std::string::npos) << flag.err;
  const auto value = run_binary("generate --model DIR --cachee=dual");
  EXPECT_NE(value.err.find("'--cachee' for generate; did you mean '--cache'?"), std::string::npos) << value.err;
  const auto far = run_binary("train --model DIR --zzzzzzzz");
  EXPECT_NE(far.err.find("unknown flag '--zzzzzzzz' for train; see --help"), std::string::npos) << far.err;
  const auto command = run_binary("generat --steps 3");
  EXPECT_EQ(command.exit_code, 2);
  EXPECT_NE(command.err.find("unknown command 'generat'; did you mean 'generate'?"), std::string::npos) << command.err;
  const auto nothing_near = run_binary("frobnicate");
  EXPECT_EQ(nothing_near.err.find("did you mean"), std::string::npos) << nothing_near.err;
}

}  // namespace
}  // namespace dc
