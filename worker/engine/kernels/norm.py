"""RMSNorm: one workgroup per row, the row's reduction in subgroup ops plus shared memory across
subgroups (reduce.glsl)."""
from worker.engine.kernels.launch import threads
from worker.engine.vk.commands import Recording
from worker.engine.vk.memory import Buffer


def rms_norm(rec: Recording, x: Buffer, weight: Buffer, out: Buffer, rows: int, cols: int, eps: float,
             gather: Buffer | None = None):
    """out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight; out may be x. With `gather` (uint32
    [rows]), out[r] is that of x[gather[r]] (out then must not be x)."""
    assert rows <= rec.ctx.info.max_workgroup_count, f"{rows} rows is past the dispatch limit"
    name, extra = ("rms_norm", []) if gather is None else ("rms_norm_gather", [gather])
    rec.dispatch(rec.ctx.kernel(name, {0: threads(rec.ctx)}), [x, out, weight, *extra], (rows, 1, 1),
                 dict(cols=cols, eps=float(eps)))
