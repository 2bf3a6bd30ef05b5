"""Decode attention doing rope_store_kv's work itself (attention.py's OwnKV): q, k and v as the
Q/K/V product wrote them, against float64 numpy (tests/test_kernels_rope_store.py's RoPE,
tests/test_kernels_attention.py's and test_kernels_attention_sinks.py's attention) over a paged
cache whose earlier positions hold random rows and every other row poison; the token's own row
must land in the cache as rope_store_kv writes it (k rotated, both f16) and nothing else change."""
import numpy as np
import pytest

from tests.kernel_io import f32
from tests.paged_io import Paged, step_buffer
from tests.test_kernels_attention import attention_reference
from tests.test_kernels_attention_sinks import sink_reference
from tests.test_kernels_rope_store import llama3_freq_factors, rope_reference
from worker.engine.kernels.attention import OwnKV, attention, split_scratch_bytes, takes_rope, takes_tiles
from worker.engine.kernels.shapes import AttentionShape
from worker.engine.kernels.x8 import quantize_x8, x8_bytes

CASES = [  # pos, n_head, n_head_kv, head_dim, rope_dim, neox, llama3, bias, n_ctx, splits (None: automatic)
    (650, 4, 2, 64, 64, False, False, False, 700, None),      # split: the last used split holds the token
    (650, 4, 2, 64, 64, False, False, False, 700, 1),         # one pass
    (0, 4, 2, 64, 64, False, False, False, 700, None),        # the first token: its own row alone
    (64, 4, 2, 64, 64, False, False, False, 4096, None),      # the token opens a split of its own
    (300, 6, 2, 128, 128, True, False, True, 400, None),      # Qwen2: NeoX, biases
    (513, 6, 2, 128, 128, False, True, False, 600, None),     # Llama 3: frequency factors
    (257, 8, 8, 96, 32, True, False, True, 300, 2),           # partial rotation, no grouping
    (130, 32, 2, 64, 64, False, False, False, 160, None),     # a GQA group over several workgroups
]


class Decode:
    """One decode token at position pos of sequence 1 of two (the other's rows stay poison), its
    raw q, k, v (and biases), the cache holding positions 0..pos-1, and numpy's rotated q, k."""

    def __init__(self, dev, pos, n_head, n_head_kv, head_dim, rope_dim, neox, llama3, bias, n_ctx):
        rng = np.random.default_rng(pos + n_head + head_dim)
        base = 500000.0 if llama3 else 10000.0
        self.paged = Paged(dev, rng, 2, n_ctx, n_head_kv, head_dim)
        self.k_old, self.v_old = f32(rng, pos, n_head_kv, head_dim), f32(rng, pos, n_head_kv, head_dim)
        self.paged.fill(1, self.k_old, self.v_old)
        self.q, self.k, self.v = (f32(rng, 1, h, head_dim) for h in (n_head, n_head_kv, n_head_kv))
        self.bias = (f32(rng, n_head, head_dim), f32(rng, n_head_kv, head_dim), f32(rng, n_head_kv, head_dim)) \
            if bias else None
        self.ff = llama3_freq_factors(rope_dim, base) if llama3 else None
        q_in, k_in, v_in = (x + b for x, b in zip((self.q, self.k, self.v), self.bias)) if bias \
            else (self.q, self.k, self.v)
        self.q_rot = rope_reference(q_in, pos, rope_dim, base, neox, self.ff)[0]
        self.k_own = rope_reference(k_in, pos, rope_dim, base, neox, self.ff).astype(np.float16).astype(np.float32)
        self.v_own = v_in.astype(np.float16).astype(np.float32)
        self.shape = AttentionShape(n_head, n_head_kv, head_dim, n_ctx, rope_dim, base, neox)
        self.pos, self.dev = pos, dev
        self.cache, self.step = self.paged.cache(), step_buffer(dev, [(1, pos)])

    def own(self) -> OwnKV:
        d = self.dev
        return OwnKV(d.put(self.k), d.put(self.v), None if self.ff is None else d.put(self.ff),
                     None if self.bias is None else tuple(d.put(b) for b in self.bias))

    def expected_kv(self):
        """Every position's K and V as the cache holds them after the pass."""
        return (np.concatenate([self.paged.stored(self.k_old), self.k_own]),
                np.concatenate([self.paged.stored(self.v_old), self.v_own]))

    def check_cache(self):
        """The token's row is numpy's; every other row is what it was."""
        got_k = self.paged.read(self.cache, "k", 1, [self.pos])
        np.testing.assert_allclose(got_k, self.k_own, rtol=1e-3, atol=2e-3)
        np.testing.assert_array_equal(self.paged.read(self.cache, "v", 1, [self.pos]), self.v_own)
        n_rows = self.paged.n_blocks * self.paged.block
        own_row = self.paged.row(1, self.pos)
        for which, before in (("k", self.paged.k), ("v", self.paged.v)):
            pool = self.dev.get(getattr(self.cache, which), np.float16, n_rows * self.paged.width)
            pool = pool.reshape(n_rows, -1)
            others = np.arange(n_rows) != own_row
            np.testing.assert_array_equal(pool[others], before[others].astype(np.float16))


@pytest.mark.parametrize("pos, n_head, n_head_kv, head_dim, rope_dim, neox, llama3, bias, n_ctx, splits", CASES)
def test_attention_rotates_and_appends_its_token(dev, pos, n_head, n_head_kv, head_dim, rope_dim, neox, llama3, bias,
                                                 n_ctx, splits):
    x = Decode(dev, pos, n_head, n_head_kv, head_dim, rope_dim, neox, llama3, bias, n_ctx)
    bq, out = dev.put(x.q), dev.empty(x.q.nbytes)
    nbytes = split_scratch_bytes(x.shape, 1, splits)
    scratch = dev.put(np.zeros(nbytes, np.uint8)) if nbytes else None
    own = x.own()
    dev.run(lambda rec: attention(rec, x.shape, bq, x.cache, out, x.step, 1, scratch, splits=splits, own=own))
    expected = attention_reference(x.q_rot, *x.expected_kv(), pos, head_dim ** -0.5)
    np.testing.assert_allclose(dev.get(out, count=x.q.size).reshape(x.q.shape[1:]), expected, rtol=1e-3, atol=1e-4)
    x.check_cache()


@pytest.mark.parametrize("splits", [None, 1])
def test_with_sinks_and_x8_output(dev, splits):
    """gpt-oss's shape of the pass: biases, sinks, and the output in 8-bit blocks too, bit for bit
    quantize_x8's of the f32 output."""
    x = Decode(dev, 300, 8, 2, 64, 64, True, False, True, 400)
    bq, out = dev.put(x.q), dev.empty(x.q.nbytes)
    cols = x.q.size
    x8, ref8 = dev.empty(x8_bytes(1, cols)), dev.empty(x8_bytes(1, cols))
    nbytes = split_scratch_bytes(x.shape, 1, splits)
    scratch = dev.put(np.zeros(nbytes, np.uint8)) if nbytes else None
    sinks = np.linspace(-1.0, 2.0, 8).astype(np.float32)
    own, b_sinks = x.own(), dev.put(sinks)

    def record(rec):
        attention(rec, x.shape, bq, x.cache, out, x.step, 1, scratch, splits=splits, sinks=b_sinks, x8=x8, own=own)
        rec.barrier()
        quantize_x8(rec, out, ref8, 1, cols)
    dev.run(record)
    k, v = x.expected_kv()
    expected = sink_reference(x.q_rot[None], k, v, x.pos, 64 ** -0.5, sinks)[0]
    np.testing.assert_allclose(dev.get(out, count=cols).reshape(x.q.shape[1:]), expected, rtol=1e-3, atol=1e-4)
    words = x8_bytes(1, cols) // 4
    np.testing.assert_array_equal(dev.get(x8, np.uint32, words), dev.get(ref8, np.uint32, words))
    x.check_cache()


@pytest.mark.parametrize("splits", [None, 1])
def test_batched_decode_one_token_a_sequence(dev, splits):
    """A batched decode pass (takes_rope's `distinct`): one token of each of three sequences at
    their own positions (a short one, one past SHORT_SPAN, a first token), then a pad repeating
    the last token as the runner pads a pass; each token rotated at its position, each
    sequence's row appended once, nothing else changed. Qwen2's NeoX pairs and biases."""
    rng = np.random.default_rng(11)
    n_head, n_head_kv, head_dim, n_ctx, base = 6, 2, 64, 400, 10000.0
    positions = [40, 300, 0]
    paged = Paged(dev, rng, 3, n_ctx, n_head_kv, head_dim)
    old = [(f32(rng, p, n_head_kv, head_dim), f32(rng, p, n_head_kv, head_dim)) for p in positions]
    for s, (k, v) in enumerate(old):
        paged.fill(s, k, v)
    q, k, v = (f32(rng, 3, h, head_dim) for h in (n_head, n_head_kv, n_head_kv))
    bias = (f32(rng, n_head, head_dim), f32(rng, n_head_kv, head_dim), f32(rng, n_head_kv, head_dim))
    pad = lambda x: np.concatenate([x, x[-1:]])   # noqa: E731 (the runner's pad: the last token again)
    cache, step = paged.cache(), step_buffer(dev, [(s, p) for s, p in enumerate(positions)] + [(2, positions[-1])])
    shape = AttentionShape(n_head, n_head_kv, head_dim, n_ctx, head_dim, base, True)
    assert takes_rope(cache, 4, qk_norm=False, distinct=True) and not takes_rope(cache, 4, qk_norm=False)
    bq, out = dev.put(pad(q)), dev.empty(pad(q).nbytes)
    nbytes = split_scratch_bytes(shape, 4, splits)
    scratch = dev.put(np.zeros(nbytes, np.uint8)) if nbytes else None
    own = OwnKV(dev.put(pad(k)), dev.put(pad(v)), None, tuple(dev.put(b) for b in bias))
    dev.run(lambda rec: attention(rec, shape, bq, cache, out, step, 4, scratch, splits=splits, own=own))
    got = dev.get(out, count=4 * n_head * head_dim).reshape(4, n_head, head_dim)
    for t, pos in enumerate(positions):
        q_rot = rope_reference((q[t] + bias[0])[None], pos, head_dim, base, True)[0]
        k_own = rope_reference((k[t] + bias[1])[None], pos, head_dim, base, True).astype(np.float16).astype(np.float32)
        v_own = (v[t] + bias[2])[None].astype(np.float16).astype(np.float32)
        k_stored = paged.read(cache, "k", t, [pos])
        np.testing.assert_allclose(k_stored, k_own, rtol=1e-3, atol=2e-3)
        np.testing.assert_array_equal(paged.read(cache, "v", t, [pos]), v_own)
        # attention over the row as the kernel stored it: a GPU's sin and cos may round a rotated
        # value to the neighbouring f16 (bounded above), which moves the output past 1e-4 (an
        # H100: one value of 384 by 1.4e-4)
        k_all = np.concatenate([paged.stored(old[t][0]), k_stored])
        v_all = np.concatenate([paged.stored(old[t][1]), v_own])
        expected = attention_reference(q_rot, k_all, v_all, pos, head_dim ** -0.5)
        for row in (t, 3) if t == 2 else (t,):
            np.testing.assert_allclose(got[row], expected, rtol=1e-3, atol=1e-4)
    n_rows = paged.n_blocks * paged.block
    others = np.ones(n_rows, bool)
    others[[paged.row(t, pos) for t, pos in enumerate(positions)]] = False
    for which, before in (("k", paged.k), ("v", paged.v)):
        pool = dev.get(getattr(cache, which), np.float16, n_rows * paged.width).reshape(n_rows, -1)
        np.testing.assert_array_equal(pool[others], before[others].astype(np.float16))


def test_only_one_token_into_an_f16_cache(dev):
    """Several tokens of a pass may read each other's K/V unless each is its sequence's only
    one, and the 8-bit cache's rows are written by rope_store_kv alone: attention refuses to
    append to it."""
    rng = np.random.default_rng(3)
    f16, q8 = Paged(dev, rng, 1, 64, 2, 64).cache(), Paged(dev, rng, 1, 64, 2, 64, kv_type="q8_0").cache()
    assert takes_rope(f16, 1, qk_norm=False) and takes_rope(f16, 2, qk_norm=False, distinct=True)
    assert not takes_rope(f16, 2, qk_norm=False) and not takes_rope(q8, 1, qk_norm=False)
    assert not takes_rope(f16, 1, qk_norm=True) and not takes_rope(q8, 2, qk_norm=False, distinct=True)
    # the tiled kernel: 128 tokens or more over an f16 cache, none of them appended by attention
    wide = AttentionShape(4, 2, 64, 256)
    assert takes_tiles(wide, f16, 128, own=False) and not takes_tiles(wide, f16, 127, own=False)
    assert not takes_tiles(wide, f16, 128, own=True) and not takes_tiles(wide, q8, 128, own=False)
    assert not takes_tiles(AttentionShape(4, 2, 256, 256), f16, 128, own=False)   # past TILED_MAX_HEAD_DIM
    shape, buf = AttentionShape(4, 2, 64, 64), dev.empty(4 * 4 * 64 * 2)
    rec = dev.ctx.recording()
    try:
        with pytest.raises(ValueError, match="appends K/V to an f16 cache"):
            attention(rec, shape, buf, q8, buf, step_buffer(dev, [(0, 1)]), 1, own=OwnKV(buf, buf))
    finally:
        rec.finish().destroy()
