"""Elementwise ops over f32 buffers: one grid-stride dispatch each (binary.comp). Outputs may
alias inputs (each invocation reads an element before writing it)."""
from worker.engine.kernels.launch import stride_groups, threads
from worker.engine.vk.commands import Recording
from worker.engine.vk.memory import Buffer


def _binary(rec: Recording, name: str, buffers: list[Buffer], n: int, b_len: int):
    size = threads(rec.ctx)
    rec.dispatch(rec.ctx.kernel(name, {0: size}), buffers, (stride_groups(rec.ctx, n, size), 1, 1),
                 dict(n=n, b_len=b_len))


def add_bias(rec: Recording, x: Buffer, bias: Buffer, rows: int, cols: int):
    """x[r, :] += bias, in place (Qwen2-style projection biases)."""
    _binary(rec, "add_bias", [x, bias, x], rows * cols, cols)


def geglu(rec: Recording, gate: Buffer, up: Buffer, out: Buffer, n: int):
    """out = gelu(gate) * up (GELU's tanh form), the Gemma feed-forward gate."""
    _binary(rec, "geglu", [gate, up, out], n, n)


def swiglu(rec: Recording, gate: Buffer, up: Buffer, out: Buffer, n: int):
    """out = silu(gate) * up, the Llama feed-forward gate."""
    _binary(rec, "swiglu", [gate, up, out], n, n)


def swiglu_oai(rec: Recording, gate: Buffer, up: Buffer, out: Buffer, n: int):
    """out = gpt-oss's clamped SwiGLU of gate and up (shaders/glu_oai.glsl)."""
    _binary(rec, "swiglu_oai", [gate, up, out], n, n)
