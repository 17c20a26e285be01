#include "sandbox/pool.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

namespace dc::sandbox {

std::vector<Result<RunResult>> run_all(const std::vector<RunSpec>& specs, int workers, const OnRunDone& on_done) {
  std::vector<Result<RunResult>> results(specs.size(), Result<RunResult>(internal_error("sandbox: not run")));
  std::atomic<size_t> next{0};
  std::mutex done_mu;
  auto work = [&] {
    for (;;) {
      size_t i = next.fetch_add(1);
      if (i >= specs.size()) return;
      Result<RunResult> r = run(specs[i]);
      std::lock_guard<std::mutex> lock(done_mu);
      results[i] = std::move(r);
      if (on_done) on_done(i, results[i]);
    }
  };
  const size_t n = std::min(specs.size(), static_cast<size_t>(std::max(1, workers)));
  std::vector<std::thread> threads;
  for (size_t t = 0; t + 1 < n; ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace dc::sandbox
