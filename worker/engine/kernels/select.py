"""Sampling's GPU side: argmax per row and top-k of one row, so only a few bytes of the
128k-256k logits are read back. Both run topk.comp in stages: each stage keeps the k best of
every chunk of a row (many workgroups), the next stage works on the survivors, until one chunk
per row is left; argmax is the k = 1 case."""
from worker.engine.kernels.launch import scratch, threads
from worker.engine.vk.commands import Recording, pack_push
from worker.engine.vk.memory import Buffer
from worker.engine.workspace import MAX_K


def per_thread(ctx) -> int:
    """Values each invocation holds in registers (a chunk is threads x this; topk.comp's
    in-play mask allows 64). GPUs want many small workgroups; lavapipe pays per workgroup, so it
    takes bigger chunks."""
    return 64 if ctx.info.kind == "cpu" else 16


def _select(rec: Recording, x: Buffer, out_ids: Buffer, out_vals: Buffer, rows: int, cols: int, k: int):
    ctx = rec.ctx
    size, values = threads(ctx), per_thread(ctx)
    chunk = size * values
    assert 0 < k <= min(MAX_K, cols) and 2 * k <= chunk and rows <= ctx.info.max_workgroup_count
    kernel = ctx.kernel("topk", {0: size, 1: values})
    n, vals, ids, has_ids, stage = cols, x, x, 0, 0
    while (chunks := -(-n // chunk)) > 1:
        next_ids = scratch(ctx, f"topk_ids_{stage % 2}", rows * chunks * k * 4)
        next_vals = scratch(ctx, f"topk_vals_{stage % 2}", rows * chunks * k * 4)
        rec.dispatch(kernel, [vals, ids, next_ids, next_vals], (chunks, rows, 1), pack_push(n, k, has_ids))
        rec.barrier()
        n, vals, ids, has_ids, stage = chunks * k, next_vals, next_ids, 1, stage + 1
    rec.dispatch(kernel, [vals, ids, out_ids, out_vals], (1, rows, 1), pack_push(n, k, has_ids))


def argmax(rec: Recording, x: Buffer, out_u32: Buffer, rows: int, cols: int):
    """out_u32[r] = index of the largest value of row r of x f32 [rows, cols], the first on ties."""
    _select(rec, x, out_u32, scratch(rec.ctx, "argmax_vals", rows * 4), rows, cols, 1)


def topk(rec: Recording, x: Buffer, out_ids_u32: Buffer, out_vals_f32: Buffer, cols: int, k: int):
    """The k largest values of x f32 [cols] and their indices, sorted descending (the lower
    index first among equal values)."""
    _select(rec, x, out_ids_u32, out_vals_f32, 1, cols, k)
