// The numbers of BENCHMARKS.md "Sandbox": per-run overhead (start to exit of `python3 -c pass` and
// `/bin/true`, in the sandbox and spawned bare) and the pool's throughput. Disabled; run with
// build/tests/test_sandbox --gtest_also_run_disabled_tests --gtest_filter='SandboxBench.*'
#include <gtest/gtest.h>

#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "sandbox/pool.h"
#include "sandbox/sandbox.h"

extern char** environ;

namespace dc::sandbox {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double bare_run(const std::vector<std::string>& argv) {
  std::vector<char*> a;
  for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid;
  if (posix_spawn(&pid, a[0], nullptr, nullptr, a.data(), environ) != 0) return -1;
  waitpid(pid, nullptr, 0);
  return seconds_since(t0);
}

TEST(SandboxBench, DISABLED_Overhead) {
  ASSERT_TRUE(check_available().ok());
  std::printf("%s\n", describe().c_str());
  const int n = 40;
  for (const std::vector<std::string>& argv :
       {std::vector<std::string>{"/bin/true"}, std::vector<std::string>{"/usr/bin/python3", "-c", "pass"}}) {
    std::vector<double> bare, boxed, call;
    for (int i = 0; i < n; ++i) {
      bare.push_back(bare_run(argv));
      RunSpec s;
      s.argv = argv;
      const auto t0 = std::chrono::steady_clock::now();
      auto r = run(s);
      call.push_back(seconds_since(t0));
      ASSERT_TRUE(r.ok() && r->ok());
      boxed.push_back(r->wall_seconds);
    }
    // clone → exit (RunResult::wall_seconds) and the whole run() call (temp dir, maps, cleanup too).
    std::printf("%-24s bare %.1f ms | sandbox: clone to exit %.1f ms, whole run() %.1f ms | overhead %.1f ms "
                "(medians of %d)\n",
                (argv[0] + (argv.size() > 1 ? " -c pass" : "")).c_str(), median(bare) * 1e3, median(boxed) * 1e3,
                median(call) * 1e3, (median(call) - median(bare)) * 1e3, n);
  }
}

TEST(SandboxBench, DISABLED_PoolThroughput) {
  ASSERT_TRUE(check_available().ok());
  std::vector<RunSpec> specs(64);
  for (auto& s : specs) s.argv = {"python3", "-c", "pass"};
  for (int workers : {1, 2, 4, 8}) {
    const auto t0 = std::chrono::steady_clock::now();
    auto results = run_all(specs, workers);
    const double t = seconds_since(t0);
    for (const auto& r : results) ASSERT_TRUE(r.ok() && r->ok());
    std::printf("pool, %d workers: %zu runs of python3 -c pass in %.2f s = %.1f runs/s\n", workers, specs.size(), t,
                specs.size() / t);
  }
}

}  // namespace
}  // namespace dc::sandbox
