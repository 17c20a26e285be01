// `diffucoder devices`: the CPU always, and the Vulkan devices or, without a driver, a line saying what
// to install (exit 0 either way: the CPU works).
#include <gtest/gtest.h>

#include <string>

#include "process.h"

namespace dc {
namespace {

const std::string kBinary = DC_BINARY_PATH;

TEST(DevicesCommand, ListsTheCpuAndTheVulkanDevices) {
  auto r = testing::run_command(kBinary + " devices");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("cpu ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("threads"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("vulkan"), std::string::npos) << r.out;  // devices, or why there are none
  auto j = testing::run_command(kBinary + " devices --json");
  ASSERT_EQ(j.exit_code, 0) << j.err;
  EXPECT_NE(j.out.find("\"vulkan_built\""), std::string::npos) << j.out;
  EXPECT_NE(j.out.find("\"memory_bytes\""), std::string::npos) << j.out;
}

TEST(DevicesCommand, WithoutADriverSaysWhatToInstall) {
  auto r = testing::run_command("VK_ICD_FILENAMES=/nonexistent VK_DRIVER_FILES=/nonexistent " + kBinary + " devices");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("cpu ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("vulkan     none: "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("vulkan:0"), std::string::npos) << r.out;
}

// DC_CPU_LEVEL caps the kernels' level: the cap shows in `devices --json`, and a misspelt value is a usage
// error (exit 2 naming the variable) rather than a silent run on the baseline kernels.
TEST(DevicesCommand, CpuLevelCapShowsAndABadOneIsRefused) {
  auto capped = testing::run_command("DC_CPU_LEVEL=baseline " + kBinary + " devices --json");
  ASSERT_EQ(capped.exit_code, 0) << capped.err;
  EXPECT_NE(capped.out.find("\"level\": \"baseline\""), std::string::npos) << capped.out;
  EXPECT_NE(capped.out.find("x86-64 baseline"), std::string::npos) << capped.out;
  auto bad = testing::run_command("DC_CPU_LEVEL=avx9000 " + kBinary + " devices");
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_NE(bad.err.find("DC_CPU_LEVEL"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("avx9000"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace dc
