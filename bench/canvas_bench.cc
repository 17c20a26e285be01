// canvas_bench: the cost of a stream's `event: canvas` events over one generation of N positions in N steps
// (one position unmasked a step, in a random order; one row): the whole canvas decoded every step (what the
// server did before CanvasView), CanvasView sending the rows whole (`stream_canvas: true`) and CanvasView
// sending the changes (`stream_canvas: "changes"`): milliseconds (decoding plus the events' JSON) and bytes.
// Usage: build/bench/canvas_bench TOKENIZER.json [N=1024] (BENCHMARKS.md "Canvas events").
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <diffucoder/diffucoder.h>

#include "server/canvas.h"

namespace {

enum class Mode { kWholeDecode, kWholeRows, kChanges };

// {ms, bytes} of one generation's canvas events.
std::pair<double, size_t> run(const diffucoder::Tokenizer& tok, int32_t mask, const std::vector<int32_t>& final_ids,
                              const std::vector<size_t>& order, Mode mode) {
  std::vector<std::vector<int32_t>> canvas(1, std::vector<int32_t>(final_ids.size(), mask));
  dc::server::CanvasView view(tok, mask);
  size_t bytes = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t pos : order) {
    canvas[0][pos] = final_ids[pos];
    if (mode == Mode::kWholeDecode) {
      dc::server::CanvasView fresh(tok, mask);  // every position decoded again
      fresh.update(canvas);
      bytes += fresh.rows().dump().size();
    } else {
      view.update(canvas);
      bytes += (mode == Mode::kChanges && !view.reshaped() ? view.changes() : view.rows()).dump().size();
    }
  }
  return {std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(), bytes};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: canvas_bench TOKENIZER.json [N=1024]\n");
    return 2;
  }
  const long n = argc == 3 ? std::atol(argv[2]) : 1024;
  if (n < 1 || n > (1 << 16)) {
    std::fprintf(stderr, "canvas_bench: N must be in [1, 65536], got '%s'\n", argv[2]);
    return 2;
  }
  auto tok = diffucoder::Tokenizer::load(argv[1]);
  if (!tok.ok()) {
    std::fprintf(stderr, "canvas_bench: %s\n", tok.status().to_string().c_str());
    return 1;
  }
  const int32_t mask = (*tok)->size();  // an id outside the vocabulary: shown as a mask only
  std::mt19937 gen(1);
  std::vector<int32_t> final_ids(static_cast<size_t>(n));
  for (auto& t : final_ids) t = static_cast<int32_t>(gen() % static_cast<uint32_t>((*tok)->size()));
  std::vector<size_t> order(final_ids.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::shuffle(order.begin(), order.end(), gen);
  const struct { const char* name; Mode mode; } modes[] = {{"whole canvas decoded every step", Mode::kWholeDecode},
                                                            {"CanvasView, rows whole (true)", Mode::kWholeRows},
                                                            {"CanvasView, changes (\"changes\")", Mode::kChanges}};
  std::printf("%ld positions in %ld steps, the best of 3:\n", n, n);
  for (const auto& m : modes) {
    double best = 1e30;
    size_t bytes = 0;
    for (int r = 0; r < 3; ++r) {
      const auto [ms, b] = run(**tok, mask, final_ids, order, m.mode);
      best = std::min(best, ms), bytes = b;
    }
    std::printf("  %-34s %8.1f ms  %10zu bytes of canvas JSON\n", m.name, best, bytes);
  }
  return 0;
}
