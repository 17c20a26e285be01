// Sequences: commands collected on the host, recorded into a command buffer at the first run and replayed,
// with timestamps (runtime.h).
#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "ops/vulkan/runtime_impl.h"

namespace dc::vk {

namespace {

constexpr uint32_t kSetsPerPool = 64;

// One collected command: a dispatch (pipeline set) or a copy from a staging buffer (pipeline null). Fixed
// arrays, no allocation: a forward collects every command again each step (~450 for a 28-layer model), to
// replay a recorded sequence when they are the same.
struct Command {
  std::string_view shader = "copy";  // for DC_VULKAN_PROFILE (the kernels' names are literals)
  VkPipeline pipeline = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  uint32_t n_buffers = 0, n_push = 0;
  std::array<uint64_t, kMaxBindings> ids{};      // the buffers' ids (the dispatch's bindings; a copy's source and destination)
  std::array<VkBuffer, kMaxBindings> handles{};  // their handles, in the same order
  std::array<uint32_t, kMaxPushBytes / 4> push{};
  uint32_t groups[3] = {1, 1, 1};
  int64_t bytes = 0;                             // a copy's size
  // (the unused entries of the arrays stay zero, so whole arrays compare)
  bool operator==(const Command& o) const {
    return pipeline == o.pipeline && n_buffers == o.n_buffers && ids == o.ids && n_push == o.n_push && push == o.push &&
           groups[0] == o.groups[0] && groups[1] == o.groups[1] && groups[2] == o.groups[2] && bytes == o.bytes;
  }
};

}  // namespace

struct Sequence::Impl {
  Runtime::Impl* rt = nullptr;
  std::vector<Command> commands;
  VkCommandBuffer cmd = VK_NULL_HANDLE;  // recorded at the first run
  VkFence fence = VK_NULL_HANDLE;
  VkQueryPool queries = VK_NULL_HANDLE;
  std::vector<VkDescriptorPool> pools;  // kSetsPerPool sets of kMaxBindings buffers each
  uint32_t sets_in_last_pool = kSetsPerPool;
  int n_dispatches = 0;
  bool reads_back = false;  // a download: the host reads a staging buffer after the run
  bool ended = false;     // run() was called: no more commands
  bool recorded = false;  // cmd holds the commands (build() succeeded)

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

  // Records the commands into a new command buffer (once: run() replays it).
  Status build();
  // DC_VULKAN_PROFILE: adds each command's GPU time (its timestamp minus the one before) to rt->profile.
  Status add_profile();
  Status record_dispatch(const Command& c);
};

Status Sequence::Impl::build() {
  const auto start = std::chrono::steady_clock::now();
  const Api& a = rt->inst.api;
  VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ai.commandPool = rt->command_pool;
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = 1;
  VkResult r = a.vkAllocateCommandBuffers(rt->device, &ai, &cmd);
  if (r != VK_SUCCESS) {
    cmd = VK_NULL_HANDLE;
    return vk_status(r, "vkAllocateCommandBuffers");
  }
  VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  r = a.vkCreateFence(rt->device, &fi, nullptr, &fence);
  if (r != VK_SUCCESS) {
    fence = VK_NULL_HANDLE;
    return vk_status(r, "vkCreateFence");
  }
  VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
  qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
  const uint32_t n_queries = 2 + (rt->profiling ? static_cast<uint32_t>(commands.size()) : 0);
  qi.queryCount = n_queries;
  r = a.vkCreateQueryPool(rt->device, &qi, nullptr, &queries);
  if (r != VK_SUCCESS) {
    queries = VK_NULL_HANDLE;
    return vk_status(r, "vkCreateQueryPool");
  }
  // Reusable (no ONE_TIME_SUBMIT), and submittable more than once in one submission (run_all of a forward
  // whose segments repeat the same commands).
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_SIMULTANEOUS_USE_BIT;
  r = a.vkBeginCommandBuffer(cmd, &bi);
  if (r != VK_SUCCESS) return vk_status(r, "vkBeginCommandBuffer");
  a.vkCmdResetQueryPool(cmd, queries, 0, n_queries);
  // The uploads (earlier submissions' copies on this queue, or host writes) and the sequences run before
  // this one in the same submission (run_all) visible to the first command: a fence wait alone makes them
  // available to the host, not visible to the device.
  VkMemoryBarrier uploads{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  uploads.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_WRITE_BIT | VK_ACCESS_SHADER_WRITE_BIT;
  uploads.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  a.vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_HOST_BIT | VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                         VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &uploads, 0, nullptr, 0, nullptr);
  a.vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, queries, 0);
  for (size_t i = 0; i < commands.size(); ++i) {
    const Command& c = commands[i];
    if (c.pipeline != VK_NULL_HANDLE) {
      DC_RETURN_IF_ERROR(record_dispatch(c));
    } else {
      const VkBufferCopy region{0, 0, static_cast<VkDeviceSize>(c.bytes)};
      a.vkCmdCopyBuffer(cmd, c.handles[0], c.handles[1], 1, &region);
    }
    // Every command sees the writes of the ones before it.
    VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    barrier.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    barrier.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    a.vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                           VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &barrier, 0, nullptr, 0, nullptr);
    if (rt->profiling) a.vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries, static_cast<uint32_t>(2 + i));
  }
  if (reads_back) {  // the fence makes the downloads available to the device only; this makes them visible to the host
    VkMemoryBarrier host{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    host.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
    host.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
    a.vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &host, 0, nullptr, 0, nullptr);
  }
  a.vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries, 1);
  r = a.vkEndCommandBuffer(cmd);
  if (r != VK_SUCCESS) return vk_status(r, "vkEndCommandBuffer");
  recorded = true;
  ++rt->counters.recordings;
  rt->counters.dispatches_recorded += n_dispatches;
  rt->counters.record_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return Status();
}

Status Sequence::Impl::record_dispatch(const Command& c) {
  const Api& a = rt->inst.api;
  DC_ASSIGN_OR_RETURN(VkDescriptorSet set, new_set(c.set_layout));
  VkDescriptorBufferInfo infos[kMaxBindings];
  VkWriteDescriptorSet writes[kMaxBindings];
  for (size_t i = 0; i < c.n_buffers; ++i) {
    infos[i] = {c.handles[i], 0, VK_WHOLE_SIZE};
    writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    writes[i].dstSet = set;
    writes[i].dstBinding = static_cast<uint32_t>(i);
    writes[i].descriptorCount = 1;
    writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[i].pBufferInfo = &infos[i];
  }
  a.vkUpdateDescriptorSets(rt->device, c.n_buffers, writes, 0, nullptr);
  a.vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, c.pipeline);
  a.vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, c.layout, 0, 1, &set, 0, nullptr);
  if (c.n_push > 0) a.vkCmdPushConstants(cmd, c.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, 4 * c.n_push, c.push.data());
  a.vkCmdDispatch(cmd, c.groups[0], c.groups[1], c.groups[2]);
  return Status();
}

Status Sequence::Impl::add_profile() {
  std::vector<uint64_t> stamps(2 + commands.size());
  const VkResult r = rt->inst.api.vkGetQueryPoolResults(rt->device, queries, 0, static_cast<uint32_t>(stamps.size()),
                                                        stamps.size() * sizeof(uint64_t), stamps.data(), sizeof(uint64_t),
                                                        VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
  if (r != VK_SUCCESS) return vk_status(r, "reading the profile's timestamps");
  for (size_t i = 0; i < commands.size(); ++i) {
    const Command& c = commands[i];
    std::string key(c.shader);
    if (rt->profile_grids)  // (appended: GCC 12 warns falsely of an overlapping copy in " " + std::to_string(...))
      key.append(" ").append(std::to_string(c.groups[0])).append("x").append(std::to_string(c.groups[1])).append("x")
          .append(std::to_string(c.groups[2]));
    auto& [ms, calls] = rt->profile[key];
    ms += static_cast<double>((stamps[2 + i] - (i == 0 ? stamps[0] : stamps[1 + i])) & rt->timestamp_mask) * rt->timestamp_period_ns * 1e-6;
    ++calls;
  }
  return Status();
}

Sequence::Sequence(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Sequence::Sequence(Sequence&&) noexcept = default;
Sequence& Sequence::operator=(Sequence&&) noexcept = default;
Sequence::~Sequence() = default;
int Sequence::dispatches() const { return impl_->n_dispatches; }
bool Sequence::empty() const { return impl_->commands.empty(); }
const DeviceInfo& Sequence::device() const { return impl_->rt->info; }
bool Sequence::same_work(const Sequence& other) const { return impl_->commands == other.impl_->commands; }

Result<Sequence> Runtime::new_sequence() {
  auto s = std::make_unique<Sequence::Impl>();
  s->rt = impl_.get();
  return Sequence(std::move(s));
}

Status Sequence::record(const Dispatch& d) {
  Impl& s = *impl_;
  // (the messages are built only on an error: this runs for every dispatch of every step)
  const auto name = [&] { return "shader " + std::string(d.shader); };
  if (s.ended) return invalid_argument(name() + ": a Sequence is recorded before its first run(); record a new one");
  if (d.push.size() * 4 > kMaxPushBytes) return invalid_argument(name() + ": more than 128 bytes of push constants");
  if (d.buffers.empty() || d.buffers.size() > kMaxBindings) return invalid_argument(name() + ": 1 to 8 buffers");
  Command c;
  for (size_t i = 0; i < d.buffers.size(); ++i) {
    const Buffer* b = d.buffers[i] != nullptr ? d.buffers[i] : &s.rt->dummy;
    if (d.buffers[i] != nullptr && !s.rt->owns(*b)) return s.rt->check_owned(*b, name() + ", binding " + std::to_string(i));
    if (s.rt->buffers[b->slot_].mapped != nullptr)
      return invalid_argument(name() + ", binding " + std::to_string(i) + ": a staging buffer is not a storage buffer");
    c.ids[i] = b->id_;
    c.handles[i] = s.rt->handle(b);
  }
  c.n_buffers = static_cast<uint32_t>(d.buffers.size());
  DC_ASSIGN_OR_RETURN(Runtime::Impl::Pipeline p, s.rt->pipeline(d.shader, d.spec, d.buffers.size()));
  c.shader = d.shader;
  c.pipeline = p.pipeline, c.layout = p.layout, c.set_layout = p.set_layout;
  std::copy(d.push.begin(), d.push.end(), c.push.begin());
  c.n_push = static_cast<uint32_t>(d.push.size());
  c.groups[0] = d.groups_x, c.groups[1] = d.groups_y, c.groups[2] = d.groups_z;
  s.commands.push_back(std::move(c));
  ++s.n_dispatches;
  return Status();
}

Status Sequence::upload(Buffer& staging, const void* src, int64_t bytes, Buffer& dst) {
  Impl& s = *impl_;
  if (s.ended) return invalid_argument("upload: a Sequence is recorded before its first run(); record a new one");
  DC_RETURN_IF_ERROR(s.rt->check_owned(staging, "upload's staging buffer"));
  DC_RETURN_IF_ERROR(s.rt->check_range(dst, 0, bytes, "upload"));
  void* mapped = s.rt->buffers[staging.slot_].mapped;
  if (mapped == nullptr) return invalid_argument("upload: the staging buffer is a device buffer (Runtime::alloc_staging makes one)");
  if (bytes <= 0 || bytes > staging.bytes())
    return out_of_range("upload: " + std::to_string(bytes) + " bytes through a staging buffer of " + std::to_string(staging.bytes()));
  std::memcpy(mapped, src, static_cast<size_t>(bytes));
  ++s.rt->counters.uploads;
  s.rt->counters.upload_bytes += bytes;
  Command c;
  c.n_buffers = 2;
  c.ids[0] = staging.id_, c.ids[1] = dst.id_;
  c.handles[0] = s.rt->handle(&staging), c.handles[1] = s.rt->handle(&dst);
  c.bytes = std::min(staging.bytes(), dst.bytes());
  s.commands.push_back(std::move(c));
  return Status();
}

Status Sequence::download(const Buffer& src, Buffer& staging) {
  Impl& s = *impl_;
  if (s.ended) return invalid_argument("download: a Sequence is recorded before its first run(); record a new one");
  DC_RETURN_IF_ERROR(s.rt->check_owned(src, "download"));
  DC_RETURN_IF_ERROR(s.rt->check_owned(staging, "download's staging buffer"));
  if (s.rt->buffers[staging.slot_].mapped == nullptr)
    return invalid_argument("download: the staging buffer is a device buffer (Runtime::alloc_staging makes one)");
  if (s.rt->buffers[src.slot_].mapped != nullptr) return invalid_argument("download: from a staging buffer, not a device buffer");
  ++s.rt->counters.downloads;
  Command c;
  c.n_buffers = 2;
  c.ids[0] = src.id_, c.ids[1] = staging.id_;
  c.handles[0] = s.rt->handle(&src), c.handles[1] = s.rt->handle(&staging);
  c.bytes = std::min(src.bytes(), staging.bytes());
  s.commands.push_back(std::move(c));
  s.reads_back = true;
  return Status();
}

Status Sequence::run() { return run_all({this}); }

Status Sequence::run_all(const std::vector<Sequence*>& seqs) {
  if (seqs.empty()) return Status();
  std::vector<VkCommandBuffer> cmds;
  int n_dispatches = 0;
  for (Sequence* q : seqs) {
    Impl& s = *q->impl_;
    if (!s.ended) {
      s.ended = true;  // a failed recording is not retried: the sequence is spent
      DC_RETURN_IF_ERROR(s.build());
    }
    if (!s.recorded) return internal_error("running a sequence whose recording failed; record a new one");
    cmds.push_back(s.cmd);
    n_dispatches += s.n_dispatches;
  }
  Impl& s = *seqs.front()->impl_;
  const Api& a = s.rt->inst.api;
  VkResult r = a.vkResetFences(s.rt->device, 1, &s.fence);
  if (r != VK_SUCCESS) return vk_status(r, "vkResetFences");
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = static_cast<uint32_t>(cmds.size());
  si.pCommandBuffers = cmds.data();
  r = a.vkQueueSubmit(s.rt->queue, 1, &si, s.fence);
  ++s.rt->counters.submits;
  if (r != VK_SUCCESS) return vk_status(r, "running a sequence of " + std::to_string(n_dispatches) + " dispatches");
  r = a.vkWaitForFences(s.rt->device, 1, &s.fence, VK_TRUE, UINT64_MAX);
  if (r != VK_SUCCESS) return vk_status(r, "waiting for a sequence of " + std::to_string(n_dispatches) + " dispatches");
  s.rt->counters.dispatches_run += n_dispatches;
  if (s.rt->profiling)
    for (size_t i = 0; i < seqs.size(); ++i)
      if (std::find(seqs.begin(), seqs.begin() + static_cast<std::ptrdiff_t>(i), seqs[i]) == seqs.begin() + static_cast<std::ptrdiff_t>(i))
        DC_RETURN_IF_ERROR(seqs[i]->impl_->add_profile());
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
