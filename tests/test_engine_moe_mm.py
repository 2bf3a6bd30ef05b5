"""Mixture-of-experts prefill through the mat-mat expert kernels (Settings.prefill_kernel "tiled"
or "mmq", which lavapipe takes only when told): tiny qwen3moe, qwen2moe and gpt-oss chunks take
mul_mat_id_tiles / mul_mmq_id_tiles over 64-slot tiles, their logits match the numpy reference
(tests/refmodel.py) within the float paths' tolerance (tiled) or test_engine_mmq.py's (mmq), and
prefill in chunks equals one pass."""
import dataclasses

import numpy as np
import pytest
from refmodel import logits as reference_logits

from tests.kernel_io import own_context
from tests.test_engine import _model, assert_chunked_then_decoded, reference_error
from tests.test_engine_mmq import TOL as MMQ_TOL
from worker.engine.engine import Engine
from worker.engine.kernels.paths import paths
from worker.engine.modelfile import ModelFile

TOL = {"tiled": 2e-3, "mmq": MMQ_TOL}
CASES = [("tiny-qwen3moe", "Q4_K_M"), ("tiny-qwen2moe", "Q8_0"), ("tiny-gpt-oss", "MXFP4_MOE")]


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("moe_mm")


@pytest.fixture(scope="module", params=["tiled", "mmq"])
def mm_ctx(request, vk_settings):
    with own_context(dataclasses.replace(vk_settings, prefill_kernel=request.param)) as ctx:
        if request.param not in paths(ctx):
            pytest.skip(f"{ctx.info.name} has no {request.param} kernel")
        yield ctx


def test_prefill_takes_the_mat_mat_expert_kernels(mm_ctx, synth_dir):
    """tiny-gpt-oss (4 layers, MXFP4 experts with biases): per layer the gate and up products,
    their clamped SwiGLU and the down product over one grouping's tiles; no expert mat-vec."""
    chosen = mm_ctx.settings.prefill_kernel
    path = _model(synth_dir, "tiny-gpt-oss", "MXFP4_MOE")
    layers = ModelFile.open(path).config.n_layer
    engine = Engine.load(path, n_ctx=64, ctx=mm_ctx, max_batch=16)
    try:
        kernels = engine.runner.profile(16)
    finally:
        engine.close()
    # gate and up through the path's kernel, down through the tiled one (f32 input: models/moe.py)
    mmq = chosen == "mmq"
    assert kernels["mul_mat_id_bias_tiles_mxfp4"][0] == (1 if mmq else 3) * layers
    assert kernels.get("mul_mmq_id_bias_tiles_mxfp4", (0,))[0] == (2 * layers if mmq else 0)
    assert kernels["moe_group"][0] == layers and kernels["swiglu_oai"][0] == layers
    assert not [k for k in kernels if k.startswith("mul_mat_vec_id")], kernels


@pytest.mark.parametrize("preset,mix", CASES)
def test_logits_match_numpy_reference(mm_ctx, synth_dir, preset, mix):
    """11 tokens in one chunk, as test_engine_mmq.py's (at 20, tiny-qwen3moe's 13th token has a
    near-tie between its 2nd and 3rd expert in layer 0, 1.5e-3 of the logits' range, which 8-bit
    router input flips already on main)."""
    err = reference_error(mm_ctx, _model(synth_dir, preset, mix), 11, 16)
    assert err < TOL[mm_ctx.settings.prefill_kernel], f"max relative logit error {err:.2e}"


@pytest.mark.parametrize("preset,mix", CASES)
def test_chunked_prefill_and_decode_match_one_pass(mm_ctx, synth_dir, preset, mix):
    """20 tokens prefilled in chunks of 12 (12 through the expert tiles, then 8 through the
    mat-vecs), then 4 decoded: the reference's logits at every step."""
    path = _model(synth_dir, preset, mix)
    model_file = ModelFile.open(path)
    ids = np.random.default_rng(5).integers(0, model_file.config.vocab_size, 24).tolist()
    ref = reference_logits(model_file, ids)
    tol = TOL[mm_ctx.settings.prefill_kernel] * np.abs(ref).max()
    assert_chunked_then_decoded(mm_ctx, path, ids, ref, 20, 12, tol)
