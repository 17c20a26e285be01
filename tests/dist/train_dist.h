// The training tests over ranks' shared parts (train_dist_test.cc, train_dist_device_test.cc): the TrainDist
// fixture (its temporary directory with sft.jsonl, the mpirun launcher, `diffucoder train` under it) and the
// comparisons of runs' outputs.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "fixtures.h"
#include "io/safetensors.h"
#include "process.h"
#include "temp_dir.h"

namespace dc {
namespace fs = std::filesystem;

// Under the sanitizers (ASAN_OPTIONS set, scripts/test.sh --sanitize): the ranks get OpenMPI's leak
// suppressions and the full unwinder they need (tests/dist/lsan_openmpi.supp); else nothing. Ranks on a Vulkan
// device (`device`) keep ASan's fast unwinder and no leak check instead: lavapipe's LLVM JIT registers its code's
// unwind frames while the full unwinder walks them, and both ranks deadlocked in libgcc's _Unwind_Find_FDE (its
// object mutex, taken again from inside it by an allocation's stack trace); the device code's leaks are checked
// in-process by test_train_vulkan under the sanitizers.
inline std::string sanitizer_options(bool device) {
  const char* asan = std::getenv("ASAN_OPTIONS");
  if (asan == nullptr) return " ";
  if (device) return std::string(" -x ASAN_OPTIONS=") + asan + ":fast_unwind_on_malloc=1:detect_leaks=0 ";
  return std::string(" -x ASAN_OPTIONS=") + asan + ":fast_unwind_on_malloc=0 -x LSAN_OPTIONS=suppressions=" +
         DC_LSAN_SUPPRESSIONS + " ";
}

class TrainDist : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new test::TempDir("dist");
    dir_ = tmp_->path();
    std::ofstream data(dir_ / "sft.jsonl");
    for (int i = 0; i < 12; ++i)
      data << R"({"prompt": "def f)" << i << R"((x):", "completion": "\n    return x * )" << i << "\"}\n";
  }
  static void TearDownTestSuite() { delete tmp_; }

  // The command prefix that starts a program on `ranks` ranks over loopback ("" for one process); `device`: ranks
  // that may open a Vulkan device (sanitizer_options).
  static std::string launcher(int ranks, bool device = false) {
    if (ranks == 1) return "";
    return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " DC_MPIEXEC " --oversubscribe -np " +
           std::to_string(ranks) + " --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo" +
           sanitizer_options(device);
  }

  // `diffucoder train` on `ranks` ranks (1: without mpirun) into dir_/out; stderr folded into out. `run`:
  // the length, precision and checkpoints (default: kSteps in f32, a checkpoint every 10).
  // `model`: the checkpoint (default: the fixtures' tiny-vocab).
  static testing::RunResult train(int ranks, const std::string& out, const std::string& extra = "", int accum = 2,
                                  const std::string& run = "--steps 20 --precision f32 --save-every 10",
                                  const std::string& model = testing::fixtures_dir() + "/tiny-vocab") {
    return train_under(launcher(ranks), out, extra, accum, run, model);
  }
  // The same under the command prefix `launch`.
  static testing::RunResult train_under(const std::string& launch, const std::string& out, const std::string& extra,
                                        int accum, const std::string& run, const std::string& model) {
    const std::string args = " train --model " + model + " --data " +
                             (dir_ / "sft.jsonl").string() + " " + run +
                             " --seq-len 32 --batch-size 1 --grad-accum " + std::to_string(accum) + " --lr 2e-3 --warmup-steps 2 --threads 1"
                             " --instruct-template --quiet --out " + (dir_ / out).string() + " " + extra;
    testing::RunResult r = testing::run_command(launch + DC_BINARY_PATH + args);
    r.out += r.err;
    return r;
  }
  static fs::path path(const std::string& p) { return dir_ / p; }
  static inline test::TempDir* tmp_ = nullptr;
  static inline fs::path dir_;
};

inline std::vector<double> losses(const fs::path& metrics) {
  std::vector<double> l;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) l.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return l;
}

inline std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Two f32 safetensors files of the same tensors: ‖a − b‖ / ‖a‖ over all values, and the largest over
// tensors of max |a − b| / max |a| — leaving out the attention's key biases: their exact gradient is zero
// (a bias on every key shifts a query's scores by a constant, which the softmax removes), so their
// gradients are rounding noise that AdamW's normalisation turns into lr-sized steps of any sign.
struct Difference {
  double norm_relative = 1e9, max_relative = 1e9;
};
inline Difference difference(const fs::path& a_path, const fs::path& b_path) {
  auto a = SafetensorsFile::open(a_path.string());
  auto b = SafetensorsFile::open(b_path.string());
  EXPECT_TRUE(a.ok() && b.ok()) << a_path << " " << b_path;
  if (!a.ok() || !b.ok()) return {};
  double diff2 = 0, norm2 = 0, worst = 0;
  for (const auto& [name, ta] : a->tensors()) {
    const TensorInfo* tb = b->find(name);
    EXPECT_NE(tb, nullptr) << name;
    if (tb == nullptr || tb->shape != ta.shape) return {};
    const float* x = reinterpret_cast<const float*>(ta.data);
    const float* y = reinterpret_cast<const float*>(tb->data);
    const int64_t n = static_cast<int64_t>(ta.n_bytes / sizeof(float));
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double d = std::fabs(double(x[i]) - y[i]);
      diff = std::max(diff, d), scale = std::max(scale, std::fabs(double(x[i])));
      diff2 += d * d, norm2 += double(x[i]) * x[i];
    }
    if (name.find("k_proj.bias") == std::string::npos) worst = std::max(worst, scale > 0 ? diff / scale : diff);
  }
  return {std::sqrt(diff2 / norm2), worst};
}

}  // namespace dc
