"""Elementwise ops over f32 buffers: one grid-stride dispatch each (binary.comp). Outputs may
alias inputs (each invocation reads an element before writing it)."""
from worker.engine.kernels.launch import stride_groups, threads
from worker.engine.vk.commands import Recording
from worker.engine.vk.memory import Buffer


def _binary(rec: Recording, name: str, buffers: list[Buffer], n: int, b_len: int, per_thread: int = 1):
    """`per_thread`: the values an invocation takes (4 for the f16 variants)."""
    size = threads(rec.ctx)
    rec.dispatch(rec.ctx.kernel(name, {0: size}), buffers, (stride_groups(rec.ctx, n // per_thread, size), 1, 1),
                 dict(n=n, b_len=b_len))


def add_bias(rec: Recording, x: Buffer, bias: Buffer, rows: int, cols: int):
    """x[r, :] += bias, in place (Qwen2-style projection biases)."""
    _binary(rec, "add_bias", [x, bias, x], rows * cols, cols)


def geglu(rec: Recording, gate: Buffer, up: Buffer, out: Buffer, n: int, f16: bool = False):
    """out = gelu(gate) * up (GELU's tanh form), the Gemma feed-forward gate; `f16`: as swiglu's."""
    _glu(rec, "geglu", gate, up, out, n, f16)


def swiglu(rec: Recording, gate: Buffer, up: Buffer, out: Buffer, n: int, f16: bool = False):
    """out = silu(gate) * up, the Llama feed-forward gate; with `f16`, out in f16 (the
    cooperative-matrix kernel's input, kernels/halves.py's layout for rows of a multiple of 8)."""
    _glu(rec, "swiglu", gate, up, out, n, f16)


def _glu(rec: Recording, name: str, gate: Buffer, up: Buffer, out: Buffer, n: int, f16: bool):
    assert not f16 or n % 4 == 0, n
    _binary(rec, f"{name}_f16" if f16 else name, [gate, up, out], n, n, 4 if f16 else 1)


def swiglu_oai(rec: Recording, gate: Buffer, up: Buffer, out: Buffer, n: int):
    """out = gpt-oss's clamped SwiGLU of gate and up (shaders/glu_oai.glsl)."""
    _binary(rec, "swiglu_oai", [gate, up, out], n, n)
