"""Sampling's GPU side: argmax per row and top-k of one row, so only a few bytes of the
128k-256k logits are read back. Both run topk.comp in stages: each stage keeps the k best of
every chunk of a row (many workgroups), the next stage works on the survivors, until one chunk
per row is left; argmax is the k = 1 case. The survivors live in a buffer the caller owns, of
scratch_bytes."""
from worker.engine.intmath import cdiv, round_up
from worker.engine.kernels.launch import threads
from worker.engine.vk.commands import Recording
from worker.engine.vk.memory import Buffer
from worker.engine.kernels.shapes import MAX_K

MAX_PER_THREAD = 64     # topk.comp marks the values still in play in one 64-bit mask
OFFSET_ALIGN = 256      # the largest minStorageBufferOffsetAlignment Vulkan allows


def per_thread(ctx) -> int:
    """Values each invocation holds in registers (a chunk is threads x this). GPUs want many
    small workgroups; lavapipe pays per workgroup, so it takes bigger chunks."""
    return MAX_PER_THREAD if ctx.info.kind == "cpu" else 16


def _slot_bytes(ctx, rows: int, cols: int, k: int) -> int:
    """One stage's survivors (ids or values) at most: the first stage's, which has the most chunks."""
    chunks = cdiv(cols, threads(ctx) * per_thread(ctx))
    return round_up(rows * chunks * k * 4, OFFSET_ALIGN) if chunks > 1 else 0


def scratch_bytes(ctx, rows: int, cols: int, k: int) -> int:
    """Bytes of the `scratch` buffer argmax (k = 1) or topk needs for rows x cols: two stages'
    survivors, ids and values, and argmax's unread best values."""
    return 4 * _slot_bytes(ctx, rows, cols, k) + (4 * rows if k == 1 else 0)


def _select(rec: Recording, x: Buffer, out_ids: Buffer, out_vals: Buffer, rows: int, cols: int, k: int,
            scratch: Buffer | None):
    ctx = rec.ctx
    size, values = threads(ctx), per_thread(ctx)
    chunk = size * values
    assert 0 < k <= min(MAX_K, cols) and 2 * k <= chunk and rows <= ctx.info.max_workgroup_count
    assert values <= MAX_PER_THREAD
    slot = _slot_bytes(ctx, rows, cols, k)
    if slot and (scratch is None or scratch.size < 4 * slot):
        raise ValueError(f"top-{k} of {rows} x {cols} needs {4 * slot} bytes of scratch")
    kernel = ctx.kernel("topk", {0: size, 1: values})
    n, vals, ids, has_ids, stage = cols, x, x, 0, 0
    while (chunks := cdiv(n, chunk)) > 1:
        used = rows * chunks * k * 4
        base = (stage % 2) * 2 * slot
        next_ids, next_vals = scratch.sub(base, used), scratch.sub(base + slot, used)
        rec.dispatch(kernel, [vals, ids, next_ids, next_vals], (chunks, rows, 1), dict(n=n, k=k, has_ids=has_ids))
        rec.barrier()
        n, vals, ids, has_ids, stage = chunks * k, next_vals, next_ids, 1, stage + 1
    rec.dispatch(kernel, [vals, ids, out_ids, out_vals], (1, rows, 1), dict(n=n, k=k, has_ids=has_ids))


def argmax(rec: Recording, x: Buffer, out_u32: Buffer, rows: int, cols: int, scratch: Buffer):
    """out_u32[r] = index of the largest value of row r of x f32 [rows, cols], the first on ties;
    `scratch` of scratch_bytes(ctx, rows, cols, 1)."""
    slots = 4 * _slot_bytes(rec.ctx, rows, cols, 1)
    if scratch.size < slots + 4 * rows:
        raise ValueError(f"argmax of {rows} x {cols} needs {slots + 4 * rows} bytes of scratch")
    _select(rec, x, out_u32, scratch.sub(slots, 4 * rows), rows, cols, 1, scratch)


def topk(rec: Recording, x: Buffer, out_ids_u32: Buffer, out_vals_f32: Buffer, cols: int, k: int,
         scratch: Buffer | None, rows: int = 1):
    """The k largest values of each row of x f32 [rows, cols] and their indices, sorted
    descending (the lower index first among equal values), into [rows, k]; `scratch` of
    scratch_bytes(ctx, rows, cols, k) (None when 0)."""
    _select(rec, x, out_ids_u32, out_vals_f32, rows, cols, k, scratch)
