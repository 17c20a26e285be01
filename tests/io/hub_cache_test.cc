// The Hugging Face hub cache lookup (io/hub_cache.h) against a cache laid out here in the hub's exact layout:
// blobs/<hash> holding the files, snapshots/<commit>/ of RELATIVE symlinks into ../../blobs, refs/main.
#include "io/hub_cache.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "io/io_test_util.h"

namespace dc {
namespace {

namespace fs = std::filesystem;
using dc::test::TempDir;

constexpr const char* kHubCommit = "0123456789abcdef0123456789abcdef01234567";

void hub_write_text(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

// models--ORG--NAME under `cache` with one snapshot `commit` holding config.json (a symlink to its blob);
// refs/main names `ref_main` (empty: no refs/main).
fs::path make_hub_repo(const fs::path& cache, const std::string& org, const std::string& name, const std::string& commit,
                   const std::string& ref_main) {
  fs::path repo = cache / ("models--" + org + "--" + name);
  hub_write_text(repo / "blobs" / "b1ob", "{\"model_type\": \"dream\"}");
  fs::create_directories(repo / "snapshots" / commit);
  fs::create_symlink(fs::path("..") / ".." / "blobs" / "b1ob", repo / "snapshots" / commit / "config.json");
  if (!ref_main.empty()) hub_write_text(repo / "refs" / "main", ref_main);
  return repo;
}

HubEnv hub_env_for(const std::string& cache) {
  HubEnv env;
  env.hf_hub_cache = cache;
  return env;
}

TEST(HubCache, FindsTheSnapshotRefsMainNamesAndFollowsTheSymlinks) {
  TempDir dir("hub");
  fs::path repo = make_hub_repo(dir.path(), "acme", "Coder-7B", kHubCommit, kHubCommit);
  auto found = find_in_hub_cache("acme/Coder-7B", hub_env_for(dir.path()));
  ASSERT_TRUE(found.ok()) << found.status().to_string();
  EXPECT_EQ(fs::path(*found), repo / "snapshots" / kHubCommit);
  std::ifstream in(fs::path(*found) / "config.json");  // through the relative symlink into blobs/
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "{\"model_type\": \"dream\"}");
  // resolve_model_path, the flags' entry, too; a refs/main with a trailing newline is read the same.
  hub_write_text(repo / "refs" / "main", std::string(kHubCommit) + "\n");
  auto resolved = resolve_model_path("acme/Coder-7B", hub_env_for(dir.path()));
  ASSERT_TRUE(resolved.ok()) << resolved.status().to_string();
  EXPECT_EQ(*resolved, *found);
}

TEST(HubCache, RevisionIsARefOrACommit) {
  TempDir dir("hub");
  const std::string other = "fedcba9876543210fedcba9876543210fedcba98";
  fs::path repo = make_hub_repo(dir.path(), "acme", "m", kHubCommit, kHubCommit);
  fs::create_directories(repo / "snapshots" / other);
  hub_write_text(repo / "refs" / "v1.0", other);
  auto by_ref = find_in_hub_cache("acme/m@v1.0", hub_env_for(dir.path()));
  ASSERT_TRUE(by_ref.ok()) << by_ref.status().to_string();
  EXPECT_EQ(fs::path(*by_ref), repo / "snapshots" / other);
  auto by_commit = find_in_hub_cache("acme/m@" + other, hub_env_for(dir.path()));
  ASSERT_TRUE(by_commit.ok()) << by_commit.status().to_string();
  EXPECT_EQ(fs::path(*by_commit), repo / "snapshots" / other);
  EXPECT_FALSE(find_in_hub_cache("acme/m@v2", hub_env_for(dir.path())).ok());
}

TEST(HubCache, AbsentNamesThePathsLookedAtAndTheDownloadCommand) {
  TempDir dir("hub");
  auto r = resolve_model_path("acme/missing", hub_env_for(dir.path()));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  const std::string& m = r.status().message();
  EXPECT_NE(m.find((fs::absolute("acme/missing")).string()), std::string::npos) << m;  // the local path
  EXPECT_NE(m.find((fs::path(dir.path()) / "models--acme--missing" / "refs" / "main").string()), std::string::npos) << m;
  EXPECT_NE(m.find("$HF_HUB_CACHE"), std::string::npos) << m;
  EXPECT_NE(m.find("huggingface-cli download acme/missing"), std::string::npos) << m;
  EXPECT_NE(m.find("hf download acme/missing"), std::string::npos) << m;
}

TEST(HubCache, RefsMainNamingAMissingSnapshotNamesBoth) {
  TempDir dir("hub");
  const std::string gone = "1111111111111111111111111111111111111111";
  fs::path repo = make_hub_repo(dir.path(), "acme", "m", kHubCommit, gone);
  auto r = find_in_hub_cache("acme/m", hub_env_for(dir.path()));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find((repo / "refs" / "main").string()), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find((repo / "snapshots" / gone).string()), std::string::npos) << r.status().message();
  // A refs/main that is not a commit hash never becomes a path.
  hub_write_text(repo / "refs" / "main", "../../../etc");
  auto bad = find_in_hub_cache("acme/m", hub_env_for(dir.path()));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("commit hash"), std::string::npos) << bad.status().message();
}

TEST(HubCache, EnvironmentPrecedenceFollowsHuggingfaceHub) {
  HubEnv env;
  env.home = "/h";
  EXPECT_EQ(hub_cache_dir(env)->path, "/h/.cache/huggingface/hub");
  env.xdg_cache_home = "/x";
  EXPECT_EQ(hub_cache_dir(env)->path, "/x/huggingface/hub");
  env.hf_home = "~/hf";
  EXPECT_EQ(hub_cache_dir(env)->path, "/h/hf/hub");
  env.huggingface_hub_cache = "/legacy";
  EXPECT_EQ(hub_cache_dir(env)->path, "/legacy");
  env.hf_hub_cache = "/c";
  EXPECT_EQ(hub_cache_dir(env)->path, "/c");
  EXPECT_EQ(hub_cache_dir(env)->source, "$HF_HUB_CACHE");
  EXPECT_FALSE(hub_cache_dir(HubEnv{}).ok());
  // The lookup goes to the cache the variables select, not another.
  TempDir a("hub"), b("hub");
  make_hub_repo(b.path(), "acme", "m", kHubCommit, kHubCommit);
  HubEnv both;
  both.hf_hub_cache = a.path();
  both.hf_home = (fs::path(b.path()) / "..").string();
  EXPECT_FALSE(find_in_hub_cache("acme/m", both).ok());
  both.hf_hub_cache.reset();
  both.hf_home.reset();
  both.xdg_cache_home = a.path();
  fs::create_directories(fs::path(a.path()) / "huggingface");
  fs::create_directory_symlink(b.path(), fs::path(a.path()) / "huggingface" / "hub");
  EXPECT_TRUE(find_in_hub_cache("acme/m", both).ok());
}

TEST(HubCache, AnExistingLocalDirectoryWins) {
  TempDir cache("hub"), work("hub");
  make_hub_repo(cache.path(), "acme", "m", kHubCommit, kHubCommit);
  fs::path local = fs::path(work.path()) / "acme" / "m";
  fs::create_directories(local);
  fs::path old = fs::current_path();
  fs::current_path(work.path());
  auto r = resolve_model_path("acme/m", hub_env_for(cache.path()));
  fs::current_path(old);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, "acme/m");
  // Paths that are not repo ids pass through for the loader to report.
  EXPECT_EQ(*resolve_model_path("/no/such/dir", hub_env_for(cache.path())), "/no/such/dir");
  EXPECT_EQ(*resolve_model_path("no-such-dir", hub_env_for(cache.path())), "no-such-dir");
  EXPECT_EQ(*resolve_model_path("out/model.gguf", hub_env_for(cache.path())), "out/model.gguf");
}

TEST(HubCache, HostileNamesAreRefused) {
  TempDir dir("hub");
  make_hub_repo(dir.path(), "acme", "m", kHubCommit, kHubCommit);
  for (const char* name : {"../m", "acme/..", "acme/.", "..acme/m", "/acme/m", "acme/m/x", "acme", "acme/m n",
                           "acme/m@../../x", "acme/m@", "acme\\m/x", "acme/m%2f", "/", "a/b\n"}) {
    auto r = find_in_hub_cache(name, hub_env_for(dir.path()));
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << name;
    EXPECT_FALSE(is_hub_repo_id(name)) << name;
  }
  EXPECT_TRUE(is_hub_repo_id("Dream-org/Dream-v0-Instruct-7B"));
  EXPECT_TRUE(is_hub_repo_id("apple/DiffuCoder-7B-cpGRPO@main"));
  // Through resolve_model_path: a one-slash value that is not a repo id is refused with the same error.
  auto r = resolve_model_path("acme/m n", hub_env_for(dir.path()));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dc
