// status_convert.h's casts are sound only while both StatusCode lists agree, name for name.
#include "api/status_convert.h"

namespace dc::api {

#define DC_SAME_CODE_(name) \
  static_assert(static_cast<int>(StatusCode::name) == static_cast<int>(diffucoder::StatusCode::name), #name)
DC_SAME_CODE_(kOk);
DC_SAME_CODE_(kInvalidArgument);
DC_SAME_CODE_(kNotFound);
DC_SAME_CODE_(kIoError);
DC_SAME_CODE_(kParseError);
DC_SAME_CODE_(kOutOfRange);
DC_SAME_CODE_(kUnimplemented);
DC_SAME_CODE_(kResourceExhausted);
DC_SAME_CODE_(kCancelled);
DC_SAME_CODE_(kFailedPrecondition);
DC_SAME_CODE_(kInternal);
#undef DC_SAME_CODE_
static_assert(static_cast<int>(StatusCode::kInternal) == 10, "a new StatusCode: add it to both lists and above");

}  // namespace dc::api
