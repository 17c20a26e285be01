// Hugging Face hub cache lookup (hub_cache.h). Only names validated as repo ids and refs read from the cache
// (validated as 40-hex commits) become path components, so no input reaches outside models--ORG--NAME/.
#include "io/hub_cache.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <vector>

namespace dc {
namespace fs = std::filesystem;

namespace {

std::optional<std::string> hub_getenv(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

bool hub_name_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-';
}

// One component of a repo id or a revision: 1..96 characters of [A-Za-z0-9._-], not "." and no "..".
bool hub_component(const std::string& s) {
  if (s.empty() || s.size() > 96 || s == "." || s.find("..") != std::string::npos) return false;
  for (char c : s)
    if (!hub_name_char(c)) return false;
  return true;
}

bool hub_is_commit(const std::string& s) {
  if (s.size() != 40) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// "~/x" with $HOME (huggingface_hub expands the variables' ~ too).
std::string hub_expand_home(const std::string& p, const HubEnv& env) {
  if (env.home && (p == "~" || p.rfind("~/", 0) == 0)) return *env.home + p.substr(1);
  return p;
}

bool hub_is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);  // follows symlinks
}

// The trimmed content of a refs/ file (a commit hash: 40 characters; read at most 256 bytes).
std::optional<std::string> hub_read_ref(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return std::nullopt;
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  std::string s(256, '\0');
  in.read(s.data(), static_cast<std::streamsize>(s.size()));
  s.resize(static_cast<size_t>(in.gcount()));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t')) s.pop_back();
  return s;
}

std::string hub_download_hint(const std::string& repo_id) {
  return "download it with `huggingface-cli download " + repo_id + "` (or `hf download " + repo_id +
         "`), or point HF_HUB_CACHE / HF_HOME at the cache that holds it";
}

}  // namespace

HubEnv HubEnv::from_process() {
  return {hub_getenv("HF_HUB_CACHE"), hub_getenv("HUGGINGFACE_HUB_CACHE"), hub_getenv("HF_HOME"),
          hub_getenv("XDG_CACHE_HOME"), hub_getenv("HOME")};
}

Result<HubCacheDir> hub_cache_dir(const HubEnv& env) {
  if (env.hf_hub_cache) return HubCacheDir{hub_expand_home(*env.hf_hub_cache, env), "$HF_HUB_CACHE"};
  if (env.huggingface_hub_cache)
    return HubCacheDir{hub_expand_home(*env.huggingface_hub_cache, env), "$HUGGINGFACE_HUB_CACHE"};
  if (env.hf_home) return HubCacheDir{(fs::path(hub_expand_home(*env.hf_home, env)) / "hub").string(), "$HF_HOME/hub"};
  if (env.xdg_cache_home)
    return HubCacheDir{(fs::path(hub_expand_home(*env.xdg_cache_home, env)) / "huggingface" / "hub").string(),
                       "$XDG_CACHE_HOME/huggingface/hub"};
  if (env.home)
    return HubCacheDir{(fs::path(*env.home) / ".cache" / "huggingface" / "hub").string(), "~/.cache/huggingface/hub"};
  return not_found("no Hugging Face cache: none of HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME, HOME is set");
}

bool is_hub_repo_id(const std::string& name) {
  std::string id = name, rev;
  if (size_t at = name.find('@'); at != std::string::npos) {
    id = name.substr(0, at), rev = name.substr(at + 1);
    if (!hub_component(rev)) return false;
  }
  size_t slash = id.find('/');
  if (slash == std::string::npos || id.find('/', slash + 1) != std::string::npos) return false;
  return hub_component(id.substr(0, slash)) && hub_component(id.substr(slash + 1));
}

Result<std::string> find_in_hub_cache(const std::string& repo, const HubEnv& env) {
  if (!is_hub_repo_id(repo))
    return invalid_argument(repo +
                            ": not a Hugging Face repo id (ORG/NAME or ORG/NAME@REVISION, of [A-Za-z0-9._-], no '..')");
  size_t at = repo.find('@');
  std::string id = repo.substr(0, at), rev = at == std::string::npos ? "main" : repo.substr(at + 1);
  auto cache = hub_cache_dir(env);
  if (!cache.ok())
    return Status(cache.status().code(), repo + ": " + cache.status().message() + "; " + hub_download_hint(id));
  size_t slash = id.find('/');
  fs::path repo_dir = fs::path(cache->path) / ("models--" + id.substr(0, slash) + "--" + id.substr(slash + 1));
  fs::path ref = repo_dir / "refs" / rev, snapshots = repo_dir / "snapshots";
  std::string where = " " + cache->path + " (from " + cache->source + ")";
  if (auto commit = hub_read_ref(ref)) {
    if (!hub_is_commit(*commit))
      return not_found(repo + ": " + ref.string() + " does not hold a commit hash (40 hex digits), in the Hugging Face cache" +
                       where);
    fs::path snap = snapshots / *commit;
    if (!hub_is_dir(snap))
      return not_found(repo + ": " + ref.string() + " names commit " + *commit + ", but its snapshot " + snap.string() +
                       " does not exist (an interrupted download?); " + hub_download_hint(id));
    return snap.string();
  }
  if (hub_is_commit(rev) && hub_is_dir(snapshots / rev)) return (snapshots / rev).string();
  std::string looked = ref.string() + " (no such file)";
  if (hub_is_commit(rev)) looked += ", " + (snapshots / rev).string() + " (no such directory)";
  return not_found(repo + ": not in the Hugging Face cache" + where + ": looked at " + looked + "; " +
                   hub_download_hint(id));
}

Result<std::string> resolve_model_path(const std::string& value, const HubEnv& env) {
  std::error_code ec;
  if (value.empty() || fs::exists(value, ec)) return value;  // a local path always wins
  auto ends_with = [&](const char* s) {
    std::string t(s);
    return value.size() >= t.size() && value.compare(value.size() - t.size(), t.size(), t) == 0;
  };
  size_t slashes = 0;
  for (char c : value) slashes += c == '/';
  if (slashes != 1 || value[0] == '/' || value.rfind("./", 0) == 0 || value.rfind("../", 0) == 0 ||
      ends_with(".gguf") || ends_with(".json"))
    return value;  // a path: the loader reports it missing
  auto found = find_in_hub_cache(value, env);
  if (found.ok()) return found;
  fs::path local = fs::absolute(value, ec);
  return Status(found.status().code(), "no such directory " + (ec ? value : local.string()) + ", and " +
                                           found.status().message());
}

}  // namespace dc
