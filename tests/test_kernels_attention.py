"""Causal GQA attention over the paged KV cache on the real device, against a float64 numpy
reference computed from what the cache holds (f16 values, or gguf.quants' Q8_0 round trip for
the 8-bit cache). Pools are shuffled block tables with poison in every row a token must not
read (tests/paged_io.py)."""
import numpy as np
import pytest

from tests.kernel_io import f32
from tests.paged_io import Paged, step_buffer
from worker.engine.kernels.attention import attention, split_scratch_bytes
from worker.engine.kernels.shapes import AttentionShape
from worker.engine.kernels.x8 import quantize_x8, x8_bytes


def attention_reference(q, k, v, pos, scale, window=0):
    """One token's attention: q [n_head, d] over positions 0..pos of its sequence's k, v
    [>pos, n_head_kv, d]; window > 0: only the `window` positions ending at its own."""
    group = q.shape[0] // k.shape[1]
    first = max(0, pos + 1 - window) if window else 0
    ks = np.repeat(k[first:pos + 1].astype(np.float64), group, axis=1)
    vs = np.repeat(v[first:pos + 1].astype(np.float64), group, axis=1)
    s = np.einsum("hd,lhd->hl", q.astype(np.float64), ks) * scale
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return np.einsum("hl,lhd->hd", p, vs)


def run_attention(dev, rng, tokens, lengths, n_head, n_head_kv, head_dim, n_ctx, splits, kv_type="f16",
                  window=0, block=16):
    """tokens: (sequence, position) per token of the pass; sequence s holds lengths[s] positions.
    Returns (got, expected) [n_tokens, n_head, head_dim]."""
    paged = Paged(dev, rng, len(lengths), n_ctx, n_head_kv, head_dim, block, kv_type)
    seqs = []
    for s, length in enumerate(lengths):
        k, v = f32(rng, length, n_head_kv, head_dim), f32(rng, length, n_head_kv, head_dim)
        paged.fill(s, k, v)
        seqs.append((paged.stored(k), paged.stored(v)))
    n_tokens = len(tokens)
    q = f32(rng, n_tokens, n_head, head_dim)
    shape = AttentionShape(n_head, n_head_kv, head_dim, n_ctx, window=window)
    got = attention_out(dev, paged, q, shape, tokens, splits)
    expected = np.stack([attention_reference(q[t], *seqs[s], pos, head_dim ** -0.5, window)
                         for t, (s, pos) in enumerate(tokens)])
    return got, expected


def attention_out(dev, paged, q, shape, tokens, splits, sinks=None) -> np.ndarray:
    """The attention kernel over `paged` for queries q [n_tokens, n_head, head_dim] at `tokens`
    ((sequence, position) each), with the scratch its splits need; its output, shaped as q."""
    n_tokens = len(tokens)
    out = dev.empty(q.nbytes)
    nbytes = split_scratch_bytes(shape, n_tokens, splits)
    scratch = dev.put(np.zeros(nbytes, np.uint8)) if nbytes else None   # zeroed: its counters
    cache, step = paged.cache(), step_buffer(dev, tokens)
    dev.run(lambda rec: attention(rec, shape, dev.put(q), cache, out, step, n_tokens, scratch, splits=splits,
                                  sinks=None if sinks is None else dev.put(sinks)))
    return dev.get(out, count=q.size).reshape(q.shape)


CASES = [  # n_tokens, pos0, n_head, n_head_kv, head_dim, n_ctx, splits (None: automatic): one sequence
    (1, 650, 4, 2, 64, 700, None),     # decode after a prefix, split over the sequence
    (1, 650, 4, 2, 64, 700, 1),        # the same in one pass
    (1, 0, 4, 2, 64, 64, None),        # the first token
    (1, 100, 4, 2, 64, 4096, None),    # a cache sized for 4096 positions: 64 splits, 4 of them used (short: 32 each)
    (1, 300, 4, 2, 64, 4096, None),    # past SHORT_SPAN: 64 positions a split, 5 used
    (1, 20, 4, 2, 64, 4096, None),     # 64 splits, 1 used: it writes the output, no partials or merge
    (5, 0, 6, 2, 128, 300, None),      # prefill from the start
    (5, 297, 6, 2, 128, 302, 1),       # prefill chunk after a prefix, one pass
    (5, 297, 6, 2, 128, 302, 3),       # the same, split
    (3, 400, 9, 3, 64, 512, None),     # SmolLM2 shape
    (2, 130, 32, 2, 64, 160, None),    # a GQA group larger than one workgroup's rows
    (1, 257, 8, 8, 80, 300, 2),        # no grouping, head_dim not a multiple of the workgroup (f16 only)
    (1, 257, 8, 8, 96, 300, 2),
]


# the 8-bit cache takes heads of whole 32-value groups
@pytest.mark.parametrize("n_tokens, pos0, n_head, n_head_kv, head_dim, n_ctx, splits, kv_type",
                         [(*case, t) for case in CASES for t in ("f16", "q8_0") if t == "f16" or case[4] % 32 == 0])
def test_attention(dev, n_tokens, pos0, n_head, n_head_kv, head_dim, n_ctx, splits, kv_type):
    rng = np.random.default_rng(pos0 + n_head)
    tokens = [(0, pos0 + t) for t in range(n_tokens)]
    got, expected = run_attention(dev, rng, tokens, [pos0 + n_tokens], n_head, n_head_kv, head_dim, n_ctx, splits,
                                  kv_type)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
@pytest.mark.parametrize("splits", [None, 1])
def test_batched_sequences_of_different_lengths(dev, splits, kv_type):
    """One pass over decode tokens of three sequences of different lengths and a prefill chunk of
    a fourth (the continuous-batching step): each token sees only its own sequence, up to its
    own position, through its own block table row."""
    rng = np.random.default_rng(11)
    lengths = [300, 17, 1, 40]
    tokens = [(0, 299), (1, 16), (2, 0), (3, 36), (3, 37), (3, 38), (3, 39)]
    got, expected = run_attention(dev, rng, tokens, lengths, 8, 2, 64, 320, splits, kv_type)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_passes_of_different_sizes_share_one_scratch(dev):
    """As the workspace's: passes of 1, 40 and 1 tokens, each split, over one scratch zeroed once:
    the merging splits leave the counters at 0, and no pass's partials land on the counters of
    a larger pass (40 tokens x 2 KV heads count past what one token's pass would reserve)."""
    rng = np.random.default_rng(5)
    n_head, n_head_kv, head_dim, n_ctx = 4, 2, 64, 700
    paged = Paged(dev, rng, 1, n_ctx, n_head_kv, head_dim)
    k, v = f32(rng, 660, n_head_kv, head_dim), f32(rng, 660, n_head_kv, head_dim)
    paged.fill(0, k, v)
    stored = paged.stored(k), paged.stored(v)
    cache, shape = paged.cache(), AttentionShape(n_head, n_head_kv, head_dim, n_ctx, scale=0.125)
    scratch = dev.put(np.zeros(split_scratch_bytes(shape, 40, splits=2), np.uint8))
    for n_tokens in (1, 40, 1):
        tokens = [(0, 620 + t) for t in range(n_tokens)]
        q, out = f32(rng, n_tokens, n_head, head_dim), dev.empty(n_tokens * n_head * head_dim * 4)
        step = step_buffer(dev, tokens)
        dev.run(lambda rec: attention(rec, shape, dev.put(q), cache, out, step, n_tokens, scratch, splits=2))
        expected = np.stack([attention_reference(q[t], *stored, pos, 0.125) for t, (_, pos) in enumerate(tokens)])
        np.testing.assert_allclose(dev.get(out, count=q.size).reshape(q.shape), expected, rtol=1e-4, atol=1e-5)


def test_recorded_decode_replays_with_the_step_buffer(dev):
    """Attention recorded once, replayed for successive positions of two sequences as a batch
    decodes them: the step buffer's positions and the cache's rows change, the recording not."""
    rng = np.random.default_rng(1)
    n_head, n_head_kv, head_dim, n_ctx = 4, 2, 64, 600
    paged = Paged(dev, rng, 2, n_ctx, n_head_kv, head_dim)
    seqs = [[f32(rng, n, n_head_kv, head_dim), f32(rng, n, n_head_kv, head_dim)] for n in (520, 33)]
    for s, (k, v) in enumerate(seqs):
        paged.fill(s, k, v)
    cache = paged.cache()
    shape = AttentionShape(n_head, n_head_kv, head_dim, n_ctx, scale=0.125)
    bq = dev.empty(2 * n_head * head_dim * 4)
    out, step = dev.empty(2 * n_head * head_dim * 4), step_buffer(dev, [(0, 0), (1, 0)])
    scratch = dev.put(np.zeros(split_scratch_bytes(shape, 2), np.uint8))
    rec = dev.ctx.recording()
    attention(rec, shape, bq, cache, out, step, 2, scratch)
    rec.finish()
    row = paged.width * 2
    for _ in range(3):
        q = f32(rng, 2, n_head, head_dim)
        positions = []
        for s in range(2):
            k_new, v_new = f32(rng, 1, n_head_kv, head_dim), f32(rng, 1, n_head_kv, head_dim)
            positions.append(len(seqs[s][0]))
            seqs[s] = [np.concatenate([seqs[s][0], k_new]), np.concatenate([seqs[s][1], v_new])]
            r = paged.row(s, positions[-1])   # the new rows, as rope_store_kv writes them
            dev.ctx.upload(cache.k.sub(r * row, row), k_new.astype(np.float16))
            dev.ctx.upload(cache.v.sub(r * row, row), v_new.astype(np.float16))
        dev.ctx.upload(bq, q)
        dev.ctx.upload(step, np.array([[0, positions[0]], [1, positions[1]]], np.uint32))
        dev.ctx.run(rec)
        got = dev.get(out, count=q.size).reshape(q.shape)
        for s in range(2):
            k, v = (x.astype(np.float16) for x in seqs[s])
            np.testing.assert_allclose(got[s], attention_reference(q[s], k, v, positions[s], 0.125),
                                       rtol=1e-4, atol=1e-5)
    rec.destroy()


def test_split_without_enough_scratch_is_refused(dev):
    rng = np.random.default_rng(0)
    shape = AttentionShape(4, 2, 64, 700)
    need = split_scratch_bytes(shape, 1)
    assert need > 0
    cache = Paged(dev, rng, 1, 700, 2, 64).cache()
    q, out, step = dev.empty(4 * 64 * 4), dev.empty(4 * 64 * 4), step_buffer(dev, [(0, 650)])
    for scratch in (None, dev.empty(need // 2)):
        rec = dev.ctx.recording()
        try:
            with pytest.raises(ValueError, match="bytes of scratch"):
                attention(rec, shape, q, cache, out, step, 1, scratch)
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
    """Positions older than the window are masked: poison there would break the result if read."""
    n_head, n_head_kv, head_dim = 4, 2, 64
    rng = np.random.default_rng(pos0 + window)
    paged = Paged(dev, rng, 1, n_ctx, n_head_kv, head_dim)
    length = pos0 + n_tokens
    k, v = f32(rng, length, n_head_kv, head_dim), f32(rng, length, n_head_kv, head_dim)
    first_seen = max(0, pos0 + 1 - window)
    paged.fill(0, k[first_seen:], v[first_seen:], first_seen)   # older rows keep the poison
    q = f32(rng, n_tokens, n_head, head_dim)
    shape = AttentionShape(n_head, n_head_kv, head_dim, n_ctx, window=window)
    got = attention_out(dev, paged, q, shape, [(0, pos0 + t) for t in range(n_tokens)], splits)
    kh, vh = k.astype(np.float16), v.astype(np.float16)
    expected = np.stack([attention_reference(q[t], kh, vh, pos0 + t, head_dim ** -0.5, window)
                         for t in range(n_tokens)])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n_head, head_dim, splits, sinks", [
    (4, 64, None, False),   # decode split over the sequence: the merging split writes the blocks
    (6, 128, 3, True),      # with sinks, merged with them
    (4, 64, 1, False),      # one pass: each workgroup writes its heads' blocks
    (6, 128, 1, True),      # the same with sinks
    (8, 80, 2, False),      # heads across blocks (80 values): split, then a quantize_x8
])
def test_x8_output_is_the_quantized_output(dev, n_head, head_dim, splits, sinks):
    """With x8 the output comes in 8-bit blocks too (the attention output product's input), bit for
    bit quantize_x8's of the f32 output, which stays the attention's."""
    rng = np.random.default_rng(head_dim + n_head)
    n_head_kv, n_ctx, tokens = 2, 300, [(0, 250), (1, 40)]
    paged = Paged(dev, rng, 2, n_ctx, n_head_kv, head_dim)
    seqs = []
    for s, length in enumerate((251, 41)):
        k, v = f32(rng, length, n_head_kv, head_dim), f32(rng, length, n_head_kv, head_dim)
        paged.fill(s, k, v)
        seqs.append((paged.stored(k), paged.stored(v)))
    q = f32(rng, len(tokens), n_head, head_dim)
    shape = AttentionShape(n_head, n_head_kv, head_dim, n_ctx)
    cols = n_head * head_dim
    out, x8, ref8 = dev.empty(q.nbytes), dev.empty(x8_bytes(len(tokens), cols)), dev.empty(x8_bytes(len(tokens), cols))
    nbytes = split_scratch_bytes(shape, len(tokens), splits)
    scratch = dev.put(np.zeros(nbytes, np.uint8)) if nbytes else None   # zeroed: its counters
    cache, step = paged.cache(), step_buffer(dev, tokens)
    sink_logits = np.full(n_head, -30.0, np.float32)   # present, weighing next to nothing

    def record(rec):
        attention(rec, shape, dev.put(q), cache, out, step, len(tokens), scratch, splits=splits,
                  sinks=dev.put(sink_logits) if sinks else None, x8=x8)
        rec.barrier()
        quantize_x8(rec, out, ref8, len(tokens), cols)
    dev.run(record)
    expected = np.stack([attention_reference(q[t], *seqs[s], pos, head_dim ** -0.5) for t, (s, pos) in enumerate(tokens)])
    np.testing.assert_allclose(dev.get(out, count=q.size).reshape(q.shape), expected, rtol=1e-4, atol=1e-5)
    words = x8_bytes(len(tokens), cols) // 4
    np.testing.assert_array_equal(dev.get(x8, np.uint32, words), dev.get(ref8, np.uint32, words))
