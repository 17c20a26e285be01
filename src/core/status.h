// Status and Result<T>: the error channel for everything driven by outside input (files, parsing,
// config, CLI and HTTP parameters). Messages name the file, tensor or field and say what to do next.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace dc {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // a parameter or field has a bad value
  kNotFound,         // a file, tensor or key is missing
  kIoError,          // reading or writing failed
  kParseError,       // a file is malformed
  kOutOfRange,       // a length or index exceeds a limit
  kUnimplemented,    // valid input that the engine does not support yet
  kResourceExhausted,  // memory ran out (an allocation failed: KV cache, forward workspace, kernel scratch)
  kCancelled,        // the caller stopped the work (a hook returned false, a client went away)
  kFailedPrecondition,  // valid, but not in the object's present state (e.g. while a generation runs)
  kInternal,
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<code name>: <message>", for logs and CLI output.
  std::string to_string() const;
  // Prefixes the message with context ("loading model.safetensors: ..."); no-op when ok.
  Status with_context(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status io_error(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status parse_error(std::string m) { return {StatusCode::kParseError, std::move(m)}; }
inline Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status failed_precondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status resource_exhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// True for the Status of work the caller stopped (StatusCode::kCancelled).
inline bool is_cancelled(const Status& status) { return status.code() == StatusCode::kCancelled; }

// Either a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                       // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {                  // NOLINT: implicit by design
    if (std::get<Status>(v_).ok()) v_ = Status(StatusCode::kInternal, "Result built from an ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  // Precondition: ok(). Aborts otherwise (a programming error, not an input error).
  T& value() & { check_ok(); return std::get<T>(v_); }
  const T& value() const& { check_ok(); return std::get<T>(v_); }
  T&& value() && { check_ok(); return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void check_ok() const;
  std::variant<T, Status> v_;
};

[[noreturn]] void die_on_bad_result(const Status& status);

template <typename T>
void Result<T>::check_ok() const {
  if (!ok()) die_on_bad_result(std::get<Status>(v_));
}

}  // namespace dc

#define DC_CONCAT_INNER_(a, b) a##b
#define DC_CONCAT_(a, b) DC_CONCAT_INNER_(a, b)

// Returns the Status of `expr` from the enclosing function if it is not ok.
#define DC_RETURN_IF_ERROR(expr)                 \
  do {                                           \
    ::dc::Status dc_status_ = (expr);            \
    if (!dc_status_.ok()) return dc_status_;     \
  } while (0)

// `DC_ASSIGN_OR_RETURN(auto x, f());` declares x from the value of a Result or returns its Status.
#define DC_ASSIGN_OR_RETURN(lhs, expr) DC_ASSIGN_OR_RETURN_IMPL_(DC_CONCAT_(dc_result_, __LINE__), lhs, expr)
#define DC_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
