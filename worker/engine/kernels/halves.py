"""The cooperative-matrix mat-mat kernel's input: activations in f16 (shaders/convert_f16.comp),
each column's row padded with zeros to a multiple of 8 values. That kernel copies them into its
tiles as they are; converting f32 x there bounded it (mul_mat_coopmat.comp has the figures).
kernels/matmul.py converts x once per product, or once for the products that share it (Q/K/V,
gate and up), into the scratch it is given (`xh`, f16_bytes of it), then a barrier; or the
dispatch before writes f16 itself (rms_norm_f16, swiglu_f16: rows of a multiple of 8, no
padding) and the products take Halves. H100, llama-3.1-8b, batched decode of 32 sequences:
12.76-12.84 ms of GPU a step in 342 dispatches against 13.18-13.24 in 438 (2480 tok/s against
2422), pp512 9390 tok/s against 9176."""
from dataclasses import dataclass

from worker.engine.intmath import cdiv
from worker.engine.kernels.launch import grid
from worker.engine.vk.commands import Recording
from worker.engine.vk.memory import Buffer

CONVERT_THREADS = 256
VECTOR_VALUES = 8   # f16 values per 16-byte vector: the padding of each row


def f16_bytes(n: int, k: int) -> int:
    """Scratch of n columns of K activations in f16, rows padded to VECTOR_VALUES."""
    return 2 * n * cdiv(k, VECTOR_VALUES) * VECTOR_VALUES


@dataclass(frozen=True)
class Halves:
    """Activations already in f16 (convert_f16), for products that share them."""
    xh: Buffer


def convert_f16(rec: Recording, x: Buffer, xh: Buffer | None, n: int, k: int):
    """xh = x (f32 [n, k]) in f16, rows padded to a multiple of VECTOR_VALUES with zeros."""
    if xh is None or xh.size < f16_bytes(n, k):
        raise ValueError(f"the cooperative-matrix kernel needs {f16_bytes(n, k)} bytes of scratch for "
                         f"{n} x {k} f16 activations")
    groups = grid(rec.ctx, cdiv(n * cdiv(k, VECTOR_VALUES), CONVERT_THREADS))
    rec.dispatch(rec.ctx.kernel("convert_f16", {0: CONVERT_THREADS}), [x, xh], groups, dict(ncols=k, n=n))


def halves(rec: Recording, x: Buffer | Halves, xh: Buffer | None, n: int, k: int) -> Buffer:
    """x's f16 buffer: x.xh when x is already Halves, else x converted into xh and a barrier."""
    if isinstance(x, Halves):
        return x.xh
    convert_f16(rec, x, xh, n, k)
    rec.barrier()
    return xh
