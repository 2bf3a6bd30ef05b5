"""Per-token logprobs from the engine against numpy's log-softmax of the engine's own logits
for the same tokens (Engine.logits: one pass over prompt + generated ids)."""
import numpy as np
import pytest

from worker.engine.engine import Engine
from worker.engine.sampling import SamplingParams


@pytest.fixture(scope="module")
def engine(vk_session, tiny_model):
    e = Engine.load(tiny_model, n_ctx=128, ctx=vk_session, max_batch=64)
    yield e
    e.close()


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def run(engine, prompt_ids, params, logprobs):
    events = [e for e in engine.generate_ids(prompt_ids, params, logprobs=logprobs) if e.token_id is not None]
    return [e.token_id for e in events], [e.logprobs for e in events]


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.9, seed=5, max_tokens=8),
                                    SamplingParams(temperature=0, max_tokens=8),
                                    SamplingParams(temperature=0.7, seed=1, repeat_penalty=1.3, max_tokens=8)],
                         ids=["sampled", "greedy", "penalties"])
def test_logprobs_are_the_log_softmax_of_the_logits(engine, params):
    prompt = engine.tokenizer.encode("Once upon a time there was")
    tokens, logprobs = run(engine, prompt, params, 5)
    assert len(tokens) == 8 and all(lp is not None for lp in logprobs)
    ref = log_softmax(engine.logits(prompt + tokens))[len(prompt) - 1:-1]   # row k predicts token k
    for row, token, lp in zip(ref, tokens, logprobs):
        assert lp.logprob == pytest.approx(row[token], abs=1e-3)
        best = np.argsort(-row, kind="stable")[:5]
        assert [t for t, _ in lp.top] == best.tolist()
        np.testing.assert_allclose([v for _, v in lp.top], row[best], atol=1e-3)
        assert all(a >= b for (_, a), (_, b) in zip(lp.top, lp.top[1:]))


def test_asking_for_logprobs_changes_no_token(engine):
    """Logprobs read the whole logits row instead of the GPU's argmax or top-k: the same tokens."""
    prompt = engine.tokenizer.encode("The little dog")
    for params in (SamplingParams(temperature=0, max_tokens=10), SamplingParams(temperature=0.8, seed=3, max_tokens=10)):
        plain, none = run(engine, prompt, params, None)
        assert none == [None] * len(plain)
        assert run(engine, prompt, params, 0)[0] == plain


def test_zero_alternatives_still_gives_each_token_its_logprob(engine):
    prompt = engine.tokenizer.encode("Hello")
    tokens, logprobs = run(engine, prompt, SamplingParams(temperature=0.5, seed=2, max_tokens=4), 0)
    ref = log_softmax(engine.logits(prompt + tokens))[len(prompt) - 1:-1]
    assert [lp.top for lp in logprobs] == [()] * 4
    np.testing.assert_allclose([lp.logprob for lp in logprobs], ref[np.arange(4), tokens], atol=1e-3)
