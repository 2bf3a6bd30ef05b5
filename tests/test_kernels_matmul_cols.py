"""The mat-cols kernel (mul_mat_cols.comp, batched decode: several columns, the weights read once
for all of them) for every GGUF weight type, on lavapipe (and on a GPU), against
gguf.quants.dequantize + numpy in float64; its gate+up (SwiGLU, GeGLU) and Q/K/V variants.

Column counts cover each compiled variant (2, 4, 8, 16 columns per workgroup), counts between
them (3, 5: clamped columns never stored) and past the largest (33: column groups side by
side); K over one and several x tiles, with a partial last tile; rows that leave a subgroup's
rows partly past the end. Tolerance as for matmul: fp32 accumulation of exact weights."""
import dataclasses

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from tests.kernel_io import own_context
from tests.test_kernels_matmul import (  # noqa: F401
    ALL_TYPES,
    FLOAT_TYPES,
    assert_close,
    random_weights,
    run_matmul,
    small_binding_ctx,
)
from tests.test_kernels_matmul_glu import Weights, activations, reference
from tests.test_kernels_matmul_norm import EPS, Run, joined_qkv, rms_normed
from worker.engine import shaderbuild
from worker.engine.kernels.mat_cols import MAT_COLS_VARIANTS, mat_cols_columns, mat_cols_shape, mat_cols_tile
from worker.engine.kernels.matmul import (
    matmul,
    matmul_qkv,
    matmul_swiglu,
    normed_input,
)
from worker.engine.kernels.tensor import free_tensor
from worker.engine.weight_types import WEIGHT_TYPES

COUNTS = (2, 3, 5, 8, 16, 33)


def k_for(qtype: T) -> int:
    """A row length that is a multiple of 16 and not of one x tile (16 values per lane)."""
    return 528 if qtype in FLOAT_TYPES else (800 if qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4)
                                              else 768)


def test_a_variant_per_column_count_and_type():
    """variants.toml's `columns`: <op>_c<N>_<type>, built with COLS=N."""
    table = shaderbuild.variants()
    for op in ("mul_mat_cols", "mul_mat_cols_glu", "mul_mat_cols_geglu", "mul_mat_cols_qkv"):
        assert op not in table and f"{op}_q4_k" not in table
        for c in MAT_COLS_VARIANTS:
            for t in WEIGHT_TYPES:
                assert ("COLS", str(c)) in table[f"{op}_c{c}_{t.name.lower()}"].defines


def test_columns_per_workgroup():
    """The smallest variant holding n, or an even share of n over the fewest largest groups."""
    assert [mat_cols_columns(n) for n in (2, 3, 5, 8, 9, 16, 17, 33, 64)] == [2, 4, 8, 8, 16, 16, 16, 16, 16]
    assert MAT_COLS_VARIANTS[-1] == 16


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_every_type(vk_ctx, qtype):
    cols = k_for(qtype)
    raw, w = random_weights(qtype, 37, cols, seed=cols)
    for n in COUNTS:
        x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
        y, _ = run_matmul(vk_ctx, qtype, raw, cols, x, n, path="mat_cols")
        assert_close(y, x.astype(np.float64) @ w.T)


@pytest.mark.parametrize("rows", [1, 2, 4])
@pytest.mark.parametrize("subgroups", [1, 4])
@pytest.mark.parametrize("row_lanes", [1, 2, 0], ids=["lane", "pair", "subgroup"])
def test_workgroup_shapes(vk_ctx, row_lanes, subgroups, rows):
    """Several subgroups share one x tile; a row's K over one lane, two, the whole subgroup
    (0); rows per lane group, over more and fewer rows than a workgroup covers; the residual
    add."""
    cols = 800
    raw, w = random_weights(T.Q4_0, 45, cols, seed=2)
    lanes = vk_ctx.info.subgroup_size
    shape = (subgroups * lanes, rows, row_lanes or lanes)
    for n in (3, 33):
        x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
        y0 = np.random.default_rng(0).standard_normal((n, 45)).astype(np.float32)
        tensor_out = run_shaped(vk_ctx, T.Q4_0, raw, cols, x, n, y0, shape)
        assert_close(tensor_out, y0 + x.astype(np.float64) @ w.T)


def run_shaped(ctx, qtype, raw, cols, x, n, y0, shape):
    with Weights(ctx) as weights, Run(ctx) as r:
        tensor = weights.upload(qtype, raw, cols)
        xb, yb = r.put(x), r.put(y0)
        r.run(lambda rec: matmul(rec, tensor, xb, yb, n, y_accumulate=True, path="mat_cols", cols_shape=shape))
        return r.get(yb, (n, raw.shape[0]))


def test_default_shapes(vk_ctx):
    """Rows per thread shrink as columns grow (partial sums kept in registers); from 8 columns on
    a row's K is split over fewer lanes than a subgroup's; every default fits its tile."""
    lanes = vk_ctx.info.subgroup_size
    few = min(lanes, 8)
    assert [mat_cols_shape(vk_ctx, c)[1:] for c in MAT_COLS_VARIANTS] == [(4, lanes), (4, lanes), (4, few), (2, few)]
    assert [mat_cols_shape(vk_ctx, c, 2)[1:] for c in MAT_COLS_VARIANTS] == [(4, lanes), (4, lanes), (2, few), (1, few)]
    for c in MAT_COLS_VARIANTS:
        for mats in (1, 2):
            assert mat_cols_tile(vk_ctx, c, mat_cols_shape(vk_ctx, c, mats))


def test_shapes_that_cannot_run_are_refused(vk_ctx):
    """Lanes per row that do not divide the subgroup (or are no power of 2), partial subgroups."""
    lanes = vk_ctx.info.subgroup_size
    for shape in ((lanes, 1, 3), (lanes, 1, 2 * lanes), (lanes + 1, 1, 1), (lanes, 0, 1)):
        assert mat_cols_tile(vk_ctx, 2, shape) is None, shape
    raw, _ = random_weights(T.Q4_0, 9, 256)
    with pytest.raises(ValueError, match="does not fit"):
        run_shaped(vk_ctx, T.Q4_0, raw, 256, np.zeros((2, 256), np.float32), 2, np.zeros((2, 9), np.float32),
                   (lanes, 1, 3))


def test_rows_split_into_parts(small_binding_ctx):
    raw, w = random_weights(T.Q4_K, 41, 256, seed=5)
    x = np.random.default_rng(1).standard_normal((5, 256)).astype(np.float32)
    y, parts = run_matmul(small_binding_ctx, T.Q4_K, raw, 256, x, 5, path="mat_cols")
    assert parts > 3
    assert_close(y, x.astype(np.float64) @ w.T)


def test_rows_not_a_multiple_of_16_are_refused(vk_ctx):
    raw, _ = random_weights(T.F32, 3, 37)
    x = np.zeros((2, 37), np.float32)
    with pytest.raises(ValueError, match="multiple of 16"):
        run_matmul(vk_ctx, T.F32, raw, 37, x, 2, path="mat_cols")


@pytest.mark.parametrize("qtype, gelu", [(T.F16, False), (T.Q4_K, False), (T.Q6_K, False), (T.Q8_0, True)],
                         ids=["F16", "Q4_K", "Q6_K", "Q8_0-geglu"])
def test_gate_up(vk_ctx, qtype, gelu):
    """One dispatch for both products and the activation, every variant's column count."""
    cols = k_for(qtype)
    raw_g, w_g = random_weights(qtype, 19, cols, seed=1)
    raw_u, w_u = random_weights(qtype, 19, cols, seed=2)
    with Weights(vk_ctx) as w, Run(vk_ctx) as r:
        gate, up = w.upload(qtype, raw_g, cols), w.upload(qtype, raw_u, cols)
        for n in (2, 3, 8, 16, 33):
            x = activations(n, w_g, seed=n)
            xb, out = r.put(x), r.empty(n * 19)
            dispatches = r.run(lambda rec: matmul_swiglu(rec, gate, up, xb, out, n, None, gelu=gelu,
                                                         path="mat_cols"))
            assert dispatches == 1
            assert_close(r.get(out, (n, 19)), reference(x, w_g, w_u, gelu))


@pytest.mark.parametrize("shape", [(4, 1, 1), (2, 2, 2), (2, 2, 0)], ids=["4x1-lane", "2x2-pair", "2x2-subgroup"])
def test_gate_up_across_subgroups(vk_ctx, shape):
    """Both weights' sums over a row's lanes, in several subgroups (0 lanes per row: the whole
    subgroup)."""
    raw_g, w_g = random_weights(T.Q4_K, 70, 768, seed=3)
    raw_u, w_u = random_weights(T.Q4_K, 70, 768, seed=4)
    subgroups, rows, row_lanes = shape
    with Weights(vk_ctx) as w, Run(vk_ctx) as r:
        gate, up = w.upload(T.Q4_K, raw_g, 768), w.upload(T.Q4_K, raw_u, 768)
        for n in (3, 16):
            x = activations(n, w_g, seed=n)
            xb, out = r.put(x), r.empty(n * 70)
            r.run(lambda rec: matmul_swiglu(rec, gate, up, xb, out, n, None, path="mat_cols",
                                            cols_shape=(subgroups * vk_ctx.info.subgroup_size, rows,
                                                        row_lanes or vk_ctx.info.subgroup_size)))
            assert_close(r.get(out, (n, 70)), reference(x, w_g, w_u))


def test_gate_up_types_differ(vk_ctx):
    """Q4_K gate, Q6_K up: each product through the mat-cols kernel, then SwiGLU."""
    raw_g, w_g = random_weights(T.Q4_K, 33, 768, seed=5)
    raw_u, w_u = random_weights(T.Q6_K, 33, 768, seed=6)
    x = activations(5, w_g, seed=5)
    with Weights(vk_ctx) as w, Run(vk_ctx) as r:
        gate, up = w.upload(T.Q4_K, raw_g, 768), w.upload(T.Q6_K, raw_u, 768)
        xb, out, scratch = r.put(x), r.empty(5 * 33), r.empty(5 * 33)
        dispatches = r.run(lambda rec: matmul_swiglu(rec, gate, up, xb, out, 5, scratch, path="mat_cols"))
        assert dispatches == 3
        assert_close(r.get(out, (5, 33)), reference(x, w_g, w_u))


@pytest.mark.parametrize("types", [(T.Q4_K,) * 3, (T.Q8_0, T.Q8_0, T.Q6_K)], ids=["qkv", "qk"])
def test_qkv_as_one_tensor(vk_ctx, types):
    """Q, K and V (or Q and K, V apart) in one dispatch, each output at its own layout."""
    cols, rows = 256, (64, 32, 32)
    with Weights(vk_ctx) as weights, Run(vk_ctx) as r:
        raws, fused, members, joined_count = joined_qkv(vk_ctx, weights, types, rows, cols)
        for n in (3, 16):
            x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
            xb = r.put(x)
            outs = [r.empty(n * rows_i) for rows_i in rows]
            dispatches = r.run(lambda rec: matmul_qkv(rec, fused, members, xb, outs, n, path="mat_cols"))
            assert dispatches == 4 - joined_count
            for out, rows_i, (_, w) in zip(outs, rows, raws):
                assert_close(r.get(out, (n, rows_i)), x.astype(np.float64) @ w.T)
    free_tensor(vk_ctx, fused)


@pytest.fixture(scope="module")
def cols_ctx(vk_settings):
    """A context whose batched products take the mat-cols kernel (as GPUs' do by default)."""
    with own_context(dataclasses.replace(vk_settings, batch_kernel="mat_cols")) as ctx:
        yield ctx


def test_batches_take_the_norms_output(cols_ctx):
    """A norm folds into one column's mat-vec; two columns take the mat-cols kernel and the norm
    is recorded, its output their input (the products then match the normalised x)."""
    raw, w = random_weights(T.Q4_K, 9, 256, seed=1)
    x = np.random.default_rng(3).standard_normal((2, 256)).astype(np.float32) * 7
    nw = np.random.default_rng(4).uniform(0.5, 1.5, 256).astype(np.float32)
    with Weights(cols_ctx) as weights, Run(cols_ctx) as r:
        q4 = weights.upload(T.Q4_K, raw, 256)
        xb, nb, scratch, yb = r.put(x), r.put(nw), r.empty(2 * 256), r.empty(2 * 9)
        for n, folds in ((1, True), (2, False)):
            result = []
            dispatches = r.run(lambda rec: result.append(normed_input(rec, xb, nb, scratch, n, 256, EPS, [q4])))
            assert (dispatches == 0) == folds and (result[0][1] is not None) == folds
        assert r.run(lambda rec: matmul(rec, q4, scratch, yb, 2)) == 1
        assert_close(r.get(yb, (2, 9)), rms_normed(x, nw) @ w.T)
