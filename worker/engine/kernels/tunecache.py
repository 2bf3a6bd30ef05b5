"""What the load-time tuners share (tuning.py: mat-vec shapes; tile_tuning.py: cooperative-matrix
tiles): a JSON file in the cache folder, one section per device, its driver and API version (a
driver update measures again), entries named after the weight and a hash of the compiled kernel
(a kernel change measures again); and the timing of the candidates, interleaved run by run after
a warm-up, so that a clock that drifts affects all of them alike."""
import hashlib
import json
import os
import statistics
from pathlib import Path

import numpy as np

from worker.engine.kernels.tensor import free_tensor, upload_tensor
from worker.engine.kernels.timing import random_weights, replay_for
from worker.engine.shaderbuild import load_spirv
from worker.engine.weight_types import row_bytes


class TuneCache:
    """The file is read once, at construction; `put` merges what other processes wrote since."""

    def __init__(self, ctx, path: Path):
        self.ctx, self.path = ctx, Path(path)
        info = ctx.info
        self.device = f"{info.name} | driver {info.driver_version:#x} | api {info.api_version:#x}"
        self.entries: dict[str, dict] = _read(self.path).get(self.device, {})
        self._hashes: dict[str, str] = {}

    def kernel_hash(self, kernel: str) -> str:
        if kernel not in self._hashes:
            shader = load_spirv(kernel, Path(self.ctx.settings.cache_dir))
            self._hashes[kernel] = hashlib.sha256(shader.spirv).hexdigest()[:16]
        return self._hashes[kernel]

    def put(self, entries: dict[str, dict]):
        self.entries |= entries
        on_disk = _read(self.path)
        on_disk[self.device] = on_disk.get(self.device, {}) | self.entries
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(on_disk, indent=1, sort_keys=True))
        tmp.replace(self.path)


def time_on_copies(ctx, key, copies: int, x_values: np.ndarray, y_bytes: int, records,
                   warmup_seconds: float, runs: int) -> dict:
    """candidate -> median seconds (time_candidates) of the products that records(weights, x, y)
    yields as (candidate, Recording) pairs, over `copies` uploads of one random weight of `key`
    (type, rows, K), x holding x_values and y of y_bytes; everything is freed after."""
    qtype, rows, cols = key
    data = random_weights(qtype, rows * row_bytes(qtype, cols))
    x, y = ctx.alloc(x_values.nbytes), ctx.alloc(y_bytes)
    ctx.upload(x, x_values)
    weights, recordings = [], {}
    try:
        for i in range(copies):
            weights.append(upload_tensor(ctx, f"tune{i}", qtype, (cols, rows), data))
        for candidate, rec in records(weights, x, y):
            recordings[candidate] = rec
        return time_candidates(ctx, recordings, warmup_seconds, runs)
    finally:
        for rec in recordings.values():
            rec.destroy()
        for w in weights:
            free_tensor(ctx, w)
        ctx.free(x)
        ctx.free(y)


def time_candidates(ctx, recordings: dict, warmup_seconds: float, runs: int) -> dict:
    """candidate -> median seconds of one timed dispatch of its recording: the recordings
    replayed for warmup_seconds in all first (slow first submissions; the clock brought up)."""
    for rec in recordings.values():
        replay_for(ctx, rec, warmup_seconds / len(recordings))
    times = {candidate: [] for candidate in recordings}
    for _ in range(runs):
        for candidate, rec in recordings.items():
            ctx.run(rec)
            times[candidate] += [ns * 1e-9 for _, ns in rec.timings_ns()]
    return {candidate: statistics.median(t) for candidate, t in times.items()}


def _read(path: Path) -> dict:
    """A missing or damaged file reads as empty: its entries are measured again."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
