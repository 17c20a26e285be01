// Weight quantization (q8 / q4, formats in types/quantization.h and README.md "Quantized weights") of
// rows, matrices and in-memory weights; model/convert.h writes quantized checkpoints with it. The
// config.json "quantization" block is read with the rest of config.json (io/config_json.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/weights.h"
#include "ops/weight.h"
#include "types/model_config.h"

namespace dc {

const char* quant_format_name(WeightQuant format);  // "q8", "q4", "none"

// The names of a quantized tensor's companions: "<name>.scale", "<name>.min" (q4 only).
std::string quant_scale_name(const std::string& name);
std::string quant_min_name(const std::string& name);

// How q4 places its 16 levels in a group: kMin: [min, max] of the group (scale = (max − min)/15, min
// stored); kSymmetric: codes −8..7 around zero, scale = (the value of largest magnitude)/−8, stored as
// min = −8·scale (the same format on disk). kMin is the more accurate (README.md) and the default.
enum class Q4Variant { kMin, kSymmetric };

struct QuantizeOptions {
  WeightQuant format = WeightQuant::kQ8;
  int64_t group_size = 128;           // q4: columns per scale; a positive multiple of 32
  bool embeddings = true;             // also quantize model.embed_tokens.weight
  Q4Variant q4_variant = Q4Variant::kMin;
};

// Checks format (q8 / q4) and, for q4, group_size (a positive multiple of 32, at most 4096); errors
// name the option.
Status check_quantize_options(const QuantizeOptions& options);

// A quantized matrix and the memory its view points into. Movable; the view stays valid across moves.
struct QuantizedMatrix {
  std::vector<uint8_t> codes;     // q8: int8 [rows, cols]; q4: packed [rows, cols/2]
  std::vector<float> scales_f32;  // q8: [rows]
  std::vector<uint16_t> scales_f16, mins_f16;  // q4: f16 bits [rows, cols/group_size]
  WeightView view;
};

// Rounds every row of `dense` (a float weight, F32 / F16 / BF16) as `options` says:
//   q8: s = max|w_row| / 127, q = round(w / s) in [−127, 127]; |w − s·q| ≤ s/2.
//   q4 (kMin): per group, min rounded down and scale rounded up to f16 so that every value lies in
//      [min, min + 15·scale]; q = round((w − min) / scale) in [0, 15]; |w − (scale·q + min)| ≤ scale/2.
// A row or group of zeros gets scale 0. Non-finite values, or values too large for f16 scales, give
// invalid_argument naming `name` and the row. q4 needs cols % group_size == 0. Threads over rows.
Result<QuantizedMatrix> quantize_matrix(const WeightView& dense, const QuantizeOptions& options,
                                        const std::string& name, ThreadPool* pool);

// One row of q8 (s = max|w| / 127, q = round(w / s)) into q[cols] and *scale. False when the row holds a
// non-finite value.
bool quantize_row_q8(const float* w, int64_t cols, int8_t* q, float* scale);

// Whether `convert` quantizes the matrix `name` of shape [rows, cols] (q4 needs cols % G == 0; the
// embeddings only with options.embeddings); otherwise it is kept as stored.
bool should_quantize(const std::string& name, int64_t cols, const QuantizeOptions& options);

// Quantizes the matrices of in-memory dense weights as convert would (for tests and benchmarks). The
// result's quantized matrices point into `storage`, which the caller keeps alive (e.g. Model::from_weights);
// its other views (norms, biases, matrices kept dense) are dense's, whose memory must outlive it too.
struct QuantizedWeights {
  ModelWeights weights;
  std::shared_ptr<const void> storage;
};
Result<QuantizedWeights> quantize_weights(const ModelConfig& config, const ModelWeights& dense,
                                          const QuantizeOptions& options, ThreadPool* pool);

}  // namespace dc
