// Profiler: cheap wall-clock timers of an op's phases, for `bench --train --profile`. Off unless a
// caller puts one in Context::profiler; then every ProfileScope adds its time under the path of the
// scopes open around it ("backward/matmul_nt_backward/dW GEMM"), exclusive of the scopes nested in it,
// so the entries add up to the time spent inside the outermost scopes. Not thread-safe: scopes are
// opened by the thread that calls the ops (the kernels' pool threads open none).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/context.h"

namespace dc {

class Profiler {
 public:
  struct Entry {
    double seconds = 0;  // exclusive of the nested scopes
    int64_t calls = 0;
  };
  // Every path seen since the last reset, with its exclusive time and call count.
  const std::map<std::string, Entry>& entries() const { return entries_; }
  void reset() { entries_.clear(); }

 private:
  friend class ProfileScope;
  struct Open {
    std::string path;
    std::chrono::steady_clock::time_point start;
    double nested = 0;  // seconds spent in scopes nested in this one
  };
  std::map<std::string, Entry> entries_;
  std::vector<Open> stack_;
};

// Times its own lifetime under `name` in ctx.profiler (nothing, not even the name's string, when there
// is none). `name` is called only with a profiler, so it may format shapes.
class ProfileScope {
 public:
  ProfileScope(const Context& ctx, const char* name) : profiler_(ctx.profiler) {
    if (profiler_ != nullptr) open(name);
  }
  template <typename NameFn, typename = decltype(std::string(std::declval<NameFn>()()))>
  ProfileScope(const Context& ctx, NameFn&& name) : profiler_(ctx.profiler) {
    if (profiler_ != nullptr) open(name());
  }
  ~ProfileScope() {
    if (profiler_ == nullptr) return;
    Profiler::Open o = std::move(profiler_->stack_.back());
    profiler_->stack_.pop_back();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - o.start).count();
    Profiler::Entry& e = profiler_->entries_[o.path];
    e.seconds += s - o.nested, e.calls += 1;
    if (!profiler_->stack_.empty()) profiler_->stack_.back().nested += s;
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  void open(const std::string& name) {
    std::string path = profiler_->stack_.empty() ? name : profiler_->stack_.back().path + "/" + name;
    profiler_->stack_.push_back({std::move(path), std::chrono::steady_clock::now(), 0.0});
  }
  Profiler* profiler_;
};

}  // namespace dc
