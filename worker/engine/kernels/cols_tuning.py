"""Workgroup shapes of the 8-bit mat-cols kernel (batched decode and short prompts, matmul.py's
"mat_cols_x8": threads, rows per lane group, lanes per row, items per lane and tile, ranges of K)
chosen per device, weight and column count by measurement, as tuning.py chooses mat-vec shapes. A fixed
rule does not hold here: on an H200 the best shape of one kernel differed by weight as much as
3x (Llama-8B, 16 columns: the 6144-row Q/K/V product took 43 us with 4 subgroups of one row per
8 lanes and 141 with the shape best for the 4096-row output projection, 8 subgroups of two rows
per 16 lanes), as the count of workgroups against the count of SMs, registers and the tile of x
in shared memory trade against each other. So each weight that takes the kernel is timed once
per machine at each column count of MAT_COLS_X8_TUNED (narrower counts keep the default, best
there in the same sweeps) with the candidates below, and the fastest is kept in
<cache_dir>/cols_shapes.json (tunecache.py, keyed as the mat-vec shapes are). Gate weights are
timed through the fused gate+up kernel, as its own entry; the fused Q/K/V weight as a plain
product of its rows.

Ranges of K (SPLITS, the split-K variant: workgroups z adding to y atomically) are candidates
for one weight where the device adds floats atomically: the down product (K = 14336 over 4096
rows) otherwise has about one workgroup per SM. H100, Llama-8B at 8 columns, best shape without
ranges against with: the down product Q4_K 42.8 -> 31.2 us (8 ranges), Q6_K 53.8 -> 44.5 (4),
Q/K/V 6144x4096 22.0 -> 18.7 (8); 16 columns 66.1 -> 43.8, 80.5 -> 64.0, 34.1 -> 26.1; decoding 8
sequences of the 8B 1165 -> 1243 tok/s, 16 1473 -> 1673 (bench --batch, same machine; 32 take
the cooperative-matrix kernel). Sums added atomically meet in no fixed order: a product's low
bits may differ from run to run, as the cooperative-matrix split's do. Plain products are timed
accumulating into y, as the residual products (the down and output projections) run; a product
that overwrites y (Q/K/V) pays a zero fill before its ranges, which the timing does not see."""
import hashlib
import itertools
import logging
from pathlib import Path

import numpy as np

from worker.engine.intmath import cdiv
from worker.engine.kernels.mat_cols import (MAT_COLS_X8_RAW_WORDS, MAT_COLS_X8_TUNED, X8_ITEM_RAW_WORDS,
                                            X8_ITEM_VALUES, mat_cols_x8_shape, x8_shape_runs)
from worker.engine.kernels.paths import product_path
from worker.engine.kernels.timing import record_glu_products, record_products
from worker.engine.kernels.tunecache import TuneCache, time_on_copies
from worker.engine.kernels.tuning import CPU_BUDGET, Budget, Key, wanted
from worker.engine.kernels.x8 import x8_bytes
from worker.engine.weight_types import row_bytes

log = logging.getLogger(__name__)

Shape = tuple[int, int, int, int, int]
SUBGROUPS = (4, 8)
# The gate+up cannot split K for more workgroups; smaller ones are its only way there (the H100's
# best at 8 and 16 columns was the grid's smallest, 4 subgroups of 8 one-row lane groups: 448
# workgroups for the 8B's 14336 rows).
GLU_SUBGROUPS = (1, 2, 4, 8)
ROWS = (1, 2)
ROW_LANES = (4, 8, 16)
TILES = (1, 2)
SPLITS = (1, 2, 4, 8, 16)
SUMS = 64              # columns x rows x weights: partial sums a thread keeps in registers, at most
# bytes of weight copies cycled through, seconds of warm-up per weight and column count (shared by
# its candidates), timed runs; on CPU drivers tuning.py's small budget
GPU_BUDGET = Budget(256 << 20, 0.3, 3)
MAX_COPIES = 128


def candidates(ctx, cols: int, mats: int, qtype, k: int) -> list[Shape]:
    """The default shape first, then the grid's shapes that can run on the device (x8_shape_runs:
    whole subgroups within its workgroup limit, lanes per row dividing the subgroup, the tile of
    x within shared memory, ranges of K only where floats add atomically), sums and raw words
    within twice the default's register budget; ranges of K (of `k` values) for one weight only
    (SwiGLU needs whole sums, so a gate+up has workgroups of fewer subgroups instead), each range a
    whole tile of items at least."""
    default = mat_cols_x8_shape(ctx, cols, mats, qtype)
    items = k // X8_ITEM_VALUES[qtype]
    subgroups, splits_grid = (SUBGROUPS, SPLITS) if mats == 1 else (GLU_SUBGROUPS, (1,))
    grid = [(s * ctx.info.subgroup_size, r, lanes, t, splits)
            for s, r, lanes, t, splits in itertools.product(subgroups, ROWS, ROW_LANES, TILES, splits_grid)
            if r * mats * cols <= SUMS and t * r * mats * X8_ITEM_RAW_WORDS[qtype] <= 2 * MAT_COLS_X8_RAW_WORDS
            and splits * lanes * t <= max(items, lanes * t)]
    return [shape for shape in dict.fromkeys([default, *grid]) if x8_shape_runs(ctx, cols, shape, qtype)]


def model_cols_shapes(ctx, settings, keys, glu_keys=()) -> dict[Key, dict[tuple[int, bool], Shape]]:
    """weight -> {(columns, through the gate+up kernel): shape} (DeviceTensor.cols_shapes) for
    the weights of `keys` (and the gates of `glu_keys`) whose products take the 8-bit mat-cols
    kernel on this device (paths.product_path), at each count of MAT_COLS_X8_TUNED: measured
    (or cached) where settings.tune asks for tuning; empty otherwise (the default shapes)."""
    if not wanted(settings.tune, ctx):
        return {}
    # a gate's key alone would time plain products its weight never takes (the fused kernel does)
    plain, glu_keys = set(keys) - set(glu_keys), set(glu_keys)
    takes = [(key, glu) for group, glu in ((plain, False), (glu_keys, True)) for key in sorted(group)
             if product_path(ctx, MAT_COLS_X8_TUNED[0], key[2], qtype=key[0]) == "mat_cols_x8"]
    tuner = ColsTuner(ctx, settings.cache_dir)
    shapes = {key: {(cols, glu): tuner.shape(key, cols, glu) for cols in MAT_COLS_X8_TUNED} for key, glu in takes}
    if tuner.measured:
        log.info("8-bit mat-cols shapes: timed %d weights and column counts on %s (cached in %s)",
                 tuner.measured, ctx.info.name, tuner.path)
    return shapes


class ColsTuner:
    def __init__(self, ctx, cache_dir: Path):
        self.ctx, self.cache = ctx, TuneCache(ctx, Path(cache_dir) / "cols_shapes.json")
        self.path = self.cache.path
        self.budget = CPU_BUDGET if ctx.info.kind == "cpu" else GPU_BUDGET
        self.measured = 0

    def shape(self, key: Key, cols: int, glu: bool) -> Shape:
        name = self._name(key, cols, glu)
        if name not in self.cache.entries:
            table = self.measure(key, cols, glu)
            self.cache.put({name: {"shape": list(min(table, key=table.get)),
                                   "us": {"x".join(map(str, s)): round(t * 1e6, 2) for s, t in table.items()}}})
        return tuple(self.cache.entries[name]["shape"])

    def measure(self, key: Key, cols: int, glu: bool) -> dict[Shape, float]:
        """Median seconds of one product of `cols` columns (glu: a gate and up pair with SwiGLU)
        with each candidate shape, quantization of x included."""
        ctx = self.ctx
        qtype, rows, k = key
        log.info("timing %s %dx%d%s: 8-bit mat-cols shapes at %d columns (once on %s)", qtype.name, rows, k,
                 " gate+up" if glu else "", cols, ctx.info.name)
        used, total = ctx.memory_budget()
        rotation = min(self.budget.rotation_bytes, (total - used) // 2)   # a small GPU keeps room for the model
        copies = min(MAX_COPIES, max(2, cdiv(rotation, rows * row_bytes(qtype, k))))
        x8 = ctx.alloc(x8_bytes(cols, k))
        record, options = (record_glu_products, {}) if glu else (record_products, {"y_accumulate": True})

        def records(weights, x, y):
            for shape in candidates(ctx, cols, 2 if glu else 1, qtype, k):
                yield shape, record(ctx, weights, x, y, cols, path="mat_cols_x8", cols_shape=shape, x8=x8, **options)
        try:
            medians = time_on_copies(ctx, key, copies, np.ones(k * cols, np.float32), 4 * rows * cols, records,
                                     self.budget.warmup_seconds, self.budget.runs)
        finally:
            ctx.free(x8)
        self.measured += 1
        return medians

    def _name(self, key: Key, cols: int, glu: bool) -> str:
        """The cache's name of a weight's entry: its type, shape and column count, and a hash of
        the kernels its candidates run (one weight's: the plain and the split-K variant) and of
        the candidates (a new one is timed)."""
        qtype, rows, k = key
        suffix = f"c{cols}_{qtype.name.lower()}"
        kernels = [f"mul_mat_cols_glu_x8_{suffix}"] if glu else [f"mul_mat_cols_x8_{suffix}",
                                                                  f"mul_mat_cols_x8_split_{suffix}"]
        shapes = repr(candidates(self.ctx, cols, 2 if glu else 1, qtype, k))
        digest = hashlib.sha256("".join([*map(self.cache.kernel_hash, kernels), shapes]).encode()).hexdigest()
        return f"{'glu ' if glu else ''}{qtype.name} {rows}x{k} c{cols} {digest[:16]}"
