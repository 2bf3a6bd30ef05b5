"""Causal GQA attention over f16 caches on the real device, against a float64 numpy reference
computed from the same f16 cache contents."""
import numpy as np
import pytest

from tests.kernel_io import f32
from worker.engine.kernels.attention import attention, split_scratch_bytes
from worker.engine.kernels.shapes import AttentionShape


def attention_reference(q, k_cache, v_cache, pos0, scale, window=0):
    """window > 0: token t sees only the `window` positions ending at its own."""
    n_tokens, n_head, _ = q.shape
    group = n_head // k_cache.shape[1]
    out = np.empty(q.shape)
    for t in range(n_tokens):
        length = pos0 + t + 1
        first = max(0, length - window) if window else 0
        k = np.repeat(k_cache[first:length].astype(np.float64), group, axis=1)  # [seen, n_head, d]
        v = np.repeat(v_cache[first:length].astype(np.float64), group, axis=1)
        s = np.einsum("hd,lhd->hl", q[t].astype(np.float64), k) * scale
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out[t] = np.einsum("hl,lhd->hd", p, v)
    return out


def caches(rng, n_ctx, n_head_kv, head_dim, valid):
    """Random f16 caches whose rows past `valid` hold huge values: reading them breaks the result."""
    k = rng.standard_normal((n_ctx, n_head_kv, head_dim)).astype(np.float16)
    v = rng.standard_normal((n_ctx, n_head_kv, head_dim)).astype(np.float16)
    k[valid:], v[valid:] = 3e4, -3e4
    return k, v


CASES = [  # n_tokens, pos0, n_head, n_head_kv, head_dim, n_ctx, splits (None: automatic)
    (1, 650, 4, 2, 64, 700, None),     # decode after a prefix, split over the sequence
    (1, 650, 4, 2, 64, 700, 1),        # the same in one pass
    (1, 0, 4, 2, 64, 64, None),        # the first token
    (5, 0, 6, 2, 128, 300, None),      # prefill from the start
    (5, 297, 6, 2, 128, 302, 1),       # prefill chunk after a prefix, one pass
    (5, 297, 6, 2, 128, 302, 3),       # the same, split
    (3, 400, 9, 3, 64, 512, None),     # SmolLM2 shape
    (2, 130, 32, 2, 64, 160, None),    # a GQA group larger than one workgroup's rows
    (1, 257, 8, 8, 80, 300, 2),        # no grouping, head_dim not a multiple of the workgroup
]


@pytest.mark.parametrize("n_tokens, pos0, n_head, n_head_kv, head_dim, n_ctx, splits", CASES)
def test_attention(dev, n_tokens, pos0, n_head, n_head_kv, head_dim, n_ctx, splits):
    rng = np.random.default_rng(pos0 + n_head)
    q = f32(rng, n_tokens, n_head, head_dim)
    k, v = caches(rng, n_ctx, n_head_kv, head_dim, pos0 + n_tokens)
    scale = float(head_dim) ** -0.5
    shape = AttentionShape(n_head, n_head_kv, head_dim, n_ctx)
    out = dev.empty(q.nbytes)
    step = dev.host(np.array([pos0, n_tokens], np.uint32))
    nbytes = split_scratch_bytes(shape, n_tokens, splits)
    scratch = dev.empty(nbytes) if nbytes else None
    dev.run(lambda rec: attention(rec, shape, dev.put(q), dev.put(k), dev.put(v), out, step, n_tokens, scratch,
                                  splits=splits))
    got = dev.get(out, count=q.size).reshape(q.shape)
    np.testing.assert_allclose(got, attention_reference(q, k, v, pos0, scale), rtol=1e-4, atol=1e-5)


def test_recorded_decode_replays_with_the_step_buffer(dev):
    """Attention recorded once, replayed for successive positions as the engine does."""
    rng = np.random.default_rng(1)
    n_head, n_head_kv, head_dim, n_ctx, prefix = 4, 2, 64, 600, 520
    k, v = caches(rng, n_ctx, n_head_kv, head_dim, prefix)
    bk, bv = dev.put(k), dev.put(v)
    shape = AttentionShape(n_head, n_head_kv, head_dim, n_ctx, scale=0.125)
    bq = dev.empty(n_head * head_dim * 4)
    out, step = dev.empty(n_head * head_dim * 4), dev.host(np.array([0, 1], np.uint32))
    scratch = dev.empty(split_scratch_bytes(shape, 1))
    rec = dev.ctx.recording()
    attention(rec, shape, bq, bk, bv, out, step, 1, scratch)
    rec.finish()
    row = n_head_kv * head_dim * 2
    for pos in range(prefix, prefix + 3):
        q, k_new, v_new = f32(rng, 1, n_head, head_dim), f32(rng, 1, n_head_kv, head_dim), f32(rng, 1, n_head_kv, head_dim)
        k[pos], v[pos] = k_new[0], v_new[0]
        dev.ctx.upload(bq, q)
        dev.ctx.upload(bk.sub(pos * row, row), k[pos])   # the new cache rows, as rope_store_kv writes them
        dev.ctx.upload(bv.sub(pos * row, row), v[pos])
        dev.ctx.upload(step, np.array([pos, 1], np.uint32))
        dev.ctx.run(rec)
        got = dev.get(out, count=q.size).reshape(q.shape)
        np.testing.assert_allclose(got, attention_reference(q, k, v, pos, 0.125), rtol=1e-4, atol=1e-5)
    rec.destroy()


def test_split_without_enough_scratch_is_refused(dev):
    shape = AttentionShape(4, 2, 64, 700)
    need = split_scratch_bytes(shape, 1)
    assert need > 0
    buffers = [dev.empty(4 * 64 * 4), dev.empty(700 * 2 * 64 * 2), dev.empty(700 * 2 * 64 * 2), dev.empty(4 * 64 * 4),
               dev.host(np.array([650, 1], np.uint32))]
    for scratch in (None, dev.empty(need // 2)):
        rec = dev.ctx.recording()
        try:
            with pytest.raises(ValueError, match="bytes of scratch"):
                attention(rec, shape, *buffers, 1, scratch)
        finally:
            rec.finish().destroy()



WINDOW_CASES = [  # n_tokens, pos0, window, n_ctx, splits: sliding-window (local) layers
    (1, 650, 512, 700, None),   # decode past the window, split: early splits see nothing
    (1, 650, 512, 700, 1),      # the same in one pass
    (1, 100, 512, 700, None),   # still inside the window: all positions
    (7, 300, 8, 320, 1),        # a prefill chunk: each token's window ends at its own position
    (7, 300, 8, 320, 3),
    (5, 0, 3, 64, None),        # from the start, window smaller than the chunk
]


@pytest.mark.parametrize("n_tokens, pos0, window, n_ctx, splits", WINDOW_CASES)
def test_attention_sliding_window(dev, n_tokens, pos0, window, n_ctx, splits):
    """Positions older than the window are masked; the caches hold huge values there, which
    would break the result if read."""
    n_head, n_head_kv, head_dim = 4, 2, 64
    rng = np.random.default_rng(pos0 + window)
    q = f32(rng, n_tokens, n_head, head_dim)
    k, v = caches(rng, n_ctx, n_head_kv, head_dim, pos0 + n_tokens)
    first_seen = max(0, pos0 + 1 - window)
    k[:first_seen], v[:first_seen] = 3e4, -3e4
    shape = AttentionShape(n_head, n_head_kv, head_dim, n_ctx, window=window)
    out = dev.empty(q.nbytes)
    step = dev.host(np.array([pos0, n_tokens], np.uint32))
    nbytes = split_scratch_bytes(shape, n_tokens, splits)
    scratch = dev.empty(nbytes) if nbytes else None
    dev.run(lambda rec: attention(rec, shape, dev.put(q), dev.put(k), dev.put(v), out, step, n_tokens, scratch,
                                  splits=splits))
    got = dev.get(out, count=q.size).reshape(q.shape)
    expected = attention_reference(q, k, v, pos0, head_dim ** -0.5, window)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
