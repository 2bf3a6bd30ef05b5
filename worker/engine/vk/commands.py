"""Command buffers recorded once and replayed: dispatches with their descriptor sets, barriers,
copies and GPU timestamps. A Recording owns everything its command buffer refers to."""
import numpy as np

from worker.engine.vk.loader import load_vulkan
from worker.engine.vk.memory import Buffer
from worker.engine.vk.pipeline import PUSH_CONSTANT_BYTES, Kernel

vk = load_vulkan()

# Host writes made before a submit are visible to it without a barrier (queue submit guarantees it).
_ACCESS = vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_READ_BIT \
    | vk.VK_ACCESS_TRANSFER_WRITE_BIT
_STAGES = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT
_BARRIER = [vk.VkMemoryBarrier(srcAccessMask=_ACCESS, dstAccessMask=_ACCESS)]   # built once: recording is host-bound


class Recording:
    """Record with dispatch/barrier/copy/timestamp, then `finish()`; submit through the Context."""

    def __init__(self, ctx, max_sets: int = 4096, max_timestamps: int = 0, profile: bool = False):
        """`profile` writes a timestamp after every dispatch, labelled with the kernel's name."""
        self.ctx, self.device = ctx, ctx.device
        self.max_sets = max_sets
        sizes = [vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=max_sets * 8)]
        pool_info = vk.VkDescriptorPoolCreateInfo(maxSets=max_sets, poolSizeCount=1, pPoolSizes=sizes)
        self.descriptor_pool = vk.vkCreateDescriptorPool(self.device, pool_info, None)
        alloc = vk.VkCommandBufferAllocateInfo(commandPool=ctx.command_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                               commandBufferCount=1)
        self.command_buffer = vk.vkAllocateCommandBuffers(self.device, alloc)[0]
        vk.vkBeginCommandBuffer(self.command_buffer, vk.VkCommandBufferBeginInfo())
        self.query_pool, self.labels = None, []
        if max_timestamps or profile:
            max_timestamps = max(max_timestamps, max_sets + 1) if profile else max_timestamps
            query_info = vk.VkQueryPoolCreateInfo(queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=max_timestamps)
            self.query_pool = vk.vkCreateQueryPool(self.device, query_info, None)
            vk.vkCmdResetQueryPool(self.command_buffer, self.query_pool, 0, max_timestamps)
        self.sets_used, self.dispatches = 0, 0
        self._set_allocs = {}   # kernel -> its VkDescriptorSetAllocateInfo from this pool
        self._buffer_infos = {}   # (buffer, offset, size) -> its VkDescriptorBufferInfo
        self.profile = profile
        if profile:
            self.timestamp("start")

    def dispatch(self, kernel: Kernel, buffers: list[Buffer], groups: tuple[int, int, int],
                 push: dict | None = None):
        """`push`: {name: value} for every member of the kernel's push-constant block."""
        assert len(buffers) == kernel.bindings, f"{kernel.name} takes {kernel.bindings} buffers"
        push = kernel.push.pack(push or {})
        assert len(push) <= PUSH_CONSTANT_BYTES
        if kernel not in self._set_allocs:   # the struct building is most of a dispatch's host time
            self._set_allocs[kernel] = vk.VkDescriptorSetAllocateInfo(
                descriptorPool=self.descriptor_pool, descriptorSetCount=1, pSetLayouts=[kernel.descriptor_set_layout])
        descriptor_set = vk.vkAllocateDescriptorSets(self.device, self._set_allocs[kernel])[0]
        self.sets_used += 1
        # one write for all bindings: bindings 0 .. n-1 are alike, so the update runs on through them
        infos = [self._buffer_info(b) for b in buffers]
        writes = [vk.VkWriteDescriptorSet(dstSet=descriptor_set, dstBinding=0, descriptorCount=len(infos),
                                          descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, pBufferInfo=infos)]
        vk.vkUpdateDescriptorSets(self.device, 1, writes, 0, None)
        cb = self.command_buffer
        vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, kernel.compute_pipeline)
        sets = [descriptor_set]
        vk.vkCmdBindDescriptorSets(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, kernel.pipeline_layout, 0, 1, sets, 0, None)
        if push:
            vk.vkCmdPushConstants(cb, kernel.pipeline_layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(push),
                                  vk.ffi.from_buffer(push))
        vk.vkCmdDispatch(cb, *groups)
        self.dispatches += 1
        if self.profile:
            self.timestamp(kernel.name)

    def _buffer_info(self, b: Buffer):
        key = (b.vk_buffer, b.offset, b.size)
        if key not in self._buffer_infos:
            self._buffer_infos[key] = vk.VkDescriptorBufferInfo(buffer=b.vk_buffer, offset=b.offset, range=b.size)
        return self._buffer_infos[key]

    def barrier(self):
        """Shader and transfer work before is finished and visible to all that comes after."""
        vk.vkCmdPipelineBarrier(self.command_buffer, _STAGES, _STAGES, 0, 1, _BARRIER, 0, None, 0, None)

    def fill(self, dst: Buffer, size: int, value: int = 0):
        """The first `size` bytes of dst (a multiple of 4) = the 32-bit word `value`, repeated."""
        vk.vkCmdFillBuffer(self.command_buffer, dst.vk_buffer, dst.offset, size, value)

    def copy(self, src: Buffer, dst: Buffer, size: int | None = None):
        size = min(src.size, dst.size) if size is None else size
        regions = [vk.VkBufferCopy(srcOffset=src.offset, dstOffset=dst.offset, size=size)]
        vk.vkCmdCopyBuffer(self.command_buffer, src.vk_buffer, dst.vk_buffer, 1, regions)

    def timestamp(self, label: str):
        vk.vkCmdWriteTimestamp(self.command_buffer, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, self.query_pool,
                               len(self.labels))
        self.labels.append(label)

    def finish(self) -> "Recording":
        """Ends recording; a final barrier makes shader writes visible to host reads after the fence."""
        barrier = [vk.VkMemoryBarrier(srcAccessMask=_ACCESS, dstAccessMask=vk.VK_ACCESS_HOST_READ_BIT)]
        vk.vkCmdPipelineBarrier(self.command_buffer, _STAGES, vk.VK_PIPELINE_STAGE_HOST_BIT, 0,
                                1, barrier, 0, None, 0, None)
        vk.vkEndCommandBuffer(self.command_buffer)
        self._command_buffers = [self.command_buffer]  # kept alive: the submit struct points at it
        self.submit_infos = [vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=self._command_buffers)]
        self._timeline_submit = None
        return self

    def timeline_submit_infos(self, semaphore) -> tuple[list, object]:
        """Submit structs that wait for the timeline `semaphore` to reach values[0] before the
        command buffer starts and set it to values[1] when it is done; `values` (a cffi
        uint64_t[2]) is filled by the caller before each submission (vk/linked.py)."""
        if self._timeline_submit is None:
            values = vk.ffi.new("uint64_t[2]")
            counts = vk.VkTimelineSemaphoreSubmitInfo(waitSemaphoreValueCount=1, pWaitSemaphoreValues=values,
                                                      signalSemaphoreValueCount=1, pSignalSemaphoreValues=values + 1)
            semaphores, stages = [semaphore], [vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT]
            infos = [vk.VkSubmitInfo(pNext=counts, waitSemaphoreCount=1, pWaitSemaphores=semaphores,
                                     pWaitDstStageMask=stages, commandBufferCount=1,
                                     pCommandBuffers=self._command_buffers, signalSemaphoreCount=1,
                                     pSignalSemaphores=semaphores)]
            self._timeline_submit = (infos, values, counts, semaphores, stages)   # all kept alive
        return self._timeline_submit[0], self._timeline_submit[1]

    def timings_ns(self) -> list[tuple[str, float]]:
        """(label, ns since the previous timestamp) for each timestamp after the first."""
        n = len(self.labels)
        data = np.zeros(n, np.uint64)
        vk.vkGetQueryPoolResults(self.device, self.query_pool, 0, n, data.nbytes, vk.ffi.from_buffer(data), 8,
                                 vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
        ticks = np.diff(data.astype(np.float64)) * self.ctx.info.timestamp_period_ns
        return list(zip(self.labels[1:], ticks.tolist()))

    def destroy(self):
        vk.vkFreeCommandBuffers(self.device, self.ctx.command_pool, 1, [self.command_buffer])
        vk.vkDestroyDescriptorPool(self.device, self.descriptor_pool, None)
        if self.query_pool is not None:
            vk.vkDestroyQueryPool(self.device, self.query_pool, None)
