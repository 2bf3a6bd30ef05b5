"""Structured output through the official openai client, served for real with a real worker:
response_format's JSON object and JSON schema, and tool_choice forcing a call (issue 12 point 2).
SmolLM2-135M (with Qwen2.5's template, which teaches the Hermes tool-call format) writes them."""
import json
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel

from tests.conftest import openai_client
from tests.test_openai import SHOWN_CALLS, WEATHER_TOOL, smollm2_qwen_template  # noqa: F401 (a fixture)

MODEL = "SmolLM2-qwen-template"
# small, so that 20 runs at SmolLM2's few tokens a second on lavapipe take about a minute
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "pet": {"enum": ["cat", "dog", "none"]}},
    "required": ["name", "age", "pet"], "additionalProperties": False}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "Get the local time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 32}},
                   "required": ["zone"], "additionalProperties": False}}}


def two_calls(first: str, second: str) -> list[dict]:
    """A question about two cities and the two calls that answered it."""
    return [{"role": "user", "content": f"What is the weather in {first} and in {second}?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{city}", "type": "function", "function": {
                    "name": "get_weather", "arguments": json.dumps({"city": city})}} for city in (first, second)]}]


TWO_CALLS = two_calls("Paris", "Rome") + two_calls("Madrid", "Oslo") + [
    {"role": "user", "content": "What is the weather in London and in Berlin?"}]


@pytest.fixture(scope="module")
def oai(start_worker, smollm2_qwen_template, live_url):  # noqa: F811
    start_worker("structured", model=smollm2_qwen_template, n_ctx=1024)
    return openai_client(live_url, 600)


def ask(text):
    return [{"role": "user", "content": text}]


class Ball(BaseModel):
    color: Literal["red", "green", "blue"]
    size: int
    bouncy: bool


def test_parse_with_a_pydantic_model(oai):
    completion = oai.chat.completions.parse(model=MODEL, messages=ask("Describe a small red ball as JSON."),
                                            response_format=Ball, max_tokens=60, temperature=0)
    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "stop"
    assert isinstance(message.parsed, Ball)
    assert message.parsed == Ball.model_validate_json(message.content)


def test_json_schema_output_validates_on_every_seeded_run(oai):
    schema_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    texts = set()
    for seed in range(20):
        answer = oai.chat.completions.create(model=MODEL, messages=ask("Invent a person: name, age and pet."),
                                             response_format=schema_format, max_tokens=40, temperature=1.0,
                                             seed=seed)
        assert answer.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(answer.choices[0].message.content), PERSON)
        texts.add(answer.choices[0].message.content)
    assert len(texts) > 1   # the seeds drew different people: the grammar constrains, it does not dictate


def test_json_object_mode_parses_streamed_and_whole(oai):
    request = dict(model=MODEL, messages=ask("Describe a cat as a JSON object."), max_tokens=100, temperature=0,
                   response_format={"type": "json_object"})
    whole = oai.chat.completions.create(**request)
    assert whole.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(whole.choices[0].message.content), dict)
    streamed = "".join(c.choices[0].delta.content or "" for c in oai.chat.completions.create(**request, stream=True))
    assert streamed == whole.choices[0].message.content
    # without the constraint the same greedy request starts otherwise
    free = oai.chat.completions.create(**(request | {"response_format": {"type": "text"}, "max_tokens": 6}))
    assert not whole.choices[0].message.content.startswith(free.choices[0].message.content)


@pytest.mark.parametrize("choice, name", [
    ("required", None),
    ({"type": "function", "function": {"name": "get_time"}}, "get_time"),
], ids=["required", "named"])
def test_forced_tool_call_is_a_valid_call(oai, choice, name):
    """Unprompted, this model does not call tools (see test_openai's round trip): forced, it calls
    one, with arguments valid under the function's parameters."""
    tools = [WEATHER_TOOL, TIME_TOOL]
    answer = oai.chat.completions.create(model=MODEL, messages=ask("What is the weather in London?"), tools=tools,
                                         tool_choice=choice, max_tokens=60, temperature=0)
    choice0 = answer.choices[0]
    assert choice0.finish_reason == "tool_calls" and choice0.message.content is None
    (call,) = choice0.message.tool_calls
    if name:
        assert call.function.name == name
    function = next(t["function"] for t in tools if t["function"]["name"] == call.function.name)
    jsonschema.validate(json.loads(call.function.arguments), function["parameters"])
    free = oai.chat.completions.create(model=MODEL, messages=ask("What is the weather in London?"), tools=tools,
                                       max_tokens=6, temperature=0)
    assert free.choices[0].message.content and not free.choices[0].message.content.startswith("<tool_call>")


def test_parallel_tool_calls(oai):
    """Shown questions about two cities answered with two calls, the model answers the next
    such question with two calls (Hermes blocks one after the other), also when forced with
    parallel_tool_calls true; with it false the answer holds the first only, generation ending
    on the token that closes it (counted from the free answer's own tokens), and a forced call
    is one call unless it is true."""
    def answer(**more):
        return oai.chat.completions.create(model=MODEL, messages=TWO_CALLS, tools=[WEATHER_TOOL], max_tokens=80,
                                           temperature=0, **more)

    def calls(**more):
        choice = answer(**more).choices[0]
        assert choice.finish_reason == "tool_calls"
        return [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]

    both = calls()
    assert both == [("get_weather", {"city": "London"}), ("get_weather", {"city": "Berlin"})]
    free = answer(logprobs=True)
    tokens = [entry.token for entry in free.choices[0].logprobs.content]
    closing = next(n for n in range(1, len(tokens) + 1) if "</tool_call>" in "".join(tokens[:n]))
    first = answer(parallel_tool_calls=False)
    assert first.choices[0].finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in first.choices[0].message.tool_calls] \
        == both[:1]
    assert first.usage.completion_tokens == closing < free.usage.completion_tokens
    assert calls(tool_choice="required", parallel_tool_calls=True) == both
    assert calls(tool_choice="required") == calls(tool_choice="required", parallel_tool_calls=False) == both[:1]


def test_unsupported_schema_keywords_are_named(oai):
    with pytest.raises(openai.BadRequestError, match='Unimplemented keys: \\["if"\\]') as refused:
        oai.chat.completions.create(model=MODEL, messages=ask("x"), max_tokens=5, response_format={
            "type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object", "if": {}}}})
    assert refused.value.body["param"] == "response_format"


def test_rest_job_with_a_response_format(client, start_worker):
    """POST /api/v1/jobs takes response_format too; the tiny model's random weights write JSON
    valid under a bounded schema (tests/test_grammar.py's)."""
    from tests.test_api import AUTH, wait
    from tests.test_grammar import SCHEMA
    start_worker("structured-tiny")
    r = client.post("/api/v1/jobs", headers=AUTH, json={
        "model": "tiny-llama", "prompt": "A ball:", "max_tokens": 60, "temperature": 0.7, "seed": 1,
        "response_format": {"type": "json_schema", "json_schema": {"name": "ball", "schema": SCHEMA}}})
    assert r.status_code == 202, r.json
    job = wait(client, r.json["id"])
    assert job["state"] == "finished" and job["finish_reason"] == "stop"
    jsonschema.validate(json.loads(job["output"]), SCHEMA)


@pytest.fixture(scope="module")
def peer(smollm2_qwen_template):  # noqa: F811
    """llama.cpp's server (xllamacpp, CPU) on the same file, its chat template through Jinja."""
    xllamacpp = pytest.importorskip("xllamacpp")
    params = xllamacpp.CommonParams()
    params.model.path = str(smollm2_qwen_template)
    params.n_ctx, params.use_jinja = 1024, True
    return xllamacpp.Server(params)


def test_llama_cpp_server_and_ours_both_keep_to_the_same_schema(oai, peer):
    """The same JSON-schema requests to llama.cpp's server and to ours, greedy and seeded: every
    output parses and validates in both."""
    request = {"messages": ask("Invent a person: name, age and pet."), "max_tokens": 40,
               "response_format": {"type": "json_schema",   # enforced, strict or not
                                   "json_schema": {"name": "person", "schema": PERSON, "strict": False}}}
    for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": 1}, {"temperature": 1.0, "seed": 2}):
        theirs = peer.handle_chat_completions(request | sampling)["choices"][0]["message"]["content"]
        ours = oai.chat.completions.create(model=MODEL, **request, **sampling).choices[0].message.content
        for text in (theirs, ours):
            jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.parametrize("name", [None, "get_time"], ids=["required", "named"])
def test_llama_cpp_server_and_ours_both_make_the_forced_call(oai, peer, name):
    """The same forced tool calls, greedy, to llama.cpp's server and to ours: both answer with
    tool_calls, and the same call. The chat shows two earlier calls: asked the bare question,
    llama.cpp's "required" grammar lets SmolLM2 write text before the call it must end with,
    and the model writes prose until max_tokens, so its answer holds no call (ours allows the
    call alone). llama.cpp's server takes tool_choice as a string only (it ignores an object,
    with a warning), so the named function is asked of it as "required" with only that
    function offered."""
    tools = [WEATHER_TOOL, TIME_TOOL]
    choice = "required" if name is None else {"type": "function", "function": {"name": name}}
    answer = oai.chat.completions.create(model=MODEL, messages=SHOWN_CALLS, tools=tools, tool_choice=choice,
                                         max_tokens=60, temperature=0).choices[0]
    ours = [c.function.model_dump() for c in answer.message.tool_calls or []]
    offered = [t for t in tools if name is None or t["function"]["name"] == name]
    reply = peer.handle_chat_completions({"messages": SHOWN_CALLS, "tools": offered, "tool_choice": "required",
                                          "max_tokens": 60, "temperature": 0})["choices"][0]
    theirs = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
              for c in reply["message"].get("tool_calls") or []]
    assert answer.finish_reason == reply["finish_reason"] == "tool_calls"
    for calls in (ours, theirs):
        (call,) = calls
        assert call["name"] == (name or call["name"])
        function = next(t["function"] for t in tools if t["function"]["name"] == call["name"])
        jsonschema.validate(json.loads(call["arguments"]), function["parameters"])
    assert [(c["name"], json.loads(c["arguments"])) for c in ours] == \
        [(c["name"], json.loads(c["arguments"])) for c in theirs]


def test_ignore_eos_and_min_tokens_through_the_client(oai):
    """vLLM's sampling parameters, as the openai client sends them (extra_body): the model's own
    end, past it to max_tokens, or not before min_tokens (tests/test_eos_params.py checks the
    token taken there against the engine's logits)."""
    def answer(max_tokens=60, **more):
        return oai.chat.completions.create(model=MODEL, messages=ask("Say hello."), max_tokens=max_tokens,
                                           temperature=0, extra_body=more)

    free = answer()
    n = free.usage.completion_tokens
    assert free.choices[0].finish_reason == "stop" and n < 60
    past = answer(n + 5, ignore_eos=True)
    assert past.choices[0].finish_reason == "length" and past.usage.completion_tokens == n + 5
    assert past.choices[0].message.content.startswith(free.choices[0].message.content)
    held = answer(n + 10, min_tokens=n + 3)
    assert held.usage.completion_tokens >= n + 3
    assert held.choices[0].message.content.startswith(free.choices[0].message.content)
