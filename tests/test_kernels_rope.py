"""RoPE on the real device against a float64 numpy reference, with positions from the step buffer."""
import numpy as np
import pytest

from tests.kernel_io import f32
from worker.engine.kernels.rope import rope


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


CASES = [  # n_tokens, n_heads, head_dim, rope_dim, base, pos0, neox, llama3 factors
    (1, 9, 64, 64, 100000.0, 37, False, False),     # SmolLM2 decode
    (5, 4, 128, 128, 500000.0, 0, False, True),      # Llama 3 prefill
    (5, 4, 128, 128, 500000.0, 700, False, True),    # Llama 3 chunk after a prefix
    (3, 6, 128, 128, 1000000.0, 300, True, False),   # Qwen2 (NeoX)
    (2, 3, 96, 32, 10000.0, 11, True, False),        # partial rotation (Phi-style), NeoX
    (2, 5, 80, 40, 10000.0, 513, False, False),      # partial rotation, normal
]


@pytest.mark.parametrize("n_tokens, n_heads, head_dim, rope_dim, base, pos0, neox, llama3", CASES)
def test_rope(dev, n_tokens, n_heads, head_dim, rope_dim, base, pos0, neox, llama3):
    rng = np.random.default_rng(pos0 + head_dim)
    x = f32(rng, n_tokens, n_heads, head_dim)
    ff = llama3_freq_factors(rope_dim, base) if llama3 else None
    bx, step = dev.put(x), dev.host(np.array([pos0, n_tokens], np.uint32))
    dev.run(lambda rec: rope(rec, bx, step, n_tokens, n_heads, head_dim, rope_dim, base, neox,
                             None if ff is None else dev.put(ff)))
    got = dev.get(bx, count=x.size).reshape(x.shape)
    np.testing.assert_allclose(got, rope_reference(x, pos0, rope_dim, base, neox, ff), rtol=0, atol=5e-4)
    np.testing.assert_array_equal(got[..., rope_dim:], x[..., rope_dim:])


def test_llama3_factors_change_the_result(dev):
    """Guards the test above: the factors are not all 1 for the dimensions the test rotates."""
    ff = llama3_freq_factors(128, 500000.0)
    assert ff.min() == 1.0 and ff.max() == 8.0 and ((ff > 1) & (ff < 8)).any()


def test_replay_reads_new_position(dev):
    x = f32(np.random.default_rng(3), 1, 2, 64)
    bx, step = dev.put(x), dev.host(np.array([0, 1], np.uint32))
    rec = dev.ctx.recording()
    rope(rec, bx, step, 1, 2, 64, 64, 10000.0, False)
    rec.finish()
    for pos in (5, 123):
        dev.ctx.upload(bx, x)
        dev.ctx.upload(step, np.array([pos, 1], np.uint32))
        dev.ctx.run(rec)
        got = dev.get(bx, count=x.size).reshape(x.shape)
        np.testing.assert_allclose(got, rope_reference(x, pos, 64, 10000.0, False), rtol=0, atol=5e-4)
    rec.destroy()
