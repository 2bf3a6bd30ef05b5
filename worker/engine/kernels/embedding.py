"""Embedding-row lookup: rows of a token table (a DeviceTensor of any weight type) into f32."""
from worker.engine.intmath import cdiv
from worker.engine.kernels.tensor import DeviceTensor
from worker.engine.vk.commands import Recording
from worker.engine.vk.memory import Buffer

THREADS = 64   # get_rows.comp's workgroup


def get_rows(rec: Recording, table: DeviceTensor, ids: Buffer, out: Buffer, n: int, scale: float = 1.0):
    """out[i, :] = scale * table row ids[i] as f32; ids uint32 [n], out f32 [n, table.cols]."""
    ctx = rec.ctx
    kernel = ctx.kernel(f"get_rows_{table.ggml_type.name.lower()}", {0: THREADS})
    slices = cdiv(table.cols, 16)
    for buffer, first, count in table.parts:
        rec.dispatch(kernel, [buffer, ids, out], (cdiv(slices, THREADS), n, 1),
                     dict(ncols=table.cols, first_row=first, rows=count, scale=float(scale)))
