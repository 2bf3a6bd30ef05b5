"""Mixture-of-experts models (tiny synthetic qwen3moe, qwen2moe and gpt-oss files) through the GPU engine:
against the numpy reference (tests/refmodel.py), against llama.cpp (tests/golden/refmodel/moe.npz,
written by tests/tools/make_moe_goldens.py with xllamacpp: its full distribution at every step of
its greedy continuation; tiny-gpt-oss-yarn adds gpt-oss's YaRN rope scaling), chunked prefill
against one pass, and `vkllm models inspect`."""
import dataclasses
import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from refmodel import logits as reference_logits

from tests.kernel_io import own_context
from tests.test_engine import _model, assert_chunked_then_decoded, reference_error
from worker.engine.engine import Engine
from worker.engine.kernels import experts
from worker.engine.kernels.paths import MAT_VEC_MAX_COLS
from worker.engine.modelfile import ModelFile
from worker.tools.synth import write_model

GOLDEN = np.load(Path(__file__).parent / "golden" / "refmodel" / "moe.npz")
GOLDEN_CASES = sorted({tuple(k.split("__")[:2]) for k in GOLDEN.files})


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("moe")


@pytest.fixture
def float_ctx(vk_ctx, vk_settings):
    """vk_ctx, or where prefill takes the 8-bit expert tiles (a GPU whose dense products take the
    cooperative-matrix kernel: kernels/experts.py's path) a context whose prefill takes the tiled
    kernel, f32 throughout as conftest.py's decode. These tests hold the float paths' 2e-3 over
    20 and more tokens, where the tiny random routers have near-ties that 8-bit rounding tips
    (tiny-gpt-oss-yarn: 40% of its logits off through the mmq tiles on an H200); the 8-bit
    expert paths have their own tests and tolerance (test_engine_moe_mm.py, test_engine_decode_x8.py)."""
    if experts.path(vk_ctx, MAT_VEC_MAX_COLS + 1) != "mmq":
        yield vk_ctx
        return
    with own_context(dataclasses.replace(vk_settings, prefill_kernel="tiled")) as ctx:
        yield ctx


def _log_softmax(logits):
    top = logits.max(-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


@pytest.mark.parametrize("preset,mix", [("tiny-qwen3moe", "Q4_K_M"), ("tiny-qwen3moe", "Q6_K"),
                                        ("tiny-qwen2moe", "Q4_K_M"), ("tiny-gpt-oss", "MXFP4_MOE"), ("tiny-gpt-oss", "Q4_0"),
                                        ("tiny-gpt-oss-yarn", "MXFP4_MOE")])
def test_logits_match_numpy_reference(float_ctx, synth_dir, preset, mix):
    """20 tokens: past tiny-gpt-oss's 8-position window, and every expert chosen by some token."""
    err = reference_error(float_ctx, _model(synth_dir, preset, mix), 20, 32)
    assert err < 2e-3, f"max relative logit error {err:.2e}"


@pytest.mark.parametrize("preset,mix", [c for c in GOLDEN_CASES if c[1] == "F32"])
def test_numpy_reference_matches_llama_cpp(synth_dir, preset, mix):
    """The reference itself (its routing, and rope_yarn written from ggml) against llama.cpp's
    float32 log-probabilities over the same weights."""
    key = f"{preset}__{mix}__"
    path = write_model(preset, synth_dir / f"golden-{preset}-{mix}.gguf", mix=mix, seed=0)
    prompt, greedy, theirs = GOLDEN[key + "tokens"].tolist(), GOLDEN[key + "greedy"].tolist(), GOLDEN[key + "logprobs"]
    ref = reference_logits(ModelFile.open(path), prompt + greedy[:-1])[len(prompt) - 1:]
    assert np.abs(_log_softmax(ref) - theirs).max() < 1e-4 * np.abs(ref).max()
    assert (ref.argmax(-1) == greedy).all()


@pytest.mark.parametrize("preset,mix", GOLDEN_CASES)
def test_tiny_moe_models_match_llama_cpp(float_ctx, synth_dir, preset, mix):
    """At every step of llama.cpp's greedy continuation (fed to us as a prompt), our
    log-probabilities over the whole vocabulary equal llama.cpp's float32 ones within the
    tolerance of the other families' logits, and our best token is its, or the two nearly tie."""
    key = f"{preset}__{mix}__"
    path = write_model(preset, synth_dir / f"golden-{preset}-{mix}.gguf", mix=mix, seed=0)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(GOLDEN[key + "sha256"])
    prompt, greedy, theirs = GOLDEN[key + "tokens"].tolist(), GOLDEN[key + "greedy"].tolist(), GOLDEN[key + "logprobs"]
    engine = Engine.load(path, n_ctx=96, ctx=float_ctx, max_batch=64)
    try:
        logits = engine.logits(prompt + greedy[:-1])[len(prompt) - 1:]
    finally:
        engine.close()
    ours = _log_softmax(logits.astype(np.float64))
    assert np.abs(ours - theirs).max() < 2e-3 * np.abs(logits).max()
    for step, best in enumerate(ours.argmax(-1)):
        top2 = np.sort(theirs[step])[::-1][:2]
        assert best == greedy[step] or top2[0] - top2[1] < 0.05, f"step {step}: ours {best}, llama.cpp {greedy[step]}"


@pytest.mark.parametrize("preset,mix", [("tiny-qwen3moe", "Q8_0"), ("tiny-qwen2moe", "Q8_0"),
                                        ("tiny-gpt-oss", "MXFP4_MOE"), ("tiny-gpt-oss-yarn", "MXFP4_MOE")])
def test_chunked_prefill_and_decode_match_one_pass(float_ctx, synth_dir, preset, mix):
    """20 tokens prefilled in chunks of 6, then 4 decoded one by one: the reference's logits at
    every step (gpt-oss's local layers slide past their 8 positions meanwhile)."""
    path = _model(synth_dir, preset, mix)
    model_file = ModelFile.open(path)
    ids = np.random.default_rng(5).integers(0, model_file.config.vocab_size, 24).tolist()
    ref = reference_logits(model_file, ids)
    assert_chunked_then_decoded(float_ctx, path, ids, ref, 20, 6, 2e-3 * np.abs(ref).max())


def inspect(path) -> str:
    done = subprocess.run([sys.executable, "-c", "import sys; from vkllm.cli import main; sys.exit(main())",
                           "models", "inspect", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_inspect_shows_the_experts(synth_dir):
    path = _model(synth_dir, "tiny-qwen3moe", "Q8_0")
    shown = inspect(path)
    assert "experts         2 of 8 per token, 256 rows each, weights softmax, renormalised\n" in shown
    # the plan counts every expert's weights, chosen or not
    model = ModelFile.open(path)
    expert_bytes = sum(t.n_bytes for name, t in model.tensors.items() if "_exps." in name)
    assert expert_bytes > sum(t.n_bytes for t in model.tensors.values()) / 2
    total = sum(t.n_bytes for t in model.tensors.values())
    assert f"weights {total / 2**20:.2f} MiB" in shown


def test_inspect_shows_the_shared_expert(synth_dir):
    """A qwen2moe file: softmax weights not renormalised, and the shared expert's width."""
    shown = inspect(_model(synth_dir, "tiny-qwen2moe", "Q8_0"))
    assert "architecture    qwen2moe\n" in shown
    assert "experts         2 of 8 per token, 256 rows each, weights softmax, shared expert of 384 rows\n" in shown
