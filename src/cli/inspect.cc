// `diffucoder inspect --model DIR|FILE.gguf [--json]`: the config, the parameter count and a per-group
// breakdown.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "gguf/dream.h"
#include "model/transformer.h"

namespace dc::cli {
namespace {

struct InspectArgs {
  std::string model_dir;
  bool json = false;
};

// "model.layers.3.mlp.up_proj.weight" → "mlp"; groups: embeddings, attention, mlp, norms, lm_head.
std::string group_of(const std::string& name) {
  if (name.find("embed_tokens") != std::string::npos) return "embeddings";
  if (name.find("self_attn") != std::string::npos) return "attention";
  if (name.find("mlp") != std::string::npos) return "mlp";
  if (name.find("norm") != std::string::npos) return "norms";
  return "lm_head";
}

// What is stored: the config, the tensors' count per dtype (GGUF: per ggml type), their bytes, the files.
struct Stored {
  ModelConfig config;
  std::map<std::string, int64_t> dtypes;
  size_t bytes = 0, files = 0;
};

Result<Stored> read_stored(const std::string& path) {
  Stored s;
  if (is_gguf_path(path)) {
    DC_ASSIGN_OR_RETURN(const GgufFile file, GgufFile::open(path));
    DC_ASSIGN_OR_RETURN(s.config, dream_config(file));
    for (const GgufTensor& t : file.tensors()) {
      s.dtypes[gguf_type_info(static_cast<uint32_t>(t.type))->name] += 1;
      s.bytes += t.n_bytes;
    }
    s.files = 1;
    return s;
  }
  DC_ASSIGN_OR_RETURN(const std::unique_ptr<Model> model, Model::load(path));  // binds and checks every weight
  s.config = model->config();
  for (const auto& [name, t] : model->checkpoint()->tensors()) s.dtypes[dtype_name(t.dtype)] += 1;
  s.bytes = model->checkpoint()->total_bytes();
  s.files = model->checkpoint()->files().size();
  return s;
}

int run_inspect(const InspectArgs& args) {
  auto stored = read_stored(args.model_dir);
  if (!stored.ok()) return report(stored.status());
  const ModelConfig& c = stored->config;
  std::map<std::string, int64_t> groups;
  int64_t total = 0;
  ModelWeights scratch;
  visit_weights(c, scratch, [&](const WeightSlot& slot) {
    int64_t n = 1;
    for (int64_t d : slot.shape) n *= d;
    groups[group_of(slot.name)] += n;
    total += n;
  });
  const std::map<std::string, int64_t>& dtypes = stored->dtypes;

  nlohmann::json j;
  j["model_dir"] = args.model_dir;
  j["config"] = {{"model_type", c.model_type}, {"vocab_size", c.n_vocab}, {"hidden_size", c.n_embd},
                 {"intermediate_size", c.n_ff}, {"num_hidden_layers", c.n_layer},
                 {"num_attention_heads", c.n_head}, {"num_key_value_heads", c.n_head_kv}, {"head_dim", c.head_dim},
                 {"rope_theta", c.rope_theta}, {"rms_norm_eps", c.rms_norm_eps},
                 {"max_position_embeddings", c.max_position_embeddings},
                 {"tie_word_embeddings", c.tie_word_embeddings}, {"mask_token_id", c.mask_token_id},
                 {"pad_token_id", c.pad_token_id}, {"bos_token_id", c.bos_token_id}, {"eos_token_id", c.eos_token_id},
                 {"torch_dtype", c.torch_dtype}};
  j["parameters"] = total;
  j["parameter_groups"] = groups;
  j["tensor_dtypes"] = dtypes;
  j["weight_bytes"] = stored->bytes;
  j["files"] = stored->files;
  if (args.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("model        %s\n", args.model_dir.c_str());
  std::printf("architecture %s: %lld layers, hidden %lld, ffn %lld, heads %lld (kv %lld, head_dim %lld), vocab %lld\n",
              c.model_type.c_str(), (long long)c.n_layer, (long long)c.n_embd, (long long)c.n_ff, (long long)c.n_head,
              (long long)c.n_head_kv, (long long)c.head_dim, (long long)c.n_vocab);
  std::printf("rope_theta   %g, rms_norm_eps %g, tied lm_head: %s\n", c.rope_theta, c.rms_norm_eps,
              c.tie_word_embeddings ? "yes" : "no");
  std::printf("tokens       mask %lld, pad %lld, bos %lld, eos %lld\n", (long long)c.mask_token_id,
              (long long)c.pad_token_id, (long long)c.bos_token_id, (long long)c.eos_token_id);
  std::printf("parameters   %lld (%.3f B)\n", (long long)total, total / 1e9);
  for (const auto& [g, n] : groups)
    std::printf("  %-11s %14lld  %5.1f%%\n", g.c_str(), (long long)n, 100.0 * n / total);
  std::printf("weights      %.3f GB in %zu file(s);", stored->bytes / 1e9, stored->files);
  for (const auto& [d, n] : dtypes) std::printf(" %s x%lld", d.c_str(), (long long)n);
  std::printf("\n");
  return 0;
}

}  // namespace

RunFn add_inspect_command(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand("inspect", "Print a checkpoint's config, parameter count and breakdown");
  cmd->add_option("--model", args->model_dir, "Hugging Face checkpoint directory, or a dream FILE.gguf")->required();
  cmd->add_flag("--json", args->json, "Print JSON instead of text");
  return [args] { return run_inspect(*args); };
}

}  // namespace dc::cli
