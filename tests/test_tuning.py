"""Mat-vec shape tuning (on lavapipe in CI): the candidates, the tuner's disk cache, VKLLM_TUNE, and the
engine against the numpy reference with tuning forced on. That every candidate computes the
right products is in test_kernels_matmul.py; which one is fastest is not asserted (no timing
assertions), only that the choice is one of them and is measured once."""
import json
from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from refmodel import logits as reference_logits

from vkllm.errors import VkllmError
from worker.engine.config import Settings
from worker.engine.engine import Engine
from worker.engine.kernels.mat_vec import workgroup_rows
from worker.engine.kernels.tuning import Budget, MatVecTuner, candidates, shape_label
from worker.engine.modelfile import ModelFile
from worker.engine.vk.device import DeviceInfo
from worker.tools.synth import write_model

QUICK = Budget(rotation_bytes=64 << 10, warmup_seconds=0.01, runs=2)
KEYS = [(T.Q4_0, 40, 256), (T.Q6_K, 24, 512)]


def device(subgroup: int, max_workgroup: int, shared: int) -> DeviceInfo:
    return DeviceInfo(0, "gpu", "discrete", 8 << 30, subgroup, 1 << 32, 64, 1 << 30, 65535, 128, 1.0, frozenset(),
                      max_workgroup_size=max_workgroup, max_shared_memory=shared)


def test_candidates_follow_the_subgroup_and_the_limits():
    """1-8 subgroups x 1-8 rows with 2-16 of them per workgroup, and both fixed shapes, sharing
    their rows (threads == lanes); and lane groups of a subgroup or half of one with 1-4 rows of
    their own, 4-64 rows a workgroup (threads x rows / lanes)."""
    shared = {(32, 2), (32, 4), (32, 8), (64, 1), (64, 2), (64, 4), (64, 8), (128, 1), (128, 2), (128, 4), (256, 1),
              (256, 2), (32, 16)}
    groups = {(64, 2, 32), (64, 4, 32), (128, 1, 32), (128, 2, 32), (128, 4, 32), (256, 1, 32), (256, 2, 32),
              (256, 4, 32), (512, 1, 32), (512, 2, 32),   # 512 x 4 rows: 8 columns' sums exceed 48 KB
              (32, 2, 16), (32, 4, 16), (64, 1, 16), (64, 2, 16), (64, 4, 16), (128, 1, 16), (128, 2, 16),
              (128, 4, 16), (256, 1, 16), (256, 2, 16), (256, 4, 16), (512, 1, 16), (512, 2, 16)}
    assert set(candidates(device(32, 1024, 49152))) == {(t, r, t) for t, r in shared} | groups
    # 64 wide, at most 256 invocations, and 16 KB of shared memory: 8 columns x rows x threads floats
    shared = {(64, 2), (64, 4), (64, 8), (128, 1), (128, 2), (128, 4), (256, 1), (256, 2)}
    groups = {(128, 2, 64), (128, 4, 64), (256, 1, 64), (256, 2, 64), (64, 2, 32), (64, 4, 32), (128, 1, 32),
              (128, 2, 32), (128, 4, 32), (256, 1, 32), (256, 2, 32)}
    assert set(candidates(device(64, 256, 16384))) == {(t, r, t) for t, r in shared} | groups


def test_shape_labels():
    assert shape_label((64, 2, 64)) == "64x2" and shape_label((256, 2, 16)) == "256x2/16"


def test_tuner_measures_once_then_reads_the_cache(vk_ctx, tmp_path, caplog):
    tuner = MatVecTuner(vk_ctx, tmp_path, QUICK)
    with caplog.at_level("INFO", logger="worker.engine.kernels.tuning"):
        shapes = tuner.shapes(KEYS)
    assert tuner.measured == 2
    # each weight timed says so as it starts (a first load on a GPU can take minutes)
    assert [r.getMessage() for r in caplog.records] == [
        f"timing Q4_0 40x256: mat-vec workgroup shapes (once on {vk_ctx.info.name})",
        f"timing Q6_K 24x512: mat-vec workgroup shapes (once on {vk_ctx.info.name})"]
    assert set(shapes) == set(KEYS) and all(s in candidates(vk_ctx.info) for s in shapes.values())
    (entries,) = json.loads((tmp_path / "tuning.json").read_text()).values()
    by_weight = {tuple(name.split()[:2]): entry for name, entry in entries.items()}
    assert sorted(by_weight) == [("Q4_0", "40x256"), ("Q6_K", "24x512")]
    for (qtype, rows, cols), shape in shapes.items():
        entry = by_weight[qtype.name, f"{rows}x{cols}"]
        assert entry["shape"] == list(shape)
        assert len(entry["us"]) == len(candidates(vk_ctx.info)) and all(us > 0 for us in entry["us"].values())
        assert entry["us"][shape_label(shape)] == min(entry["us"].values())   # the fastest

    again = MatVecTuner(vk_ctx, tmp_path, QUICK)
    assert again.shapes(KEYS) == shapes and again.measured == 0
    more = again.shapes(KEYS + [(T.F16, 16, 64)])
    assert again.measured == 1 and {k: more[k] for k in KEYS} == shapes
    assert len(next(iter(json.loads((tmp_path / "tuning.json").read_text()).values()))) == 3


def test_gate_up_is_timed_writing_its_blocks_over_8bit_x(x8_ctx, tmp_path):
    """Over 8-bit x a gate+up of whole 32-row blocks is timed through the kernel that also writes
    its 8-bit blocks (as decode runs it), every candidate; one of other rows through the plain one."""
    tuner = MatVecTuner(x8_ctx, tmp_path, QUICK)
    shapes = tuner.shapes([(T.Q4_K, 64, 256), (T.Q4_K, 48, 256)], glu=True)
    assert all(shape in candidates(x8_ctx.info) for shape in shapes.values())
    (entries,) = json.loads((tmp_path / "tuning.json").read_text()).values()
    hashes = {name.split()[-1]: entry for name, entry in entries.items()}
    assert set(hashes) == {tuner.cache.kernel_hash(kernel) for kernel in ("mul_mat_vec_glu_x8_blocks_q4_k",
                                                                          "mul_mat_vec_glu_x8_q4_k")}
    assert all(len(entry["us"]) == len(candidates(x8_ctx.info)) for entry in entries.values())


def test_residual_products_are_timed_writing_the_next_norms_blocks(x8_ctx, tmp_path):
    """Over 8-bit x a residual product of whole 32-row blocks is timed adding to y and writing the
    next norm's input (the kernel decode runs, mul_mat_vec_x8_rms_blocks), every candidate (each
    has workgroups of a divisor or a multiple of 32 rows, so each can); one of other rows is left
    to the plain table."""
    tuner = MatVecTuner(x8_ctx, tmp_path, QUICK)
    shapes = tuner.shapes([(T.Q4_K, 64, 256), (T.Q4_K, 48, 256)], residual=True)
    shown = candidates(x8_ctx.info)
    assert all(32 % workgroup_rows(shape) == 0 or workgroup_rows(shape) % 32 == 0 for shape in shown)
    assert set(shapes) == {(T.Q4_K, 64, 256)} and shapes[T.Q4_K, 64, 256] in shown
    (entries,) = json.loads((tmp_path / "tuning.json").read_text()).values()
    (name, entry), = entries.items()
    assert name == f"residual Q4_K 64x256 {tuner.cache.kernel_hash('mul_mat_vec_x8_rms_blocks_q4_k')}"
    assert len(entry["us"]) == len(shown)
    with pytest.raises(ValueError, match="does not write the next norm's input"):
        tuner.measure((T.Q4_K, 48, 256), residual=True)


def test_residual_weights_take_the_residual_table(x8_ctx, tmp_path, monkeypatch):
    """tiny-llama Q4_K_M over 8-bit x with tuning on (each table answered with a shape of its
    own): the attention output and down weights run the residual table's shape, the gates the
    gate+up table's, the other weights the plain one's."""
    from worker.engine import engine as engine_module
    plain_shape, glu_shape, residual_shape = candidates(x8_ctx.info)[:3]

    def shapes(self, keys, glu=False, residual=False):
        keys = {k for k in keys if not residual or self.times_norm_blocks(k)}
        return dict.fromkeys(keys, residual_shape if residual else glu_shape if glu else plain_shape)
    monkeypatch.setattr(MatVecTuner, "shapes", shapes)
    monkeypatch.setattr(engine_module, "model_cols_shapes", lambda *args: {})
    path = write_model("tiny-llama", tmp_path / "tiny-llama-q4km.gguf", mix="Q4_K_M", seed=1)
    engine = Engine.load(path, replace(x8_ctx.settings, tune=True, cache_dir=tmp_path), n_ctx=32, ctx=x8_ctx,
                         max_batch=1)
    try:
        for layer in engine.model.layers:
            assert layer["attn_output"].mat_vec_shape == layer["ffn_down"].mat_vec_shape == residual_shape
            assert layer["attn_qkv"].mat_vec_shape == plain_shape and layer["ffn_gate"].glu_shape == glu_shape
        assert engine.model.output.mat_vec_shape == plain_shape
    finally:
        engine.close()


def test_a_damaged_cache_is_measured_again(vk_ctx, tmp_path):
    (tmp_path / "tuning.json").write_text("{not json")
    tuner = MatVecTuner(vk_ctx, tmp_path, QUICK)
    assert tuner.shapes(KEYS[:1])[KEYS[0]] in candidates(vk_ctx.info) and tuner.measured == 1
    assert len(next(iter(json.loads((tmp_path / "tuning.json").read_text()).values()))) == 1


def test_tile_tuner_reads_the_same_cache_format(vk_ctx, tmp_path, monkeypatch):
    """The cooperative-matrix tiler keeps its tiles through the tuners' shared cache: what one
    process stored (store, here with made-up timings) another reads without measuring, keyed by
    the chunk and the candidate list too. No cooperative matrices are needed to read a cache."""
    from worker.engine.kernels import tile_tuning
    from worker.engine.kernels.tile_tuning import TileTuner
    key, fast, slow = (T.Q4_K, 256, 512), (64, 64, 32, 32, 32, 1), (128, 128, 64, 64, 32, 1)
    TileTuner(vk_ctx, tmp_path, 512).store({key: {slow: 2e-6, fast: 1e-6}})
    again = TileTuner(vk_ctx, tmp_path, 512)
    assert again.tiles([key]) == {key: fast} and again.measured == 0
    (entries,) = json.loads((tmp_path / "coopmat_tiles.json").read_text()).values()
    (name, entry), = entries.items()
    assert name.startswith("Q4_K 256x512 n512 ") and entry["us"] == {"64x64x32x32x32x1": 1.0, "128x128x64x64x32x1": 2.0}
    assert TileTuner(vk_ctx, tmp_path, 1024)._name(key) not in again.cache.entries   # another chunk, another entry
    monkeypatch.setattr(tile_tuning, "CANDIDATES_DIGEST", "0ther")
    assert TileTuner(vk_ctx, tmp_path, 512)._name(key) not in again.cache.entries    # other candidates


@pytest.mark.parametrize("value,expected", [("0", False), ("1", True), ("auto", None), (None, None)])
def test_vkllm_tune_setting(value, expected):
    env = {} if value is None else {"VKLLM_TUNE": value}
    assert Settings.from_env(env).tune is expected


def test_vkllm_tune_setting_refuses_other_values():
    with pytest.raises(VkllmError, match="VKLLM_TUNE must be 0, 1 or auto"):
        Settings.from_env({"VKLLM_TUNE": "yes please"})


@pytest.fixture(scope="module")
def tiny_q8(tmp_path_factory):
    return write_model("tiny-llama", tmp_path_factory.mktemp("tuning") / "tiny-llama-q8.gguf", mix="Q8_0", seed=1)


def test_engine_with_tuning_matches_reference(vk_ctx, tiny_q8, tmp_path):
    """Token by token (one column: the pipelines the candidates test built), each position's
    logits against the numpy forward pass."""
    settings = replace(vk_ctx.settings, tune=True, cache_dir=tmp_path)
    model_file = ModelFile.open(tiny_q8)
    ids = np.random.default_rng(4).integers(0, model_file.config.vocab_size, 6).tolist()
    engine = Engine.load(tiny_q8, settings, n_ctx=32, ctx=vk_ctx, max_batch=1)
    try:
        layer = engine.model.layers[0]
        assert all(layer[name].mat_vec_shape in candidates(vk_ctx.info) for name in ("attn_q", "attn_k", "ffn_down"))
        assert engine.model.output.mat_vec_shape in candidates(vk_ctx.info)
        assert layer["attn_qkv"].mat_vec_shape in candidates(vk_ctx.info)
        got = []
        for pos, token in enumerate(ids):
            engine.runner.decode(token, pos, "logits")
            got.append(engine.runner.read_logits().copy())
    finally:
        engine.close()
    (entries,) = json.loads((tmp_path / "tuning.json").read_text()).values()
    # rows x K: 128x256 (k, v), 256x256 (q, o), 768x256, 256x768, 384x256 (output), 512x256 (q, k
    # and v as one tensor); the 768x256 gate through the fused gate+up kernel
    assert sorted(name.rsplit(" ", 1)[0] for name in entries) == [
        "Q8_0 128x256", "Q8_0 256x256", "Q8_0 256x768", "Q8_0 384x256", "Q8_0 512x256", "Q8_0 768x256",
        "glu Q8_0 768x256"]
    assert layer["ffn_gate"].glu_shape in candidates(vk_ctx.info)
    ref = reference_logits(model_file, ids)
    np.testing.assert_allclose(np.array(got), ref, atol=2e-3 * np.abs(ref).max())


def test_engine_tunes_by_default_on_gpus_only(vk_ctx, tiny_q8, tmp_path):
    engine = Engine.load(tiny_q8, replace(vk_ctx.settings, cache_dir=tmp_path, tune=None), n_ctx=32, ctx=vk_ctx,
                         max_batch=1)
    try:
        tuned = engine.model.layers[0]["attn_q"].mat_vec_shape is not None
    finally:
        engine.close()
    assert tuned == (tmp_path / "tuning.json").exists() == (vk_ctx.info.kind != "cpu")
