"""RMSNorm and softmax on the real device against float64 numpy references."""
import numpy as np
import pytest

from tests.kernel_io import f32
from worker.engine.kernels import norm


@pytest.mark.parametrize("rows, cols", [(1, 576), (5, 1003), (3, 7)])
def test_rms_norm_with_weight(dev, rows, cols):
    rng = np.random.default_rng(cols)
    x, w = 3 * f32(rng, rows, cols), f32(rng, cols)
    out = dev.empty(x.nbytes)
    dev.run(lambda rec: norm.rms_norm(rec, dev.put(x), dev.put(w), out, rows, cols, 1e-5))
    v = x.astype(np.float64)
    want = v / np.sqrt((v * v).mean(axis=1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(dev.get(out, count=x.size).reshape(rows, cols), want, rtol=1e-5, atol=1e-6)


def test_rms_norm_without_weight_in_place_and_eps(dev):
    rng = np.random.default_rng(9)
    x = 1e-3 * f32(rng, 4, 130)
    bx = dev.put(x)
    dev.run(lambda rec: norm.rms_norm(rec, bx, None, bx, 4, 130, 1e-6))
    v = x.astype(np.float64)
    want = v / np.sqrt((v * v).mean(axis=1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(dev.get(bx, count=x.size).reshape(4, 130), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows, cols", [(3, 1001), (2, 5), (1, 49152)])
def test_softmax(dev, rows, cols):
    rng = np.random.default_rng(cols)
    x = 10 * f32(rng, rows, cols)
    x[0, :2] = [80.0, -1e30]  # large values must not overflow; huge negatives give 0
    out = dev.empty(x.nbytes)
    dev.run(lambda rec: norm.softmax(rec, dev.put(x), out, rows, cols))
    v = x.astype(np.float64)
    e = np.exp(v - v.max(axis=1, keepdims=True))
    got = dev.get(out, count=x.size).reshape(rows, cols)
    np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-8)
