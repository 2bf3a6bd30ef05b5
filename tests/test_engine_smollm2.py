"""SmolLM2-135M-Instruct (real weights, Q4_1) on the GPU engine against llama-cpp-python goldens
(tests/golden/refmodel/smollm2.npz, written by tests/tools/make_refmodel_goldens.py).

Two llama.cpp references are stored: the file as shipped (llama.cpp's CPU backend quantizes
activations to 8 bits inside its matmuls) and `exact_*` (the same weights dequantized to F32,
F32 KV cache: float maths throughout, as our shaders do). Greedy continuations must equal the
as-shipped ones except where its top-2 logits were within 0.05 of each other, and the exact
ones everywhere; last-position logits are compared with stated tolerances."""
import numpy as np
import pytest

from tests.llama_golden import Golden
from worker.engine.engine import Engine

GOLDEN = Golden("smollm2", eos=2)
PROMPTS = GOLDEN.prompts


@pytest.fixture(scope="module")
def engine(smollm2_path, vk_session):
    engine = Engine.load(smollm2_path, n_ctx=256, ctx=vk_session, max_batch=64)
    yield engine
    engine.close()


@pytest.mark.parametrize("i", PROMPTS)
def test_tokenization_matches_llama_cpp(engine, i):
    GOLDEN.check_tokenization(engine, i)


@pytest.fixture(scope="module")
def continuations(engine):
    return GOLDEN.continuations(engine)


@pytest.mark.parametrize("i", PROMPTS)
def test_greedy_matches_llama_cpp_in_float(continuations, i):
    assert continuations[i] == GOLDEN.greedy(f"p{i}_exact_greedy")


@pytest.mark.parametrize("i", PROMPTS)
def test_greedy_matches_llama_cpp_as_shipped(continuations, i):
    GOLDEN.check_as_shipped(continuations[i], i)


@pytest.mark.parametrize("i", [0, 2])
def test_last_logits_match_llama_cpp_float(engine, i):
    ids = GOLDEN[f"p{i}_tokens"].tolist()
    ours = engine.logits(ids)[-1]
    exact = GOLDEN[f"p{i}_exact_last"]
    assert np.abs(ours - exact).max() < 0.02 * np.abs(exact).max()
    shipped = GOLDEN[f"p{i}_last"].astype(np.float32)
    assert np.corrcoef(ours, shipped)[0, 1] > 0.99
