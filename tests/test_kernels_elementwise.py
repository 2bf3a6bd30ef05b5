"""Elementwise kernels on the real device against float64 numpy references."""
import numpy as np

from tests.kernel_io import f32
from worker.engine.kernels import elementwise
from worker.engine.kernels.launch import threads


def test_add_and_in_place(dev):
    rng = np.random.default_rng(1)
    a, b = f32(rng, 1037), f32(rng, 1037)
    ba, bb, out = dev.put(a), dev.put(b), dev.empty(a.nbytes)
    dev.run(lambda rec: elementwise.add(rec, ba, bb, out, a.size))
    np.testing.assert_allclose(dev.get(out, count=a.size), a.astype(np.float64) + b, rtol=1e-6)
    dev.run(lambda rec: elementwise.add(rec, ba, bb, ba, a.size))  # residual: out is a
    np.testing.assert_allclose(dev.get(ba, count=a.size), a.astype(np.float64) + b, rtol=1e-6)


def test_add_bias_broadcasts_rows(dev):
    rng = np.random.default_rng(2)
    x, bias = f32(rng, 7, 45), f32(rng, 45)
    bx = dev.put(x)
    dev.run(lambda rec: elementwise.add_bias(rec, bx, dev.put(bias), 7, 45))
    np.testing.assert_allclose(dev.get(bx, count=x.size).reshape(7, 45), x.astype(np.float64) + bias, rtol=1e-6)


def test_swiglu(dev):
    rng = np.random.default_rng(3)
    gate, up = 4 * f32(rng, 2051), f32(rng, 2051)
    gate[:3] = [-100.0, 100.0, 0.0]
    out = dev.empty(gate.nbytes)
    dev.run(lambda rec: elementwise.swiglu(rec, dev.put(gate), dev.put(up), out, gate.size))
    g = gate.astype(np.float64)
    np.testing.assert_allclose(dev.get(out, count=gate.size), g / (1 + np.exp(-g)) * up, rtol=1e-5, atol=1e-6)


def test_scale_in_place(dev):
    rng = np.random.default_rng(4)
    x = f32(rng, 999)
    bx = dev.put(x)
    dev.run(lambda rec: elementwise.scale(rec, bx, bx, x.size, 0.125))
    np.testing.assert_allclose(dev.get(bx, count=x.size), x.astype(np.float64) * 0.125, rtol=1e-6)


def test_gelu_tanh_approximation(dev):
    rng = np.random.default_rng(5)
    x = 3 * f32(rng, 1001)
    x[:4] = [-60.0, 60.0, 0.0, -3.0]
    out = dev.empty(x.nbytes)
    dev.run(lambda rec: elementwise.gelu(rec, dev.put(x), out, x.size))
    v = x.astype(np.float64)
    want = 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * v * (1 + 0.044715 * v * v)))
    np.testing.assert_allclose(dev.get(out, count=x.size), want, rtol=1e-5, atol=1e-6)


def test_many_elements_take_several_per_invocation(dev):
    """Past the workgroup-count limit the grid-stride loop covers the rest."""
    n = min(dev.ctx.info.max_workgroup_count, 65535) * threads(dev.ctx) + 77
    a = np.arange(n, dtype=np.float32)
    ba, out = dev.put(a), dev.empty(a.nbytes)
    dev.run(lambda rec: elementwise.add(rec, ba, ba, out, n))
    np.testing.assert_array_equal(dev.get(out, count=n), 2 * a)
