"""ModelConfig of the mixture-of-experts families from GGUF metadata (as llama.cpp reads it):
the tiny synthetic qwen3moe, qwen2moe and gpt-oss files, and files that the expert kernels cannot run
refused with one line."""
import dataclasses
import math

import pytest
from gguf import GGMLQuantizationType as T

from tests.test_config import META
from worker.engine.errors import GGUFError
from worker.engine.modelfile import ModelFile
from worker.engine.models.config import ModelConfig
from worker.tools.synth import write_model


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cfg-moe")
    return lambda preset: ModelFile.open(write_model(preset, folder / f"{preset}.gguf", "Q8_0"))


def test_tiny_qwen3moe(files):
    c = files("tiny-qwen3moe").config
    assert (c.n_expert, c.n_expert_used, c.n_ff_exp) == (8, 2, 256)
    assert c.expert_weights_norm and not c.expert_softmax_chosen and not c.ffn_oai
    assert c.has_qk_norm and c.rope_neox and not c.has_attn_sinks and not c.sliding_window
    required = c.required_tensors()
    assert "blk.1.ffn_down_exps.weight" in required and "blk.1.ffn_down.weight" not in required


def test_tiny_qwen2moe(files):
    c = files("tiny-qwen2moe").config
    assert (c.n_expert, c.n_expert_used, c.n_ff_exp, c.n_ff_shexp) == (8, 2, 256, 384)
    assert not c.expert_weights_norm and not c.expert_softmax_chosen and not c.ffn_oai
    assert c.has_qkv_bias and c.rope_neox and not c.has_qk_norm
    required = set(c.required_tensors())
    assert {"blk.1.ffn_gate_inp_shexp.weight", "blk.1.ffn_up_shexp.weight", "blk.1.ffn_down_shexp.weight",
            "blk.1.ffn_down_exps.weight", "blk.1.attn_q.bias"} <= required


def test_tiny_gpt_oss(files):
    c = files("tiny-gpt-oss").config
    assert (c.n_expert, c.n_expert_used) == (8, 2) and c.expert_softmax_chosen and not c.expert_weights_norm
    assert c.ffn_oai and c.has_attn_sinks and c.has_attn_out_bias and c.has_qkv_bias
    assert c.swa_layers == (True, False, True, False) and c.sliding_window == 8   # pattern 2: even layers local
    assert c.rope_base_swa == c.rope_base == 150000.0                           # one base for all layers
    assert c.ffn_norm == "post_attention_norm"
    required = c.required_tensors()
    assert {"blk.3.attn_sinks.weight", "blk.3.ffn_down_exps.bias", "blk.3.attn_output.bias"} <= set(required)


def test_tiny_gpt_oss_yarn_scales_every_layer(files):
    """gpt-oss's local layers rotate with YaRN as its global ones (llama.cpp: one rope for all)."""
    c = files("tiny-gpt-oss-yarn").config
    assert c.rope_yarn.factor == 8.0 and c.rope_yarn.original_context == 256
    assert all(c.layer_rope_freq_factors(i) == c.rope_freq_factors for i in range(4))
    assert len({c.layer_attention_scale(i) for i in range(4)}) == 1
    assert c.layer_attention_scale(0) == pytest.approx(64 ** -0.5 * (1 + 0.1 * math.log(8.0)) ** 2)


MOE = {k.replace("llama.", "qwen3moe."): v for k, v in META.items()} | {
    "general.architecture": "qwen3moe", "qwen3moe.expert_count": 8, "qwen3moe.expert_used_count": 2,
    "qwen3moe.expert_feed_forward_length": 32}


@pytest.mark.parametrize("used, count", [(0, 8), (9, 8), (33, 64), (8, 1024)])
def test_expert_counts_the_kernels_cannot_run_are_refused(used, count):
    meta = MOE | {"qwen3moe.expert_used_count": used, "qwen3moe.expert_count": count}
    with pytest.raises(GGUFError, match="experts used of"):
        ModelConfig.from_metadata(meta)


def test_missing_expert_keys_are_named():
    meta = {k: v for k, v in MOE.items() if k != "qwen3moe.expert_feed_forward_length"}
    with pytest.raises(GGUFError, match="expert_feed_forward_length' is missing"):
        ModelConfig.from_metadata(meta)


def test_expert_tensor_of_the_wrong_shape_or_types_is_refused(files):
    model = files("tiny-qwen3moe")
    tensors = dict(model.tensors)
    up = tensors["blk.1.ffn_up_exps.weight"]
    wrong = tensors | {up.name: dataclasses.replace(up, shape=(up.shape[0], up.shape[1], 4))}
    with pytest.raises(GGUFError, match=r"'blk.1.ffn_up_exps.weight' has shape \(256, 256, 4\), expected \(256, 256, 8\)"):
        model.config.check_tensors(wrong)
    other = tensors | {up.name: dataclasses.replace(up, ggml_type=T.F16)}
    with pytest.raises(GGUFError, match="layer 1: ffn_gate_exps and ffn_up_exps differ in type"):
        model.config.check_tensors(other)


def test_shared_expert_width_defaults_to_feed_forward_length():
    """As llama.cpp's qwen2moe loader: n_ff_shexp is feed_forward_length where the file has no
    expert_shared_feed_forward_length; families without a shared expert have none."""
    meta = {k.replace("qwen3moe.", "qwen2moe."): v for k, v in MOE.items()} | {"general.architecture": "qwen2moe"}
    assert ModelConfig.from_metadata(meta).n_ff_shexp == 128
    assert ModelConfig.from_metadata(meta | {"qwen2moe.expert_shared_feed_forward_length": 48}).n_ff_shexp == 48
    assert ModelConfig.from_metadata(MOE | {"qwen3moe.expert_shared_feed_forward_length": 48}).n_ff_shexp == 0


def test_shared_expert_of_the_wrong_shape_is_refused(files):
    model = files("tiny-qwen2moe")
    tensors = dict(model.tensors)
    down = tensors["blk.0.ffn_down_shexp.weight"]
    wrong = tensors | {down.name: dataclasses.replace(down, shape=(256, 256))}
    with pytest.raises(GGUFError, match=r"'blk.0.ffn_down_shexp.weight' has shape \(256, 256\), expected \(384, 256\)"):
        model.config.check_tensors(wrong)
    # its gate is one row: [n_embd] or [n_embd, 1], not a row per expert
    gate = tensors["blk.0.ffn_gate_inp_shexp.weight"]
    model.config.check_tensors(tensors | {gate.name: dataclasses.replace(gate, shape=(256, 1))})
    with pytest.raises(GGUFError, match=r"'blk.0.ffn_gate_inp_shexp.weight' has shape \(256, 8\), expected \(256,\)"):
        model.config.check_tensors(tensors | {gate.name: dataclasses.replace(gate, shape=(256, 8))})
