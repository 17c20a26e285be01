// Runs a shell command for the tests that drive the `diffucoder` binary (or python) from outside,
// capturing its exit code, standard output and standard error.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace dc::testing {

struct RunResult {
  int exit_code = -1;  // -1: not started, or killed by a signal
  std::string out, err;
};

// Runs `command` through the shell; stderr goes to a temporary file that is read back and removed.
inline RunResult run_command(const std::string& command) {
  static int counter = 0;
  const std::filesystem::path err_path = std::filesystem::temp_directory_path() /
                                         ("dc_test_err_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
  RunResult r;
  FILE* pipe = popen((command + " 2>" + err_path.string()).c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err(err_path);
  std::stringstream ss;
  ss << err.rdbuf();
  r.err = ss.str();
  std::filesystem::remove(err_path);
  return r;
}

// Runs the project's binary (DC_BINARY_PATH) with `args` (shell words).
inline RunResult run_binary(const std::string& args) { return run_command(std::string(DC_BINARY_PATH) + " " + args); }

}  // namespace dc::testing
