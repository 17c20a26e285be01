// BPE merge loop (a linked list of symbols plus a min-heap of candidate pairs keyed by rank, then
// position) and the per-word cache shared by all threads.
#include "tokenizer/bpe.h"

#include <algorithm>
#include <functional>
#include <mutex>
#include <shared_mutex>

namespace dc {

// Memoised word -> ids. Readers share the lock; the map is cleared when it reaches kMaxEntries so
// memory stays bounded on unbounded input.
class BpeWordCache {
 public:
  static constexpr size_t kMaxEntries = 1 << 17;
  static constexpr size_t kMaxWordBytes = 256;  // longer words are rare and not worth keeping

  bool lookup(std::string_view word, std::vector<int32_t>* out) const {
    std::shared_lock lock(mu_);
    const auto it = map_.find(word);
    if (it == map_.end()) return false;
    out->insert(out->end(), it->second.begin(), it->second.end());
    return true;
  }

  void insert(std::string_view word, const int32_t* ids, size_t n) {
    if (word.size() > kMaxWordBytes) return;
    std::unique_lock lock(mu_);
    if (map_.size() >= kMaxEntries) map_.clear();
    map_.try_emplace(std::string(word), ids, ids + n);
  }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  mutable std::shared_mutex mu_;
  std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> map_;
};

BpeModel::BpeModel(const std::array<int32_t, 256>& byte_ids, const std::vector<Merge>& merges,
                   std::unordered_map<std::string, int32_t> word_ids, bool ignore_merges)
    : byte_ids_(byte_ids),
      word_ids_(std::move(word_ids)),
      ignore_merges_(ignore_merges),
      cache_(std::make_unique<BpeWordCache>()) {
  ranks_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    ranks_.set(merges[r].left, merges[r].right, Rank{static_cast<int32_t>(r), merges[r].merged});
  }
}

BpeModel::BpeModel(BpeModel&&) noexcept = default;
BpeModel& BpeModel::operator=(BpeModel&&) noexcept = default;
BpeModel::~BpeModel() = default;

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>* out, MergeScratch& scratch) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    const auto it = word_ids_.find(std::string(word));
    if (it != word_ids_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  if (word.size() == 1) {
    out->push_back(byte_ids_[static_cast<uint8_t>(word[0])]);
    return;
  }
  if (cache_->lookup(word, out)) return;
  const size_t first = out->size();
  run_merges(word, out, scratch);
  cache_->insert(word, out->data() + first, out->size() - first);
}

void BpeModel::run_merges(std::string_view word, std::vector<int32_t>* out, MergeScratch& scratch) const {
  using Symbol = MergeScratch::Symbol;
  using Candidate = MergeScratch::Candidate;
  // Heap order: the top is the lowest rank, then the lowest position.
  const auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::vector<Symbol>& symbols = scratch.symbols;
  std::vector<Candidate>& heap = scratch.heap;
  symbols.clear();
  heap.clear();

  const int32_t n = static_cast<int32_t>(word.size());
  for (int32_t i = 0; i < n; ++i) {
    symbols.push_back(Symbol{byte_ids_[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1, true});
  }
  const auto push_pair = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    const Rank* r = ranks_.find(symbols[pos].id, symbols[next].id);
    if (r == nullptr) return;
    heap.push_back(Candidate{r->rank, pos, r->merged});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    // Stale when either side has changed since the candidate was pushed: the pair now yields
    // another token (a symbol only grows, so equal results mean the same pair).
    const Rank* r = ranks_.find(left.id, symbols[left.next].id);
    if (r == nullptr || r->merged != top.merged) continue;
    Symbol& right = symbols[left.next];
    left.id = top.merged;
    left.next = right.next;
    right.alive = false;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out->push_back(symbols[i].id);
}

}  // namespace dc
