// Running out of memory is a Status: a forward whose workspace cannot be allocated returns
// resource_exhausted instead of throwing. Runs in a child process with its address space capped
// (RLIMIT_AS), so nothing here allocates more than the cap; skipped under the sanitizers, whose
// runtimes reserve terabytes of address space.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <vector>

#include "model/synthetic.h"
#include "model/transformer.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define DC_TEST_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define DC_TEST_UNDER_SANITIZER 1
#endif
#endif

namespace dc {
namespace {

int64_t address_space_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0;
  statm >> pages;
  return pages * sysconf(_SC_PAGESIZE);
}

// In the child: a tiny model's forward over 400k positions (~0.9 GB of activations) with the address
// space capped 256 MB above what the process already holds. Exit code 0: resource_exhausted came back.
[[maybe_unused]] int forward_under_cap(bool threads) {  // (unused under the sanitizers)
  ThreadPool pool(threads ? 2 : 1);
  Context ctx;
  ctx.pool = &pool;
  ModelConfig config = synthetic_config("tiny").value();
  auto model = make_synthetic_model(config, 3, &pool);
  if (!model.ok()) return 10;
  constexpr int64_t kPositions = 400000;
  std::vector<int32_t> tokens(kPositions, 5);
  std::vector<int64_t> out_rows = {kPositions - 1};
  std::vector<float> logits(static_cast<size_t>(config.n_vocab));
  ForwardBatch batch;
  batch.n_batch = 1;
  batch.n_seq = kPositions;
  batch.tokens = tokens.data();
  batch.out_rows = out_rows.data();
  batch.n_out = 1;
  const rlimit cap{static_cast<rlim_t>(address_space_bytes() + (int64_t{256} << 20)), RLIM_INFINITY};
  if (setrlimit(RLIMIT_AS, &cap) != 0) return 11;
  const Status st = (*model)->forward(ctx, batch, logits.data());
  std::fprintf(stderr, "forward under a 256 MB cap: %s\n", st.to_string().c_str());
  if (st.ok()) return 12;
  if (st.code() != StatusCode::kResourceExhausted) return 13;
  return st.message().find("out of memory") != std::string::npos ? 0 : 14;
}

TEST(OutOfMemory, ForwardThatCannotGetItsWorkspaceReturnsResourceExhausted) {
#ifdef DC_TEST_UNDER_SANITIZER
  GTEST_SKIP() << "address-space caps do not work under the sanitizers";
#else
  for (bool threads : {false, true}) {
    std::fflush(nullptr);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) _exit(forward_under_cap(threads));
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status)) << "the child died (signal " << WTERMSIG(status) << "): an exception escaped";
    EXPECT_EQ(WEXITSTATUS(status), 0) << "threads " << threads << " (exit codes: see forward_under_cap)";
  }
#endif
}

}  // namespace
}  // namespace dc
