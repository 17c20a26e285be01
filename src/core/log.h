// The library's messages to whoever runs it (the "note:" lines: a degraded path, a cache not written):
// the layers never print, they call dc::log, which hands (level, message) to the process-wide sink the
// application installed — the CLI prints it, the Python package forwards it to logging, a C++ program
// sets one through diffucoder::set_log_callback. Without one, messages go to stderr as the CLI prints them.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace dc {

enum class LogLevel {
  kDebug = 0,
  kInfo,     // progress worth a line ("finishing the packed-weight cache ...")
  kWarning,  // a "note:": the work goes on, slower or without something (weights left unpacked, f32 training)
  kError,    // something failed that the caller's Status does not carry (a cleanup, a background write)
};

// "debug", "info", "warning", "error".
const char* log_level_name(LogLevel level);

// (level, message without a trailing newline). Called on the thread that logs, possibly several at once
// and with the library's own locks not held: a sink must be thread-safe; it may call log() itself.
using LogSink = std::function<void(LogLevel, std::string_view)>;

// Replaces the process-wide sink (an empty function: back to the default). Thread-safe; a message being
// delivered while the sink changes goes to the old or the new one, never lost, and the old sink is destroyed
// only after its last call returns.
void set_log_sink(LogSink sink);

// The default sink's text for a message: "note: <message>" for warnings, "error: <message>" for errors,
// the message alone otherwise (what the CLI prints, one line each).
std::string format_log_line(LogLevel level, std::string_view message);

// Delivers one message to the current sink (the default: format_log_line on stderr, one write per line).
void log(LogLevel level, std::string_view message);

}  // namespace dc
