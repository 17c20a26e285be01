// The one crossing between the layers' error type (core/status.h: dc::Status / dc::Result) and the public
// one (diffucoder::Status / diffucoder::Result, include/diffucoder/diffucoder.h): the facade's functions
// return to_public(...) of the layers' results; a program built on the layers and the facade (the CLI)
// brings a facade result back with to_internal.
#pragma once

#include <diffucoder/diffucoder.h>

#include <utility>

#include "core/status.h"

namespace dc::api {

// The codes are the same list in the same order (checked in status_convert.cc).
inline diffucoder::Status to_public(const Status& s) {
  return s.ok() ? diffucoder::Status() : diffucoder::Status(static_cast<diffucoder::StatusCode>(s.code()), s.message());
}
inline Status to_internal(const diffucoder::Status& s) {
  return s.ok() ? Status() : Status(static_cast<StatusCode>(s.code()), s.message());
}

template <typename T>
diffucoder::Result<T> to_public(Result<T>&& r) {
  if (!r.ok()) return to_public(r.status());
  return std::move(r).value();
}
template <typename T>
Result<T> to_internal(diffucoder::Result<T>&& r) {
  if (!r.ok()) return to_internal(r.status());
  return std::move(r).value();
}

}  // namespace dc::api
