"""Sampling's GPU side: argmax per row and top-k of one row, so only a few bytes of the
128k-256k logits are read back."""
from worker.kernels.launch import scratch, threads
from worker.vk.commands import Recording, pack_push
from worker.vk.memory import Buffer

TOPK_PER_THREAD = 16  # values each invocation holds in registers: a chunk is threads * this
MAX_K = 64


def argmax(rec: Recording, x: Buffer, out_u32: Buffer, rows: int, cols: int):
    """out_u32[r] = index of the largest value of row r of x f32 [rows, cols], the first on ties."""
    assert rows <= rec.ctx.info.max_workgroup_count
    rec.dispatch(rec.ctx.kernel("argmax", {0: threads(rec.ctx)}), [x, out_u32], (rows, 1, 1), pack_push(cols))


def topk(rec: Recording, x: Buffer, out_ids_u32: Buffer, out_vals_f32: Buffer, cols: int, k: int):
    """The k largest values of x f32 [cols] and their indices, sorted descending (lower index
    first among equal values). Each stage keeps the k best of every chunk; stages repeat over
    the survivors until one chunk is left, with a barrier between stages."""
    ctx = rec.ctx
    size = threads(ctx)
    chunk = size * TOPK_PER_THREAD
    assert 0 < k <= min(MAX_K, cols) and 2 * k <= chunk
    kernel = ctx.kernel("topk", {0: size, 1: TOPK_PER_THREAD})
    n, vals, ids, has_ids, stage = cols, x, x, 0, 0
    while (chunks := -(-n // chunk)) > 1:
        next_ids = scratch(ctx, f"topk_ids_{stage % 2}", chunks * k * 4)
        next_vals = scratch(ctx, f"topk_vals_{stage % 2}", chunks * k * 4)
        rec.dispatch(kernel, [vals, ids, next_ids, next_vals], (chunks, 1, 1), pack_push(n, k, has_ids))
        rec.barrier()
        n, vals, ids, has_ids, stage = chunks * k, next_vals, next_ids, 1, stage + 1
    rec.dispatch(kernel, [vals, ids, out_ids_u32, out_vals_f32], (1, 1, 1), pack_push(n, k, has_ids))
