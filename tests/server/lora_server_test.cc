// Per-request LoRA adapters (serve --lora NAME=DIR, issue 37): the scheduler runs one batched forward per
// adapter, so a job's tokens do not depend on its batch mates' adapters (a job alone on an engine holding its
// adapter unmerged gives the same tokens); over HTTP a request's `model` picks the adapter, each answering
// as a server with that adapter merged, the base's name the base, an unknown name a 404 naming the models.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <thread>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine_fixtures.h"
#include "fixtures.h"
#include "random_adapter.h"
#include "running_server.h"
#include "api/scheduler.h"
#include "server/scheduler_gate.h"
#include "temp_dir.h"

namespace dc::server {
namespace {

using namespace std::chrono_literals;
constexpr uint32_t kAdapterQvDown = (1u << kLoraQ) | (1u << kLoraV) | (1u << kLoraDown);
constexpr uint32_t kAdapterAll = (1u << kLoraTargets) - 1;

// Two random adapters for the model in `dir`, written under `tmp`: "x" (all projections) and "y" (q, v, down).
std::vector<NamedLora> two_adapters(const std::string& model_dir, const std::string& tmp) {
  EngineOptions o;
  o.model_dir = model_dir;
  o.n_threads = 1;
  o.weight_cache = "off";
  auto engine = Engine::load(o);
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  const ModelConfig& c = (*engine)->config();
  const std::vector<NamedLora> named = {{"x", tmp + "/x"}, {"y", tmp + "/y"}};
  EXPECT_TRUE(dc::testing::write_random_adapter(named[0].dir, c, 4, kAdapterAll, 1, 0.3f).ok());
  EXPECT_TRUE(dc::testing::write_random_adapter(named[1].dir, c, 2, kAdapterQvDown, 2, 0.4f).ok());
  return named;
}

std::unique_ptr<Engine> lora_engine(const std::string& model_dir, std::vector<NamedLora> adapters,
                                    const std::string& lora_dir = "", LoraMode mode = LoraMode::kMerged) {
  EngineOptions o;
  o.model_dir = model_dir;
  o.n_threads = 2;
  o.matmul_precision = MatmulPrecision::kF32;
  o.weight_cache = "off";
  o.lora_adapters = std::move(adapters);
  o.lora_dir = lora_dir;
  o.lora_mode = mode;
  auto e = Engine::load(o);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return e.ok() ? std::move(*e) : nullptr;
}

TEST(SchedulerLora, MixedAdaptersInOneBatchEqualEachAlone) {
  const dc::test::TempDir tmp("sched_lora");
  const std::string model_dir = dc::testing::fixtures_dir() + "/tiny-gqa2";
  const std::vector<NamedLora> named = two_adapters(model_dir, tmp.path());
  const auto engine = lora_engine(model_dir, named);
  ASSERT_NE(engine, nullptr);
  Engine& e = *engine;
  const LoraWeights* x = e.lora_adapter("x");
  const LoraWeights* y = e.lora_adapter("y");
  ASSERT_NE(x, nullptr);
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(e.lora_adapter("z"), nullptr);
  EXPECT_EQ(e.lora_adapter_names(), (std::vector<std::string>{"x", "y"}));
  struct LoraCase {
    const LoraWeights* lora;
    std::string adapter;  // its name ("" = the base)
    std::vector<int32_t> prompt;
    SamplingParams params;
  };
  std::vector<LoraCase> cases;
  const char* names[] = {"", "x", "y", "x", "", "y"};
  for (int i = 0; i < 6; ++i) {
    SamplingParams p = e.default_params();
    p.max_new_tokens = 6 + 2 * (i % 3);
    p.steps = 6;
    p.alg = i % 2 == 0 ? Algorithm::kEntropy : Algorithm::kMaskgitPlus;
    p.temperature = i < 3 ? 0.0f : 0.7f;
    p.seed = static_cast<uint64_t>(i);
    if (i == 5) p.block_length = 4, p.cache = CacheMode::kDual, p.max_new_tokens = 8, p.steps = 8;  // its own forward
    std::vector<int32_t> prompt;
    for (int j = 0; j < 3 + 3 * i; ++j) prompt.push_back(static_cast<int32_t>((31 * j + 13 * i) % 300 + 1));
    cases.push_back({e.lora_adapter(names[i]), names[i], prompt, p});
  }
  Gate gate(e.head_fn());
  Scheduler scheduler(gate.fn(), e.config().n_vocab, e.head_memory(), &e.pool(), SchedulerOptions{}, nullptr,
                      [&e] { return e.head_fn(); });
  std::vector<std::shared_ptr<Job>> jobs;  // job 0 (the base) holds the gate: the others join its batch
  for (const LoraCase& c : cases) jobs.push_back(std::make_shared<Job>(c.prompt, c.params, std::vector<int32_t>{}, false, c.lora));
  const std::vector<JobResult> results = run_gated(scheduler, gate, jobs);
  ASSERT_EQ(results.size(), cases.size());
  const std::vector<int64_t> rows = gate.rows();
  EXPECT_GE(*std::max_element(rows.begin(), rows.end()), 2) << "the base jobs never shared a forward: nothing was tested";
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(results[i].status.ok()) << "case " << i << ": " << results[i].status.to_string();
    // Alone: an engine holding that adapter unmerged as its only one (the base: the plain engine).
    const auto alone_engine = cases[i].adapter.empty()
                                  ? lora_engine(model_dir, {})
                                  : lora_engine(model_dir, {}, named[cases[i].adapter == "x" ? 0 : 1].dir,
                                                LoraMode::kUnmerged);
    ASSERT_NE(alone_engine, nullptr);
    auto alone = alone_engine->generate({cases[i].prompt}, cases[i].params);
    ASSERT_TRUE(alone.ok()) << alone.status().to_string();
    EXPECT_EQ(results[i].generated, alone->generated) << "case " << i << " (adapter '" << cases[i].adapter << "')";
  }
  // The adapters change the tokens (else the test above proves nothing).
  SamplingParams p = e.default_params();
  p.max_new_tokens = 8;
  p.temperature = 0.0f;
  const std::vector<int32_t> prompt{5, 17, 42, 99};
  GenerateOutput base = e.generate({prompt}, p).value();
  const auto with_x = lora_engine(model_dir, {}, named[0].dir, LoraMode::kUnmerged);
  EXPECT_NE(with_x->generate({prompt}, p).value().generated, base.generated);
}

// A scheduler without a head factory cannot run an adapter's own forward: such jobs fail, the server lives.
TEST(SchedulerLora, AdapterJobsWithoutAFactoryFailCleanly) {
  const dc::test::TempDir tmp("sched_lora_plain");
  const std::string model_dir = dc::testing::fixtures_dir() + "/tiny-gqa2";
  const auto engine = lora_engine(model_dir, two_adapters(model_dir, tmp.path()));
  ASSERT_NE(engine, nullptr);
  Engine& e = *engine;
  Scheduler plain(e.head_fn(), e.config().n_vocab, e.head_memory(), &e.pool(), SchedulerOptions{}, nullptr);
  SamplingParams p = e.default_params();
  p.max_new_tokens = 4;
  auto job = std::make_shared<Job>(std::vector<int32_t>{1, 2, 3}, p, std::vector<int32_t>{}, false, e.lora_adapter("x"));
  ASSERT_EQ(plain.submit(job), SubmitResult::kOk);
  EXPECT_EQ(wait_result(*job).status.code(), StatusCode::kUnimplemented);
  auto base = std::make_shared<Job>(std::vector<int32_t>{1, 2, 3}, p, std::vector<int32_t>{}, false);
  ASSERT_EQ(plain.submit(base), SubmitResult::kOk);
  EXPECT_TRUE(wait_result(*base).status.ok());
}

// Over HTTP (the tiny checkpoint with the real vocabulary and tokenizer): /v1/models lists the base and the
// adapters; each adapter's name answers as a server with that adapter merged, the base's name (or none) as
// the base model's server; an unknown name is a 404 naming the models.
TEST(HttpLora, ModelFieldPicksTheAdapter) {
  const dc::test::TempDir tmp("http_lora");
  const std::string model_dir = dc::testing::fixtures_dir() + "/tiny-vocab";
  const std::vector<NamedLora> named = two_adapters(model_dir, tmp.path());
  diffucoder::LoadOptions lo;  // as `serve --lora x=DIR --lora y=DIR` loads it
  lo.model_dir = model_dir;
  lo.threads = 2;
  lo.precision = "f32";
  lo.weight_cache = "off";
  for (const NamedLora& n : named) lo.lora_adapters.push_back({n.name, n.dir});
  auto loaded = diffucoder::Model::load(lo);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const diffucoder::Model& multi = **loaded;
  EXPECT_EQ(multi.adapter_names(), (std::vector<std::string>{"x", "y"}));
  const auto base = lora_engine(model_dir, {});
  const auto merged_x = lora_engine(model_dir, {}, named[0].dir);
  const auto merged_y = lora_engine(model_dir, {}, named[1].dir);
  ASSERT_TRUE(base && merged_x && merged_y);
  ServerOptions so;
  so.port = 0;
  so.model_name = "tiny";
  test::Running server(multi, so);
  httplib::Client c("127.0.0.1", server.port());
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  ASSERT_EQ(models->status, 200);
  const nlohmann::json listed = nlohmann::json::parse(models->body)["data"];
  ASSERT_EQ(listed.size(), 3u) << models->body;
  EXPECT_EQ(listed[0]["id"], "tiny");
  EXPECT_EQ(listed[1]["id"], "x");
  EXPECT_EQ(listed[2]["id"], "y");
  EXPECT_EQ(listed[1]["parent"], "tiny");

  const auto text_of = [](httplib::Client& client, const std::string& model) {
    nlohmann::json body = {{"prompt", "def add(a, b):"}, {"max_tokens", 8}, {"n", 2}, {"temperature", 0}};
    if (!model.empty()) body["model"] = model;
    auto r = client.Post("/v1/completions", body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return std::string();
    EXPECT_EQ(r->status, 200) << r->body;
    const nlohmann::json j = nlohmann::json::parse(r->body);
    if (!model.empty()) {
      EXPECT_EQ(j["model"], model);
    }
    return j["choices"][0]["text"].get<std::string>() + "|" + j["choices"][1]["text"].get<std::string>();
  };
  std::map<std::string, std::string> want;
  for (const auto& [name, engine] : {std::pair{std::string("x"), merged_x.get()}, std::pair{std::string("y"), merged_y.get()},
                                     std::pair{std::string("tiny"), base.get()}}) {
    test::Running one(*engine, so);
    httplib::Client oc("127.0.0.1", one.port());
    want[name] = text_of(oc, "");
  }
  EXPECT_NE(want["x"], want["tiny"]);
  EXPECT_NE(want["y"], want["tiny"]);
  // Concurrent requests of every model: mixed in the batches, each answers with its own adapter.
  std::vector<std::string> models_asked = {"x", "y", "tiny", "", "y", "x"};
  std::vector<std::string> got(models_asked.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < models_asked.size(); ++i)
    threads.emplace_back([&, i] {
      httplib::Client tc("127.0.0.1", server.port());
      got[i] = text_of(tc, models_asked[i]);
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < models_asked.size(); ++i)
    EXPECT_EQ(got[i], want[models_asked[i].empty() ? "tiny" : models_asked[i]]) << "model '" << models_asked[i] << "'";

  auto unknown = c.Post("/v1/completions", R"({"prompt": "a", "max_tokens": 2, "model": "gpt-4"})", "application/json");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404) << unknown->body;
  const nlohmann::json err = nlohmann::json::parse(unknown->body)["error"];
  EXPECT_EQ(err["param"], "model");
  EXPECT_EQ(err["code"], "model_not_found");
  for (const char* s : {"gpt-4", "'tiny'", "'x'", "'y'"})
    EXPECT_NE(err["message"].get<std::string>().find(s), std::string::npos) << s << ": " << err.dump();
  // A server without named adapters answers to any model name, as before.
  test::Running plain(*base, so);
  httplib::Client pc("127.0.0.1", plain.port());
  EXPECT_EQ(text_of(pc, "gpt-4"), want["tiny"]);
}

}  // namespace
}  // namespace dc::server
