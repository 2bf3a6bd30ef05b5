"""The read-bandwidth roofline: how fast this GPU streams a buffer larger than any cache. Decode
reads every weight once per token, so bytes per token / this figure bounds tokens/s."""

from worker.engine.intmath import cdiv

WARMUP_SECONDS = 0.5  # an idle GPU drops its clock (the H200's to 345 MHz): keep it busy first
MAX_SPAN_VEC4, MIN_SPAN_VEC4 = 4096, 256   # vec4s a workgroup reads (64 KiB .. 4 KiB)
SPAN_GROUPS = 2048   # workgroups a copy spreads over at least, where the span allows


def read_bandwidth(ctx, nbytes: int, reps: int = 5, warmup: float = WARMUP_SECONDS) -> float:
    """Bytes/s of a plain streaming read of a buffer larger than any cache (median of reps)."""
    return nbytes / read_seconds(ctx, nbytes, nbytes, reps, warmup)


def read_seconds(ctx, nbytes: int, rotation_bytes: int, reps: int = 5, warmup: float = WARMUP_SECONDS) -> float:
    """Median seconds of a plain streaming read of nbytes, timed as `vkllm bench kernels` times a
    product of that many weight bytes: copies dispatched in turn, each followed by a barrier and
    a timestamp, their total at least rotation_bytes (past the L2 cache). What a product of a
    small weight can reach at best: each dispatch's launch, ramp and barrier are its own."""
    from worker.engine.kernels.timing import median_seconds
    n_vec4 = nbytes // 16
    span = min(MAX_SPAN_VEC4, max(MIN_SPAN_VEC4, n_vec4 // SPAN_GROUPS))
    groups, copies = cdiv(n_vec4, span), max(1, cdiv(rotation_bytes, nbytes))
    srcs, dst = [ctx.alloc(nbytes) for _ in range(copies)], ctx.alloc(4 * groups)
    rec = ctx.recording(max_sets=copies, max_timestamps=copies + 1)
    rec.timestamp("start")
    for i, src in enumerate(srcs):
        rec.dispatch(ctx.kernel("read_bandwidth", {0: 256}), [src, dst], (groups, 1, 1),
                     dict(n_vec4=n_vec4, per_group=span))
        rec.barrier()
        rec.timestamp(f"copy{i}")
    rec.finish()
    seconds = median_seconds(ctx, rec, reps, warmup)
    rec.destroy()
    for buffer in (*srcs, dst):
        ctx.free(buffer)
    return seconds
