"""The mmq path (mul_mmq.comp over quantize_x8.comp's 8-bit activations) on lavapipe, which has
VK_KHR_shader_integer_dot_product, against numpy: the activations' blocks against a numpy
quantization, the products against two references.

- The exact one: gguf.quants.dequantize(W) @ (d * q) in float64, where d and q are the
  activations quantized as the kernel does (per block of 32: d = max |x| / 127, q = x / d
  rounded to even). Per 16-value slice the kernel computes a * d * (w . q) + b * d * sum(q)
  with the integer dot exact, which is that product summed differently: within 1e-5, as for
  the float kernels. The activations are built so that x / d are integers (each block is
  integers times a power of two, one of them +-127): rounding at a tie, where the GPU's x / d
  may fall one ulp either side of numpy's, never decides a quant.
- The float one: dequantize(W) @ x of the f32 activations, within 1e-2. Rounding x to 127
  steps of its block's max errs by up to d / 2 per value, uniformly: an RMS of
  max|x| / 127 / sqrt(12), which for Gaussian blocks of 32 (max ~ 2-2.5 sigma) is ~0.5% of x's
  RMS, and the products' relative error is the same (observed 0.49-0.55%)."""
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from tests.kernel_io import own_context
from tests.test_kernels_matmul import assert_close, random_weights, run_matmul
from vkllm.errors import VkllmError
from worker.engine.config import Settings
from worker.engine.kernels.matmul import BlocksOut, matmul, matmul_swiglu
from worker.engine.kernels.norm import rms_norm_x8
from worker.engine.kernels.paths import mat_mat_path, mmq_types, paths, product_path
from worker.engine.kernels.tensor import free_tensor, upload_tensor
from worker.engine.kernels.tuning import candidates
from worker.engine.kernels.x8 import quantize_x8, x8_bytes
from worker.engine.vk.device import INTEGER_DOT, DeviceInfo

MMQ_TYPES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4)
FLOAT_RTOL = 1e-2


@pytest.fixture(autouse=True)
def offered(vk_ctx):
    if "mmq" not in paths(vk_ctx):
        pytest.skip(f"{vk_ctx.info.name} has no integer dot products")


def quantized(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(d [n, k/32], q [n, k/32, 32]) of f32 x [n, k] as quantize_x8.comp makes them."""
    blocks = x.reshape(x.shape[0], -1, 32).astype(np.float32)
    amax = np.abs(blocks).max(-1)
    d = amax / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=amax > 0)
    return d, np.rint(blocks * inv[..., None]).astype(np.int64)


def dequantized(x: np.ndarray) -> np.ndarray:
    d, q = quantized(x)
    return (d.astype(np.float64)[..., None] * q).reshape(x.shape)


def exact_activations(n: int, k: int, seed: int) -> np.ndarray:
    """Blocks of integers in [-127, 127] times a power of two, one of each block +-127."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-127, 128, (n, k // 32, 32))
    q[..., 0] = rng.choice([-127, 127], (n, k // 32))
    q = np.take_along_axis(q, rng.permuted(np.tile(np.arange(32), (n, k // 32, 1)), axis=-1), -1)
    scale = np.exp2(rng.integers(-8, 1, (n, k // 32, 1)).astype(np.float64))
    return (q * scale).reshape(n, k).astype(np.float32)


def cols_of(qtype: T) -> int:
    return {32: 96, 256: 512}[GGML_QUANT_SIZES[qtype][0]]


def test_the_mmq_types_are_the_quantized_types():
    assert mmq_types() == frozenset(MMQ_TYPES)


def assert_blocks(raw: np.ndarray, x: np.ndarray, max_quant_error: int, scale_rtol: float,
                  squares: np.ndarray | None = None):
    """raw (the x8 buffer's bytes) holds x [n, k] quantized as numpy's `quantized` does: its
    scales within scale_rtol, its quants within max_quant_error (and rarely off at all), each
    half's sum d times its quants, the fourth word 0 (or `squares` [n, k / 32], within 1e-5)."""
    n, k = x.shape
    planes = raw.reshape(n, 3, k // 32, 16)   # per column: quants 0..15, quants 16..31, ds (x8.glsl)
    qs = np.concatenate([planes[:, 0], planes[:, 1]], axis=-1).view(np.int8).astype(np.int64)
    ds = planes[:, 2].copy().view(np.float32)
    d, q = quantized(x)
    np.testing.assert_allclose(ds[..., 0], d, rtol=scale_rtol)
    assert np.abs(qs - q).max() <= max_quant_error and (qs != q).mean() < 1e-2
    sums = qs.reshape(n, k // 32, 2, 16).sum(-1) * ds[..., :1]
    np.testing.assert_allclose(ds[..., 1:3], sums, rtol=1e-6)
    if squares is None:
        assert (ds[..., 3] == 0).all()
    else:
        np.testing.assert_allclose(ds[..., 3], squares, rtol=1e-5)


def test_quantize_x8_blocks(vk_ctx, dev):
    """Exact activations give numpy's quants, scales and slice sums exactly (scales to an ulp);
    Gaussian ones the same quants but for a rare tie, each sum d times its slice's quants."""
    n, k = 5, 96
    for exact in (True, False):
        x = exact_activations(n, k, seed=1) if exact else np.random.default_rng(2).standard_normal((n, k))
        x = x.astype(np.float32)
        xb, x8 = dev.put(x), dev.empty(x8_bytes(n, k))
        dev.run(lambda rec: quantize_x8(rec, xb, x8, n, k))
        assert_blocks(dev.get(x8, np.uint8, x8_bytes(n, k)), x, 0 if exact else 1, 1e-6)


@pytest.mark.parametrize("with_f32", [False, True], ids=["x8", "f32_x8"])
def test_rms_norm_x8_blocks(vk_ctx, dev, with_f32):
    """The norm's output in 8-bit blocks: numpy's norm quantized as quantize_x8 does (a value
    whose x / d lands within rounding of a half may take the other quant). With an f32 output
    too (a mixture of experts' FFN input), that output is numpy's norm, and its blocks are
    exactly what quantize_x8 makes of it."""
    n, k, eps = 3, 4096, 1e-5
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((n, k)).astype(np.float32), rng.standard_normal(k).astype(np.float32)
    xb, wb, x8 = dev.put(x), dev.put(w), dev.empty(x8_bytes(n, k))
    out = dev.empty(x.nbytes) if with_f32 else None
    dev.run(lambda rec: rms_norm_x8(rec, xb, wb, x8, n, k, eps, out=out))
    normed = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps) * w
    blocks = dev.get(x8, np.uint8, x8_bytes(n, k))
    assert_blocks(blocks, normed.astype(np.float32), 1, 1e-5)
    if with_f32:
        np.testing.assert_allclose(dev.get(out, np.float32, n * k).reshape(n, k), normed, rtol=1e-5, atol=1e-5)
        again = dev.empty(x8_bytes(n, k))
        dev.run(lambda rec: quantize_x8(rec, out, again, n, k))
        np.testing.assert_array_equal(dev.get(again, np.uint8, x8_bytes(n, k)), blocks)


@pytest.mark.parametrize("qtype", MMQ_TYPES, ids=lambda t: t.name)
def test_mmq_every_type(vk_ctx, qtype):
    """Partial tiles in both directions (67 rows; 17 and 70 columns)."""
    cols = cols_of(qtype)
    raw, w = random_weights(qtype, 67, cols, seed=3)
    for n in (17, 70):
        x = exact_activations(n, cols, seed=n)
        y, _ = run_matmul(vk_ctx, qtype, raw, cols, x, n, path="mmq")
        assert_close(y, x.astype(np.float64) @ w.T)
        x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
        y, _ = run_matmul(vk_ctx, qtype, raw, cols, x, n, path="mmq")
        assert_close(y, dequantized(x) @ w.T, 1e-4)   # a rare tie may round the other way
        assert_close(y, x.astype(np.float64) @ w.T, FLOAT_RTOL)


@pytest.mark.parametrize("qtype", MMQ_TYPES, ids=lambda t: t.name)
def test_mat_vec_x8_every_type(vk_ctx, qtype):
    """The mat-vec kernel over 8-bit activations, one column and a group of three (y += W x)."""
    cols = cols_of(qtype)
    raw, w = random_weights(qtype, 67, cols, seed=3)
    for n in (1, 3):
        x = exact_activations(n, cols, seed=n)
        y0 = np.random.default_rng(n).standard_normal((n, 67)).astype(np.float32)
        y, _ = run_matmul(vk_ctx, qtype, raw, cols, x, n, y0, path="mat_vec_x8")
        assert_close(y, y0 + x.astype(np.float64) @ w.T)


@pytest.mark.parametrize("qtype", [T.Q2_K, T.Q3_K], ids=lambda t: t.name)
def test_mat_vec_x8_items_every_tuning_candidate(vk_ctx, qtype):
    """The 8-bit item loops of the K-quants whose items are half blocks, under each workgroup
    shape the tuner may choose: rows of 7 blocks (14 items, a multiple of no lane count) and 37
    rows (a multiple of no workgroup's)."""
    cols = 7 * 256
    raw, w = random_weights(qtype, 37, cols, seed=12)
    x = exact_activations(1, cols, seed=12)
    for shape in candidates(vk_ctx.info):
        y, _ = run_matmul(vk_ctx, qtype, raw, cols, x, 1, path="mat_vec_x8", shape=shape)
        assert_close(y, x.astype(np.float64) @ w.T)


def run_glu(ctx, gate, up, x, n: int, path: str, gelu: bool = False) -> np.ndarray:
    """act(gate x) * (up x) through matmul_swiglu on `path`, x (f32 [n, K]) quantized into
    scratch of its own."""
    rows, cols = gate.rows, gate.cols
    xb, out, scratch, x8 = (ctx.alloc(size) for size in (x.nbytes, 4 * n * rows, 4 * n * rows, x8_bytes(n, cols)))
    ctx.upload(xb, x)
    rec = ctx.recording()
    matmul_swiglu(rec, gate, up, xb, out, n, scratch, gelu=gelu, path=path, x8=x8)
    ctx.run(rec.finish())
    y = ctx.download(out, count=n * rows).reshape(n, rows)
    rec.destroy()
    for buffer in (xb, out, scratch, x8):
        ctx.free(buffer)
    return y


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_K, T.Q5_K, T.Q6_K], ids=lambda t: t.name)
def test_glu_x8(vk_ctx, qtype):
    """The fused gate+up kernel over 8-bit activations, silu(gate x) * (up x), one column and a
    group of three: the types whose weights it reads through item loads (Q4_K, Q5_K, Q6_K) and
    one through 16-value slices (every type's slices: test_mat_vec_x8_every_type)."""
    cols = cols_of(qtype)
    (raw_g, w_g), (raw_u, w_u) = random_weights(qtype, 67, cols, seed=4), random_weights(qtype, 67, cols, seed=5)
    gate, up = (upload_tensor(vk_ctx, name, qtype, (cols, 67), raw) for name, raw in (("g", raw_g), ("u", raw_u)))
    for n in (1, 3):
        x = exact_activations(n, cols, seed=n)
        y = run_glu(vk_ctx, gate, up, x, n, "mat_vec_x8")
        g, u = x.astype(np.float64) @ w_g.T, x.astype(np.float64) @ w_u.T
        assert_close(y, g * (0.5 + 0.5 * np.tanh(g / 2)) * u)   # silu(g) * u
    for tensor in (gate, up):
        free_tensor(vk_ctx, tensor)


def block_shapes(ctx) -> list:
    """Mat-vec workgroup shapes for the products that also write 8-bit blocks of 32 rows: the
    fixed one (several workgroups a block, counted), lane groups of a subgroup holding one block,
    and three blocks a workgroup, the last workgroup's partly past the end of 512 rows."""
    sg = ctx.info.subgroup_size
    return [None, (4 * sg, 8, sg), (6 * sg, 16, sg)]


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q8_0], ids=lambda t: t.name)
@pytest.mark.parametrize("shape", [0, 1, 2], ids=["fixed", "block", "blocks"])
def test_glu_x8_writes_its_output_in_blocks(vk_ctx, qtype, shape):
    """One column of silu(gate x) * (up x) over 8-bit x, 512 rows (16 blocks of 32), its output
    also in 8-bit blocks (BlocksOut) by workgroups of each of `block_shapes`: the f32 output as
    without them, the blocks numpy's quantization of it; twice from one recording (the counters
    back at 0)."""
    rows, cols = 512, cols_of(qtype)
    (raw_g, w_g), (raw_u, w_u) = random_weights(qtype, rows, cols, seed=4), random_weights(qtype, rows, cols, seed=5)
    gate, up = (upload_tensor(vk_ctx, name, qtype, (cols, rows), raw) for name, raw in (("g", raw_g), ("u", raw_u)))
    gate.glu_shape = block_shapes(vk_ctx)[shape]
    x = exact_activations(1, cols, seed=1)
    xb, out, scratch, x8 = (vk_ctx.alloc(size) for size in (x.nbytes, 4 * rows, 4 * rows, x8_bytes(1, cols)))
    blocks, done = vk_ctx.alloc(x8_bytes(1, rows)), vk_ctx.alloc(4 * rows // 32)
    vk_ctx.upload(xb, x)
    vk_ctx.upload(done, np.zeros(rows // 32, np.uint32))
    rec = vk_ctx.recording()
    matmul_swiglu(rec, gate, up, xb, out, 1, scratch, path="mat_vec_x8", x8=x8, blocks_out=BlocksOut(blocks, done))
    rec.finish()
    try:
        g, u = x.astype(np.float64) @ w_g.T, x.astype(np.float64) @ w_u.T
        for _ in range(2):
            vk_ctx.run(rec)
            y = vk_ctx.download(out, count=rows).reshape(1, rows)
            assert_close(y, g * (0.5 + 0.5 * np.tanh(g / 2)) * u)   # silu(g) * u
            assert_blocks(vk_ctx.download(blocks, np.uint8, x8_bytes(1, rows)), y, 1, 1e-6)
            assert (vk_ctx.download(done, np.uint32, rows // 32) == 0).all()
    finally:
        rec.destroy()
        for tensor in (gate, up):
            free_tensor(vk_ctx, tensor)
        for buffer in (xb, out, scratch, x8, blocks, done):
            vk_ctx.free(buffer)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_mmq_over_many_tiles(vk_ctx, qtype):
    raw, w = random_weights(qtype, 301, 512, seed=8)
    x = exact_activations(150, 512, seed=4)
    y, _ = run_matmul(vk_ctx, qtype, raw, 512, x, 150, path="mmq")
    assert_close(y, x.astype(np.float64) @ w.T)


def test_mmq_accumulates_and_splits_rows(vk_settings):
    """y += W x, and a weight split into parts by a binding range of 1000 bytes."""
    raw, w = random_weights(T.Q4_K, 41, 256, seed=5)
    x = exact_activations(17, 256, seed=6)
    y0 = np.random.default_rng(2).standard_normal((17, 41)).astype(np.float32)
    with own_context(vk_settings, block_size=16 << 20, max_binding_range=1000) as ctx:
        y, parts = run_matmul(ctx, T.Q4_K, raw, 256, x, 17, y0, path="mmq")
    assert parts > 3
    assert_close(y, y0 + x.astype(np.float64) @ w.T)


def test_float_weights_take_the_tiled_kernel(vk_ctx):
    """F16 on the mmq path: the float kernel's result (within fp32 rounding, which 8-bit
    activations would miss by far), and no 8-bit scratch needed."""
    raw, w = random_weights(T.F16, 33, 96, seed=7)
    x = np.random.default_rng(3).standard_normal((17, 96)).astype(np.float32)
    tensor = upload_tensor(vk_ctx, "w", T.F16, (96, 33), raw)
    xb, yb = vk_ctx.alloc(x.nbytes), vk_ctx.alloc(4 * 17 * 33)
    vk_ctx.upload(xb, x)
    rec = vk_ctx.recording()
    matmul(rec, tensor, xb, yb, 17, path="mmq")
    vk_ctx.run(rec.finish())
    y = vk_ctx.download(yb, count=17 * 33).reshape(17, 33)
    rec.destroy()
    free_tensor(vk_ctx, tensor)
    vk_ctx.free(xb)
    vk_ctx.free(yb)
    assert_close(y, x.astype(np.float64) @ w.T)


def test_swiglu_over_one_quantization(vk_ctx, dev):
    """Gate and up on the mmq path share one quantization of x (one quantize_x8 dispatch)."""
    n, cols, rows = 17, 256, 40
    (raw_g, w_g), (raw_u, w_u) = random_weights(T.Q4_K, rows, cols, seed=9), random_weights(T.Q6_K, rows, cols, seed=10)
    gate, up = (upload_tensor(vk_ctx, name, t, (cols, rows), raw)
                for name, t, raw in (("g", T.Q4_K, raw_g), ("u", T.Q6_K, raw_u)))
    x = exact_activations(n, cols, seed=11) / 64   # exact still; gate values within exp's range
    xb, out, scratch, x8 = dev.put(x), dev.empty(4 * n * rows), dev.empty(4 * n * rows), dev.empty(x8_bytes(n, cols))
    rec = vk_ctx.recording(max_sets=16, profile=True)
    matmul_swiglu(rec, gate, up, xb, out, n, up=scratch, path="mmq", x8=x8)
    vk_ctx.run(rec.finish())
    kernels = [label for label, _ in rec.timings_ns()]
    rec.destroy()
    assert kernels == ["quantize_x8", "mul_mmq_q4_k", "mul_mmq_q6_k", "swiglu"], kernels
    g, u = x.astype(np.float64) @ w_g.T, x.astype(np.float64) @ w_u.T
    assert_close(dev.get(out, count=n * rows).reshape(n, rows), g / (1 + np.exp(-g)) * u)
    free_tensor(vk_ctx, gate)
    free_tensor(vk_ctx, up)


def test_missing_scratch_is_an_error(vk_ctx):
    raw, _ = random_weights(T.Q4_0, 8, 64)
    tensor = upload_tensor(vk_ctx, "w", T.Q4_0, (64, 8), raw)
    xb, yb = vk_ctx.alloc(4 * 17 * 64), vk_ctx.alloc(4 * 17 * 8)
    rec = vk_ctx.recording()
    try:
        with pytest.raises(ValueError, match="needs 1632 bytes of scratch"):
            matmul(rec, tensor, xb, yb, 17, path="mmq")
    finally:
        rec.destroy()
        free_tensor(vk_ctx, tensor)
        vk_ctx.free(xb)
        vk_ctx.free(yb)


def test_lavapipe_keeps_its_paths_unless_told(vk_ctx, vk_settings):
    """CPU drivers: the mat-vec groups for prefill, and the tiled kernel as the mat-mat kernel
    (lavapipe's dot products are not accelerated); Settings.prefill_kernel forces mmq."""
    if vk_ctx.info.kind != "cpu":
        pytest.skip("a GPU's own rule: test_gpus_take_mmq_where_accelerated_without_matrix_units")
    assert product_path(vk_ctx, 70, 256) == "mat_vec" and mat_mat_path(vk_ctx) == "tiled"
    with own_context(dataclasses.replace(vk_settings, prefill_kernel="mmq")) as ctx:
        assert product_path(ctx, 70, 256) == "mmq" and product_path(ctx, 8, 256) == "mat_vec"
    with own_context(dataclasses.replace(vk_settings, prefill_kernel="coopmat")) as ctx:
        if "coopmat" not in paths(ctx):
            with pytest.raises(VkllmError, match="VKLLM_PREFILL_KERNEL=coopmat: .* has no coopmat kernel"):
                product_path(ctx, 70, 256)


@pytest.mark.parametrize("accelerated, coopmat, expected", [(True, False, "mmq"), (False, False, "tiled"),
                                                            (True, True, "coopmat")])
def test_gpus_take_mmq_where_accelerated_without_matrix_units(accelerated, coopmat, expected):
    info = DeviceInfo(0, "gpu", "discrete", 8 << 30, 32, 1 << 32, 64, 1 << 30, 65535, 128, 1.0, frozenset(),
                      coopmat_shapes=((16, 16, 16),) if coopmat else (), int8_dot=True,
                      int8_dot_accelerated=accelerated)
    extensions = {INTEGER_DOT} | ({"VK_KHR_cooperative_matrix"} if coopmat else set())
    device = SimpleNamespace(info=info, extensions=frozenset(extensions), settings=Settings())
    assert product_path(device, 512, 4096) == expected


@pytest.mark.parametrize("batch_kernel, qtype, expected", [
    ("auto", T.Q4_K, {1: "mat_vec_x8", 2: "mat_cols_x8", 8: "mat_cols_x8", 33: "mat_cols_x8", 64: "mat_cols_x8",
                      65: "coopmat"}),
    ("auto", T.Q6_K, {1: "mat_vec_x8", 9: "mat_cols_x8", 64: "mat_cols_x8", 65: "coopmat"}),
    ("auto", T.Q8_0, {1: "mat_vec_x8", 8: "mat_vec_x8", 9: "mat_cols", 16: "mat_cols", 17: "coopmat"}),
    ("auto", T.MXFP4, {1: "mat_vec", 2: "mat_cols", 16: "mat_cols", 17: "coopmat"}),
    ("mat_vec", T.Q4_K, {1: "mat_vec_x8", 8: "mat_vec_x8", 9: "coopmat", 16: "coopmat"}),
    ("mat_cols", T.Q4_K, {1: "mat_vec_x8", 2: "mat_cols", 8: "mat_cols", 16: "mat_cols", 17: "coopmat"}),
    ("mat_mat", T.Q4_K, {1: "mat_vec_x8", 2: "coopmat", 8: "coopmat", 64: "coopmat"}),
    ("auto+atomics", T.Q4_K, {2: "mat_cols_x8", 8: "mat_cols_x8", 9: "coopmat", 16: "coopmat", 64: "coopmat"})])
def test_gpus_decode_batches_by_rule(batch_kernel, qtype, expected):
    """A GPU with integer dot products and matrix units (an H200), under auto: Q4_K, Q5_K and Q6_K
    products of 2 .. 64 columns through the 8-bit mat-cols kernel, other quantized types' of up
    to 8 through the 8-bit mat-vec kernel (but MXFP4's, slower there), then the f32 mat-cols to
    16; batch_kernel mat_vec, mat_cols or
    mat_mat forces those kernels (the 8-bit mat-vec one still takes one column). With float
    atomics (split-K cooperative-matrix products) those take 9 columns and more under auto."""
    batch_kernel, _, atomics = batch_kernel.partition("+")
    info = DeviceInfo(0, "gpu", "discrete", 8 << 30, 32, 1 << 32, 64, 1 << 30, 65535, 128, 1.0, frozenset(),
                      coopmat_shapes=((16, 16, 16),), int8_dot=True, int8_dot_accelerated=True,
                      float_atomic_add=bool(atomics))
    device = SimpleNamespace(info=info, extensions=frozenset({INTEGER_DOT, "VK_KHR_cooperative_matrix"}),
                             settings=Settings(batch_kernel=batch_kernel))
    assert {n: product_path(device, n, 4096, qtype=qtype) for n in expected} == expected


@pytest.mark.parametrize("value, expected", [("", "auto"), ("MMQ", "mmq"), ("tiled", "tiled")])
def test_prefill_kernel_from_the_environment(value, expected):
    assert Settings.from_env({"VKLLM_PREFILL_KERNEL": value}).prefill_kernel == expected


def test_bad_prefill_kernel_is_refused():
    with pytest.raises(VkllmError, match="VKLLM_PREFILL_KERNEL must be one of auto, tiled, mmq, coopmat"):
        Settings.from_env({"VKLLM_PREFILL_KERNEL": "int8"})
