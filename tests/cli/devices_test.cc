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

}  // namespace
}  // namespace dc
