"""Mat-vec, mat-mat and row lookup for every GGUF weight type, on lavapipe (and on a GPU: the
mat-mat tests take every kernel the device offers, cooperative matrices included), against
gguf.quants.dequantize + numpy in float64.

Tolerance: ||y - ref|| <= 1e-5 * ||ref|| (fp32 accumulation of exactly dequantized weights;
observed errors are ~1e-7). The cooperative-matrix kernel multiplies f16 weights and
activations: its reference rounds both to f16 first (numpy), within 1e-4 (a value the GPU
rounds the other way now and then; the f16 rounding itself is ~5e-4, so the check still tells);
where the items kernel takes the product, the weights as it dequantizes them in f16 (`items_f16`).
get_rows must match the dequantized rows to fp32 rounding."""
import dataclasses

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from tests.kernel_io import own_context
from worker.engine.kernels import coopmat, fragments
from worker.engine.kernels.coopmat import coopmat_kernel, coopmat_splits, frag_kernel, items_kernel
from worker.engine.kernels.embedding import get_rows
from worker.engine.kernels.fragments import nv_fragments
from worker.engine.kernels.halves import f16_bytes
from worker.engine.kernels.mat_vec import mat_vec_shape
from worker.engine.kernels.matmul import matmul
from worker.engine.kernels.paths import coopmat_shape, paths
from worker.engine.kernels.tensor import free_tensor, upload_tensor
from worker.engine.kernels.tile_tuning import candidates as tile_candidates
from worker.engine.kernels.tuning import candidates
from worker.engine.kernels.x8 import x8_bytes

RTOL = 1e-5
F16_RTOL = 1e-4
PATHS = ("tiled", "mat_vec", "coopmat")
FLOAT_TYPES = (T.F32, T.F16, T.BF16)
LEGACY_TYPES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)
RANDOM_BLOCK_TYPES = (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4)
ALL_TYPES = FLOAT_TYPES + LEGACY_TYPES + RANDOM_BLOCK_TYPES
# Byte offsets of the f16 scales inside a block: random bytes there would give inf/NaN or huge values.
F16_FIELDS = {T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}


def random_weights(qtype: T, rows: int, cols: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(GGUF bytes [rows, row_bytes], dequantized float64 [rows, cols]). gguf quantizes the
    float and legacy types; k-quants and MXFP4 get random blocks with sane scales."""
    rng = np.random.default_rng(seed)
    block, type_size = GGML_QUANT_SIZES[qtype]
    if qtype in FLOAT_TYPES + LEGACY_TYPES:
        data = gq.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype)
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(rows, -1)
    else:
        blocks = rng.integers(0, 256, (rows * cols // block, type_size), dtype=np.uint8)
        for offset in F16_FIELDS.get(qtype, ()):
            scale = rng.uniform(0.001, 0.02, len(blocks)).astype(np.float16)
            blocks[:, offset:offset + 2] = scale.view(np.uint8).reshape(-1, 2)
        if qtype == T.MXFP4:
            blocks[:, 0] = rng.integers(120, 132, len(blocks))
        raw = blocks.reshape(rows, -1)
    ref = gq.dequantize(raw, qtype).astype(np.float64).reshape(rows, cols)
    return raw, ref


def cols_for(qtype: T) -> tuple[int, ...]:
    """Row lengths that are not a multiple of one workgroup pass (32 threads x 16 values on
    lavapipe); float types also with a tail shorter than 16."""
    block = GGML_QUANT_SIZES[qtype][0]
    return {1: (37, 531), 32: (96, 800), 256: (768,)}[block]


def run_matmul(ctx, qtype, raw, cols, x, n, y0=None, path=None, shape=None, tile=None):
    """(y, the weight's parts): y (+)= W x through matmul's `path` (None: its choice), with the
    f16 and 8-bit scratch that any path takes."""
    tensor = upload_tensor(ctx, "w", qtype, (cols, raw.shape[0]), raw)
    tensor.mat_vec_shape, tensor.coopmat_tile = shape, tile
    xb, yb = ctx.alloc(x.nbytes), ctx.alloc(4 * n * tensor.rows)
    xh, x8 = ctx.alloc(f16_bytes(n, cols)), ctx.alloc(x8_bytes(n, cols))
    ctx.upload(xb, x.astype(np.float32))
    if y0 is not None:
        ctx.upload(yb, y0.astype(np.float32))
    rec = ctx.recording()
    matmul(rec, tensor, xb, yb, n, y_accumulate=y0 is not None, path=path, xh=xh, x8=x8)
    ctx.run(rec.finish())
    y = ctx.download(yb, count=n * tensor.rows).reshape(n, tensor.rows)
    rec.destroy()
    parts = len(tensor.parts)
    free_tensor(ctx, tensor)
    for buffer in (xb, yb, xh, x8):
        ctx.free(buffer)
    return y, parts


def assert_close(y, ref, rtol=RTOL):
    err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    assert err <= rtol, f"relative error {err:.2e}"


def mat_mat_paths(ctx) -> list[str]:
    return [p for p in paths(ctx) if p in ("tiled", "coopmat")]


def offered(ctx, path):
    if path not in paths(ctx):
        pytest.skip(f"{ctx.info.name} has no {path} kernel")


def product(x, w, path):
    """The reference of x @ w.T as the path computes it (f16 operands on matrix units)."""
    if path == "coopmat":
        x, w = (np.asarray(a, np.float16).astype(np.float64) for a in (x, w))
        return x @ w.T, F16_RTOL
    return x.astype(np.float64) @ w.T, RTOL


def multiplied(ctx, path, qtype, raw, w, n):
    """The weights that `path` multiplies over n columns: w (dequantized exactly), or where the
    items kernel takes the product, w as it dequantizes them in f16 (`items_f16`)."""
    return items_f16(raw, qtype) if path == "coopmat" and items_kernel(ctx.info, qtype, n) else w


def items_f16(raw, qtype):
    """The weights of `raw` (Q4_K, Q5_K or Q6_K) as the items kernel stores them: per sub-block
    a = d * sc and b (-dmin * m, -32 a for Q6_K) rounded to f16, then a * q + b for the
    unsigned quants q rounded once (an f16 fma). q comes from gguf with unit scales."""
    blocks = raw.reshape(-1, GGML_QUANT_SIZES[qtype][1])
    unit = blocks.copy()
    if qtype == T.Q6_K:
        scale = blocks[:, 192:208].view(np.int8).astype(np.float64)
        d = blocks[:, 208:210].copy().view(np.float16).astype(np.float64)
        a = (d * scale).astype(np.float16).astype(np.float64)
        b = -32 * a
        unit[:, 192:208] = 1
        unit[:, 208:210] = np.array([1.0], np.float16).view(np.uint8)
        offset = 32
    else:
        sc, m = gq.Q4_K.get_scale_min(blocks[:, 4:16])
        d, dmin = (blocks[:, i:i + 2].copy().view(np.float16).astype(np.float64) for i in (0, 2))
        a = (d * sc).astype(np.float16).astype(np.float64)
        b = (-dmin * m).astype(np.float16).astype(np.float64)
        unit[:, 0:4] = np.array([1.0, 0.0], np.float16).view(np.uint8)
        unit[:, 4:16] = [1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]   # get_scale_min: sc 1, m 0
        offset = 0
    q = gq.dequantize(unit, qtype).astype(np.float64).reshape(len(blocks), a.shape[1], -1) + offset
    w = (a[:, :, None] * q + b[:, :, None]).astype(np.float16).astype(np.float64)
    return w.reshape(raw.shape[0], -1)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_mat_vec_every_type(vk_ctx, qtype):
    for rows in (1, 7, 33, 257):
        for cols in cols_for(qtype):
            raw, w = random_weights(qtype, rows, cols, seed=rows + cols)
            x = np.random.default_rng(rows).standard_normal((1, cols))
            y, _ = run_matmul(vk_ctx, qtype, raw, cols, x, 1)
            assert_close(y, x.astype(np.float32) @ w.T)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_mat_mat_every_type(vk_ctx, qtype, path):
    """Several columns through each mat-mat kernel and through the mat-vec kernel's column
    groups (n = 3 fits one group, 17 and 70 leave a partial last group and partial tiles)."""
    offered(vk_ctx, path)
    cols = cols_for(qtype)[-1]
    raw, w = random_weights(qtype, 67, cols, seed=3)
    for n in (3, 17, 70):
        x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
        y, _ = run_matmul(vk_ctx, qtype, raw, cols, x, n, path=path)
        assert_close(y, *product(x, multiplied(vk_ctx, path, qtype, raw, w, n), path))


@pytest.mark.parametrize("qtype", [T.F32, T.Q4_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_mat_mat_over_many_tiles(vk_ctx, qtype):
    """A product of several whole and partial tiles in both directions, K over several steps,
    through each mat-mat kernel the device offers (a prefill chunk in miniature)."""
    cols = {T.F32: 531}.get(qtype, 512)
    raw, w = random_weights(qtype, 301, cols, seed=8)
    x = np.random.default_rng(4).standard_normal((150, cols)).astype(np.float32)
    for path in mat_mat_paths(vk_ctx):
        y, _ = run_matmul(vk_ctx, qtype, raw, cols, x, 150, path=path)
        assert_close(y, *product(x, w, path))


@pytest.mark.parametrize("qtype", [T.F16, T.Q4_0, T.Q4_K, T.Q6_K, T.Q8_0], ids=lambda t: t.name)
def test_mat_vec_every_tuning_candidate(vk_ctx, qtype):
    """Each workgroup shape the tuner may choose (rows and K not multiples of any workgroup's
    share), for one column, and for Q4_0 also two: the reduction indexes by rows and columns.
    Only one type takes columns because each (shape, columns) pipeline costs lavapipe ~0.3-1 s
    of LLVM compilation on a cold shader cache."""
    cols = cols_for(qtype)[-1]
    raw, w = random_weights(qtype, 37, cols, seed=11)
    for n in (1, 2) if qtype == T.Q4_0 else (1,):
        x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
        for shape in candidates(vk_ctx.info):
            y, _ = run_matmul(vk_ctx, qtype, raw, cols, x, n, path="mat_vec", shape=shape)
            assert_close(y, x @ w.T)


@pytest.mark.parametrize("qtype", [T.F16, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_coopmat_every_tile_candidate(vk_ctx, qtype):
    """Each tile the tile tuner may choose, over partial tiles in both directions."""
    offered(vk_ctx, "coopmat")
    raw, w = random_weights(qtype, 301, 512, seed=12)
    x = np.random.default_rng(5).standard_normal((150, 512)).astype(np.float32)
    tiles = tile_candidates(vk_ctx.info)
    assert len(tiles) > 1
    for tile in tiles:
        y, _ = run_matmul(vk_ctx, qtype, raw, 512, x, 150, path="coopmat", tile=tile)
        assert_close(y, *product(x, w, "coopmat"))


@pytest.mark.parametrize("n", [12, 40])
@pytest.mark.parametrize("qtype", [T.F16, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_coopmat_split_k(vk_ctx, qtype, n):
    """A product over few tiles takes split-K on devices that add floats atomically (K in
    ranges; F16's K leaves the last ranges short and empty): the same sums, added to y or
    written over what it held."""
    offered(vk_ctx, "coopmat")
    cols = 5000 if qtype == T.F16 else 256 * 23
    raw, w = random_weights(qtype, 70, cols, seed=13)
    x = np.random.default_rng(6).standard_normal((n, cols)).astype(np.float32)
    y0 = np.random.default_rng(7).standard_normal((n, 70)).astype(np.float32)
    tensor = upload_tensor(vk_ctx, "w", qtype, (cols, 70), raw)
    (bm, bn, _, _, bk, _), ahead = coopmat_kernel(vk_ctx.info, tensor, n)
    assert (coopmat_splits(vk_ctx, tensor, n, (bm, bn, bk), ahead) > 1) == vk_ctx.info.float_atomic_add
    free_tensor(vk_ctx, tensor)
    ref, rtol = product(x, multiplied(vk_ctx, "coopmat", qtype, raw, w, n), "coopmat")
    y, _ = run_matmul(vk_ctx, qtype, raw, cols, x, n, y0=y0, path="coopmat")
    assert_close(y, y0 + ref, rtol)
    y, _ = run_matmul(vk_ctx, qtype, raw, cols, x, n, path="coopmat")
    assert_close(y, ref, rtol)


@pytest.mark.parametrize("kernel", ["items", "frag"])
@pytest.mark.parametrize("n", [5, 16, 17, 32])
@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q5_K, T.Q6_K], ids=lambda t: t.name)
def test_coopmat_items_few_columns(vk_ctx, monkeypatch, qtype, n, kernel):
    """Up to COOPMAT_ITEMS_COLS columns the K-quants take the items kernel, or where the device's
    matrix layout is NVIDIA's mul_mat_coopmat_frag.comp (on others it runs the items kernel
    here): each count of steps loaded ahead (more than a short range has), partial tiles in both
    directions, one range of K and split-K, written over y and added to it."""
    offered(vk_ctx, "coopmat")
    if kernel == "frag" and not nv_fragments(vk_ctx):
        pytest.skip(f"{vk_ctx.info.name} lays its matrices out otherwise")
    if kernel == "items":
        monkeypatch.setattr(fragments, "_known", {vk_ctx: False})
    assert (frag_kernel(vk_ctx, qtype, n) is not None) == (kernel == "frag")
    for cols in (256 * 7, 256 * 23):
        raw, _ = random_weights(qtype, 301, cols, seed=n + cols)
        x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
        tensor = upload_tensor(vk_ctx, "w", qtype, (cols, 301), raw)
        assert coopmat_kernel(vk_ctx.info, tensor, n)[1] >= 1   # the items kernel's products
        free_tensor(vk_ctx, tensor)
        ref, rtol = product(x, items_f16(raw, qtype), "coopmat")
        for ahead in (1, 2, 3, 5):
            monkeypatch.setattr(coopmat, "COOPMAT_ITEMS_AHEAD", {qtype: ahead})
            y, _ = run_matmul(vk_ctx, qtype, raw, cols, x, n, path="coopmat")
            assert_close(y, ref, rtol)
        y0 = np.random.default_rng(7).standard_normal((n, 301)).astype(np.float32)
        y, _ = run_matmul(vk_ctx, qtype, raw, cols, x, n, y0=y0, path="coopmat")
        assert_close(y, y0 + ref, rtol)


def test_coopmat_layout_probe(vk_ctx):
    """coopmat_layout.comp finds where each of the 256 elements of a 16 x 16 matrix (as A and as
    B) lives: every element somewhere over the lanes (AMD's lanes hold copies of others'), no
    other value. On NVIDIA, NVIDIA's layout: each element in one place, as the frag kernel takes."""
    offered(vk_ctx, "coopmat")
    if vk_ctx.info.subgroup_size != fragments.SUBGROUP or coopmat_shape(vk_ctx.info) != (16, 16, 16):
        pytest.skip("the probe runs 16x16x16 matrices over 32 lanes")
    nvidia = "NVIDIA" in vk_ctx.info.name
    for found in fragments.device_layout(vk_ctx):
        assert set(found[found >= 0].tolist()) == set(range(256)) and (found >= -1).all()
        if nvidia:
            assert sorted(found[found >= 0].tolist()) == list(range(256))
    assert nv_fragments(vk_ctx) or not nvidia


def test_items_kernel_splits_k_to_one_workgroup_a_multiprocessor(vk_ctx, monkeypatch):
    """coopmat_splits: the items kernel splits K into as many ranges as keep a product's
    workgroups within one per multiprocessor (coopmat.ITEMS_SPLIT_GROUPS where the driver does not
    count them), where the plain kernel's go towards SPLIT_FEW_COLS_GROUPS; on devices that add
    floats atomically (lavapipe too)."""
    if not vk_ctx.info.float_atomic_add:
        pytest.skip(f"{vk_ctx.info.name} adds no floats atomically: no product splits K")
    # a small tile keeps the weights small (the rule counts tiles and steps): K of 16 ranges of
    # SPLIT_MIN_STEPS steps
    bm, bn, bk, k = 16, 32, 16, 16 * 8 * 16
    # (multiprocessors, tiles): ranges through the items kernel (the 8B's down, Q/K/V, gate, ...)
    expected = {(132, 32): 4, (132, 48): 2, (132, 112): 1, (132, 8): 16, (132, 67): 1, (132, 66): 2,
                (28, 32): 1, (28, 8): 3, (0, 32): 4, (0, 48): 2, (0, 65): 1, (0, 64): 2}
    assert coopmat.ITEMS_SPLIT_GROUPS == 128
    for (sms, tiles), ranges in expected.items():
        monkeypatch.setattr(vk_ctx, "info", dataclasses.replace(vk_ctx.info, multiprocessors=sms))
        raw = np.zeros(tiles * bm * (k // 256) * GGML_QUANT_SIZES[T.Q4_K][1], np.uint8)
        tensor = upload_tensor(vk_ctx, "w", T.Q4_K, (k, tiles * bm), raw)
        try:
            assert coopmat_splits(vk_ctx, tensor, 32, (bm, bn, bk), 1) == ranges, (sms, tiles)
            assert coopmat_splits(vk_ctx, tensor, 32, (bm, bn, bk)) == min(16, 1536 // tiles)
        finally:
            free_tensor(vk_ctx, tensor)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n", [1, 5])
def test_accumulate_adds_to_y(vk_ctx, n, path):
    offered(vk_ctx, path)
    raw, w = random_weights(T.Q4_1, 33, 96)
    x = np.random.default_rng(1).standard_normal((n, 96)).astype(np.float32)
    y0 = np.random.default_rng(2).standard_normal((n, 33)).astype(np.float32)
    y, _ = run_matmul(vk_ctx, T.Q4_1, raw, 96, x, n, y0, path=path)
    ref, rtol = product(x, w, path)
    assert_close(y, y0 + ref, rtol)


@pytest.fixture(scope="module")
def small_binding_ctx(vk_settings):
    """Binding range of 1000 bytes: the test tensors split into many parts."""
    with own_context(vk_settings, block_size=16 << 20, max_binding_range=1000) as ctx:
        yield ctx


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K, T.F16], ids=lambda t: t.name)
def test_rows_split_into_parts(small_binding_ctx, qtype):
    cols = cols_for(qtype)[0]
    raw, w = random_weights(qtype, 41, cols, seed=5)
    for n, path in ((1, "mat_vec"), (17, "mat_vec")) + tuple((17, p) for p in mat_mat_paths(small_binding_ctx)):
        x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
        y, parts = run_matmul(small_binding_ctx, qtype, raw, cols, x, n, path=path)
        assert parts > 3
        assert_close(y, *product(x, multiplied(small_binding_ctx, path, qtype, raw, w, n), path))


def test_more_row_groups_than_dispatch_limit(vk_ctx):
    """An output head taller than maxComputeWorkGroupCount[0] x rows per workgroup."""
    if vk_ctx.info.max_workgroup_count > 1 << 16:
        pytest.skip("the device dispatches this many workgroups in one dimension")
    rows = vk_ctx.info.max_workgroup_count * mat_vec_shape(vk_ctx)[1] + 77
    raw, w = random_weights(T.Q4_0, rows, 32, seed=9)
    x = np.random.default_rng(0).standard_normal((1, 32)).astype(np.float32)
    y, _ = run_matmul(vk_ctx, T.Q4_0, raw, 32, x, 1)
    assert_close(y, x @ w.T)
    np.testing.assert_allclose(y[0, -77:], (x @ w.T)[0, -77:], rtol=1e-4, atol=1e-5)


def lookup(ctx, qtype, raw, cols, ids, scale=1.0):
    table = upload_tensor(ctx, "token_embd", qtype, (cols, raw.shape[0]), raw)
    idb, out = ctx.alloc(4 * len(ids)), ctx.alloc(4 * len(ids) * cols)
    ctx.upload(idb, np.asarray(ids, np.uint32))
    rec = ctx.recording()
    get_rows(rec, table, idb, out, len(ids), scale)
    ctx.run(rec.finish())
    result = ctx.download(out, count=len(ids) * cols).reshape(len(ids), cols)
    rec.destroy()
    parts = len(table.parts)
    free_tensor(ctx, table)
    ctx.free(idb)
    ctx.free(out)
    return result, parts


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_get_rows_every_type(vk_ctx, qtype):
    for cols in cols_for(qtype):
        raw, w = random_weights(qtype, 33, cols, seed=cols)
        ids = [0, 32, 5, 5, 17]
        rows, _ = lookup(vk_ctx, qtype, raw, cols, ids)
        np.testing.assert_allclose(rows, w[ids], rtol=1e-6, atol=1e-7)


def test_get_rows_across_parts(small_binding_ctx):
    raw, w = random_weights(T.Q6_K, 9, 256, seed=4)
    ids = [8, 0, 3, 7, 3]
    rows, parts = lookup(small_binding_ctx, T.Q6_K, raw, 256, ids)
    assert parts == 3  # 4 rows of 210 bytes per 1000-byte part
    np.testing.assert_allclose(rows, w[ids], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("qtype", [T.F32, T.Q8_0], ids=lambda t: t.name)
def test_get_rows_scaled(vk_ctx, qtype):
    """Gemma's embedding scale, sqrt(n_embd), applied in the lookup (F32 rows with a tail too)."""
    for cols in cols_for(qtype):
        raw, w = random_weights(qtype, 9, cols, seed=cols + 1)
        rows, _ = lookup(vk_ctx, qtype, raw, cols, [3, 0, 8], scale=25.298221)
        np.testing.assert_allclose(rows, w[[3, 0, 8]].astype(np.float64) * 25.298221, rtol=1e-6, atol=1e-6)
