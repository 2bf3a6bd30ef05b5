"""ignore_eos and min_tokens (vLLM's and llama.cpp server's sampling parameters) on SmolLM2-135M,
through Engine.generate and the batch: the same request with and without, and at the position
where the model ends, the token min_tokens takes instead is the argmax of Engine.logits over
the tokens that do not end a generation."""
import numpy as np
import pytest

from worker.engine.batch import Request
from worker.engine.engine import Engine
from worker.engine.sampling import SamplingParams

GREEDY = dict(temperature=0.0, max_tokens=40)


@pytest.fixture(scope="module")
def engine(smollm2_path, vk_session):
    engine = Engine.load(smollm2_path, n_ctx=256, ctx=vk_session, max_batch=64)   # Engine.logits of the whole text: one pass
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def prompt(engine):
    return engine.tokenizer.encode(engine.render_chat([{"role": "user", "content": "Say hello."}], None))


def generate(engine, ids, via_batch, **params):
    """(token ids, finish reason, generated count) of one greedy generation."""
    params = SamplingParams(**GREEDY | params)
    if via_batch:
        seq, events = engine.batch.add(Request(ids, params)), []
        while not seq.done:
            events += [event for s, event in engine.batch.step() if s is seq]
    else:
        events = list(engine.generate_ids(ids, params))
    return [e.token_id for e in events if e.token_id is not None], events[-1].finish_reason, \
        events[-1].timings.generated_tokens


@pytest.mark.parametrize("via_batch", [False, True], ids=["generate", "batch"])
def test_ignore_eos_goes_on_past_the_end_to_max_tokens(engine, prompt, via_batch):
    plain, finish, count = generate(engine, prompt, via_batch)
    assert finish == "stop" and count == len(plain) + 1 < GREEDY["max_tokens"]   # the end token is no event
    tokens, finish, count = generate(engine, prompt, via_batch, ignore_eos=True)
    assert finish == "length" and count == len(tokens) == GREEDY["max_tokens"]
    assert tokens[:len(plain)] == plain and tokens[len(plain)] in engine.tokenizer.eog_ids


@pytest.mark.parametrize("via_batch", [False, True], ids=["generate", "batch"])
def test_min_tokens_draws_no_end_before_that_many(engine, prompt, via_batch):
    plain, _, count = generate(engine, prompt, via_batch)
    tokens, finish, forced = generate(engine, prompt, via_batch, min_tokens=count + 3)
    assert forced >= count + 3 and tokens[:len(plain)] == plain
    logits = engine.logits(prompt + plain)[-1].copy()
    logits[list(engine.tokenizer.eog_ids)] = -np.inf
    assert tokens[len(plain)] == int(np.argmax(logits))
    # as vLLM counts: min_tokens tokens are out before an end token may be drawn, so one already
    # reached when the model ends changes nothing
    assert generate(engine, prompt, via_batch, min_tokens=len(plain))[0] == plain


@pytest.mark.parametrize("via_batch", [False, True], ids=["generate", "batch"])
def test_min_tokens_holds_stop_strings_off_until_that_many(engine, prompt, via_batch):
    """As vLLM's: stop strings end a generation only once min_tokens tokens are out, so one the
    text reaches before then does not cut it (a request asking for 8 tokens and stop "," got 1)."""
    plain, finish, _ = generate(engine, prompt, via_batch)
    stop = engine.tokenizer.decode(plain[:2])   # the text as its second token completes it
    assert finish == "stop" and stop not in engine.tokenizer.decode(plain[1:])
    assert generate(engine, prompt, via_batch, stop=[stop])[0] == plain[:2]
    tokens, finish, _ = generate(engine, prompt, via_batch, stop=[stop], min_tokens=4)
    assert tokens == plain and finish == "stop"   # the model's own end, past min_tokens
