// q8 / q4 quantization of weight rows and matrices (convert.cc writes quantized checkpoints with it).
#include "model/quantize.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

namespace dc {
namespace {

// The next f16 value below / above h (finite h).
uint16_t f16_step_down(uint16_t h) {
  if (h == 0x0000) return 0x8001;
  return (h & 0x8000) ? h + 1 : h - 1;
}
uint16_t f16_step_up(uint16_t h) {
  if (h == 0x8000) return 0x0001;
  return (h & 0x8000) ? h - 1 : h + 1;
}
// The largest f16 <= v / the smallest f16 >= v.
uint16_t f16_round_down(float v) {
  const uint16_t h = f32_to_f16(v);
  return f16_to_f32(h) > v ? f16_step_down(h) : h;
}
uint16_t f16_round_up(float v) {
  const uint16_t h = f32_to_f16(v);
  return f16_to_f32(h) < v ? f16_step_up(h) : h;
}

constexpr float kMaxQ4Value = 60000.0f;  // q4 mins and scales are f16 (largest finite 65504)

// One row of q4. False when the row holds a non-finite value or one too large for f16 scales.
bool quantize_row_q4(const float* w, int64_t cols, int64_t group, Q4Variant variant, uint8_t* packed,
                     uint16_t* scales, uint16_t* mins) {
  std::vector<uint8_t> q(group);
  for (int64_t g = 0; g * group < cols; ++g) {
    const float* v = w + g * group;
    float lo = v[0], hi = v[0], big = v[0];
    for (int64_t c = 0; c < group; ++c) {
      if (!(std::abs(v[c]) <= kMaxQ4Value)) return false;  // also NaN and inf
      lo = std::min(lo, v[c]);
      hi = std::max(hi, v[c]);
      if (std::abs(v[c]) > std::abs(big)) big = v[c];
    }
    float s, mn;
    if (variant == Q4Variant::kMin) {
      const uint16_t mn16 = f16_round_down(lo);
      mn = f16_to_f32(mn16);
      const uint16_t s16 = f16_round_up((hi - mn) / 15.0f);
      s = f16_to_f32(s16);
      scales[g] = s16;
      mins[g] = mn16;
    } else {
      const uint16_t s16 = f32_to_f16(big / -8.0f);
      s = f16_to_f32(s16);
      mn = -8.0f * s;
      scales[g] = s16;
      mins[g] = f32_to_f16(mn);
    }
    for (int64_t c = 0; c < group; ++c) {
      const float r = s != 0 ? std::nearbyint((v[c] - mn) / s) : 0.0f;
      q[c] = static_cast<uint8_t>(std::clamp(r, 0.0f, 15.0f));
    }
    for (int64_t c = 0; c < group; c += 2) packed[(g * group + c) / 2] = static_cast<uint8_t>(q[c] | (q[c + 1] << 4));
  }
  return true;
}

}  // namespace

bool quantize_row_q8(const float* w, int64_t cols, int8_t* q, float* scale) {
  float amax = 0;
  bool finite = true;
  for (int64_t c = 0; c < cols; ++c) {
    const float a = std::abs(w[c]);
    finite &= a <= std::numeric_limits<float>::max();  // false for NaN and inf
    amax = std::max(amax, a);
  }
  if (!finite) return false;
  const float s = amax / 127.0f;
  *scale = s;
  for (int64_t c = 0; c < cols; ++c) {
    const float r = s > 0 ? std::nearbyint(w[c] / s) : 0.0f;
    q[c] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
  }
  return true;
}

// ---- names ---------------------------------------------------------------------------------------------

const char* quant_format_name(WeightQuant format) {
  switch (format) {
    case WeightQuant::kQ8: return "q8";
    case WeightQuant::kQ4: return "q4";
    case WeightQuant::kNone: return "none";
    case WeightQuant::kGguf: return "gguf";
  }
  return "?";
}

std::string quant_scale_name(const std::string& name) { return name + ".scale"; }
std::string quant_min_name(const std::string& name) { return name + ".min"; }

// ---- quantizing matrices ---------------------------------------------------------------------------

Status check_quantize_options(const QuantizeOptions& o) {
  if (o.format != WeightQuant::kQ8 && o.format != WeightQuant::kQ4)
    return invalid_argument("--weights must be q8 or q4");
  if (o.format == WeightQuant::kQ4 && (o.group_size <= 0 || o.group_size % 32 != 0 || o.group_size > 4096))
    return invalid_argument("--group-size " + std::to_string(o.group_size) +
                            " is not supported; use a positive multiple of 32 up to 4096 (default 128)");
  return Status();
}

Result<QuantizedMatrix> quantize_matrix(const WeightView& dense, const QuantizeOptions& o, const std::string& name,
                                        ThreadPool* pool) {
  DC_RETURN_IF_ERROR(check_quantize_options(o));
  if (dense.quantized() || !is_float_dtype(dense.dtype))
    return invalid_argument("tensor '" + name + "' is " + dtype_name(dense.dtype) + ", not a float tensor to quantize");
  const int64_t rows = dense.rows, cols = dense.cols;
  const bool q4 = o.format == WeightQuant::kQ4;
  if (q4 && cols % o.group_size != 0)
    return invalid_argument("tensor '" + name + "' has " + std::to_string(cols) +
                            " columns, not a multiple of the q4 group size " + std::to_string(o.group_size));
  QuantizedMatrix m;
  const int64_t n_groups = q4 ? cols / o.group_size : 0;
  m.codes.resize(q4 ? rows * cols / 2 : rows * cols);
  if (q4) {
    m.scales_f16.resize(rows * n_groups);
    m.mins_f16.resize(rows * n_groups);
  } else {
    m.scales_f32.resize(rows);
  }
  std::atomic<int64_t> bad_row{-1};
  parallel_for(pool, rows, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(cols);
    for (int64_t r = r0; r < r1 && bad_row.load(std::memory_order_relaxed) < 0; ++r) {
      dense.row_to_f32(r, row.data());
      const bool ok = q4 ? quantize_row_q4(row.data(), cols, o.group_size, o.q4_variant, m.codes.data() + r * cols / 2,
                                           m.scales_f16.data() + r * n_groups, m.mins_f16.data() + r * n_groups)
                         : quantize_row_q8(row.data(), cols, reinterpret_cast<int8_t*>(m.codes.data()) + r * cols,
                                           m.scales_f32.data() + r);
      if (!ok) bad_row.store(r);
    }
  }, 16);
  if (bad_row.load() >= 0)
    return invalid_argument("tensor '" + name + "' row " + std::to_string(bad_row.load()) +
                            " holds a non-finite value" + (q4 ? " or one beyond ±60000 (too large for the f16 scales of q4)" : "") +
                            "; cannot quantize it");
  m.view.rows = rows;
  m.view.cols = cols;
  m.view.data = m.codes.data();
  m.view.quant = o.format;
  if (q4) {
    m.view.dtype = DType::kU8;
    m.view.scales = m.scales_f16.data();
    m.view.mins = m.mins_f16.data();
    m.view.group_size = o.group_size;
  } else {
    m.view.dtype = DType::kI8;
    m.view.scales = m.scales_f32.data();
  }
  return m;
}

bool should_quantize(const std::string& name, int64_t cols, const QuantizeOptions& o) {
  if (name == "model.embed_tokens.weight" && !o.embeddings) return false;
  return o.format == WeightQuant::kQ8 || (o.format == WeightQuant::kQ4 && cols % o.group_size == 0);
}

Result<QuantizedWeights> quantize_weights(const ModelConfig& config, const ModelWeights& dense,
                                          const QuantizeOptions& options, ThreadPool* pool) {
  auto held = std::make_shared<std::vector<QuantizedMatrix>>();
  ModelWeights out = dense;
  Status status;
  visit_weights(config, out, [&](const WeightSlot& slot) {
    if (!status.ok() || slot.matrix == nullptr || !should_quantize(slot.name, slot.matrix->cols, options)) return;
    auto q = quantize_matrix(*slot.matrix, options, slot.name, pool);
    if (!q.ok()) {
      status = q.status();
      return;
    }
    held->push_back(std::move(q).value());
    *slot.matrix = held->back().view;  // the codes' buffers do not move when `held` grows
  });
  if (!status.ok()) return status;
  if (config.tie_word_embeddings) out.output = out.tok_embd;
  return QuantizedWeights{std::move(out), std::move(held)};
}

}  // namespace dc
