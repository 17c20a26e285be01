// Two small open-addressing hash maps for the tokenizer's large tables (150k entries): string
// views to ids, and packed id pairs to merge ranks. No per-entry allocation; fast to build.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "core/splitmix64.h"

namespace dc {

// Maps string views to int32 ids. The viewed characters must outlive the map (and must not move).
class StringIdMap {
 public:
  void reserve(size_t n) {
    if (capacity_for(n) > slots_.size()) rehash(capacity_for(n));
  }
  // Inserts `key` or overwrites its id. Precondition: id >= 0, key.size() < 2^32.
  void set(std::string_view key, int32_t id) {
    if (capacity_for(size_ + 1) > slots_.size()) rehash(std::max<size_t>(16, 2 * slots_.size()));
    for (size_t i = hash(key) & mask();; i = (i + 1) & mask()) {
      Slot& s = slots_[i];
      if (s.id < 0) {
        s = Slot{key.data(), static_cast<uint32_t>(key.size()), id};
        ++size_;
        return;
      }
      if (s.view() == key) {
        s.id = id;
        return;
      }
    }
  }
  // The id of `key`, or -1.
  int32_t find(std::string_view key) const {
    if (slots_.empty()) return -1;
    for (size_t i = hash(key) & mask();; i = (i + 1) & mask()) {
      const Slot& s = slots_[i];
      if (s.id < 0) return -1;
      if (s.size == key.size() && s.view() == key) return s.id;
    }
  }
  size_t size() const { return size_; }

 private:
  struct Slot {
    const char* data = nullptr;
    uint32_t size = 0;
    int32_t id = -1;  // -1 marks an empty slot
    std::string_view view() const { return {data, size}; }
  };
  static size_t hash(std::string_view s) { return std::hash<std::string_view>{}(s); }
  static size_t capacity_for(size_t n) {  // load factor at most 3/4
    size_t cap = 16;
    while (cap * 3 < n * 4) cap *= 2;
    return cap;
  }
  size_t mask() const { return slots_.size() - 1; }
  void rehash(size_t cap) {
    std::vector<Slot> old(cap);
    old.swap(slots_);
    for (const Slot& s : old) {
      if (s.id < 0) continue;
      size_t i = hash(s.view()) & mask();
      while (slots_[i].id >= 0) i = (i + 1) & mask();
      slots_[i] = s;
    }
  }
  std::vector<Slot> slots_;
  size_t size_ = 0;
};

// Maps a pair of non-negative int32 ids to a value (any trivially copyable V).
template <typename V>
class PairMap {
 public:
  void reserve(size_t n) {
    if (capacity_for(n) > slots_.size()) rehash(capacity_for(n));
  }
  // Inserts (a, b) or overwrites its value.
  void set(int32_t a, int32_t b, V value) {
    if (capacity_for(size_ + 1) > slots_.size()) rehash(std::max<size_t>(16, 2 * slots_.size()));
    const uint64_t k = key(a, b);
    for (size_t i = hash(k) & mask();; i = (i + 1) & mask()) {
      Slot& s = slots_[i];
      if (s.key == kEmpty) {
        s = Slot{k, value};
        ++size_;
        return;
      }
      if (s.key == k) {
        s.value = value;
        return;
      }
    }
  }
  // The value of (a, b), or nullptr.
  const V* find(int32_t a, int32_t b) const {
    if (slots_.empty()) return nullptr;
    const uint64_t k = key(a, b);
    for (size_t i = hash(k) & mask();; i = (i + 1) & mask()) {
      const Slot& s = slots_[i];
      if (s.key == k) return &s.value;
      if (s.key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key = kEmpty;
    V value{};
  };
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  static size_t capacity_for(size_t n) {  // load factor at most 3/4
    size_t cap = 16;
    while (cap * 3 < n * 4) cap *= 2;
    return cap;
  }
  static size_t hash(uint64_t k) { return static_cast<size_t>(splitmix64_finalize(k)); }
  size_t mask() const { return slots_.size() - 1; }
  void rehash(size_t cap) {
    std::vector<Slot> old(cap);
    old.swap(slots_);
    for (const Slot& s : old) {
      if (s.key == kEmpty) continue;
      size_t i = hash(s.key) & mask();
      while (slots_[i].key != kEmpty) i = (i + 1) & mask();
      slots_[i] = s;
    }
  }
  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace dc
