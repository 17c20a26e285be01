// The training ops' front-ends (ops/matmul.h, ops/elementwise.h, ops/attention.h, ops/loss.h, ops/adamw.h,
// ops/dropout.h) on
// a Context of device 0: each dispatches to the Vulkan backend, which records the kernels into the one
// sequence of a begin() / finish(), and the results equal the same front-ends' on the CPU (the kernels'
// own tests hold them to the reference on more shapes: backward_kernels_test.cc).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "ops/adamw.h"
#include "ops/attention.h"
#include "ops/device.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/loss.h"
#include "ops/matmul.h"
#include "vulkan_test_util.h"

namespace dc {
namespace {

using testing::expect_close;
using testing::random_floats;

// A device's view of the host vectors of one forward: each copied in, or read back once finish() has run.
struct DeviceVectors {
  DeviceBackend& b;
  std::vector<std::string> names;
  template <typename T>
  T* in(const std::vector<T>& host) {
    names.push_back("in" + std::to_string(names.size()));
    return const_cast<T*>(as_operand(device_cast<const T>(b.copy_in(names.back().c_str(), host.data(), static_cast<int64_t>(host.size() * sizeof(T))))));
  }
  void out(const float* device, std::vector<float>& host) {
    names.push_back("out" + std::to_string(names.size()));
    b.copy_out(names.back().c_str(), device_cast<const void>(as_device(device)), host.data(), static_cast<int64_t>(host.size() * 4));
  }
};

// Device 0's backend (a test failure when there is none) and a Context of it.
class VulkanTrainingOps : public ::testing::Test {
 protected:
  void SetUp() override {
    auto opened = open_vulkan_backend(0);
    ASSERT_TRUE(opened.ok()) << opened.status().to_string();
    backend_ = std::move(opened).value();
    dev_.device = Device::kVulkan, dev_.backend = backend_.get();
  }
  std::unique_ptr<DeviceBackend> backend_;
  Context dev_;
};

TEST_F(VulkanTrainingOps, FrontEndsDispatchToTheDevice) {
  DeviceBackend& b = *backend_;
  const Context& dev = dev_;
  Context cpu;
  const int64_t n = 9, out = 67, in = 42, n_vocab = 101;
  const std::vector<float> w_values = random_floats(1, out * in), norm_w = random_floats(2, in, 0.5f, 1.5f);
  const WeightView w{DType::kF32, w_values.data(), out, in};
  ASSERT_TRUE(b.add_matrix(w, "w").ok());
  ASSERT_TRUE(b.add_vector(norm_w.data(), in, "norm").ok());
  const std::vector<float> x = random_floats(3, n * in), dy = random_floats(4, n * out), logits = random_floats(5, n * n_vocab, -4, 4);
  const std::vector<int32_t> targets{0, 5, 100, 7, 7, 3, 50, 99, 1};
  const std::vector<float> loss_weights(n, 0.5f), g = random_floats(6, 1000, -0.1f, 0.1f);
  // The CPU's results.
  std::vector<float> dx(n * in), dw(out * in), dxn(n * in, 0.0f), dnorm(in, 0.0f), dlogits(n * n_vocab), loss(1), sumsq(1);
  std::vector<float> p = random_floats(7, 1000), m(1000, 0.0f), v(1000, 0.0f);
  const AdamWStep step = adamw_scalars(1, 1e-3, 0.9, 0.999, 1e-8, 0.1);
  matmul_nt_backward(cpu, x.data(), n, w, dy.data(), dx.data(), dw.data(), nullptr, nullptr, GradWrite::kOverwrite, GradWrite::kOverwrite);
  rms_norm_backward(cpu, x.data(), norm_w.data(), dx.data(), n, in, 1e-6f, dxn.data(), dnorm.data());
  cross_entropy_rows(cpu, logits.data(), targets.data(), loss_weights.data(), n, n_vocab, dlogits.data(), nullptr, loss.data());
  squared_norm(cpu, g.data(), 1000, sumsq.data());
  adamw_update(cpu, step, p.data(), g.data(), m.data(), v.data(), 1000, sumsq.data(), 0.5f);
  // The device's, one forward.
  std::vector<float> got_dx(dx.size()), got_dw(dw.size()), got_dxn(dxn.size()), got_dnorm(in), got_dlogits(dlogits.size()), got_loss(1);
  std::vector<float> got_p(p.size()), got_m(m.size()), got_v(v.size());
  const auto lock = b.lock();
  ASSERT_TRUE(b.begin().ok());
  DeviceVectors d{b, {}};
  float* d_x = d.in(x);
  float* d_dy = d.in(dy);
  float* d_dx = device_floats(dev, "dx", n * in);
  float* d_dw = device_floats(dev, "dw", out * in);
  float* d_dxn = d.in(std::vector<float>(n * in, 0.0f));
  float* d_dnorm = d.in(std::vector<float>(in, 0.0f));
  float* d_logits = d.in(logits);
  float* d_loss = device_floats(dev, "loss", 1);
  float* d_sumsq = device_floats(dev, "sumsq", 1);
  float* d_g = d.in(g);
  float* d_p = d.in(random_floats(7, 1000));
  float* d_m = d.in(std::vector<float>(1000, 0.0f));
  float* d_v = d.in(std::vector<float>(1000, 0.0f));
  const int32_t* d_targets = d.in(targets);
  const float* d_weights = d.in(loss_weights);
  ASSERT_TRUE(device_status(dev).ok()) << device_status(dev).to_string();
  matmul_nt_backward(dev, d_x, n, w, d_dy, d_dx, d_dw, nullptr, nullptr, GradWrite::kOverwrite, GradWrite::kOverwrite);
  rms_norm_backward(dev, d_x, norm_w.data(), d_dx, n, in, 1e-6f, d_dxn, d_dnorm);
  cross_entropy_rows(dev, d_logits, d_targets, d_weights, n, n_vocab, d_logits, nullptr, d_loss);
  squared_norm(dev, d_g, 1000, d_sumsq);
  adamw_update(dev, step, d_p, d_g, d_m, d_v, 1000, d_sumsq, 0.5f);
  d.out(d_dx, got_dx), d.out(d_dw, got_dw), d.out(d_dxn, got_dxn), d.out(d_dnorm, got_dnorm), d.out(d_logits, got_dlogits);
  d.out(d_loss, got_loss), d.out(d_p, got_p), d.out(d_m, got_m), d.out(d_v, got_v);
  const Status s = b.finish();
  ASSERT_TRUE(s.ok()) << s.to_string();
  expect_close(dx, got_dx, 1e-5, "dx");
  expect_close(dw, got_dw, 1e-5, "dw");
  expect_close(dxn, got_dxn, 1e-5, "rms_norm dx");
  expect_close(dnorm, got_dnorm, 1e-5, "rms_norm dw");
  expect_close(dlogits, got_dlogits, 1e-5, "dlogits");
  EXPECT_NEAR(got_loss[0], loss[0], 1e-5 * std::abs(loss[0]));
  expect_close(p, got_p, 1e-6, "p");
  expect_close(m, got_m, 1e-6, "m");
  expect_close(v, got_v, 1e-6, "v");
}

// A kernel's scratch (rms_norm_backward's r per row, a named forward buffer) asked for again in the same
// forward with more rows grows while the first call's command still binds the smaller one: both run right.
TEST_F(VulkanTrainingOps, ScratchGrownWithinAForwardKeepsItsFirstUse) {
  DeviceBackend& b = *backend_;
  const Context& dev = dev_;
  const int64_t d = 40;
  const std::vector<float> w = random_floats(1, d, 0.5f, 1.5f);
  ASSERT_TRUE(b.add_vector(w.data(), d, "norm").ok());
  const auto lock = b.lock();
  std::vector<std::vector<float>> want, got;
  ASSERT_TRUE(b.begin().ok());
  DeviceVectors dv{b, {}};
  for (const int64_t n : {2, 300}) {  // the lm_head's rows, then every position's
    const std::vector<float> x = random_floats(n, n * d), dy = random_floats(n + 1, n * d);
    want.emplace_back(n * d, 0.0f), got.emplace_back(n * d);
    rms_norm_backward(Context{}, x.data(), w.data(), dy.data(), n, d, 1e-6f, want.back().data(), nullptr);
    float* dx = dv.in(std::vector<float>(n * d, 0.0f));
    rms_norm_backward(dev, dv.in(x), w.data(), dv.in(dy), n, d, 1e-6f, dx, nullptr);
    dv.out(dx, got.back());
  }
  const Status s = b.finish();
  ASSERT_TRUE(s.ok()) << s.to_string();
  for (size_t i = 0; i < want.size(); ++i) expect_close(want[i], got[i], 1e-5, "call " + std::to_string(i));
}

// copy_floats and zero_fill on the device (the training forward's saved activations, the backward's zeroed
// accumulators): the copy is bit for bit, denormals, −0 and NaN payloads included; the fill writes +0 over
// every value of the count and nothing past it.
TEST_F(VulkanTrainingOps, CopyIsBitExactAndZeroFillZeroes) {
  DeviceBackend& b = *backend_;
  const Context& dev = dev_;
  const int64_t n = 1000;
  std::vector<float> x = random_floats(9, n);
  const uint32_t odd[] = {0x00000001u, 0x80000000u, 0x7fc01234u, 0xffbfffffu, 0x007fffffu};  // denormals, −0, NaNs
  for (size_t i = 0; i < std::size(odd); ++i) std::memcpy(&x[i * 7], &odd[i], 4);
  const std::vector<float> ones(n, 1.0f);
  std::vector<float> copied(n), zeroed(n);
  const auto lock = b.lock();
  ASSERT_TRUE(b.begin().ok());
  DeviceVectors d{b, {}};
  float* d_x = d.in(x);
  float* d_y = device_floats(dev, "y", n);
  float* d_z = d.in(ones);
  copy_floats(dev, d_x, n, d_y);
  zero_fill(dev, d_z, n - 3);
  d.out(d_y, copied), d.out(d_z, zeroed);
  const Status s = b.finish();
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(0, std::memcmp(x.data(), copied.data(), n * sizeof(float)));
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, &zeroed[i], 4);
    ASSERT_EQ(bits, i < n - 3 ? 0u : 0x3f800000u) << "index " << i;
  }
}

// Hashed dropout on the device draws the CPU's mask and writes the CPU's values bit for bit (the 64-bit hash in
// 32-bit words, the threshold compare, one multiply), for seeds with their high words set, drop probabilities from
// 0.05 to 0.9, a row count and a width that are not multiples of the workgroup, in place and not.
TEST_F(VulkanTrainingOps, DropoutIsTheCpusBitForBit) {
  DeviceBackend& b = *backend_;
  const Context& dev = dev_;
  const int64_t n = 37, d = 301;
  const std::vector<float> x = random_floats(11, n * d);
  struct Case { uint64_t seed; float p; };
  const Case cases[] = {{0, 0.05f}, {0x9E3779B97F4A7C15ull, 0.3f}, {0xFFFFFFFF00000001ull, 0.5f}, {12345, 0.9f}};
  std::vector<std::vector<float>> want, got;
  const auto lock = b.lock();
  ASSERT_TRUE(b.begin().ok());
  DeviceVectors dv{b, {}};
  for (const Case& c : cases) {
    want.emplace_back(n * d), got.emplace_back(n * d), got.emplace_back(n * d);
    dropout_hashed(Context{}, x.data(), n, d, c.seed, c.p, want.back().data());
    float* d_x = dv.in(x);
    float* d_y = device_floats(dev, ("dropout.y" + std::to_string(want.size())).c_str(), n * d);
    ASSERT_TRUE(device_status(dev).ok()) << device_status(dev).to_string();
    dropout_hashed(dev, d_x, n, d, c.seed, c.p, d_y);
    dropout_hashed(dev, d_x, n, d, c.seed, c.p, d_x);  // in place
    dv.out(d_y, got[got.size() - 2]), dv.out(d_x, got.back());
  }
  const Status s = b.finish();
  ASSERT_TRUE(s.ok()) << s.to_string();
  for (size_t k = 0; k < want.size(); ++k) {
    int64_t kept = 0;
    for (const float v : want[k]) kept += v != 0.0f;
    const double fraction = static_cast<double>(kept) / static_cast<double>(n * d), p = cases[k].p;
    EXPECT_NEAR(fraction, 1.0 - p, 4.0 * std::sqrt(p * (1.0 - p) / static_cast<double>(n * d))) << "case " << k;
    EXPECT_EQ(0, std::memcmp(want[k].data(), got[2 * k].data(), want[k].size() * sizeof(float))) << "case " << k;
    EXPECT_EQ(0, std::memcmp(want[k].data(), got[2 * k + 1].data(), want[k].size() * sizeof(float))) << "case " << k << " in place";
  }
}

// copy_floats between rows inside buffers (a chunk of a trainer's loss rows: its operands offset into the rows'
// buffers): x[100, 400) lands at y[50, 350), bit for bit, and the rest of y stays; a copy past the end of a buffer
// is refused with its sizes.
TEST_F(VulkanTrainingOps, CopyTakesOperandsInsideBuffers) {
  DeviceBackend& b = *backend_;
  const Context& dev = dev_;
  const int64_t n = 1000;
  const std::vector<float> x = random_floats(10, n), ones(n, 1.0f);
  std::vector<float> got(n);
  {
    const auto lock = b.lock();
    ASSERT_TRUE(b.begin().ok());
    DeviceVectors d{b, {}};
    float* d_x = d.in(x);
    float* d_y = d.in(ones);
    copy_floats(dev, d_x + 100, 300, d_y + 50);
    d.out(d_y, got);
    const Status s = b.finish();
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  EXPECT_EQ(0, std::memcmp(x.data() + 100, got.data() + 50, 300 * sizeof(float)));
  for (int64_t i = 0; i < n; ++i) {
    if (i < 50 || i >= 350) {
      ASSERT_EQ(got[i], 1.0f) << "index " << i << " outside the copy was written";
    }
  }
  const auto lock = b.lock();
  ASSERT_TRUE(b.begin().ok());
  DeviceVectors d{b, {}};
  float* d_x = d.in(x);
  float* d_y = d.in(ones);
  copy_floats(dev, d_x + 900, 200, d_y);
  const Status s = b.finish();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("x [x_offset + count]"), std::string::npos) << s.to_string();
}

}  // namespace
}  // namespace dc
