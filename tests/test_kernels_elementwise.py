"""Elementwise kernels on the real device against float64 numpy references."""
import numpy as np

from tests.kernel_io import f32
from worker.engine.kernels import elementwise
from worker.engine.kernels.launch import threads


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


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def test_geglu(dev):
    """GELU's tanh form times up, down to large arguments (where tanh must saturate, not NaN)."""
    rng = np.random.default_rng(5)
    gate, up = 4 * f32(rng, 2051), f32(rng, 2051)
    gate[:4] = [-100.0, 100.0, 0.0, -3.0]
    out = dev.empty(gate.nbytes)
    dev.run(lambda rec: elementwise.geglu(rec, dev.put(gate), dev.put(up), out, gate.size))
    np.testing.assert_allclose(dev.get(out, count=gate.size), gelu_tanh(gate.astype(np.float64)) * up,
                               rtol=1e-5, atol=1e-6)


def test_swiglu_and_geglu_in_f16(dev):
    """The f16 variants (a cooperative-matrix product's input): four values an invocation, each
    within f16 rounding of the float64 reference."""
    rng = np.random.default_rng(6)
    gate, up = 4 * f32(rng, 3, 2048), f32(rng, 3, 2048)
    gate[0, :3] = [-100.0, 100.0, 0.0]
    g = gate.astype(np.float64)
    for op, want in ((elementwise.swiglu, g / (1 + np.exp(-g)) * up), (elementwise.geglu, gelu_tanh(g) * up)):
        out = dev.empty(gate.size * 2)
        dev.run(lambda rec: op(rec, dev.put(gate), dev.put(up), out, gate.size, f16=True))
        got = dev.get(out, np.float16, count=gate.size).reshape(gate.shape)
        np.testing.assert_allclose(got, want, rtol=2 ** -10, atol=2 ** -14)


def test_many_elements_take_several_per_invocation(dev):
    """Past the workgroup-count limit the grid-stride loop covers the rest."""
    n = min(dev.ctx.info.max_workgroup_count, 65535) * threads(dev.ctx) + 77
    a = np.arange(n, dtype=np.float32)
    ba = dev.put(a)
    dev.run(lambda rec: elementwise.add_bias(rec, ba, ba, 1, n))
    np.testing.assert_array_equal(dev.get(ba, count=n), 2 * a)
