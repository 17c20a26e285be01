// Sequences: command buffers recorded once per shape and replayed, with timestamps (runtime.h).
#include <chrono>
#include <cstring>
#include <utility>

#include "ops/vulkan/runtime_impl.h"

namespace dc::vk {

namespace {
constexpr uint32_t kSetsPerPool = 64;
}

struct Sequence::Impl {
  Runtime::Impl* rt = nullptr;
  VkCommandBuffer cmd = VK_NULL_HANDLE;
  VkFence fence = VK_NULL_HANDLE;
  VkQueryPool queries = VK_NULL_HANDLE;
  std::vector<VkDescriptorPool> pools;  // kSetsPerPool sets of kMaxBindings buffers each
  uint32_t sets_in_last_pool = kSetsPerPool;
  int n_dispatches = 0;
  bool ended = false;

  ~Impl() {
    const Api& a = rt->inst.api;
    if (fence) a.vkDestroyFence(rt->device, fence, nullptr);
    if (cmd) a.vkFreeCommandBuffers(rt->device, rt->command_pool, 1, &cmd);
    if (queries) a.vkDestroyQueryPool(rt->device, queries, nullptr);
    for (VkDescriptorPool p : pools) a.vkDestroyDescriptorPool(rt->device, p, nullptr);
  }

  Result<VkDescriptorSet> new_set(VkDescriptorSetLayout layout) {
    const Api& a = rt->inst.api;
    if (sets_in_last_pool == kSetsPerPool) {
      VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, kSetsPerPool * static_cast<uint32_t>(kMaxBindings)};
      VkDescriptorPoolCreateInfo pi{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
      pi.maxSets = kSetsPerPool;
      pi.poolSizeCount = 1;
      pi.pPoolSizes = &size;
      VkDescriptorPool pool;
      const VkResult r = a.vkCreateDescriptorPool(rt->device, &pi, nullptr, &pool);
      if (r != VK_SUCCESS) return vk_status(r, "vkCreateDescriptorPool");
      pools.push_back(pool);
      sets_in_last_pool = 0;
    }
    VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    ai.descriptorPool = pools.back();
    ai.descriptorSetCount = 1;
    ai.pSetLayouts = &layout;
    VkDescriptorSet set;
    const VkResult r = a.vkAllocateDescriptorSets(rt->device, &ai, &set);
    if (r != VK_SUCCESS) return vk_status(r, "vkAllocateDescriptorSets");
    ++sets_in_last_pool;
    ++rt->counters.descriptor_sets;
    return set;
  }
};

Sequence::Sequence(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Sequence::Sequence(Sequence&&) noexcept = default;
Sequence& Sequence::operator=(Sequence&&) noexcept = default;
Sequence::~Sequence() = default;
int Sequence::dispatches() const { return impl_->n_dispatches; }
const DeviceInfo& Sequence::device() const { return impl_->rt->info; }

Result<Sequence> Runtime::new_sequence() {
  Impl& m = *impl_;
  const Api& a = m.inst.api;
  auto s = std::make_unique<Sequence::Impl>();
  s->rt = &m;
  VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ai.commandPool = m.command_pool;
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = 1;
  VkResult r = a.vkAllocateCommandBuffers(m.device, &ai, &s->cmd);
  if (r != VK_SUCCESS) {
    s->cmd = VK_NULL_HANDLE;
    return vk_status(r, "vkAllocateCommandBuffers");
  }
  VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  r = a.vkCreateFence(m.device, &fi, nullptr, &s->fence);
  if (r != VK_SUCCESS) {
    s->fence = VK_NULL_HANDLE;
    return vk_status(r, "vkCreateFence");
  }
  VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
  qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
  qi.queryCount = 2;
  r = a.vkCreateQueryPool(m.device, &qi, nullptr, &s->queries);
  if (r != VK_SUCCESS) {
    s->queries = VK_NULL_HANDLE;
    return vk_status(r, "vkCreateQueryPool");
  }
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};  // reusable: no ONE_TIME_SUBMIT
  r = a.vkBeginCommandBuffer(s->cmd, &bi);
  if (r != VK_SUCCESS) return vk_status(r, "vkBeginCommandBuffer");
  a.vkCmdResetQueryPool(s->cmd, s->queries, 0, 2);
  // The uploads (earlier submissions' copies on this queue, or host writes) visible to the first dispatch:
  // a fence wait alone makes them available to the host, not visible to the device.
  VkMemoryBarrier uploads{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  uploads.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_WRITE_BIT;
  uploads.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
  a.vkCmdPipelineBarrier(s->cmd, VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_HOST_BIT,
                         VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &uploads, 0, nullptr, 0, nullptr);
  a.vkCmdWriteTimestamp(s->cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, s->queries, 0);
  ++m.counters.recordings;
  return Sequence(std::move(s));
}

Status Sequence::record(const Dispatch& d) {
  Impl& s = *impl_;
  const auto start = std::chrono::steady_clock::now();
  const std::string name(d.shader);
  if (s.ended) return invalid_argument("shader " + name + ": a Sequence is recorded before its first run(); record a new one");
  if (d.push.size() * 4 > kMaxPushBytes) return invalid_argument("shader " + name + ": more than 128 bytes of push constants");
  for (size_t i = 0; i < d.buffers.size(); ++i)
    if (d.buffers[i] != nullptr) DC_RETURN_IF_ERROR(s.rt->check_owned(*d.buffers[i], "shader " + name + ", binding " + std::to_string(i)));
  DC_ASSIGN_OR_RETURN(Runtime::Impl::Pipeline p, s.rt->pipeline(d.shader, d.spec, d.buffers.size()));
  DC_ASSIGN_OR_RETURN(VkDescriptorSet set, s.new_set(p.set_layout));
  VkDescriptorBufferInfo infos[kMaxBindings];
  VkWriteDescriptorSet writes[kMaxBindings];
  for (size_t i = 0; i < d.buffers.size(); ++i) {
    infos[i] = {s.rt->handle(d.buffers[i]), 0, VK_WHOLE_SIZE};
    writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    writes[i].dstSet = set;
    writes[i].dstBinding = static_cast<uint32_t>(i);
    writes[i].descriptorCount = 1;
    writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[i].pBufferInfo = &infos[i];
  }
  const Api& a = s.rt->inst.api;
  a.vkUpdateDescriptorSets(s.rt->device, static_cast<uint32_t>(d.buffers.size()), writes, 0, nullptr);
  a.vkCmdBindPipeline(s.cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline);
  a.vkCmdBindDescriptorSets(s.cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p.layout, 0, 1, &set, 0, nullptr);
  if (!d.push.empty())
    a.vkCmdPushConstants(s.cmd, p.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, static_cast<uint32_t>(4 * d.push.size()), d.push.data());
  a.vkCmdDispatch(s.cmd, d.groups_x, d.groups_y, d.groups_z);
  // Every dispatch sees the writes of the ones before it (the uploads: the barrier of new_sequence).
  VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  barrier.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
  barrier.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT;
  a.vkCmdPipelineBarrier(s.cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                         VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &barrier, 0, nullptr, 0, nullptr);
  ++s.n_dispatches;
  ++s.rt->counters.dispatches_recorded;
  s.rt->counters.record_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return Status();
}

Status Sequence::run() {
  Impl& s = *impl_;
  const Api& a = s.rt->inst.api;
  if (!s.ended) {
    a.vkCmdWriteTimestamp(s.cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, s.queries, 1);
    const VkResult r = a.vkEndCommandBuffer(s.cmd);
    if (r != VK_SUCCESS) return vk_status(r, "vkEndCommandBuffer");
    s.ended = true;
  }
  VkResult r = a.vkResetFences(s.rt->device, 1, &s.fence);
  if (r != VK_SUCCESS) return vk_status(r, "vkResetFences");
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &s.cmd;
  r = a.vkQueueSubmit(s.rt->queue, 1, &si, s.fence);
  ++s.rt->counters.submits;
  if (r != VK_SUCCESS) return vk_status(r, "running a sequence of " + std::to_string(s.n_dispatches) + " dispatches");
  r = a.vkWaitForFences(s.rt->device, 1, &s.fence, VK_TRUE, UINT64_MAX);
  if (r != VK_SUCCESS) return vk_status(r, "waiting for a sequence of " + std::to_string(s.n_dispatches) + " dispatches");
  return Status();
}

Result<double> Sequence::run_timed() {
  DC_RETURN_IF_ERROR(run());
  Impl& s = *impl_;
  uint64_t stamps[2] = {0, 0};
  const VkResult r = s.rt->inst.api.vkGetQueryPoolResults(s.rt->device, s.queries, 0, 2, sizeof(stamps), stamps, sizeof(uint64_t),
                                                          VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
  if (r != VK_SUCCESS) return vk_status(r, "reading the sequence's timestamps");
  return static_cast<double>((stamps[1] - stamps[0]) & s.rt->timestamp_mask) * s.rt->timestamp_period_ns * 1e-6;
}

}  // namespace dc::vk
