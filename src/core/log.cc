// The process-wide log sink: a shared_ptr swapped under a mutex, called outside it (a sink may log or
// replace itself; a slow sink does not serialise the threads that log).
#include "core/log.h"

#include <cstdio>
#include <memory>
#include <mutex>
#include <utility>

namespace dc {
namespace {

struct SinkSlot {
  std::mutex mu;
  std::shared_ptr<const LogSink> sink;  // null: the default
};

// Never destroyed: threads that log during static destruction (a model's destructor) still find it.
SinkSlot& slot() {
  static SinkSlot* s = new SinkSlot();
  return *s;
}

}  // namespace

const char* log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "unknown";
}

void set_log_sink(LogSink sink) {
  std::shared_ptr<const LogSink> next = sink ? std::make_shared<const LogSink>(std::move(sink)) : nullptr;
  SinkSlot& s = slot();
  std::lock_guard<std::mutex> lock(s.mu);
  s.sink.swap(next);
  // `next` (the old sink) is released here or by the last log() still calling it
}

std::string format_log_line(LogLevel level, std::string_view message) {
  switch (level) {
    case LogLevel::kWarning: return "note: " + std::string(message);
    case LogLevel::kError: return "error: " + std::string(message);
    default: return std::string(message);
  }
}

void log(LogLevel level, std::string_view message) {
  std::shared_ptr<const LogSink> sink;
  {
    SinkSlot& s = slot();
    std::lock_guard<std::mutex> lock(s.mu);
    sink = s.sink;
  }
  if (sink) {
    (*sink)(level, message);
    return;
  }
  const std::string line = format_log_line(level, message) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);  // one write: lines of several threads do not interleave
  std::fflush(stderr);
}

}  // namespace dc
