"""A residual product that also writes the next RMSNorm's input (matmul's NormBlocks,
mul_mat_vec_x8_rms_blocks: x += W a, then x times the norm weight in 8-bit blocks with each
block's sum of x^2, by the last workgroup of each 32-row block) and the products over that input
(Quantized with an eps: the *_x8_rms kernels, which scale by 1 / rms(x) themselves), against
numpy: on lavapipe under decode_kernel "x8", on GPUs with integer dot products by default."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from tests.test_kernels_matmul import assert_close, random_weights
from tests.test_kernels_mmq import FLOAT_RTOL, assert_blocks, block_shapes, cols_of, dequantized, exact_activations
from worker.engine.kernels.matmul import NormBlocks, matmul, matmul_qkv
from worker.engine.kernels.tensor import free_tensor, upload_tensor
from worker.engine.kernels.x8 import Quantized, x8_bytes

ROWS, EPS = 512, 1e-5   # the hidden size: 16 blocks of 32, each from several workgroups


def rms_normed(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + EPS) * weight


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q8_0], ids=lambda t: t.name)
@pytest.mark.parametrize("shape", [0, 1, 2], ids=["fixed", "block", "blocks"])
def test_residual_product_writes_the_next_norms_input(x8_ctx, qtype, shape):
    """x += W a (a over 8-bit blocks) by workgroups of each of `block_shapes`, its blocks numpy's
    quantization of x * weight with each block's sum of x^2, and a Q4_K product over them the
    product of rms_norm(x) * weight; the recording run twice (x grows by W a again, the counters
    are back at 0)."""
    ctx, cols = x8_ctx, cols_of(qtype)
    rng = np.random.default_rng(2)
    raw, w = random_weights(qtype, ROWS, cols, seed=6)
    raw_c, w_c = random_weights(T.Q4_K, 96, ROWS, seed=7)
    residual = upload_tensor(ctx, "w", qtype, (cols, ROWS), raw)
    residual.mat_vec_shape = block_shapes(ctx)[shape]
    consumer = upload_tensor(ctx, "c", T.Q4_K, (ROWS, 96), raw_c)
    a, x0 = exact_activations(1, cols, seed=1), rng.standard_normal((1, ROWS)).astype(np.float32)
    weight = rng.standard_normal(ROWS).astype(np.float32)
    buffers = ab, xb, wb, x8, blocks, done, yb = [ctx.alloc(size) for size in (
        a.nbytes, x0.nbytes, weight.nbytes, x8_bytes(1, cols), x8_bytes(1, ROWS), 4 * ROWS // 32, 4 * 96)]
    for buffer, array in ((ab, a), (xb, x0), (wb, weight), (done, np.zeros(ROWS // 32, np.uint32))):
        ctx.upload(buffer, array)
    rec = ctx.recording()
    matmul(rec, residual, ab, xb, 1, y_accumulate=True, x8=x8, next_norm=NormBlocks(blocks, done, wb, EPS))
    rec.barrier()
    matmul(rec, consumer, Quantized(blocks, EPS), yb, 1)
    rec.finish()
    try:
        for run in (1, 2):
            ctx.run(rec)
            x = ctx.download(xb, count=ROWS).reshape(1, ROWS)
            assert_close(x, x0 + run * (a.astype(np.float64) @ w.T))
            squares = (x.astype(np.float64) ** 2).reshape(1, -1, 32).sum(-1)
            assert_blocks(ctx.download(blocks, np.uint8, x8_bytes(1, ROWS)), (x * weight).astype(np.float32), 1,
                          1e-5, squares)
            assert (ctx.download(done, np.uint32, ROWS // 32) == 0).all()
            y = ctx.download(yb, count=96).reshape(1, 96)
            scale = 1 / np.sqrt((x.astype(np.float64) ** 2).mean() + EPS)
            assert_close(y, scale * dequantized((x * weight).astype(np.float32)) @ w_c.T, 1e-4)   # a rare tie
            assert_close(y, rms_normed(x, weight) @ w_c.T, FLOAT_RTOL)
    finally:
        rec.destroy()
        for tensor in (residual, consumer):
            free_tensor(ctx, tensor)
        for buffer in buffers:
            ctx.free(buffer)


def test_products_over_the_unscaled_input_scale_it(x8_ctx):
    """Q/K/V as three weights (their mat-vecs one by one) over one norm's unscaled blocks
    (written here by a residual product over a = 0: x unchanged) give the products of
    rms_norm(x) * weight, over its 8-bit rounding (test_engine_decode_x8.py covers the fused
    Q/K/V and gate+up kernels' _rms variants in whole decode steps)."""
    ctx, k = x8_ctx, ROWS
    rng = np.random.default_rng(3)
    weights = [random_weights(T.Q4_K, rows, k, seed=10 + i) for i, rows in enumerate((64, 32, 32))]
    tensors = [upload_tensor(ctx, name, T.Q4_K, (k, raw.shape[0]), raw) for name, (raw, _) in zip("qkv", weights)]
    zero_raw, _ = random_weights(T.Q8_0, k, 32, seed=1)
    residual = upload_tensor(ctx, "r", T.Q8_0, (32, k), zero_raw)
    x0, weight = rng.standard_normal((1, k)).astype(np.float32), rng.standard_normal(k).astype(np.float32)
    buffers = ab, xb, wb, x8, blocks, done, *outs = [ctx.alloc(size) for size in (
        128, x0.nbytes, weight.nbytes, x8_bytes(1, 32), x8_bytes(1, k), 4 * k // 32, 256, 128, 128)]
    for buffer, array in ((ab, np.zeros(32, np.float32)), (xb, x0), (wb, weight), (done, np.zeros(k // 32, np.uint32))):
        ctx.upload(buffer, array)
    rec = ctx.recording()
    matmul(rec, residual, ab, xb, 1, y_accumulate=True, x8=x8, next_norm=NormBlocks(blocks, done, wb, EPS))
    rec.barrier()
    matmul_qkv(rec, None, tensors, Quantized(blocks, EPS), outs, 1)
    rec.finish()
    try:
        ctx.run(rec)
        scale = 1 / np.sqrt((x0.astype(np.float64) ** 2).mean() + EPS)
        ref = scale * dequantized(x0 * weight)   # x0 * weight: as the kernel rounds it (a = 0 adds nothing)
        for out, (raw, w) in zip(outs, weights):
            assert_close(ctx.download(out, count=w.shape[0]).reshape(1, -1), ref @ w.T, 1e-4)
    finally:
        rec.destroy()
        for tensor in (*tensors, residual):
            free_tensor(ctx, tensor)
        for buffer in buffers:
            ctx.free(buffer)


def test_only_a_residual_mat_vec_writes_the_next_norms_input(x8_ctx):
    raw, _ = random_weights(T.Q4_K, 64, 256, seed=1)
    tensor = upload_tensor(x8_ctx, "w", T.Q4_K, (256, 64), raw)
    buffers = [x8_ctx.alloc(size) for size in (4 * 256 * 3, 4 * 64 * 3, x8_bytes(3, 256), 256, 8)]
    x, y, x8, norm_w, done = buffers
    rec = x8_ctx.recording()
    try:
        for n, accumulate in ((1, False), (3, True)):
            with pytest.raises(ValueError, match="writes the next norm's blocks"):
                matmul(rec, tensor, x, y, n, y_accumulate=accumulate, x8=x8,
                       next_norm=NormBlocks(x8, done, norm_w, EPS))
        with pytest.raises(ValueError, match="take an RMSNorm's input unscaled"):
            matmul(rec, tensor, Quantized(x8, EPS), y, 3, x8=x8)
    finally:
        rec.destroy()
        free_tensor(x8_ctx, tensor)
        for buffer in buffers:
            x8_ctx.free(buffer)
