// Compiled alone by the ctest test api_public_header_alone with only include/ on the include path: the public
// header must stand on the standard library (no header of src/), and its types must be usable as documented.
#include <diffucoder/diffucoder.h>

#include <type_traits>
#include <utility>

static_assert(std::is_same_v<decltype(diffucoder::check_config({})), diffucoder::Status>);
static_assert(std::is_same_v<decltype(diffucoder::Model::load({})), diffucoder::Result<std::unique_ptr<diffucoder::Model>>>);
static_assert(std::is_same_v<decltype(diffucoder::BatchEngine::create(std::declval<const diffucoder::Model&>(), {})),
                             diffucoder::Result<std::unique_ptr<diffucoder::BatchEngine>>>);
static_assert(std::is_same_v<decltype(std::declval<diffucoder::BatchEngine&>().submit({})), diffucoder::Submission>);

int use_the_types() {
  diffucoder::Result<int> r = diffucoder::Status(diffucoder::StatusCode::kNotFound, "x");
  diffucoder::set_log_callback([](diffucoder::LogLevel, std::string_view) {});
  return r.ok() ? *r : static_cast<int>(r.status().code());
}
