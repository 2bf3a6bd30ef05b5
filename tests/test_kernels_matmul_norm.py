"""The mat-vec kernels with RMSNorm folded in (matmul.py's `norm`, `normed_input`) and Q/K/V as
one tensor and one dispatch (`matmul_qkv`, tensor.upload_rows), on lavapipe, against numpy in
float64 over gguf.quants.dequantize: y = (x / rms(x) * norm_weight) @ W.T."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from tests.test_kernels_matmul import (ALL_TYPES, assert_close, cols_for, multiplied, offered, product,
                                       random_weights)
from tests.test_kernels_matmul_glu import Weights, reference
from worker.engine.kernels.coopmat import coopmat_kernel, coopmat_splits
from worker.engine.kernels.halves import f16_bytes
from worker.engine.kernels.matmul import matmul, matmul_qkv, matmul_swiglu, normed_input
from worker.engine.kernels.norm import FoldedNorm
from worker.engine.kernels.paths import MAT_VEC_MAX_COLS
from worker.engine.kernels.tensor import free_tensor, upload_rows

EPS = 1e-5


def rms_normed(x, weight, eps=EPS):
    v = x.astype(np.float64)
    return v / np.sqrt((v * v).mean(axis=1, keepdims=True) + eps) * weight


def inputs(n, cols, seed):
    """x with a scale far from 1 (the norm must divide it out) and a norm weight."""
    rng = np.random.default_rng(seed)
    return (7 * rng.standard_normal((n, cols))).astype(np.float32), rng.uniform(0.5, 1.5, cols).astype(np.float32)


def shapes(ctx):
    """The fixed shape, one of several subgroups per workgroup (the shared-memory reduction) and
    one of four subgroups with rows of their own (the shuffle reduction)."""
    sg = ctx.info.subgroup_size
    return [None, (4 * sg, 2, 4 * sg), (4 * sg, 2, sg)]


class Run:
    """Buffers for one recorded run, freed at exit."""

    def __init__(self, ctx):
        self.ctx, self.buffers = ctx, []

    def put(self, array):
        buffer = self.ctx.alloc(max(array.nbytes, 4))
        self.ctx.upload(buffer, np.ascontiguousarray(array, np.float32))
        self.buffers.append(buffer)
        return buffer

    def empty(self, count):
        buffer = self.ctx.alloc(4 * count)
        self.buffers.append(buffer)
        return buffer

    def run(self, record) -> int:
        """Dispatches recorded."""
        rec = self.ctx.recording()
        record(rec)
        dispatches = rec.dispatches
        self.ctx.run(rec.finish())
        rec.destroy()
        return dispatches

    def get(self, buffer, shape):
        return self.ctx.download(buffer, count=int(np.prod(shape))).reshape(shape)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for buffer in self.buffers:
            self.ctx.free(buffer)


def check_folded_norm(ctx, qtype, counts):
    cols = cols_for(qtype)[-1]
    raw, w = random_weights(qtype, 33, cols, seed=3)
    with Weights(ctx) as weights, Run(ctx) as r:
        for shape in shapes(ctx):
            tensor = weights.upload(qtype, raw, cols, shape)
            for n in counts:
                x, nw = inputs(n, cols, seed=n)
                y0 = np.random.default_rng(0).standard_normal((n, 33)).astype(np.float32)
                xb, nb, yb = r.put(x), r.put(nw), r.put(y0)
                r.run(lambda rec: matmul(rec, tensor, xb, yb, n, y_accumulate=True, path="mat_vec",
                                         norm=FoldedNorm(nb, EPS)))
                assert_close(r.get(yb, (n, 33)), y0 + rms_normed(x, nw) @ w.T)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_folded_norm_every_type(vk_ctx, qtype):
    """Every type, one and several columns, both reduction paths, float rows with a tail shorter
    than 4; the residual add on top of it."""
    check_folded_norm(vk_ctx, qtype, (1, 3))


def test_folded_norm_past_one_group_of_columns(vk_ctx):
    """Columns in two workgroup columns (z): each normalises its own."""
    check_folded_norm(vk_ctx, T.Q4_K, (MAT_VEC_MAX_COLS + 3,))


@pytest.mark.parametrize("qtype, gelu", [(T.F16, False), (T.Q4_K, False), (T.Q6_K, False), (T.MXFP4, False),
                                         (T.Q4_K, True)], ids=["F16", "Q4_K", "Q6_K", "MXFP4", "Q4_K-geglu"])
def test_folded_norm_gate_up(vk_ctx, qtype, gelu):
    """The fused gate+up kernel (its two inner loops: dequant.glsl's, MXFP4's items): one
    dispatch, both products of the normalised x."""
    cols = cols_for(qtype)[-1]
    raw_g, w_g = random_weights(qtype, 17, cols, seed=1)
    raw_u, w_u = random_weights(qtype, 17, cols, seed=2)
    with Weights(vk_ctx) as weights, Run(vk_ctx) as r:
        for shape in shapes(vk_ctx):
            gate, up = weights.upload(qtype, raw_g, cols, shape), weights.upload(qtype, raw_u, cols)
            for n in (1, 2):
                x, nw = inputs(n, cols, seed=n)
                xn = rms_normed(x, nw)
                x = (x * 2 / np.sqrt(np.mean((xn @ w_g.T) ** 2))).astype(np.float32)  # gate rms ~2: silu's curve
                xb, nb, out, scratch = r.put(x), r.put(nw), r.empty(n * 17), r.empty(n * 17)
                dispatches = r.run(lambda rec: matmul_swiglu(rec, gate, up, xb, out, n, scratch, gelu=gelu,
                                                             norm=FoldedNorm(nb, EPS)))
                assert dispatches == 1
                assert_close(r.get(out, (n, 17)), reference(rms_normed(x, nw), w_g, w_u, gelu))


def joined_qkv(ctx, weights, types, rows, cols):
    """Random Q, K and V weights of `types` and `rows`: those of the first type joined
    (upload_rows), V apart (uploaded through `weights`, a Weights) where its type differs.
    Returns (raws, the joined tensor, the members as matmul_qkv takes them, how many joined);
    the caller frees the joined tensor."""
    raws = [random_weights(t, r, cols, seed=i) for i, (t, r) in enumerate(zip(types, rows))]
    joined_count = 3 if len(set(types)) == 1 else 2
    fused, views = upload_rows(ctx, "qkv", types[0], [(cols, r) for r in rows[:joined_count]],
                               [raw for raw, _ in raws[:joined_count]])
    separate = [weights.upload(types[2], raws[2][0], cols)] if joined_count == 2 else []
    return raws, fused, views + separate, joined_count


@pytest.mark.parametrize("types", [(T.Q4_K,) * 3, (T.Q8_0, T.Q8_0, T.Q6_K), (T.F16,) * 3],
                         ids=["qkv", "qk", "f16"])
def test_qkv_as_one_tensor(vk_ctx, types):
    """Q, K and V (or Q and K with V of another type) in one dispatch (two), each output
    written at its own layout for several columns; the views of the joined tensor give the same
    products on their own."""
    cols, rows = 256, (64, 32, 32)
    with Weights(vk_ctx) as weights, Run(vk_ctx) as r:
        raws, fused, members, joined_count = joined_qkv(vk_ctx, weights, types, rows, cols)
        assert fused.sections == rows[:joined_count] and [v.rows for v in members] == list(rows)
        for n in (1, 3):
            x, nw = inputs(n, cols, seed=n)
            xb, nb = r.put(x), r.put(nw)
            outs = [r.empty(n * rows_i) for rows_i in rows]
            dispatches = r.run(lambda rec: matmul_qkv(rec, fused, members, xb, outs, n, norm=FoldedNorm(nb, EPS)))
            assert dispatches == 4 - joined_count
            for out, rows_i, (_, w) in zip(outs, rows, raws):
                assert_close(r.get(out, (n, rows_i)), rms_normed(x, nw) @ w.T)
            # on the norm's output: the joined tensor, and the views alone (the tiled kernels' path)
            xn = r.put(rms_normed(x, nw))
            for joined in (fused, None):
                outs = [r.empty(n * rows_i) for rows_i in rows]
                dispatches = r.run(lambda rec: matmul_qkv(rec, joined, members, xn, outs, n))
                assert dispatches == (4 - joined_count if joined else 3)
                for out, rows_i, (_, w) in zip(outs, rows, raws):
                    assert_close(r.get(out, (n, rows_i)), rms_normed(x, nw) @ w.T)
    free_tensor(vk_ctx, fused)


@pytest.mark.parametrize("path", ["tiled", "coopmat"])
@pytest.mark.parametrize("types", [(T.Q4_K,) * 3, (T.Q8_0, T.Q8_0, T.Q6_K)], ids=["qkv", "qk"])
@pytest.mark.parametrize("cols, n", [(256, 70), (4096, 20)])
def test_qkv_as_one_tensor_mat_mat(vk_ctx, path, types, cols, n):
    """Prefill's mat-mat kernels take the joined tensor in one dispatch too (V of another type
    in a second), sections ending inside row tiles, columns past one column tile; over few
    columns and a long K the cooperative-matrix kernel splits K (on devices that add floats
    atomically), each section's output zeroed first (they start out holding noise here)."""
    offered(vk_ctx, path)
    rows = (96, 40, 40)
    with Weights(vk_ctx) as weights, Run(vk_ctx) as r:
        raws, fused, members, joined_count = joined_qkv(vk_ctx, weights, types, rows, cols)
        if path == "coopmat" and n < cols // 64:
            (bm, bn, _, _, bk, _), ahead = coopmat_kernel(vk_ctx.info, fused, n)
            assert (coopmat_splits(vk_ctx, fused, n, (bm, bn, bk), ahead) > 1) == vk_ctx.info.float_atomic_add
        rng = np.random.default_rng(5)
        x = rng.standard_normal((n, cols)).astype(np.float32)
        xb, outs = r.put(x), [r.put(rng.standard_normal(n * rows_i).astype(np.float32)) for rows_i in rows]
        xh = r.empty(f16_bytes(n, cols) // 4)
        dispatches = r.run(lambda rec: matmul_qkv(rec, fused, members, xb, outs, n, path=path, xh=xh))
        assert dispatches == 4 - joined_count + (path == "coopmat")   # x converted to f16 once for all
        for out, rows_i, qtype, (raw, w) in zip(outs, rows, types, raws):
            w = multiplied(vk_ctx, path, qtype, raw, w, n)
            assert_close(r.get(out, (n, rows_i)), *product(x, w, path))
    free_tensor(vk_ctx, fused)


def test_rows_that_break_the_offset_alignment_stay_apart(vk_ctx):
    """A Q8_0 row of 32 values is 34 bytes: a second weight after one such row could not be bound."""
    raw, _ = random_weights(T.Q8_0, 1, 32)
    assert upload_rows(vk_ctx, "qk", T.Q8_0, [(32, 1), (32, 1)], [raw, raw]) is None


def test_normed_input_folds_only_into_item_loops(vk_ctx):
    """Products whose mat-vec takes the item loops get x and the norm to fold, nothing recorded;
    with any other consumer (Q6_K; the gate+up kernel of Q4_K) the norm is recorded and its
    output is the input, equal to the norm of x. One column, which every device multiplies
    with the mat-vec kernel (test_kernels_matmul_cols.py: batches through the mat-cols kernel,
    which takes the norm's output)."""
    raw, _ = random_weights(T.Q4_K, 1, 256)
    raw6, _ = random_weights(T.Q6_K, 1, 256)
    with Weights(vk_ctx) as weights, Run(vk_ctx) as r:
        q4, q6 = weights.upload(T.Q4_K, raw, 256), weights.upload(T.Q6_K, raw6, 256)
        x, nw = inputs(1, 256, seed=0)
        xb, nb, scratch = r.put(x), r.put(nw), r.empty(256)
        for consumers, glu, folds in (([q4, q4], False, True), ([q4, q6], False, False), ([q4, q4], True, False)):
            result = []
            dispatches = r.run(lambda rec: result.append(normed_input(rec, xb, nb, scratch, 1, 256, EPS, consumers, glu)))
            if folds:
                assert dispatches == 0 and result[0] == (xb, FoldedNorm(nb, EPS))
            else:
                assert dispatches == 1 and result[0] == (scratch, None)
                np.testing.assert_allclose(r.get(scratch, (1, 256)), rms_normed(x, nw), rtol=1e-5, atol=1e-6)
