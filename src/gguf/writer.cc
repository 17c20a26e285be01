// GGUF writing (writer.h): serialised metadata, the tensor table with aligned offsets, streamed tensor
// bytes; and the checkpoint → dream GGUF conversion.
#include "gguf/writer.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "gguf/dream.h"
#include "gguf/quants.h"
#include "gguf/tokenizer_gguf.h"
#include "io/checkpoint.h"
#include "io/mapped_file.h"
#include "model/weights.h"

namespace dc {
namespace {

constexpr uint64_t kAlignment = 32;

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.insert(out.end(), b, b + sizeof(T));
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

}  // namespace

void GgufWriter::key(const std::string& k, GgufValueType t) {
  put_string(meta_, k);
  put<uint32_t>(meta_, static_cast<uint32_t>(t));
  ++n_kv_;
}

void GgufWriter::add_u32(const std::string& k, uint32_t v) {
  key(k, GgufValueType::kU32);
  put(meta_, v);
}

void GgufWriter::add_f32(const std::string& k, float v) {
  key(k, GgufValueType::kF32);
  put(meta_, v);
}

void GgufWriter::add_bool(const std::string& k, bool v) {
  key(k, GgufValueType::kBool);
  put<uint8_t>(meta_, v ? 1 : 0);
}

void GgufWriter::add_string(const std::string& k, const std::string& v) {
  key(k, GgufValueType::kString);
  put_string(meta_, v);
}

void GgufWriter::add_strings(const std::string& k, const std::vector<std::string>& v) {
  key(k, GgufValueType::kArray);
  put<uint32_t>(meta_, static_cast<uint32_t>(GgufValueType::kString));
  put<uint64_t>(meta_, v.size());
  for (const std::string& s : v) put_string(meta_, s);
}

void GgufWriter::add_i32s(const std::string& k, const std::vector<int32_t>& v) {
  key(k, GgufValueType::kArray);
  put<uint32_t>(meta_, static_cast<uint32_t>(GgufValueType::kI32));
  put<uint64_t>(meta_, v.size());
  for (int32_t x : v) put(meta_, x);
}

void GgufWriter::add_tensor(const std::string& name, GgufType type, std::vector<int64_t> dims, Producer produce) {
  const GgufTypeInfo info = *gguf_type_info(static_cast<uint32_t>(type));
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  tensors_.push_back({name, type, std::move(dims), static_cast<uint64_t>(n / info.block * info.bytes), std::move(produce)});
}

Status GgufWriter::write(const std::string& path) const {
  std::vector<uint8_t> head;
  head.insert(head.end(), {'G', 'G', 'U', 'F'});
  put<uint32_t>(head, 3);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, n_kv_);
  head.insert(head.end(), meta_.begin(), meta_.end());
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    put_string(head, t.name);
    put<uint32_t>(head, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) put<uint64_t>(head, static_cast<uint64_t>(d));
    put<uint32_t>(head, static_cast<uint32_t>(t.type));
    put<uint64_t>(head, offset);
    offset += (t.n_bytes + kAlignment - 1) / kAlignment * kAlignment;
  }
  head.resize((head.size() + kAlignment - 1) / kAlignment * kAlignment, 0);
  return write_file_atomically(path, [&](const ByteSink& sink) -> Status {
    DC_RETURN_IF_ERROR(sink(head.data(), head.size()));
    static const uint8_t kZeros[kAlignment] = {};
    for (const Tensor& t : tensors_) {
      uint64_t written = 0;
      DC_RETURN_IF_ERROR(t.produce([&](const void* data, size_t n) {
        written += n;
        return sink(data, n);
      }));
      if (written != t.n_bytes)
        return internal_error("writing " + path + ": tensor '" + t.name + "' produced " + std::to_string(written) +
                              " bytes instead of " + std::to_string(t.n_bytes));
      DC_RETURN_IF_ERROR(sink(kZeros, static_cast<size_t>((kAlignment - t.n_bytes % kAlignment) % kAlignment)));
    }
    return Status::ok_status();
  });
}

namespace {

// llama.cpp's general.file_type (LlamaFileType) of a whole file of that weight type.
uint32_t file_type(GgufWeights w) {
  switch (w) {
    case GgufWeights::kF32: return 0;
    case GgufWeights::kF16: return 1;
    case GgufWeights::kBF16: return 32;
    case GgufWeights::kQ8_0: return 7;
    case GgufWeights::kQ4_0: return 2;
    case GgufWeights::kQ4_1: return 3;
    case GgufWeights::kQ5_0: return 8;
    case GgufWeights::kQ5_1: return 9;
    case GgufWeights::kQ2_K: return 10;
    case GgufWeights::kQ3_K: return 11;  // MOSTLY_Q3_K_S: every matrix Q3_K
    case GgufWeights::kQ4_K: return 14;  // MOSTLY_Q4_K_S: every matrix Q4_K
    case GgufWeights::kQ5_K: return 16;  // MOSTLY_Q5_K_S
    case GgufWeights::kQ6_K: return 18;
  }
  return 0;
}

GgufType matrix_type(GgufWeights w, int64_t cols) {
  // The 32-value block types, else F16; the K-quants (256 values), else Q8_0.
  const auto block32 = [cols](GgufType t) { return cols % 32 == 0 ? t : GgufType::kF16; };
  const auto k_quant = [cols, &block32](GgufType t) { return cols % 256 == 0 ? t : block32(GgufType::kQ8_0); };
  switch (w) {
    case GgufWeights::kF32: return GgufType::kF32;
    case GgufWeights::kF16: return GgufType::kF16;
    case GgufWeights::kBF16: return GgufType::kBF16;
    case GgufWeights::kQ8_0: return block32(GgufType::kQ8_0);
    case GgufWeights::kQ4_0: return block32(GgufType::kQ4_0);
    case GgufWeights::kQ4_1: return block32(GgufType::kQ4_1);
    case GgufWeights::kQ5_0: return block32(GgufType::kQ5_0);
    case GgufWeights::kQ5_1: return block32(GgufType::kQ5_1);
    case GgufWeights::kQ2_K: return k_quant(GgufType::kQ2_K);
    case GgufWeights::kQ3_K: return k_quant(GgufType::kQ3_K);
    case GgufWeights::kQ4_K: return k_quant(GgufType::kQ4_K);
    case GgufWeights::kQ5_K: return k_quant(GgufType::kQ5_K);
    case GgufWeights::kQ6_K: return k_quant(GgufType::kQ6_K);
  }
  return GgufType::kF16;
}

// The producer of a [rows, cols] float tensor stored as `type`: 64 rows at a time, widened to f32 and
// encoded on the pool's threads.
GgufWriter::Producer matrix_producer(const TensorInfo& t, int64_t rows, int64_t cols, GgufType type, ThreadPool* pool) {
  return [&t, rows, cols, type, pool](const ByteSink& sink) -> Status {
    const GgufTypeInfo info = *gguf_type_info(static_cast<uint32_t>(type));
    const size_t row_bytes = static_cast<size_t>(cols / info.block * info.bytes);
    const int64_t chunk = 64;
    std::vector<float> f32(static_cast<size_t>(chunk * cols));
    std::vector<uint8_t> out(static_cast<size_t>(chunk) * row_bytes);
    const size_t in_row = static_cast<size_t>(cols) * dtype_size(t.dtype);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t n = std::min(chunk, rows - r0);
      std::atomic<int64_t> bad_row{-1};
      parallel_for(pool, n, [&](int64_t a, int64_t b) {
        for (int64_t r = a; r < b; ++r) {
          float* x = f32.data() + r * cols;
          convert_to_f32(t.dtype, static_cast<const uint8_t*>(t.data) + (r0 + r) * in_row, x, static_cast<size_t>(cols));
          uint8_t* y = out.data() + r * row_bytes;
          for (int64_t c = 0; c < cols; ++c)
            if (!std::isfinite(x[c])) bad_row.store(r0 + r);
          switch (type) {
            case GgufType::kF32: std::memcpy(y, x, row_bytes); break;
            case GgufType::kF16: for (int64_t c = 0; c < cols; ++c) { const uint16_t h = f32_to_f16(x[c]); std::memcpy(y + 2 * c, &h, 2); } break;
            case GgufType::kBF16: for (int64_t c = 0; c < cols; ++c) { const uint16_t h = f32_to_bf16(x[c]); std::memcpy(y + 2 * c, &h, 2); } break;
            case GgufType::kQ8_0: quantize_q8_0(x, y, cols); break;
            case GgufType::kQ4_0: quantize_q4_0(x, y, cols); break;
            case GgufType::kQ4_1: quantize_q4_1(x, y, cols); break;
            case GgufType::kQ5_0: quantize_q5_0(x, y, cols); break;
            case GgufType::kQ5_1: quantize_q5_1(x, y, cols); break;
            case GgufType::kQ2_K: quantize_q2_k(x, y, cols); break;
            case GgufType::kQ3_K: quantize_q3_k(x, y, cols); break;
            case GgufType::kQ4_K: quantize_q4_k(x, y, cols); break;
            case GgufType::kQ5_K: quantize_q5_k(x, y, cols); break;
            case GgufType::kQ6_K: quantize_q6_k(x, y, cols); break;
          }
          if (!gguf_row_finite(type, y, cols)) bad_row.store(r0 + r);  // e.g. a finite value beyond f16's range
        }
      }, 4);
      if (bad_row.load() >= 0)
        return invalid_argument("tensor '" + t.name + "' in " + t.file + " row " + std::to_string(bad_row.load()) +
                                " holds a non-finite value or one beyond the range of " +
                                gguf_type_info(static_cast<uint32_t>(type))->name + "; cannot convert it");
      DC_RETURN_IF_ERROR(sink(out.data(), static_cast<size_t>(n) * row_bytes));
    }
    return Status::ok_status();
  };
}

}  // namespace

Status convert_to_gguf(const GgufConvertOptions& o, ThreadPool* pool) {
  namespace fs = std::filesystem;
  DC_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::open(o.model_dir));
  const ModelConfig& c = ckpt.config();
  if (c.quantization.format != WeightQuant::kNone)
    return invalid_argument(o.model_dir + " is a quantized checkpoint (written by `diffucoder convert --weights q8|q4`); "
                            "convert the original bf16 / f32 checkpoint to GGUF instead");
  GgufWriter w;
  w.add_string("general.architecture", "dream");
  w.add_string("general.name", fs::path(o.model_dir).lexically_normal().filename().string());
  w.add_u32("general.file_type", file_type(o.weights));
  const bool quantized = o.weights != GgufWeights::kF32 && o.weights != GgufWeights::kF16 && o.weights != GgufWeights::kBF16;
  if (quantized) w.add_u32("general.quantization_version", 2);
  w.add_u32("dream.context_length", static_cast<uint32_t>(c.max_position_embeddings));
  w.add_u32("dream.embedding_length", static_cast<uint32_t>(c.n_embd));
  w.add_u32("dream.feed_forward_length", static_cast<uint32_t>(c.n_ff));
  w.add_u32("dream.block_count", static_cast<uint32_t>(c.n_layer));
  w.add_u32("dream.attention.head_count", static_cast<uint32_t>(c.n_head));
  w.add_u32("dream.attention.head_count_kv", static_cast<uint32_t>(c.n_head_kv));
  if (c.head_dim * c.n_head != c.n_embd) {
    w.add_u32("dream.attention.key_length", static_cast<uint32_t>(c.head_dim));
    w.add_u32("dream.attention.value_length", static_cast<uint32_t>(c.head_dim));
  }
  w.add_f32("dream.rope.freq_base", static_cast<float>(c.rope_theta));
  w.add_f32("dream.attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  w.add_bool("dream.attention.causal", false);

  const std::string tok_path = (fs::path(o.model_dir) / "tokenizer.json").string();
  if (fs::exists(tok_path)) {
    DC_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::from_file(tok_path));
    GgufVocab vocab = gguf_vocab(tok, c.n_vocab);
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", "qwen2");
    w.add_strings("tokenizer.ggml.tokens", vocab.tokens);
    w.add_i32s("tokenizer.ggml.token_type", vocab.types);
    w.add_strings("tokenizer.ggml.merges", vocab.merges);
  }
  for (const GgufTokenIdKey& id : kGgufTokenIds)
    if (c.*id.member >= 0) w.add_u32(id.key, static_cast<uint32_t>(c.*id.member));
  if (c.mask_token_id >= 0) w.add_u32(kGgufMaskTokenId, static_cast<uint32_t>(c.mask_token_id));
  const std::string tc_path = (fs::path(o.model_dir) / "tokenizer_config.json").string();
  if (fs::exists(tc_path)) {
    DC_ASSIGN_OR_RETURN(std::string text, read_text_file(tc_path));
    const nlohmann::json tc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (tc.is_discarded()) return parse_error(tc_path + ": not valid JSON");
    if (auto it = tc.find("chat_template"); it != tc.end() && it->is_string())
      w.add_string("tokenizer.chat_template", it->get<std::string>());
  }

  ModelWeights shapes;
  Status status;
  struct Entry {
    std::string name;
    GgufType type;
    std::vector<int64_t> dims;
    GgufWriter::Producer produce;
  };
  std::vector<Entry> entries;
  visit_weights(c, shapes, [&](const WeightSlot& slot) {
    if (!status.ok()) return;
    const TensorInfo* t = ckpt.find(slot.name);
    if (t == nullptr) {
      status = not_found("tensor '" + slot.name + "' is missing from the checkpoint in " + o.model_dir);
      return;
    }
    if (t->shape != slot.shape || !is_float_dtype(t->dtype)) {
      status = invalid_argument("tensor '" + slot.name + "' in " + t->file + " is " + dtype_name(t->dtype) +
                                " of another shape than config.json implies (or not a float type)");
      return;
    }
    const int64_t rows = slot.shape.size() > 1 ? slot.shape[0] : 1, cols = slot.shape.back();
    const GgufType type = slot.matrix != nullptr ? matrix_type(o.weights, cols) : GgufType::kF32;
    entries.push_back({gguf_tensor_name(slot.name), type, std::vector<int64_t>(slot.shape.rbegin(), slot.shape.rend()),
                       matrix_producer(*t, rows, cols, type, pool)});
  });
  DC_RETURN_IF_ERROR(status);
  const int64_t count = static_cast<int64_t>(entries.size());
  for (int64_t i = 0; i < count; ++i) {
    Entry& e = entries[static_cast<size_t>(i)];
    w.add_tensor(e.name, e.type, e.dims, [&o, &e, i, count](const ByteSink& sink) -> Status {
      DC_RETURN_IF_ERROR(e.produce(sink));
      if (o.on_tensor) o.on_tensor(i + 1, count, e.name, gguf_type_info(static_cast<uint32_t>(e.type))->name);
      return Status::ok_status();
    });
  }
  return w.write(o.out_path);
}

}  // namespace dc
