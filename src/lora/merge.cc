// merge_lora: W' = W + scale · B·A in f32, stored again as the base stored W (docs/lora.md "The merge").
#include "lora/merge.h"

#include <algorithm>
#include <atomic>
#include <new>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>

#include "core/check.h"
#include "gguf/quants.h"
#include "model/quantize.h"

namespace dc {
namespace {

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBytes = std::unique_ptr<uint8_t[], FreeDeleter>;

// What a merged model owns besides the base: the merged matrices' bytes.
struct LoraStorage {
  std::unique_ptr<Model> base;  // its views are the tensors the adapter leaves alone
  std::deque<AlignedBytes> bytes;
  std::deque<QuantizedMatrix> quantized;  // a deque: the views stay where they are as it grows

  uint8_t* take(size_t n) {  // 64-byte aligned, as mapped tensors and the kernels' loads expect
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, (n + 63) / 64 * 64));
    if (p == nullptr) throw std::bad_alloc();
    bytes.emplace_back(p);
    return p;
  }
};

using RowQuantizer = void (*)(const float*, uint8_t*, int64_t);

RowQuantizer gguf_quantizer(cpu::GgmlType t) {
  switch (t) {
    case cpu::GgmlType::kQ8_0: return quantize_q8_0;
    case cpu::GgmlType::kQ4_0: return quantize_q4_0;
    case cpu::GgmlType::kQ4_1: return quantize_q4_1;
    case cpu::GgmlType::kQ5_0: return quantize_q5_0;
    case cpu::GgmlType::kQ5_1: return quantize_q5_1;
    case cpu::GgmlType::kQ2_K: return quantize_q2_k;
    case cpu::GgmlType::kQ3_K: return quantize_q3_k;
    case cpu::GgmlType::kQ4_K: return quantize_q4_k;
    case cpu::GgmlType::kQ5_K: return quantize_q5_k;
    case cpu::GgmlType::kQ6_K: return quantize_q6_k;
    case cpu::GgmlType::kNone: break;
  }
  DC_CHECK(false, "a kGguf weight view without a ggml block type");
  return nullptr;
}

// merged f32 [rows, cols] → the base's storage. row_changed[r] == 0: row r's update was all zero (GGUF
// blocks keep their bytes then); empty: every row changed.
Result<WeightView> store_like(const WeightView& base, const std::vector<float>& merged,
                              const std::vector<uint8_t>& row_changed, const std::string& name, LoraStorage& st,
                              ThreadPool* pool) {
  const int64_t rows = base.rows, cols = base.cols;
  std::atomic<int64_t> bad_row{-1};
  parallel_for(pool, rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < cols; ++c)
        if (!std::isfinite(merged[r * cols + c])) bad_row.store(r);
  }, 16);
  if (bad_row.load() >= 0)
    return invalid_argument("merging the LoRA adapter into '" + name + "' gives a non-finite value in row " +
                            std::to_string(bad_row.load()) + " (do the adapter's tensors hold inf / nan?)");
  WeightView v = base;
  if (base.quant == WeightQuant::kQ8 || base.quant == WeightQuant::kQ4) {
    QuantizeOptions o;
    o.format = base.quant;
    o.group_size = base.quant == WeightQuant::kQ4 ? base.group_size : 128;
    DC_ASSIGN_OR_RETURN(QuantizedMatrix q, quantize_matrix(WeightView{DType::kF32, merged.data(), rows, cols}, o, name, pool));
    return st.quantized.emplace_back(std::move(q)).view;
  }
  if (base.quant == WeightQuant::kGguf) {
    const RowQuantizer quantize = gguf_quantizer(base.ggml_type);
    const int64_t row_bytes = cpu::ggml_row_bytes(base.ggml_type, cols);
    uint8_t* out = st.take(static_cast<size_t>(rows * row_bytes));
    const auto* in = static_cast<const uint8_t*>(base.data);
    parallel_for(pool, rows, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        if (!row_changed.empty() && row_changed[r] == 0) std::memcpy(out + r * row_bytes, in + r * row_bytes, row_bytes);
        else quantize(merged.data() + r * cols, out + r * row_bytes, cols);
      }
    }, 16);
    v.data = out;
    return v;
  }
  const size_t n = static_cast<size_t>(rows * cols);
  uint8_t* out = st.take(n * dtype_size(base.dtype));
  switch (base.dtype) {
    case DType::kF32: std::memcpy(out, merged.data(), n * 4); break;
    case DType::kBF16: for (size_t i = 0; i < n; ++i) reinterpret_cast<uint16_t*>(out)[i] = f32_to_bf16(merged[i]); break;
    case DType::kF16: for (size_t i = 0; i < n; ++i) reinterpret_cast<uint16_t*>(out)[i] = f32_to_f16(merged[i]); break;
    default: return internal_error("LoRA merge: '" + name + "' has dtype " + dtype_name(base.dtype));
  }
  v.data = out;
  return v;
}

// merged[rows = out, cols = in] += scale · B·A (B [out, r], A [r, in], f32 accumulation over r, then one
// multiply by scale, as PEFT's (B @ A) * scaling). row_changed[o] = whether row o's update has a non-zero.
void add_update(const LoraUpdate& u, int64_t rows, int64_t cols, std::vector<float>& merged,
                std::vector<uint8_t>& row_changed, ThreadPool* pool) {
  const int64_t r = u.rank;
  std::vector<float> a(static_cast<size_t>(r * cols)), b(static_cast<size_t>(rows * r));  // [r, in], [out, r]
  convert_to_f32(u.a->dtype, u.a->data, a.data(), a.size());
  convert_to_f32(u.b->dtype, u.b->data, b.data(), b.size());
  row_changed.assign(static_cast<size_t>(rows), 0);
  parallel_for(pool, rows, [&](int64_t o0, int64_t o1) {
    std::vector<float> acc(static_cast<size_t>(cols));  // [in] one row of B·A
    for (int64_t o = o0; o < o1; ++o) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t k = 0; k < r; ++k) {
        const float bk = b[o * r + k];
        const float* ak = a.data() + k * cols;
        for (int64_t c = 0; c < cols; ++c) acc[c] += bk * ak[c];
      }
      float* dst = merged.data() + o * cols;
      bool any = false;
      for (int64_t c = 0; c < cols; ++c) {
        const float d = acc[c] * u.scale;
        any = any || d != 0.0f;
        dst[c] += d;
      }
      row_changed[o] = any;
    }
  }, 8);
}

}  // namespace

Result<std::unique_ptr<Model>> merge_lora(std::unique_ptr<Model> base, const LoraPlan& plan, ThreadPool* pool,
                                          LoraMergeReport* report) {
  const ModelConfig config = base->config();
  ModelWeights w = base->weights();  // views; the merged matrices are re-pointed below
  auto st = std::make_shared<LoraStorage>();
  std::map<std::string, const LoraUpdate*> updates;
  std::map<std::string, const LoraReplacement*> replacements;
  for (const LoraUpdate& u : plan.updates) updates[u.weight_name] = &u;
  for (const LoraReplacement& r : plan.replacements) replacements[r.weight_name] = &r;
  LoraMergeReport local;
  LoraMergeReport& rep = report != nullptr ? *report : local;
  rep = LoraMergeReport{};
  Status status;
  try {
    visit_weights(config, w, [&](const WeightSlot& slot) {
      if (!status.ok() || slot.matrix == nullptr) return;
      const auto u = updates.find(slot.name);
      const auto r = replacements.find(slot.name);
      if (u == updates.end() && r == replacements.end()) return;
      const WeightView& m = *slot.matrix;  // [rows, cols]
      if (m.layout != WeightLayout::kRowMajor) {
        status = failed_precondition("LoRA merge: '" + slot.name + "' is already packed; merge before pack_weights");
        return;
      }
      const int64_t rows = m.rows, cols = m.cols;
      std::vector<float> merged(static_cast<size_t>(rows * cols));  // [rows, cols] f32
      std::vector<uint8_t> row_changed;                             // empty: every row
      if (u != updates.end()) {
        parallel_for(pool, rows, [&](int64_t r0, int64_t r1) {
          for (int64_t i = r0; i < r1; ++i) m.row_to_f32(i, merged.data() + i * cols);
        }, 16);
        add_update(*u->second, rows, cols, merged, row_changed, pool);
        ++rep.n_updates;
      } else {
        convert_to_f32(r->second->tensor->dtype, r->second->tensor->data, merged.data(), merged.size());
        ++rep.n_replacements;
      }
      auto stored = store_like(m, merged, row_changed, slot.name, *st, pool);
      if (!stored.ok()) {
        status = stored.status();
        return;
      }
      *slot.matrix = stored.value();
      rep.changed.push_back(slot.name);
    });
  } catch (const std::bad_alloc&) {
    return resource_exhausted("LoRA merge: out of memory for the merged matrices");
  }
  DC_RETURN_IF_ERROR(status);
  if (config.tie_word_embeddings) w.output = w.tok_embd;
  st->base = std::move(base);
  return Model::from_weights(config, std::move(w), std::move(st));
}

Result<std::unique_ptr<Model>> load_lora_merged(std::unique_ptr<Model> base, const std::string& adapter_dir,
                                                ThreadPool* pool, LoraMergeReport* report) {
  DC_ASSIGN_OR_RETURN(LoraAdapter adapter, open_lora_adapter(adapter_dir));
  DC_ASSIGN_OR_RETURN(LoraPlan plan, plan_lora(adapter, base->config()));
  return merge_lora(std::move(base), plan, pool, report);
}

}  // namespace dc
