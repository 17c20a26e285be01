// The dream architecture: metadata → ModelConfig (through config.json's validation), tensor names, and
// the binding of a GGUF's tensors to ModelWeights (mapped as they are; dream.h).
#include "gguf/dream.h"

#include <atomic>
#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>
#include <vector>

#include "io/config_json.h"
#include "io/mapped_file.h"
#include "gguf/quants.h"

namespace dc {

bool is_gguf_path(std::string_view path) {
  return path.size() > 5 && path.substr(path.size() - 5) == ".gguf";
}

std::string gguf_tensor_name(const std::string& hf) {
  static const std::pair<const char*, const char*> kTop[] = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"},
  };
  for (const auto& [ours, theirs] : kTop)
    if (hf == ours) return theirs;
  static const std::string kLayers = "model.layers.";
  if (hf.compare(0, kLayers.size(), kLayers) != 0) return "";
  const size_t dot = hf.find('.', kLayers.size());
  if (dot == std::string::npos) return "";
  const std::string index = hf.substr(kLayers.size(), dot - kLayers.size());
  const std::string rest = hf.substr(dot + 1);
  static const std::pair<const char*, const char*> kLayer[] = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  for (const auto& [ours, theirs] : kLayer)
    if (rest == ours) return "blk." + index + "." + theirs;
  return "";
}

Result<nlohmann::json> dream_config_json(const GgufFile& f) {
  DC_ASSIGN_OR_RETURN(std::string_view arch, f.get_string("general.architecture"));
  if (arch != "dream")
    return unimplemented(f.path() + ": general.architecture is '" + std::string(arch) +
                         "'; only dream (Dream / DiffuCoder, converted by llama.cpp's convert_hf_to_gguf.py) is supported");
  const GgufTensor* embd = f.find_tensor("token_embd.weight");
  if (embd == nullptr || embd->dims.size() != 2)
    return not_found(f.path() + ": tensor 'token_embd.weight' (the embeddings, 2-D) is missing");
  nlohmann::json j;
  j["model_type"] = "Dream";
  j["vocab_size"] = embd->dims[1];
  DC_ASSIGN_OR_RETURN(int64_t n_embd, f.get_int("dream.embedding_length"));
  DC_ASSIGN_OR_RETURN(int64_t n_head, f.get_int("dream.attention.head_count"));
  j["hidden_size"] = n_embd;
  j["num_attention_heads"] = n_head;
  DC_ASSIGN_OR_RETURN(j["intermediate_size"], f.get_int("dream.feed_forward_length"));
  DC_ASSIGN_OR_RETURN(j["num_hidden_layers"], f.get_int("dream.block_count"));
  DC_ASSIGN_OR_RETURN(j["num_key_value_heads"], f.get_int_or("dream.attention.head_count_kv", n_head));
  if (f.find("dream.attention.key_length") != nullptr) {
    DC_ASSIGN_OR_RETURN(j["head_dim"], f.get_int("dream.attention.key_length"));
  }
  DC_ASSIGN_OR_RETURN(j["max_position_embeddings"], f.get_int("dream.context_length"));
  if (f.find("dream.rope.freq_base") != nullptr) {
    DC_ASSIGN_OR_RETURN(j["rope_theta"], f.get_float("dream.rope.freq_base"));
  }
  DC_ASSIGN_OR_RETURN(j["rms_norm_eps"], f.get_float("dream.attention.layer_norm_rms_epsilon"));
  j["tie_word_embeddings"] = f.find_tensor("output.weight") == nullptr;
  j["torch_dtype"] = embd->type == GgufType::kF32 ? "float32" : embd->type == GgufType::kF16 ? "float16" : "bfloat16";
  for (const GgufTokenIdKey& id : kGgufTokenIds) {  // absent: null, Hugging Face's "none" (not -1, an index)
    if (f.find(id.key) == nullptr) {
      j[id.config_field] = nullptr;
    } else {
      DC_ASSIGN_OR_RETURN(j[id.config_field], f.get_int(id.key));
    }
  }
  int64_t mask = -1;
  if (f.find(kGgufMaskTokenId) != nullptr) {
    DC_ASSIGN_OR_RETURN(mask, f.get_int(kGgufMaskTokenId));
  } else if (const GgufValue* tokens = f.find("tokenizer.ggml.tokens")) {
    for (size_t k = 0; k < tokens->strings.size(); ++k)
      if (tokens->strings[k] == "<|mask|>") mask = static_cast<int64_t>(k);
  }
  if (mask < 0)
    return not_found(f.path() + ": no mask token: neither 'tokenizer.ggml.mask_token_id' nor a token \"<|mask|>\"; "
                     "a diffusion model needs one (re-convert with a current convert_hf_to_gguf.py)");
  j["mask_token_id"] = mask;
  return j;
}

Result<ModelConfig> dream_config(const GgufFile& f) {
  DC_ASSIGN_OR_RETURN(const nlohmann::json j, dream_config_json(f));
  return parse_model_config(j.dump(), f.path() + " (its dream metadata, read as config.json fields)");
}

namespace {

std::string dims_str(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t k = 0; k < d.size(); ++k) s += (k ? ", " : "") + std::to_string(d[k]);
  return s + "]";
}

// What the loaded model owns: the mapping, the norms / biases, dense matrices copied for alignment.
struct GgufStorage {
  explicit GgufStorage(GgufFile f, const ModelConfig& c) : file(std::move(f)), vectors(c) {}
  GgufFile file;
  VectorStore vectors;
  std::deque<std::vector<uint8_t>> bytes;  // a deque: references stay valid as it grows
};

DType dense_dtype(GgufType t) {
  return t == GgufType::kF32 ? DType::kF32 : t == GgufType::kF16 ? DType::kF16 : DType::kBF16;
}

Status non_finite_row(const GgufStorage& st, const GgufTensor& t, int64_t row) {
  return invalid_argument(st.file.path() + ": tensor '" + t.name + "' row " + std::to_string(row) +
                          " holds a non-finite value (or a scale beyond f16's range)");
}

Status bind_matrix(const GgufTensor& t, const WeightSlot& slot, GgufStorage& st, ThreadPool* pool) {
  const int64_t rows = slot.shape[0], cols = slot.shape[1];
  WeightView v;
  v.rows = rows;
  v.cols = cols;
  switch (t.type) {
    case GgufType::kF32: case GgufType::kF16: case GgufType::kBF16:
      v.dtype = dense_dtype(t.type);
      v.data = t.data;
      if (reinterpret_cast<uintptr_t>(t.data) % dtype_size(v.dtype) != 0)  // general.alignment 1 or 2: copy
        v.data = st.bytes.emplace_back(t.data, t.data + t.n_bytes).data();
      break;
    default: {  // a ggml block type: its blocks run in place (the kernels of ops/cpu/matmul_gguf.h)
      const int64_t row_bytes = static_cast<int64_t>(t.n_bytes) / rows;
      std::atomic<int64_t> bad_row{-1};  // every block's scales checked once, in parallel
      parallel_for(pool, rows, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          if (!gguf_row_finite(t.type, t.data + r * row_bytes, cols)) bad_row.store(r);
      }, 16);
      if (bad_row.load() >= 0) return non_finite_row(st, t, bad_row.load());
      v.dtype = DType::kU8;
      v.quant = WeightQuant::kGguf;
      v.ggml_type = static_cast<cpu::GgmlType>(static_cast<uint32_t>(t.type));
      v.data = t.data;
    }
  }
  // A dense matrix copied for its alignment: the file's pages are not read again.
  if (v.data != t.data) release_pages(t.data, t.n_bytes);
  *slot.matrix = v;
  return Status();
}

}  // namespace

Result<GgufModel> load_gguf_model(const std::string& path, ThreadPool* pool) {
  DC_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
  GgufModel m;
  DC_ASSIGN_OR_RETURN(m.config, dream_config(file));
  auto st = std::make_shared<GgufStorage>(std::move(file), m.config);
  Status status;
  visit_weights(m.config, m.weights, [&](const WeightSlot& slot) {
    if (!status.ok()) return;
    const std::string name = gguf_tensor_name(slot.name);
    const GgufTensor* t = st->file.find_tensor(name);
    if (t == nullptr) {
      status = not_found(path + ": tensor '" + name + "' (our " + slot.name + ") is missing; is this a complete dream GGUF?");
      return;
    }
    const std::vector<int64_t> want(slot.shape.rbegin(), slot.shape.rend());  // GGUF dims: innermost first
    if (t->dims != want) {
      status = invalid_argument(path + ": tensor '" + name + "' has dims " + dims_str(t->dims) + " but the metadata implies " +
                                dims_str(want));
      return;
    }
    if (slot.matrix != nullptr) {
      status = bind_matrix(*t, slot, *st, pool);
      return;
    }
    const std::span<float> dst = st->vectors.take(slot.shape[0]);
    const uint8_t* src = t->data;
    std::vector<uint8_t> aligned;
    if (reinterpret_cast<uintptr_t>(src) % 4 != 0) {  // general.alignment below 4: read from a copy
      aligned.assign(src, src + t->n_bytes);
      src = aligned.data();
    }
    gguf_dequantize(t->type, src, dst.data(), slot.shape[0]);
    *slot.vector = dst;
  });
  if (!status.ok()) return status;
  if (m.config.tie_word_embeddings) m.weights.output = m.weights.tok_embd;
  m.file = &st->file;
  m.storage = std::move(st);
  return m;
}

}  // namespace dc
