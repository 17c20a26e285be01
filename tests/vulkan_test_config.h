// The synthetic checkpoint shape the Vulkan model and training tests share: the tiny shape with head sizes the
// device's attention takes (head_dim 16..128) and a vocabulary of 300 (298 the mask id, 299 pad / eos / bos).
#pragma once

#include <cstdint>

#include "model/synthetic.h"
#include "types/model_config.h"

namespace dc::testing {

inline ModelConfig vulkan_test_config(int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t n_ff) {
  ModelConfig c = synthetic_config("tiny").value();
  c.n_head = n_head, c.n_head_kv = n_head_kv, c.head_dim = head_dim, c.n_embd = n_head * head_dim, c.n_ff = n_ff;
  c.n_vocab = 300, c.mask_token_id = 298, c.pad_token_id = c.eos_token_id = c.bos_token_id = 299;
  return c;
}

}  // namespace dc::testing
