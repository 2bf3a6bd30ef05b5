"""Sampling against a plain re-implementation of llama.cpp's sampler chain written here, and
stop strings."""
import math

import numpy as np
import pytest

from vkllm.errors import VkllmError
from worker.engine.sampling import Sampler, SamplingParams, StopMatcher

VOCAB = 1000


def random_logits(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(scale=3.0, size=VOCAB).astype(np.float32)


def reference(logits, params: SamplingParams, history) -> dict[int, float]:
    """Token -> probability after llama.cpp's chain: penalties, top-k, top-p, min-p, temperature."""
    z = [float(x) for x in logits]
    window = history[-params.repeat_last_n:] if params.repeat_last_n else []
    for tok in set(window):
        count = window.count(tok)
        z[tok] = z[tok] * params.repeat_penalty if z[tok] <= 0 else z[tok] / params.repeat_penalty
        z[tok] -= count * params.frequency_penalty + params.presence_penalty
    if params.temperature <= 0 or params.top_k == 1:
        return {max(range(len(z)), key=lambda i: (z[i], -i)): 1.0}
    ranked = sorted(range(len(z)), key=lambda i: (-z[i], i))
    if params.top_k > 0:
        ranked = ranked[:params.top_k]

    def probs(tokens, temperature=1.0):
        weights = [math.exp((z[t] - z[tokens[0]]) / temperature) for t in tokens]
        return [w / sum(weights) for w in weights]

    if params.top_p < 1:
        total, kept = 0.0, []
        for tok, p in zip(ranked, probs(ranked)):
            kept.append(tok)
            total += p
            if total >= params.top_p:
                break
        ranked = kept
    if params.min_p > 0:
        p = probs(ranked)
        ranked = [t for t, q in zip(ranked, p) if q >= params.min_p * p[0]]
    return dict(zip(ranked, probs(ranked, params.temperature)))


def candidates(sampler, logits, history, ids=None) -> dict[int, float]:
    ids = np.arange(VOCAB) if ids is None else ids
    toks, probs = sampler.candidates(ids, logits, history)
    return dict(zip(toks.tolist(), probs.tolist()))


PENALTIES = dict(repeat_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.3, repeat_last_n=8)


@pytest.mark.parametrize("params", [
    SamplingParams(),
    SamplingParams(top_k=0, top_p=0.5, min_p=0.0, temperature=1.0),
    SamplingParams(top_k=5, top_p=1.0, min_p=0.0, temperature=0.7),
    SamplingParams(top_k=0, top_p=1.0, min_p=0.2, temperature=1.5),
    SamplingParams(top_k=100, top_p=0.9, min_p=0.01, **PENALTIES),
    SamplingParams(temperature=0.0, **PENALTIES),
], ids=["defaults", "top_p", "top_k", "min_p", "all+penalties", "greedy+penalties"])
def test_candidates_match_reference(params):
    history = [3, 3, 17, 999, 3, 42, 17, 5, 0, 0, 1]
    for seed in range(5):
        logits = random_logits(seed)
        ours = candidates(Sampler(params, VOCAB), logits, history)
        ref = reference(logits, params, history)
        assert list(ours) == list(ref)
        assert np.allclose(list(ours.values()), list(ref.values()), rtol=1e-6)


def test_ties_at_the_top_k_boundary_keep_the_lowest_ids():
    logits = np.random.default_rng(5).integers(0, 4, size=VOCAB).astype(np.float32)  # many ties
    params = SamplingParams(top_k=50, top_p=1.0, min_p=0.0, temperature=1.0)
    ours = candidates(Sampler(params, VOCAB), logits, [])
    assert list(ours) == list(reference(logits, params, []))


def test_min_tokens_passes_over_end_tokens_until_that_many_are_drawn():
    """The draws before min_tokens take the best token that is no end token; later ones the
    argmax, an end token too."""
    logits = random_logits(0)
    eog = [int(i) for i in np.argsort(-logits)[:2]]
    sampler = Sampler(SamplingParams(temperature=0.0, min_tokens=3), VOCAB, eog)
    other = np.where(np.isin(np.arange(VOCAB), eog), -np.inf, logits)
    assert [sampler.sample(logits, []) for _ in range(4)] == [int(np.argmax(other))] * 3 + [eog[0]]


def test_min_tokens_a_grammar_cannot_meet_is_an_error_naming_it():
    """Where a grammar's mask left only an end token (every other logit -inf) before min_tokens,
    the draw fails with MinTokensUnmet, greedy or sampled, rather than pick a token the grammar
    refuses."""
    from worker.engine.errors import MinTokensUnmet
    ended = np.full(VOCAB, -np.inf, dtype=np.float32)
    ended[7] = 2.0
    for params in (dict(temperature=0.0), dict(temperature=1.0, top_k=0, seed=1),
                   dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, seed=2)):
        sampler = Sampler(SamplingParams(**params, min_tokens=5), VOCAB, [3, 7])
        sampler.sample(random_logits(1), []), sampler.sample(random_logits(2), [])
        with pytest.raises(MinTokensUnmet) as raised:
            sampler.sample(ended, [])
        assert str(raised.value) == ("min_tokens=5 cannot be met: the output's grammar (response_format or "
                                     "tool_choice) is complete after 2 tokens"), params


def test_greedy_is_argmax():
    for seed in range(20):
        logits = random_logits(seed)
        for params in (SamplingParams(temperature=0.0), SamplingParams(top_k=1, temperature=1.0)):
            assert Sampler(params, VOCAB).sample(logits, [1, 2, 3]) == int(np.argmax(logits))


def test_penalties_change_exactly_the_recent_tokens():
    logits = np.array([2.0, -1.0, 0.5, 3.0, 0.0, 1.0], dtype=np.float32)
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=2.0,
                            presence_penalty=0.25, frequency_penalty=0.5, repeat_last_n=4)
    history = [3, 0, 1, 1, 4]           # token 3 is outside the last 4
    toks, probs = Sampler(params, 6).candidates(np.arange(6), logits, history)
    penalized = dict(zip(toks.tolist(), np.log(probs)))
    expected = {0: 2.0 / 2 - 0.5 - 0.25,      # positive: divided; seen once
                1: -1.0 * 2 - 2 * 0.5 - 0.25,  # negative: multiplied; seen twice
                2: 0.5, 3: 3.0,               # not in the window
                4: 0.0 * 2 - 0.5 - 0.25, 5: 1.0}
    shift = penalized[5] - expected[5]
    for tok, value in expected.items():
        assert penalized[tok] - shift == pytest.approx(value, abs=1e-9)


def test_top_k_candidates_read_back_give_the_same_choice():
    params = SamplingParams(top_k=20, seed=7)
    logits = random_logits(3)
    top = np.argsort(-logits)[:64]
    assert candidates(Sampler(params, VOCAB), logits[top], [], ids=top) == \
        pytest.approx(candidates(Sampler(params, VOCAB), logits, []))
    full, subset = Sampler(params, VOCAB), Sampler(params, VOCAB)
    assert [full.sample(logits, []) for _ in range(30)] == \
        [subset.sample_candidates(top, logits[top], []) for _ in range(30)]


def test_same_seed_same_tokens_other_seed_other_tokens():
    logits = random_logits(11)
    params = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=1234)
    a, b = Sampler(params, VOCAB), Sampler(params, VOCAB)
    c = Sampler(SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=4321), VOCAB)
    seq_a = [a.sample(logits, []) for _ in range(40)]
    assert seq_a == [b.sample(logits, []) for _ in range(40)]
    assert seq_a != [c.sample(logits, []) for _ in range(40)]


def test_draws_follow_the_probabilities():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0), 4)
    counts = np.bincount([sampler.sample(logits, []) for _ in range(20000)], minlength=4)
    assert np.allclose(counts / 20000, [0.5, 0.3, 0.15, 0.05], atol=0.015)


@pytest.mark.parametrize("params, greedy, full", [
    (SamplingParams(temperature=0.0), True, False),
    (SamplingParams(top_k=1), True, False),
    (SamplingParams(temperature=0.0, repeat_penalty=1.1), True, True),
    (SamplingParams(temperature=0.0, repeat_penalty=1.1, repeat_last_n=0), True, False),
    (SamplingParams(), False, True),
    (SamplingParams(temperature=0.0, min_tokens=2), True, True),
    (SamplingParams(temperature=0.0, ignore_eos=True), True, False),
])
def test_greedy_and_full_logits_flags(params, greedy, full):
    assert (params.is_greedy, params.needs_full_logits) == (greedy, full)


@pytest.mark.parametrize("field, value, message", [
    ("temperature", -0.1, r"temperature must be a number in \[0.0, inf\)"),
    ("top_k", -1, r"top_k must be an integer in \[0, inf\)"),
    ("top_k", 2.5, "top_k must be an integer"),
    ("top_p", 0.0, r"top_p must be a number in \(0.0, 1.0\]"),
    ("top_p", 1.5, "top_p must be"),
    ("min_p", -0.5, r"min_p must be a number in \[0.0, 1.0\]"),
    ("repeat_penalty", 0.0, r"repeat_penalty must be a number in \(0.0, inf\)"),
    ("presence_penalty", 3.0, r"presence_penalty must be a number in \[-2.0, 2.0\]"),
    ("frequency_penalty", float("nan"), "frequency_penalty must be"),
    ("max_tokens", 0, r"max_tokens must be an integer in \[1, inf\)"),
    ("seed", -5, "seed must be an integer"),
    ("stop", ("ok", ""), "stop must be a list of non-empty strings"),
    ("min_tokens", -1, r"min_tokens must be an integer in \[0, inf\)"),
    ("min_tokens", 129, r"min_tokens \(129\) must not be above max_tokens \(128\)"),
    ("ignore_eos", 1, "ignore_eos must be true or false"),
])
def test_bad_params_name_the_field_and_range(field, value, message):
    with pytest.raises(VkllmError, match=message):
        SamplingParams(**{field: value})


def test_stop_list_becomes_a_tuple():
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")
    assert SamplingParams(stop="END").stop == ("END",)
    assert SamplingParams(stop=None).stop == ()


def push_all(matcher, chunks):
    out, stopped = [], False
    for chunk in chunks:
        text, stopped = matcher.push(chunk)
        out.append(text)
    return out, stopped


def test_stop_string_split_across_pushes():
    m = StopMatcher(["</end>"])
    out, stopped = push_all(m, ["Hello </", "en", "d> ignored", "more"])
    assert out == ["Hello ", "", "", ""] and stopped
    assert m.flush() == ""


def test_held_back_prefix_is_released_when_it_does_not_complete():
    m = StopMatcher(["STOP"])
    assert m.push("go ST") == ("go ", False)
    assert m.push("ART") == ("START", False)
    assert m.push(" S") == (" ", False)
    assert m.flush() == "S"


def test_earliest_of_several_stop_strings_wins():
    m = StopMatcher(["world", "lo w"])
    assert m.push("hello world") == ("hel", True)
    assert m.push("after") == ("", True)


def test_overlapping_prefixes_hold_the_longest_candidate():
    m = StopMatcher(["abcd", "bcx"])
    assert m.push("zabc") == ("z", False)      # "abc" could still become "abcd"
    assert m.push("x") == ("a", True)          # ...but "bcx" completes first


def test_no_stop_strings_pass_everything_through():
    m = StopMatcher([])
    assert m.push("anything") == ("anything", False)
    assert m.flush() == ""
