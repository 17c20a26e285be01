// Profiler / ProfileScope: nested paths, call counts, exclusive times, and nothing at all without one.
#include "core/profiler.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace dc {
namespace {

TEST(Profiler, NestedScopesRecordPathsCallsAndExclusiveTimes) {
  Profiler profiler;
  Context ctx;
  ctx.profiler = &profiler;
  for (int i = 0; i < 2; ++i) {
    const ProfileScope outer(ctx, "outer");
    const ProfileScope inner(ctx, [] { return std::string("inner ") + std::to_string(7); });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // inside inner only
  }
  {
    const ProfileScope alone(ctx, "inner 7");  // the same name at the top level is another path
  }
  const auto& e = profiler.entries();
  ASSERT_EQ(e.size(), 3u);
  ASSERT_EQ(e.count("outer"), 1u);
  ASSERT_EQ(e.count("outer/inner 7"), 1u);
  ASSERT_EQ(e.count("inner 7"), 1u);
  EXPECT_EQ(e.at("outer").calls, 2);
  EXPECT_EQ(e.at("outer/inner 7").calls, 2);
  EXPECT_EQ(e.at("inner 7").calls, 1);
  EXPECT_GE(e.at("outer/inner 7").seconds, 0.040);
  // The sleeps are the inner scope's: the outer keeps only its own (near-zero) time.
  EXPECT_LT(e.at("outer").seconds, e.at("outer/inner 7").seconds / 4);
  profiler.reset();
  EXPECT_TRUE(profiler.entries().empty());
}

TEST(Profiler, WithoutOneTheNameIsNeverMade) {
  Context ctx;  // no profiler
  bool called = false;
  {
    const ProfileScope scope(ctx, [&] {
      called = true;
      return std::string("x");
    });
  }
  EXPECT_FALSE(called);
}

}  // namespace
}  // namespace dc
