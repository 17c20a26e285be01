// ggml block weights (WeightQuant::kGguf, a quantized GGUF's matrices read in place) have no device kernels:
// the Vulkan backend refuses to upload one, naming the matrix and its type and saying what runs instead.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ops/device.h"
#include "ops/weight.h"

namespace dc {
namespace vulkan_gguf_test {  // named: the test sources are built as one unit

TEST(VulkanBackend, GgufBlockWeightsAreRefusedClearly) {
  auto backend = open_vulkan_backend(0);
  ASSERT_TRUE(backend.ok()) << backend.status().to_string();
  std::vector<uint8_t> blocks(4 * 144, 0);  // 4 rows of one Q4_K block
  WeightView w;
  w.dtype = DType::kU8;
  w.quant = WeightQuant::kGguf;
  w.ggml_type = cpu::GgmlType::kQ4_K;
  w.data = blocks.data();
  w.rows = 4;
  w.cols = 256;
  const Status s = (*backend)->add_matrix(w, "model.layers.0.self_attn.q_proj.weight");
  ASSERT_EQ(s.code(), StatusCode::kUnimplemented) << s.to_string();
  EXPECT_NE(s.message().find("model.layers.0.self_attn.q_proj.weight: Q4_K blocks"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("--device cpu"), std::string::npos) << s.message();
}

}  // namespace vulkan_gguf_test
}  // namespace dc
