"""matmul_swiglu: silu(W_gate x) * (W_up x) for every GGUF weight type, on lavapipe, against
gguf.quants.dequantize + numpy in float64; the fused kernel and the unfused fallback (types or
row parts that differ).

Tolerance: ||y - ref|| <= 1e-5 * ||ref||, as for matmul: silu's slope is at most 1.1, so the
products' fp32 errors (~1e-7) pass through it without growing by more than that.

Most tests give the gate a small workgroup shape (one subgroup, two rows), as the tuner would: on
lavapipe a pipeline is compiled at its first dispatch, and the default CPU shape's 16 rows of two
weights cost ~2-20 s each there (unrolled code); the default is tested once."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from tests.test_kernels_matmul import (  # noqa: F401
    ALL_TYPES,
    F16_RTOL,
    RTOL,
    assert_close,
    cols_for,
    random_weights,
    small_binding_ctx,
)
from worker.engine.kernels.halves import f16_bytes
from worker.engine.kernels.matmul import matmul_swiglu
from worker.engine.kernels.paths import paths
from worker.engine.kernels.tensor import DeviceTensor, free_tensor, upload_tensor
from worker.engine.kernels.tuning import candidates


def reference(x, w_gate, w_up, gelu=False):
    gate = x.astype(np.float64) @ w_gate.T
    if gelu:    # GELU, tanh form
        act = 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate ** 3)))
    else:       # silu
        act = gate * 0.5 * (1 + np.tanh(gate / 2))
    return act * (x.astype(np.float64) @ w_up.T)


def activations(n, w_gate, seed) -> np.ndarray:
    """x [n, cols] scaled so that each column's gate values have an rms of 2: silu's curved
    part, not only ~0 or the identity (the random k-quant blocks' mins bias them by hundreds)."""
    x = np.random.default_rng(seed).standard_normal((n, w_gate.shape[1]))
    gate_rms = np.sqrt(np.mean((x @ w_gate.T) ** 2, axis=1, keepdims=True))
    return (2 * x / gate_rms).astype(np.float32)


def small_shape(ctx) -> tuple[int, int, int]:
    return ctx.info.subgroup_size, 2, ctx.info.subgroup_size


def run_swiglu(ctx, w_gate: DeviceTensor, w_up: DeviceTensor, x: np.ndarray, gelu=False,
               path=None) -> tuple[np.ndarray, int]:
    """(out [n, rows], dispatches recorded)."""
    n, rows = x.shape[0], w_gate.rows
    xb, out, up = ctx.alloc(x.nbytes), ctx.alloc(4 * n * rows), ctx.alloc(4 * n * rows)
    xh = ctx.alloc(f16_bytes(n, w_gate.cols))
    ctx.upload(xb, x.astype(np.float32))
    rec = ctx.recording()
    matmul_swiglu(rec, w_gate, w_up, xb, out, n, up, gelu=gelu, path=path, xh=xh)
    dispatches = rec.dispatches
    ctx.run(rec.finish())
    y = ctx.download(out, count=n * rows).reshape(n, rows)
    rec.destroy()
    for buffer in (xb, out, up, xh):
        ctx.free(buffer)
    return y, dispatches


class Weights:
    """Gate and up weights uploaded for one test, freed at exit."""

    def __init__(self, ctx):
        self.ctx, self.tensors = ctx, []

    def upload(self, qtype, raw, cols, shape=None) -> DeviceTensor:
        tensor = upload_tensor(self.ctx, "w", qtype, (cols, raw.shape[0]), raw)
        tensor.mat_vec_shape = tensor.glu_shape = shape
        self.tensors.append(tensor)
        return tensor

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for tensor in self.tensors:
            free_tensor(self.ctx, tensor)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_fused_every_type(vk_ctx, qtype):
    """One dispatch; odd row counts; float rows with and without a tail shorter than 4."""
    for rows, cols in ((1, cols_for(qtype)[0]), (33, cols_for(qtype)[-1])):
        raw_g, w_g = random_weights(qtype, rows, cols, seed=rows)
        raw_u, w_u = random_weights(qtype, rows, cols, seed=rows + 1)
        with Weights(vk_ctx) as w:
            gate, up = w.upload(qtype, raw_g, cols, small_shape(vk_ctx)), w.upload(qtype, raw_u, cols)
            for n in (1, 5):
                x = activations(n, w_g, seed=n)
                y, dispatches = run_swiglu(vk_ctx, gate, up, x)
                assert dispatches == 1
                assert_close(y, reference(x, w_g, w_u))


def test_default_shape(vk_ctx):
    raw_g, w_g = random_weights(T.Q4_K, 37, 512, seed=1)
    raw_u, w_u = random_weights(T.Q4_K, 37, 512, seed=2)
    x = activations(1, w_g, seed=0)
    with Weights(vk_ctx) as w:
        y, dispatches = run_swiglu(vk_ctx, w.upload(T.Q4_K, raw_g, 512), w.upload(T.Q4_K, raw_u, 512), x)
    assert dispatches == 1
    assert_close(y, reference(x, w_g, w_u))


def test_columns_beyond_one_group(vk_ctx):
    """17 and 65 columns: on a CPU driver the fused kernel in column groups (one dispatch); on a
    GPU (the default batch kernel) the mat-mat kernels and SwiGLU (three), whose products on
    matrix units take f16 operands (x converted once for both: four)."""
    raw_g, w_g = random_weights(T.Q4_0, 21, 96, seed=1)
    raw_u, w_u = random_weights(T.Q4_0, 21, 96, seed=2)
    cpu = vk_ctx.info.kind == "cpu"
    for n in (17, 65):
        x = activations(n, w_g, seed=0)
        with Weights(vk_ctx) as w:
            gate, up = w.upload(T.Q4_0, raw_g, 96, small_shape(vk_ctx)), w.upload(T.Q4_0, raw_u, 96)
            y, dispatches = run_swiglu(vk_ctx, gate, up, x)
        coopmat = not cpu and "coopmat" in paths(vk_ctx)
        assert dispatches == (1 if cpu else 4 if coopmat else 3)
        if coopmat:
            f16 = [np.asarray(a, np.float16) for a in (x, w_g, w_u)]
            assert_close(y, reference(*f16), F16_RTOL)
        else:
            assert_close(y, reference(x, w_g, w_u), RTOL)


def test_tuning_candidates_across_subgroups(vk_ctx):
    """The gate's tuned shape is used: each shape the tuner may choose with several subgroups,
    whose sums (two per row and column) meet in shared memory (the mat-vec kernel, which GPUs
    take for one column only)."""
    raw_g, w_g = random_weights(T.Q8_0, 37, 800, seed=3)
    raw_u, w_u = random_weights(T.Q8_0, 37, 800, seed=4)
    x = activations(2, w_g, seed=2)
    shapes = [(t, r, lanes) for t, r, lanes in candidates(vk_ctx.info) if lanes == t > vk_ctx.info.subgroup_size]
    assert shapes
    for shape in shapes:
        with Weights(vk_ctx) as w:
            gate, up = w.upload(T.Q8_0, raw_g, 800, shape), w.upload(T.Q8_0, raw_u, 800)
            y, dispatches = run_swiglu(vk_ctx, gate, up, x, path="mat_vec")
        assert dispatches == 1
        assert_close(y, reference(x, w_g, w_u))


@pytest.mark.parametrize("n", [1, 5])
def test_types_differ(vk_ctx, n):
    """Q4_K gate, Q6_K up: two products, SwiGLU."""
    raw_g, w_g = random_weights(T.Q4_K, 33, 768, seed=5)
    raw_u, w_u = random_weights(T.Q6_K, 33, 768, seed=6)
    x = activations(n, w_g, seed=n)
    with Weights(vk_ctx) as w:
        gate = w.upload(T.Q4_K, raw_g, 768, small_shape(vk_ctx))
        up = w.upload(T.Q6_K, raw_u, 768, small_shape(vk_ctx))
        y, dispatches = run_swiglu(vk_ctx, gate, up, x)
    assert dispatches == 3
    assert_close(y, reference(x, w_g, w_u))


def test_same_parts_fused_per_part(small_binding_ctx):
    raw_g, w_g = random_weights(T.Q8_0, 41, 96, seed=7)
    raw_u, w_u = random_weights(T.Q8_0, 41, 96, seed=8)
    x = activations(5, w_g, seed=5)
    with Weights(small_binding_ctx) as w:
        gate = w.upload(T.Q8_0, raw_g, 96, small_shape(small_binding_ctx))
        up = w.upload(T.Q8_0, raw_u, 96)
        y, dispatches = run_swiglu(small_binding_ctx, gate, up, x)
        assert len(gate.parts) > 3 and dispatches == len(gate.parts)
    assert_close(y, reference(x, w_g, w_u))


def test_parts_differ(small_binding_ctx):
    """Up weights whose rows are split elsewhere than the gate's (uploaded as two tensors whose
    parts make one): each product per its own parts, then SwiGLU."""
    ctx = small_binding_ctx
    raw_g, w_g = random_weights(T.Q8_0, 41, 96, seed=9)
    raw_u, w_u = random_weights(T.Q8_0, 41, 96, seed=10)
    x = activations(1, w_g, seed=1)
    with Weights(ctx) as w:
        gate = w.upload(T.Q8_0, raw_g, 96, small_shape(ctx))
        head, tail = w.upload(T.Q8_0, raw_u[:5], 96), w.upload(T.Q8_0, raw_u[5:], 96)
        up = DeviceTensor(T.Q8_0, 41, 96, head.parts + [(b, 5 + first, count) for b, first, count in tail.parts],
                          small_shape(ctx))
        y, dispatches = run_swiglu(ctx, gate, up, x)
        assert dispatches == len(gate.parts) + len(up.parts) + 1
    assert_close(y, reference(x, w_g, w_u))


def test_shapes_must_match(vk_ctx):
    raw, _ = random_weights(T.Q8_0, 4, 64)
    with Weights(vk_ctx) as w:
        gate, up = w.upload(T.Q8_0, raw, 64), w.upload(T.Q8_0, raw[:3], 64)
        rec = vk_ctx.recording()
        with pytest.raises(ValueError, match="differ in shape"):
            matmul_swiglu(rec, gate, up, None, None, 1, None)
        rec.destroy()


GEMMA3_TYPES = (T.F32, T.Q5_0, T.Q8_0, T.Q4_K, T.Q6_K)   # gemma-3-270m's Q4_K_M file has these


@pytest.mark.parametrize("qtype", GEMMA3_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 5])
def test_geglu_fused(vk_ctx, qtype, n):
    """gelu=True: GeGLU in the fused kernel (one dispatch)."""
    cols = cols_for(qtype)[-1]
    raw_g, w_g = random_weights(qtype, 33, cols, seed=11)
    raw_u, w_u = random_weights(qtype, 33, cols, seed=12)
    x = activations(n, w_g, seed=n)
    with Weights(vk_ctx) as w:
        gate, up = w.upload(qtype, raw_g, cols, small_shape(vk_ctx)), w.upload(qtype, raw_u, cols)
        y, dispatches = run_swiglu(vk_ctx, gate, up, x, gelu=True)
    assert dispatches == 1
    assert_close(y, reference(x, w_g, w_u, gelu=True))
    assert np.abs(y - reference(x, w_g, w_u)).max() > 1e-2 * np.abs(y).max()   # not silu


def test_geglu_unfused(vk_ctx):
    """Types that differ: two products, then the elementwise GeGLU."""
    raw_g, w_g = random_weights(T.Q5_0, 33, 640, seed=13)
    raw_u, w_u = random_weights(T.Q8_0, 33, 640, seed=14)
    x = activations(2, w_g, seed=3)
    with Weights(vk_ctx) as w:
        gate = w.upload(T.Q5_0, raw_g, 640, small_shape(vk_ctx))
        up = w.upload(T.Q8_0, raw_u, 640, small_shape(vk_ctx))
        y, dispatches = run_swiglu(vk_ctx, gate, up, x, gelu=True)
    assert dispatches == 3
    assert_close(y, reference(x, w_g, w_u, gelu=True))
