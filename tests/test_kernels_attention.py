"""KV-cache append and causal GQA attention over f16 caches on the real device, against a
float64 numpy reference computed from the same f16 cache contents."""
import numpy as np
import pytest

from tests.kernel_io import f32
from worker.engine.kernels.attention import attention, kv_store


def attention_reference(q, k_cache, v_cache, pos0, scale):
    n_tokens, n_head, _ = q.shape
    group = n_head // k_cache.shape[1]
    out = np.empty(q.shape)
    for t in range(n_tokens):
        length = pos0 + t + 1
        k = np.repeat(k_cache[:length].astype(np.float64), group, axis=1)  # [length, n_head, d]
        v = np.repeat(v_cache[:length].astype(np.float64), group, axis=1)
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
    out = dev.empty(q.nbytes)
    step = dev.host(np.array([pos0, n_tokens], np.uint32))
    dev.run(lambda rec: attention(rec, dev.put(q), dev.put(k), dev.put(v), out, step, n_tokens, n_head,
                                  n_head_kv, head_dim, scale, splits=splits))
    got = dev.get(out, count=q.size).reshape(q.shape)
    np.testing.assert_allclose(got, attention_reference(q, k, v, pos0, scale), rtol=1e-4, atol=1e-5)


def test_kv_store_writes_only_its_rows(dev):
    rng = np.random.default_rng(0)
    n_ctx, width, pos0, n = 40, 2 * 64, 17, 5
    cache = np.full((n_ctx, width), 7.0, np.float16)
    src = 100 * f32(rng, n, width)
    bc = dev.put(cache)
    dev.run(lambda rec: kv_store(rec, dev.put(src), bc, dev.host(np.array([pos0, n], np.uint32)), n, width))
    want = cache.copy()
    want[pos0:pos0 + n] = src.astype(np.float16)
    got = dev.get(bc, np.float16, cache.size).reshape(cache.shape)
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-3)
    np.testing.assert_array_equal(got[:pos0], cache[:pos0])
    np.testing.assert_array_equal(got[pos0 + n:], cache[pos0 + n:])


def test_recorded_decode_replays_with_the_step_buffer(dev):
    """kv_store + attention recorded once, replayed for successive positions as the engine does."""
    rng = np.random.default_rng(1)
    n_head, n_head_kv, head_dim, n_ctx, prefix = 4, 2, 64, 600, 520
    k, v = caches(rng, n_ctx, n_head_kv, head_dim, prefix)
    bk, bv = dev.put(k), dev.put(v)
    bq, bk_new, bv_new = (dev.empty(n_head * head_dim * 4) for _ in range(3))
    out, step = dev.empty(n_head * head_dim * 4), dev.host(np.array([0, 1], np.uint32))
    rec = dev.ctx.recording()
    kv_store(rec, bk_new, bk, step, 1, n_head_kv * head_dim)
    kv_store(rec, bv_new, bv, step, 1, n_head_kv * head_dim)
    rec.barrier()
    attention(rec, bq, bk, bv, out, step, 1, n_head, n_head_kv, head_dim, 0.125)
    rec.finish()
    for pos in range(prefix, prefix + 3):
        q, k_new, v_new = f32(rng, 1, n_head, head_dim), f32(rng, 1, n_head_kv, head_dim), f32(rng, 1, n_head_kv, head_dim)
        for buf, data in ((bq, q), (bk_new, k_new), (bv_new, v_new)):
            dev.ctx.upload(buf, data)
        dev.ctx.upload(step, np.array([pos, 1], np.uint32))
        dev.ctx.run(rec)
        k[pos], v[pos] = k_new[0], v_new[0]
        got = dev.get(out, count=q.size).reshape(q.shape)
        np.testing.assert_allclose(got, attention_reference(q, k, v, pos, 0.125), rtol=1e-4, atol=1e-5)
    rec.destroy()
