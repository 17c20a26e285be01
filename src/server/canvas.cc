// CanvasView: the stream's canvas event, decoded incrementally.
#include "server/canvas.h"

#include <span>
#include <string>

namespace dc::server {

nlohmann::json CanvasView::piece(int32_t id) const {
  if (id == mask_id_) return nullptr;
  if (id < 0 || id >= tokenizer_.size()) return "";
  diffucoder::Result<std::string> text = tokenizer_.decode(std::span<const int32_t>(&id, 1));
  return text.ok() ? *text : std::string();
}

int64_t CanvasView::update(const std::vector<std::vector<int32_t>>& rows) {
  int64_t decoded = 0;
  reshaped_ = pieces_.empty() || rows.size() != ids_.size();
  changes_ = nlohmann::json::array();
  ids_.resize(rows.size());
  while (pieces_.size() > rows.size()) pieces_.erase(pieces_.size() - 1);
  while (pieces_.size() < rows.size()) pieces_.push_back(nlohmann::json::array());
  for (size_t r = 0; r < rows.size(); ++r) {
    std::vector<int32_t>& ids = ids_[r];
    nlohmann::json& pieces = pieces_[r];
    if (ids.size() != rows[r].size()) {  // a new row (or a new shape): every position
      ids = rows[r];
      pieces = nlohmann::json::array();
      for (int32_t id : ids) pieces.push_back(piece(id));
      decoded += static_cast<int64_t>(ids.size());
      reshaped_ = true;
      continue;
    }
    for (size_t j = 0; j < ids.size(); ++j) {
      if (ids[j] == rows[r][j]) continue;
      ids[j] = rows[r][j];
      pieces[j] = piece(ids[j]);
      changes_.push_back(nlohmann::json::array({r, j, pieces[j]}));
      ++decoded;
    }
  }
  return decoded;
}

}  // namespace dc::server
