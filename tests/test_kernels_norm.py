"""RMSNorm on the real device against float64 numpy references."""
import numpy as np
import pytest

from tests.kernel_io import f32
from worker.engine.kernels import norm


# 4-vector rows within one 4-vector per invocation (576) and past it (4100), single values (1003, 7)
@pytest.mark.parametrize("rows, cols", [(1, 576), (2, 4100), (5, 1003), (3, 7)])
def test_rms_norm_with_weight(dev, rows, cols):
    rng = np.random.default_rng(cols)
    x, w = 3 * f32(rng, rows, cols), f32(rng, cols)
    out = dev.empty(x.nbytes)
    dev.run(lambda rec: norm.rms_norm(rec, dev.put(x), dev.put(w), out, rows, cols, 1e-5))
    v = x.astype(np.float64)
    want = v / np.sqrt((v * v).mean(axis=1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(dev.get(out, count=x.size).reshape(rows, cols), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cols", [130, 4100])
def test_rms_norm_in_place_and_eps(dev, cols):
    rng = np.random.default_rng(9)
    x, w = 1e-3 * f32(rng, 4, cols), f32(rng, cols)
    bx = dev.put(x)
    dev.run(lambda rec: norm.rms_norm(rec, bx, dev.put(w), bx, 4, cols, 1e-6))
    v = x.astype(np.float64)
    want = v / np.sqrt((v * v).mean(axis=1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(dev.get(bx, count=x.size).reshape(4, cols), want, rtol=1e-5, atol=1e-6)


def test_gathered_rows(dev):
    """The output norm of a batched pass: only the rows that get logits, in the order asked."""
    rng = np.random.default_rng(4)
    x, w = f32(rng, 7, 96), f32(rng, 96)
    rows = np.array([6, 2, 3], np.uint32)
    out = dev.empty(3 * 96 * 4)
    dev.run(lambda rec: norm.rms_norm(rec, dev.put(x), dev.put(w), out, 3, 96, 1e-5, gather=dev.put(rows)))
    want = x[rows] / np.sqrt(np.mean(x[rows].astype(np.float64) ** 2, axis=1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(dev.get(out, count=3 * 96).reshape(3, 96), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cols", [576, 4100, 1003])
def test_rms_norm_add_adds_into_the_output(dev, cols):
    """A post norm and its residual add: out += rms_norm(x) * w, 4-vector rows and single values."""
    rng = np.random.default_rng(cols + 1)
    x, w, res = 3 * f32(rng, 3, cols), f32(rng, cols), f32(rng, 3, cols)
    out = dev.put(res)
    dev.run(lambda rec: norm.rms_norm_add(rec, dev.put(x), dev.put(w), out, 3, cols, 1e-6))
    v = x.astype(np.float64)
    want = res + v / np.sqrt((v * v).mean(axis=1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(dev.get(out, count=x.size).reshape(3, cols), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows, cols", [(3, 4096), (2, 96)])
def test_rms_norm_in_f16(dev, rows, cols):
    """The norm straight into a cooperative-matrix product's f16 input: within f16 rounding."""
    rng = np.random.default_rng(cols + 2)
    x, w = 3 * f32(rng, rows, cols), f32(rng, cols)
    out = dev.empty(x.size * 2)
    dev.run(lambda rec: norm.rms_norm_f16(rec, dev.put(x), dev.put(w), out, rows, cols, 1e-5))
    v = x.astype(np.float64)
    want = v / np.sqrt((v * v).mean(axis=1, keepdims=True) + 1e-5) * w
    got = dev.get(out, np.float16, count=x.size).reshape(rows, cols)
    np.testing.assert_allclose(got, want, rtol=2 ** -10, atol=2 ** -14)
