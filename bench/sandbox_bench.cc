// sandbox_bench: the numbers of BENCHMARKS.md "Sandbox". --overhead: the per-run overhead, start to exit of
// `/bin/true` and `python3 -c pass` spawned bare (posix_spawn + wait) and in the sandbox (clone to exit, and
// the whole sandbox::run call with its temp dir, maps and cleanup), medians of 40 runs each. --pool: the
// pool's throughput, 64 runs of `python3 -c pass` with 1, 2, 4 and 8 workers. Neither flag: both.
// Usage: build/bench/sandbox_bench [--overhead] [--pool] (docs/bench.md).
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "sandbox/pool.h"
#include "sandbox/sandbox.h"

extern char** environ;

namespace {

using namespace dc::sandbox;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds from posix_spawn to the end of waitpid, outside the sandbox; -1 when the spawn fails.
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

// A failed run ends the benchmark (exit 1) with its error.
bool check_run(const dc::Result<RunResult>& r, const std::string& what) {
  if (r.ok() && r->ok()) return true;
  std::fprintf(stderr, "sandbox_bench: %s failed: %s\n", what.c_str(),
               r.ok() ? "the program did not exit 0" : r.status().to_string().c_str());
  return false;
}

int overhead() {
  std::printf("%s\n", describe().c_str());
  const int n = 40;
  for (const std::vector<std::string>& argv :
       {std::vector<std::string>{"/bin/true"}, std::vector<std::string>{"/usr/bin/python3", "-c", "pass"}}) {
    const std::string name = argv[0] + (argv.size() > 1 ? " -c pass" : "");
    std::vector<double> bare, boxed, call;
    for (int i = 0; i < n; ++i) {
      bare.push_back(bare_run(argv));
      RunSpec s;
      s.argv = argv;
      const auto t0 = std::chrono::steady_clock::now();
      auto r = run(s);
      call.push_back(seconds_since(t0));
      if (!check_run(r, name)) return 1;
      boxed.push_back(r->wall_seconds);
    }
    // clone → exit (RunResult::wall_seconds) and the whole run() call (temp dir, maps, cleanup too).
    std::printf("%-24s bare %.1f ms | sandbox: clone to exit %.1f ms, whole run() %.1f ms | overhead %.1f ms "
                "(medians of %d)\n",
                name.c_str(), median(bare) * 1e3, median(boxed) * 1e3, median(call) * 1e3,
                (median(call) - median(bare)) * 1e3, n);
  }
  return 0;
}

int pool_throughput() {
  std::vector<RunSpec> specs(64);
  for (auto& s : specs) s.argv = {"python3", "-c", "pass"};
  for (int workers : {1, 2, 4, 8}) {
    const auto t0 = std::chrono::steady_clock::now();
    auto results = run_all(specs, workers);
    const double t = seconds_since(t0);
    for (const auto& r : results)
      if (!check_run(r, "python3 -c pass")) return 1;
    std::printf("pool, %d workers: %zu runs of python3 -c pass in %.2f s = %.1f runs/s\n", workers, specs.size(), t,
                specs.size() / t);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool want_overhead = false, want_pool = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--overhead") == 0) {
      want_overhead = true;
    } else if (std::strcmp(argv[i], "--pool") == 0) {
      want_pool = true;
    } else {
      std::fprintf(stderr, "sandbox_bench: unknown argument '%s' (usage: sandbox_bench [--overhead] [--pool])\n", argv[i]);
      return 2;
    }
  }
  if (!want_overhead && !want_pool) want_overhead = want_pool = true;
  if (const dc::Status s = check_available(); !s.ok()) {
    std::fprintf(stderr, "sandbox_bench: the sandbox is not available: %s\n", s.to_string().c_str());
    return 1;
  }
  if (want_overhead && overhead() != 0) return 1;
  if (want_pool && pool_throughput() != 0) return 1;
  return 0;
}
