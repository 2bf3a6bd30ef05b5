"""Decode over 8-bit activations (Settings.decode_kernel "x8"; GPUs with integer dot products
take it by default, lavapipe only when told): one-column products of the quantized weights take
the mul_mat_vec*_x8 kernels over x quantized once per input (a norm's by the residual product
before it, or by its own dispatch before the first layer), and the logits of each decode step match the numpy reference
(tests/refmodel.py) within test_engine_mmq.py's tolerance, for the reasons given there (every
product's activations rounded to 8 bits per block of 32); greedy decoding gives the reference's
tokens."""
import dataclasses

import numpy as np
import pytest
from refmodel import RefModel

from tests.test_engine import _model, assert_chunked_then_decoded, reference_logits
from tests.test_engine_mmq import TOL
from vkllm.errors import VkllmError
from worker.engine.config import Settings
from worker.engine.batch import Request
from worker.engine.engine import Engine
from worker.engine.kernels.paths import product_path
from worker.engine.modelfile import ModelFile
from worker.engine.sampling import SamplingParams

# Dense models only: on the tiny mixtures of experts (random routers, near-tied logits) the 8-bit
# rounding of the router's input tips a choice of expert at some step (tiny-qwen2moe at position
# 0 of this prompt: its logits 14% off there, 0.3% with f32 attention; tiny-qwen3moe at a later
# step), which no tolerance for rounding covers (test_engine_mmq.py saw the like on tiny-gpt-oss)
CASES = [("tiny-llama", "Q4_K_M"), ("tiny-qwen2", "Q4_0"), ("tiny-qwen3", "Q3_K_L"), ("tiny-gemma3", "Q5_0")]


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("synth_x8")


@pytest.mark.parametrize("n_ctx, split", [(32, False), (256, True)])
@pytest.mark.parametrize("n", [1, 3])
def test_decode_takes_the_x8_kernels(x8_ctx, synth_dir, n_ctx, split, n):
    """Q4_K_M, 2 layers, one token or three (the mat-cols kernel's): the norms' outputs
    (attention, FFN, output head) quantized by the norm (rms_norm_x8, none folded into an f32
    product; one token: only the first layer's, the others' inputs written by the residual
    product before them, mul_mat_vec_x8_rms_blocks, and scaled by their products, *_x8_rms),
    the gate+up output by quantize_x8 (one token: by the gate+up product,
    mul_mat_vec_glu_x8_blocks), the attention output by the attention kernel, by the split that
    merges where the sequence splits (a cache of 256 positions, not one of 32: attention.SHORT_CHUNK);
    every product over 8-bit x. One token's attention does RoPE and the cache append itself (no rope_store_kv)."""
    engine = Engine.load(_model(synth_dir, "tiny-llama", "Q4_K_M"), n_ctx=n_ctx, ctx=x8_ctx, max_batch=16)
    try:
        kernels = engine.runner.profile(n)
    finally:
        engine.close()
    products = {k: count for k, (count, _) in kernels.items() if k.startswith(("mul_", "quantize", "rms_norm"))}
    assert not any("_norm_" in k for k in products if k.startswith("mul_")), products
    assert products.get("quantize_x8", 0) == (0 if n == 1 else 2), products
    assert products.get("mul_mat_vec_glu_x8_blocks_rms_q4_k", 0) == (2 if n == 1 else 0), products
    assert products["rms_norm_x8"] == (1 if n == 1 else 5) and "rms_norm" not in products, products
    # one token: both residual products of each layer write the next norm's input, which the
    # second layer's Q/K (one product) and V (Q6_K, its own), both gate+ups and the output head scale
    writers = sum(count for k, count in products.items() if k.startswith("mul_mat_vec_x8_rms_blocks_"))
    scaled = sum(count for k, count in products.items() if k.endswith(("_rms_q4_k", "_rms_q6_k")))
    assert (writers, scaled) == ((4, 5) if n == 1 else (0, 0)), products
    rope = "_rope_freq_factors" if n == 1 else ""
    assert kernels.get(f"attention{'_split' if split else ''}{rope}_x8", (0,))[0] == 2, kernels
    assert kernels.get("rope_store_kv_freq_factors", (0,))[0] == (0 if n == 1 else 2), kernels
    assert all(k.endswith(("_q4_k", "_q6_k")) and "_x8_" in k for k in products if k.startswith("mul_")), products
    assert any("_cols_" in k for k in products) == (n > 1), products   # the output head's one row: mat-vec


@pytest.mark.parametrize("preset,mix", CASES)
def test_logits_of_each_decode_step_match_numpy_reference(x8_ctx, synth_dir, preset, mix):
    """Two tokens prefilled (over f32 x), six decoded one by one over 8-bit x."""
    path = _model(synth_dir, preset, mix)
    ids = np.random.default_rng(3).integers(0, ModelFile.open(path).config.vocab_size, 8).tolist()
    ref = reference_logits(ModelFile.open(path), ids)
    assert_chunked_then_decoded(x8_ctx, path, ids, ref, 2, 16, TOL * np.abs(ref).max())


def test_moe_decode_takes_the_x8_expert_kernel(x8_ctx, synth_dir):
    """tiny-qwen3moe: the chosen experts' gate+up reads the FFN input in the 8-bit blocks that
    the FFN norm writes beside its f32 output (which the router's product takes: rms_norm_f32_x8),
    their down products the slots' activations quantized by quantize_x8; the first decoded step's
    logits match the reference within TOL (later steps may tip a near-tied expert choice, as
    CASES says)."""
    path = _model(synth_dir, "tiny-qwen3moe", "Q4_K_M")
    engine = Engine.load(path, n_ctx=32, ctx=x8_ctx, max_batch=16)   # unsplit attention (SHORT_CHUNK)
    try:
        kernels = engine.runner.profile(1)
    finally:
        engine.close()
    layers = ModelFile.open(path).config.n_layer
    experts = {k: count for k, (count, _) in kernels.items() if k.startswith("mul_mat_vec_id")}
    assert sum(c for k, c in experts.items() if k.startswith("mul_mat_vec_id_glu_x8_")) == layers, experts
    assert sum(c for k, c in experts.items() if k.startswith("mul_mat_vec_id_x8_")) == layers, experts   # down
    assert sum(experts.values()) == 2 * layers, experts
    # per layer the slots' activations (the attention kernel writes its output's blocks itself,
    # the dense tail's output head takes rms_norm_x8)
    assert kernels["quantize_x8"][0] == layers and kernels["attention_x8"][0] == layers, kernels
    assert kernels["rms_norm_f32_x8"][0] == layers and "rms_norm" not in kernels, kernels
    ids = np.random.default_rng(3).integers(0, ModelFile.open(path).config.vocab_size, 3).tolist()
    ref = reference_logits(ModelFile.open(path), ids)
    assert_chunked_then_decoded(x8_ctx, path, ids, ref, 2, 16, TOL * np.abs(ref).max())


def test_greedy_tokens_match_reference(x8_ctx, synth_dir):
    path = _model(synth_dir, "tiny-llama", "Q8_0")
    prompt = np.random.default_rng(5).integers(0, ModelFile.open(path).config.vocab_size, 6).tolist()
    engine = Engine.load(path, n_ctx=64, ctx=x8_ctx, max_batch=16)
    try:
        events = list(engine.generate_ids(prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)))
    finally:
        engine.close()
    tokens = [e.token_id for e in events if e.token_id is not None]
    assert tokens == RefModel(ModelFile.open(path)).greedy(prompt, 8)


@pytest.mark.parametrize("mix, kernel", [("Q8_0", "mul_mat_vec_x8_slices_q8_0"),
                                         ("Q4_K_M", "mul_mat_cols_glu_x8_c4_q4_k")])
def test_sequences_decoded_together_give_what_each_gives_alone(x8_ctx, synth_dir, mix, kernel):
    """Three sequences in one batch: each step's products take an 8-bit kernel over their three
    columns (Q8_0 the mat-vec kernel's column groups; Q4_K and Q6_K the mat-cols kernel, fused
    Q/K/V and gate+up included), each column quantized alone, so each sequence gets the tokens it
    gets alone (which may part from the reference's where 8-bit rounding tips a near tie)."""
    path = _model(synth_dir, "tiny-llama", mix)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompts = [np.random.default_rng(seed).integers(3, 380, length).tolist() for seed, length in ((1, 3), (2, 9), (3, 5))]
    engine = Engine.load(path, dataclasses.replace(x8_ctx.settings, max_sequences=4), n_ctx=64, ctx=x8_ctx,
                         max_batch=16)
    try:
        assert kernel in engine.runner.profile(3)
        alone, together = alone_and_together(engine, prompts, params)
    finally:
        engine.close()
    assert together == alone
    assert all(len(tokens) == 6 for tokens in alone)


def alone_and_together(engine, prompts, params) -> tuple[list, list]:
    """The tokens each prompt gets generated alone, then with all of them in one batch."""
    alone = [[e.token_id for e in engine.generate_ids(ids, params) if e.token_id is not None] for ids in prompts]
    for i, ids in enumerate(prompts):
        engine.batch.add(Request(ids, params), tag=i)
    together = {i: [] for i in range(len(prompts))}
    while len(engine.batch):
        for seq, event in engine.batch.step():
            if event.token_id is not None:
                together[seq.tag].append(event.token_id)
    return alone, [together[i] for i in range(len(prompts))]


def test_lavapipe_decodes_over_f32_unless_told(vk_ctx):
    from gguf import GGMLQuantizationType as T
    if vk_ctx.info.kind != "cpu":
        pytest.skip("a GPU's own rule")
    assert product_path(vk_ctx, 1, 256, qtype=T.Q4_K) == "mat_vec"


def test_decode_kernel_from_the_environment():
    assert Settings.from_env({}).decode_kernel == "auto"
    assert Settings.from_env({"VKLLM_DECODE_KERNEL": "X8"}).decode_kernel == "x8"
    with pytest.raises(VkllmError, match="VKLLM_DECODE_KERNEL must be one of auto, mat_vec, x8"):
        Settings.from_env({"VKLLM_DECODE_KERNEL": "int8"})
