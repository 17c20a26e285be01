// `--model ORG/NAME` finds the checkpoint in Hugging Face's local cache (io/hub_cache.h, README "With a
// downloaded model"): a cache laid out here in the hub's exact layout from the tiny-vocab fixture (blobs/ of
// the fixture's files, snapshots/<commit>/ of relative symlinks into ../../blobs, refs/main), found through
// HF_HUB_CACHE; a name that is not there fails with exit 1 naming the paths looked at and the download command.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "fixtures.h"
#include "process.h"
#include "temp_dir.h"

namespace dc {
namespace {

namespace fs = std::filesystem;
using testing::run_command;

constexpr const char* kHubCliCommit = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678";

// HF_HUB_CACHE=<cache> before the binary with `args`.
testing::RunResult hub_cli_run(const std::string& cache, const std::string& args) {
  return run_command("HF_HUB_CACHE='" + cache + "' " + std::string(DC_BINARY_PATH) + " " + args);
}

// models--test-org--tiny-vocab under `cache`: each fixture file a blob (a symlink to the fixture's file),
// linked from the snapshot by a relative symlink, as huggingface_hub lays them out.
fs::path make_hub_cli_cache(const fs::path& cache) {
  fs::path repo = cache / "models--test-org--tiny-vocab";
  fs::create_directories(repo / "blobs");
  fs::create_directories(repo / "snapshots" / kHubCliCommit);
  fs::create_directories(repo / "refs");
  int i = 0;
  for (const char* name : {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"}) {
    const std::string blob = "blob" + std::to_string(i++);
    fs::create_symlink(fs::absolute(testing::vocab_model()) / name, repo / "blobs" / blob);
    fs::create_symlink(fs::path("..") / ".." / "blobs" / blob, repo / "snapshots" / kHubCliCommit / name);
  }
  std::ofstream(repo / "refs" / "main") << kHubCliCommit;
  return repo;
}

TEST(HubCacheCli, InspectAndTokenizeFindTheModelInTheCache) {
  const test::TempDir cache("hub_cli");
  const fs::path repo = make_hub_cli_cache(cache.path());
  auto r = hub_cli_run(cache.path(), "inspect --model test-org/tiny-vocab --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(fs::path(j["model_dir"].get<std::string>()), repo / "snapshots" / kHubCliCommit);
  auto direct = testing::run_binary("inspect --model " + testing::vocab_model() + " --json");
  ASSERT_EQ(direct.exit_code, 0) << direct.err;
  EXPECT_EQ(j["parameters"], nlohmann::json::parse(direct.out)["parameters"]);
  auto t = hub_cli_run(cache.path(), "tokenize --model test-org/tiny-vocab --text 'def f(x):'");
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_FALSE(t.out.empty());
}

TEST(HubCacheCli, AbsentModelNamesThePathsAndTheDownloadCommand) {
  const test::TempDir cache("hub_cli");
  auto r = hub_cli_run(cache.path(), "inspect --model test-org/not-downloaded");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const std::string looked = (fs::path(cache.path()) / "models--test-org--not-downloaded" / "refs" / "main").string();
  EXPECT_NE(r.err.find(looked), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("hf download test-org/not-downloaded"), std::string::npos) << r.err;
  // refs/main naming a snapshot that is not there: both named.
  const fs::path repo = make_hub_cli_cache(cache.path());
  fs::remove_all(repo / "snapshots" / kHubCliCommit);
  auto m = hub_cli_run(cache.path(), "inspect --model test-org/tiny-vocab");
  EXPECT_EQ(m.exit_code, 1) << m.err;
  EXPECT_NE(m.err.find((repo / "refs" / "main").string()), std::string::npos) << m.err;
  EXPECT_NE(m.err.find((repo / "snapshots" / kHubCliCommit).string()), std::string::npos) << m.err;
}

// `serve --model ORG/NAME` names its one model ORG/NAME in /v1/models (not the snapshot's commit): the server
// started on a free port, asked once with Python's urllib, stopped (bounded by `timeout`).
TEST(HubCacheCli, ServeNamesTheModelByItsHubName) {
  const test::TempDir cache("hub_cli");
  make_hub_cli_cache(cache.path());
  const std::string err = (fs::path(cache.path()) / "serve.err").string();
  const fs::path script = fs::path(cache.path()) / "serve.sh";
  std::ofstream(script) << "HF_HUB_CACHE='" << cache.path() << "' " << DC_BINARY_PATH
                        << " serve --model test-org/tiny-vocab --port 0 --threads 1 2>'" << err << "' &\n"
                        << "pid=$!\nport=\nfor i in $(seq 300); do\n"
                        << "  port=$(grep -o 'http://127.0.0.1:[0-9]*' '" << err << "' | head -n1 | cut -d: -f3)\n"
                        << "  [ -n \"$port\" ] && break; sleep 0.1\ndone\n"
                        << "/usr/bin/python3 -c 'import sys, urllib.request; print(urllib.request.urlopen("
                        << "\"http://127.0.0.1:%s/v1/models\" % sys.argv[1], timeout=20).read().decode())' \"$port\"\n"
                        << "kill $pid; wait $pid\n";
  auto r = run_command("timeout 60 sh '" + script.string() + "'");
  auto models = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(models.is_discarded()) << r.out << r.err;
  ASSERT_EQ(models["data"].size(), 1u) << r.out;
  EXPECT_EQ(models["data"][0]["id"], "test-org/tiny-vocab") << r.out;
}

}  // namespace
}  // namespace dc
