"""RMSNorm: one workgroup per row, the row's reduction in subgroup ops plus shared memory across
subgroups (reduce.glsl). Decode folds the norms in front of mat-vecs into those mat-vecs
(`matmul.normed_input`); the kernel stays for the rest (prefill, q/k norms, post norms)."""
from dataclasses import dataclass

from worker.engine.intmath import cdiv, round_up
from worker.engine.vk.commands import Recording
from worker.engine.vk.memory import Buffer

MAX_SUBGROUPS = 32   # reduce.glsl takes up to 64


@dataclass(frozen=True)
class FoldedNorm:
    """RMSNorm that a mat-vec applies to its own input (matmul.py's `norm`): x / rms(x) * weight,
    the sum of squares of x gathered from the loads of the product itself."""
    weight: Buffer
    eps: float


def rms_norm_threads(ctx, cols: int) -> int:
    """A 4-vector per invocation for rows of up to 4 x MAX_SUBGROUPS subgroups of values (a 4096
    row: 1024 invocations on NVIDIA), so that one row's loads are all in flight at once."""
    sg = ctx.info.subgroup_size
    return max(sg, min(round_up(cdiv(cols, 4), sg), MAX_SUBGROUPS * sg, ctx.info.max_workgroup_size))


def _dispatch(rec: Recording, name: str, buffers: list[Buffer], rows: int, cols: int, eps: float):
    """One workgroup per row of kernel `name` (an rms_norm.comp variant) over `buffers`."""
    assert rows <= rec.ctx.info.max_workgroup_count, f"{rows} rows is past the dispatch limit"
    rec.dispatch(rec.ctx.kernel(name, {0: rms_norm_threads(rec.ctx, cols)}), buffers, (rows, 1, 1),
                 dict(cols=cols, eps=float(eps)))


def rms_norm_x8(rec: Recording, x: Buffer, weight: Buffer, x8: Buffer, rows: int, cols: int, eps: float,
                out: Buffer | None = None):
    """rms_norm's output in 8-bit blocks of 32 (shaders/x8.glsl) into x8, for the 8-bit mat-vec
    kernels: one dispatch for the norm and quantize_x8; with `out` (not x), in f32 there too.
    cols: a multiple of 32."""
    assert cols % 32 == 0, cols
    if out is None:
        _dispatch(rec, "rms_norm_x8", [x, x8, weight], rows, cols, eps)
    else:
        _dispatch(rec, "rms_norm_f32_x8", [x, out, weight, x8], rows, cols, eps)


def rms_norm_f16(rec: Recording, x: Buffer, weight: Buffer, xh: Buffer, rows: int, cols: int, eps: float):
    """rms_norm's output in f16 into xh (kernels/halves.py's layout), for cooperative-matrix
    products: no conversion dispatch. cols: a multiple of 8 (rows need no padding)."""
    assert cols % 8 == 0, cols
    _dispatch(rec, "rms_norm_f16", [x, xh, weight], rows, cols, eps)


def rms_norm(rec: Recording, x: Buffer, weight: Buffer, out: Buffer, rows: int, cols: int, eps: float,
             gather: Buffer | None = None):
    """out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight; out may be x. With `gather` (uint32
    [rows]), out[r] is that of x[gather[r]] (out then must not be x)."""
    name, extra = ("rms_norm", []) if gather is None else ("rms_norm_gather", [gather])
    _dispatch(rec, name, [x, out, weight, *extra], rows, cols, eps)


def rms_norm_add(rec: Recording, x: Buffer, weight: Buffer, out: Buffer, rows: int, cols: int, eps: float):
    """out[r] += x[r] / sqrt(mean(x[r]^2) + eps) * weight (out may not be x): a post norm and the
    residual add after it in one dispatch."""
    _dispatch(rec, "rms_norm_add", [x, out, weight], rows, cols, eps)
