"""What the contexts of a split model share (worker/engine/staged.py).

- **Memory**: host memory that every context imports (VK_EXT_external_memory_host: the same
  pages under a buffer of each device), so a stage reads the hidden state and the token ids the
  stage before wrote with no copy by the host. Two GPUs can import the same pages; so can two
  contexts on one.
- **Order** (`Timeline`): where every context is on one logical device (engine.open_contexts
  gives the contexts of one GPU one), or on one GPU whose driver exports timeline semaphores as
  opaque fds (VK_KHR_external_semaphore_fd; NVIDIA's does, lavapipe's does not), one timeline
  semaphore that all of them use: each submission waits for the value the one before it
  signalled and signals the next, whatever its context, so a pass's stages, and the passes
  after it, are queued at once and run one after the other on the GPU with no host round trip
  between them. An opaque fd only travels between devices with the same UUIDs (the spec's
  compatibility rule), so contexts on different GPUs order their stages through the host
  instead (`staged.py`).

H200, 2026-12-02 (an experiment: two VkDevices, stages of 5 ms of copies each): the next stage
started 212 us after the one before ended when the host polled its fence and submitted it, 553 us
when it blocked on the fence, 10 us when the GPU waited on the shared timeline; each switch
between the devices still cost the GPU 90-126 us (stages of 0.16 to 5 ms), which one device
never pays."""
import mmap

from vkllm.errors import VkllmError
from worker.engine.intmath import round_up
from worker.engine.vk.loader import load_vulkan
from worker.engine.vk.memory import Block, Buffer

vk = load_vulkan()

_OPAQUE_FD = vk.VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT


class SharedMemory:
    """Host memory imported by every context of `ctxs`, for buffers of the given sizes by name:
    `buffers(name)` gives one per context over the same bytes, in the order of `ctxs`."""

    def __init__(self, ctxs, sizes: dict[str, int]):
        missing = [ctx.info.describe() for ctx in ctxs if "VK_EXT_external_memory_host" not in ctx.extensions]
        if missing:
            raise VkllmError(f"splitting a model needs VK_EXT_external_memory_host, which {'; '.join(missing)} lacks")
        alignment = max(ctx.alignment for ctx in ctxs)
        self._offsets, total = {}, 0
        for name, nbytes in sizes.items():
            self._offsets[name] = (total, nbytes)
            total = round_up(total + nbytes, alignment)
        total = round_up(max(total, 1), mmap.PAGESIZE)
        self._host = mmap.mmap(-1, total)   # page-aligned: the import alignment of every driver seen
        self._imports = {}   # one per logical device (contexts may share one)
        for ctx in ctxs:
            self._imports.setdefault(ctx.device, Block(ctx.device, total, 0, True, host=self._host))
        self._blocks = [self._imports[ctx.device] for ctx in ctxs]

    def buffers(self, name: str) -> list[Buffer]:
        offset, nbytes = self._offsets[name]
        return [Buffer(block, offset, nbytes) for block in self._blocks]

    def destroy(self):
        for block in self._imports.values():
            block.destroy()
        self._imports, self._blocks = {}, []


def shares_timeline(ctxs) -> bool:
    """Whether `Timeline` can order submissions across `ctxs` on the GPU: they share one logical
    device, or its semaphore's fd can move between theirs."""
    return len({ctx.device for ctx in ctxs}) == 1 or (
        all(ctx.info.shares_timeline for ctx in ctxs) and len({ctx.info.uuid for ctx in ctxs}) == 1)


class Timeline:
    """One timeline semaphore, created in the first context: the contexts on its logical device
    take it as it is, those on others import it (exported then); `submit` queues a recording
    after everything submitted through it before."""

    def __init__(self, ctxs):
        kind = vk.VkSemaphoreTypeCreateInfo(semaphoreType=vk.VK_SEMAPHORE_TYPE_TIMELINE)
        first = ctxs[0]
        others = [ctx for ctx in ctxs if ctx.device != first.device]
        export = vk.VkExportSemaphoreCreateInfo(pNext=kind, handleTypes=_OPAQUE_FD) if others else kind
        created = vk.vkCreateSemaphore(first.device, vk.VkSemaphoreCreateInfo(pNext=export), None)
        self.semaphores = {ctx: created for ctx in ctxs if ctx.device == first.device}
        self._owned = [(first.device, created)]   # (device, semaphore) of each handle made here
        for ctx in others:
            get_fd = vk.vkGetDeviceProcAddr(first.device, "vkGetSemaphoreFdKHR")
            semaphore = vk.vkCreateSemaphore(ctx.device, vk.VkSemaphoreCreateInfo(pNext=kind), None)
            self.semaphores[ctx] = semaphore
            self._owned.append((ctx.device, semaphore))
            fd = get_fd(first.device, vk.VkSemaphoreGetFdInfoKHR(semaphore=self.semaphores[first],
                                                                 handleType=_OPAQUE_FD))
            import_fd = vk.vkGetDeviceProcAddr(ctx.device, "vkImportSemaphoreFdKHR")
            import_fd(ctx.device, vk.VkImportSemaphoreFdInfoKHR(semaphore=semaphore, handleType=_OPAQUE_FD, fd=fd))
        self.value = 0   # signalled by the last submission

    def submit(self, recording, fence: list | None = None):
        """Queues `recording` (on its own context) to start once the submission before it is
        done; `fence` (Context.new_fence's), if given, signals when it is."""
        infos, values = recording.timeline_submit_infos(self.semaphores[recording.ctx])
        values[0], values[1] = self.value, self.value + 1
        self.value += 1
        vk.vkQueueSubmit(recording.ctx.queue, 1, infos, fence[0] if fence else None)

    def destroy(self):
        for device, semaphore in self._owned:
            vk.vkDestroySemaphore(device, semaphore, None)
        self.semaphores, self._owned = {}, []
