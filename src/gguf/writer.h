// Writing GGUF (version 3): a metadata + tensor-table builder whose tensor bytes are produced while the
// file is written (nothing of a 7B model is held twice), and `convert`'s checkpoint → dream GGUF.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "gguf/gguf_file.h"
#include "io/atomic_dir.h"

namespace dc {

class GgufWriter {
 public:
  // Metadata in the order added (keys must be unique; the writer does not check).
  void add_u32(const std::string& key, uint32_t v);
  void add_f32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_string(const std::string& key, const std::string& v);
  void add_strings(const std::string& key, const std::vector<std::string>& v);
  void add_i32s(const std::string& key, const std::vector<int32_t>& v);

  // A tensor of `type` with ggml dims (innermost first; dims[0] a multiple of the type's block) whose
  // bytes produce(sink) writes, exactly the type's size of those dims, when the file is written.
  using Producer = std::function<Status(const ByteSink& sink)>;
  void add_tensor(const std::string& name, GgufType type, std::vector<int64_t> dims, Producer produce);

  // Writes the file atomically (io/atomic_dir.h), data aligned to 32 bytes. A producer that writes
  // another byte count than its tensor's is an error naming the tensor.
  Status write(const std::string& path) const;

 private:
  void key(const std::string& k, GgufValueType t);
  struct Tensor {
    std::string name;
    GgufType type;
    std::vector<int64_t> dims;
    uint64_t n_bytes;
    Producer produce;
  };
  std::vector<uint8_t> meta_;  // the serialised key/value pairs
  uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
};

// `diffucoder convert --out FILE.gguf`: the weight type of the matrices (norms and biases stay F32).
enum class GgufWeights { kF32, kF16, kBF16, kQ8_0, kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ2_K, kQ3_K, kQ4_K, kQ5_K, kQ6_K };

struct GgufConvertOptions {
  std::string model_dir;  // a dense Hugging Face checkpoint (F32 / F16 / BF16 tensors)
  std::string out_path;   // FILE.gguf
  GgufWeights weights = GgufWeights::kF16;
  // Called once per tensor, after it is written: index (1-based), count, GGUF name, its type name.
  std::function<void(int64_t, int64_t, const std::string&, const char*)> on_tensor;
};

// Writes the checkpoint as a GGUF of architecture dream with the metadata llama.cpp's converter writes
// (general.*, dream.* sizes / heads / RoPE base / RMS epsilon / causal false, tokenizer.ggml.* from
// tokenizer.json when the directory has one, the token ids including the mask token, the chat template
// of tokenizer_config.json). A matrix whose columns are not a multiple of the chosen type's block falls
// back to Q8_0 (the K-quants: Q2_K ... Q6_K), then F16 (every type). Errors name the file or tensor; a quantized (`convert --weights q8|q4`)
// checkpoint is refused.
Status convert_to_gguf(const GgufConvertOptions& options, ThreadPool* pool);

}  // namespace dc
