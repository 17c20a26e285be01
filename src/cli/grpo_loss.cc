// `diffucoder grpo-loss --model DIR [--ref-model DIR] --batch FILE.json [--json]`: the Coupled-GRPO loss
// of one given batch and its parts (src/train/grpo_loss.h), in f32, drawing nothing at random: the
// exactness interface the PyTorch reference (tests/reference/grpo_ref.py) is compared through. With
// --device vulkan[:N] the forward, the scored rows' lm_head and cross-entropy and the backward run on the
// device (train/device_training.h); the per-tensor gradient norms are taken from the downloaded gradients.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <span>

#include "cli/commands.h"
#include "cli/common.h"
#include "io/mapped_file.h"
#include "lora/adapter.h"
#include "lora/trainable.h"
#include "model/params.h"
#include "model/transformer.h"
#include "ops/device.h"
#include "gguf/model_source.h"
#include "tokenizer/tokenizer.h"
#include "train/grpo_loss.h"
#include "train/rollout.h"

namespace dc::cli {
namespace {

using Json = nlohmann::json;
constexpr int64_t kMaxTokens = int64_t{1} << 22;  // 3 versions × B × (P + C) positions of one forward

struct GrpoLossArgs {
  std::string model_dir, ref_dir, batch_path, lora_dir, device = "cpu";
  int threads = 0;
  bool json = false;
};

struct ParsedBatch {
  train::GrpoBatch batch;
  train::CoupledMask mask;
  std::vector<double> rewards;
  int64_t group_size = 0;
  std::vector<float> old_logps;
  train::GrpoLossOptions options;
  bool scale_rewards = false;
  std::optional<int32_t> im_end_id;
};

// A [rows][width] array of numbers from field `key` (width fixed by the first row unless given).
template <typename T>
Result<std::vector<T>> matrix(const Json& j, const std::string& key, int64_t rows, int64_t* width) {
  const Json& m = j.at(key);
  if (!m.is_array() || static_cast<int64_t>(m.size()) != rows)
    return invalid_argument("batch: '" + key + "' must be a list of " + std::to_string(rows) + " lists");
  std::vector<T> out;
  for (int64_t r = 0; r < rows; ++r) {
    const Json& row = m[r];
    if (*width < 0 && row.is_array()) *width = static_cast<int64_t>(row.size());
    if (!row.is_array() || static_cast<int64_t>(row.size()) != *width)
      return invalid_argument("batch: " + key + "[" + std::to_string(r) + "] must be a list of " +
                              std::to_string(*width) + " numbers (every row of '" + key + "' has one length)");
    for (const Json& v : row) {
      if (!v.is_number()) return invalid_argument("batch: " + key + "[" + std::to_string(r) + "] holds a non-number");
      if constexpr (std::is_integral_v<T>) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > std::numeric_limits<int32_t>::max())
          return invalid_argument("batch: " + key + "[" + std::to_string(r) + "] holds " + v.dump() +
                                  ", not a non-negative integer");
      }
      out.push_back(v.get<T>());
    }
  }
  return out;
}

Result<ParsedBatch> parse_batch(const std::string& text) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::parse_error& e) {
    return invalid_argument(std::string("batch: not JSON: ") + e.what());
  }
  if (!j.is_object()) return invalid_argument("batch: the file must hold one JSON object");
  for (const char* key : {"prompt_ids", "completion_ids", "rewards", "group_size", "t", "mask"})
    if (!j.contains(key)) return invalid_argument(std::string("batch: missing key '") + key + "'");
  const std::set<std::string> known = {"prompt_ids", "completion_ids", "rewards",       "group_size",
                                       "t",          "mask",           "old_logps",     "beta",
                                       "epsilon",    "scale_rewards",  "im_end_id",     "prompt_mask"};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (known.count(it.key()) == 0)
      return invalid_argument("batch: unknown key '" + it.key() + "'");
  ParsedBatch p;
  train::GrpoBatch& b = p.batch;
  const Json& completions = j["completion_ids"];
  if (!completions.is_array() || completions.empty())
    return invalid_argument("batch: 'completion_ids' must be a non-empty list of id lists");
  b.n_batch = static_cast<int64_t>(completions.size());
  if (!j["group_size"].is_number_integer()) return invalid_argument("batch: 'group_size' must be an integer");
  p.group_size = j["group_size"].get<int64_t>();
  if (p.group_size < 2 || b.n_batch % p.group_size != 0)
    return invalid_argument("batch: group_size " + std::to_string(p.group_size) + " must be at least 2 and divide the " +
                            std::to_string(b.n_batch) + " completions");
  try {
    int64_t width = -1;
    DC_ASSIGN_OR_RETURN(b.completion_ids, matrix<int32_t>(j, "completion_ids", b.n_batch, &width));
    b.n_completion = width;
    // One prompt per completion, or one per group (repeated over its completions).
    const int64_t n_prompts = j["prompt_ids"].is_array() ? static_cast<int64_t>(j["prompt_ids"].size()) : -1;
    const int64_t per_group = n_prompts == b.n_batch / p.group_size && n_prompts != b.n_batch ? p.group_size : 1;
    width = -1;
    DC_ASSIGN_OR_RETURN(std::vector<int32_t> prompts,
                        matrix<int32_t>(j, "prompt_ids", b.n_batch / per_group, &width));
    b.n_prompt = width;
    for (int64_t i = 0; i < b.n_batch; ++i)
      b.prompt_ids.insert(b.prompt_ids.end(), prompts.begin() + i / per_group * width,
                          prompts.begin() + (i / per_group + 1) * width);
    if (j.contains("prompt_mask")) {  // the left pads of prompts of several lengths, shaped as prompt_ids
      DC_ASSIGN_OR_RETURN(std::vector<int32_t> pm, matrix<int32_t>(j, "prompt_mask", b.n_batch / per_group, &width));
      for (int32_t m : pm)
        if (m > 1) return invalid_argument("batch: 'prompt_mask' entries must be 0 (a left pad) or 1 (a prompt token)");
      for (int64_t i = 0; i < b.n_batch; ++i)
        b.prompt_mask.insert(b.prompt_mask.end(), pm.begin() + i / per_group * width, pm.begin() + (i / per_group + 1) * width);
    }
    if (3 * b.n_batch * (b.n_prompt + b.n_completion) > kMaxTokens)
      return invalid_argument("batch: 3 × completions × (prompt + completion length) must be at most " +
                              std::to_string(kMaxTokens) + " tokens");
    width = b.n_completion;
    DC_ASSIGN_OR_RETURN(std::vector<int32_t> mask, matrix<int32_t>(j, "mask", b.n_batch, &width));
    for (int32_t m : mask) {
      if (m > 1) return invalid_argument("batch: 'mask' entries must be 0 or 1");
      p.mask.partial.push_back(static_cast<uint8_t>(m));
    }
    if (!j["t"].is_number()) return invalid_argument("batch: 't' must be a number in (0, 1)");
    p.mask.t = j["t"].get<double>();
    const Json& rewards = j["rewards"];
    if (!rewards.is_array() || static_cast<int64_t>(rewards.size()) != b.n_batch)
      return invalid_argument("batch: 'rewards' must be a list of " + std::to_string(b.n_batch) + " numbers");
    for (const Json& r : rewards) {
      if (!r.is_number() && !r.is_null()) return invalid_argument("batch: 'rewards' holds " + r.dump() + ", not a number");
      p.rewards.push_back(r.is_null() ? std::nan("") : r.get<double>());  // null: NaN, counted as 0
    }
    if (j.contains("old_logps")) {
      width = b.n_completion;
      DC_ASSIGN_OR_RETURN(p.old_logps, matrix<float>(j, "old_logps", b.n_batch, &width));
    }
    auto number = [&](const char* key, double* out, double lo, double hi) -> Status {
      if (!j.contains(key)) return Status();
      if (!j[key].is_number() || !(j[key].get<double>() >= lo && j[key].get<double>() <= hi))
        return invalid_argument(std::string("batch: '") + key + "' must be a number in [" + std::to_string(lo) +
                                ", " + std::to_string(hi) + "]");
      *out = j[key].get<double>();
      return Status();
    };
    DC_RETURN_IF_ERROR(number("beta", &p.options.beta, 0.0, 1e6));
    DC_RETURN_IF_ERROR(number("epsilon", &p.options.epsilon, 0.0, 1.0));
    if (j.contains("scale_rewards")) {
      if (!j["scale_rewards"].is_boolean()) return invalid_argument("batch: 'scale_rewards' must be true or false");
      p.scale_rewards = j["scale_rewards"].get<bool>();
    }
    if (j.contains("im_end_id")) {
      if (!j["im_end_id"].is_number_integer()) return invalid_argument("batch: 'im_end_id' must be a token id");
      p.im_end_id = j["im_end_id"].get<int32_t>();
    }
  } catch (const Json::exception& e) {
    return invalid_argument(std::string("batch: ") + e.what());
  }
  return p;
}

// A checkpoint widened to f32 (the exact path) and a model over it.
struct F32Model {
  ModelParams params;
  std::unique_ptr<Model> model;
};
Result<F32Model> load_f32(const std::string& dir) {
  ModelConfig config;
  F32Model m;
  DC_ASSIGN_OR_RETURN(m.params, load_trainable_params(dir, &config));
  m.model = Model::from_weights(config, m.params.weights(), nullptr);
  return m;
}

// --device's backend and the policy's gradients there (both null on the CPU), ctx pointed at the device.
struct OnDevice {
  std::unique_ptr<DeviceBackend> backend;  // before the state, whose device memory goes first
  std::unique_ptr<train::DeviceTraining> state;
};
// The batch's forward: `rows` (its positions and scored rows), with a reference model's log-probs when `reference`.
Result<OnDevice> open_on_device(const DeviceSpec& device, const Model& policy, const train::CoupledRows& rows, bool reference,
                                Context& ctx) {
  OnDevice d;
  if (device.device == Device::kCpu) return d;
  DC_ASSIGN_OR_RETURN(d.backend, open_vulkan_backend(device.index));
  ctx.device = device.device, ctx.backend = d.backend.get();
  train::DeviceBatchShape batch;
  batch.positions = rows.n_batch * rows.n_seq, batch.loss_rows = static_cast<int64_t>(rows.out_rows.size());
  batch.smaller_batch = "fewer rows in the batch file";
  DC_ASSIGN_OR_RETURN(d.state, train::DeviceTraining::start(ctx, policy, nullptr, batch, reference));
  return d;
}

Json rows_json(const std::vector<float>& v, int64_t width) {
  Json out = Json::array();
  for (size_t i = 0; i < v.size(); i += width) out.push_back(std::vector<double>(v.begin() + i, v.begin() + i + width));
  return out;
}

// The completion mask of every row, up to its first <|im_end|> (the id from the batch, else the model's
// tokenizer).
Status add_completion_mask(ParsedBatch& p, const std::string& model_dir) {
  if (!p.im_end_id) {
    auto tokenizer = model_source_tokenizer(model_dir);
    if (!tokenizer.ok())
      return invalid_argument("the completion mask needs the <|im_end|> id: give 'im_end_id' in the batch or "
                              "a model with a tokenizer (" + tokenizer.status().message() + ")");
    p.im_end_id = tokenizer->token_to_id("<|im_end|>");
    if (!p.im_end_id)
      return invalid_argument("the tokenizer of " + model_dir + " has no <|im_end|> token; give 'im_end_id' in the batch");
  }
  for (int64_t b = 0; b < p.batch.n_batch; ++b) {
    const auto row = std::span(p.batch.completion_ids).subspan(b * p.batch.n_completion, p.batch.n_completion);
    const std::vector<uint8_t> mask = train::completion_mask(row, *p.im_end_id);
    p.batch.completion_mask.insert(p.batch.completion_mask.end(), mask.begin(), mask.end());
  }
  return Status();
}

// The --json result: the loss, the advantages, the log-probs (policy, reference), the completion mask, the
// KL, the clip fraction and the gradients' norms.
void print_json(const ParsedBatch& p, const std::vector<double>& advantages, const train::GrpoLossResult& res,
                const std::vector<float>& ref_logps, double grad_norm, const Json& norms) {
  Json mask = Json::array();
  for (int64_t b = 0; b < p.batch.n_batch; ++b)
    mask.push_back(std::vector<int>(p.batch.completion_mask.begin() + b * p.batch.n_completion,
                                    p.batch.completion_mask.begin() + (b + 1) * p.batch.n_completion));
  const Json out = {{"loss", res.loss},
                    {"advantages", advantages},
                    {"logps", rows_json(res.logps, p.batch.n_completion)},
                    {"ref_logps", rows_json(ref_logps, p.batch.n_completion)},
                    {"completion_mask", mask},
                    {"kl", res.kl},
                    {"clip_fraction", res.clip_fraction},
                    {"grad_norm", grad_norm},
                    {"grad_norms", norms}};
  std::printf("%s\n", out.dump().c_str());
}

int run_grpo_loss(const GrpoLossArgs& a) {
  auto text = read_text_file(a.batch_path);
  if (!text.ok()) return report(text.status());
  auto parsed = parse_batch(*text);
  if (!parsed.ok()) return report(invalid_argument(a.batch_path + ": " + parsed.status().message()));
  ParsedBatch& p = *parsed;
  auto policy = load_f32(a.model_dir);
  if (!policy.ok()) return report(policy.status());
  const ModelConfig& cfg = policy->model->config();
  if (const Status st = add_completion_mask(p, a.model_dir); !st.ok()) return report(st);
  auto advantages = train::leave_one_out_advantages(p.rewards, p.group_size, p.scale_rewards);
  if (!advantages.ok()) return report(invalid_argument(a.batch_path + ": batch: " + advantages.status().message()));
  auto rows = train::coupled_rows(p.batch, p.mask, static_cast<int32_t>(cfg.mask_token_id), cfg.n_vocab, true);
  if (!rows.ok()) return report(invalid_argument(a.batch_path + ": " + rows.status().message()));

  ThreadPool pool(a.threads);
  Context ctx;
  ctx.pool = &pool;
  ctx.matmul_precision = MatmulPrecision::kF32;
  auto device = parse_device(a.device);
  if (!device.ok()) return usage_error(device.status());
  if (device->device != Device::kCpu && !a.lora_dir.empty())
    return usage_error(invalid_argument("--device " + a.device + ": --lora (LoRA gradients) runs on the CPU only for "
                                        "now; use --device cpu"));
  auto opened = open_on_device(*device, *policy->model, *rows, !a.ref_dir.empty(), ctx);
  if (!opened.ok()) return report(opened.status());
  train::DeviceTraining* on_device = opened->state.get();
  train::GrpoLossInputs in;
  in.batch = &p.batch;
  in.rows = &*rows;
  in.advantages = *advantages;
  in.old_logps = p.old_logps;
  if (!a.ref_dir.empty()) {
    auto ref = load_f32(a.ref_dir);
    if (!ref.ok()) return report(ref.status());
    const ModelConfig& rc = ref->model->config();
    if (rc.n_vocab != cfg.n_vocab || rc.mask_token_id != cfg.mask_token_id)
      return report(invalid_argument("--ref-model " + a.ref_dir + " has another vocabulary or mask id than --model"));
    if (on_device != nullptr)
      if (const Status up = on_device->upload_reference(ctx, *ref->model); !up.ok()) return report(up);
    auto ref_logps = train::coupled_logps(ctx, *ref->model, *rows, p.batch.n_completion,
                                          on_device != nullptr ? &on_device->rows() : nullptr);
    if (!ref_logps.ok()) return report(ref_logps.status());
    in.ref_logps = std::move(*ref_logps);
  }
  // The gradients: of every weight, or with --lora of the adapter's A and B only (the base frozen).
  Json norms = Json::object();
  double sum_of_squares = 0;
  auto add_norm = [&](const std::string& name, const float* g, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(g[i]) * g[i];
    norms[name] = std::sqrt(s), sum_of_squares += s;
  };
  Activations acts;
  Result<train::GrpoLossResult> res = invalid_argument("not run");
  if (!a.lora_dir.empty()) {
    auto adapter = open_lora_adapter(a.lora_dir);
    if (!adapter.ok()) return report(adapter.status());
    auto lora = LoraParams::from_adapter(*adapter, cfg);
    if (!lora.ok()) return report(lora.status());
    LoraParams grads = LoraParams::zeros_like(*lora);
    res = train::grpo_loss_and_lora_grads(ctx, *policy->model, in, p.options, 1.0f, lora->weights(), grads, acts);
    if (res.ok())
      for (const LoraParams::Tensor& t : grads.tensors()) add_norm(t.name, grads.data() + t.offset, t.size);
  } else {
    ModelParams grads = ModelParams::zeros(cfg);
    if (on_device != nullptr) {
      res = train::grpo_loss_and_device_grads(ctx, *policy->model, in, p.options, 1.0f, *on_device, acts,
                                              GradWrite::kOverwrite);
      if (res.ok())
        if (const Status down = on_device->grads().download(ctx, grads); !down.ok()) return report(down);
    } else {
      res = train::grpo_loss_and_grads(ctx, *policy->model, in, p.options, 1.0f, grads, acts);
    }
    if (res.ok())
      for (const auto& t : grads.tensors()) add_norm(t.name, t.data, t.size);
  }
  if (!res.ok()) return report(invalid_argument(a.batch_path + ": " + res.status().message()));
  const std::vector<float>& ref_logps = in.ref_logps.empty() ? res->logps : in.ref_logps;
  const double grad_norm = std::sqrt(sum_of_squares);
  // Never a NaN printed as a result: a non-finite part is an error naming it (a model holding non-finite
  // weights, or an overflow).
  for (const auto& [name, value] : {std::pair<const char*, double>{"loss", res->loss}, {"kl", res->kl},
                                    {"grad norm", grad_norm}})
    if (!std::isfinite(value))
      return report(internal_error(std::string("grpo-loss: the ") + name + " of " + a.batch_path +
                                   " is not finite (" + std::to_string(value) + "): check the weights of " +
                                   a.model_dir + (a.ref_dir.empty() ? "" : " and " + a.ref_dir)));
  if (!a.json) {
    std::printf("loss %.6g  kl %.6g  clip fraction %.4g  grad norm %.6g  (%lld completions, %lld scored tokens)\n",
                res->loss, res->kl, res->clip_fraction, grad_norm, (long long)p.batch.n_batch,
                (long long)res->n_tokens);
    return 0;
  }
  print_json(p, in.advantages, *res, ref_logps, grad_norm, norms);
  return 0;
}

}  // namespace

RunFn add_grpo_loss_command(CLI::App& app) {
  auto a = std::make_shared<GrpoLossArgs>();
  CLI::App* cmd = app.add_subcommand("grpo-loss", "The Coupled-GRPO loss, its parts and gradient norms of one given "
                                                  "batch (f32, nothing drawn at random)");
  cmd->add_option("--model", a->model_dir, "Policy checkpoint directory, or a dream F32 / F16 / BF16 FILE.gguf")->required();
  cmd->add_option("--ref-model", a->ref_dir, "Reference model for the KL term (default: the policy itself, KL 0)");
  cmd->add_option("--batch", a->batch_path,
                  "JSON: prompt_ids, completion_ids, rewards, group_size, t, mask [, prompt_mask, old_logps, beta, "
                  "epsilon, scale_rewards, im_end_id]")->required();
  cmd->add_option("--lora", a->lora_dir, "A PEFT LoRA adapter held unmerged over the frozen --model: the gradients of "
                  "its A and B only (docs/lora.md)");
  cmd->add_option("--device", a->device, "Where the forward and backward run: cpu | vulkan | vulkan:N (`diffucoder "
                  "devices`; f32, no --lora)")->capture_default_str();
  cmd->add_flag("--json", a->json, "Print every part as one JSON object (else a one-line summary)");
  cmd->add_option("--threads", a->threads, "Threads (0: all hardware threads)")->capture_default_str()
      ->check(CLI::Range(0, kMaxThreads));
  require_finite_floats(cmd);
  return [a] { return run_grpo_loss(*a); };
}

}  // namespace dc::cli
