"""The Vulkan context a model runs on (or a stage of a split one): device, memory pools, kernels,
submission."""
import time
from pathlib import Path

import numpy as np

from worker.engine.config import Settings
from worker.engine.shaderbuild import load_spirv
from worker.engine.vk import device as vkdevice
from worker.engine.vk.commands import Recording
from worker.engine.vk.debug import ValidationLog
from worker.engine.vk.loader import load_vulkan
from worker.engine.vk.memory import (
    _HOST,
    _LOCAL,
    Buffer,
    Pool,
    choose_memory_type,
    memory_types,
)
from worker.engine.vk.pipeline import Kernel

vk = load_vulkan()

STAGING_BYTES = 64 << 20


class LogicalDevice:
    """The instance, logical device and compute queue of settings.device, shared by the contexts
    that run on it (`Context`'s `share`); the last context closed destroys them."""

    def __init__(self, settings: Settings):
        self.instance = vkdevice.create_instance(settings.validation)
        self.validation = ValidationLog(self.instance) if settings.validation else None
        self.info, self.physical_device = vkdevice.choose_device(vkdevice.list_devices(self.instance),
                                                                 settings.device)
        self.queue_family = vkdevice.compute_queue_family(self.physical_device)
        self.device, self.queue, self.extensions = vkdevice.create_logical_device(
            self.physical_device, self.info, self.queue_family)
        self.users = 0

    def release(self):
        self.users -= 1
        if self.users == 0:
            vk.vkDestroyDevice(self.device, None)
            if self.validation is not None:
                self.validation.destroy()
            vk.vkDestroyInstance(self.instance, None)


class Context:
    """Memory pools, kernels and submission on a logical device: its own (settings.device's), or
    `share`'s, another context's (engine.open_contexts gives the contexts of one device one logical
    device and queue, where a VkDevice each made the GPU switch between them at every hand-off of
    a split, vk/linked.py). `block_size` and `max_binding_range` can be lowered (tests do, to
    exercise block spill-over and row splitting on small data); `direct_upload=False` forces
    uploads through the staging buffer even when device memory is host-visible."""

    def __init__(self, settings: Settings | None = None, *, block_size: int = 1 << 30,
                 max_binding_range: int | None = None, direct_upload: bool | None = None,
                 share: "Context | None" = None):
        self.settings = settings or Settings()
        self.logical = share.logical if share is not None else LogicalDevice(self.settings)
        self.logical.users += 1
        self.instance, self.validation = self.logical.instance, self.logical.validation
        self.info, self.physical_device = self.logical.info, self.logical.physical_device
        self.queue_family, self.queue = self.logical.queue_family, self.logical.queue
        self.device, self.extensions = self.logical.device, self.logical.extensions
        self.max_binding_range = min(self.info.max_storage_buffer_range, max_binding_range or 1 << 62)
        block_size = min(block_size, self.info.max_allocation)
        self.alignment = alignment = max(self.info.storage_offset_alignment, 16)   # of every buffer and sub-range
        types = memory_types(self.physical_device)
        local_type = choose_memory_type(types, _LOCAL, _HOST, main_heap=True)
        local_host_visible = types[local_type].flags & _HOST == _HOST
        self.direct_upload = local_host_visible if direct_upload is None else direct_upload and local_host_visible
        self.device_pool = Pool(self.device, local_type, local_host_visible, block_size, alignment)
        host_type = choose_memory_type(types, _HOST, vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT)
        self.host_pool = Pool(self.device, host_type, True, min(block_size, 256 << 20), alignment)
        pool_info = vk.VkCommandPoolCreateInfo(queueFamilyIndex=self.queue_family,
                                               flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT)
        self.command_pool = vk.vkCreateCommandPool(self.device, pool_info, None)
        self.fence = vk.vkCreateFence(self.device, vk.VkFenceCreateInfo(), None)
        self._fences = [self.fence]
        self._extra_fences = []
        self._kernels: dict[tuple, Kernel] = {}
        self._staging: Buffer | None = None

    # -- memory -------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> Buffer:
        """Device-local memory (host-visible too where the device allows it)."""
        return self.device_pool.allocate(nbytes)

    def alloc_host(self, nbytes: int) -> Buffer:
        """Host memory: readbacks, staging."""
        return self.host_pool.allocate(nbytes)

    def alloc_input(self, nbytes: int) -> Buffer:
        """Memory the host writes and kernels read every pass (step values, token ids, the KV
        block table): device memory where the host can map it (resizable BAR, integrated GPUs,
        CPU drivers), so that the kernels' reads are no bus round trip, else host memory."""
        return (self.device_pool if self.device_pool.host_visible else self.host_pool).allocate(nbytes)

    def free(self, buffer: Buffer):
        (self.host_pool if buffer.block in self.host_pool.blocks else self.device_pool).release(buffer)

    def upload(self, buffer: Buffer, data):
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        assert raw.nbytes <= buffer.size, f"{raw.nbytes} bytes into a {buffer.size}-byte buffer"
        if buffer.host_visible and (self.direct_upload or buffer.block in self.host_pool.blocks):
            buffer.view()[:raw.nbytes] = raw
            return
        staging = self._staging_buffer()
        for start in range(0, raw.nbytes, staging.size):
            chunk = raw[start:start + staging.size]
            staging.view()[:chunk.nbytes] = chunk
            self._copy_now(staging, Buffer(buffer.block, buffer.offset + start, chunk.nbytes), chunk.nbytes)

    def download(self, buffer: Buffer, dtype=np.float32, count: int | None = None) -> np.ndarray:
        nbytes = buffer.size if count is None else count * np.dtype(dtype).itemsize
        if buffer.host_visible:
            return buffer.view()[:nbytes].copy().view(dtype)
        staging = self._staging_buffer()
        out = np.empty(nbytes, np.uint8)
        for start in range(0, nbytes, staging.size):
            n = min(staging.size, nbytes - start)
            self._copy_now(Buffer(buffer.block, buffer.offset + start, n), staging, n)
            out[start:start + n] = staging.view()[:n]
        return out.view(dtype)

    def _staging_buffer(self) -> Buffer:
        if self._staging is None:
            self._staging = self.alloc_host(STAGING_BYTES)
        return self._staging

    def _copy_now(self, src: Buffer, dst: Buffer, size: int):
        rec = self.recording(max_sets=1)
        rec.copy(src, dst, size)
        self.run(rec.finish())
        rec.destroy()

    # -- kernels and submission ---------------------------------------------------------------
    def kernel(self, name: str, spec: dict[int, int] | None = None) -> Kernel:
        key = (name, tuple(sorted((spec or {}).items())))
        if key not in self._kernels:
            shader = load_spirv(name, Path(self.settings.cache_dir))
            self._kernels[key] = Kernel(self.device, name, shader, dict(spec or {}))
        return self._kernels[key]

    def recording(self, max_sets: int = 4096, max_timestamps: int = 0, profile: bool = False) -> Recording:
        return Recording(self, max_sets, max_timestamps, profile)

    def run(self, recording: Recording):
        """Submit a finished recording and wait for it (once per token: the structs are prebuilt)."""
        self.submit(recording, self._fences)
        self.wait(self._fences)

    def new_fence(self) -> list:
        """A fence for `submit`/`wait`, as the one-element list both take (built once, not per
        call); destroyed with the context."""
        fence = [vk.vkCreateFence(self.device, vk.VkFenceCreateInfo(), None)]
        self._extra_fences.append(fence[0])
        return fence

    def submit(self, recording: Recording, fence: list):
        """Queue a finished recording without waiting. Recordings run in submission order; one
        that reads what an earlier one wrote starts with a barrier."""
        vk.vkQueueSubmit(self.queue, 1, recording.submit_infos, fence[0])

    def wait(self, fence: list, poll_s: float = 0.0):
        """Blocks until the fence signals, then resets it. `poll_s`: polls it first, for up to
        that long; a poll sees the signal sooner than the blocking wait wakes (StagedPass)."""
        deadline = time.perf_counter() + poll_s
        while poll_s and not self.signaled(fence) and time.perf_counter() < deadline:
            pass
        vk.vkWaitForFences(self.device, 1, fence, vk.VK_TRUE, 0xFFFFFFFFFFFFFFFF)
        vk.vkResetFences(self.device, 1, fence)

    def signaled(self, fence: list) -> bool:
        try:
            vk.vkGetFenceStatus(self.device, fence[0])
        except vk.VkNotReady:
            return False
        return True

    # -- accounting ---------------------------------------------------------------------------
    def memory_budget(self) -> tuple[int, int]:
        """(used, total) bytes of device-local memory: VK_EXT_memory_budget where the device
        reports it, else our own allocations against the device-local heap size."""
        if "VK_EXT_memory_budget" in self.extensions:
            budget = vk.VkPhysicalDeviceMemoryBudgetPropertiesEXT()
            props = vk.VkPhysicalDeviceMemoryProperties2(pNext=budget)
            vk.vkGetPhysicalDeviceMemoryProperties2(self.physical_device, props)
            heaps = props.memoryProperties
            local = [i for i in range(heaps.memoryHeapCount)
                     if heaps.memoryHeaps[i].flags & vk.VK_MEMORY_HEAP_DEVICE_LOCAL_BIT]
            total = sum(budget.heapBudget[i] for i in local)
            if total:
                return sum(budget.heapUsage[i] for i in local), total
        return self.device_pool.reserved, self.info.device_local_bytes

    def available(self, utilization: float = 1.0) -> int:
        """Bytes that may still be allocated here while at most `utilization` of the device's
        memory is in use: that share of memory_budget's total less its usage, the free space of
        this context's own blocks (where allocations go first) counted as available."""
        used, total = self.memory_budget()
        return int(total * utilization) - used + self.device_pool.reserved - self.device_pool.used

    def close(self):
        vk.vkDeviceWaitIdle(self.device)
        for kernel in self._kernels.values():
            kernel.destroy()
        self._kernels.clear()
        self.device_pool.destroy()
        self.host_pool.destroy()
        for fence in [self.fence, *self._extra_fences]:
            vk.vkDestroyFence(self.device, fence, None)
        vk.vkDestroyCommandPool(self.device, self.command_pool, None)
        self.logical.release()
