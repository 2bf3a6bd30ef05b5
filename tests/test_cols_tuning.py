"""Shape tuning of the 8-bit mat-cols kernel (worker/engine/kernels/cols_tuning.py), on lavapipe
with the 8-bit kernels forced (decode_kernel "x8") and tuning forced on: the candidates, the
tuner's cache, and an engine whose weights take their tuned shapes decoding a batch to the
tokens each sequence gets alone. That every shape computes the right products is
test_kernels_matmul_cols_x8.py's; which one is fastest is not asserted (no timing assertions)."""
import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from tests.test_engine import _model
from tests.test_engine_decode_x8 import alone_and_together
from worker.engine.engine import Engine
from worker.engine.kernels import cols_tuning
from worker.engine.kernels.cols_tuning import MAT_COLS_X8_TUNED, ColsTuner, candidates
from worker.engine.kernels.mat_cols import X8_ITEM_VALUES, mat_cols_x8_shape, mat_cols_x8_tile_bytes
from worker.engine.sampling import SamplingParams


def h200(float_atomic_add: bool = True):
    info = SimpleNamespace(subgroup_size=32, kind="discrete", max_shared_memory=49152, max_workgroup_size=1024,
                           float_atomic_add=float_atomic_add)
    return SimpleNamespace(info=info)


@pytest.mark.parametrize("qtype, mats", [(T.Q4_K, 1), (T.Q4_K, 2), (T.Q6_K, 1)], ids=["Q4_K", "Q4_K-glu", "Q6_K"])
def test_candidates_start_with_the_default_and_fit(qtype, mats):
    """Over Llama-8B's down product (K = 14336): ranges of K for one weight only, each a whole tile
    of items or more, none where the device cannot add floats atomically; a gate+up's workgroups
    of 1 to 8 subgroups, one weight's of 4 and 8."""
    ctx, k = h200(), 14336
    for cols in MAT_COLS_X8_TUNED:
        shapes = candidates(ctx, cols, mats, qtype, k)
        assert shapes[0] == mat_cols_x8_shape(ctx, cols, mats, qtype) and len(shapes) == len(set(shapes)) > 4
        for shape in shapes:
            threads, rows, lanes, tile, splits = shape
            assert threads % 32 == 0 and threads <= 1024 and 32 % lanes == 0
            assert rows * mats * cols <= 64 or shape == shapes[0]
            assert mat_cols_x8_tile_bytes(cols, shape, qtype) <= 49152
            assert splits * lanes * tile <= k // X8_ITEM_VALUES[qtype]
        assert {s[4] for s in shapes} == ({1} if mats == 2 else {1, 2, 4, 8, 16})
        assert {s[0] // 32 for s in shapes[1:]} == ({1, 2, 4, 8} if mats == 2 else {4, 8})
        assert {s[4] for s in candidates(h200(float_atomic_add=False), cols, mats, qtype, k)} == {1}


def test_tuner_measures_once_then_reads_the_cache(x8_ctx, tmp_path):
    key = (T.Q4_K, 48, 512)
    tuner = ColsTuner(x8_ctx, tmp_path)
    shape = tuner.shape(key, 8, False)
    assert tuner.measured == 1 and shape in candidates(x8_ctx, 8, 1, T.Q4_K, 512)
    (entries,) = json.loads((tmp_path / "cols_shapes.json").read_text()).values()
    (entry,) = entries.values()
    assert len(entry["us"]) == len(candidates(x8_ctx, 8, 1, T.Q4_K, 512))
    assert "x".join(map(str, shape)) == min(entry["us"], key=entry["us"].get)
    again = ColsTuner(x8_ctx, tmp_path)
    assert again.shape(key, 8, False) == shape and again.measured == 0


def test_engine_takes_tuned_shapes(x8_ctx, tmp_path, monkeypatch):
    """tiny-llama Q4_K_M with tuning on (few candidates per entry, for lavapipe's compile time: one
    split of K where the weight's K has room for one, else the first two): each Q4_K and Q6_K
    weight timed at 8, 16 and 32 columns (gates through the fused kernel, Q, K and V as their
    joined tensor), the tensors given their shapes (the residual weights' mat-vec shapes those
    timed writing the next norm's input), and five sequences decoded together (8-column
    variants, the Q4_K down products in ranges of K) get the tokens each gets alone."""
    full = candidates

    def few(ctx, cols, mats, qtype, k):
        shapes = full(ctx, cols, mats, qtype, k)
        split = [s for s in shapes if s[4] > 1][:1]
        return split or shapes[:2]
    monkeypatch.setattr(cols_tuning, "candidates", few)
    path = _model(tmp_path, "tiny-llama", "Q4_K_M")
    settings = dataclasses.replace(x8_ctx.settings, tune=True, cache_dir=tmp_path / "cache", max_sequences=6)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    prompts = [np.random.default_rng(seed).integers(3, 380, 2 + seed).tolist() for seed in range(5)]
    engine = Engine.load(path, settings, n_ctx=64, ctx=x8_ctx, max_batch=16)
    try:
        layer = engine.model.layers[0]
        assert set(layer["attn_qkv"].cols_shapes) == {(c, False) for c in MAT_COLS_X8_TUNED}
        assert set(layer["ffn_gate"].cols_shapes) == {(c, True) for c in MAT_COLS_X8_TUNED}
        assert set(engine.model.output.cols_shapes) == {(c, False) for c in MAT_COLS_X8_TUNED}
        downs = [layer["ffn_down"] for layer in engine.model.layers if layer["ffn_down"].ggml_type == T.Q4_K]
        assert downs and all(d.cols_shapes[8, False][4] > 1 for d in downs)
        # one-column decode: the residual weights take the shapes timed writing the next norm's input
        (mat_vec,) = json.loads((tmp_path / "cache" / "tuning.json").read_text()).values()
        residual = {" ".join(name.split()[1:3]): entry["shape"] for name, entry in mat_vec.items()
                    if name.startswith("residual ")}
        for w in (layer["attn_output"], *downs):
            assert list(w.mat_vec_shape) == residual[f"{w.ggml_type.name} {w.rows}x{w.cols}"]
        alone, together = alone_and_together(engine, prompts, params)
    finally:
        engine.close()
    assert together == alone
    (entries,) = json.loads((tmp_path / "cache" / "cols_shapes.json").read_text()).values()
    assert all(len(entry["us"]) in (1, 2) for entry in entries.values())
    assert {name.split(" c")[0] for name in entries} >= {"glu Q4_K 768x256", "Q6_K 384x256"}
