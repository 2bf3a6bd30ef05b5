"""Cooperative-matrix mat-mat tiles (mul_mat_coopmat.comp's BM, BN, WM, WN, BK, STAGES) chosen per device
and weight by measurement, as tuning.py chooses mat-vec shapes: each distinct weight (type, rows,
K) of a model is timed once per machine over one prefill chunk of columns with every candidate
tile that fits the device, and the fastest is kept in <cache_dir>/coopmat_tiles.json under the
device, its driver and API version, the chunk and a hash of the compiled kernel (tunecache.py,
as for mat-vec shapes). Prefill is compute-bound, so a few weight copies suffice (no rotation
past the cache)."""
import hashlib
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np

from worker.engine.kernels.halves import f16_bytes
from worker.engine.kernels.paths import COOPMAT_TILES, coopmat_shape, coopmat_tile_runs, paths
from worker.engine.kernels.timing import record_products
from worker.engine.kernels.tunecache import TuneCache, time_on_copies
from worker.engine.kernels.tuning import Key, wanted

log = logging.getLogger(__name__)

Tile = tuple[int, int, int, int, int, int]
CANDIDATES_DIGEST = hashlib.sha256(repr(COOPMAT_TILES).encode()).hexdigest()[:8]
COPIES = 4
WARMUP_SECONDS = 0.3    # per weight, shared by its candidates
RUNS = 3


def candidates(info) -> list[Tile]:
    """COOPMAT_TILES that the device runs (paths.coopmat_tile_runs)."""
    if coopmat_shape(info) is None:
        return []
    return [tile for tile in COOPMAT_TILES if coopmat_tile_runs(info, tile)]


def model_tiles(ctx, settings, keys, n: int) -> dict[Key, Tile]:
    """The tiles a model's weights run with at n columns: measured (or cached) when the device
    has cooperative matrices and settings.tune asks for tuning; empty otherwise (the default tile)."""
    if "coopmat" not in paths(ctx) or not wanted(settings.tune, ctx):
        return {}
    tuner = TileTuner(ctx, settings.cache_dir, n)
    tiles = tuner.tiles(keys)
    if tuner.measured:
        log.info("coopmat tiles: timed %d weights on %s (cached in %s)", tuner.measured, ctx.info.name, tuner.path)
    return tiles


class TileTuner:
    def __init__(self, ctx, cache_dir: Path, n: int):
        self.ctx, self.n, self.cache = ctx, n, TuneCache(ctx, Path(cache_dir) / "coopmat_tiles.json")
        self.path = self.cache.path
        self.measured = 0

    def tiles(self, keys) -> dict[Key, Tile]:
        keys = sorted(set(keys))
        missing = [key for key in keys if self._name(key) not in self.cache.entries]
        if missing:
            self.store({key: self.measure(key) for key in missing})
        return {key: tuple(self.cache.entries[self._name(key)]["tile"]) for key in keys}

    def store(self, tables: dict[Key, dict[Tile, float]]):
        self.cache.put({self._name(key): {"tile": list(min(table, key=table.get)),
                                          "us": {"x".join(map(str, t)): round(s * 1e6, 2) for t, s in table.items()}}
                        for key, table in tables.items()})

    def measure(self, key: Key) -> dict[Tile, float]:
        """Median seconds of one product at n columns with each candidate tile."""
        ctx, n = self.ctx, self.n
        qtype, rows, cols = key
        log.info("timing %s %dx%d: cooperative-matrix tiles at %d columns (once on %s)", qtype.name, rows, cols, n,
                 ctx.info.name)
        x_values = np.random.default_rng(0).standard_normal(cols * n).astype(np.float32)
        xh = ctx.alloc(f16_bytes(n, cols))

        def records(weights, x, y):
            for tile in candidates(ctx.info):
                yield tile, record_products(ctx, [replace(w, coopmat_tile=tile) for w in weights], x, y, n,
                                            path="coopmat", xh=xh)
        try:
            medians = time_on_copies(ctx, key, COPIES, x_values, 4 * rows * n, records, WARMUP_SECONDS, RUNS)
        finally:
            ctx.free(xh)
        self.measured += 1
        return medians

    def _name(self, key: Key) -> str:
        """The weight, the columns, the kernel and the candidates timed (a new candidate list times
        the weights again)."""
        qtype, rows, cols = key
        kernel = self.cache.kernel_hash(f'mul_mat_coopmat_{qtype.name.lower()}')
        return f"{qtype.name} {rows}x{cols} n{self.n} {kernel} t{CANDIDATES_DIGEST}"
