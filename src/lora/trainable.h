// LoraParams: LoRA adapters held unmerged in f32, one contiguous buffer (the A and B of every adapted
// projection back to back, layer by layer, in lora_target order), seen as the LoraWeights the forward reads
// (model/lora_weights.h) and, for a buffer of gradients, as the LoraGrads the backward writes. The trainers
// hold their adapters, gradients and Adam moments as four of these; `--lora-mode unmerged` holds a PEFT
// adapter so. Saved and loaded in PEFT's layout (adapter_config.json + adapter_model.safetensors).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "lora/adapter.h"
#include "model/lora_weights.h"
#include "types/model_config.h"

namespace dc {

// What a training run adapts (train / grpo --lora-*).
struct LoraSpec {
  int64_t r = 0;                       // 0: no adapters (a full fine-tune)
  double alpha = 0;                    // 0: = r (scale 1)
  uint32_t targets = (1u << kLoraTargets) - 1;  // bit t: lora_target t (default: all seven projections)
  float dropout = 0;                   // lora_dropout, in [0, 1)
  bool use_rslora = false;             // scale alpha / √r instead of alpha / r
  double scale() const;
};

// Parses "--lora-targets": a comma-separated list of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
// down_proj (or q, k, v, o, gate, up, down), or "all-linear" / "all". Errors name the bad entry.
Result<uint32_t> parse_lora_targets(const std::string& text);
// The names of a target mask, "q_proj,v_proj".
std::string lora_targets_text(uint32_t targets);
// The spec's numbers checked (r ≥ 1, alpha finite ≥ 0, dropout in [0, 1), targets non-empty), errors
// naming the flag.
Status check_lora_spec(const LoraSpec& spec);

class LoraParams {
 public:
  struct Tensor {
    std::string name;  // PEFT's: "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight"
    std::vector<int64_t> shape;
    int64_t offset = 0, size = 0;  // into data()
  };

  // Zero-filled adapters of `spec` for every layer of `config` (throws std::bad_alloc when memory runs out).
  static LoraParams zeros(const ModelConfig& config, const LoraSpec& spec);
  // A buffer shaped like `like` (its gradients, its moments), zero-filled.
  static LoraParams zeros_like(const LoraParams& like);
  // An opened PEFT adapter's tensors widened to f32 (per-module rank and alpha of rank_pattern /
  // alpha_pattern kept), for the unmerged forward and for a resumed run. modules_to_save (a replaced
  // embedding or lm_head) is refused: such an adapter is merged (--lora-mode merged).
  static Result<LoraParams> from_adapter(const LoraAdapter& adapter, const ModelConfig& config);

  LoraParams() = default;
  LoraParams(LoraParams&&) = default;
  LoraParams& operator=(LoraParams&&) = default;

  // PEFT's initialisation: each A Kaiming-uniform with a = √5 (U(−1/√in, 1/√in)), each B zero; the draws
  // a function of (seed, tensor, index) only.
  void init_peft(uint64_t seed);
  // Writes adapter_config.json (PEFT's LORA fields; base_model_name_or_path = base_model) and
  // adapter_model.safetensors (f32) into directory `dir`, each file atomically. Needs a uniform spec (a
  // trained adapter, not one loaded with rank_pattern).
  Status save_peft(const std::string& dir, const std::string& base_model) const;

  const LoraSpec& spec() const { return spec_; }
  const LoraWeights& weights() const { return weights_; }  // views into this buffer
  // Writable views of this buffer as gradients (for a buffer made by zeros_like).
  const LoraGrads& grads() { return grads_; }
  float* data() { return buffer_.get(); }
  const float* data() const { return buffer_.get(); }
  int64_t n_values() const { return n_values_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }
  void zero();
  // The dropout the forward applies in training mode (LoraSpec::dropout; a resumed run's from its config).
  void set_dropout(float p) { spec_.dropout = p, weights_.dropout = p; }

 private:
  struct Entry {  // one adapted projection
    int64_t layer = 0;
    int target = 0;
    int64_t r = 0, in = 0, out = 0;
    float scale = 0;
  };
  static LoraParams make(const ModelConfig& config, const LoraSpec& spec, std::vector<Entry> entries);
  struct FreeDeleter {
    void operator()(float* p) const { std::free(p); }
  };
  LoraSpec spec_;
  int64_t n_layer_ = 0;
  std::vector<Entry> entries_;
  std::unique_ptr<float[], FreeDeleter> buffer_;
  int64_t n_values_ = 0;
  std::vector<Tensor> tensors_;
  LoraWeights weights_;
  LoraGrads grads_;
};

// The input and output width of projection `t` of a layer of `config`.
int64_t lora_in_features(const ModelConfig& config, int t);
int64_t lora_out_features(const ModelConfig& config, int t);

}  // namespace dc
