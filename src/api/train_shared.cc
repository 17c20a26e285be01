#include "api/train_shared.h"

#include <algorithm>
#include <cmath>

#include "core/number_text.h"
#include "core/peak_rss.h"

namespace dc::api {

Status check_number(bool ok, const char* field, const char* rule, double value) {
  if (ok) return Status();
  return invalid_argument(std::string(field) + ": must be " + rule + ", got " + number_text(value));
}

Status check_optimizer_fields(const OptimizerFields& f) {
  DC_RETURN_IF_ERROR(check_number(f.lr >= 0, "lr", "at least 0", f.lr));
  DC_RETURN_IF_ERROR(check_number(f.min_lr_ratio >= 0 && f.min_lr_ratio <= 1, "min_lr_ratio", "in [0, 1]", f.min_lr_ratio));
  DC_RETURN_IF_ERROR(check_number(f.weight_decay >= 0, "weight_decay", "at least 0", f.weight_decay));
  DC_RETURN_IF_ERROR(check_number(f.max_grad_norm >= 0, "max_grad_norm", "at least 0 (0: no clipping)", f.max_grad_norm));
  // A beta of 1 divides by 1 − β^t = 0 in AdamW's bias correction (NaN weights).
  DC_RETURN_IF_ERROR(check_number(f.beta1 >= 0 && f.beta1 < 1, "beta1", "in [0, 1)", f.beta1));
  DC_RETURN_IF_ERROR(check_number(f.beta2 >= 0 && f.beta2 < 1, "beta2", "in [0, 1)", f.beta2));
  return check_number(f.adam_eps > 0 && std::isfinite(f.adam_eps), "adam_eps", "above 0 and finite", f.adam_eps);
}

Result<LoraSpec> lora_spec(int64_t r, double alpha, const std::string& targets, double dropout) {
  LoraSpec spec;
  if (r == 0) return spec;
  spec.r = r, spec.alpha = alpha, spec.dropout = static_cast<float>(dropout);
  DC_ASSIGN_OR_RETURN(spec.targets, parse_lora_targets(targets));
  DC_RETURN_IF_ERROR(check_lora_spec(spec));
  return spec;
}

Result<std::vector<diffucoder::TrainRankStats>> gather_rank_stats(dist::Comm* comm, const train::TrainFootprint& held,
                                                                   int64_t steps_here) {
  diffucoder::TrainRankStats mine;
  mine.peak_rss_bytes = peak_rss_bytes();
  mine.master_weight_bytes = held.master_weight_bytes;
  mine.optimizer_state_bytes = held.optimizer_state_bytes;
  mine.gradient_bytes = held.gradient_bytes;
  if (comm == nullptr) return std::vector<diffucoder::TrainRankStats>{mine};
  mine.bytes_sent_per_step =
      static_cast<double>(comm->bytes_sent()) / static_cast<double>(std::max<int64_t>(1, steps_here));
  // As doubles, the one gather the communicator has (byte counts stay exact below 2^53).
  constexpr int kFields = 5;
  const double values[kFields] = {static_cast<double>(mine.peak_rss_bytes), static_cast<double>(mine.master_weight_bytes),
                                  static_cast<double>(mine.optimizer_state_bytes),
                                  static_cast<double>(mine.gradient_bytes), mine.bytes_sent_per_step};
  std::vector<double> all(static_cast<size_t>(kFields) * static_cast<size_t>(comm->size()));
  DC_RETURN_IF_ERROR(comm->all_gather_doubles(values, kFields, all.data()));
  std::vector<diffucoder::TrainRankStats> out;
  for (int r = 0; r < comm->size(); ++r) {
    const double* v = &all[static_cast<size_t>(kFields) * static_cast<size_t>(r)];
    out.push_back({static_cast<int64_t>(v[0]), static_cast<int64_t>(v[1]), static_cast<int64_t>(v[2]),
                   static_cast<int64_t>(v[3]), v[4]});
  }
  return out;
}

Status open_rank_device(const std::string& spec, const dist::Comm* comm, std::unique_ptr<DeviceBackend>* backend,
                        Context* ctx) {
  const int local_rank = comm != nullptr ? comm->local_rank() : 0;
  DC_ASSIGN_OR_RETURN(const DeviceSpec device, parse_rank_device(spec, local_rank));
  if (device.device == Device::kCpu) return Status();
  auto opened = open_vulkan_backend(device.index);
  if (!opened.ok()) {
    const std::string who = comm != nullptr && comm->size() > 1
                                ? "rank " + std::to_string(comm->rank()) + " (local rank " + std::to_string(local_rank) + "): "
                                : "";
    return Status(opened.status().code(), who + "--device " + spec + " is vulkan:" + std::to_string(device.index) +
                                              " here, which cannot be opened: " + opened.status().message());
  }
  *backend = std::move(*opened);
  ctx->device = device.device, ctx->backend = backend->get();
  return Status();
}

}  // namespace dc::api
