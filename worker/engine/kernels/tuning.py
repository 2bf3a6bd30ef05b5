"""Mat-vec workgroup shapes (threads, rows, and the lanes that share a row's K: the kernel's
specialization constants 0, 1 and 4; mat_vec.workgroup_rows) chosen per device by measurement.
The best shape depends on the GPU (subgroup width, compute units, caches, clocks) and on the
weight's type and size, and no fixed guess holds across AMD, NVIDIA and Intel gaming GPUs. So
each distinct weight (type, rows, K) of a model is timed once per machine, on random weights of
its shape, for a few dozen candidate shapes, and the fastest is kept in <cache_dir>/tuning.json,
keyed by the device, its driver and API version and a hash of the compiled kernel: a driver
update or a kernel change measures again.

Timing follows `vkllm bench kernels`: GPU timestamps around each product, distinct copies of
the weight cycled through so that a product never finds its weight in the cache, the GPU kept
busy before timing so its clock is up, medians (the cache and the timing loop are tunecache.py's,
shared with tile_tuning.py).

The fused gate+up kernel (mul_mat_vec_glu, matmul_swiglu) has inner loops and register needs of
its own, and its best shape is not the plain kernel's: a feed-forward gate weight is also timed
through it (`glu=True`), as a separate entry, and over 8-bit x with its output in 8-bit blocks
too, as one-column decode runs it (matmul.BlocksOut: a shape whose workgroups hold whole blocks
needs no counter, which timing without the blocks would not see). Likewise a residual product
that writes the next RMSNorm's input in 8-bit blocks (matmul.NormBlocks: the attention output and
feed-forward down weights, `residual=True`) is timed doing so, adding to y, over the shapes that
can: on an H100 the 8B's took 13.9 us a product on average with the plain timing's choice
(256x2/32: 16 rows a workgroup, each counted and fenced) and 12.7 with whole-block workgroups
(1024x1/32), which the plain timing had found no faster (10.75 us for both at 4096x4096).

Lane groups (a subgroup, or half of one, with rows of its own and no shared-memory reduction) won
most large products over 8-bit x on an H200 (each weight's candidates timed in one run): the 32B's
fused gate+up 27648x5120 with its 8-bit block output 63.0 -> 52.5 us (the shared layout's best,
one subgroup over two rows, took a counter per block: a workgroup of whole 32-row blocks
quantizes them itself), the 8B's 28.4 -> 25.1 us, its residual products 1-1.2 us faster; the
plain products within a few %. Tried on an H100 and left out: for the 8B's gate+up with its
blocks (best 512x1/16, 33.3 us), one subgroup over one row of each weight (37.1: a counter per
row) and 32 one-row lane groups a workgroup (1024 threads, 35.6-36.6)."""
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from worker.engine.intmath import cdiv
from worker.engine.kernels.mat_vec import CPU_MAT_VEC_SHAPE, GPU_MAT_VEC_SHAPE
from worker.engine.kernels.matmul import BlocksOut, NormBlocks, folds_norm, writes_blocks
from worker.engine.kernels.paths import MAT_VEC_MAX_COLS, X8_BLOCK_VALUES, product_path
from worker.engine.kernels.timing import record_glu_products, record_products
from worker.engine.kernels.tunecache import TuneCache, time_on_copies
from worker.engine.kernels.x8 import x8_bytes
from worker.engine.weight_types import row_bytes

log = logging.getLogger(__name__)

Key = tuple[GGMLQuantizationType, int, int]   # a weight: (type, rows, K)
Shape = tuple[int, int, int]                   # (threads, rows, lanes) per workgroup: mat_vec.workgroup_rows

SUBGROUPS = (1, 2, 4, 8)
ROWS = (1, 2, 4, 8)
# Subgroups x rows per workgroup: one leaves each workgroup too little work for its fixed cost
# (reduction, scheduling), but one subgroup over two rows read 14336x4096 weights fastest on an
# H200 (Q4_K, Q6_K, Q8_0, kernels stripped to their loads); more than 16 leaves too few workgroups
# to fill a GPU on the narrow weights (K and V projections of a few hundred rows).
WORK_RANGE = (2, 16)
# Lane groups (the subgroup size over LANE_DIVISORS lanes each) of GROUP_ROWS rows, GROUP_SUBGROUPS
# subgroups a workgroup, GROUP_WORKGROUP_ROWS rows in all.
LANE_DIVISORS = (1, 2)
GROUP_SUBGROUPS = (1, 2, 4, 8, 16)
GROUP_ROWS = (1, 2, 4)
GROUP_WORKGROUP_ROWS = (4, 64)
MAX_COPIES = 256   # bounds recording time for small weights; 256 copies of even 0.6 MB pass most caches


@dataclass(frozen=True)
class Budget:
    """How hard to measure: bytes of distinct weight copies cycled through (well past the
    last-level cache: 60 MB on an H200, up to 128 MB on RDNA), seconds of warm-up per weight,
    timed runs per candidate."""
    rotation_bytes: int
    warmup_seconds: float
    runs: int


GPU_BUDGET = Budget(512 << 20, 0.5, 5)
CPU_BUDGET = Budget(1 << 20, 0.02, 5)


def wanted(setting: bool | None, ctx) -> bool:
    """Settings.tune; None (auto) tunes on GPUs only: a CPU driver's timings are noisy (other
    processes share the cores) and the fixed CPU shape is known to be good there."""
    return ctx.info.kind != "cpu" if setting is None else setting


def candidates(info) -> list[Shape]:
    """Threads in 1-8 subgroups sharing 1-8 rows per workgroup, within WORK_RANGE, plus both fixed
    shapes (the defaults are always measured against); and workgroups of lane groups (a subgroup
    or half of one with rows of its own; one subgroup of its full width is the shared layout
    already); all within the device's workgroup and shared-memory limits (the reduction keeps a
    float per thread, row and column)."""
    sg = info.subgroup_size
    grid = [(s, r) for s in SUBGROUPS for r in ROWS if WORK_RANGE[0] <= s * r <= WORK_RANGE[1]]
    shared = [(s * sg, r, s * sg) for s, r in grid + [GPU_MAT_VEC_SHAPE, CPU_MAT_VEC_SHAPE]]
    groups = [(s * sg, r, sg // d) for d in LANE_DIVISORS for s in GROUP_SUBGROUPS for r in GROUP_ROWS
              if sg // d > 1 and s * d > 1 and GROUP_WORKGROUP_ROWS[0] <= r * s * d <= GROUP_WORKGROUP_ROWS[1]]
    return [(t, r, lanes) for t, r, lanes in dict.fromkeys(shared + groups)
            if t <= info.max_workgroup_size and 4 * MAT_VEC_MAX_COLS * r * t <= info.max_shared_memory]


def shape_label(shape: Shape) -> str:
    """threads x rows, and /lanes where lane groups have rows of their own."""
    threads, rows, lanes = shape
    return f"{threads}x{rows}" + ("" if lanes == threads else f"/{lanes}")


def model_shapes(ctx, settings, keys, glu_keys=(), residual_keys=()) -> tuple[dict[Key, Shape], ...]:
    """The shapes a model's weights run with, through the plain kernel (`keys`), through the
    fused gate+up kernel (`glu_keys`, the gate weights) and as residual products writing the next
    norm's input (`residual_keys`): measured (or cached) when settings.tune asks for it; empty
    otherwise, which leaves every weight on its fixed shape."""
    if not wanted(settings.tune, ctx):
        return {}, {}, {}
    tuner = MatVecTuner(ctx, settings.cache_dir)
    shapes = tuner.shapes(keys), tuner.shapes(glu_keys, glu=True), tuner.shapes(residual_keys, residual=True)
    if tuner.measured:
        log.info("mat-vec shapes: timed %d weights on %s (cached in %s)", tuner.measured, ctx.info.name, tuner.path)
    return shapes


class MatVecTuner:
    """The cache is read once, at construction; `shapes` times only what it lacks."""

    def __init__(self, ctx, cache_dir: Path, budget: Budget | None = None):
        self.ctx, self.cache = ctx, TuneCache(ctx, Path(cache_dir) / "tuning.json")
        self.path = self.cache.path
        self.budget = budget or (CPU_BUDGET if ctx.info.kind == "cpu" else GPU_BUDGET)
        self.measured = 0   # weights timed by this tuner (the others came from the cache)

    def shapes(self, keys, glu: bool = False, residual: bool = False) -> dict[Key, Shape]:
        """`glu`: through the fused gate+up kernel, the key being the gate weight's; `residual`:
        as a residual product writing the next norm's input, for the keys whose decode products
        do (`times_norm_blocks`; the others run the plain table's shapes)."""
        keys = sorted(k for k in set(keys) if not residual or self.times_norm_blocks(k))
        missing = [key for key in keys if self._name(key, glu, residual) not in self.cache.entries]
        if missing:
            self.store({key: self.measure(key, glu, residual=residual) for key in missing}, glu, residual)
        return {key: tuple(self.cache.entries[self._name(key, glu, residual)]["shape"]) for key in keys}

    def store(self, tables: dict[Key, dict[Shape, float]], glu: bool = False, residual: bool = False):
        """Keeps the fastest shape of each table (with the table, for reading)."""
        self.cache.put({self._name(key, glu, residual): {"shape": list(min(table, key=table.get)),
                                                         "us": {shape_label(shape): round(s * 1e6, 2)
                                                                for shape, s in table.items()}}
                        for key, table in tables.items()})

    def measure(self, key: Key, glu: bool = False, with_blocks: bool = True,
                residual: bool = False) -> dict[Shape, float]:
        """Median seconds of one product (glu: a gate and up pair, with SwiGLU) with each
        candidate shape; a gate+up writes its 8-bit blocks where decode does (`times_blocks`), unless
        not `with_blocks` (`vkllm bench kernels --glu` times both); a `residual` product
        (`times_norm_blocks`) adds to y and writes the next norm's input, over the shapes that can."""
        if residual and not self.times_norm_blocks(key):
            raise ValueError(f"a residual product of {key} does not write the next norm's input")
        ctx, budget = self.ctx, self.budget
        qtype, rows, cols = key
        log.info("timing %s %dx%d%s: mat-vec workgroup shapes (once on %s)", qtype.name, rows, cols,
                 " gate+up" if glu else " residual, next norm's blocks" if residual else "", ctx.info.name)
        used, total = ctx.memory_budget()
        rotation = min(budget.rotation_bytes, (total - used) // 2)   # a small GPU keeps room for the model
        copies = min(MAX_COPIES, max(2, cdiv(rotation, rows * row_bytes(qtype, cols))))
        record = record_glu_products if glu else record_products
        # the kernel the weight's products take: over 8-bit x, its quantization is in each product
        x8 = ctx.alloc(x8_bytes(1, cols)) if self._x8(key) else None
        # a gate+up over 8-bit x also writes its output in 8-bit blocks, as decode runs it
        counters = np.zeros(rows // X8_BLOCK_VALUES, np.uint32)
        blocks = (BlocksOut(ctx.alloc(x8_bytes(1, rows)), ctx.alloc(counters.nbytes))
                  if with_blocks and self.times_blocks(key, glu) else None)
        if blocks is not None:
            ctx.upload(blocks.done, counters)
        norm = None
        if residual:   # the next norm's weight: ones
            norm = NormBlocks(ctx.alloc(x8_bytes(1, rows)), ctx.alloc(counters.nbytes), ctx.alloc(4 * rows), 1e-5)
            ctx.upload(norm.done, counters)
            ctx.upload(norm.weight, np.ones(rows, np.float32))

        def records(weights, x, y):
            for shape in candidates(ctx.info):
                tuned = [replace(w, mat_vec_shape=shape, glu_shape=shape) for w in weights]
                if norm is not None:
                    if folds_norm(ctx, tuned[0], [], 1):
                        yield shape, record(ctx, tuned, x, y, x8=x8, y_accumulate=True, next_norm=norm)
                    continue
                writes = blocks is not None and writes_blocks(ctx, tuned[0], tuned[0], 1)
                yield shape, record(ctx, tuned, x, y, x8=x8, **({"blocks_out": blocks} if writes else {}))
        try:
            medians = time_on_copies(ctx, key, copies, np.ones(cols, np.float32), 4 * rows, records,
                                     budget.warmup_seconds, budget.runs)
        finally:
            extra = ([blocks.x8, blocks.done] if blocks is not None else []) + (
                [norm.x8, norm.done, norm.weight] if norm is not None else [])
            for buffer in [x8] + extra:
                if buffer is not None:
                    ctx.free(buffer)
        self.measured += 1
        return medians

    def _x8(self, key: Key) -> bool:
        qtype, _, cols = key
        return product_path(self.ctx, 1, cols, qtype=qtype) == "mat_vec_x8"

    def _x8_whole_blocks(self, key: Key) -> bool:
        """Over 8-bit x, rows of whole 32-row blocks (every candidate's workgroups tile them): a
        product decode has write 8-bit blocks besides its output."""
        return self._x8(key) and key[1] % X8_BLOCK_VALUES == 0

    def times_blocks(self, key: Key, glu: bool) -> bool:
        """Whether a gate+up of `key` is timed writing its 8-bit blocks (BlocksOut)."""
        return glu and self._x8_whole_blocks(key)

    def times_norm_blocks(self, key: Key) -> bool:
        """Whether a residual product of `key` is timed writing the next norm's input (NormBlocks)."""
        return self._x8_whole_blocks(key)

    def _name(self, key: Key, glu: bool = False, residual: bool = False) -> str:
        qtype, rows, cols = key
        x8 = ("_x8_blocks" if self.times_blocks(key, glu) else "_x8") if self._x8(key) else ""
        if residual:
            x8 = "_x8_rms_blocks"
        kernel = f"mul_mat_vec{'_glu' if glu else ''}{x8}_{qtype.name.lower()}"
        kind = "glu " if glu else "residual " if residual else ""
        return f"{kind}{qtype.name} {rows}x{cols} {self.cache.kernel_hash(kernel)}"
