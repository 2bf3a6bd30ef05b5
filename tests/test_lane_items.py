"""lane_items.glsl, the loads of mul_mat_coopmat_frag.comp's lanes, on any device: the frag
kernel runs only where the matrix layout is NVIDIA's (test_kernels_matmul.py tests it there), so
lane_items_probe.comp dequantizes the weights through the same loads and words and the values
must be gguf's."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from tests.test_kernels_matmul import random_weights
from worker.engine.intmath import cdiv


@pytest.mark.parametrize("blocks", [1, 7, 16])
@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q5_K, T.Q6_K], ids=lambda t: t.name)
def test_lane_items_dequantize_as_gguf(vk_ctx, qtype, blocks):
    """Every lane's four values of every group of every lane item, rows of an odd number of
    blocks included (Q6_K's 210-byte blocks then start 2 bytes into a word on every other row)."""
    rows, cols = 37, 256 * blocks
    raw, ref = random_weights(qtype, rows, cols, seed=blocks)
    weights, out = vk_ctx.alloc(raw.nbytes + 16), vk_ctx.alloc(4 * rows * cols)
    try:
        vk_ctx.upload(weights, raw)
        vk_ctx.upload(out, np.full(rows * cols, np.nan, np.float32))
        rec = vk_ctx.recording()
        rec.dispatch(vk_ctx.kernel(f"lane_items_probe_{qtype.name.lower()}", {0: 64}), [weights, out],
                     (cdiv(4 * rows, 64), 1, 1), {"rows": rows, "ncols": cols})
        vk_ctx.run(rec.finish())
        rec.destroy()
        got = vk_ctx.download(out, np.float32, rows * cols).reshape(rows, cols)
    finally:
        vk_ctx.free(weights)
        vk_ctx.free(out)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max())
