"""The read-bandwidth roofline: how fast this GPU streams a buffer larger than any cache. Decode
reads every weight once per token, so bytes per token / this figure bounds tokens/s."""
import statistics

from worker.engine.intmath import cdiv

WARMUP_SECONDS = 0.5  # an idle GPU drops its clock (the H200's to 345 MHz): keep it busy first


def read_bandwidth(ctx, nbytes: int, reps: int = 5, warmup: float = WARMUP_SECONDS) -> float:
    """Bytes/s of a plain streaming read of a buffer larger than any cache (median of reps)."""
    from worker.engine.kernels.timing import replay_for
    n_vec4, per_group = nbytes // 16, 4096
    groups = cdiv(n_vec4, per_group)
    src, dst = ctx.alloc(nbytes), ctx.alloc(4 * groups)
    rec = ctx.recording(max_timestamps=2)
    rec.timestamp("start")
    rec.dispatch(ctx.kernel("read_bandwidth", {0: 256}), [src, dst], (groups, 1, 1),
                 dict(n_vec4=n_vec4, per_group=per_group))
    rec.timestamp("read")
    rec.finish()
    replay_for(ctx, rec, warmup)
    times = []
    for _ in range(reps):
        ctx.run(rec)
        times.append(rec.timings_ns()[0][1] * 1e-9)
    rec.destroy()
    ctx.free(src)
    ctx.free(dst)
    return nbytes / statistics.median(times)
