// sandbox_bench: the numbers of BENCHMARKS.md "Sandbox". --overhead: the per-run overhead, start to exit of
// `/bin/true` and `python3 -c pass` spawned bare (posix_spawn + wait) and in the sandbox (clone to exit, and
// the whole sandbox::run call with its temp dir, maps and cleanup), medians of 40 runs each. --pool: the
// pool's throughput, 64 runs of `python3 -c pass` with 1, 2, 4 and 8 workers. Neither flag: both.
// --big-caller MIB: the cost of a run to a caller holding MIB of touched memory that a thread keeps writing
// (a trainer during its rewards): /bin/true runs with the memory from malloc (copied by a fork) and from
// alloc_pages (core/pages.h: not copied), side by side; wall, the caller's and the children's user / sys
// time per run, and the writer's pages per second against the writer alone.
// Usage: build/bench/sandbox_bench [--overhead] [--pool] [--big-caller MIB] (docs/bench.md).
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/pages.h"
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

double seconds(const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; }

struct Times {
  double user = 0, sys = 0;
};
Times usage(int who) {
  struct rusage ru;
  getrusage(who, &ru);
  return {seconds(ru.ru_utime), seconds(ru.ru_stime)};
}

// A thread writing one byte of every page of [p, p + bytes) round and round until `stop`; counts pages.
struct Writer {
  std::atomic<bool> stop{false};
  std::atomic<int64_t> pages{0};
  Times times;  // the writer thread's own, at its end
  std::thread thread;
  Writer(char* p, size_t bytes) {
    thread = std::thread([this, p, bytes] {
      while (!stop.load(std::memory_order_relaxed)) {
        for (size_t off = 0; off < bytes && !stop.load(std::memory_order_relaxed); off += 4096) {
          p[off] += 1;
          pages.fetch_add(1, std::memory_order_relaxed);
        }
      }
      times = usage(RUSAGE_THREAD);
    });
  }
  void finish() {
    stop = true;
    thread.join();
  }
};

// `runs` sandboxed /bin/true while a Writer writes [p, p + bytes); one line of results.
bool big_caller_runs(const char* what, char* p, size_t bytes, int runs) {
  std::memset(p, 1, bytes);
  Writer alone(p, bytes);  // the writer alone first, for its speed without runs
  std::this_thread::sleep_for(std::chrono::seconds(1));
  alone.finish();
  const double alone_rate = alone.pages.load() / 1.0;
  Writer writer(p, bytes);
  const Times self0 = usage(RUSAGE_THREAD), kids0 = usage(RUSAGE_CHILDREN);
  std::vector<double> walls;
  int64_t max_rss = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < runs; ++i) {
    RunSpec s;
    s.argv = {"/bin/true"};
    const auto r0 = std::chrono::steady_clock::now();
    auto r = run(s);
    walls.push_back(seconds_since(r0));
    if (!check_run(r, "/bin/true")) {
      writer.finish();
      return false;
    }
    max_rss = std::max(max_rss, r->max_rss_bytes);
  }
  const double t = seconds_since(t0);
  const Times self1 = usage(RUSAGE_THREAD), kids1 = usage(RUSAGE_CHILDREN);
  writer.finish();
  std::printf("%-34s run() median %.1f ms | per run: caller thread user %.2f sys %.2f ms, children user %.2f sys %.2f "
              "ms, writer sys %.2f ms | writer %.0f%% of its speed alone | a run's max RSS %.1f MiB (%d runs)\n",
              what, median(walls) * 1e3, (self1.user - self0.user) / runs * 1e3, (self1.sys - self0.sys) / runs * 1e3,
              (kids1.user - kids0.user) / runs * 1e3, (kids1.sys - kids0.sys) / runs * 1e3,
              writer.times.sys / runs * 1e3, 100.0 * (writer.pages.load() / t) / alone_rate, max_rss / 1048576.0, runs);
  return true;
}

int big_caller(size_t mib) {
  const size_t bytes = mib << 20;
  const int runs = 40;
  std::printf("caller holding %zu MiB, written page by page by a second thread during the runs\n", mib);
  char* heap = static_cast<char*>(std::malloc(bytes));  // as every large buffer was before core/pages.h
  if (heap == nullptr || !big_caller_runs("malloc (copied by the clone)", heap, bytes, runs)) return 1;
  std::free(heap);
  dc::PageArray<char> pages = dc::alloc_page_array<char>(bytes);
  if (!pages || !big_caller_runs("alloc_pages (MADV_DONTFORK)", pages.get(), bytes, runs)) return 1;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool want_overhead = false, want_pool = false;
  long big_mib = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--overhead") == 0) {
      want_overhead = true;
    } else if (std::strcmp(argv[i], "--pool") == 0) {
      want_pool = true;
    } else if (std::strcmp(argv[i], "--big-caller") == 0 && i + 1 < argc) {
      char* end = nullptr;
      big_mib = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || big_mib <= 0 || big_mib > (1 << 20)) {
        std::fprintf(stderr, "sandbox_bench: --big-caller takes MiB, a whole number in [1, 1048576], not '%s'\n", argv[i]);
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "sandbox_bench: unknown argument '%s' (usage: sandbox_bench [--overhead] [--pool] [--big-caller MIB])\n",
                   argv[i]);
      return 2;
    }
  }
  if (!want_overhead && !want_pool && big_mib == 0) want_overhead = want_pool = true;
  if (const dc::Status s = check_available(); !s.ok()) {
    std::fprintf(stderr, "sandbox_bench: the sandbox is not available: %s\n", s.to_string().c_str());
    return 1;
  }
  if (want_overhead && overhead() != 0) return 1;
  if (want_pool && pool_throughput() != 0) return 1;
  if (big_mib > 0 && big_caller(static_cast<size_t>(big_mib)) != 0) return 1;
  return 0;
}
