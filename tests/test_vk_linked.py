"""What the contexts of a split model share (worker/engine/vk/linked.py): host memory every one of
them imports, and on a GPU whose driver exports them a timeline semaphore that orders their
submissions on the GPU. lavapipe imports host memory but exports no semaphore: there the
timeline orders contexts that share a logical device, and the case of two logical devices runs
on the GPU machine."""
import numpy as np
import pytest

from tests.kernel_io import own_context
from worker.engine.vk.linked import SharedMemory, Timeline, shares_timeline


def _copy(ctx, src, dst):
    rec = ctx.recording(max_sets=1)
    rec.copy(src, dst)
    return rec.finish()


def test_what_one_context_writes_to_shared_memory_the_others_read(vk_ctxs):
    a, b, c = vk_ctxs
    shared = SharedMemory(vk_ctxs, {"x": 4096, "y": 100})
    data = np.random.default_rng(0).integers(0, 2**32, 1024, dtype=np.uint32)
    src, out = a.alloc(4096), c.alloc_host(4096)
    try:
        a.upload(src, data)
        xa, xb, xc = shared.buffers("x")
        ya = shared.buffers("y")[0]
        assert ya.offset >= xa.offset + 4096 and ya.size == 100   # the names do not overlap
        for ctx, rec in ((a, _copy(a, src, xa)), (c, _copy(c, xc, out))):   # a writes it on the GPU, c reads it
            ctx.run(rec)
            rec.destroy()
        np.testing.assert_array_equal(xb.view(np.uint32), data)   # one set of pages under every context's buffer
        np.testing.assert_array_equal(out.view(np.uint32), data)
    finally:
        a.free(src)
        c.free(out)
        shared.destroy()


def test_a_timeline_queues_each_submission_after_the_one_before(vk_ctx):
    """Three copies queued at once, each reading what the one before wrote; only the last has a fence."""
    data = np.arange(1024, dtype=np.uint32)
    bufs = [vk_ctx.alloc(4096) for _ in range(3)] + [vk_ctx.alloc_host(4096)]
    timeline, fence = Timeline([vk_ctx]), vk_ctx.new_fence()
    recs = [_copy(vk_ctx, bufs[i], bufs[i + 1]) for i in range(3)]
    try:
        vk_ctx.upload(bufs[0], data)
        for i, rec in enumerate(recs):
            timeline.submit(rec, fence if i == 2 else None)
        vk_ctx.wait(fence)
        assert timeline.value == 3
        np.testing.assert_array_equal(bufs[3].view(np.uint32), data)
    finally:
        for rec in recs:
            rec.destroy()
        for buf in bufs:
            vk_ctx.free(buf)
        timeline.destroy()


def test_a_timeline_orders_stages_on_two_contexts_of_one_logical_device(vk_ctx, vk_settings):
    """Contexts sharing a logical device (engine.open_contexts gives those of one device one)
    share the semaphore itself and one import of the shared memory: on any driver."""
    with own_context(vk_settings, block_size=128 << 20, share=vk_ctx) as b:
        assert b.device == vk_ctx.device and b.queue == vk_ctx.queue and shares_timeline([vk_ctx, b])
        _two_stages_in_order(vk_ctx, b)


def test_a_timeline_orders_stages_on_two_logical_devices_of_one_gpu(vk_ctxs):
    a, b = vk_ctxs[:2]
    if not shares_timeline([a, b]):
        pytest.skip(f"{a.info.name} exports no timeline semaphore (the GPU machine runs this)")
    _two_stages_in_order(a, b)


def _two_stages_in_order(a, b):
    """A stage on a writes the shared memory, the next on b reads it, queued at once: the second
    waits for the first on the GPU."""
    shared = SharedMemory([a, b], {"x": 64 << 20})
    xa, xb = shared.buffers("x")
    data = np.random.default_rng(1).integers(0, 2**32, (64 << 20) // 4, dtype=np.uint32)
    src, out = a.alloc(64 << 20), b.alloc_host(64 << 20)
    timeline, fence = Timeline([a, b]), b.new_fence()
    first, second = _copy(a, src, xa), _copy(b, xb, out)
    try:
        a.upload(src, data)
        timeline.submit(first)
        timeline.submit(second, fence)
        b.wait(fence)
        np.testing.assert_array_equal(out.view(np.uint32), data)
    finally:
        for rec in (first, second):
            rec.destroy()
        a.free(src)
        b.free(out)
        timeline.destroy()
        shared.destroy()
