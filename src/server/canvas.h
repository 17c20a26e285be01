// The canvas view of a streamed generation (`stream_canvas`): per row, per generated position, the token's
// text or null while it is masked, kept between steps so that each step decodes only the positions whose id
// changed since the previous one (a step unmasks a few positions; decoding the whole canvas every step was
// O(rows × max_tokens) tokenizer calls per step), and the list of those changes (`stream_canvas: "changes"`:
// events after the first send only them, so a generation's events are O(max_tokens) bytes, not O(max_tokens²)).
#pragma once

#include <diffucoder/diffucoder.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

namespace dc::server {

class CanvasView {
 public:
  // `tokenizer` outlives the view; `mask_id` is the model's mask token (shown as null).
  CanvasView(const diffucoder::Tokenizer& tokenizer, int32_t mask_id) : tokenizer_(tokenizer), mask_id_(mask_id) {}

  // Brings the view to `rows` ([n_rows][n_positions] ids, the generated part of each row): decodes the
  // positions whose id differs from the previous call's (every position on the first call, and a row whose
  // length changed); returns how many positions it decoded.
  int64_t update(const std::vector<std::vector<int32_t>>& rows);

  // What the last update changed: [[row, position, piece or null], …] in row-major order, as rows() shows
  // them; a client holding the previous rows() applies them to get the new one. Not meaningful when
  // reshaped() (send rows() whole then).
  const nlohmann::json& changes() const { return changes_; }
  // Whether the last update was the first, or changed the number of rows or a row's length.
  bool reshaped() const { return reshaped_; }

  // [n_rows][n_positions]: each position's text (Tokenizer::decode of the one id; "" for an id outside the
  // vocabulary or one that does not decode) or null for a mask. The `rows` of an `event: canvas`.
  const nlohmann::json& rows() const { return pieces_; }

  // The text of one id as rows() shows it.
  nlohmann::json piece(int32_t id) const;

 private:
  const diffucoder::Tokenizer& tokenizer_;
  int32_t mask_id_;
  std::vector<std::vector<int32_t>> ids_;  // what pieces_ shows
  nlohmann::json pieces_ = nlohmann::json::array();
  nlohmann::json changes_ = nlohmann::json::array();
  bool reshaped_ = true;
};

}  // namespace dc::server
