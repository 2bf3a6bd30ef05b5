"""Workgroup shapes of the mat-cols kernel (mul_mat_cols.comp: batched decode, the weights read
once for several columns), over f32 x and over 8-bit x: its column-count variants, the default
shapes and what a shape needs to run. kernels/matmul.py records its products with them;
cols_tuning.py times other shapes over the 8-bit variant."""
from gguf import GGMLQuantizationType as T

from worker.engine.intmath import cdiv
from worker.engine.kernels.paths import X8_BLOCK_BYTES, X8_BLOCK_VALUES

# mul_mat_cols.comp's column counts (variants.toml `columns`; paths.py says which products take it).
MAT_COLS_VARIANTS = (2, 4, 8, 16)
# Its workgroup: subgroups sharing one staged tile of x, threads over rows such that a thread's
# partial sums (columns x rows x weights) stay within MAT_COLS_SUMS registers, up to 4 rows; a
# row's K split over a whole subgroup below MAT_COLS_MANY columns, over MAT_COLS_ROW_LANES
# lanes from there on (a workgroup then covers lanes / MAT_COLS_ROW_LANES times more rows and
# reads x once for all of them).
MAT_COLS_SUBGROUPS = 4
MAT_COLS_SUMS = 32
MAT_COLS_MANY = 8
MAT_COLS_ROW_LANES = 8
# Its 8-bit variant ("mat_cols_x8", variants.toml mul_mat_cols_*x8: 2 .. 32 columns, the types
# of paths.x8_cols_types): the values of one item of each type (mul_mat_vec_items.glsl's
# ITEM_VALUES), and the raw 32-bit words a thread keeps in flight per tile (its items' loads,
# of every row and weight) at most.
MAT_COLS_X8_VARIANTS = (2, 4, 8, 16, 32)
# cols_tuning.py times shapes at the counts from MAT_COLS_MANY (narrower ones keep the default);
# its split-K variants (variants.toml mul_mat_cols_*x8_split: ranges of K in workgroups z, sums
# added to y atomically) are built for those counts, and taken where a weight's tuned shape
# names more than one range (a shape's fifth entry).
MAT_COLS_X8_TUNED = tuple(c for c in MAT_COLS_X8_VARIANTS if c >= MAT_COLS_MANY)
X8_ITEM_VALUES = {T.Q4_K: 64, T.Q5_K: 64, T.Q6_K: 128}
X8_ITEM_RAW_WORDS = {T.Q4_K: 12, T.Q5_K: 20, T.Q6_K: 40}
MAT_COLS_X8_RAW_WORDS = 96


def mat_cols_columns(n: int, variants: tuple[int, ...] = MAT_COLS_VARIANTS) -> int:
    """Columns per mat-cols workgroup for n columns: the smallest variant that holds them, or
    that holds an even share of them over the fewest groups of the largest."""
    share = cdiv(n, cdiv(n, variants[-1]))
    return next(c for c in variants if c >= share)


def mat_cols_shape(ctx, cols: int, mats: int = 1) -> tuple[int, int, int]:
    """(threads, rows per lane group, lanes per row) of a mat-cols workgroup over `cols` columns
    of `mats` weights (2: gate and up); a CPU driver's workgroup is one subgroup, as for the
    mat-vec kernel."""
    lanes = ctx.info.subgroup_size
    subgroups = 1 if ctx.info.kind == "cpu" else MAT_COLS_SUBGROUPS
    return (subgroups * lanes, max(1, min(4, MAT_COLS_SUMS // (mats * cols))),
            lanes if cols < MAT_COLS_MANY else min(lanes, MAT_COLS_ROW_LANES))


def mat_cols_tile(ctx, cols: int, shape: tuple[int, int, int]) -> int | None:
    """16-value slices of x per tile: as many as a subgroup has lanes, fewer where shared memory
    runs short; None where the shape cannot run (`mat_cols_shape_runs`)."""
    slices = min(ctx.info.subgroup_size, ctx.info.max_shared_memory // (64 * cols))
    return slices if mat_cols_shape_runs(ctx, shape) and slices > 0 else None


def mat_cols_shape_runs(ctx, shape: tuple[int, ...]) -> bool:
    """Whether a mat-cols workgroup shape can run: lanes per row a power of 2 dividing the
    subgroup, threads whole subgroups within the device's limit, rows at least one."""
    threads, rows, row_lanes = shape[:3]
    lanes = ctx.info.subgroup_size
    return (threads % lanes == 0 and threads <= ctx.info.max_workgroup_size and rows > 0
            and 0 < row_lanes <= lanes and lanes % row_lanes == 0 and row_lanes & (row_lanes - 1) == 0)


def mat_cols_x8_shape(ctx, cols: int, mats: int, qtype: T) -> tuple[int, int, int, int, int]:
    """(threads, rows per lane group, lanes per row, items per lane and tile, ranges of K) of a
    mat-cols workgroup over 8-bit x, K whole (one range; cols_tuning.py times more). Up to 4 columns
    and on CPU drivers: rows and lanes as for the f32 kernel. From 8 on a GPU, measured on an H200
    (Llama-8B's weights, 8-32 columns): one row per lane group while columns' sums fill the
    registers, and tiles of x small enough that several workgroups share an SM (a 48 KiB tile left
    one and ran 2-3x slower): gate+up (two weights) over 4 lanes per row (8 at 16 columns), one item
    per tile; one weight over 16 lanes per row (Q6_K, whose items are twice as long: 8), two rows
    from 16 columns on, two items per tile up to 16. Lanes are halved until one item each fits
    shared memory, then as many items per tile (up to 4) as keep the raw words in flight within
    MAT_COLS_X8_RAW_WORDS and the tile within it."""
    threads, rows, row_lanes = mat_cols_shape(ctx, cols, mats)
    tiles = (4, 2)
    if cols >= MAT_COLS_MANY and ctx.info.kind != "cpu":
        lanes, big = ctx.info.subgroup_size, cols > 16 or mats == 1
        threads = (2 if big else 1) * MAT_COLS_SUBGROUPS * lanes
        if mats == 2:
            rows, row_lanes, tiles = 1, 8 if cols == 16 else 4, ()
        else:
            rows, row_lanes = (1 if cols <= MAT_COLS_MANY else 2), (8 if qtype == T.Q6_K else 16)
            tiles = (2,) if cols <= 16 and qtype != T.Q6_K else ()
        row_lanes = min(row_lanes, lanes)
    raw = mats * rows * X8_ITEM_RAW_WORDS[qtype]
    while row_lanes > 1 and not x8_tile_fits(ctx, cols, (threads, rows, row_lanes, 1, 1), qtype):
        row_lanes //= 2
    tile = next((t for t in tiles if t * raw <= MAT_COLS_X8_RAW_WORDS
                 and x8_tile_fits(ctx, cols, (threads, rows, row_lanes, t, 1), qtype)), 1)
    return threads, rows, row_lanes, tile, 1


def x8_shape_runs(ctx, cols: int, shape: tuple[int, int, int, int, int], qtype: T) -> bool:
    """Whether an 8-bit mat-cols shape can run over `cols` (a variant's count) columns: as
    `mat_cols_shape_runs`, a tile of at least one item within shared memory, and ranges of K past
    one only where the split variant is built and the device adds floats atomically."""
    splits = shape[4]
    return (mat_cols_shape_runs(ctx, shape) and shape[3] > 0 and x8_tile_fits(ctx, cols, shape, qtype)
            and (splits == 1 or (splits > 1 and cols in MAT_COLS_X8_TUNED and ctx.info.float_atomic_add)))


def x8_tile_fits(ctx, cols: int, shape: tuple[int, int, int, int, int], qtype: T) -> bool:
    return mat_cols_x8_tile_bytes(cols, shape, qtype) <= ctx.info.max_shared_memory


def mat_cols_x8_tile_bytes(cols: int, shape: tuple[int, int, int, int, int], qtype: T) -> int:
    """Shared memory of the 8-bit mat-cols kernel's tile of x: 48 bytes per 32 values (x8.glsl)
    of lanes x items values per column."""
    row_lanes, tile_items = shape[2:4]
    return cols * row_lanes * tile_items * X8_ITEM_VALUES[qtype] // X8_BLOCK_VALUES * X8_BLOCK_BYTES
