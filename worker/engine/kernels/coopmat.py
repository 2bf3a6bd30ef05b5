"""Which tile and how many ranges of K a cooperative-matrix product (mul_mat_coopmat.comp) takes:
a weight's tuned tile (kernels/tile_tuning.py) or the default past COOPMAT_FEW_COLS columns, a
fixed tile for fewer (`few_cols_tile`) or, for K-quants up to COOPMAT_ITEMS_COLS, the items
kernel's (`coopmat_kernel`), or mul_mat_coopmat_frag.comp's where the device's matrix layout
allows (`frag_kernel`), and split-K where the product has fewer tiles than the GPU has room for
(`coopmat_splits`, `frag_splits`). kernels/matmul.py records the products with them."""
from gguf import GGMLQuantizationType as T

from worker.engine.intmath import cdiv
from worker.engine.kernels.fragments import nv_fragments
from worker.engine.kernels.paths import coopmat_tile_runs
from worker.engine.kernels.tensor import DeviceTensor

# mul_mat_coopmat.comp's tile: (BM, BN) rows and columns per workgroup, (WM, WN) per subgroup,
# each subgroup holding (WM / TM) x (WN / TN) accumulators of the device's (TM, TN, TK) shape,
# BK, the step along K (a multiple of 16 and of TK), and the stages of shared tiles (1 or 2).
# A weight's tuned tile replaces the default: on an H200 the best single tile for a Llama-8B
# layer's products at 512 columns (each weight's own best makes the layer ~1.25x faster).
COOPMAT_TILE = (128, 128, 64, 64, 32, 1)
# Up to COOPMAT_FEW_COLS columns (batched decode past the mat-vec groups, short prompts) a tile
# of 128 columns is mostly empty and 128 rows leave too few workgroups: on an H200 a Llama-8B
# pass of 2-32 columns took 43-50 ms through a 64 x 64 tile against 77-83 ms through COOPMAT_TILE
# (tune off; tiles tuned at the prefill chunk do not apply below it either). Up to 32 columns
# COOPMAT_NARROW_TILE, its columns cut to 16 or 32 (few_cols_tile): H200, Q4_K at 32 columns
# (split over 1536 groups), 14336x4096 116 -> 94 us, 4096x14336 116 -> 90, 6144x4096 56 -> 40,
# the best of 28 tiles; at 8 columns 95 -> 76, 94 -> 71 (split over 384), 43 -> 33. Past 32,
# COOPMAT_FEW_COLS_TILE where the device runs it (16 subgroups; else COOPMAT_FEW_COLS_SMALL):
# at 64 columns (split over 1536) 14336x4096 146 -> 113 us, 4096x14336 134 -> 116, 6144x4096 66 ->
# 50 against the small one, the best of 46 tiles of up to 16 subgroups; at 16 and 32 columns none
# of 12 and 36 beat the narrow tile by more than 1 us.
COOPMAT_FEW_COLS_TILE = (128, 64, 32, 16, 64, 1)
COOPMAT_FEW_COLS_SMALL = (64, 64, 32, 32, 32, 1)
COOPMAT_NARROW_TILE = (64, 32, 16, 16, 64, 1)
COOPMAT_FEW_COLS = 64
# Split-K (mul_mat_coopmat_split): a product with fewer tiles than SPLIT_GROUPS workgroups
# (SPLIT_FEW_COLS_GROUPS up to COOPMAT_FEW_COLS columns) splits K into up to groups / tiles ranges
# of at least SPLIT_MIN_STEPS steps of BK, each range a workgroup adding its sums to y atomically
# (y zeroed first unless it accumulates). H200, a 4096x14336 Q4_K product at 64 columns: 638 us
# unsplit, 209 at 192 groups, 121 at 384, 127 at 768; at 32 columns 14336x4096 over 64x32 tiles
# 215 us at 384 groups, 116 at 1536.
SPLIT_GROUPS = 384
SPLIT_FEW_COLS_GROUPS = 1536
SPLIT_MIN_STEPS = 8


# Up to COOPMAT_ITEMS_COLS columns, the K-quants of COOPMAT_ITEMS_AHEAD take the items kernel
# (mul_mat_coopmat_items: each thread loads whole items of a row that many steps ahead and
# dequantizes them at the store) with COOPMAT_ITEMS_TILE, its columns cut to 16 up to 16. H100,
# 32 columns, the engine's K ranges (us, plain kernel -> items): 14336x4096 gate+up Q4_K 162 ->
# 142 (116 unsplit), 4096x14336 Q4_K 80 -> 72, Q6_K 99 -> 89 (two steps ahead; one: 106),
# 6144x4096 Q4_K 40 -> 42, the best of 5 tiles x 1-3 steps ahead; at 64 columns the items
# kernel lost on 4096x14336 (Q4_K 102 -> 106, Q6_K 121 -> 150). The 8B decoding 32 sequences
# (bench --batch 32, 64-token prompts, 256 tokens each, same run): 2437 -> 2744 tok/s. Dequantizing
# in packed f16 (mul_mat_coopmat.comp's halves4; H100, 2026-12-07, 32 columns, us): gate+up 114 ->
# 97, 4096x14336 Q4_K 72 -> 66, Q6_K 90 -> 84, 6144x4096 41 -> 37 (storing the quants undecoded,
# a bound: 79, 56, 76, 32); the 8B at 32 sequences 2901 -> 3249 tok/s, TPOT 11.20 -> 10.03 ms.
COOPMAT_ITEMS_COLS = 32
COOPMAT_ITEMS_TILE = (128, 32, 32, 32, 128, 1)
COOPMAT_ITEMS_AHEAD = {T.Q4_K: 1, T.Q5_K: 1, T.Q6_K: 2}
# The items kernel splits K into as many ranges as keep a product's workgroups within one per
# multiprocessor (DeviceInfo.multiprocessors; ITEMS_SPLIT_GROUPS where the driver does not say;
# AMD's compute units are not measured): a second workgroup on some SMs (6 ranges of 32 tiles, 4
# of 48) or many more ranges (14) cost more than the longer range they save. H100 (132 SMs),
# 2026-12-07, us at 16 / 32 columns over 2, 4, 6 and 14 ranges: 4096x14336 Q4_K (32 tiles) 73/83,
# 45/50, 56/65, 56/65; Q6_K 107/108, 65/65, 78/85, 76/83; 6144x4096 Q4_K (48 tiles) 29/33, 32/37,
# 28/34, 35/44; 4096x4096 Q4_K 29/33, 21/23, 27/32, 27/33; 14336x4096 gate+up (112 tiles each) is
# best in one range (n=32: 96 us, 114 in 2, 119 in 3). The plain kernel's SPLIT_FEW_COLS_GROUPS
# gave 14, 4 and 4 ranges; the 8B decoding 32 sequences (bench --batch, same run) 3250 -> 3400
# tok/s, 16 1938 -> 2047.
ITEMS_SPLIT_GROUPS = 128


# Where fragments.py finds the device's matrices laid out as NVIDIA's, the products the items
# kernel takes (its types, up to COOPMAT_ITEMS_COLS columns) take mul_mat_coopmat_frag.comp
# instead: no shared tiles, each lane building its matrix elements in registers. FRAG_TILE: 128
# rows (4 subgroups of 32) and 32 columns, cut to 16 up to 16 (BK: the steps of SPLIT_MIN_STEPS
# for the split rule, as an item of Q4_K); K split towards FRAG_SM_GROUPS workgroups a
# multiprocessor. H100, 2026-12-07, us at 8 / 16 / 32 columns (items -> frag): Q/K/V 6144x4096
# 27.6 / 28.2 / 32.0 -> 22.0 / 23.0 / 27.6; 4096x14336 Q4_K 43.3 / 43.8 / 49.9 -> 36.6 / 38.1 /
# 47.1, Q6_K 64.3 / 65.3 / 67.1 -> 53.2 / 54.8 / 67.8; gate+up 14336x4096 79.4 / 81.2 / 94.7 ->
# 74.0 / 76.5 / 97.8; 4096x4096 19.7 / 20.0 / 22.5 -> 19.5 / 20.5 / 23.8. Tiles of 64 rows, 64
# rows a subgroup (Q6_K's items then spill) or 256, and 2 or 8 workgroups an SM, lost overall.
# The 8B decoding together (bench --batch, tune off, same run): 12 sequences 1654.9 -> 1830.9
# tok/s, 16 2199.7 -> 2429.5, 24 2896.0 -> 3007.8, 32 3752.8 -> 3795.9. Q6_K's lanes loading only
# their own words (lane_items.glsl; H100, 2026-12-08, us at 8 / 16 / 32 columns): 4096x14336 53.0 /
# 55.0 / 67.8 -> 43.8 / 45.7 / 63.2, the 128256x4096 output 341.8 / 352.3 / 440.8 -> 252.2 / 265.2 /
# 347.4.
FRAG_TILE = (128, 32, 32, 32, 64, 1)
FRAG_SM_GROUPS = 4


def frag_kernel(ctx, qtype, n: int) -> tuple[int, ...] | None:
    """The tile of mul_mat_coopmat_frag.comp for a product of a `qtype` weight over n columns,
    where it takes it (`items_kernel` would, and the device's layout is the kernel's); else None."""
    if items_kernel(ctx.info, qtype, n) is None or not nv_fragments(ctx):
        return None
    bm, bn, wm, wn, bk, stages = FRAG_TILE
    return (bm, 16, wm, 16, bk, stages) if n <= 16 else FRAG_TILE


def frag_splits(ctx, w: DeviceTensor, n: int, tile: tuple[int, ...]) -> int:
    """Ranges of K for mul_mat_coopmat_frag.comp's product of w over n columns with `tile`: where
    the device adds floats atomically, enough to bring the largest part's tiles towards
    FRAG_SM_GROUPS workgroups a multiprocessor, each range SPLIT_MIN_STEPS steps or more."""
    bm, bn, _, _, bk, _ = tile
    return _ranges(ctx, w, n, (bm, bn, bk), FRAG_SM_GROUPS * (ctx.info.multiprocessors or ITEMS_SPLIT_GROUPS))


def coopmat_kernel(info, w: DeviceTensor, n: int) -> tuple[tuple[int, ...], int]:
    """(tile, steps ahead) of w's product over n columns: `items_kernel`'s where it takes the
    product, else mul_mat_coopmat's (`coopmat_tile`, 0)."""
    return items_kernel(info, w.ggml_type, n) or (coopmat_tile(info, w, n), 0)


def items_kernel(info, qtype, n: int) -> tuple[tuple[int, ...], int] | None:
    """(tile, steps ahead >= 1) of the items kernel for a product of a `qtype` weight over n
    columns: up to COOPMAT_ITEMS_COLS columns of its types where the device runs its tile."""
    ahead = COOPMAT_ITEMS_AHEAD.get(qtype)
    if ahead is None or n > COOPMAT_ITEMS_COLS:
        return None
    bm, bn, wm, wn, bk, stages = COOPMAT_ITEMS_TILE
    tile = (bm, 16, wm, 16, bk, stages) if n <= 16 else COOPMAT_ITEMS_TILE
    return (tile, ahead) if coopmat_tile_runs(info, tile) else None


def coopmat_tile(info, w: DeviceTensor, n: int) -> tuple[int, ...]:
    """The (BM, BN, WM, WN, BK, stages) tile of w's product over n columns on a device of `info`:
    `few_cols_tile` up to COOPMAT_FEW_COLS columns, else w's tuned tile or COOPMAT_TILE."""
    return few_cols_tile(info, n) if n <= COOPMAT_FEW_COLS else w.coopmat_tile or COOPMAT_TILE


def few_cols_tile(info, n: int) -> tuple[int, ...]:
    """The cooperative-matrix tile of n <= COOPMAT_FEW_COLS columns on a device of `info`:
    COOPMAT_FEW_COLS_TILE past 32 (COOPMAT_FEW_COLS_SMALL where it does not run), else
    COOPMAT_NARROW_TILE with 16 columns up to 16."""
    if n > 32:
        return COOPMAT_FEW_COLS_TILE if coopmat_tile_runs(info, COOPMAT_FEW_COLS_TILE) else COOPMAT_FEW_COLS_SMALL
    bm, bn, wm, wn, bk, stages = COOPMAT_NARROW_TILE
    return bm, 16 if n <= 16 else bn, wm, wn, bk, stages


def coopmat_splits(ctx, w: DeviceTensor, n: int, tile: tuple[int, int, int], ahead: int = 0) -> int:
    """Ranges of K for the cooperative-matrix product of w over n columns with (BM, BN, BK)
    `tile` (`ahead` as coopmat_kernel gives it: >= 1 for the items kernel): where the device adds
    floats atomically, enough to bring the largest part's tiles towards SPLIT_GROUPS workgroups
    (SPLIT_FEW_COLS_GROUPS for few columns; for the items kernel, at most one a multiprocessor),
    each range SPLIT_MIN_STEPS steps or more; else 1."""
    if ahead:
        groups = ctx.info.multiprocessors or ITEMS_SPLIT_GROUPS
    else:
        groups = SPLIT_FEW_COLS_GROUPS if n <= COOPMAT_FEW_COLS else SPLIT_GROUPS
    return _ranges(ctx, w, n, tile, groups)


def _ranges(ctx, w: DeviceTensor, n: int, tile: tuple[int, int, int], groups: int) -> int:
    """Ranges of K that bring the largest part's (BM, BN, BK) `tile`s towards `groups`
    workgroups, each SPLIT_MIN_STEPS steps or more; 1 where the device adds no floats atomically."""
    bm, bn, bk = tile
    if not ctx.info.float_atomic_add:
        return 1
    tiles = cdiv(max(count for _, _, count in w.parts), bm) * cdiv(n, bn)
    return max(1, min(groups // tiles, w.cols // (bk * SPLIT_MIN_STEPS)))
