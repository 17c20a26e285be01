// CanvasView (server/canvas.h), the `event: canvas` rows of a stream: after every step of a simulated
// generation (a few positions unmasked per step, two rows) its rows equal a full decode of the canvas, it
// decoded exactly the positions that changed, and its changes applied to the previous rows give the new ones;
// a finished canvas reassembles to the text's full decode.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "running_server.h"
#include "server/canvas.h"

namespace dc::server::test {
namespace {

using nlohmann::json;

class CanvasViewTest : public TinyVocabSuite {};

// What the stream sent before CanvasView: every position decoded, every step.
json full_decode(const Tokenizer& tok, int32_t mask, const std::vector<std::vector<int32_t>>& rows) {
  json out = json::array();
  for (const auto& row : rows) {
    json pieces = json::array();
    for (int32_t t : row) {
      if (t == mask) {
        pieces.push_back(nullptr);
      } else if (t >= 0 && t < tok.vocab_size()) {
        Result<std::string> piece = tok.decode({t});
        pieces.push_back(piece.ok() ? *piece : std::string());
      } else {
        pieces.push_back("");
      }
    }
    out.push_back(std::move(pieces));
  }
  return out;
}

TEST_F(CanvasViewTest, DecodesOnlyChangedPositionsAndMatchesAFullDecode) {
  const Tokenizer& tok = *engine().tokenizer();
  const int32_t mask = static_cast<int32_t>(engine().config().mask_token_id);
  auto a = tok.encode("def add(a, b):\n    return a + b  # the sum");
  auto b = tok.encode("print('hello, canvas')");
  ASSERT_TRUE(a.ok() && b.ok());
  const size_t n = std::max(a->size(), b->size());
  a->resize(n, 0), b->resize(n, 0);  // (0: "!")
  const std::vector<std::vector<int32_t>> final_rows = {*a, *b};
  std::vector<std::vector<int32_t>> canvas(2, std::vector<int32_t>(n, mask));
  CanvasView view(*model().tokenizer(), mask);
  EXPECT_EQ(view.update(canvas), static_cast<int64_t>(2 * n));  // the first event: every position
  EXPECT_TRUE(view.reshaped());
  EXPECT_EQ(view.rows(), full_decode(tok, mask, canvas));
  std::vector<size_t> order(2 * n);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  for (size_t done = 0; done < order.size();) {
    const size_t step = std::min<size_t>(3, order.size() - done);  // three positions a step
    for (size_t i = done; i < done + step; ++i) canvas[order[i] / n][order[i] % n] = final_rows[order[i] / n][order[i] % n];
    done += step;
    json applied = view.rows();  // what a client of stream_canvas "changes" holds
    ASSERT_EQ(view.update(canvas), static_cast<int64_t>(step)) << "after " << done << " positions";
    ASSERT_EQ(view.rows(), full_decode(tok, mask, canvas)) << "after " << done << " positions";
    ASSERT_FALSE(view.reshaped());
    ASSERT_EQ(view.changes().size(), step);
    for (const json& c : view.changes()) applied[c[0].get<size_t>()][c[1].get<size_t>()] = c[2];
    ASSERT_EQ(applied, view.rows()) << "after " << done << " positions";
  }
  EXPECT_EQ(view.update(canvas), 0);  // nothing changed: nothing decoded
  // The finished canvas reassembles to the full decode of each row's text.
  std::string text;
  for (const json& piece : view.rows()[0]) text += piece.get<std::string>();
  EXPECT_EQ(text, *tok.decode(*a));
  // A changed id is decoded again (a sampler that remasks), and a new shape decodes every position.
  canvas[1][0] = mask;
  EXPECT_EQ(view.update(canvas), 1);
  EXPECT_TRUE(view.rows()[1][0].is_null());
  canvas.push_back({mask, *a->begin()});
  EXPECT_EQ(view.update(canvas), 2);
  EXPECT_TRUE(view.reshaped());  // a new shape: the event sends the rows whole
  EXPECT_EQ(view.rows(), full_decode(tok, mask, canvas));
  canvas.resize(1);
  EXPECT_EQ(view.update(canvas), 0);
  EXPECT_EQ(view.rows(), full_decode(tok, mask, canvas));
}

}  // namespace
}  // namespace dc::server::test
