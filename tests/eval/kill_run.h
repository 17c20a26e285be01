// The eval tests' killed runs: `diffucoder` started with args and SIGKILLed (no chance to clean up) once ready()
// says it has written enough, to test that --resume continues it.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace dc::testing {

// Runs DC_BINARY_PATH with `args` (argv[1:]; stdout and stderr to /dev/null, TMPDIR = tmp_dir, created, so that
// the killed run's sandbox dirs stay in the test's directory), polls ready() every 10 ms (at most 10 s), then kills it.
inline void run_and_kill(std::vector<std::string> args, const std::string& tmp_dir, const std::function<bool()>& ready) {
  args.insert(args.begin(), DC_BINARY_PATH);
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::filesystem::create_directories(tmp_dir);
  pid_t pid = fork();
  if (pid == 0) {
    setenv("TMPDIR", tmp_dir.c_str(), 1);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1), dup2(devnull, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  for (int i = 0; i < 1000 && !ready(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

}  // namespace dc::testing
