// server_load: a bounded load test of `diffucoder serve` on loopback. N client threads post completions
// back to back for a fixed time; prints one JSON line: requests, failures, completion tokens, req/s, tokens/s
// and latency percentiles (p50, p95, p99, max). Exit code 1 when any request failed (non-200, bad JSON or no
// choices).
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  int port = 8080, clients = 64;
  double seconds = 60.0;
  std::string extra = "{}";  // JSON object merged into every request (max_tokens, alg, ...)
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--port") port = std::atoi(v.c_str());
    else if (k == "--clients") clients = std::atoi(v.c_str());
    else if (k == "--seconds") seconds = std::atof(v.c_str());
    else if (k == "--request") extra = v;
    else {
      std::fprintf(stderr, "usage: server_load --port P --clients N --seconds S --request '{\"max_tokens\": 16}'\n");
      return 2;
    }
  }
  const nlohmann::json base = nlohmann::json::parse(extra, nullptr, false);
  if (!base.is_object()) {
    std::fprintf(stderr, "server_load: --request must be a JSON object\n");
    return 2;
  }
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  const Clock::time_point deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::atomic<int64_t> ok{0}, failed{0}, tokens{0};
  std::mutex mu;
  std::vector<double> latencies;
  std::string first_failure;
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      httplib::Client cli("127.0.0.1", port);
      cli.set_read_timeout(600, 0);
      cli.set_keep_alive(true);
      for (int i = 0; Clock::now() < deadline; ++i) {
        nlohmann::json body = base;
        body["prompt"] = "def f" + std::to_string(c) + "_" + std::to_string(i) + "(x):";
        body["seed"] = c * 100000 + i;
        const Clock::time_point ts = Clock::now();
        auto res = cli.Post("/v1/completions", body.dump(), "application/json");
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - ts).count();
        bool good = res && res->status == 200;
        if (good) {
          const nlohmann::json j = nlohmann::json::parse(res->body, nullptr, false);
          good = j.is_object() && j.contains("choices") && !j["choices"].empty() && j.contains("usage");
          if (good) tokens += j["usage"]["completion_tokens"].get<int64_t>();
        }
        std::lock_guard<std::mutex> lock(mu);
        if (good) {
          ++ok;
          latencies.push_back(ms);
        } else {
          ++failed;
          if (first_failure.empty())
            first_failure = (res ? std::to_string(res->status) + " " + res->body.substr(0, 200)
                                 : httplib::to_string(res.error())) +
                            " after " + std::to_string(ms) + " ms (request " + std::to_string(i) + " of client " +
                            std::to_string(c) + ")";
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  std::sort(latencies.begin(), latencies.end());
  auto pct = [&](double p) {
    return latencies.empty() ? 0.0 : latencies[std::min(latencies.size() - 1, static_cast<size_t>(p * latencies.size()))];
  };
  nlohmann::json out = {{"clients", clients},
                        {"seconds", wall},
                        {"requests", ok.load() + failed.load()},
                        {"failed", failed.load()},
                        {"completion_tokens", tokens.load()},
                        {"requests_per_second", ok.load() / wall},
                        {"tokens_per_second", tokens.load() / wall},
                        {"latency_ms_p50", pct(0.5)},
                        {"latency_ms_p95", pct(0.95)},
                        {"latency_ms_p99", pct(0.99)},
                        {"latency_ms_max", latencies.empty() ? 0.0 : latencies.back()}};
  if (!first_failure.empty()) out["first_failure"] = first_failure;
  std::printf("%s\n", out.dump().c_str());
  return failed.load() == 0 && ok.load() > 0 ? 0 : 1;
}
