"""Row normalizations: one workgroup per row, the row's reductions in subgroup ops plus shared
memory across subgroups (reduce.glsl)."""
from worker.engine.kernels.launch import threads
from worker.engine.vk.commands import Recording, pack_push
from worker.engine.vk.memory import Buffer


def _rows(rec: Recording, name: str, buffers: list[Buffer], rows: int, *params):
    assert rows <= rec.ctx.info.max_workgroup_count, f"{rows} rows is past the dispatch limit"
    rec.dispatch(rec.ctx.kernel(name, {0: threads(rec.ctx)}), buffers, (rows, 1, 1), pack_push(*params))


def rms_norm(rec: Recording, x: Buffer, weight: Buffer | None, out: Buffer, rows: int, cols: int, eps: float):
    """out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight (weight None: no scaling)."""
    if weight is None:
        _rows(rec, "rms_norm_unweighted", [x, out], rows, cols, float(eps))
    else:
        _rows(rec, "rms_norm", [x, out, weight], rows, cols, float(eps))


def softmax(rec: Recording, x: Buffer, out: Buffer, rows: int, cols: int):
    """out[r] = softmax(x[r]), max-subtracted; out may be x."""
    _rows(rec, "softmax", [x, out], rows, cols)
