"""Constrained generation in the engine (worker/engine/grammar.py, the "_masked" selections) on
the tiny model: every token is the best the grammar allows, checked against the engine's own
logits and a matcher of the grammar library stepped independently on the host."""
import json

import jsonschema
import llguidance
import numpy as np
import pytest

from worker.engine.engine import Engine
from worker.engine.grammar import JSON_OPTIONS, GrammarError, grammar, lltokenizer
from worker.engine.toolcalls import FORMATS
from worker.engine.sampling import SamplingParams

# Bounded everywhere, so that even the tiny model's random weights finish it within max_tokens.
SCHEMA = {"type": "object", "properties": {
    "color": {"enum": ["red", "green", "blue"]},
    "size": {"type": "integer", "minimum": 0, "maximum": 99},
    "ok": {"type": "boolean"}},
    "required": ["color", "size", "ok"], "additionalProperties": False}
PROMPT = "Describe a ball as JSON:"


@pytest.fixture(scope="module")
def engine(vk_session, tiny_model):
    e = Engine.load(tiny_model, ctx=vk_session, max_batch=64)
    yield e
    e.close()


def _allowed(matcher) -> np.ndarray:
    """The host matcher's mask as booleans over the vocabulary."""
    return np.unpackbits(np.frombuffer(matcher.compute_bitmask(), np.uint8), bitorder="little").astype(bool)


def test_greedy_takes_the_best_allowed_token_at_every_step(engine):
    events = list(engine.generate(PROMPT, SamplingParams(temperature=0, max_tokens=60),
                                  constraint={"type": "json_schema", "schema": SCHEMA}))
    tokens = [e.token_id for e in events if e.token_id is not None]
    assert events[-1].finish_reason == "stop"   # the grammar completed; only end-of-generation was left
    text = "".join(e.text for e in events)
    jsonschema.validate(json.loads(text), SCHEMA)

    prompt = engine.tokenizer.encode(PROMPT)
    rows = engine.logits(prompt + tokens)[len(prompt) - 1:]
    vocab = engine.config.vocab_size
    reference = llguidance.LLMatcher(
        llguidance.LLTokenizer(llguidance.TokenizerWrapper(_HostVocab(engine.tokenizer)), n_vocab=vocab,
                               eos_token=sorted(engine.tokenizer.eog_ids)),
        llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, overrides=JSON_OPTIONS))
    for token, row in zip(tokens + [None], rows):
        allowed = _allowed(reference)[:vocab]
        best = int(np.flatnonzero(allowed)[np.argmax(row[allowed])])
        if token is None:   # the step after the last token chose end of generation
            assert best in engine.tokenizer.eog_ids
        else:
            assert token == best
            assert reference.consume_token(token)
    # unconstrained, the same prompt does not write this JSON
    free = "".join(e.text for e in engine.generate(PROMPT, SamplingParams(temperature=0, max_tokens=len(tokens))))
    assert free != text


class _HostVocab:
    """The tokenizer as llguidance's wrapper reads it, spelled out here from token_bytes alone."""

    def __init__(self, tokenizer):
        self.tokens = [tokenizer.token_bytes(i) or b"\xff" + tokenizer.vocab.tokens[i].encode()
                       for i in range(tokenizer.vocab_size)]
        self.eos_token_id, self.bos_token_id, self._t = tokenizer.eos_id, tokenizer.bos_id, tokenizer

    def __call__(self, text: str):
        return self._t.encode(text, add_special=False, parse_special=False)


@pytest.mark.parametrize("params", [
    dict(temperature=1.0, top_k=40),                       # GPU top-k candidates
    dict(temperature=1.0, top_k=0, repeat_penalty=1.3),    # all logits to the host sampler
    dict(temperature=1.5, top_k=40, top_p=0.9),
], ids=["topk", "logits", "top-p"])
def test_sampled_output_always_validates(engine, params):
    for seed in range(5):
        events = list(engine.generate(PROMPT, SamplingParams(**params, seed=seed, max_tokens=60),
                                      constraint={"type": "json_schema", "schema": SCHEMA}))
        assert events[-1].finish_reason == "stop"
        jsonschema.validate(json.loads("".join(e.text for e in events)), SCHEMA)


def test_json_object_mode_and_logprobs_of_allowed_tokens_only(engine):
    """With logprobs the alternatives are the grammar's: after `{` only `"` or `}` may follow."""
    events = list(engine.generate(PROMPT, SamplingParams(temperature=0, max_tokens=3), logprobs=20,
                                  constraint={"type": "json_object"}))
    first = events[0]
    assert engine.tokenizer.token_bytes(first.token_id).startswith(b"{")
    for event in events[:-1]:
        assert event.logprobs.logprob <= 0 and all(np.isfinite(v) for _, v in event.logprobs.top)
        assert event.token_id in [t for t, _ in event.logprobs.top]
    # the first token's alternatives all open an object: the others were masked
    assert all(engine.tokenizer.token_bytes(t).lstrip().startswith(b"{") for t, _ in first.logprobs.top)


@pytest.mark.parametrize("constraint, words", [
    ({"type": "json_schema", "schema": {"type": "object", "if": {"type": "object"}}}, 'Unimplemented keys: ["if"]'),
    ({"type": "json_schema", "schema": {"type": "nonsense"}}, "nonsense"),
    ({"type": "tool_call", "tools": [{"type": "function", "function": {"name": "f"}}], "name": None,
      "parallel": False},
     "teaches no tool-call format"),
])
def test_constraints_the_library_cannot_enforce_are_refused(engine, constraint, words):
    with pytest.raises(GrammarError, match=words.replace("[", r"\[").replace("]", r"\]")):
        list(engine.generate(PROMPT, SamplingParams(max_tokens=2), constraint=constraint))


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "single"])
def test_a_forced_call_takes_more_calls_only_when_parallel(engine, parallel):
    """The Hermes format's grammar for a forced call: one <tool_call> block, or with
    parallel_tool_calls several, one a line (as Qwen2.5's template writes them); the model may end
    after any complete call. Checked by a matcher of the library over the tokens of each text."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}]
    text = grammar({"type": "tool_call", "tools": tools, "name": None, "parallel": parallel}, FORMATS[0])
    one = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    two = one + "\n" + one.replace("1", "2")

    def matches(candidate: str) -> bool:
        tokens = engine.tokenizer.encode(candidate, add_special=False, parse_special=False)
        matcher = llguidance.LLMatcher(lltokenizer(engine.tokenizer, engine.config.vocab_size), text)
        return matcher.validate_tokens(tokens) == len(tokens) and matcher.consume_tokens(tokens) \
            and matcher.is_accepting()

    assert matches(one)
    assert matches(two) == parallel
    assert not matches(one[:-1])   # a call ends with its end tag
    assert not matches(one.replace('"x": 1', '"x": "1"'))   # the arguments keep to the parameters


def test_batched_sequences_each_keep_their_own_grammar(engine):
    """In one batch a constrained greedy sequence, an unconstrained one and a constrained
    sampled one: each row gets its own mask (none for the free one) and each sequence gives
    what it gives alone."""
    from worker.engine.batch import Request
    json_schema = {"type": "json_schema", "schema": SCHEMA}
    requests = {"greedy": Request(engine.tokenizer.encode(PROMPT), SamplingParams(temperature=0, max_tokens=60),
                                  constraint=json_schema),
                "free": Request(engine.tokenizer.encode("A ball"), SamplingParams(temperature=0, max_tokens=12)),
                "sampled": Request(engine.tokenizer.encode(PROMPT), SamplingParams(temperature=1.0, top_k=40, seed=3,
                                                                                 max_tokens=60),
                                   constraint=json_schema, logprobs=2)}
    alone = {name: list(engine.generate_ids(r.ids, r.params, logprobs=r.logprobs, constraint=r.constraint))
             for name, r in requests.items()}
    batch = engine.batch
    seqs = {name: batch.add(r, tag=name) for name, r in requests.items()}
    got = {name: [] for name in requests}
    while len(batch):
        for seq, event in batch.step():
            got[seq.tag].append(event)
    for name in requests:
        assert [e.token_id for e in got[name]] == [e.token_id for e in alone[name]], name
        assert got[name][-1].finish_reason == alone[name][-1].finish_reason and seqs[name].done
    for name in ("greedy", "sampled"):
        jsonschema.validate(json.loads("".join(e.text for e in got[name])), SCHEMA)


BOOLEAN = {"type": "json_schema", "schema": {"type": "boolean"}}


@pytest.mark.parametrize("params", [dict(temperature=0), dict(temperature=1.0, top_k=40, seed=5)],
                         ids=["greedy", "sampled"])
def test_a_grammar_complete_before_min_tokens_fails_that_generation_alone(engine, params):
    """A JSON boolean's grammar allows only the end after "true" or "false", so min_tokens past
    that cannot be met. It failed the whole batch step with the grammar library's state dump (the
    sampler's pick, under min_tokens no end token, one the grammar refused); now the generation
    fails alone with MinTokensUnmet naming why, its output kept: raised by Engine.generate, and in
    a batch its last event, finish_reason "error", while a free sequence beside it gives what it
    gives alone."""
    from worker.engine.batch import Request
    from worker.engine.errors import MinTokensUnmet
    ids = engine.tokenizer.encode("Is it?")
    plain = list(engine.generate_ids(ids, SamplingParams(**params, max_tokens=20), constraint=BOOLEAN))
    text, n = "".join(e.text for e in plain), plain[-1].timings.generated_tokens - 1   # the end is no text
    assert plain[-1].finish_reason == "stop" and text in ("true", "false")
    message = (f"min_tokens=10 cannot be met: the output's grammar (response_format or tool_choice) is complete "
               f"after {n} tokens")
    held = SamplingParams(**params, max_tokens=20, min_tokens=10)
    with pytest.raises(MinTokensUnmet) as raised:
        list(engine.generate_ids(ids, held, constraint=BOOLEAN))
    assert str(raised.value) == message

    free = Request(engine.tokenizer.encode("A ball"), SamplingParams(temperature=0, max_tokens=12))
    free_alone = list(engine.generate_ids(free.ids, free.params))
    batch = engine.batch
    seqs = {"held": batch.add(Request(ids, held, constraint=BOOLEAN), tag="held"), "free": batch.add(free, tag="free")}
    got = {name: [] for name in seqs}
    while len(batch):
        for seq, event in batch.step():
            got[seq.tag].append(event)
    last = got["held"][-1]
    assert ("".join(e.text for e in got["held"]), last.finish_reason, type(last.error), str(last.error),
            last.timings.generated_tokens) == (text, "error", MinTokensUnmet, message, n)
    assert [e.token_id for e in got["free"]] == [e.token_id for e in free_alone]
    assert got["free"][-1].finish_reason == free_alone[-1].finish_reason and all(s.done for s in seqs.values())


def test_min_tokens_still_holds_where_the_grammar_allows_more(engine):
    """An integer may end after any digit: min_tokens keeps it from ending before that many
    tokens are out, as without a grammar (the end is passed over while anything else is allowed)."""
    ids = engine.tokenizer.encode("How many?")
    integer = {"type": "json_schema", "schema": {"type": "integer"}}
    events = list(engine.generate_ids(ids, SamplingParams(temperature=0, max_tokens=12, min_tokens=6),
                                      constraint=integer))
    last = events[-1]
    assert last.timings.generated_tokens > 6 or (last.finish_reason, last.timings.generated_tokens) == ("length", 12)
    assert isinstance(json.loads("".join(e.text for e in events)), int)
