"""The mat-cols kernel over 8-bit activations (mul_mat_cols.comp with X8, matmul.py's
"mat_cols_x8" path: batched decode of 2 .. 64 columns of Q4_K, Q5_K and Q6_K weights, the
weights' integer quants dotted with the activations' by packed 8-bit dot products), on lavapipe
(and on a GPU), against gguf.quants.dequantize + numpy in float64.

The activations are exact in 8 bits per block (test_kernels_mmq.exact_activations), so the
kernel is held to matmul's fp32 tolerance. Column counts cover each compiled variant (2 .. 32)
and counts between and past them (3, 33: clamped columns never stored, column groups side by
side); K over several tiles with a partial last one; rows that leave lane groups past the end;
the residual add; the gate+up (SwiGLU, GeGLU) and Q/K/V variants; workgroup shapes; K split
into ranges (the split-K variants, float atomics), adding to y or to zeros."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from tests.test_kernels_matmul import assert_close, random_weights, run_matmul, small_binding_ctx  # noqa: F401
from tests.test_kernels_matmul_glu import reference
from tests.test_kernels_mmq import exact_activations, run_glu
from worker.engine import shaderbuild
from worker.engine.kernels.mat_cols import (
    MAT_COLS_X8_TUNED,
    MAT_COLS_X8_VARIANTS,
    X8_ITEM_VALUES,
    mat_cols_columns,
    mat_cols_x8_shape,
    mat_cols_x8_tile_bytes,
)
from worker.engine.kernels.matmul import matmul, matmul_qkv, matmul_swiglu
from worker.engine.kernels.paths import x8_cols_types
from worker.engine.kernels.tensor import free_tensor, upload_rows, upload_tensor
from worker.engine.kernels.x8 import x8_bytes

TYPES = (T.Q4_K, T.Q5_K, T.Q6_K)
COUNTS = (2, 3, 4, 8, 16, 32, 33)
K = 1280   # 20 Q4_K items of 64 values, 10 Q6_K items of 128: over a tile, the last one partial


def test_built_for_the_item_types():
    """A variant per column count for the types whose items give integer quants, and only those."""
    assert x8_cols_types() == frozenset(TYPES) == frozenset(X8_ITEM_VALUES)
    table = shaderbuild.variants()
    for op in ("mul_mat_cols_x8", "mul_mat_cols_glu_x8", "mul_mat_cols_geglu_x8", "mul_mat_cols_qkv_x8"):
        for c in MAT_COLS_X8_VARIANTS:
            for t in TYPES:
                assert {("COLS", str(c)), ("X8", "1")} <= set(table[f"{op}_c{c}_{t.name.lower()}"].defines)
    assert [mat_cols_columns(n, MAT_COLS_X8_VARIANTS) for n in (2, 3, 9, 17, 32, 33, 64)] == [2, 4, 16, 32, 32, 32, 32]


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_every_type(vk_ctx, qtype):
    raw, w = random_weights(qtype, 37, K, seed=7)
    for n in COUNTS:
        x = exact_activations(n, K, seed=n)
        y0 = np.random.default_rng(n).standard_normal((n, 37)).astype(np.float32)
        y, _ = run_matmul(vk_ctx, qtype, raw, K, x, n, y0, path="mat_cols_x8")
        assert_close(y, y0 + x.astype(np.float64) @ w.T)


@pytest.mark.parametrize("tile", [1, 2, 4])
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("row_lanes", [1, 4, 0], ids=["lane", "quad", "subgroup"])
def test_workgroup_shapes(vk_ctx, row_lanes, rows, tile):
    """Lanes per row (one, four, the subgroup), rows per lane group and items per tile, over more
    and fewer rows than a workgroup covers."""
    lanes = vk_ctx.info.subgroup_size
    shape = (2 * lanes, rows, row_lanes or lanes, tile, 1)
    raw, w = random_weights(T.Q4_K, 45, K, seed=2)
    tensor = upload_tensor(vk_ctx, "w", T.Q4_K, (K, 45), raw)
    counts = [n for n in (3, 8) if mat_cols_x8_tile_bytes(mat_cols_columns(n, MAT_COLS_X8_VARIANTS), shape, T.Q4_K)
              <= vk_ctx.info.max_shared_memory]
    assert counts   # 3 columns (a tile for 4) fits every device's 16 KiB or more
    for n in counts:
        x = exact_activations(n, K, seed=n)
        xb, yb, x8 = vk_ctx.alloc(x.nbytes), vk_ctx.alloc(4 * n * 45), vk_ctx.alloc(x8_bytes(n, K))
        vk_ctx.upload(xb, x)
        vk_ctx.upload(yb, np.full(n * 45, np.nan, np.float32))
        rec = vk_ctx.recording()
        matmul(rec, tensor, xb, yb, n, path="mat_cols_x8", cols_shape=shape, x8=x8)
        vk_ctx.run(rec.finish())
        y = vk_ctx.download(yb, count=n * 45).reshape(n, 45)
        rec.destroy()
        for buffer in (xb, yb, x8):
            vk_ctx.free(buffer)
        assert_close(y, x.astype(np.float64) @ w.T)
    free_tensor(vk_ctx, tensor)


def split_shape(ctx, n: int, splits: int) -> tuple[int, int, int, int, int]:
    """The default shape of n columns over 4 lanes per row, one item a tile, in `splits` ranges of K."""
    threads, rows, _, _, _ = mat_cols_x8_shape(ctx, mat_cols_columns(n, MAT_COLS_X8_VARIANTS), 1, T.Q4_K)
    return threads, rows, min(4, ctx.info.subgroup_size), 1, splits


def run_split(ctx, qtype, raw, x, n, shape, y0=None):
    """y (+)= W x through the 8-bit mat-cols kernel of `shape` (y filled with NaN where it does
    not accumulate: a range that is not added to zeros poisons its rows)."""
    tensor = upload_tensor(ctx, "w", qtype, (K, raw.shape[0]), raw)
    xb, yb, x8 = ctx.alloc(x.nbytes), ctx.alloc(4 * n * tensor.rows), ctx.alloc(x8_bytes(n, K))
    ctx.upload(xb, x)
    ctx.upload(yb, np.full(n * tensor.rows, np.nan, np.float32) if y0 is None else y0)
    rec = ctx.recording()
    matmul(rec, tensor, xb, yb, n, y_accumulate=y0 is not None, path="mat_cols_x8", cols_shape=shape, x8=x8)
    ctx.run(rec.finish())
    y = ctx.download(yb, count=n * tensor.rows).reshape(n, tensor.rows)
    rec.destroy()
    free_tensor(ctx, tensor)
    for buffer in (xb, yb, x8):
        ctx.free(buffer)
    return y


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_split_k(vk_ctx, qtype):
    """K in 2, 3 and 7 ranges (the last ones short or empty: Q6_K has 10 items of K) at each
    count the split variant is built for, over zeros and adding to y (the residual)."""
    assert vk_ctx.info.float_atomic_add
    raw, w = random_weights(qtype, 37, K, seed=11)
    for n, splits in ((5, 2), (8, 7), (16, 3), (32, 2)):
        assert mat_cols_columns(n, MAT_COLS_X8_VARIANTS) in MAT_COLS_X8_TUNED
        x = exact_activations(n, K, seed=n)
        shape = split_shape(vk_ctx, n, splits)
        assert_close(run_split(vk_ctx, qtype, raw, x, n, shape), x.astype(np.float64) @ w.T)
        y0 = np.random.default_rng(n).standard_normal((n, 37)).astype(np.float32)
        assert_close(run_split(vk_ctx, qtype, raw, x, n, shape, y0), y0 + x.astype(np.float64) @ w.T)


def test_split_k_is_refused_where_it_cannot_run(vk_ctx):
    """Ranges of K for a count without the split variant, or for gate+up (SwiGLU needs whole sums)."""
    raw, _ = random_weights(T.Q4_K, 9, K)
    gate, up = (upload_tensor(vk_ctx, name, T.Q4_K, (K, 9), raw) for name in "gu")
    buffers = [vk_ctx.alloc(size) for size in (4 * 8 * K, 4 * 8 * 9, 4 * 8 * 9, x8_bytes(8, K))]
    rec = vk_ctx.recording()
    try:
        with pytest.raises(ValueError, match="does not fit"):
            matmul(rec, gate, buffers[0], buffers[1], 4, path="mat_cols_x8", cols_shape=split_shape(vk_ctx, 4, 2),
                   x8=buffers[3])
        with pytest.raises(ValueError, match="does not fit"):
            matmul_swiglu(rec, gate, up, buffers[0], buffers[1], 8, buffers[2], path="mat_cols_x8",
                          cols_shape=split_shape(vk_ctx, 8, 2), x8=buffers[3])
    finally:
        rec.destroy()
        for t in (gate, up):
            free_tensor(vk_ctx, t)
        for buffer in buffers:
            vk_ctx.free(buffer)


def test_a_tile_past_shared_memory_is_refused(vk_ctx):
    lanes = vk_ctx.info.subgroup_size
    too_many = vk_ctx.info.max_shared_memory // (32 * lanes * 2 * 48) + 1   # items of 2 blocks, 48 bytes each
    raw, _ = random_weights(T.Q4_K, 9, K)
    tensor = upload_tensor(vk_ctx, "w", T.Q4_K, (K, 9), raw)
    buffers = [vk_ctx.alloc(size) for size in (4 * 32 * K, 4 * 32 * 9, x8_bytes(32, K))]
    rec = vk_ctx.recording()
    try:
        with pytest.raises(ValueError, match="does not fit"):
            matmul(rec, tensor, buffers[0], buffers[1], 32, path="mat_cols_x8",
                   cols_shape=(lanes, 1, lanes, too_many, 1), x8=buffers[2])
    finally:
        rec.destroy()
        free_tensor(vk_ctx, tensor)
        for buffer in buffers:
            vk_ctx.free(buffer)


def test_default_shapes_fit(vk_ctx):
    """Every default shape's tile of x fits shared memory and its raw loads the register budget."""
    for qtype in TYPES:
        for c in MAT_COLS_X8_VARIANTS:
            for mats in (1, 2):
                shape = mat_cols_x8_shape(vk_ctx, c, mats, qtype)
                assert mat_cols_x8_tile_bytes(c, shape, qtype) <= vk_ctx.info.max_shared_memory, (qtype, c, shape)


@pytest.mark.parametrize("qtype, gelu", [(T.Q4_K, False), (T.Q6_K, True)], ids=["Q4_K", "Q6_K-geglu"])
def test_glu(vk_ctx, qtype, gelu):
    (raw_g, w_g), (raw_u, w_u) = random_weights(qtype, 53, K, seed=4), random_weights(qtype, 53, K, seed=5)
    gate, up = (upload_tensor(vk_ctx, name, qtype, (K, 53), raw) for name, raw in (("g", raw_g), ("u", raw_u)))
    for n in (5, 32):
        x = exact_activations(n, K, seed=n)
        assert_close(run_glu(vk_ctx, gate, up, x, n, "mat_cols_x8", gelu), reference(x, w_g, w_u, gelu))
    for t in (gate, up):
        free_tensor(vk_ctx, t)


@pytest.mark.parametrize("splits", [1, 3])
def test_qkv(vk_ctx, splits):
    """The fused Q/K/V weight in one dispatch, each section's rows to its output (in ranges of K:
    every output zeroed first, over the NaN it held)."""
    sections = (64, 32, 32)
    raws = [random_weights(T.Q4_K, rows, K, seed=10 + i) for i, rows in enumerate(sections)]
    fused, views = upload_rows(vk_ctx, "qkv", T.Q4_K, [(K, rows) for rows in sections], [raw for raw, _ in raws])
    n = 9
    fused.cols_shapes = {(16, False): split_shape(vk_ctx, n, splits)}
    x = exact_activations(n, K, seed=3)
    xb, x8 = vk_ctx.alloc(x.nbytes), vk_ctx.alloc(x8_bytes(n, K))
    outs = [vk_ctx.alloc(4 * n * rows) for rows in sections]
    vk_ctx.upload(xb, x)
    for out, rows in zip(outs, sections):
        vk_ctx.upload(out, np.full(n * rows, np.nan, np.float32))
    rec = vk_ctx.recording()
    matmul_qkv(rec, fused, views, xb, outs, n, path="mat_cols_x8", x8=x8)
    vk_ctx.run(rec.finish())
    for out, rows, (_, w) in zip(outs, sections, raws):
        assert_close(vk_ctx.download(out, count=n * rows).reshape(n, rows), x.astype(np.float64) @ w.T)
    rec.destroy()
    for buffer in (xb, x8, *outs):
        vk_ctx.free(buffer)
    free_tensor(vk_ctx, fused)


def test_rows_split_into_parts(small_binding_ctx):
    """A weight past the binding range in parts, one dispatch each, every part's rows in place."""
    raw, w = random_weights(T.Q6_K, 41, 512, seed=5)
    x = exact_activations(9, 512, seed=1)
    y, parts = run_matmul(small_binding_ctx, T.Q6_K, raw, 512, x, 9, path="mat_cols_x8")
    assert parts > 3
    assert_close(y, x.astype(np.float64) @ w.T)
