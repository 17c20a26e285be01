// Each Vulkan training kernel (ops/vulkan/backward_kernels.h) against the CPU's reference backward
// (Context::reference_kernels) on device 0 (lavapipe in CI), on shapes whose rows, columns and k are not
// multiples of the tiles. Tolerances relative to the largest reference value: 1e-5 for the products and
// reductions (f32, another summation order), 1e-6 for the element-wise ops and AdamW.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernel_test_util.h"
#include "ops/adamw.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/loss.h"
#include "ops/matmul.h"
#include "ops/vulkan/backward_kernels.h"
#include "vulkan_test_util.h"

namespace dc {
namespace {

using testing::cpu_reference;
using testing::expect_close;
using testing::make_weight;
using testing::TestWeight;
using testing::ok_or_throw;
using testing::random_floats;
using testing::vulkan_runtime;

std::vector<float> read_floats(const vk::Buffer& b, size_t n) { return ok_or_throw(vulkan_runtime().read<float>(b, static_cast<int64_t>(n))); }
vk::Buffer floats_on_device(const std::vector<float>& v, const char* what) { return ok_or_throw(vulkan_runtime().make_buffer(v, what)); }

// Records `record` into a fresh sequence and runs it.
template <typename F>
void run_on_device(F record) {
  auto seq = ok_or_throw(vulkan_runtime().new_sequence());
  ok_or_throw(record(seq));
  ok_or_throw(seq.run());
}

// dx = dy·W over every weight kind, dW = dyᵀ·x and dbias (dense W only: a quantized one is a frozen base's),
// each written and added, against the CPU's matmul_nt_backward: 67 × 42 W (tails of the 64-tiles and the
// 16-k steps; q4 groups of 14 columns), n 1, 9 and 70.
TEST(VulkanBackwardKernels, MatmulBackwardAgainstTheCpu) {
  vk::Runtime& rt = vulkan_runtime();
  const int64_t out = 67, in = 42;
  for (const std::string kind : {"f32", "f16", "bf16", "q8", "q4"}) {
    const TestWeight w = make_weight(kind, out, in, 14, 5);
    const bool dense = !w.view.quantized();
    const vk::DeviceMatrix w_device = ok_or_throw(vk::upload_matrix(rt, w.host, kind));
    for (int64_t n : {1, 9, 70}) {
      for (const GradWrite write : {GradWrite::kOverwrite, GradWrite::kAdd}) {
        const bool add = write == GradWrite::kAdd;
        const std::vector<float> x = random_floats(10 + n, static_cast<size_t>(n * in)), dy = random_floats(20 + n, static_cast<size_t>(n * out));
        std::vector<float> dx = random_floats(30, static_cast<size_t>(n * in)), dw = random_floats(31, static_cast<size_t>(out * in));
        std::vector<float> dbias = random_floats(32, static_cast<size_t>(out));
        const vk::Buffer d_x = floats_on_device(x, "x"), d_dy = floats_on_device(dy, "dy");
        vk::Buffer d_dx = floats_on_device(dx, "dx"), d_dw = floats_on_device(dw, "dw"), d_db = floats_on_device(dbias, "dbias");
        matmul_nt_backward(cpu_reference(), x.data(), n, w.view, dy.data(), dx.data(), dense ? dw.data() : nullptr, dbias.data(), nullptr,
                           write, write);
        run_on_device([&](vk::Sequence& s) {
          return vk::matmul_nt_backward(s, d_x, n, w_device, d_dy, &d_dx, dense ? &d_dw : nullptr, &d_db, add, add);
        });
        const std::string what = kind + " n=" + std::to_string(n) + (add ? " add" : " overwrite");
        expect_close(dx, read_floats(d_dx, dx.size()), 1e-5, "dx " + what);
        if (dense) expect_close(dw, read_floats(d_dw, dw.size()), 1e-5, "dw " + what);
        expect_close(dbias, read_floats(d_db, dbias.size()), 1e-5, "dbias " + what);
      }
    }
  }
}

TEST(VulkanBackwardKernels, MatmulBackwardChecksShapes) {
  vk::Runtime& rt = vulkan_runtime();
  const std::vector<float> values = random_floats(5, 6);
  const vk::DeviceMatrix w = ok_or_throw(vk::upload_matrix(rt, {DType::kF32, WeightQuant::kNone, 2, 3, 0, values.data(), nullptr, nullptr}, "w"));
  const vk::Buffer x = floats_on_device(random_floats(1, 3), "x"), dy = floats_on_device(random_floats(2, 2), "dy");
  vk::Buffer small = floats_on_device(random_floats(3, 2), "dw");
  auto seq = ok_or_throw(rt.new_sequence());
  const Status s = vk::matmul_nt_backward(seq, x, 1, w, dy, nullptr, &small, nullptr, false, false);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.to_string().find("dw [rows, cols]"), std::string::npos) << s.to_string();
  const TestWeight q8 = make_weight("q8", 2, 3, 0, 1);  // a quantized weight has no gradient to write
  const vk::DeviceMatrix q8_device = ok_or_throw(vk::upload_matrix(rt, q8.host, "q8"));
  vk::Buffer dw = floats_on_device(random_floats(4, 6), "dw");
  const Status q = vk::matmul_nt_backward(seq, x, 1, q8_device, dy, nullptr, &dw, nullptr, false, false);
  EXPECT_EQ(q.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(q.message().find("quantized weight has no gradient"), std::string::npos) << q.message();
}

TEST(VulkanBackwardKernels, RmsNormBackwardAgainstTheCpu) {
  for (const int64_t d : {48, 300}) {  // one pass of 128 invocations, and several with a tail
    const int64_t n = 13;
    const std::vector<float> x = random_floats(1, static_cast<size_t>(n * d)), w = random_floats(2, static_cast<size_t>(d), 0.5f, 1.5f);
    const std::vector<float> dy = random_floats(3, static_cast<size_t>(n * d));
    std::vector<float> dx = random_floats(4, static_cast<size_t>(n * d)), dw = random_floats(5, static_cast<size_t>(d));
    const vk::Buffer d_x = floats_on_device(x, "x"), d_w = floats_on_device(w, "w"), d_dy = floats_on_device(dy, "dy");
    vk::Buffer d_dx = floats_on_device(dx, "dx"), d_dw = floats_on_device(dw, "dw");
    vk::Buffer rstd = ok_or_throw(vulkan_runtime().alloc(n * 4, "rstd"));
    rms_norm_backward(cpu_reference(), x.data(), w.data(), dy.data(), n, d, 1e-6f, dx.data(), dw.data());
    run_on_device([&](vk::Sequence& s) { return vk::rms_norm_backward(s, d_x, d_w, d_dy, n, d, 1e-6f, &d_dx, &d_dw, rstd); });
    expect_close(dx, read_floats(d_dx, dx.size()), 1e-5, "dx d=" + std::to_string(d));
    expect_close(dw, read_floats(d_dw, dw.size()), 1e-5, "dw d=" + std::to_string(d));
    // dw alone (no dx: the row pass writes only r)
    rms_norm_backward(cpu_reference(), x.data(), w.data(), dy.data(), n, d, 1e-6f, nullptr, dw.data());
    run_on_device([&](vk::Sequence& s) { return vk::rms_norm_backward(s, d_x, d_w, d_dy, n, d, 1e-6f, nullptr, &d_dw, rstd); });
    expect_close(dw, read_floats(d_dw, dw.size()), 1e-5, "dw alone d=" + std::to_string(d));
  }
}

TEST(VulkanBackwardKernels, RopeSwigluAndEmbeddingBackwardAgainstTheCpu) {
  const int64_t n = 7, heads = 3, head_dim = 16, half = head_dim / 2;
  std::vector<int32_t> positions(n);
  for (int64_t i = 0; i < n; ++i) positions[static_cast<size_t>(i)] = static_cast<int32_t>(3 * i + 1);
  std::vector<float> cos(static_cast<size_t>(n * half)), sin(cos.size());
  rope_tables(positions.data(), n, head_dim, 10000.0, cos.data(), sin.data());
  std::vector<float> dq = random_floats(1, static_cast<size_t>(n * heads * head_dim));
  vk::Buffer d_dq = floats_on_device(dq, "dq");
  const vk::Buffer d_cos = floats_on_device(cos, "cos"), d_sin = floats_on_device(sin, "sin");
  rope_backward(cpu_reference(), dq.data(), n, heads, head_dim, cos.data(), sin.data());
  run_on_device([&](vk::Sequence& s) { return vk::rope_apply(s, d_dq, n, heads, head_dim, d_cos, d_sin, /*inverse=*/true); });
  expect_close(dq, read_floats(d_dq, dq.size()), 1e-6, "rope_backward");

  const int64_t count = 1000;  // swiglu_backward with dgate written over dout, as the model's backward calls it
  const std::vector<float> gate = random_floats(2, count, -4, 4), up = random_floats(3, count);
  std::vector<float> dout = random_floats(4, count), dup(count);
  const vk::Buffer d_gate = floats_on_device(gate, "gate"), d_up = floats_on_device(up, "up");
  vk::Buffer d_dout = floats_on_device(dout, "dout"), d_dup = ok_or_throw(vulkan_runtime().alloc(count * 4, "dup"));
  swiglu_backward(cpu_reference(), gate.data(), up.data(), dout.data(), count, dout.data(), dup.data());
  run_on_device([&](vk::Sequence& s) { return vk::swiglu_backward(s, d_gate, d_up, d_dout, count, d_dout, d_dup); });
  expect_close(dout, read_floats(d_dout, dout.size()), 1e-6, "swiglu_backward dgate");
  expect_close(dup, read_floats(d_dup, dup.size()), 1e-6, "swiglu_backward dup");
  // scale_floats in place (a LoRA adapter's scale: model/lora_project.cc), count not a multiple of 256.
  std::vector<float> scaled = up;
  scale_floats(cpu_reference(), scaled.data(), count, 0.37f, scaled.data());
  vk::Buffer d_scaled = floats_on_device(up, "scaled");
  run_on_device([&](vk::Sequence& s) { return vk::scale(s, d_scaled, count, 0.37f, d_scaled); });
  expect_close(scaled, read_floats(d_scaled, scaled.size()), 1e-6, "scale");

  const int64_t rows = 11, cols = 300, ids_n = 9;  // repeated ids add in order
  const std::vector<int32_t> ids{3, 0, 3, 10, 7, 3, 0, 5, 10};
  const std::vector<float> dy = random_floats(5, static_cast<size_t>(ids_n * cols));
  std::vector<float> table = random_floats(6, static_cast<size_t>(rows * cols));
  const vk::Buffer d_ids = ok_or_throw(vulkan_runtime().make_buffer(ids, "ids")), d_dy = floats_on_device(dy, "dy");
  vk::Buffer d_table = floats_on_device(table, "dtable");
  embedding_backward(cpu_reference(), ids.data(), ids_n, dy.data(), cols, table.data());
  run_on_device([&](vk::Sequence& s) { return vk::embedding_backward(s, d_ids, ids_n, d_dy, cols, d_table); });
  expect_close(table, read_floats(d_table, table.size()), 1e-6, "embedding_backward");
}

// MHA and GQA, head dims 16 and 64, 21 positions, a left-padded row (its first 6 positions invalid).
TEST(VulkanBackwardKernels, AttentionBackwardAgainstTheCpu) {
  struct Case { int64_t n_head, n_head_kv, head_dim; };
  for (const Case c : {Case{2, 2, 16}, Case{4, 2, 16}, Case{3, 1, 64}}) {
    const AttentionShape shape{2, 21, c.n_head, c.n_head_kv, c.head_dim};
    const int64_t B = shape.n_batch, L = shape.n_seq, D = c.head_dim, nq = B * L * c.n_head * D, nkv = B * L * c.n_head_kv * D;
    const std::vector<float> q = random_floats(D, static_cast<size_t>(nq), -2, 2), k = random_floats(D + 1, static_cast<size_t>(nkv), -2, 2);
    const std::vector<float> v = random_floats(D + 2, static_cast<size_t>(nkv)), dout = random_floats(D + 3, static_cast<size_t>(nq));
    std::vector<uint8_t> valid(static_cast<size_t>(B * L + 3) / 4 * 4, 1);
    for (int j = 0; j < 6; ++j) valid[static_cast<size_t>(L + j)] = 0;
    std::vector<float> out(static_cast<size_t>(nq)), dq(out.size()), dk(static_cast<size_t>(nkv)), dv(dk.size());
    attention(cpu_reference(), shape, q.data(), k.data(), v.data(), valid.data(), out.data());
    attention_backward(cpu_reference(), shape, q.data(), k.data(), v.data(), valid.data(), out.data(), dout.data(), dq.data(), dk.data(), dv.data());
    vk::Runtime& rt = vulkan_runtime();
    const vk::Buffer d_q = floats_on_device(q, "q"), d_k = floats_on_device(k, "k"), d_v = floats_on_device(v, "v");
    const vk::Buffer d_out = floats_on_device(out, "out"), d_dout = floats_on_device(dout, "dout");
    const vk::Buffer d_valid = ok_or_throw(rt.make_buffer(valid, "valid"));
    vk::Buffer d_dq = ok_or_throw(rt.alloc(nq * 4, "dq")), d_dk = ok_or_throw(rt.alloc(nkv * 4, "dk")), d_dv = ok_or_throw(rt.alloc(nkv * 4, "dv"));
    vk::Buffer stats = ok_or_throw(rt.alloc(B * L * c.n_head * 3 * 4, "stats"));
    run_on_device([&](vk::Sequence& s) {
      return vk::attention_backward(s, {B, L, c.n_head, c.n_head_kv, D}, d_q, d_k, d_v, &d_valid, d_out, d_dout, d_dq, d_dk, d_dv, stats);
    });
    const std::string what = "H=" + std::to_string(c.n_head) + " Hkv=" + std::to_string(c.n_head_kv) + " D=" + std::to_string(D);
    expect_close(dq, read_floats(d_dq, dq.size()), 1e-5, "dq " + what);
    expect_close(dk, read_floats(d_dk, dk.size()), 1e-5, "dk " + what);
    expect_close(dv, read_floats(d_dv, dv.size()), 1e-5, "dv " + what);
    const std::vector<float> got_dk = read_floats(d_dk, dk.size());
    for (int64_t e = 0; e < 6 * c.n_head_kv * D; ++e) ASSERT_EQ(got_dk[static_cast<size_t>(L * c.n_head_kv * D + e)], 0.0f) << "padded key " << what;
  }
}

// The loss rows' cross-entropy and its gradient (written over the logits, as the trainer does), and the
// loss Σ weights·CE summed on the device, against the CPU's.
TEST(VulkanBackwardKernels, CrossEntropyAgainstTheCpu) {
  vk::Runtime& rt = vulkan_runtime();
  const int64_t n = 5, n_vocab = 1003;
  const std::vector<float> logits = random_floats(1, static_cast<size_t>(n * n_vocab), -8, 8), weights{0.5f, 1, 0, 2, 0.25f};
  const std::vector<int32_t> targets{0, 1002, 17, 500, 17};
  std::vector<float> dlogits(logits.size()), ce(n);
  const double loss = cross_entropy(cpu_reference(), logits.data(), targets.data(), weights.data(), n, n_vocab, dlogits.data(), ce.data());
  vk::Buffer d_logits = floats_on_device(logits, "logits"), d_ce = ok_or_throw(rt.alloc(n * 4, "ce")), d_wce = ok_or_throw(rt.alloc(n * 4, "wce"));
  const vk::Buffer d_targets = ok_or_throw(rt.make_buffer(targets, "targets")), d_weights = floats_on_device(weights, "weights");
  vk::Buffer partials = ok_or_throw(rt.alloc(4, "partials")), d_loss = ok_or_throw(rt.alloc(4, "loss"));
  run_on_device([&](vk::Sequence& s) -> Status {
    DC_RETURN_IF_ERROR(vk::cross_entropy(s, d_logits, d_targets, d_weights, n, n_vocab, &d_logits, &d_ce, d_wce));
    return vk::reduce_sum(s, d_wce, 0, n, /*squares=*/false, partials, d_loss);
  });
  expect_close(dlogits, read_floats(d_logits, dlogits.size()), 1e-5, "dlogits");
  expect_close(ce, read_floats(d_ce, ce.size()), 1e-5, "ce");
  EXPECT_NEAR(read_floats(d_loss, 1)[0], loss, 1e-5 * std::abs(loss));
}

// Σ g² over more than one chunk of the first pass (a second pass adds the partials) into an index of its output,
// then AdamW with and without clipping (no sum; a sum with max_norm 0; clipped), against adamw_value and the
// norm's clip_coefficient, and a non-finite sum's skip (nothing written).
TEST(VulkanBackwardKernels, GradientNormAndAdamwAgainstTheCpu) {
  vk::Runtime& rt = vulkan_runtime();
  const int64_t n = 150001;  // 3 chunks of 64 Ki, the last partial
  const std::vector<float> g = random_floats(1, n, -0.01f, 0.01f);
  double sum = 0;
  for (float x : g) sum += static_cast<double>(x) * x;
  const vk::Buffer d_g = floats_on_device(g, "g");
  vk::Buffer partials = ok_or_throw(rt.alloc(vk::reduce_partials(n) * 4, "partials")), sumsq = ok_or_throw(rt.alloc(4, "sumsq"));
  vk::Buffer sums = floats_on_device({-1.0f, -1.0f, -1.0f}, "sums");
  run_on_device([&](vk::Sequence& s) { return vk::reduce_sum(s, d_g, 0, n, /*squares=*/true, partials, sums, 2); });
  const std::vector<float> got_sums = read_floats(sums, 3);
  EXPECT_NEAR(got_sums[2], sum, 1e-6 * sum);
  EXPECT_EQ(got_sums[0], -1.0f) << "reduce_sum wrote outside out[out_index]";
  EXPECT_EQ(got_sums[1], -1.0f) << "reduce_sum wrote outside out[out_index]";
  run_on_device([&](vk::Sequence& s) { return vk::reduce_sum(s, sums, 1, 2, /*squares=*/false, partials, sumsq); });
  EXPECT_NEAR(read_floats(sumsq, 1)[0], sum - 1, 1e-6 * sum);
  run_on_device([&](vk::Sequence& s) { return vk::reduce_sum(s, d_g, 0, n, /*squares=*/true, partials, sumsq); });
  EXPECT_NEAR(read_floats(sumsq, 1)[0], sum, 1e-6 * sum);
  // -1: no sum (grad_scale 1); 0: the sum without clipping; 0.1: clipped (the norm is ~2.2).
  for (const double max_norm : {-1.0, 0.0, 0.1}) {
    const double norm = std::sqrt(sum);
    const float coef = max_norm > 0 && max_norm / (norm + 1e-6) < 1 ? static_cast<float>(max_norm / (norm + 1e-6)) : 1.0f;
    const AdamWStep step = adamw_scalars(3, 1e-3, 0.9, 0.999, 1e-8, 0.01, coef);
    std::vector<float> p = random_floats(2, n), m = random_floats(3, n, -0.001f, 0.001f), v = random_floats(4, n, 0, 1e-5f);
    vk::Buffer d_p = floats_on_device(p, "p"), d_m = floats_on_device(m, "m"), d_v = floats_on_device(v, "v");
    for (int64_t i = 0; i < n; ++i) adamw_value(step, p[i], g[i], m[i], v[i]);
    vk::AdamWScalars s{step.decay, step.b1, step.b2, step.one_b1, step.one_b2, step.step_size, step.bc2_sqrt, step.eps, 1.0f};
    run_on_device([&](vk::Sequence& seq) {
      return vk::adamw_update(seq, s, d_p, d_g, d_m, d_v, n, max_norm >= 0 ? &sumsq : nullptr, static_cast<float>(max_norm));
    });
    const std::string what = " max_norm " + std::to_string(max_norm);
    expect_close(p, read_floats(d_p, p.size()), 1e-6, "p" + what);
    expect_close(m, read_floats(d_m, m.size()), 1e-6, "m" + what);
    expect_close(v, read_floats(d_v, v.size()), 1e-6, "v" + what);
  }
  for (const float bad : {NAN, INFINITY}) {
    const std::vector<float> p = random_floats(2, n), m = random_floats(3, n, -0.001f, 0.001f), v = random_floats(4, n, 0, 1e-5f);
    vk::Buffer d_p = floats_on_device(p, "p"), d_m = floats_on_device(m, "m"), d_v = floats_on_device(v, "v");
    const vk::Buffer d_bad = floats_on_device({bad}, "sumsq");
    const AdamWStep step = adamw_scalars(3, 1e-3, 0.9, 0.999, 1e-8, 0.01);
    vk::AdamWScalars s{step.decay, step.b1, step.b2, step.one_b1, step.one_b2, step.step_size, step.bc2_sqrt, step.eps, 1.0f};
    run_on_device([&](vk::Sequence& seq) { return vk::adamw_update(seq, s, d_p, d_g, d_m, d_v, n, &d_bad, 0.1f); });
    EXPECT_TRUE(read_floats(d_p, p.size()) == p && read_floats(d_m, m.size()) == m && read_floats(d_v, v.size()) == v)
        << "a step with Σ g² = " << bad << " was applied";
  }
}

}  // namespace
}  // namespace dc
