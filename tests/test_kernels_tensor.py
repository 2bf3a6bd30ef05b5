"""DeviceTensor upload: row splitting over the binding range, byte sizes, refusals."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from tests.kernel_io import own_context
from vkllm.errors import VkllmError
from worker.engine.kernels.tensor import free_tensor, upload_tensor
from worker.engine.weight_types import row_bytes


@pytest.fixture(scope="module")
def small_ctx(vk_settings):
    with own_context(vk_settings, block_size=4 << 20, max_binding_range=4096) as ctx:
        yield ctx


@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4],
                         ids=lambda t: t.name)
def test_row_bytes_match_gguf_quantize(qtype):
    assert row_bytes(qtype, 64) == gq.quantize(np.zeros((1, 64), np.float32), qtype).view(np.uint8).nbytes


def test_parts_cover_rows_in_order(small_ctx):
    rows, cols = 50, 512  # Q8_0: 544 bytes a row, 7 rows per 4096-byte part
    data = np.random.default_rng(0).integers(0, 256, (rows, row_bytes(T.Q8_0, cols)), dtype=np.uint8)
    tensor = upload_tensor(small_ctx, "blk.0.ffn_up.weight", T.Q8_0, (cols, rows), data)
    assert (tensor.rows, tensor.cols, tensor.row_bytes) == (rows, cols, 544)
    assert [(first, count) for _, first, count in tensor.parts] == [(i, min(7, rows - i)) for i in range(0, rows, 7)]
    for buffer, first, count in tensor.parts:
        assert buffer.size <= small_ctx.max_binding_range
        np.testing.assert_array_equal(small_ctx.download(buffer, np.uint8).reshape(count, -1),
                                      data[first:first + count])
    free_tensor(small_ctx, tensor)
    assert tensor.parts == []


def test_higher_dimensions_are_rows(vk_ctx):
    data = np.zeros((3, 4, 32), np.float16)
    tensor = upload_tensor(vk_ctx, "t", T.F16, (32, 4, 3), data.view(np.uint8))
    assert (tensor.rows, tensor.cols, len(tensor.parts)) == (12, 32, 1)
    free_tensor(vk_ctx, tensor)


@pytest.mark.parametrize("qtype, shape, nbytes, message", [
    (T.Q4_0, (48, 2), 54, "not a multiple"),
    (T.Q4_0, (64, 2), 70, "bytes for 2 rows"),
    (T.IQ2_XXS, (256, 1), 66, "not supported"),
    (T.F32, (2048, 1), 8192, "exceeds the binding range"),
])
def test_refusals(small_ctx, qtype, shape, nbytes, message):
    with pytest.raises(VkllmError, match=message):
        upload_tensor(small_ctx, "t", qtype, shape, np.zeros(nbytes, np.uint8))
