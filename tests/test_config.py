"""ModelConfig from GGUF metadata: SmolLM2's published hyperparameters, the tiny synthetic
families, and Llama 3.1 rope factors against transformers' formula (re-implemented here)."""
import dataclasses
import math

import numpy as np
import pytest
from refmodel import yarn_angle

from worker.engine.errors import GGUFError
from worker.engine.kernels.shapes import AttentionShape
from worker.engine.modelfile import ModelFile
from worker.engine.models.config import ModelConfig, Yarn, llama3_rope_factors
from worker.tools.synth import write_model


def transformers_llama3_factors(dim, base, factor, low, high, old_ctx):
    """transformers' _compute_llama3_parameters, as the ratio of old to new inverse frequency."""
    inv_freq = 1.0 / base ** (np.arange(0, dim, 2) / dim)
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
    return inv_freq / np.where(medium, smoothed, scaled)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cfg")
    return lambda preset: ModelFile.open(write_model(preset, folder / f"{preset}.gguf", "Q8_0")).config


def test_smollm2(smollm2_path):
    c = ModelFile.open(smollm2_path).config
    assert c.arch == "llama"
    assert (c.n_layer, c.n_embd, c.n_ff, c.n_head, c.n_head_kv, c.head_dim) == (30, 576, 1536, 9, 3, 64)
    assert (c.rope_dim, c.rope_base, c.context_length, c.vocab_size) == (64, 100000.0, 8192, 49152)
    assert c.norm_eps == pytest.approx(1e-5)
    assert c.tied_embeddings and not c.rope_neox and not c.has_qkv_bias and not c.has_qk_norm
    assert c.rope_freq_factors is None


def test_tiny_llama_has_llama3_rope_factors(tiny):
    c = tiny("tiny-llama")
    assert c.arch == "llama" and not c.rope_neox and not c.tied_embeddings
    expected = transformers_llama3_factors(64, 500000.0, 8.0, 1.0, 4.0, 8192)
    np.testing.assert_allclose(c.rope_freq_factors, expected, rtol=1e-6)
    assert c.rope_freq_factors[0] == 1.0 and c.rope_freq_factors[-1] == 8.0


def test_llama3_factors_of_llama_3_1_8b():
    ours = llama3_rope_factors(128, 500000.0, 8.0, 1.0, 4.0, 8192)
    np.testing.assert_allclose(ours, transformers_llama3_factors(128, 500000.0, 8.0, 1.0, 4.0, 8192),
                               rtol=1e-12)


def test_tiny_qwen2(tiny):
    c = tiny("tiny-qwen2")
    assert c.arch == "qwen2"
    assert c.rope_neox and c.has_qkv_bias and not c.has_qk_norm and not c.tied_embeddings
    assert (c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.vocab_size) == (128, 4, 2, 32, 331)
    assert c.rope_base == 1e6 and c.rope_freq_factors is None


def test_tiny_qwen3_head_dim_is_not_embd_over_heads(tiny):
    c = tiny("tiny-qwen3")
    assert c.arch == "qwen3"
    assert c.rope_neox and c.has_qk_norm and not c.has_qkv_bias and c.tied_embeddings
    assert (c.n_embd, c.n_head, c.head_dim, c.rope_dim) == (256, 4, 32, 32)


def test_llama_file_with_biases_uses_them(tiny):
    c = tiny("tiny-llama-bias")
    assert c.arch == "llama" and c.has_qkv_bias and not c.rope_neox and not c.has_qk_norm
    assert "blk.1.attn_q.bias" in c.required_tensors()


def test_required_tensors_follow_the_family(tiny):
    qwen2 = tiny("tiny-qwen2").required_tensors()
    qwen3 = tiny("tiny-qwen3").required_tensors()
    assert "blk.1.attn_v.bias" in qwen2 and "blk.1.attn_k_norm.weight" not in qwen2
    assert "blk.1.attn_k_norm.weight" in qwen3 and "blk.1.attn_v.bias" not in qwen3
    assert "output.weight" not in qwen3                 # tied


def test_frozen(tiny):
    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny("tiny-qwen2").n_layer = 3


META = {"general.architecture": "llama", "llama.block_count": 2, "llama.embedding_length": 64,
        "llama.feed_forward_length": 128, "llama.attention.head_count": 4,
        "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.context_length": 256,
        "tokenizer.ggml.tokens": ["a"] * 300}


def test_defaults_from_minimal_metadata():
    c = ModelConfig.from_metadata(META)
    assert (c.n_head_kv, c.head_dim, c.rope_dim, c.rope_base, c.vocab_size) == (4, 16, 16, 10000.0, 300)


def test_linear_rope_scaling_is_a_constant_factor():
    c = ModelConfig.from_metadata(META | {"llama.rope.scaling.type": "linear",
                                          "llama.rope.scaling.factor": 4.0})
    assert c.rope_freq_factors == (4.0,) * 8


YARN = {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0,
        "llama.rope.scaling.original_context_length": 64}


def test_yarn_is_a_per_pair_factor_and_a_score_scale():
    """The divisors and the magnitude are those of the reference's rope_yarn (tests/refmodel.py,
    itself checked against llama.cpp in test_engine_moe.py): mixed angle = angle / factor."""
    c = ModelConfig.from_metadata(META | YARN)
    assert c.rope_yarn == Yarn(4.0, 64, 32.0, 1.0, 1.0, 1.0)
    mixed, mscale = yarn_angle(np.ones(8), c.rope_yarn, 16, 10000.0)
    np.testing.assert_allclose(c.rope_freq_factors, 1 / mixed, rtol=1e-12)
    f = c.rope_freq_factors
    assert f[0] == 1.0 < f[1] < 4.0 == f[7]   # extrapolated, the ramp, interpolated
    assert mscale == pytest.approx(1 + 0.1 * np.log(4.0))
    assert c.layer_attention_scale(0) == pytest.approx(16 ** -0.5 * mscale ** 2)


def test_yarn_keys_override_llama_cpp_defaults():
    c = ModelConfig.from_metadata(META | YARN | {"llama.rope.scaling.yarn_beta_fast": 16.0,
                                                 "llama.rope.scaling.yarn_beta_slow": 2.0,
                                                 "llama.rope.scaling.yarn_ext_factor": 0.0,
                                                 "llama.rope.scaling.yarn_attn_factor": 0.5})
    assert c.rope_yarn == Yarn(4.0, 64, 16.0, 2.0, 0.0, 0.5)
    assert c.rope_freq_factors == pytest.approx((4.0,) * 8)   # ext_factor 0: plain interpolation
    assert c.layer_attention_scale(0) == pytest.approx(16 ** -0.5 * 0.25)


@pytest.mark.parametrize("change", [{"llama.rope.scaling.factor": 0.0},
                                    {"llama.rope.scaling.original_context_length": -1}])
def test_bad_yarn_metadata_is_a_clear_error(change):
    with pytest.raises(GGUFError, match="bad llama metadata: yarn rope scaling"):
        ModelConfig.from_metadata(META | YARN | change)


def test_unknown_rope_scaling_is_refused():
    with pytest.raises(GGUFError, match="unsupported rope scaling type 'longrope'"):
        ModelConfig.from_metadata(META | {"llama.rope.scaling.type": "longrope",
                                          "llama.rope.scaling.factor": 4.0})


def test_unknown_architecture():
    with pytest.raises(GGUFError, match="unsupported architecture 'mamba'"):
        ModelConfig.from_metadata(META | {"general.architecture": "mamba"})


def test_tiny_gemma3(tiny):
    c = tiny("tiny-gemma3")
    assert c.arch == "gemma3" and c.rope_neox and c.has_qk_norm and c.tied_embeddings
    assert c.has_post_norms and c.ffn_gelu and c.embedding_scale == pytest.approx(16.0)
    assert c.sliding_window == 8 and c.swa_layers == (True,) * 5 + (False,)
    assert (c.rope_base, c.rope_base_swa) == (1e6, 10000.0)
    assert "blk.5.post_attention_norm.weight" in c.required_tensors()
    assert "blk.5.post_ffw_norm.weight" in c.required_tensors()


GEMMA3 = {k.replace("llama.", "gemma3."): v for k, v in META.items()} | {
    "general.architecture": "gemma3", "gemma3.block_count": 12, "gemma3.attention.sliding_window": 512}


def test_gemma3_every_sixth_layer_is_global():
    c = ModelConfig.from_metadata(GEMMA3)
    assert [i for i in range(12) if not c.is_sliding(i)] == [5, 11]
    assert c.rope_base_swa == 10000.0 and c.embedding_scale == 8.0


def test_gemma3_pattern_and_local_base_from_the_file():
    c = ModelConfig.from_metadata(GEMMA3 | {"gemma3.attention.sliding_window_pattern": 3,
                                            "gemma3.rope.freq_base_swa": 5000.0})
    assert [i for i in range(12) if not c.is_sliding(i)] == [2, 5, 8, 11] and c.rope_base_swa == 5000.0
    flags = [True, False] * 6
    c = ModelConfig.from_metadata(GEMMA3 | {"gemma3.attention.sliding_window_pattern": flags})
    assert list(c.swa_layers) == flags


def test_gemma3_without_a_window_has_no_local_layers():
    c = ModelConfig.from_metadata({k: v for k, v in GEMMA3.items() if "sliding_window" not in k})
    assert c.sliding_window == 0 and not any(c.is_sliding(i) for i in range(12))


def test_gemma3_linear_rope_scaling_is_for_global_layers_only():
    """llama.cpp scales the frequency of global layers only (Gemma 3 4B and larger: factor 8)."""
    c = ModelConfig.from_metadata(GEMMA3 | {"gemma3.rope.scaling.type": "linear", "gemma3.rope.scaling.factor": 8.0})
    assert c.layer_rope_freq_factors(5) == (8.0,) * 8 and c.layer_rope_freq_factors(0) is None


def test_gemma3_yarn_is_for_global_layers_only():
    c = ModelConfig.from_metadata(GEMMA3 | {k.replace("llama.", "gemma3."): v for k, v in YARN.items()})
    assert c.layer_rope_freq_factors(0) is None and c.layer_attention_scale(0) is None
    assert c.layer_rope_freq_factors(5) == c.rope_freq_factors and c.layer_attention_scale(5) > c.head_dim ** -0.5


def test_gemma3_final_logit_softcapping_is_refused():
    with pytest.raises(GGUFError, match="soft-capping"):
        ModelConfig.from_metadata(GEMMA3 | {"gemma3.final_logit_softcapping": 30.0})


def test_gemma3_27b_scales_scores_by_embd_per_head():
    """Gemma 3 27B (62 layers, 5376 wide, 32 heads of 128): query_pre_attn_scalar = 5376 / 32."""
    big = GEMMA3 | {"gemma3.block_count": 62, "gemma3.embedding_length": 5376, "gemma3.attention.head_count": 32,
                    "gemma3.attention.key_length": 128}
    assert ModelConfig.from_metadata(big).attention_scale == pytest.approx(168 ** -0.5)
    assert AttentionShape.from_config(ModelConfig.from_metadata(big), 64, 5).scale == pytest.approx(168 ** -0.5)
    assert AttentionShape.from_config(ModelConfig.from_metadata(GEMMA3), 64, 5).scale == pytest.approx(16 ** -0.5)
