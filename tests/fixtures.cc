// The JSON loaders of fixtures.h (one copy of nlohmann's parser for every test binary).
#include "fixtures.h"

namespace dc::testing {

nlohmann::json load_manifest() {
  const std::filesystem::path dir = fixtures_dir();
  if (!std::filesystem::exists(dir / ".complete")) {
    ADD_FAILURE() << "reference fixtures missing in " << dir << ": run `ctest -R reference_fixtures` first";
    return nlohmann::json::object({{"models", nlohmann::json::array()}});
  }
  std::ifstream in(dir / "manifest.json");
  return nlohmann::json::parse(in);
}

nlohmann::json load_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return nlohmann::json::parse(in);
}

}  // namespace dc::testing
