"""RoPE on q and k fused with the append to the paged KV cache (f16 and 8-bit), against a float64
numpy RoPE reference, with each token's sequence slot and position from the step buffer and its
cache row from a shuffled block table (tests/paged_io.py)."""
import numpy as np
import pytest

from tests.kernel_io import f32
from tests.paged_io import Paged, step_buffer
from worker.engine.kernels.rope import rope_store_kv
from worker.engine.kernels.shapes import AttentionShape


def llama3_freq_factors(rope_dim, base, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_ctx=8192):
    """rope_freqs as Llama 3.1 GGUF files carry them (llama.cpp's convert_hf_to_gguf.py)."""
    freqs = base ** (-np.arange(0, rope_dim, 2) / rope_dim)
    wavelen = 2 * np.pi / freqs
    smooth = (original_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    mid = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < original_ctx / high_freq_factor, 1.0,
                    np.where(wavelen > original_ctx / low_freq_factor, factor, mid)).astype(np.float32)


def rope_reference(x, pos0, rope_dim, base, neox, freq_factors=None):
    n_tokens = x.shape[0]
    half = rope_dim // 2
    i = np.arange(half)
    freqs = float(base) ** (-2.0 * i / rope_dim)
    if freq_factors is not None:
        freqs = freqs / freq_factors.astype(np.float64)
    theta = (pos0 + np.arange(n_tokens))[:, None, None] * freqs
    c, s = np.cos(theta), np.sin(theta)
    i0, i1 = (i, i + half) if neox else (2 * i, 2 * i + 1)
    out = x.astype(np.float64)
    x0, x1 = out[..., i0].copy(), out[..., i1].copy()
    out[..., i0] = x0 * c - x1 * s
    out[..., i1] = x0 * s + x1 * c
    return out


def test_llama3_factors_change_the_result(dev):
    """Guards the test above: the factors are not all 1 for the dimensions the test rotates."""
    ff = llama3_freq_factors(128, 500000.0)
    assert ff.min() == 1.0 and ff.max() == 8.0 and ((ff > 1) & (ff < 8)).any()


CASES = [  # n_tokens, pos0, n_head, n_head_kv, head_dim, rope_dim, base, neox, llama3 factors
    (1, 37, 6, 2, 64, 64, 100000.0, False, False),     # decode after a prefix, GQA
    (5, 0, 6, 2, 128, 128, 500000.0, False, True),     # Llama 3 prefill from the start
    (5, 700, 4, 4, 128, 128, 500000.0, False, True),   # chunk after a prefix, no grouping
    (5, 300, 6, 2, 128, 128, 1000000.0, True, False),  # Qwen2 (NeoX)
    (1, 11, 4, 4, 96, 32, 10000.0, True, False),       # partial rotation, NeoX, decode
    (5, 0, 6, 2, 80, 40, 10000.0, False, False),       # partial rotation, normal (f16 only: 80 % 32)
    (5, 0, 6, 2, 96, 64, 10000.0, False, False),
    (5, 513, 6, 2, 80, 40, 10000.0, True, True),       # partial rotation with factors
    (5, 513, 6, 2, 96, 64, 10000.0, True, True),
]


class Inputs:
    """Random q, k, v for tokens (slot, position) of a pass, a paged cache of n_ctx positions per
    sequence and the step buffer."""

    def __init__(self, dev, tokens, n_head, n_head_kv, head_dim, rope_dim, llama3, base, neox, kv_type="f16"):
        n_tokens = len(tokens)
        rng = np.random.default_rng(tokens[0][1] + n_head * head_dim)
        self.q = f32(rng, n_tokens, n_head, head_dim)
        self.k = f32(rng, n_tokens, n_head_kv, head_dim)
        self.v = f32(rng, n_tokens, n_head_kv, head_dim)
        self.ff = llama3_freq_factors(rope_dim, base) if llama3 else None
        self.tokens, self.positions = tokens, np.array([pos for _, pos in tokens])
        n_ctx = int(self.positions.max()) + 3
        self.paged = Paged(dev, rng, max(s for s, _ in tokens) + 1, n_ctx, n_head_kv, head_dim, kv_type=kv_type)
        self.shape = AttentionShape(n_head, n_head_kv, head_dim, n_ctx, rope_dim, base, neox)
        self.step = step_buffer(dev, tokens)
        self.cache = self.paged.empty_cache()
        self.dev = dev

    def freq_factors(self):
        return None if self.ff is None else self.dev.put(self.ff)

    def rope(self, x, rope_dim, base, neox):
        """Each token rotated at its own position."""
        return np.concatenate([rope_reference(x[t:t + 1], int(pos), rope_dim, base, neox, self.ff)
                               for t, pos in enumerate(self.positions)])

    def written(self, which):
        """The cache rows of every token of the pass, float32 [n_tokens, n_head_kv, head_dim]."""
        return np.concatenate([self.paged.read(self.cache, which, s, [pos]) for s, pos in self.tokens])

    def untouched(self):
        """Every other row of both pools still holds zeros."""
        rows = {self.paged.row(s, pos) for s, pos in self.tokens}
        for which in ("k", "v"):
            for s in range(len(self.paged.table)):
                others = [p for p in range(self.paged.stride * self.paged.block) if self.paged.row(s, p) not in rows]
                assert (self.paged.read(self.cache, which, s, others) == 0).all()


def check(x, rope_dim, base, neox, kv_type, q_in=None, k_in=None):
    """q_in, k_in: the heads before the rotation (numpy's), where the kernel normalised them;
    else x.q and x.k, which dimensions past rope_dim then keep exactly."""
    exact = q_in is None
    q_in, k_in = (x.q, x.k) if exact else (q_in, k_in)
    q = x.dev.get(x.qbuf, count=x.q.size).reshape(x.q.shape)
    np.testing.assert_allclose(q, x.rope(q_in, rope_dim, base, neox), rtol=0, atol=5e-4)
    if exact:
        np.testing.assert_array_equal(q[..., rope_dim:], x.q[..., rope_dim:])
    np.testing.assert_array_equal(x.dev.get(x.kbuf, count=x.k.size).reshape(x.k.shape), x.k)
    k_want = x.rope(k_in, rope_dim, base, neox)
    k_got, v_got = x.written("k"), x.written("v")
    if kv_type == "f16":
        np.testing.assert_allclose(k_got.astype(np.float64), k_want, rtol=1e-3, atol=5e-4)
        if exact:
            np.testing.assert_array_equal(k_got[..., rope_dim:], x.k[..., rope_dim:].astype(np.float16))
        np.testing.assert_array_equal(v_got, x.v.astype(np.float16))
    else:
        # llama.cpp's q8_0 of the rotated rows (gguf.quants): equal but where float rounding of
        # the rotation (up to ~5e-4 at large positions) moves a value across a rounding boundary
        # (one step of its scale)
        for got, want in ((k_got, x.paged.stored(k_want.astype(np.float32))), (v_got, x.paged.stored(x.v))):
            step = np.abs(want).reshape(-1, 32).max(axis=1) / 127
            err = np.abs(got - want).reshape(-1, 32).max(axis=1)
            assert (err <= step * 1.01 + 1e-6).all()
            assert np.mean(got == want) > 0.9
    x.untouched()


# the 8-bit cache takes heads of whole 32-value groups
@pytest.mark.parametrize("n_tokens, pos0, n_head, n_head_kv, head_dim, rope_dim, base, neox, llama3, kv_type",
                         [(*case, t) for case in CASES for t in ("f16", "q8_0") if t == "f16" or case[4] % 32 == 0])
def test_rope_store_kv(dev, n_tokens, pos0, n_head, n_head_kv, head_dim, rope_dim, base, neox, llama3, kv_type):
    x = Inputs(dev, [(0, pos0 + t) for t in range(n_tokens)], n_head, n_head_kv, head_dim, rope_dim, llama3, base,
               neox, kv_type)
    x.qbuf, x.kbuf, bv = dev.put(x.q), dev.put(x.k), dev.put(x.v)
    ff = x.freq_factors()
    dev.run(lambda rec: rope_store_kv(rec, x.shape, x.qbuf, x.kbuf, bv, x.cache, x.step, n_tokens, ff))
    check(x, rope_dim, base, neox, kv_type)


def head_norm(x, weight, eps):
    """Qwen3's per-head RMSNorm over the last axis, in float64."""
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
@pytest.mark.parametrize("case", [CASES[3], CASES[4], CASES[8]], ids=["neox", "partial-decode", "partial-factors"])
def test_rope_store_kv_normalises_heads_first(dev, case, kv_type):
    """qk_norm: each q and k head RMS-normalised and weighted before the rotation (q in place, k
    into the cache, dimensions past rope_dim normalised too), v as it was."""
    n_tokens, pos0, n_head, n_head_kv, head_dim, rope_dim, base, neox, llama3 = case
    x = Inputs(dev, [(0, pos0 + t) for t in range(n_tokens)], n_head, n_head_kv, head_dim, rope_dim, llama3, base,
               neox, kv_type)
    rng, eps = np.random.default_rng(head_dim), 1e-6
    w_q, w_k = 0.5 + f32(rng, head_dim), 0.5 + f32(rng, head_dim)
    x.qbuf, x.kbuf, bv = dev.put(x.q), dev.put(x.k), dev.put(x.v)
    ff, norms = x.freq_factors(), (dev.put(w_q), dev.put(w_k), eps)
    dev.run(lambda rec: rope_store_kv(rec, x.shape, x.qbuf, x.kbuf, bv, x.cache, x.step, n_tokens, ff, norms))
    check(x, rope_dim, base, neox, kv_type, head_norm(x.q, w_q, eps), head_norm(x.k, w_k, eps))


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
@pytest.mark.parametrize("case, normed", [(CASES[3], False), (CASES[4], False), (CASES[4], True)],
                         ids=["neox", "partial-decode", "partial-decode-normed"])
def test_rope_store_kv_adds_biases_first(dev, case, normed, kv_type):
    """bias: the q, k and v projections' biases added before anything else (Qwen2; with the
    per-head norms after them where a model has both), q keeping them, v stored biased."""
    n_tokens, pos0, n_head, n_head_kv, head_dim, rope_dim, base, neox, llama3 = case
    x = Inputs(dev, [(0, pos0 + t) for t in range(n_tokens)], n_head, n_head_kv, head_dim, rope_dim, llama3, base,
               neox, kv_type)
    rng, eps = np.random.default_rng(head_dim + 1), 1e-6
    b_q, b_k, b_v = f32(rng, n_head, head_dim), f32(rng, n_head_kv, head_dim), f32(rng, n_head_kv, head_dim)
    w_q, w_k = 0.5 + f32(rng, head_dim), 0.5 + f32(rng, head_dim)
    x.qbuf, x.kbuf, bv = dev.put(x.q), dev.put(x.k), dev.put(x.v)
    norms = (dev.put(w_q), dev.put(w_k), eps) if normed else None
    biases = tuple(dev.put(b) for b in (b_q, b_k, b_v))
    dev.run(lambda rec: rope_store_kv(rec, x.shape, x.qbuf, x.kbuf, bv, x.cache, x.step, n_tokens, x.freq_factors(),
                                      norms, biases))
    q_in, k_in = x.q + b_q, x.k + b_k
    if normed:
        q_in, k_in = head_norm(q_in, w_q, eps), head_norm(k_in, w_k, eps)
    x.v = x.v + b_v   # what the cache holds
    check(x, rope_dim, base, neox, kv_type, q_in, k_in)


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_tokens_of_several_sequences(dev, kv_type):
    """One pass over decode tokens of two sequences and a chunk of a third: each token rotated
    at its own position and written to its own sequence's row."""
    tokens = [(2, 40), (0, 5), (1, 300), (1, 301), (1, 302)]
    x = Inputs(dev, tokens, 4, 2, 64, 64, False, 10000.0, False, kv_type)
    x.qbuf, x.kbuf, bv = dev.put(x.q), dev.put(x.k), dev.put(x.v)
    dev.run(lambda rec: rope_store_kv(rec, x.shape, x.qbuf, x.kbuf, bv, x.cache, x.step, len(tokens)))
    check(x, 64, 10000.0, False, kv_type)


def test_replay_reads_new_position(dev):
    """Recorded once, replayed for successive decode positions as the engine does."""
    x = Inputs(dev, [(0, 0)], 2, 2, 64, 64, False, 10000.0, False)
    bq, bk, bv = dev.put(x.q), dev.put(x.k), dev.put(x.v)
    rec = dev.ctx.recording()
    rope_store_kv(rec, x.shape, bq, bk, bv, x.cache, x.step, 1)
    rec.finish()
    for pos in (0, 2):
        dev.ctx.upload(bq, x.q)
        dev.ctx.upload(x.step, np.array([0, pos], np.uint32))
        dev.ctx.run(rec)
        np.testing.assert_allclose(dev.get(bq, count=x.q.size).reshape(x.q.shape),
                                   rope_reference(x.q, pos, 64, 10000.0, False), rtol=0, atol=5e-4)
    rec.destroy()
    k_cache = x.paged.read(x.cache, "k", 0, [0, 1, 2])
    for pos in (0, 2):
        np.testing.assert_allclose(k_cache[pos].astype(np.float64), rope_reference(x.k, pos, 64, 10000.0, False)[0],
                                   rtol=1e-3, atol=5e-4)
    assert (k_cache[1] == 0).all() and (x.paged.read(x.cache, "v", 0, [0, 2]) == x.v.astype(np.float16)).all()
