"""RMSNorm: one workgroup per row, the row's reduction in subgroup ops plus shared memory across
subgroups (reduce.glsl)."""
from worker.engine.kernels.launch import threads
from worker.engine.vk.commands import Recording
from worker.engine.vk.memory import Buffer


def rms_norm(rec: Recording, x: Buffer, weight: Buffer, out: Buffer, rows: int, cols: int, eps: float):
    """out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight; out may be x."""
    assert rows <= rec.ctx.info.max_workgroup_count, f"{rows} rows is past the dispatch limit"
    rec.dispatch(rec.ctx.kernel("rms_norm", {0: threads(rec.ctx)}), [x, out, weight], (rows, 1, 1),
                 dict(cols=cols, eps=float(eps)))
