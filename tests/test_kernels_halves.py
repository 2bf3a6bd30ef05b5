"""convert_f16 (the cooperative-matrix kernel's input) against numpy's f16 rounding; the products
through it on rows of any length (tests/test_kernels_matmul.py has the tiles and split-K)."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from tests.kernel_io import Device
from tests.test_kernels_matmul import assert_close, offered, product, random_weights, run_matmul
from worker.engine.kernels import elementwise, norm
from worker.engine.kernels.halves import convert_f16, f16_bytes


@pytest.mark.parametrize("k", [64, 37, 8, 3])
def test_convert_f16_pads_rows_to_eight_values(vk_ctx, k):
    """Each column's row in f16 (to nearest, as numpy), then zeros up to a multiple of 8; the
    bytes past the n columns' rows are left as they were."""
    n = 5
    rng = np.random.default_rng(k)
    x = (rng.standard_normal((n, k)) * np.logspace(-3, 3, k)).astype(np.float32)
    padded = -(-k // 8) * 8
    dev = Device(vk_ctx)
    try:
        xb = dev.put(x)
        xh = dev.put(np.full(n * padded + 8, 7.0, np.float16))
        dev.run(lambda rec: convert_f16(rec, xb, xh, n, k))
        got = dev.get(xh, np.float16, n * padded + 8)
    finally:
        dev.close()
    expected = np.zeros((n, padded), np.float16)
    expected[:, :k] = x.astype(np.float16)
    np.testing.assert_array_equal(got[:n * padded].reshape(n, padded), expected)
    assert (got[n * padded:] == 7.0).all()


@pytest.mark.parametrize("op", ["rms_norm", "swiglu", "geglu"])
def test_f16_outputs_are_the_conversion_of_the_f32_ones(vk_ctx, op):
    """The norm's and the SwiGLU's own f16 outputs (a cooperative-matrix product's input with no
    convert_f16 between) are, byte for byte, convert_f16 of their f32 outputs: that kernel's layout."""
    n, k = 3, 96
    rng = np.random.default_rng(len(op))
    a, b = (3 * rng.standard_normal((n, k))).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32)
    dev = Device(vk_ctx)
    try:
        ba, bb, f32_out = dev.put(a), dev.put(b), dev.empty(a.nbytes)
        via, direct = dev.empty(a.size * 2), dev.empty(a.size * 2)
        if op == "rms_norm":
            dev.run(lambda rec: norm.rms_norm(rec, ba, bb, f32_out, n, k, 1e-5))
            dev.run(lambda rec: norm.rms_norm_f16(rec, ba, bb, direct, n, k, 1e-5))
        else:
            glu = getattr(elementwise, op)
            dev.run(lambda rec: glu(rec, ba, bb, f32_out, n * k))
            dev.run(lambda rec: glu(rec, ba, bb, direct, n * k, f16=True))
        dev.run(lambda rec: convert_f16(rec, f32_out, via, n, k))
        np.testing.assert_array_equal(dev.get(direct, np.uint16, a.size), dev.get(via, np.uint16, a.size))
    finally:
        dev.close()


def test_convert_f16_refuses_short_scratch(vk_ctx):
    dev = Device(vk_ctx)
    try:
        xb, xh = dev.put(np.zeros((3, 37), np.float32)), dev.empty(f16_bytes(3, 37) - 16)
        with pytest.raises(ValueError, match=f"needs {f16_bytes(3, 37)} bytes"):
            dev.run(lambda rec: convert_f16(rec, xb, xh, 3, 37))
    finally:
        dev.close()


@pytest.mark.parametrize("qtype, cols", [(T.F16, 100), (T.F32, 37), (T.F16, 8), (T.BF16, 250)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_coopmat_rows_not_a_multiple_of_eight(vk_ctx, qtype, cols):
    """Float weights' rows of any length through the cooperative-matrix kernel: the padding of x's
    f16 rows multiplies the zeros past each weight row's end."""
    offered(vk_ctx, "coopmat")
    raw, w = random_weights(qtype, 90, cols, seed=cols)
    x = np.random.default_rng(cols).standard_normal((70, cols)).astype(np.float32)
    y, _ = run_matmul(vk_ctx, qtype, raw, cols, x, 70, path="coopmat")
    assert_close(y, *product(x, w, "coopmat"))
