"""Cooperative-matrix mat-mat tiles (mul_mat_coopmat.comp's BM, BN, WM, WN, BK, STAGES) chosen per device
and weight by measurement, as tuning.py chooses mat-vec shapes: each distinct weight (type, rows,
K) of a model is timed once per machine over one prefill chunk of columns with every candidate
tile that fits the device, and the fastest is kept in <cache_dir>/coopmat_tiles.json under the
device, its driver and API version, the chunk and a hash of the compiled kernel. Prefill is
compute-bound, so a few weight copies suffice (no rotation past the cache); candidates are
interleaved run by run after a warm-up, as for mat-vec shapes."""
import hashlib
import json
import logging
import os
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np

from worker.engine.kernels.matmul import COOPMAT_TILES, coopmat_shape, paths
from worker.engine.kernels.tensor import free_tensor, upload_tensor
from worker.engine.kernels.timing import random_weights, record_products, replay_for
from worker.engine.kernels.tuning import Key, wanted
from worker.engine.shaderbuild import load_spirv
from worker.engine.weight_types import row_bytes

log = logging.getLogger(__name__)

Tile = tuple[int, int, int, int, int, int]
COPIES = 4
WARMUP_SECONDS = 0.3    # per weight, shared by its candidates
RUNS = 3


def candidates(info) -> list[Tile]:
    """COOPMAT_TILES within the device's workgroup size and shared memory (the shader's f16
    tiles, per stage, with 16 bytes of padding per row, and a TM x TN f32 staging tile per
    subgroup)."""
    shape = coopmat_shape(info)
    if shape is None:
        return []
    tm, tn, _ = shape
    fitting = []
    for tile in COOPMAT_TILES:
        bm, bn, wm, wn, bk, stages = tile
        subgroups = (bm // wm) * (bn // wn)
        shared = stages * (bm + bn) * (bk + 8) * 2 + subgroups * tm * tn * 4
        if subgroups * info.subgroup_size <= info.max_workgroup_size and shared <= info.max_shared_memory:
            fitting.append(tile)
    return fitting


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
        self.ctx, self.n, self.path = ctx, n, Path(cache_dir) / "coopmat_tiles.json"
        info = ctx.info
        self.device = f"{info.name} | driver {info.driver_version:#x} | api {info.api_version:#x}"
        self._entries = _read(self.path).get(self.device, {})
        self._hashes: dict[str, str] = {}
        self.measured = 0

    def tiles(self, keys) -> dict[Key, Tile]:
        keys = sorted(set(keys))
        missing = [key for key in keys if self._name(key) not in self._entries]
        if missing:
            self.store({key: self.measure(key) for key in missing})
        return {key: tuple(self._entries[self._name(key)]["tile"]) for key in keys}

    def store(self, tables: dict[Key, dict[Tile, float]]):
        for key, table in tables.items():
            best = min(table, key=table.get)
            self._entries[self._name(key)] = {"tile": list(best),
                                              "us": {"x".join(map(str, t)): round(s * 1e6, 2) for t, s in table.items()}}
        on_disk = _read(self.path)
        on_disk[self.device] = on_disk.get(self.device, {}) | self._entries
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(on_disk, indent=1, sort_keys=True))
        tmp.replace(self.path)

    def measure(self, key: Key) -> dict[Tile, float]:
        """Median seconds of one product at n columns with each candidate tile."""
        ctx, n = self.ctx, self.n
        qtype, rows, cols = key
        data = random_weights(qtype, rows * row_bytes(qtype, cols))
        x, y = ctx.alloc(4 * cols * n), ctx.alloc(4 * rows * n)
        ctx.upload(x, np.random.default_rng(0).standard_normal(cols * n).astype(np.float32))
        weights, recordings = [], {}
        try:
            for i in range(COPIES):
                weights.append(upload_tensor(ctx, f"tile{i}", qtype, (cols, rows), data))
            for tile in candidates(ctx.info):
                recordings[tile] = record_products(ctx, [replace(w, coopmat_tile=tile) for w in weights], x, y, n)
            for rec in recordings.values():
                replay_for(ctx, rec, WARMUP_SECONDS / len(recordings))
            times = {tile: [] for tile in recordings}
            for _ in range(RUNS):
                for tile, rec in recordings.items():
                    ctx.run(rec)
                    times[tile] += [ns * 1e-9 for _, ns in rec.timings_ns()]
        finally:
            for rec in recordings.values():
                rec.destroy()
            for w in weights:
                free_tensor(ctx, w)
            ctx.free(x)
            ctx.free(y)
        self.measured += 1
        return {tile: statistics.median(t) for tile, t in times.items()}

    def _name(self, key: Key) -> str:
        qtype, rows, cols = key
        kernel = f"mul_mat_coopmat_{qtype.name.lower()}"
        if kernel not in self._hashes:
            shader = load_spirv(kernel, Path(self.ctx.settings.cache_dir))
            self._hashes[kernel] = hashlib.sha256(shader.spirv).hexdigest()[:16]
        return f"{qtype.name} {rows}x{cols} n{self.n} {self._hashes[kernel]}"


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
