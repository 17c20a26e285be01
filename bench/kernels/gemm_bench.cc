// gemm_bench: GFLOP/s of matmul_nt (y[n, m] = x[n, k] · Wᵀ, W bf16 [m, k]) for the reference kernel, the
// fast kernel in f32 and bf16 activation precision, and oneDNN (when built with it; run with
// OMP_WAIT_POLICY=passive so its spinning OpenMP threads do not slow the other columns), at the
// Qwen2.5-0.5B and 7B projection shapes and n in {1, 32, 128, 320, 512}; each rate is the best of runs.
// Usage: gemm_bench [--threads N] [--model 0.5b|7b|all] [--n 1,32,...] [--only NAME] [--no-reference]
//                   [--time S] [--cpu-time] [--attention] [--cold] [--dw] [--dx] [--f16]
// --cold: weights cycled through 256 MB of copies, so they come from memory as in a real forward.
// --attention: the attention op instead (reference vs fast, GFLOP/s).
// --dw: the backward's dW = dyᵀ·x (bf16 operands, f32 sums) at the same shapes with n tokens, side by
// side: through transposed copies (dy → dyᵀ f32, x → xᵀ bf16, then matmul_nt_add: the previous path)
// and matmul_tn_add reading dy and x in place, and matmul_tn overwriting dW (a step's first micro-batch);
// with --cold, dW is cycled through 256 MB of copies, as the gradients come from memory in a step.
// --dx: the backward's dx = dy·W (W bf16 [m, k], dy [n, m]) side by side: from a second copy, Wᵀ in kPanels
// read in place, and from the forward's one copy of W viewed as Wᵀ (kPanelsTransposed, re-paired per block
// as the kernel packs it); with --cold the copies are cycled through 256 MB, as the weights come from
// memory in a step.
// --f16: two more columns, the same weights stored as f16 (an F16 checkpoint or GGUF) at f32 precision
// (widened per packed block, f32 FMAs) and at bf16 precision (split into bf16 hi + lo panels, pack_f16.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/context.h"
#include "ops/attention.h"
#include "ops/cpu/backward_kernels.h"
#include "ops/matmul.h"
#include "ops/peak.h"

#ifdef DC_BENCH_WITH_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace {

struct Shape {
  const char* model;
  const char* name;
  int64_t m, k;  // W [m, k]
};

constexpr Shape kShapes[] = {
    {"0.5b", "q/o   896x896", 896, 896},     {"0.5b", "k/v   128x896", 128, 896},
    {"0.5b", "gate 4864x896", 4864, 896},    {"0.5b", "down 896x4864", 896, 4864},
    {"0.5b", "lm 151936x896", 151936, 896},  {"7b", "q/o 3584x3584", 3584, 3584},
    {"7b", "k/v  512x3584", 512, 3584},      {"7b", "gate 18944x3584", 18944, 3584},
    {"7b", "down 3584x18944", 3584, 18944},  {"7b", "lm 151936x3584", 151936, 3584},
};

// --cpu-time: time calls by the process's CPU time divided by the thread count instead of the wall
// clock; on a machine shared with other jobs this removes the time the threads were descheduled (idle
// pool threads accrue no CPU time, so load imbalance is hidden: use it for kernel tuning only).
bool g_cpu_time = false;
int g_threads = 1;

double now_seconds() {
  if (!g_cpu_time)
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (ts.tv_sec + 1e-9 * ts.tv_nsec) / g_threads;
}

// Best seconds per call of fn over runs lasting at least min_time in total (at least 2 runs, 1 if slow).
double best_seconds(const std::function<void()>& fn, double min_time) {
  double best = 1e30, total = 0;
  for (int rep = 0; rep < 1000; ++rep) {
    const double t0 = now_seconds();
    fn();
    const double s = now_seconds() - t0;
    best = std::min(best, s);
    total += s;
    if ((rep >= 1 && total >= min_time) || total > 5 * min_time + 2) break;
  }
  return best;
}

#ifdef DC_BENCH_WITH_DNNL
// oneDNN matmul, x f32 reordered to bf16 per call (timed), f32 output. prepacked = false: W bf16 [m, k]
// read in place as a [k, m] matrix with strides (1, k), as the engine stores it. prepacked = true:
// W reordered once (untimed) into the layout oneDNN picks: its best case, at the price of a copy.
struct DnnlMatmul {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  dnnl::memory x_f32, x_bf16, y;
  std::vector<dnnl::memory> w;  // one per copy of W (--cold), used in turn
  size_t call = 0;
  dnnl::reorder to_bf16;
  dnnl::matmul mm;
  DnnlMatmul(float* x, int64_t n, const uint16_t* wdata, int64_t copies, int64_t m, int64_t k, float* out,
             bool prepacked) {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    dnnl::memory::desc xd({n, k}, dt::f32, tag::ab), xbd({n, k}, dt::bf16, tag::ab);
    dnnl::memory::desc wd({k, m}, dt::bf16, dnnl::memory::dims{1, k}), yd({n, m}, dt::f32, tag::ab);
    dnnl::memory::desc w_any({k, m}, dt::bf16, tag::any);
    x_f32 = dnnl::memory(xd, eng, x);
    x_bf16 = dnnl::memory(xbd, eng);
    y = dnnl::memory(yd, eng, out);
    to_bf16 = dnnl::reorder(x_f32, x_bf16);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(xbd, prepacked ? w_any : wd, yd), eng);
    mm = dnnl::matmul(pd);
    for (int64_t c = 0; c < copies; ++c) {
      dnnl::memory w_user(wd, eng, const_cast<uint16_t*>(wdata + c * m * k));
      if (!prepacked) {
        w.push_back(w_user);
        continue;
      }
      w.emplace_back(pd.weights_desc(), eng);
      dnnl::reorder(w_user, w.back()).execute(strm, w_user, w.back());
      strm.wait();
    }
  }
  void run() {
    to_bf16.execute(strm, x_f32, x_bf16);
    mm.execute(strm, {{DNNL_ARG_SRC, x_bf16}, {DNNL_ARG_WEIGHTS, w[call++ % w.size()]}, {DNNL_ARG_DST, y}});
    strm.wait();
  }
};
#endif

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> out;
  for (const char* p = s; *p;) {
    out.push_back(std::strtoll(p, nullptr, 10));
    p = std::strchr(p, ',');
    if (!p) break;
    ++p;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0;
  std::string model = "all", only;
  std::vector<int64_t> ns = {1, 32, 128, 320, 512};
  bool reference = true, attention_only = false, cold = false, dw_only = false, dx_only = false, f16 = false;
  double min_time = 0.3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--model" && i + 1 < argc) model = argv[++i];
    else if (a == "--n" && i + 1 < argc) ns = parse_list(argv[++i]);
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else if (a == "--no-reference") reference = false;
    else if (a == "--cpu-time") g_cpu_time = true;
    else if (a == "--attention") attention_only = true;
    else if (a == "--cold") cold = true;
    else if (a == "--dw") dw_only = true;
    else if (a == "--dx") dx_only = true;
    else if (a == "--f16") f16 = true;
    else if (a == "--time" && i + 1 < argc) min_time = std::atof(argv[++i]);
    else {
      std::fprintf(stderr, "usage: gemm_bench [--threads N] [--model 0.5b|7b|all] [--n 1,32,...] [--only NAME]\n"
                           "                  [--no-reference] [--time S] [--cpu-time] [--attention] [--cold] [--dw] [--dx] [--f16]\n");
      return 2;
    }
  }
  dc::ThreadPool pool(threads);
  g_threads = pool.n_threads();
  const double peak = dc::measure_bf16_gemm_peak_gflops(&pool);
  std::printf("threads %d, measured bf16 GEMM peak %.1f GFLOP/s (best of ~1 s of runs)\n", pool.n_threads(), peak);

  std::mt19937 gen(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  if (attention_only) {
    // Bidirectional attention over one row of L positions: 4·L²·n_head·head_dim flops.
    const dc::AttentionShape shapes[] = {{1, 320, 14, 2, 64}, {1, 320, 28, 4, 128}, {1, 1024, 14, 2, 64}};
    std::printf("%-22s %9s %9s\n", "attention B,L,H/Hkv,D", "ref", "fast");
    for (const auto& a : shapes) {
      const int64_t rows = a.n_batch * a.n_seq;
      std::vector<float> q(rows * a.n_head * a.head_dim), k(rows * a.n_head_kv * a.head_dim);
      std::vector<float> v(k.size()), out(q.size());
      for (auto* vec : {&q, &k, &v})
        for (auto& e : *vec) e = dist(gen);
      const double gflop = 4.0 * a.n_batch * a.n_seq * a.n_seq * a.n_head * a.head_dim * 1e-9;
      dc::Context ref_ctx{dc::Device::kCpu, &pool};
      ref_ctx.reference_kernels = true;
      dc::Context fast_ctx{dc::Device::kCpu, &pool};
      auto rate = [&](const dc::Context& ctx) {
        auto call = [&] { dc::attention(ctx, a, q.data(), k.data(), v.data(), nullptr, out.data()); };
        return gflop / best_seconds(call, min_time);
      };
      char name[64];
      std::snprintf(name, sizeof name, "%ld,%ld,%ld/%ld,%ld", long(a.n_batch), long(a.n_seq), long(a.n_head),
                    long(a.n_head_kv), long(a.head_dim));
      std::printf("%-22s %9.1f %9.1f\n", name, reference ? rate(ref_ctx) : NAN, rate(fast_ctx));
    }
    return 0;
  }
  if (dw_only) {
    dc::Context ctx{dc::Device::kCpu, &pool};
    ctx.matmul_precision = dc::MatmulPrecision::kBF16;
    if (!dc::bf16_backward(ctx)) return std::fprintf(stderr, "gemm_bench --dw needs AVX512_BF16\n"), 1;
    std::printf("%-16s %5s %11s %9s %7s %10s   (dW = dyᵀ·x GFLOP/s, best of runs)\n", "shape [m x k]", "n",
                "transposed", "in place", "gain", "overwrite");
    for (const Shape& s : kShapes) {
      if ((model != "all" && model != s.model) || (!only.empty() && std::string(s.name).find(only) == std::string::npos))
        continue;
      for (int64_t n : ns) {
        std::vector<float> dy(n * s.m), x(n * s.k), dw(s.m * s.k, 0.0f), dyt(s.m * n);  // dyt: [m, n]
        std::vector<uint16_t> xt(s.k * n);                                                // [k, n]
        for (auto* v : {&dy, &x})
          for (auto& e : *v) e = dist(gen);
        const double gflop = 2.0 * n * s.m * s.k * 1e-9;
        const double transposed = gflop / best_seconds([&] {
          dc::cpu::transpose_fast(&pool, dy.data(), n, s.m, dyt.data());
          dc::transpose_to_bf16(ctx, dc::WeightView{dc::DType::kF32, x.data(), n, s.k}, xt.data());
          dc::matmul_nt_add(ctx, dyt.data(), s.m, dc::WeightView{dc::DType::kBF16, xt.data(), s.k, n}, dw.data());
        }, min_time);
        const int64_t copies = cold ? std::max<int64_t>(1, (256 << 20) / (s.m * s.k * 4)) : 1;
        std::vector<float> dws(s.m * s.k * copies, 0.0f);  // the dW products' outputs, cycled through
        int64_t call = 0;
        auto next_dw = [&] { return dws.data() + (call++ % copies) * s.m * s.k; };
        const double in_place =
            gflop / best_seconds([&] { dc::matmul_tn_add(ctx, dy.data(), n, s.m, x.data(), s.k, next_dw()); }, min_time);
        const double overwrite =
            gflop / best_seconds([&] { dc::matmul_tn(ctx, dy.data(), n, s.m, x.data(), s.k, next_dw()); }, min_time);
        std::printf("%-16s %5ld %11.1f %9.1f %6.2fx %10.1f\n", s.name, static_cast<long>(n), transposed, in_place,
                    in_place / transposed, overwrite);
        std::fflush(stdout);
      }
    }
    return 0;
  }
  if (dx_only) {
    dc::Context ctx{dc::Device::kCpu, &pool};
    ctx.matmul_precision = dc::MatmulPrecision::kBF16;
    if (!dc::bf16_backward(ctx)) return std::fprintf(stderr, "gemm_bench --dx needs AVX512_BF16\n"), 1;
    std::printf("%-16s %5s %11s %11s %7s   (dx = dy·W GFLOP/s, best of runs)\n", "shape [m x k]", "n", "Wᵀ copy",
                "W's panels", "ratio");
    for (const Shape& s : kShapes) {
      if ((model != "all" && model != s.model) || (!only.empty() && std::string(s.name).find(only) == std::string::npos))
        continue;
      std::vector<uint16_t> w(s.m * s.k), wt(s.k * s.m);  // W [m, k] and Wᵀ [k, m] row-major bf16
      for (int64_t i = 0; i < s.m * s.k; ++i) w[i] = dc::f32_to_bf16(dist(gen) * 0.05f);
      for (int64_t r = 0; r < s.m; ++r)
        for (int64_t c = 0; c < s.k; ++c) wt[c * s.m + r] = w[r * s.k + c];
      // Both packed copies cycled through (one per call) in 256 MB with --cold: the weights from memory.
      auto packed = [&](const dc::WeightView& rm) {
        const dc::PanelSizes sizes = dc::panel_sizes(rm);
        const int64_t words = sizes.data_bytes / 4, copies = cold ? std::max<int64_t>(1, (256 << 20) / sizes.data_bytes) : 1;
        auto buf = std::make_shared<std::vector<uint32_t>>(words * copies + 16);
        uint32_t* base = buf->data() + (64 - reinterpret_cast<uintptr_t>(buf->data()) % 64) % 64 / 4;
        std::vector<dc::WeightView> views;
        for (int64_t c = 0; c < copies; ++c)
          views.push_back(dc::pack_panels(ctx, rm, base + c * words, nullptr, nullptr, 0, sizes.panels));
        return std::make_pair(buf, views);
      };
      const auto wt_copies = packed(dc::WeightView{dc::DType::kBF16, wt.data(), s.k, s.m});
      const auto w_copies = packed(dc::WeightView{dc::DType::kBF16, w.data(), s.m, s.k});
      for (int64_t n : ns) {
        std::vector<float> dy(n * s.m), dx(n * s.k, 0.0f);
        for (auto& e : dy) e = dist(gen);
        const double gflop = 2.0 * n * s.m * s.k * 1e-9;
        int64_t call = 0;
        const double copy = gflop / best_seconds([&] {
          const auto& v = wt_copies.second;
          dc::matmul_nt_add(ctx, dy.data(), n, v[call++ % v.size()], dx.data());
        }, min_time);
        const double one = gflop / best_seconds([&] {
          const auto& v = w_copies.second;
          dc::matmul_nt_add(ctx, dy.data(), n, dc::transposed_panels(v[call++ % v.size()]), dx.data());
        }, min_time);
        std::printf("%-16s %5ld %11.1f %11.1f %6.2fx\n", s.name, static_cast<long>(n), copy, one, one / copy);
        std::fflush(stdout);
      }
    }
    return 0;
  }
  std::printf("%-16s %5s %9s %9s %9s %7s", "shape [m x k]", "n", "ref", "fast f32", "fast bf16", "bf16 %");
  if (f16) std::printf(" %9s %9s", "f16 f32", "f16 bf16");
#ifdef DC_BENCH_WITH_DNNL
  std::printf(" %9s %9s", "oneDNN", "prepacked");
#endif
  std::printf("   (GFLOP/s, best of runs)\n");
  for (const Shape& s : kShapes) {
    if (model != "all" && model != s.model) continue;
    if (!only.empty() && std::string(s.name).find(only) == std::string::npos) continue;
    // --cold: enough copies of W (cycled through, one per call) that it is never in cache, as in a
    // forward where each layer's weights come from memory.
    const int64_t copies = cold ? std::max<int64_t>(1, (256 << 20) / (s.m * s.k * 2)) : 1;
    std::vector<uint16_t> w(s.m * s.k * copies);
    for (int64_t i = 0; i < s.m * s.k; ++i) w[i] = dc::f32_to_bf16(dist(gen) * 0.05f);
    for (int64_t c = 1; c < copies; ++c) std::copy_n(w.data(), s.m * s.k, w.data() + c * s.m * s.k);
    std::vector<uint16_t> wh(f16 ? w.size() : 0);  // the same values rounded to f16
    for (size_t i = 0; i < wh.size(); ++i) wh[i] = dc::f32_to_f16(dc::bf16_to_f32(w[i]));
    int64_t call = 0;
    dc::DType dtype = dc::DType::kBF16;  // which copy the next calls read
    auto view_of_next = [&] {
      const uint16_t* base = dtype == dc::DType::kF16 ? wh.data() : w.data();
      return dc::WeightView{dtype, base + (call++ % copies) * s.m * s.k, s.m, s.k};
    };
    for (int64_t n : ns) {
      std::vector<float> x(n * s.k), y(n * s.m);
      for (auto& v : x) v = dist(gen);
      const double gflop = 2.0 * n * s.m * s.k * 1e-9;
      auto rate = [&](const dc::Context& ctx) {
        auto call = [&] { dc::matmul_nt(ctx, x.data(), n, view_of_next(), nullptr, y.data()); };
        return gflop / best_seconds(call, min_time);
      };
      dc::Context ref_ctx{dc::Device::kCpu, &pool};
      ref_ctx.reference_kernels = true;
      dc::Context f32_ctx{dc::Device::kCpu, &pool};
      dc::Context bf16_ctx{dc::Device::kCpu, &pool};
      bf16_ctx.matmul_precision = dc::MatmulPrecision::kBF16;
      const double r_ref = reference ? rate(ref_ctx) : NAN;
      const double r_f32 = rate(f32_ctx);
      const double r_bf16 = rate(bf16_ctx);
      std::printf("%-16s %5ld %9.1f %9.1f %9.1f %6.0f%%", s.name, static_cast<long>(n), r_ref, r_f32, r_bf16,
                  100 * r_bf16 / peak);
      if (f16) {
        dtype = dc::DType::kF16;
        const double r_f16_f32 = rate(f32_ctx);
        std::printf(" %9.1f %9.1f", r_f16_f32, rate(bf16_ctx));
        dtype = dc::DType::kBF16;
      }
#ifdef DC_BENCH_WITH_DNNL
      for (bool prepacked : {false, true}) {
        DnnlMatmul dnnl_mm(x.data(), n, w.data(), copies, s.m, s.k, y.data(), prepacked);
        std::printf(" %9.1f", gflop / best_seconds([&] { dnnl_mm.run(); }, min_time));
      }
#endif
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return 0;
}
