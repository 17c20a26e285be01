// Status / Result propagation, dtype conversions (bf16 and f16 round-to-nearest-even, specials), the
// thread pool (every index visited exactly once, any thread count) and the per-thread workspace buffers.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "core/workspace.h"

namespace dc {
namespace {

Result<int> half_of(int x) {
  if (x % 2 != 0) return invalid_argument("x: " + std::to_string(x) + " is odd");
  return x / 2;
}

Result<int> quarter_of(int x) {
  DC_ASSIGN_OR_RETURN(int h, half_of(x));
  DC_ASSIGN_OR_RETURN(int q, half_of(h));
  return q;
}

TEST(Status, PropagatesFirstError) {
  EXPECT_EQ(*quarter_of(8), 2);
  auto r = quarter_of(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "x: 3 is odd");
  EXPECT_EQ(r.status().with_context("loading").to_string(), "invalid argument: loading: x: 3 is odd");
  EXPECT_TRUE(Status().with_context("ignored").ok());
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties go to the even mantissa (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-INFINITY)), -INFINITY);
}

TEST(DType, F16RoundTripAndSpecials) {
  for (float v : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f, 0.333251953125f})
    EXPECT_EQ(f16_to_f32(f32_to_f16(v)), v) << v;
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds to +inf
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie → even
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  std::vector<uint16_t> h = {0x3c00, 0xc000};
  float out[2];
  convert_to_f32(DType::kF16, h.data(), out, 2);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
}

TEST(ThreadPool, VisitsEveryIndexOnce) {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 7, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      for (int rep = 0; rep < 3; ++rep)
        pool.parallel_for(n, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) hits[i]++;
        });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 3) << "threads " << threads << " index " << i;
    }
  }
}

TEST(ThreadPool, ConcurrentCallersEachGetTheirOwnResult) {
  // Several threads share one pool: each parallel_for must visit its own range exactly once.
  ThreadPool pool(3);
  constexpr int kCallers = 4, kCalls = 50;
  std::vector<int64_t> sums(kCallers, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c)
    callers.emplace_back([&, c] {
      for (int call = 0; call < kCalls; ++call) {
        const int64_t n = 100 + c * 37 + call;
        std::vector<std::atomic<int>> hits(n);
        pool.parallel_for(n, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) hits[i]++;
        });
        for (int64_t i = 0; i < n; ++i) sums[c] += hits[i].load();
      }
    });
  for (auto& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) {
    int64_t want = 0;
    for (int call = 0; call < kCalls; ++call) want += 100 + c * 37 + call;
    EXPECT_EQ(sums[c], want) << "caller " << c;
  }
}

TEST(ThreadPool, ExceptionInAnyChunkReachesTheCaller) {
  // A worker's std::bad_alloc (e.g. from kernel scratch) must not terminate the process.
  ThreadPool pool(3);
  for (int64_t bad : {0, 500, 999}) {
    EXPECT_THROW(pool.parallel_for(1000, [&](int64_t b, int64_t e) {
      if (bad >= b && bad < e) throw std::bad_alloc();
    }), std::bad_alloc) << "index " << bad;
    std::atomic<int64_t> sum{0};  // the pool still works afterwards
    pool.parallel_for(1000, [&](int64_t b, int64_t e) { sum += e - b; });
    EXPECT_EQ(sum.load(), 1000);
  }
}

TEST(ThreadPool, NestedParallelForRunsInline) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(64 * 64);
  pool.parallel_for(64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      pool.parallel_for(64, [&](int64_t b2, int64_t e2) {
        for (int64_t j = b2; j < e2; ++j) hits[i * 64 + j]++;
      });
  });
  for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i;
}

TEST(ThreadPool, EachThreadOfACallHasItsOwnWorkspaceBuffer) {
  // The kernels' block buffers (Workspace::thread_buffer) are keyed by ThreadPool::thread_index(): one
  // thread per index within a call, each index always the same buffer, freed by release(). Under
  // ThreadSanitizer (scripts/test.sh --tsan) a shared buffer would also show as a race.
  ThreadPool pool(4);
  Workspace ws;
  EXPECT_EQ(ThreadPool::thread_index(), 0);  // outside any parallel_for
  std::mutex mu;
  std::map<int, std::set<int64_t*>> buffers;  // thread index → the buffers it was given
  bool overwritten = false;
  for (int call = 0; call < 4; ++call) {
    std::map<int, std::set<std::thread::id>> threads;  // thread index → the threads that had it
    pool.parallel_for(64, [&](int64_t, int64_t) {
      const int index = ThreadPool::thread_index();
      int64_t* buf = ws.thread_buffer<int64_t>("test", 512);
      for (int i = 0; i < 512; ++i) buf[i] = index;
      std::this_thread::yield();
      bool bad = reinterpret_cast<uintptr_t>(buf) % 64 != 0;
      for (int i = 0; i < 512; ++i) bad |= buf[i] != index;
      std::lock_guard<std::mutex> lock(mu);
      overwritten |= bad;
      buffers[index].insert(buf);
      threads[index].insert(std::this_thread::get_id());
    });
    for (const auto& [index, ids] : threads) {
      EXPECT_GE(index, 0);
      EXPECT_LT(index, pool.n_threads());
      EXPECT_EQ(ids.size(), 1u) << "index " << index << " was used by several threads in one call";
    }
  }
  EXPECT_FALSE(overwritten) << "a thread's buffer was written by another thread (or is not 64-byte aligned)";
  std::set<int64_t*> all;
  for (const auto& [index, bufs] : buffers) {
    EXPECT_EQ(bufs.size(), 1u) << "index " << index << " got a new buffer in a later call";
    all.insert(bufs.begin(), bufs.end());
  }
  EXPECT_EQ(all.size(), buffers.size());
  EXPECT_GE(ws.bytes(), static_cast<int64_t>(buffers.size() * 512 * sizeof(int64_t)));
  ws.release();
  EXPECT_EQ(ws.bytes(), 0);
}

}  // namespace
}  // namespace dc
