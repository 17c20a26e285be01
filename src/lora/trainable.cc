// LoraParams: unmerged adapters in one f32 buffer; PEFT's initialisation and file layout (lora/trainable.h).
#include "lora/trainable.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <new>
#include <nlohmann/json.hpp>

#include "core/splitmix64.h"
#include "io/atomic_dir.h"
#include "io/safetensors.h"

namespace dc {
namespace fs = std::filesystem;

double LoraSpec::scale() const {
  const double a = alpha > 0 ? alpha : static_cast<double>(r);
  return use_rslora ? a / std::sqrt(static_cast<double>(r)) : a / static_cast<double>(r);
}

Result<uint32_t> parse_lora_targets(const std::string& text) {
  if (text == "all-linear" || text == "all") return (1u << kLoraTargets) - 1;
  uint32_t mask = 0;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    int found = -1;
    for (int t = 0; t < kLoraTargets; ++t) {
      const std::string name = lora_target_name(t);
      if (item == name || item + "_proj" == name) found = t;
    }
    if (found < 0)
      return invalid_argument("--lora-targets: '" + item + "' is not a projection of the model (q_proj, k_proj, v_proj, "
                              "o_proj, gate_proj, up_proj, down_proj, or all-linear)");
    mask |= 1u << found;
    at = comma + 1;
  }
  return mask;
}

std::string lora_targets_text(uint32_t targets) {
  std::string s;
  for (int t = 0; t < kLoraTargets; ++t)
    if (targets >> t & 1u) s.append(s.empty() ? "" : ",").append(lora_target_name(t));
  return s;
}

Status check_lora_spec(const LoraSpec& s) {
  if (s.r < 1 || s.r > 65536) return invalid_argument("--lora-r: must be in [1, 65536] (got " + std::to_string(s.r) + ")");
  if (!std::isfinite(s.alpha) || s.alpha < 0)
    return invalid_argument("--lora-alpha: must be finite and >= 0 (0: the rank); got " + std::to_string(s.alpha));
  if (!(s.dropout >= 0.0f && s.dropout < 1.0f))
    return invalid_argument("--lora-dropout: must be in [0, 1) (got " + std::to_string(s.dropout) + ")");
  if ((s.targets & ((1u << kLoraTargets) - 1)) == 0) return invalid_argument("--lora-targets: no projection selected");
  return Status();
}

int64_t lora_in_features(const ModelConfig& c, int t) {
  return t == kLoraO ? c.n_head * c.head_dim : t == kLoraDown ? c.n_ff : c.n_embd;
}

int64_t lora_out_features(const ModelConfig& c, int t) {
  switch (t) {
    case kLoraQ: return c.n_head * c.head_dim;
    case kLoraK:
    case kLoraV: return c.n_head_kv * c.head_dim;
    case kLoraGate:
    case kLoraUp: return c.n_ff;
    default: return c.n_embd;  // o_proj, down_proj
  }
}

LoraParams LoraParams::make(const ModelConfig& config, const LoraSpec& spec, std::vector<Entry> entries) {
  LoraParams p;
  p.spec_ = spec;
  p.n_layer_ = config.n_layer;
  p.entries_ = std::move(entries);
  int64_t n = 0;
  for (const Entry& e : p.entries_) {
    const std::string module = "base_model.model." + lora_module_path(e.layer, e.target);
    p.tensors_.push_back({module + ".lora_A.weight", {e.r, e.in}, n, e.r * e.in});
    n += e.r * e.in;
    p.tensors_.push_back({module + ".lora_B.weight", {e.out, e.r}, n, e.out * e.r});
    n += e.out * e.r;
  }
  p.n_values_ = n;
  const size_t bytes = (static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float) + 63) / 64 * 64;
  p.buffer_.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
  if (p.buffer_ == nullptr) throw std::bad_alloc();
  p.zero();
  p.weights_.layers.assign(static_cast<size_t>(config.n_layer), {});
  p.grads_.layers.assign(static_cast<size_t>(config.n_layer), {});
  p.weights_.dropout = spec.dropout;
  for (size_t i = 0; i < p.entries_.size(); ++i) {
    const Entry& e = p.entries_[i];
    float* a = p.buffer_.get() + p.tensors_[2 * i].offset;
    float* b = p.buffer_.get() + p.tensors_[2 * i + 1].offset;
    p.weights_.layers[e.layer][e.target] = LoraMatrix{a, b, e.r, e.scale};
    p.grads_.layers[e.layer][e.target] = LoraGradMatrix{a, b};
  }
  return p;
}

LoraParams LoraParams::zeros(const ModelConfig& config, const LoraSpec& spec) {
  std::vector<Entry> entries;
  for (int64_t il = 0; il < config.n_layer; ++il)
    for (int t = 0; t < kLoraTargets; ++t)
      if (spec.targets >> t & 1u)
        entries.push_back({il, t, spec.r, lora_in_features(config, t), lora_out_features(config, t),
                           static_cast<float>(spec.scale())});
  return make(config, spec, std::move(entries));
}

LoraParams LoraParams::zeros_like(const LoraParams& like) {
  ModelConfig shape;
  shape.n_layer = like.n_layer_;
  LoraParams p = make(shape, like.spec_, like.entries_);
  return p;
}

void LoraParams::zero() { std::fill_n(buffer_.get(), std::max<int64_t>(n_values_, 1), 0.0f); }

Result<LoraParams> LoraParams::from_adapter(const LoraAdapter& adapter, const ModelConfig& config) {
  if (!adapter.config.modules_to_save.empty())
    return invalid_argument(adapter.config_path + ": field 'modules_to_save' replaces whole tensors, which an unmerged "
                            "adapter cannot hold: load it merged (--lora-mode merged, the default)");
  DC_ASSIGN_OR_RETURN(const LoraPlan plan, plan_lora(adapter, config));
  std::vector<Entry> entries;
  for (const LoraUpdate& u : plan.updates) {
    Entry e;
    bool found = false;
    for (int64_t il = 0; il < config.n_layer && !found; ++il)
      for (int t = 0; t < kLoraTargets && !found; ++t)
        if (u.weight_name == lora_module_path(il, t) + ".weight") e.layer = il, e.target = t, found = true;
    if (!found)
      return invalid_argument(adapter.dir + ": the adapter changes " + u.weight_name +
                              ", which an unmerged adapter cannot hold: load it merged (--lora-mode merged)");
    e.r = u.rank, e.in = lora_in_features(config, e.target), e.out = lora_out_features(config, e.target), e.scale = u.scale;
    entries.push_back(e);
  }
  // Layer by layer, targets in order (the buffer's layout), whatever the file's order.
  std::vector<size_t> order(entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return std::pair(entries[x].layer, entries[x].target) < std::pair(entries[y].layer, entries[y].target);
  });
  std::vector<Entry> sorted;
  for (size_t i : order) sorted.push_back(entries[i]);
  LoraSpec spec;
  spec.r = sorted.empty() ? 0 : sorted[0].r;
  spec.alpha = adapter.config.lora_alpha;
  spec.use_rslora = adapter.config.use_rslora;
  spec.targets = 0;
  for (const Entry& e : sorted) spec.targets |= 1u << e.target;
  LoraParams p = make(config, spec, sorted);
  for (size_t k = 0; k < order.size(); ++k) {
    const LoraUpdate& u = plan.updates[order[k]];
    convert_to_f32(u.a->dtype, u.a->data, p.data() + p.tensors_[2 * k].offset, static_cast<size_t>(p.tensors_[2 * k].size));
    convert_to_f32(u.b->dtype, u.b->data, p.data() + p.tensors_[2 * k + 1].offset,
                   static_cast<size_t>(p.tensors_[2 * k + 1].size));
  }
  for (const Tensor& t : p.tensors_)
    for (int64_t i = 0; i < t.size; ++i)
      if (!std::isfinite(p.data()[t.offset + i]))
        return invalid_argument(adapter.dir + "/adapter_model.safetensors: tensor " + t.name + " holds a non-finite value");
  return p;
}

void LoraParams::init_peft(uint64_t seed) {
  for (size_t k = 0; k < tensors_.size(); ++k) {
    const Tensor& t = tensors_[k];
    float* d = buffer_.get() + t.offset;
    if (k % 2 == 1) {  // B
      std::fill_n(d, t.size, 0.0f);
      continue;
    }
    // kaiming_uniform_(a=√5): gain √(2 / (1 + a²)) = √(1/3), bound = gain·√(3 / fan_in) = 1/√fan_in.
    const double bound = 1.0 / std::sqrt(static_cast<double>(t.shape[1]));
    const uint64_t key = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(k) + 0x4c6f5241ull));
    for (int64_t i = 0; i < t.size; ++i) {
      const double u01 = static_cast<double>(splitmix64(key + static_cast<uint64_t>(i)) >> 11) * (1.0 / 9007199254740992.0);
      d[i] = static_cast<float>((2.0 * u01 - 1.0) * bound);
    }
  }
}

Status LoraParams::save_peft(const std::string& dir, const std::string& base_model) const {
  nlohmann::ordered_json targets = nlohmann::ordered_json::array();
  for (int t = 0; t < kLoraTargets; ++t)
    if (spec_.targets >> t & 1u) targets.push_back(lora_target_name(t));
  for (const Entry& e : entries_)
    if (e.r != spec_.r)
      return invalid_argument("save_peft: an adapter with per-module ranks (rank_pattern) is saved only as it was loaded");
  const nlohmann::ordered_json config = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", base_model},
      {"r", spec_.r},
      {"lora_alpha", spec_.alpha > 0 ? spec_.alpha : static_cast<double>(spec_.r)},
      {"lora_dropout", spec_.dropout},
      {"target_modules", targets},
      {"bias", "none"},
      {"use_rslora", spec_.use_rslora},
      {"fan_in_fan_out", false},
      {"use_dora", false},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
      {"init_lora_weights", true},
      {"inference_mode", true},
  };
  std::vector<TensorToWrite> out;
  for (const Tensor& t : tensors_) out.push_back({t.name, DType::kF32, t.shape, buffer_.get() + t.offset});
  DC_RETURN_IF_ERROR(write_safetensors((fs::path(dir) / "adapter_model.safetensors").string(), out, {{"format", "pt"}}));
  return write_file_atomically((fs::path(dir) / "adapter_config.json").string(), [&](const ByteSink& sink) {
    const std::string text = config.dump(2) + "\n";
    return sink(text.data(), text.size());
  });
}

}  // namespace dc
