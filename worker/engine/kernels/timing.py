"""Timing helpers shared by the mat-vec tuner and the benchmarks: weights of any type with
random content, recordings that rotate over weight copies, and a warm-up replay."""
import statistics
import time

import numpy as np
from gguf import GGMLQuantizationType

from worker.engine.kernels.matmul import matmul, matmul_swiglu

PATTERN_BYTES = 64 << 20     # random bytes repeated to fill the weights: content is irrelevant


def random_weights(qtype: GGMLQuantizationType, nbytes: int) -> np.ndarray:
    """Random bytes are valid blocks except for NaN/inf scales, which cost no extra time; float
    types get normal floats."""
    rng, size = np.random.default_rng(0), min(nbytes, PATTERN_BYTES)
    floats = rng.standard_normal(size // 4 + 1).astype(np.float32)
    pattern = {GGMLQuantizationType.F32: floats, GGMLQuantizationType.F16: floats.astype(np.float16),
               GGMLQuantizationType.BF16: (floats.view(np.uint32) >> 16).astype(np.uint16)}.get(
        qtype, rng.integers(0, 256, size, dtype=np.uint8))
    return np.resize(pattern.view(np.uint8), nbytes)


def record_products(ctx, weights, x, y, n: int = 1, **options):
    """One product per weight copy, each followed by a barrier and a timestamp: rotating over
    copies whose total is well past the L2 cache times reads from memory, as a real step does.
    `options`: matmul's (path, cols_shape, x8: the mmq path also quantizes x per product)."""
    rec = ctx.recording(max_sets=2 * len(weights) * len(weights[0].parts) + 1, max_timestamps=len(weights) + 1)
    rec.timestamp("start")
    for i, w in enumerate(weights):
        matmul(rec, w, x, y, n, **options)
        rec.barrier()
        rec.timestamp(f"copy{i}")
    return rec.finish()


def record_glu_products(ctx, weights, x, y, n: int = 1, up=None, **options):
    """As record_products, through the fused gate+up kernel: copy i is the gate and copy i + 1
    the up weight of product i (y holds the SwiGLU output; `up`, y-sized scratch, is taken only
    where the path is unfused: the mat-mat kernels). `options`: matmul_swiglu's (path,
    cols_shape)."""
    # unfused (the mat-mat kernels): two products, maybe an 8-bit quantization, and the SwiGLU
    rec = ctx.recording(max_sets=4 * len(weights) * len(weights[0].parts) + 1, max_timestamps=len(weights) + 1)
    rec.timestamp("start")
    for i, gate in enumerate(weights):
        matmul_swiglu(rec, gate, weights[(i + 1) % len(weights)], x, y, n, up=y if up is None else up, **options)
        rec.barrier()
        rec.timestamp(f"copy{i}")
    return rec.finish()


def replay_for(ctx, rec, seconds: float):
    """Replays a recording until `seconds` have passed, so timings that follow see a busy GPU
    (an idle GPU drops its clock: the H200's to 345 MHz about a second after it idles)."""
    end = time.perf_counter() + seconds
    while True:
        ctx.run(rec)
        if time.perf_counter() >= end:
            return


def median_seconds(ctx, rec, runs: int, warmup: float) -> float:
    """Median seconds of rec's timed spans (Recording.timings_ns) over `runs` runs, after
    replaying it for `warmup` seconds."""
    replay_for(ctx, rec, warmup)
    times = []
    for _ in range(runs):
        ctx.run(rec)
        times += [ns * 1e-9 for _, ns in rec.timings_ns()]
    return statistics.median(times)
