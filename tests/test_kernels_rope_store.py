"""RoPE on q and k fused with the f16 KV-cache append, against a float64 numpy RoPE reference,
with positions from the step buffer."""
import numpy as np
import pytest

from tests.kernel_io import f32
from worker.engine.kernels.rope import rope_store_kv
from worker.engine.kernels.shapes import AttentionShape

CACHE_FILL = 7.0  # cache rows the op must not touch hold this


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
    (5, 0, 6, 2, 80, 40, 10000.0, False, False),       # partial rotation, normal
    (5, 513, 6, 2, 80, 40, 10000.0, True, True),       # partial rotation with factors
]


class Inputs:
    """Random q, k, v for one case and its step buffer; caches of n_ctx rows filled with CACHE_FILL."""

    def __init__(self, dev, n_tokens, pos0, n_head, n_head_kv, head_dim, rope_dim, llama3, base, neox):
        rng = np.random.default_rng(pos0 + n_head * head_dim)
        self.q = f32(rng, n_tokens, n_head, head_dim)
        self.k = f32(rng, n_tokens, n_head_kv, head_dim)
        self.v = f32(rng, n_tokens, n_head_kv, head_dim)
        self.ff = llama3_freq_factors(rope_dim, base) if llama3 else None
        self.n_ctx = pos0 + n_tokens + 3
        self.shape = AttentionShape(n_head, n_head_kv, head_dim, self.n_ctx, rope_dim, base, neox)
        self.step = dev.host(np.array([pos0, n_tokens], np.uint32))
        self.dev = dev

    def cache(self):
        return self.dev.put(np.full((self.n_ctx, *self.k.shape[1:]), CACHE_FILL, np.float16))

    def cache_array(self, buf):
        return self.dev.get(buf, np.float16, self.n_ctx * self.k[0].size).reshape(self.n_ctx, *self.k.shape[1:])

    def freq_factors(self):
        return None if self.ff is None else self.dev.put(self.ff)


@pytest.mark.parametrize("n_tokens, pos0, n_head, n_head_kv, head_dim, rope_dim, base, neox, llama3", CASES)
def test_rope_store_kv(dev, n_tokens, pos0, n_head, n_head_kv, head_dim, rope_dim, base, neox, llama3):
    x = Inputs(dev, n_tokens, pos0, n_head, n_head_kv, head_dim, rope_dim, llama3, base, neox)
    bq, bk, bv, kc, vc = dev.put(x.q), dev.put(x.k), dev.put(x.v), x.cache(), x.cache()
    ff = x.freq_factors()
    dev.run(lambda rec: rope_store_kv(rec, x.shape, bq, bk, bv, kc, vc, x.step, n_tokens, ff))
    q = dev.get(bq, count=x.q.size).reshape(x.q.shape)
    np.testing.assert_allclose(q, rope_reference(x.q, pos0, rope_dim, base, neox, x.ff), rtol=0, atol=5e-4)
    np.testing.assert_array_equal(q[..., rope_dim:], x.q[..., rope_dim:])
    np.testing.assert_array_equal(dev.get(bk, count=x.k.size).reshape(x.k.shape), x.k)
    rows = slice(pos0, pos0 + n_tokens)
    k_cache, v_cache = x.cache_array(kc), x.cache_array(vc)
    k_want = rope_reference(x.k, pos0, rope_dim, base, neox, x.ff)
    np.testing.assert_allclose(k_cache[rows].astype(np.float64), k_want, rtol=1e-3, atol=5e-4)
    np.testing.assert_array_equal(k_cache[rows][..., rope_dim:], x.k[..., rope_dim:].astype(np.float16))
    np.testing.assert_array_equal(v_cache[rows], x.v.astype(np.float16))
    for cache in (k_cache, v_cache):
        assert (cache[:pos0] == CACHE_FILL).all() and (cache[pos0 + n_tokens:] == CACHE_FILL).all()


def test_replay_reads_new_position(dev):
    """Recorded once, replayed for successive decode positions as the engine does."""
    x = Inputs(dev, 1, 0, 2, 2, 64, 64, False, 10000.0, False)
    bq, bk, bv, kc, vc = dev.put(x.q), dev.put(x.k), dev.put(x.v), x.cache(), x.cache()
    rec = dev.ctx.recording()
    rope_store_kv(rec, x.shape, bq, bk, bv, kc, vc, x.step, 1)
    rec.finish()
    for pos in (0, 2):
        dev.ctx.upload(bq, x.q)
        dev.ctx.upload(x.step, np.array([pos, 1], np.uint32))
        dev.ctx.run(rec)
        np.testing.assert_allclose(dev.get(bq, count=x.q.size).reshape(x.q.shape),
                                   rope_reference(x.q, pos, 64, 10000.0, False), rtol=0, atol=5e-4)
    rec.destroy()
    k_cache = x.cache_array(kc)
    for pos in (0, 2):
        np.testing.assert_allclose(k_cache[pos].astype(np.float64), rope_reference(x.k, pos, 64, 10000.0, False)[0],
                                   rtol=1e-3, atol=5e-4)
    assert (k_cache[1] == CACHE_FILL).all() and (x.cache_array(vc)[[0, 2]] == x.v.astype(np.float16)).all()
