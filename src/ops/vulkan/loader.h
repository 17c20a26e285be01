// The Vulkan entry points the runtime uses, loaded from the loader library at run time (dlopen), so the
// binary starts on machines without Vulkan and reports its absence as a Status.
#pragma once

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include <string>

#include "core/status.h"

namespace dc::vk {

#define DC_VK_INSTANCE_FUNCTIONS(X)                                                                        \
  X(vkDestroyInstance) X(vkEnumeratePhysicalDevices) X(vkGetPhysicalDeviceProperties)                     \
  X(vkGetPhysicalDeviceProperties2) X(vkGetPhysicalDeviceFeatures2) X(vkGetPhysicalDeviceMemoryProperties) \
  X(vkGetPhysicalDeviceQueueFamilyProperties) X(vkEnumerateDeviceExtensionProperties) X(vkCreateDevice)    \
  X(vkDestroyDevice) X(vkGetDeviceQueue) X(vkCreateBuffer) X(vkDestroyBuffer)                              \
  X(vkGetBufferMemoryRequirements) X(vkAllocateMemory) X(vkFreeMemory) X(vkBindBufferMemory) X(vkMapMemory) \
  X(vkUnmapMemory) X(vkCreateCommandPool) X(vkDestroyCommandPool) X(vkAllocateCommandBuffers)              \
  X(vkFreeCommandBuffers) X(vkBeginCommandBuffer) X(vkEndCommandBuffer) X(vkCmdCopyBuffer)                 \
  X(vkCmdBindPipeline) X(vkCmdBindDescriptorSets) X(vkCmdPushConstants) X(vkCmdDispatch)                   \
  X(vkCmdPipelineBarrier) X(vkCmdWriteTimestamp) X(vkCmdResetQueryPool) X(vkCreateQueryPool)               \
  X(vkDestroyQueryPool) X(vkGetQueryPoolResults) X(vkQueueSubmit) X(vkDeviceWaitIdle) X(vkCreateFence)     \
  X(vkDestroyFence) X(vkWaitForFences) X(vkResetFences) X(vkCreateShaderModule) X(vkDestroyShaderModule)   \
  X(vkCreateDescriptorSetLayout) X(vkDestroyDescriptorSetLayout) X(vkCreatePipelineLayout)                 \
  X(vkDestroyPipelineLayout) X(vkCreateComputePipelines) X(vkDestroyPipeline) X(vkCreateDescriptorPool)    \
  X(vkDestroyDescriptorPool) X(vkAllocateDescriptorSets) X(vkUpdateDescriptorSets)

// The function table of one instance.
struct Api {
  PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
  PFN_vkCreateInstance vkCreateInstance = nullptr;
#define DC_VK_MEMBER(name) PFN_##name name = nullptr;
  DC_VK_INSTANCE_FUNCTIONS(DC_VK_MEMBER)
#undef DC_VK_MEMBER
  // Optional (VK_NV_cooperative_matrix): null where the loader or no driver has it.
  PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV vkGetPhysicalDeviceCooperativeMatrixPropertiesNV = nullptr;
};

// Opens the loader library and fills vkGetInstanceProcAddr and vkCreateInstance. kNotFound when the
// library cannot be opened (dlerror's reason and what to install).
Status load_global(const char* library, Api* api);
// Fills the rest of the table from `instance`. kInternal naming the first missing entry point.
Status load_instance(VkInstance instance, Api* api);

// "VK_ERROR_OUT_OF_DEVICE_MEMORY" etc.
std::string result_name(VkResult r);

// The Status of a failed call: kResourceExhausted for the out-of-memory results, kInternal with
// "reopen the device" for VK_ERROR_DEVICE_LOST, kNotFound for VK_ERROR_INCOMPATIBLE_DRIVER, kInternal
// otherwise; the message is "<what>: <result name>".
Status vk_status(VkResult r, const std::string& what);

}  // namespace dc::vk
