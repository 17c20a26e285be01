// Issue 20, memory: admission under a memory budget. 16 concurrent max_tokens 1024 completions on the tiny
// model with the real 152k vocabulary (1024 masked positions each at their first step, whose logits the
// head computes 64 rows at a time) each complete or get 503, the process's peak RSS stays under 1.5 GB,
// and the server answers after. A request whose step buffers alone exceed the budget is a 503 that names
// --max-memory.
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <vector>

#include "engine/engine.h"
#include "engine_fixtures.h"
#include "fixtures.h"
#include "server/running_server.h"

namespace dc::server {
namespace {

using nlohmann::json;
using test::Running;

int64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return 0;
}

TEST(MemoryBudget, SixteenLargeCompletionsStayUnderIt) {
  dc::testing::load_manifest();
  {  // the peak of this test only (Linux: 5 resets VmHWM)
    std::ofstream("/proc/self/clear_refs") << "5";
  }
  auto e = testing::load_engine(dc::testing::fixtures_dir() + "/tiny-vocab", 2);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  ServerOptions o;
  o.port = 0;
  o.limits.max_tokens = 1024;
  o.scheduler.max_memory_bytes = int64_t{1} << 30;  // one such job at a time
  o.scheduler.max_queue = 1;                        // and one waiting: the others get 503 at once (CI time)
  Running s(**e, o);
  std::atomic<int> ok{0}, busy{0}, other{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 16; ++i) {
    clients.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", s.port());
      c.set_read_timeout(300, 0);
      const json body = {{"prompt", "def f" + std::to_string(i)}, {"max_tokens", 1024}, {"steps", 2}};
      auto r = c.Post("/v1/completions", body.dump(), "application/json");
      (r && r->status == 200 ? ok : r && r->status == 503 ? busy : other)++;
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(other.load(), 0);
  EXPECT_GE(ok.load(), 1);
  EXPECT_EQ(ok.load() + busy.load(), 16);
  httplib::Client c("127.0.0.1", s.port());
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
#if !defined(__SANITIZE_ADDRESS__)  // AddressSanitizer's shadow memory and quarantine are not the server's
  EXPECT_LT(peak_rss_bytes(), int64_t{1500} << 20) << ok.load() << " completed, " << busy.load() << " got 503";
#endif
  std::printf("peak RSS %lld MiB; %d completed, %d got 503\n", static_cast<long long>(peak_rss_bytes() >> 20),
              ok.load(), busy.load());
}

// A job's step buffers are a hidden row per masked position (the lm_head runs in chunks of 64 rows, a
// block every head holds once): a budget that leaves less than that for 8 rows × 1024 tokens refuses
// the request before queueing it, naming the flag.
TEST(MemoryBudget, RequestThatCanNeverFitIsRefused) {
  auto e = testing::load_engine(dc::testing::fixtures_dir() + "/tiny-vocab", 2);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  const HeadMemory head = (*e)->head_memory();
  ServerOptions o;
  o.port = 0;
  o.limits.max_tokens = 1024;
  o.scheduler.max_memory_bytes = head.fixed_bytes + 1024 * head.bytes_per_row * 4;  // 4 rows of 1024, not 8
  Running s(**e, o);
  httplib::Client c("127.0.0.1", s.port());
  auto r = c.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 1024, "n": 8})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;
  const json err = json::parse(r->body)["error"];
  EXPECT_EQ(err["param"], "n") << r->body;
  EXPECT_NE(err["message"].get<std::string>().find("--max-memory"), std::string::npos) << r->body;
  // The number it names is what was weighed against the budget (the head's block included): above it.
  const std::string msg = err["message"].get<std::string>();
  const size_t at = msg.find("needs about ");
  ASSERT_NE(at, std::string::npos) << msg;
  const int64_t need_mib = std::stoll(msg.substr(at + 12));
  EXPECT_GT(need_mib, o.scheduler.max_memory_bytes >> 20) << msg;
}

}  // namespace
}  // namespace dc::server
