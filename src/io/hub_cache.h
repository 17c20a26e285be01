// Models where users keep them: a `--model ORG/NAME[@REVISION]` / from_pretrained("ORG/NAME") that is not a
// local path is found in Hugging Face's local cache, without any network. The cache is huggingface_hub's:
// $HF_HUB_CACHE, else (legacy) $HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub,
// else ~/.cache/huggingface/hub; the repo is models--ORG--NAME/, whose refs/<REVISION> (default main) holds the
// commit whose snapshots/<commit>/ is the checkpoint directory (its files are relative symlinks into blobs/,
// which every reader follows).
#pragma once

#include <optional>
#include <string>

#include "core/status.h"

namespace dc {

// The environment the cache directory is chosen by (unset = nullopt; an empty value counts as unset).
struct HubEnv {
  std::optional<std::string> hf_hub_cache, huggingface_hub_cache, hf_home, xdg_cache_home, home;
  static HubEnv from_process();  // getenv of HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, HF_HOME, XDG_CACHE_HOME, HOME
};

// The hub cache directory `env` selects, and what selected it ("$HF_HUB_CACHE", "$HF_HOME/hub", ...).
struct HubCacheDir {
  std::string path, source;
};
Result<HubCacheDir> hub_cache_dir(const HubEnv& env);  // error only when no variable, HOME included, is set

// True when `name` is a repo id "ORG/NAME" (exactly one '/', both parts of [A-Za-z0-9._-], at most 96
// characters each, neither "." nor containing ".."), optionally followed by "@REVISION" ([A-Za-z0-9._-]).
bool is_hub_repo_id(const std::string& name);

// The snapshot directory of `repo` ("ORG/NAME" or "ORG/NAME@REVISION": a ref under refs/, else a commit under
// snapshots/) in the cache of `env`. Errors: kInvalidArgument for a name that is not a repo id; kNotFound
// naming every path looked at and the command that downloads it, or a ref naming a missing snapshot.
Result<std::string> find_in_hub_cache(const std::string& repo, const HubEnv& env);

// A model flag's value: a path that exists is returned as is (a local directory always wins); a value that
// looks like "ORG/NAME[@REVISION]" (one '/', not absolute, not ./ or ../, no .gguf / .json suffix) is
// looked up with find_in_hub_cache (its not-found error names the local path too); anything else is
// returned unchanged, for the loader to report.
Result<std::string> resolve_model_path(const std::string& value, const HubEnv& env);
inline Result<std::string> resolve_model_path(const std::string& value) {
  return resolve_model_path(value, HubEnv::from_process());
}

}  // namespace dc
