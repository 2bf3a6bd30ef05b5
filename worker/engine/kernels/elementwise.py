"""Elementwise ops over f32 buffers: one grid-stride dispatch each (binary.comp, unary.comp).
Outputs may alias inputs (each invocation reads an element before writing it)."""
from worker.engine.kernels.launch import stride_groups, threads
from worker.engine.vk.commands import Recording, pack_push
from worker.engine.vk.memory import Buffer


def _elementwise(rec: Recording, name: str, buffers: list[Buffer], n: int, *params):
    size = threads(rec.ctx)
    rec.dispatch(rec.ctx.kernel(name, {0: size}), buffers, (stride_groups(rec.ctx, n, size), 1, 1),
                 pack_push(n, *params))


def add(rec: Recording, a: Buffer, b: Buffer, out: Buffer, n: int):
    """out = a + b (residual connections; out may be a)."""
    _elementwise(rec, "add", [a, b, out], n)


def add_bias(rec: Recording, x: Buffer, bias: Buffer, rows: int, cols: int):
    """x[r, :] += bias, in place (Qwen2-style projection biases)."""
    _elementwise(rec, "add_bias", [x, bias, x], rows * cols, cols)


def swiglu(rec: Recording, gate: Buffer, up: Buffer, out: Buffer, n: int):
    """out = silu(gate) * up, the Llama feed-forward gate."""
    _elementwise(rec, "swiglu", [gate, up, out], n)


def scale(rec: Recording, x: Buffer, out: Buffer, n: int, s: float):
    _elementwise(rec, "scale", [x, out], n, float(s))


def gelu(rec: Recording, x: Buffer, out: Buffer, n: int):
    """GELU with llama.cpp's tanh approximation."""
    _elementwise(rec, "gelu", [x, out], n)
