"""Attention with gpt-oss's sinks (a learned logit per head in the softmax's denominator) on the
real device, in one pass and split with the merge, over a paged cache (tests/paged_io.py), against
numpy from what the cache holds."""
import numpy as np
import pytest

from tests.kernel_io import f32
from tests.paged_io import Paged
from tests.test_kernels_attention import attention_out
from worker.engine.kernels.shapes import AttentionShape


def sink_reference(q, k_cache, v_cache, pos0, scale, sinks, window=0):
    n_tokens, n_head, _ = q.shape
    group = n_head // k_cache.shape[1]
    out = np.empty(q.shape)
    for t in range(n_tokens):
        length = pos0 + t + 1
        first = max(0, length - window) if window else 0
        k = np.repeat(k_cache[first:length].astype(np.float64), group, axis=1)
        v = np.repeat(v_cache[first:length].astype(np.float64), group, axis=1)
        s = np.einsum("hd,lhd->hl", q[t].astype(np.float64), k) * scale
        top = np.maximum(s.max(axis=1), sinks)[:, None]
        p = np.exp(s - top)
        p /= p.sum(axis=1, keepdims=True) + np.exp(sinks[:, None] - top)
        out[t] = np.einsum("hl,lhd->hd", p, v)
    return out


@pytest.mark.parametrize("n_tokens, pos0, n_ctx, window, splits, kv_type", [
    (1, 300, 400, 0, None, "f16"),     # decode, split over the sequence and merged
    (1, 300, 400, 0, 1, "f16"),        # the same in one pass
    (1, 300, 400, 0, 1, "q8_0"),       # the same over the 8-bit cache
    (4, 20, 64, 8, 1, "f16"),          # prefill of a local layer
    (3, 2, 64, 0, 1, "f16"),           # few positions: the sink outweighs them
])
def test_sinks_join_the_denominator(dev, n_tokens, pos0, n_ctx, window, splits, kv_type):
    n_head, n_head_kv, head_dim = 4, 2, 64
    rng = np.random.default_rng(pos0 + n_tokens)
    paged = Paged(dev, rng, 1, n_ctx, n_head_kv, head_dim, kv_type=kv_type)
    k, v = f32(rng, pos0 + n_tokens, n_head_kv, head_dim), f32(rng, pos0 + n_tokens, n_head_kv, head_dim)
    paged.fill(0, k, v)
    q = f32(rng, n_tokens, n_head, head_dim)
    sinks = np.array([-2.0, 0.5, 3.0, 8.0], np.float32)   # the last above every score
    shape = AttentionShape(n_head, n_head_kv, head_dim, n_ctx, window=window)
    got = attention_out(dev, paged, q, shape, [(0, pos0 + t) for t in range(n_tokens)], splits, sinks)
    ks, vs = paged.stored(k), paged.stored(v)
    ref = sink_reference(q, ks, vs, pos0, head_dim ** -0.5, sinks.astype(np.float64), window)
    no_sinks = sink_reference(q, ks, vs, pos0, head_dim ** -0.5, np.full(n_head, -np.inf), window)
    assert np.abs(ref - no_sinks).max() > 0.01     # the sinks matter here
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
