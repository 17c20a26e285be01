// The tiny training setup the trainer tests share (tests/train/trainer_test.cc, trainer_lora_test.cc): the
// grad fixtures' checkpoint, a small corpus of this project's own source, the options of a short run.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/context.h"
#include "core/thread_pool.h"
#include "train/data.h"
#include "train/trainer.h"

namespace dc::train {

inline const std::filesystem::path kGrad = DC_GRAD_FIXTURES_DIR;

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Sequences of `L` ids from this project's own source: characters mapped to ids by frequency rank,
// the 61 most frequent to 0..60 and every other to 61 (ids 62 / 63 are the fixture's mask / pad).
inline Dataset code_corpus(int64_t L) {
  const std::string text = read_file(std::filesystem::path(DC_SOURCE_DIR) / "src" / "train" / "trainer.cc") +
                           read_file(std::filesystem::path(DC_SOURCE_DIR) / "src" / "train" / "data.cc");
  std::map<unsigned char, int64_t> count;
  for (unsigned char ch : text) ++count[ch];
  std::vector<std::pair<int64_t, unsigned char>> by_count;
  for (auto [ch, n] : count) by_count.push_back({-n, ch});
  std::sort(by_count.begin(), by_count.end());
  std::map<unsigned char, int32_t> id;
  for (size_t i = 0; i < by_count.size(); ++i) id[by_count[i].second] = static_cast<int32_t>(std::min<size_t>(i, 61));
  Dataset ds;
  for (size_t b = 0; b + L <= text.size(); b += L) {
    TrainSequence s;
    for (int64_t j = 0; j < L; ++j) s.tokens.push_back(id[static_cast<unsigned char>(text[b + j])]);
    s.loss_mask.assign(L, 1);
    ds.sequences.push_back(std::move(s));
  }
  return ds;
}

inline TrainOptions tiny_options(const std::filesystem::path& out, int64_t steps) {
  TrainOptions o;
  o.model_dir = (kGrad / "tiny-train").string();
  o.data_path = "code-corpus";
  o.out_dir = out.string();
  o.seq_len = 32, o.batch_size = 8, o.steps = steps;
  o.lr.lr = 1e-2, o.lr.warmup_steps = 10, o.lr.total_steps = steps, o.lr.min_lr_ratio = 0.1;
  o.adam.beta2 = 0.99;
  return o;
}

inline Context make_ctx(ThreadPool& pool) {
  Context ctx;
  ctx.pool = &pool;
  return ctx;
}

// A trainer of `o` on the code corpus, run until `steps` are done (null, with the failure recorded, when it fails).
inline std::unique_ptr<Trainer> trained_to(const TrainOptions& o, ThreadPool& pool, int64_t steps) {
  auto t = Trainer::create_with_data(o, make_ctx(pool), code_corpus(32));
  if (!t.ok()) {
    ADD_FAILURE() << t.status().message();
    return nullptr;
  }
  while ((*t)->steps_done() < steps) {
    const auto s = (*t)->step();
    if (!s.ok()) {
      ADD_FAILURE() << "step " << (*t)->steps_done() + 1 << ": " << s.status().message();
      return nullptr;
    }
  }
  return std::move(*t);
}

}  // namespace dc::train
