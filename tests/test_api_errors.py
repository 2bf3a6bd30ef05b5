"""Every API endpoint refuses a missing or wrong key; bad bodies get 4xx JSON saying what is wrong;
the OpenAPI document is a valid OpenAPI 3.1 document."""
import http.client
import json
from urllib.parse import urlsplit

import pytest
from openapi_spec_validator import validate

from tests.test_api import AUTH

ENDPOINTS = [
    ("POST", "/api/v1/jobs"), ("GET", "/api/v1/jobs"), ("GET", "/api/v1/jobs/abc"),
    ("GET", "/api/v1/jobs/abc/stream"), ("POST", "/api/v1/jobs/abc/cancel"), ("GET", "/api/v1/models"),
    ("GET", "/api/v1/openapi.json"), ("POST", "/api/v1/tokenize"), ("GET", "/v1/models"),
    ("GET", "/v1/models/tiny-llama"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
]


@pytest.fixture(scope="module")
def worker(start_worker):
    return start_worker("errors-w1")


@pytest.mark.parametrize("method,path", ENDPOINTS)
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"X-API-Key": "wrong"}])
def test_refused_without_the_key(client, method, path, headers):
    r = client.open(path, method=method, json={}, headers=headers)
    assert r.status_code == 401
    assert r.json["error"]["code"] == "invalid_api_key"


def test_x_api_key_header_works(client):
    assert client.get("/api/v1/models", headers={"X-API-Key": AUTH["Authorization"][7:]}).status_code == 200


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer"])
def test_the_bearer_scheme_in_any_case_works(client, scheme):
    key = AUTH["Authorization"][7:]
    assert client.get("/api/v1/models", headers={"Authorization": f"{scheme} {key}"}).status_code == 200
    assert client.get("/api/v1/models", headers={"Authorization": f"Basic {key}"}).status_code == 401


@pytest.mark.parametrize("body,status,param,words", [
    ({"prompt": "x"}, 400, "model", "model is required"),
    ({"model": "nope", "prompt": "x"}, 404, "model", "unknown model 'nope'"),
    ({"model": "tiny-llama"}, 400, "prompt", "prompt (a non-empty string) or messages is required"),
    ({"model": "tiny-llama", "prompt": "x", "temperature": -1}, 400, "temperature", "between 0.0 and 5.0"),
    ({"model": "tiny-llama", "prompt": "x", "top_k": 1.5}, 400, "top_k", "must be an integer"),
    ({"model": "tiny-llama", "prompt": "x", "top_p": "high"}, 400, "top_p", "must be a number"),
    ({"model": "tiny-llama", "prompt": "x", "top_p": 0}, 400, "top_p", "(above 0.0)"),
    ({"model": "tiny-llama", "prompt": "x", "max_tokens": 257}, 400, "max_tokens", "between 1 and 256"),
    ({"model": "tiny-llama", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "at most 4"),
    ({"model": "tiny-llama", "messages": [{"role": "robot", "content": "x"}]}, 400, "messages", "role"),
    ({"model": "tiny-llama", "prompt": "x", "priority": "urgent"}, 400, "priority", "priority must be"),
    ({"model": "tiny-llama", "prompt": "x", "metadata": [1]}, 400, "metadata", "JSON object"),
    ({"model": "tiny-llama", "prompt": "y" * 5000}, 400, "prompt", "longer than the context of tiny-llama"),
])
def test_bad_bodies(client, worker, body, status, param, words):
    r = client.post("/api/v1/jobs", json=body, headers=AUTH)
    assert r.status_code == status, r.json
    assert r.json["error"]["param"] == param and words in r.json["error"]["message"]


@pytest.mark.parametrize("path,body,param,message", [
    ("/api/v1/jobs", {"prompt": "x", "messages": [{"role": "user", "content": "y"}]}, "prompt",
     "send either prompt or messages, not both"),
    ("/api/v1/tokenize", {"prompt": "x", "messages": [{"role": "user", "content": "y"}]}, "prompt",
     "send either prompt or messages, not both"),
    ("/api/v1/jobs", {"prompt": "x", "tools": [{"type": "function", "function": {"name": "f"}}],
                      "tool_choice": "required"}, "prompt",
     "tool_choice forces a call of one of the tools, which reach the model only through a chat's template: "
     "they need messages, not a prompt"),
    ("/v1/completions", {"prompt": "x", "tools": [{"type": "function", "function": {"name": "f"}}],
                         "tool_choice": {"type": "function", "function": {"name": "f"}}}, "prompt",
     "tool_choice forces a call of one of the tools, which reach the model only through a chat's template: "
     "they need messages, not a prompt"),
    ("/api/v1/jobs", {"prompt": "x", "tool_choice": "required"}, "tool_choice",
     "tool_choice forces a tool call, which needs tools"),
])
def test_a_body_is_refused_for_what_it_ignores(client, worker, path, body, param, message):
    """A REST body with both prompt and messages ran the messages and dropped the prompt without
    a word; tools with a plain prompt and a forced tool_choice were told 'which needs tools'."""
    r = client.post(path, json={"model": "tiny-llama", "max_tokens": 2} | body, headers=AUTH)
    assert (r.status_code, r.json) == (400, {"error": {"message": message, "type": "invalid_request_error",
                                                       "param": param, "code": None}})


def test_not_json_too_large_unknown(client, worker):
    r = client.post("/api/v1/jobs", data="model=x", headers=AUTH)
    assert r.status_code == 400 and "JSON object" in r.json["error"]["message"]
    r = client.post("/api/v1/jobs", data=b"{" + b" " * (2 << 20) + b"}", headers=AUTH | {
        "Content-Type": "application/json"})
    assert r.status_code == 413 and r.json["error"]["message"]
    r = client.get("/api/v1/jobs/no-such-job", headers=AUTH)
    assert r.status_code == 404 and r.json["error"]["code"] == "job_not_found"
    assert client.get("/api/v1/jobs?limit=500", headers=AUTH).status_code == 400
    assert client.get("/api/v1/jobs?state=lost", headers=AUTH).status_code == 400
    r = client.post("/v1/completions", json={"model": "tiny-llama", "prompt": "x", "n": 0}, headers=AUTH)
    assert r.status_code == 400 and r.json["error"]["param"] == "n"


@pytest.mark.parametrize("path", ["/api/v1/jobs", "/v1/chat/completions", "/api/v1/tokenize"])
def test_a_body_over_the_limit_is_413_naming_it(client, path):
    r = client.post(path, data=b"{" + b" " * (1 << 20) + b"}", headers=AUTH | {"Content-Type": "application/json"})
    assert (r.status_code, r.json) == (413, {"error": {
        "message": "the request body is over 1048576 bytes, the most a request may have",
        "type": "invalid_request_error", "param": None, "code": "body_too_large"}})


def _post_chunked(live_url, path, body: bytes):
    """POST body with Transfer-Encoding: chunked (no Content-Length), in 64 KiB chunks."""
    conn = http.client.HTTPConnection(urlsplit(live_url).netloc, timeout=30)
    chunks = (body[i:i + (64 << 10)] for i in range(0, len(body), 64 << 10))
    conn.request("POST", path, body=chunks, headers=AUTH | {"Content-Type": "application/json"},
                 encode_chunked=True)
    r = conn.getresponse()
    answer = (r.status, json.loads(r.read()))
    conn.close()
    return answer


@pytest.mark.parametrize("path", ["/api/v1/jobs", "/v1/chat/completions", "/api/v1/tokenize"])
def test_a_chunked_body_over_the_limit_is_413_naming_it(live_url, path):
    """A chunked body (no Content-Length) was cut at the limit and refused as 'not valid JSON'; it
    gets the 413 a stated length over the limit gets. One of exactly the limit is still read.
    (The body here, cut at the limit, was valid JSON: it was taken for the whole request.)"""
    over = b'{"prompt": "x"' + b" " * ((1 << 20) - 15) + b"}!"   # the limit and one byte more
    assert len(over) == (1 << 20) + 1
    assert _post_chunked(live_url, path, over) == (413, {"error": {
        "message": "the request body is over 1048576 bytes, the most a request may have",
        "type": "invalid_request_error", "param": None, "code": "body_too_large"}})
    assert _post_chunked(live_url, "/api/v1/jobs", over[:-1]) == (400, {"error": {
        "message": "model is required (see GET /v1/models)", "type": "invalid_request_error", "param": "model",
        "code": None}})


@pytest.mark.parametrize("query,param,message", [
    ("offset=-1", "offset", "offset must be at least 0, got -1"),
    ("offset=x", "offset", "offset must be an integer, got 'x'"),
    ("limit=0", "limit", "limit must be between 1 and 100, got 0"),
    ("limit=x", "limit", "limit must be an integer, got 'x'"),
    ("offset=3&limit=101", "limit", "limit must be between 1 and 100, got 101"),
    # past Redis' 64-bit range this was a 500 (ResponseError from ZREVRANGE)
    ("offset=99999999999999999999999999", "offset", "offset must be at most 1000000000, got 99999999999999999999999999"),
])
def test_bad_listing_arguments_name_the_one_at_fault(client, query, param, message):
    """A job listing's bad offset was refused as param "limit", and a limit that is not a number as
    param "offset", each with one message for both."""
    r = client.get(f"/api/v1/jobs?{query}", headers=AUTH)
    assert r.status_code == 400
    assert (r.json["error"]["param"], r.json["error"]["message"]) == (param, message)


def test_openapi_document_validates(client):
    doc = client.get("/api/v1/openapi.json", headers=AUTH).json
    validate(doc)
    assert set(doc["paths"]) == {"/jobs", "/jobs/{job_id}", "/jobs/{job_id}/stream", "/jobs/{job_id}/cancel",
                                 "/tokenize", "/models"}


def test_health(client):
    assert client.get("/healthz").json == {"status": "ok"}


def test_ready_when_a_worker_serves(client, worker):
    ready = client.get("/readyz")
    assert ready.status_code == 200 and "tiny-llama" in ready.json["models"]


def test_every_value_the_api_accepts_the_worker_accepts():
    """The API checks ranges without the engine; its bounds, as it sends them on (a negative seed
    as its uint64), must lie within SamplingParams'."""
    from appliance.schema import SAMPLING, worker_value
    from worker.engine.sampling import SamplingParams
    for name, (kind, lo, hi, lo_ok) in SAMPLING.items():
        for value in ([lo] if lo_ok else []) + [hi]:
            # the API also refuses min_tokens above max_tokens (test_request_errors), so it comes with one as large
            SamplingParams(**{name: worker_value(name, value)},
                           **({"max_tokens": max(1, value)} if name == "min_tokens" else {}))
