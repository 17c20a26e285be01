// visit_weights, VectorStore, and bind_weights: the load-time checks of a checkpoint against config.json.
#include "model/weights.h"

#include <sstream>

#include "model/quantize.h"

namespace dc {
namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

}  // namespace

void visit_weights(const ModelConfig& c, ModelWeights& w, const std::function<void(const WeightSlot&)>& fn) {
  visit_tensors(c, w, [&](std::string name, std::vector<int64_t> shape, WeightView* m, VectorView* v) {
    fn({std::move(name), std::move(shape), m, v});
  });
}

VectorStore::VectorStore(const ModelConfig& config) {
  ModelWeights scratch;
  size_t n = 0;
  visit_weights(config, scratch, [&](const WeightSlot& slot) {
    if (slot.vector != nullptr) n += static_cast<size_t>(slot.shape[0]);
  });
  values_.assign(n, 0.0f);
}

std::span<float> VectorStore::take(int64_t n) {
  DC_CHECK(n >= 0 && used_ + static_cast<size_t>(n) <= values_.size(), "VectorStore: more values than the config has");
  const std::span<float> s(values_.data() + used_, static_cast<size_t>(n));
  used_ += static_cast<size_t>(n);
  return s;
}

namespace {

// Binds the quantized matrix `slot` (codes `t` plus its scale / min tensors) after checking their
// dtypes and shapes against config.json and its "quantization" block.
Status bind_quantized(const Checkpoint& checkpoint, const QuantizationConfig& q, const WeightSlot& slot,
                      const TensorInfo& t, const TensorInfo& scale) {
  const int64_t rows = slot.shape[0], cols = slot.shape[1];
  const bool q4 = q.format == WeightQuant::kQ4;
  const std::string format = std::string(quant_format_name(q.format)) +
                             (q4 ? ", group_size " + std::to_string(q.group_size) : std::string());
  auto expect = [&](const TensorInfo& x, DType dtype, const std::vector<int64_t>& shape) -> Status {
    if (x.dtype != dtype || x.shape != shape)
      return invalid_argument("tensor '" + x.name + "' in " + x.file + " is " + dtype_name(x.dtype) + " " +
                              shape_str(x.shape) + " but config.json (" + slot.name + " " + shape_str(slot.shape) +
                              ", quantization " + format + ") implies " + dtype_name(dtype) + " " + shape_str(shape));
    return Status();
  };
  WeightView v;
  v.rows = rows;
  v.cols = cols;
  v.data = t.data;
  v.quant = q.format;
  v.scales = scale.data;
  if (q4) {
    if (cols % q.group_size != 0)
      return invalid_argument("tensor '" + slot.name + "' has " + std::to_string(cols) +
                              " columns, not a multiple of the q4 group_size " + std::to_string(q.group_size) +
                              " in config.json");
    const TensorInfo* mins = checkpoint.find(quant_min_name(slot.name));
    if (mins == nullptr)
      return not_found("tensor '" + quant_min_name(slot.name) + "' (the q4 mins of " + slot.name +
                       ") is missing from the checkpoint in " + checkpoint.dir());
    const std::vector<int64_t> groups = {rows, cols / q.group_size};
    DC_RETURN_IF_ERROR(expect(t, DType::kU8, {rows, cols / 2}));
    DC_RETURN_IF_ERROR(expect(scale, DType::kF16, groups));
    DC_RETURN_IF_ERROR(expect(*mins, DType::kF16, groups));
    v.dtype = DType::kU8;
    v.mins = mins->data;
    v.group_size = q.group_size;
  } else {
    DC_RETURN_IF_ERROR(expect(t, DType::kI8, {rows, cols}));
    DC_RETURN_IF_ERROR(expect(scale, DType::kF32, {rows}));
    v.dtype = DType::kI8;
  }
  *slot.matrix = v;
  return Status();
}

}  // namespace

Result<ModelWeights> bind_weights(const Checkpoint& checkpoint, const ModelConfig& c, VectorStore& vectors) {
  const QuantizationConfig& quant = c.quantization;  // parsed with config.json when the checkpoint opened
  ModelWeights w;
  Status status;
  int64_t n_quantized = 0;
  visit_weights(c, w, [&](const WeightSlot& slot) {
    if (!status.ok()) return;
    const TensorInfo* t = checkpoint.find(slot.name);
    const TensorInfo* scale = slot.matrix != nullptr ? checkpoint.find(quant_scale_name(slot.name)) : nullptr;
    if (t == nullptr) {
      status = not_found("tensor '" + slot.name + "' is missing from the checkpoint in " + checkpoint.dir() +
                         " (is this a Dream/DiffuCoder checkpoint, and are all shards present?)");
    } else if (scale != nullptr) {
      if (quant.format == WeightQuant::kNone) {
        status = invalid_argument("tensor '" + scale->name + "' in " + scale->file +
                                  " is a quantization scale but config.json in " + checkpoint.dir() +
                                  " has no \"quantization\" block; was it written by `diffucoder convert`?");
      } else {
        status = bind_quantized(checkpoint, quant, slot, *t, *scale);
        ++n_quantized;
      }
    } else if (t->shape != slot.shape) {
      status = invalid_argument("tensor '" + slot.name + "' in " + t->file + " has shape " + shape_str(t->shape) +
                                " but config.json implies " + shape_str(slot.shape) +
                                (quant.format != WeightQuant::kNone && slot.matrix != nullptr
                                     ? " (and it has no " + quant_scale_name(slot.name) + " to be a quantized tensor)"
                                     : std::string()));
    } else if (!is_float_dtype(t->dtype)) {
      status = invalid_argument("tensor '" + slot.name + "' in " + t->file + " is " + dtype_name(t->dtype) +
                                (slot.matrix != nullptr ? " without a " + quant_scale_name(slot.name) + " tensor"
                                                        : std::string(", not a float type")) +
                                "; expected F32, F16 or BF16");
    } else if (slot.matrix != nullptr) {
      *slot.matrix = WeightView{t->dtype, t->data, slot.shape[0], slot.shape.size() > 1 ? slot.shape[1] : 1};
    } else {
      const std::span<float> dst = vectors.take(slot.shape[0]);
      convert_to_f32(t->dtype, t->data, dst.data(), dst.size());
      *slot.vector = dst;
    }
  });
  if (!status.ok()) return status;
  if (quant.format != WeightQuant::kNone && n_quantized == 0)
    return invalid_argument("config.json in " + checkpoint.dir() + " declares \"quantization\" " +
                            quant_format_name(quant.format) +
                            " but no matrix has a quantization scale tensor: remove the block, or convert the "
                            "checkpoint with `diffucoder convert`");
  if (c.tie_word_embeddings) w.output = w.tok_embd;
  return w;
}

}  // namespace dc
