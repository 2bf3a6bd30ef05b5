"""The Vulkan runtime on the real device (lavapipe in CI): memory, uploads, recordings."""
import numpy as np
import pytest

from tests.kernel_io import own_context
from vkllm.errors import VkllmError
from worker.engine.intmath import cdiv
from worker.engine.vk import device as vkdevice


def _add(ctx, a, b):
    n = a.size
    bufs = [ctx.alloc(a.nbytes) for _ in range(3)]
    ctx.upload(bufs[0], a)
    ctx.upload(bufs[1], b)
    rec = ctx.recording(max_timestamps=2)
    rec.timestamp("start")
    rec.dispatch(ctx.kernel("add_bias", {0: 64}), bufs, (cdiv(n, 64), 1, 1), dict(n=n, b_len=n))
    rec.timestamp("add")
    rec.finish()
    return rec, bufs


def test_add_matches_numpy_and_replays(vk_ctx):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(1001, np.float32), rng.standard_normal(1001, np.float32)
    rec, bufs = _add(vk_ctx, a, b)
    for _ in range(3):  # recorded once, replayed
        vk_ctx.run(rec)
        np.testing.assert_array_equal(vk_ctx.download(bufs[2], count=a.size), a + b)
    vk_ctx.upload(bufs[0], b)  # new inputs, same command buffer
    vk_ctx.run(rec)
    np.testing.assert_array_equal(vk_ctx.download(bufs[2], count=a.size), b + b)
    (label, ns), = rec.timings_ns()
    assert label == "add" and ns > 0
    rec.destroy()
    for buf in bufs:
        vk_ctx.free(buf)


def test_fill_writes_a_word_over_the_first_bytes(vk_ctx):
    """Recording.fill (split-K products zero their output with it): the first `size` bytes of a
    suballocated buffer, not the rest nor its neighbour, and a barrier makes it visible to a
    dispatch after (add_bias reads the zeros)."""
    before, buf, after = (vk_ctx.alloc(4 * 100) for _ in range(3))
    ones = np.ones(100, np.float32)
    for b in (before, buf, after):
        vk_ctx.upload(b, ones)
    out = vk_ctx.alloc(4 * 100)
    rec = vk_ctx.recording()
    rec.fill(buf, 4 * 60)
    rec.barrier()
    rec.dispatch(vk_ctx.kernel("add_bias", {0: 64}), [buf, before, out], (2, 1, 1), dict(n=100, b_len=100))
    vk_ctx.run(rec.finish())
    want = np.r_[np.zeros(60), np.ones(40)].astype(np.float32)
    np.testing.assert_array_equal(vk_ctx.download(buf, count=100), want)
    np.testing.assert_array_equal(vk_ctx.download(out, count=100), want + 1)
    for b in (before, after):
        np.testing.assert_array_equal(vk_ctx.download(b, count=100), ones)
    rec.destroy()
    for b in (before, buf, after, out):
        vk_ctx.free(b)


@pytest.mark.parametrize("poll_s", [0.0, 10.0])
def test_wait_polled_or_blocking_sees_the_work_and_resets_the_fence(vk_ctx, poll_s):
    """StagedPass's hand-offs poll the fence before blocking; both ways the work is done when
    wait returns and the fence is reset, so it serves the next submission."""
    a = np.arange(4099, dtype=np.float32)
    rec, bufs = _add(vk_ctx, a, a)
    fence = vk_ctx.new_fence()
    for k in range(1, 4):
        vk_ctx.upload(bufs[1], k * a)
        vk_ctx.submit(rec, fence)
        vk_ctx.wait(fence, poll_s)
        assert not vk_ctx.signaled(fence)
        np.testing.assert_array_equal(vk_ctx.download(bufs[2], count=a.size), (k + 1) * a)
    rec.destroy()
    for buf in bufs:
        vk_ctx.free(buf)


def test_suballocation_alignment_and_accounting(vk_ctx):
    pool = vk_ctx.device_pool
    used0 = pool.used
    bufs = [vk_ctx.alloc(n) for n in (3, 1000, 17, 4096)]
    align = vk_ctx.info.storage_offset_alignment
    assert all(b.offset % align == 0 for b in bufs)
    spans = sorted((b.block.vk_buffer, b.offset, b.offset + b.size) for b in bufs)
    assert all(x[2] <= y[1] for x, y in zip(spans, spans[1:]) if x[0] == y[0])  # no overlap
    assert pool.used >= used0 + 3 + 1000 + 17 + 4096
    for b in bufs:
        vk_ctx.free(b)
    assert pool.used == used0


def test_block_spill_and_oversized_request(vk_ctx):
    pool = vk_ctx.device_pool
    blocks0 = len(pool.blocks)
    # larger than a block, and than any block earlier tests left: a block of its own
    big = vk_ctx.alloc(max([pool.block_size] + [b.size for b in pool.blocks]) + 1)
    assert len(pool.blocks) == blocks0 + 1 and big.offset == 0
    data = np.arange(big.size // 4, dtype=np.uint32)
    vk_ctx.upload(big, data)
    np.testing.assert_array_equal(vk_ctx.download(big, np.uint32, data.size), data)
    vk_ctx.free(big)


def test_staging_upload_path(vk_settings):
    with own_context(vk_settings, block_size=16 << 20, direct_upload=False) as ctx:
        buf = ctx.alloc(5 << 20)
        data = np.random.default_rng(1).integers(0, 255, 5 << 20, dtype=np.uint8)
        ctx.upload(buf, data)
        np.testing.assert_array_equal(ctx.download(buf, np.uint8), data)


def test_device_choice_by_name_and_index(vk_ctx):
    candidates = [(vk_ctx.info, None)]
    assert vkdevice.choose_device(candidates, "0")[0] is vk_ctx.info
    assert vkdevice.choose_device(candidates, vk_ctx.info.name[:5].upper())[0] is vk_ctx.info
    with pytest.raises(VkllmError, match="no Vulkan device matches"):
        vkdevice.choose_device(candidates, "no-such-gpu")


def _info(i, kind, mem, name=None):
    return vkdevice.DeviceInfo(i, name or f"dev{i}", kind, mem, 32, 1 << 27, 16, 1 << 30, 65535, 128, 1.0, frozenset())


def test_a_number_names_a_device_by_index_only():
    """`--devices 1` is the device of index 1, never another whose name holds a "1" (an AMD
    "NAVI31", llvmpipe's "LLVM 15.0.6"): digits that are no device's index are refused."""
    candidates = [(_info(0, "discrete", 16 << 30, "AMD Radeon RX 7900 XTX (RADV NAVI31)"), None),
                  (_info(1, "discrete", 16 << 30, "AMD Radeon RX 7800 XT (RADV NAVI32)"), None)]
    assert vkdevice.choose_device(candidates, "1")[0].index == 1
    assert vkdevice.choose_device(candidates, "navi31")[0].index == 0
    with pytest.raises(VkllmError, match="no Vulkan device matches '3'"):
        vkdevice.choose_device(candidates, "3")


def test_device_ranking_prefers_discrete():
    info = _info
    candidates = [(info(0, "cpu", 64 << 30), None), (info(1, "integrated", 8 << 30), None),
                  (info(2, "discrete", 8 << 30), None), (info(3, "discrete", 24 << 30), None)]
    assert vkdevice.choose_device(candidates, None)[0].index == 3
