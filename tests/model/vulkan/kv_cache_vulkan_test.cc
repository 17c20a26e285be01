// A KV cache is read only on the device that filled it: a window forward handed a cache of another device
// (device memory to the CPU, host memory to the device) is an error naming both, not a dereference of the
// other side's addresses (model/kv_cache.h, Model::forward).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "batch_case.h"
#include "model/kv_cache.h"
#include "model/synthetic.h"
#include "synthetic_pair.h"

namespace dc {
namespace {

TEST(KvCacheVulkan, ACacheOfAnotherDeviceIsRefusedByNameOnBothSides) {
  ModelConfig c = synthetic_config("tiny").value();
  c.n_head = 2, c.n_head_kv = 1, c.head_dim = 16, c.n_embd = 32, c.n_ff = 64, c.n_vocab = 64;
  c.mask_token_id = 62, c.pad_token_id = c.eos_token_id = c.bos_token_id = 63;
  const auto pair = testing::synthetic_pair(c, 3);
  ASSERT_NE(pair, nullptr);
  const Model &cpu_model = *pair->cpu_model, &device_model = *pair->device_model;
  const Context &cpu = pair->cpu, &device = pair->device;

  const int64_t L = 6;
  const BatchCase k = every_position(1, L, [](int64_t i) { return i * 5 % 62; });
  ForwardBatch b = k.view();
  std::vector<float> logits(L * c.n_vocab);
  KvCache on_device, on_host;
  b.cache_op = CacheOp::kRefresh;
  b.cache = &on_device;
  ASSERT_TRUE(device_model.forward(device, b, logits.data()).ok());
  b.cache = &on_host;
  ASSERT_TRUE(cpu_model.forward(cpu, b, logits.data()).ok());
  ASSERT_EQ(on_device.backend(), device.backend);
  ASSERT_EQ(on_host.backend(), nullptr);

  b.cache_op = CacheOp::kUse, b.window_begin = 2, b.window_end = L;
  b.out_rows = k.rows.data() + 2, b.n_out = L - 2;
  b.cache = &on_device;  // device memory, read by the CPU
  Status st = cpu_model.forward(cpu, b, logits.data());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("filled on " + device.backend->name() + " and this forward runs on the CPU"),
            std::string::npos) << st.to_string();
  b.cache = &on_host;  // host memory, read by the device
  st = device_model.forward(device, b, logits.data());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("filled on the CPU and this forward runs on " + device.backend->name()),
            std::string::npos) << st.to_string();
  b.cache = &on_device;  // the device's own cache still works after the refusals
  EXPECT_TRUE(device_model.forward(device, b, logits.data()).ok());
}

}  // namespace
}  // namespace dc
