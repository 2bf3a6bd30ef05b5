"""8-bit activations (shaders/x8.glsl's blocks of 32 values) for the kernels over them (the
8-bit mat-vec and mat-cols kernels, mmq, the MoE experts'): the scratch they take (`x8_bytes`),
the dispatch that quantizes f32 activations into it (`quantize_x8`), and `Quantized`, x already
in that form. kernels/halves.py is the f16 counterpart, for the cooperative-matrix kernel."""
from dataclasses import dataclass

from worker.engine.intmath import cdiv
from worker.engine.kernels.launch import grid
from worker.engine.kernels.paths import X8_BLOCK_BYTES, X8_BLOCK_VALUES
from worker.engine.vk.commands import Recording
from worker.engine.vk.memory import Buffer

QUANTIZE_X8_THREADS = 64


def x8_bytes(n: int, k: int) -> int:
    """Scratch of 8-bit activations for n columns of K values."""
    return n * cdiv(k, X8_BLOCK_VALUES) * X8_BLOCK_BYTES


@dataclass(frozen=True)
class Quantized:
    """Activations already in 8-bit blocks (normed_input's, through rms_norm_x8): the 8-bit
    mat-vec products take them as they are. With an `eps`, the blocks are an RMSNorm's input not
    yet scaled, which a residual product wrote (`NormBlocks`): the one-column 8-bit mat-vec
    products over them (their _rms variants) scale by 1 / rms themselves."""
    x8: Buffer
    eps: float | None = None


def quantize_x8(rec: Recording, x: Buffer, x8: Buffer | None, n: int, k: int):
    """x8 = x (f32 [n, k], k a multiple of 32) in 8-bit blocks of 32 (shaders/x8.glsl)."""
    if k % X8_BLOCK_VALUES:
        raise ValueError(f"8-bit activations take rows of a multiple of {X8_BLOCK_VALUES} values, not {k}")
    if x8 is None or x8.size < x8_bytes(n, k):
        raise ValueError(f"the mmq kernel needs {x8_bytes(n, k)} bytes of scratch for {n} x {k} 8-bit activations")
    kernel = rec.ctx.kernel("quantize_x8", {0: QUANTIZE_X8_THREADS})
    groups = grid(rec.ctx, cdiv(n * k // X8_BLOCK_VALUES, QUANTIZE_X8_THREADS))
    rec.dispatch(kernel, [x, x8], groups, dict(ncols=k, n=n))
