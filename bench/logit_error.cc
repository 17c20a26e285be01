// The logit error of models (GGUF files of each type, our q8 / q4 directories, ...) against a reference
// checkpoint (bf16): one forward over a random prompt followed by a canvas of mask tokens, the logits of
// every position compared with the reference's: max |Δ|, max |Δ| / max |reference logit|, RMS of Δ, and
// the greedy agreement (the share of positions whose argmax token is the reference's) over the canvas
// and over all positions (on random weights every canvas position sees the same mask token, so their
// argmaxes tend to move together). The models load one at a time (a 7B reference and a 7B GGUF are
// never in memory together). Not run by ctest.
//
//   build/bench/logit_error --reference DIR --model F.gguf [--model DIR2 ...] [--prompt-len 64]
//       [--canvas 256] [--precision f32|bf16|auto] [--threads N] [--seed 0]
// Prints one JSON line per model.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/splitmix64.h"
#include "engine/engine.h"

namespace {

using namespace dc;

struct Args {
  std::string reference;
  std::vector<std::string> models;
  int64_t prompt_len = 64, canvas = 256;
  std::string precision = "f32";
  int threads = 0;
  uint64_t seed = 0;
};

// The logits [prompt_len + canvas, n_vocab] of every position, for the model at `path`.
Result<std::vector<float>> canvas_logits(const Args& a, const std::string& path, double* load_s) {
  EngineOptions eo;
  eo.model_dir = path;
  eo.n_threads = a.threads;
  eo.weight_cache = "off";
  if (a.precision != "auto") eo.matmul_precision = a.precision == "bf16" ? MatmulPrecision::kBF16 : MatmulPrecision::kF32;
  const auto t0 = std::chrono::steady_clock::now();
  DC_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::load(eo));
  *load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const ModelConfig& c = engine->config();
  std::vector<int32_t> tokens(static_cast<size_t>(a.prompt_len + a.canvas), static_cast<int32_t>(c.mask_token_id));
  for (int64_t i = 0; i < a.prompt_len; ++i)  // random ids below 150000 (real tokens of both vocabularies)
    tokens[i] = static_cast<int32_t>(splitmix64(a.seed + static_cast<uint64_t>(i)) % 150000);
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < a.prompt_len + a.canvas; ++i) rows.push_back(i);
  ForwardBatch b;
  b.n_batch = 1;
  b.n_seq = static_cast<int64_t>(tokens.size());
  b.tokens = tokens.data();
  b.out_rows = rows.data();
  b.n_out = static_cast<int64_t>(rows.size());
  std::vector<float> logits(rows.size() * static_cast<size_t>(c.n_vocab));
  DC_RETURN_IF_ERROR(engine->logits_fn()(b, logits.data()));
  return logits;
}

int64_t argmax(const float* x, int64_t n) { return std::max_element(x, x + n) - x; }

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--reference") a.reference = v;
    else if (k == "--model") a.models.push_back(v);
    else if (k == "--prompt-len") a.prompt_len = std::atoll(v.c_str());
    else if (k == "--canvas") a.canvas = std::atoll(v.c_str());
    else if (k == "--precision" && (v == "f32" || v == "bf16" || v == "auto")) a.precision = v;
    else if (k == "--threads") a.threads = std::atoi(v.c_str());
    else if (k == "--seed") a.seed = std::strtoull(v.c_str(), nullptr, 10);
    else return std::fprintf(stderr, "error: unknown option %s\n", k.c_str()), 2;
  }
  if (a.reference.empty() || a.models.empty() || a.prompt_len < 1 || a.canvas < 1)
    return std::fprintf(stderr, "error: give --reference DIR and at least one --model PATH\n"), 2;
  double load_s = 0;
  auto ref = canvas_logits(a, a.reference, &load_s);
  if (!ref.ok()) return std::fprintf(stderr, "error: %s\n", ref.status().message().c_str()), 1;
  const int64_t n_rows = a.prompt_len + a.canvas, n_vocab = static_cast<int64_t>(ref->size()) / n_rows;
  double range = 0;
  for (float v : *ref) range = std::max(range, static_cast<double>(std::fabs(v)));
  std::fprintf(stderr, "reference %s: max |logit| %.4g\n", a.reference.c_str(), range);
  for (const std::string& path : a.models) {
    auto got = canvas_logits(a, path, &load_s);
    if (!got.ok()) return std::fprintf(stderr, "error: %s\n", got.status().message().c_str()), 1;
    if (got->size() != ref->size()) return std::fprintf(stderr, "error: %s has another vocabulary\n", path.c_str()), 1;
    double max_abs = 0, sum_sq = 0;
    int64_t agree_canvas = 0, agree_all = 0;
    for (size_t i = 0; i < ref->size(); ++i) {
      const double d = std::fabs(static_cast<double>((*got)[i]) - (*ref)[i]);
      max_abs = std::max(max_abs, d);
      sum_sq += d * d;
    }
    for (int64_t r = 0; r < n_rows; ++r) {
      const bool same = argmax(got->data() + r * n_vocab, n_vocab) == argmax(ref->data() + r * n_vocab, n_vocab);
      agree_all += same;
      agree_canvas += same && r >= a.prompt_len;
    }
    std::printf("{\"model\": \"%s\", \"precision\": \"%s\", \"load_s\": %.1f, \"max_abs\": %.6g, \"max_rel\": %.6g, "
                "\"rms\": %.6g, \"greedy_agreement_canvas\": %.4f, \"greedy_agreement_all\": %.4f, "
                "\"canvas\": %lld, \"positions\": %lld}\n",
                path.c_str(), a.precision.c_str(), load_s, max_abs, max_abs / range,
                std::sqrt(sum_sq / static_cast<double>(ref->size())), static_cast<double>(agree_canvas) / a.canvas,
                static_cast<double>(agree_all) / n_rows, (long long)a.canvas, (long long)n_rows);
    std::fflush(stdout);
  }
  return 0;
}
