"""Device memory: a few large VkDeviceMemory blocks, each wrapped by one VkBuffer, with tensors
sub-allocated inside at the storage-buffer offset alignment (docs/ARCHITECTURE.md, "Memory")."""
import ctypes
import mmap
from dataclasses import dataclass

import numpy as np

from vkllm.errors import VkllmError
from worker.engine.intmath import round_up
from worker.engine.vk.loader import load_vulkan

vk = load_vulkan()

_USAGE = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
          | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)
_HOST = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
_LOCAL = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT


class OutOfDeviceMemory(VkllmError):
    pass


@dataclass(eq=False)
class Buffer:
    """A byte range [offset, offset + size) of one block's VkBuffer."""
    block: "Block"
    offset: int
    size: int

    @property
    def vk_buffer(self):
        return self.block.vk_buffer

    @property
    def host_visible(self) -> bool:
        return self.block.mapped is not None

    def sub(self, offset: int, size: int) -> "Buffer":
        """A range inside this buffer; `offset` must keep the storage-buffer offset alignment."""
        assert 0 <= offset and offset + size <= self.size
        return Buffer(self.block, self.offset + offset, size)

    def view(self, dtype=np.uint8) -> np.ndarray:
        """A zero-copy numpy view of host-visible memory; valid while the pool lives."""
        raw = self.block.mapped[self.offset:self.offset + self.size]
        return raw.view(dtype)


_HOST_POINTER = vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT


class Block:
    """One VkDeviceMemory with a VkBuffer over all of it and a first-fit free list."""

    def __init__(self, device, size: int, type_index: int, host_visible: bool, host: mmap.mmap | None = None):
        """`host`: instead of allocating, import this page-aligned host memory of `size` bytes
        (VK_EXT_external_memory_host), which other devices may import too; `type_index` is then
        not used (the driver says which types can hold it)."""
        self.device, self.size = device, size
        external = vk.VkExternalMemoryBufferCreateInfo(handleTypes=_HOST_POINTER) if host is not None else None
        info = vk.VkBufferCreateInfo(pNext=external, size=size, usage=_USAGE, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE)
        self.vk_buffer = vk.vkCreateBuffer(device, info, None)
        requirements = vk.vkGetBufferMemoryRequirements(device, self.vk_buffer)
        alloc = vk.VkMemoryAllocateInfo(allocationSize=requirements.size, memoryTypeIndex=type_index)
        self._pointer = None
        if host is not None:
            self._pointer = ctypes.c_char.from_buffer(host)   # pins the mapping while the block lives
            pointer = vk.ffi.cast("void *", ctypes.addressof(self._pointer))
            props = vk.VkMemoryHostPointerPropertiesEXT()   # the package's own would lack its sType
            vk.vkGetDeviceProcAddr(device, "vkGetMemoryHostPointerPropertiesEXT")(device, _HOST_POINTER, pointer, props)
            types = props.memoryTypeBits & requirements.memoryTypeBits
            imported = vk.VkImportMemoryHostPointerInfoEXT(handleType=_HOST_POINTER, pHostPointer=pointer)
            alloc = vk.VkMemoryAllocateInfo(pNext=imported, allocationSize=size,
                                            memoryTypeIndex=(types & -types).bit_length() - 1)
        try:
            self.memory = vk.vkAllocateMemory(device, alloc, None)
        except (vk.VkErrorOutOfDeviceMemory, vk.VkErrorOutOfHostMemory, vk.VkErrorInvalidExternalHandle) as e:
            vk.vkDestroyBuffer(device, self.vk_buffer, None)
            raise OutOfDeviceMemory(f"the device could not allocate {size / 2**20:.0f} MiB") from e
        vk.vkBindBufferMemory(device, self.vk_buffer, self.memory, 0)
        self.mapped = None
        if host is not None:
            self.mapped = np.frombuffer(host, np.uint8)
        elif host_visible:
            self.mapped = np.frombuffer(vk.vkMapMemory(device, self.memory, 0, size, 0), np.uint8)
        self.free = [(0, size)]  # sorted (offset, size) holes

    def allocate(self, size: int, alignment: int) -> int | None:
        for i, (start, hole) in enumerate(self.free):
            aligned = round_up(start, alignment)
            if aligned + size <= start + hole:
                pieces = [(start, aligned - start), (aligned + size, start + hole - aligned - size)]
                self.free[i:i + 1] = [p for p in pieces if p[1] > 0]
                return aligned
        return None

    def release(self, offset: int, size: int):
        self.free.append((offset, size))
        self.free.sort()
        merged = []
        for start, hole in self.free:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + hole)
            else:
                merged.append((start, hole))
        self.free = merged

    @property
    def used(self) -> int:
        return self.size - sum(hole for _, hole in self.free)

    def destroy(self):
        self.mapped = self._pointer = None
        vk.vkDestroyBuffer(self.device, self.vk_buffer, None)
        vk.vkFreeMemory(self.device, self.memory, None)


class Pool:
    """Blocks of one memory type. Requests larger than a block get a block of their own."""

    def __init__(self, device, type_index: int, host_visible: bool, block_size: int, alignment: int):
        self.device, self.type_index, self.host_visible = device, type_index, host_visible
        self.block_size, self.alignment = block_size, alignment
        self.blocks: list[Block] = []

    def allocate(self, size: int) -> Buffer:
        size = max(size, 4)
        for block in self.blocks:
            offset = block.allocate(size, self.alignment)
            if offset is not None:
                return Buffer(block, offset, size)
        block = Block(self.device, max(self.block_size, round_up(size, self.alignment)),
                      self.type_index, self.host_visible)
        self.blocks.append(block)
        return Buffer(block, block.allocate(size, self.alignment), size)

    def release(self, buffer: Buffer):
        buffer.block.release(buffer.offset, buffer.size)

    @property
    def reserved(self) -> int:
        return sum(b.size for b in self.blocks)

    @property
    def used(self) -> int:
        return sum(b.used for b in self.blocks)

    def destroy(self):
        for block in self.blocks:
            block.destroy()
        self.blocks = []


@dataclass(frozen=True)
class MemoryType:
    """A memory type's property flags and the size of the heap it allocates from."""
    flags: int
    heap_size: int


def memory_types(physical_device) -> list[MemoryType]:
    memory = vk.vkGetPhysicalDeviceMemoryProperties(physical_device)
    return [MemoryType(memory.memoryTypes[i].propertyFlags, memory.memoryHeaps[memory.memoryTypes[i].heapIndex].size)
            for i in range(memory.memoryTypeCount)]


def choose_memory_type(types: list[MemoryType], required: int, preferred: int = 0, main_heap: bool = False) -> int:
    """Index of a memory type with all `required` flags, preferring one that also has `preferred`;
    with `main_heap`, only among those on a heap of at least half the largest such types have: a
    GPU without resizable BAR offers device-local memory the host can map only in a window of
    256 MiB, a heap of its own, which must not hold the weights (the device-local memory proper
    is then not host-visible); with resizable BAR the mapped heap is about the whole memory."""
    fitting = [i for i, t in enumerate(types) if t.flags & required == required]
    if not fitting:
        raise VkllmError(f"the Vulkan device has no memory type with flags {required:#x}")
    if main_heap:
        largest = max(types[i].heap_size for i in fitting)
        fitting = [i for i in fitting if 2 * types[i].heap_size >= largest]
    return next((i for i in fitting if types[i].flags & preferred == preferred), fitting[0])
