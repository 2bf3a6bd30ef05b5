"""gemma-3-270m (real weights, Q4_K_M: Q5_0, Q4_K, Q8_0, Q6_K) on the GPU engine against
llama-cpp-python goldens (tests/golden/refmodel/gemma3_270m.npz, written by
tests/tools/make_refmodel_goldens.py --gemma3), as test_engine_smollm2.py does for SmolLM2.

The last prompt is 802 tokens, past the model's 512-position sliding window, and is prefilled
in chunks of 64: its local layers must mask what slid out of the window, in prefill and decode."""
import numpy as np
import pytest

from tests.llama_golden import Golden, first_difference
from worker.engine.engine import Engine
from worker.engine.vk.context import Context

GOLDEN = Golden("gemma3_270m", eos=1)
PROMPTS = GOLDEN.prompts


@pytest.fixture(scope="module")
def gemma_ctx(vk_settings):
    """A context of its own: the 171 MB embedding table takes a pool block of its own, which
    would otherwise stay in the session context's pool for the tests after these."""
    ctx = Context(vk_settings, block_size=64 << 20)
    yield ctx
    errors = ctx.validation.errors if ctx.validation else []
    ctx.close()
    assert errors == [], "Vulkan validation errors"


@pytest.fixture(scope="module")
def engine(gemma3_270m_path, gemma_ctx):
    engine = Engine.load(gemma3_270m_path, n_ctx=1024, ctx=gemma_ctx, max_batch=64)
    yield engine
    engine.close()


def test_the_long_prompt_is_past_the_sliding_window(engine):
    assert engine.model.config.sliding_window == 512
    assert len(GOLDEN["p4_tokens"]) > engine.model.config.sliding_window + 256


@pytest.mark.parametrize("i", PROMPTS)
def test_tokenization_matches_llama_cpp(engine, i):
    GOLDEN.check_tokenization(engine, i)


@pytest.fixture(scope="module")
def continuations(engine):
    return GOLDEN.continuations(engine)


@pytest.mark.parametrize("i", PROMPTS)
def test_greedy_matches_llama_cpp_in_float(continuations, i):
    """Equal to llama.cpp's float32 run, or parting from it only where its two best logits were
    within 0.05 (quantized weights leave near-ties that rounding order decides)."""
    ours, exact = continuations[i], GOLDEN.greedy(f"p{i}_exact_greedy")
    step = first_difference(ours, exact)
    if step is not None:
        top2 = GOLDEN[f"p{i}_exact_top2"][step]
        assert top2[0] - top2[1] < 0.05, f"prompt {i}: ours {ours} llama.cpp {exact}, diverging at step {step}"


@pytest.mark.parametrize("i", PROMPTS)
def test_greedy_matches_llama_cpp_as_shipped(continuations, i):
    GOLDEN.check_as_shipped(continuations[i], i)


@pytest.mark.parametrize("i", [2, 4])
def test_last_logits_match_llama_cpp_float(gemma3_270m_path, gemma_ctx, i):
    """Prefill in chunks of 64 (the long prompt: 13 chunks), then the last position's logits."""
    ids = GOLDEN[f"p{i}_tokens"].tolist()
    engine = Engine.load(gemma3_270m_path, n_ctx=1024, ctx=gemma_ctx, max_batch=64)
    try:
        engine.runner.prefill(ids, 0, 64, select="logits")
        ours = engine.runner.read_logits().copy()
    finally:
        engine.close()
    exact = GOLDEN[f"p{i}_exact_last"].astype(np.float32)
    assert np.abs(ours - exact).max() < 0.02 * np.abs(exact).max()
    if f"p{i}_last" in GOLDEN:
        assert np.corrcoef(ours, GOLDEN[f"p{i}_last"].astype(np.float32))[0, 1] > 0.99
