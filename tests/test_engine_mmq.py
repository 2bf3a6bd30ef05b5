"""Prefill through the mmq path (Settings.prefill_kernel "mmq"; lavapipe takes it only when told,
GPUs with accelerated 8-bit dot products and no matrix units by default): tiny models' chunks
take the mul_mmq kernels, their logits match the numpy reference (tests/refmodel.py), and
greedy generation gives the reference's tokens.

Tolerance: max |logit error| <= 4e-2 * max |logit|, where the float paths keep 2e-3
(test_engine.py): every quantized product rounds its activations to 8 bits per block of 32
(~0.5% RMS error per product, tests/test_kernels_mmq.py, whose exact references show the
kernels add nothing to it), and these tiny random models compound that through two layers:
observed 0.4-2.1e-2 (tiny-llama Q4_K_M: 1.9e-2 through mmq, 4e-4 through the tiled kernel),
the limit twice the largest. A mixture of experts' attention and router products take mmq, and
its experts' gate and up products mul_mmq_id_tiles (their down products the tiled kernel's
mul_mat_id_tiles: tests/test_engine_moe_mm.py)."""
import dataclasses

import numpy as np
import pytest
from refmodel import RefModel

from tests.kernel_io import own_context
from tests.test_engine import _model, reference_error
from worker.engine.engine import Engine
from worker.engine.kernels.paths import mat_mat_path, paths
from worker.engine.kernels.shapes import AttentionShape
from worker.engine.modelfile import ModelFile
from worker.engine.sampling import SamplingParams
from worker.engine.workspace import Workspace

TOL = 4e-2
CASES = [("tiny-llama", "Q4_K_M"), ("tiny-qwen2", "Q4_0"), ("tiny-qwen3", "Q3_K_L"), ("tiny-gemma3", "Q5_0"),
         ("tiny-qwen3moe", "Q4_K_M"), ("tiny-qwen2moe", "Q4_K_M"), ("tiny-gpt-oss", "MXFP4_MOE")]


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("synth_mmq")


@pytest.fixture(scope="module")
def mmq_ctx(vk_settings):
    with own_context(dataclasses.replace(vk_settings, prefill_kernel="mmq")) as ctx:
        if "mmq" not in paths(ctx):
            pytest.skip(f"{ctx.info.name} has no integer dot products")
        yield ctx


def test_prefill_takes_the_mmq_kernels(mmq_ctx, synth_dir):
    """Q4_K_M: Q/K/V, gate, up and down in Q4_K (and Q6_K), each product over 8-bit x."""
    engine = Engine.load(_model(synth_dir, "tiny-llama", "Q4_K_M"), n_ctx=64, ctx=mmq_ctx, max_batch=16)
    try:
        kernels = engine.runner.profile(16)
    finally:
        engine.close()
    products = {k: count for k, (count, _) in kernels.items() if k.startswith(("mul_", "quantize"))}
    # 2 layers: x quantized for Q/K/V, attention output, gate+up and down; the output head's
    # one row is a mat-vec
    assert products == {"quantize_x8": 8, "mul_mmq_q4_k": 12, "mul_mmq_q6_k": 2, "mul_mat_vec_q6_k": 1}, products


@pytest.mark.parametrize("preset,mix", CASES)
def test_logits_match_numpy_reference(mmq_ctx, synth_dir, preset, mix):
    err = reference_error(mmq_ctx, _model(synth_dir, preset, mix), 11, 16)
    assert err < TOL, f"max relative logit error {err:.2e}"


def test_greedy_tokens_match_reference(mmq_ctx, synth_dir):
    path = _model(synth_dir, "tiny-llama", "Q8_0")
    prompt = np.random.default_rng(5).integers(0, ModelFile.open(path).config.vocab_size, 14).tolist()
    engine = Engine.load(path, n_ctx=64, ctx=mmq_ctx, max_batch=16)
    try:
        events = list(engine.generate_ids(prompt, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)))
    finally:
        engine.close()
    tokens = [e.token_id for e in events if e.token_id is not None]
    assert tokens == RefModel(ModelFile.open(path)).greedy(prompt, 6)


def test_the_plan_counts_the_8_bit_activations(vk_ctx, mmq_ctx, synth_dir):
    """A chunk of 512 needs 1.5 bytes per value of the widest product input (tiny-llama: the FFN's
    768): 32 quants and 16 bytes of scale and sums per 32; none where the path is not taken
    (lavapipe's own rule; a GPU's where it takes another mat-mat kernel)."""
    config = ModelFile.open(_model(synth_dir, "tiny-llama", "Q4_K_M")).config
    shape = AttentionShape.from_config(config, 64)
    needed = 512 * 768 * 3 // 2
    assert Workspace.kernel_sizes(mmq_ctx, config, 512, shape)["x8"] == needed
    assert Workspace.kernel_sizes(vk_ctx, config, 512, shape)["x8"] == (needed if mat_mat_path(vk_ctx) == "mmq" else 0)
