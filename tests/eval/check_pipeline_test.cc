// CheckPipeline (checks overlapping generation): batches handed over one at a time give the same records as
// check_samples over all the samples at once (the serial path), and an error stops the pipeline and is returned.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <tuple>

#include "eval/check_pipeline.h"
#include "eval/humaneval.h"
#include "sandbox/sandbox.h"

namespace dc::eval::pipeline_test {
namespace {

const std::string kHumanEval = std::string(DC_SOURCE_DIR) + "/data/humaneval/HumanEval.jsonl.gz";

using Outcome = std::tuple<bool, Failure, std::string>;  // passed, failure, detail
using Outcomes = std::map<std::pair<std::string, int>, Outcome>;

// Two samples of each of the first 6 tasks: the canonical solution, and a broken one of a kind that depends
// on the task (wrong answer, exception, syntax error). No timeouts: under load a wall clock decides those.
std::vector<Sample> make_samples(const std::vector<Task>& tasks) {
  const char* broken[] = {"    return None\n", "    raise ValueError('x')\n", "    return (\n"};
  std::vector<Sample> out;
  for (size_t i = 0; i < 6; ++i) {
    for (int s = 0; s < 2; ++s) {
      Sample x;
      x.task_id = tasks[i].task_id;
      x.sample = s;
      x.completion = s == 0 ? tasks[i].canonical_solution : broken[i % 3];
      x.program = tasks[i].prompt + x.completion;
      out.push_back(x);
    }
  }
  return out;
}

TEST(CheckPipeline, BatchesGiveTheRecordsOfTheSerialPath) {
  if (!sandbox::check_available().ok()) GTEST_SKIP() << "no namespaces";
  auto tasks = load_tasks(kHumanEval);
  ASSERT_TRUE(tasks.ok()) << tasks.status().message();
  std::map<std::string, const Task*> by_id;
  for (const auto& t : *tasks) by_id[t.task_id] = &t;
  const std::vector<Sample> samples = make_samples(*tasks);
  CheckOptions options;
  options.timeout_seconds = 20;  // no sample should reach it, however loaded the machine

  Outcomes serial, piped;
  ASSERT_TRUE(check_samples(samples, by_id, options, 2, [&](const SampleRecord& r) {
                serial[{r.task_id, r.sample}] = {r.passed, r.failure, r.detail};
                return Status::ok_status();
              }).ok());

  std::mutex mu;  // on_record runs on the pipeline's threads; the test reads after finish()
  CheckPipeline pipeline(by_id, options, 2, [&](const SampleRecord& r) {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(piped.emplace(std::make_pair(r.task_id, r.sample), Outcome{r.passed, r.failure, r.detail}).second)
        << "checked twice: " << r.task_id << " " << r.sample;
    return Status::ok_status();
  }, {});
  for (size_t begin = 0; begin < samples.size(); begin += 3)  // batches of 3: uneven, more than one waiting
    ASSERT_TRUE(pipeline.submit({samples.begin() + begin, samples.begin() + std::min(samples.size(), begin + 3)}).ok());
  ASSERT_TRUE(pipeline.finish().ok());

  ASSERT_EQ(serial.size(), samples.size());
  EXPECT_EQ(piped, serial);
  int passed = 0;
  for (const auto& [key, o] : serial) passed += std::get<0>(o);
  EXPECT_EQ(passed, 6);  // the canonical ones; every broken one fails
  EXPECT_EQ(std::get<1>(serial.at({"HumanEval/3", 1})), Failure::kAssertion);
  EXPECT_EQ(std::get<1>(serial.at({"HumanEval/4", 1})), Failure::kException);
  EXPECT_EQ(std::get<1>(serial.at({"HumanEval/2", 1})), Failure::kSyntax);
}

TEST(CheckPipeline, AnErrorStopsItAndIsReturned) {
  if (!sandbox::check_available().ok()) GTEST_SKIP() << "no namespaces";
  auto tasks = load_tasks(kHumanEval);
  ASSERT_TRUE(tasks.ok());
  std::map<std::string, const Task*> by_id;
  for (const auto& t : *tasks) by_id[t.task_id] = &t;
  std::vector<Sample> good = make_samples(*tasks);
  good.resize(2);
  Sample unknown = good[0];
  unknown.task_id = "Nope/1";
  int calls = 0;
  CheckPipeline pipeline(by_id, CheckOptions(), 1, [&](const SampleRecord&) {
    ++calls;
    return Status::ok_status();
  }, {});
  ASSERT_TRUE(pipeline.submit({unknown}).ok());
  Status later = Status::ok_status();
  for (int i = 0; i < 3 && later.ok(); ++i) later = pipeline.submit(good);  // refused once the error is seen
  Status s = pipeline.finish();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("unknown task_id Nope/1"), std::string::npos) << s.message();
  EXPECT_EQ(calls, 0);  // the batches behind the failed one are never checked
  EXPECT_EQ(pipeline.finish().message(), s.message());  // finish again: the same error, nothing hangs
}

}  // namespace
}  // namespace dc::eval::pipeline_test
