"""A generation that max_tokens ends inside a multi-byte character, on the tiny model: the text
ends before that character (as vLLM's and llama.cpp server's output does), where it ended with
U+FFFD; the token ids and the count stay every token's. A grammar (JSON whose one value is the
string below) makes the tiny model write an emoji, a real U+FFFD and a CJK character byte by
byte. Reference: that JSON's UTF-8, cut after the generated tokens' bytes, decoded by Python with
the cut character left out."""
import pytest

from worker.engine.batch import Request
from worker.engine.engine import Engine
from worker.engine.sampling import SamplingParams

VALUE = "\U0001F642\ufffd\u672c"
WRITTEN = f'"{VALUE}"'.encode()     # what the grammar allows, whole
CONSTRAINT = {"type": "json_schema", "schema": {"const": VALUE}}


@pytest.fixture(scope="module")
def engine(vk_session, tiny_model):
    e = Engine.load(tiny_model, n_ctx=128, ctx=vk_session, max_batch=8)
    yield e
    e.close()


def generate(engine, max_tokens: int, via_batch: bool):
    ids, params = engine.tokenizer.encode("Say it:"), SamplingParams(temperature=0, max_tokens=max_tokens)
    if via_batch:
        seq, events = engine.batch.add(Request(ids, params, constraint=CONSTRAINT)), []
        while not seq.done:
            events += [event for s, event in engine.batch.step() if s is seq]
        return events
    return list(engine.generate_ids(ids, params, constraint=CONSTRAINT))


@pytest.mark.parametrize("via_batch", [False, True], ids=["generate", "batch"])
def test_text_cut_by_max_tokens_ends_with_whole_characters(engine, via_batch):
    whole = generate(engine, 20, via_batch)
    assert "".join(e.text for e in whole) == WRITTEN.decode() and whole[-1].finish_reason == "stop"
    n_tokens = len(whole) - 1
    cuts = 0
    for k in range(1, n_tokens):
        events = generate(engine, k, via_batch)
        tokens = [e.token_id for e in events if e.token_id is not None]
        assert tokens == [e.token_id for e in whole[:k]]
        assert events[-1].finish_reason == "length" and events[-1].timings.generated_tokens == k
        written = b"".join(engine.tokenizer.token_bytes(t) for t in tokens)
        assert WRITTEN.startswith(written)
        text = "".join(e.text for e in events)
        assert text == written.decode("utf-8", errors="ignore"), k
        cuts += text.encode() != written
    assert cuts >= 4, "the tokens did not split the characters: nothing was tested"
