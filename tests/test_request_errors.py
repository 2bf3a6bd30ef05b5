"""No 500s and no silent fixes: malformed requests get 400 JSON before any job is queued, a bad
Last-Event-ID gets 400 (one past the stream's end replays it from the start), and a non-streaming
OpenAI request whose client hangs up cancels its job."""
import json
import socket
import time
from urllib.parse import urlparse

import pytest
from redis import Redis

from tests.conftest import API_KEY
from tests.test_api import AUTH, sse_events, submit, wait
from vkllm import protocol


@pytest.fixture(scope="module")
def worker(start_worker):
    # one sequence at a time, so jobs submitted ahead keep a later one queued (batched, it would run at once)
    return start_worker("requests-w1", env={"VKLLM_MAX_SEQUENCES": "1"})


def index_size(app) -> int:
    return Redis.from_url(app.config["REDIS_URL"]).zcard(protocol.JOBS)


SURROGATE = "\\ud800"   # as JSON text: the escape of a lone surrogate
DEEP = "[" * 100_000 + "]" * 100_000
NESTED_40 = '{"a":' * 40 + "1" + "}" * 40
METADATA = "metadata must be an object of at most 16 string values (keys up to 64 characters, values up to 512)"

BAD = [   # (path, raw JSON body, words in the error)
    ("/api/v1/jobs", f'{{"model": "tiny-llama", "prompt": "{SURROGATE}"}}', "lone surrogate"),
    ("/api/v1/jobs", f'{{"model": "tiny-llama", "prompt": "x", "metadata": {{"{SURROGATE}": 1}}}}', "lone surrogate"),
    ("/api/v1/jobs", f'{{"model": "tiny-llama", "prompt": "x", "stop": ["a{SURROGATE}"]}}', "lone surrogate"),
    ("/v1/completions", f'{{"model": "tiny-llama", "prompt": "x{SURROGATE}"}}', "lone surrogate"),
    ("/v1/chat/completions", f'{{"model": "tiny-llama", "messages": [{{"role": "user", "content": "{SURROGATE}"}}]}}',
     "lone surrogate"),
    ("/api/v1/jobs", f'{{"model": "tiny-llama", "prompt": "x", "metadata": {{"deep": {DEEP}}}}}', "nests deeper"),
    ("/api/v1/jobs", f'{{"model": "tiny-llama", "prompt": "x", "metadata": {NESTED_40}}}', "nests deeper"),
    ("/v1/chat/completions", f'{{"model": "tiny-llama", "messages": {DEEP}}}', "nests deeper"),
    ("/api/v1/jobs", '{"model": "tiny-llama", "prompt": "x", "max_tokens": 0}', "max_tokens must be between"),
    ("/api/v1/jobs", '{"model": "tiny-llama", "prompt": "x", "max_tokens": false}', "max_tokens must be an integer"),
    ("/api/v1/jobs", '{"model": "tiny-llama", "prompt": "x", "max_tokens": true}', "max_tokens must be an integer"),
    ("/v1/completions", '{"model": "tiny-llama", "prompt": "x", "max_tokens": 0}', "max_tokens must be between"),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], '
     '"max_completion_tokens": false}', "max_completion_tokens must be an integer"),
    ("/v1/completions", '{"model": "tiny-llama", "prompt": "x", "stream": "false"}', "stream must be"),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], '
     '"stream": 1}', "stream must be"),
    ("/v1/completions", '{"model": "tiny-llama", "prompt": "x", "stream": true, "stream_options": "yes"}',
     "stream_options must be"),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], '
     '"stream": true, "stream_options": {"include_usage": "yes"}}', "stream_options must be"),
    ("/v1/completions", '{"model": "tiny-llama", "prompt": "x", "n": true}', "n must be an integer"),
    ("/v1/completions", '{"model": "tiny-llama", "prompt": "x", "n": 9}', "n must be an integer between 1 and 8"),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": [{"type": "image_url", '
     '"image_url": {"url": "http://x/y.png"}}]}]}', "messages[0].content[0] is a 'image_url' part"),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": [{"type": "text", '
     '"text": "a"}, {"type": "input_audio"}]}]}', "content[1] is a 'input_audio' part"),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "tool", "content": "1"}]}',
     "needs the tool_call_id"),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "critic", "content": "1"}]}',
     "must have a role in"),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "assistant", "content": null, '
     '"tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{"}}]}]}',
     "arguments is not JSON"),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], '
     '"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "always"}', "tool_choice must be"),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], '
     '"tool_choice": "required"}', "forces a tool call, which needs tools"),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], '
     '"tools": [{"type": "function", "function": {"name": "f"}}], '
     '"tool_choice": {"type": "function", "function": {"name": "g"}}}', "names the function 'g', which is not"),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], '
     '"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"}',
     "teaches no tool-call format"),   # the tiny model's ChatML template
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], '
     '"response_format": {"type": "xml"}}', "response_format must be"),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], '
     '"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": []}}}',
     "response_format json_schema must be"),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], '
     '"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object", '
     '"if": {"required": ["a"]}}}}}', 'Unimplemented keys: ["if"]'),
    ("/api/v1/jobs", '{"model": "tiny-llama", "prompt": "x", "response_format": {"type": "json_schema", '
     '"json_schema": {"name": "a", "schema": {"type": "string", "format": "hostname-ish"}}}}', "hostname-ish"),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], '
     '"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}, "strict": "yes"}}}',
     "json_schema.strict must be true or false"),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], '
     '"tools": [{"type": "function", "function": {"name": "f"}}], "parallel_tool_calls": 0}',
     "parallel_tool_calls must be true or false"),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], '
     '"parallel_tool_calls": "yes"}', "parallel_tool_calls must be true or false"),   # checked without tools too
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], '
     '"tools": [{"type": "retrieval"}]}', "tools[0] must be"),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], '
     '"top_logprobs": 3}', "top_logprobs needs logprobs: true"),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], '
     '"logprobs": true, "top_logprobs": 21}', "top_logprobs must be an integer between 0 and 20"),
    ("/v1/completions", '{"model": "tiny-llama", "prompt": "x", "logprobs": true}', "logprobs must be an integer"),
    ("/api/v1/jobs", '{"model": "tiny-llama", "prompt": "x"', "not valid JSON"),
    ("/api/v1/jobs", '{"model": "tiny-llama", "prompt": "x", "ignore_eos": "yes"}', "ignore_eos must be true or false"),
    ("/v1/completions", '{"model": "tiny-llama", "prompt": "x", "max_tokens": 4, "min_tokens": 5}',
     "min_tokens (5) must not be above max_tokens (4)"),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], '
     '"min_tokens": -1}', "min_tokens must be between 0"),
    # OpenAI's user (a string) and metadata (at most 16 string values, keys up to 64 characters,
    # values up to 512): other types were accepted and ignored
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], "user": 5}',
     "user must be a string"),
    ("/v1/completions", '{"model": "tiny-llama", "prompt": "x", "user": ["a"]}', "user must be a string"),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], '
     '"metadata": "x"}', METADATA),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], '
     '"metadata": {"a": 1}}', METADATA),
    ("/v1/completions", '{"model": "tiny-llama", "prompt": "x", "metadata": '
     + json.dumps({f"k{i}": "v" for i in range(17)}) + '}', METADATA),
    ("/v1/completions", '{"model": "tiny-llama", "prompt": "x", "metadata": {"' + "k" * 65 + '": "v"}}', METADATA),
    ("/v1/completions", '{"model": "tiny-llama", "prompt": "x", "metadata": {"k": "' + "v" * 513 + '"}}', METADATA),
    # parameters not implemented: refused rather than ignored (unless they ask for nothing)
    ("/v1/completions", '{"model": "tiny-llama", "prompt": "x", "echo": true}', "echo is not supported"),
    ("/v1/completions", '{"model": "tiny-llama", "prompt": "x", "echo": 0}', "echo is not supported"),
    ("/v1/completions", '{"model": "tiny-llama", "prompt": "x", "suffix": "end"}', "suffix is not supported"),
    ("/v1/completions", '{"model": "tiny-llama", "prompt": "x", "best_of": 3}', "best_of is not supported"),
    ("/v1/completions", '{"model": "tiny-llama", "prompt": "x", "n": 2, "best_of": 3}', "best_of is not supported"),
    ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], '
     '"logit_bias": {"50256": -100}}', "logit_bias is not supported"),
]


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"echo": False, "suffix": "", "best_of": 2, "n": 2, "logit_bias": {}}),
    ("/v1/completions", {"echo": None, "suffix": None, "best_of": None, "logit_bias": None}),
    ("/v1/chat/completions", {"logit_bias": {}}),
    ("/v1/chat/completions", {"top_logprobs": 0}),
    ("/v1/chat/completions", {"logprobs": False, "top_logprobs": 0}),
])
def test_unimplemented_parameters_that_ask_for_nothing_are_accepted(client, worker, path, body):
    """Clients send some of them by default (LangChain's logit_bias: {}, best_of equal to n);
    top_logprobs 0 without logprobs asks for no alternatives of no logprobs (vLLM takes it too)."""
    prompt = {"prompt": "Hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "Hi"}]}
    r = client.post(path, json={"model": "tiny-llama", "max_tokens": 2} | prompt | body, headers=AUTH)
    assert r.status_code == 200, r.json
    assert len(r.json["choices"]) == body.get("n", 1)
    assert all(choice["logprobs"] is None for choice in r.json["choices"])


@pytest.mark.parametrize("path,raw,words", BAD, ids=[f"{p}:{w}:{i}" for i, (p, _, w) in enumerate(BAD)])
def test_bad_requests_get_400_and_queue_nothing(app, client, worker, path, raw, words):
    before = index_size(app)
    r = client.post(path, data=raw.encode(), headers=AUTH | {"Content-Type": "application/json"})
    assert r.status_code == 400, r.get_data(as_text=True)[:300]
    assert r.json["error"]["type"] == "invalid_request_error" and words in r.json["error"]["message"]
    assert index_size(app) == before


SELF_REFERENCE = "the schema admits no JSON value: its grammar cannot start (such as a $ref to itself with no " \
    "alternative)"


@pytest.mark.parametrize("schema", [{"$ref": "#"}, {"$defs": {"n": {"$ref": "#/$defs/n"}}, "$ref": "#/$defs/n"}])
def test_a_schema_whose_grammar_cannot_start_is_400_in_one_line_before_it_is_queued(app, client, worker, schema):
    """The grammar library compiles a schema that admits no value (a $ref to itself) and fails
    at the first mask, which for the tiny model's vocabulary the worker's check never computed:
    the job was queued and failed with the library's stop reason followed by a dump of its
    parser state (tens of lines of counters and the whole grammar). It is refused before it is
    queued, param response_format, in one line."""
    ask = {"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    # the worker builds its grammar vocabulary on a first constraint, which may outlast the web
    # app's wait for the count (the worker would then fail the job itself, param unknown)
    assert client.post("/v1/chat/completions", headers=AUTH,
                       json=ask | {"response_format": {"type": "json_object"}}).status_code == 200
    before = index_size(app)
    r = client.post("/v1/chat/completions", headers=AUTH, json=ask | {
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}})
    assert r.status_code == 400 and r.json == {"error": {
        "message": SELF_REFERENCE, "type": "invalid_request_error", "param": "response_format", "code": None}}
    assert index_size(app) == before


@pytest.mark.parametrize("value,words", [
    (0, "max_completion_tokens must be between 1 and 256, got 0"),
    (-1, "max_completion_tokens must be between 1 and 256, got -1"),
    (257, "max_completion_tokens must be between 1 and 256, got 257"),
    ("8", "max_completion_tokens must be an integer"),
])
def test_max_completion_tokens_errors_name_it(client, worker, value, words):
    """A chat request that bounds its answer with max_completion_tokens (OpenAI's name; max_tokens
    is deprecated for chat) is told about max_completion_tokens, not a max_tokens it never sent."""
    r = client.post("/v1/chat/completions", json={"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}],
                                                  "max_completion_tokens": value}, headers=AUTH)
    assert r.status_code == 400
    assert r.json["error"]["param"] == "max_completion_tokens" and r.json["error"]["message"] == words
    r = client.post("/v1/chat/completions", json={"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}],
                                                  "max_completion_tokens": 4, "min_tokens": 5}, headers=AUTH)
    assert r.status_code == 400 and r.json["error"]["param"] == "min_tokens"
    assert r.json["error"]["message"] == "min_tokens (5) must not be above max_completion_tokens (4)"


def test_n_null_means_one(client, worker):
    r = client.post("/v1/completions", json={"model": "tiny-llama", "prompt": "Hi", "n": None, "max_tokens": 2},
                    headers=AUTH)
    assert r.status_code == 200, r.json
    assert len(r.json["choices"]) == 1 and r.json["usage"]["completion_tokens"] == 2


@pytest.fixture(scope="module")
def finished_job(app, worker):
    client = app.test_client()
    job = submit(client, max_tokens=4)
    wait(client, job["id"])
    events = sse_events(client.get(f"/api/v1/jobs/{job['id']}/stream", headers=AUTH).get_data(as_text=True))
    assert events[-1][1] == "end" and len(events) == 5
    return job["id"], events


@pytest.mark.parametrize("value", ["abc", "1-2-3", "-5-0", "1-", "18446744073709551616-0",
                                   "99999999999999999999999-0", "1700000000000-18446744073709551616"])
@pytest.mark.parametrize("where", ["header", "query"])
def test_unparseable_last_event_id_is_400(client, finished_job, value, where):
    job_id, _ = finished_job
    url = f"/api/v1/jobs/{job_id}/stream"
    r = (client.get(url, headers=AUTH | {"Last-Event-ID": value}) if where == "header"
         else client.get(url, query_string={"last_event_id": value}, headers=AUTH))
    assert r.status_code == 400 and r.is_json and r.json["error"]["param"] == "Last-Event-ID"


@pytest.mark.parametrize("value", ["18446744073709551615-18446744073709551615", "9999999999999-0"])
def test_last_event_id_past_the_end_replays_from_the_start(client, finished_job, value):
    job_id, events = finished_job
    r = client.get(f"/api/v1/jobs/{job_id}/stream", headers=AUTH | {"Last-Event-ID": value})
    assert r.status_code == 200 and sse_events(r.get_data(as_text=True)) == events
    # an id the stream did send still resumes after it
    r = client.get(f"/api/v1/jobs/{job_id}/stream", headers=AUTH | {"Last-Event-ID": events[2][0]})
    assert sse_events(r.get_data(as_text=True)) == events[3:]


def test_resuming_after_the_end_event_is_204(client, finished_job):
    """204 tells EventSource to stop reconnecting; an empty 200 made it reconnect forever."""
    job_id, events = finished_job
    for r in (client.get(f"/api/v1/jobs/{job_id}/stream", headers=AUTH | {"Last-Event-ID": events[-1][0]}),
              client.get(f"/api/v1/jobs/{job_id}/stream", query_string={"last_event_id": events[-1][0]},
                         headers=AUTH)):
        assert r.status_code == 204 and r.get_data() == b""
    # the event before the end still resumes with the end event
    r = client.get(f"/api/v1/jobs/{job_id}/stream", headers=AUTH | {"Last-Event-ID": events[-2][0]})
    assert r.status_code == 200 and sse_events(r.get_data(as_text=True)) == events[-1:]


def test_a_whole_completion_whose_client_hangs_up_is_cancelled(client, worker, live_url):
    """Jobs ahead keep the worker busy, so the completion is still queued when its client leaves
    (it could not finish before the server looks at the connection again)."""
    ahead = [submit(client, max_tokens=240, prompt="Once", ignore_eos=True)["id"] for _ in range(3)]
    try:
        address = urlparse(live_url)
        body = json.dumps({"model": "tiny-llama", "prompt": "Hello", "max_tokens": 200}).encode()
        sock = socket.create_connection((address.hostname, address.port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        job_id, deadline = None, time.monotonic() + 60
        while job_id is None and time.monotonic() < deadline:
            listed = client.get("/api/v1/jobs?limit=10", headers=AUTH).json["data"]
            job_id = next((j["id"] for j in listed if j["kind"] == "completion" and j["state"] != "finished"), None)
            time.sleep(0.1)
        assert job_id is not None
        sock.close()
        job = wait(client, job_id, timeout=120)
        assert job["state"] == "cancelled"
    finally:
        for job_id in ahead:
            client.post(f"/api/v1/jobs/{job_id}/cancel", headers=AUTH)
