"""OpenAI's Batch API on the job queue, driven by the official `openai` client over real HTTP:
real redis-server, real `vkllm worker` processes on the tiny synthetic model, killed by pid."""
import json
import os
import re
import signal
import threading
import time

import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion
from redis import Redis
from rq.job import Job

from tests.conftest import API_KEY, openai_client, private_redis
from tests.test_openai import smollm2_qwen_template  # noqa: F401 (a fixture)
from vkllm import protocol

CHAT = "/v1/chat/completions"


def _config(redis_url, tiny_model, data_dir, **more) -> dict:
    return {"REDIS_URL": redis_url, "API_KEY": API_KEY, "SECRET_KEY": "test-secret", "TESTING": True,
            "MODELS_DIR": str(tiny_model.parent), "DATA_DIR": str(data_dir)} | more


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    """A redis-server of this module's own (its workers and apps use it): the batch sweep of
    another module's app, which keeps its files elsewhere, never sees these batches."""
    with private_redis(tmp_path_factory.mktemp("batch-redis")) as url:
        yield url


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def app(redis_url, tiny_model, data_dir):
    """The app of this module: its files in a data folder of its own, no background sweep (reads
    move batches on; test_the_sweep_finalizes_a_batch_nobody_reads covers the sweep)."""
    from appliance.app import create_app
    return create_app(_config(redis_url, tiny_model, data_dir, BATCH_SWEEP_INTERVAL=0))


class Served:
    """An app on a real socket, stoppable: a web-app restart is one stopped, another started."""

    def __init__(self, app):
        from werkzeug.serving import make_server
        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def client(self) -> openai.OpenAI:
        return openai_client(self.url, 120)

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def w1(start_worker):
    return start_worker("batch-w1")


@pytest.fixture(scope="module")
def oai(live_url, w1):
    return openai_client(live_url, 120)


def jsonl(lines: list[dict]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def chat_line(custom_id: str, content: str, max_tokens: int = 3, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": CHAT,
            "body": {"model": "tiny-llama", "messages": [{"role": "user", "content": content}],
                     "max_tokens": max_tokens, "temperature": 0} | body}


def upload(client, lines: list[dict]):
    return client.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch")


def wait_status(client, batch_id, statuses=("completed", "failed", "cancelled", "expired"), timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} stayed {batch.status} ({batch.request_counts})")


def read_file(client, file_id) -> list[dict]:
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_a_50_line_batch_completes_with_one_output_line_per_request(oai):
    lines = [chat_line(f"req-{i}", f"Tell me about number {i}") for i in range(50)]
    data = jsonl(lines)
    uploaded = oai.files.create(file=("fifty.jsonl", data), purpose="batch")
    assert uploaded.bytes == len(data) and uploaded.filename == "fifty.jsonl" and uploaded.purpose == "batch"
    assert oai.files.retrieve(uploaded.id).bytes == len(data)
    assert oai.files.content(uploaded.id).content == data

    batch = oai.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h",
                               metadata={"run": "fifty"})
    assert batch.status in ("validating", "in_progress") and batch.metadata == {"run": "fifty"}
    done = wait_status(oai, batch.id)
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (50, 50, 0)
    assert done.error_file_id is None and done.completed_at >= done.in_progress_at >= done.created_at
    assert done.expires_at == done.created_at + 24 * 3600

    output = read_file(oai, done.output_file_id)
    assert [line["custom_id"] for line in output] == [f"req-{i}" for i in range(50)]   # input order
    assert oai.files.retrieve(done.output_file_id).purpose == "batch_output"
    for line in output:
        assert line["error"] is None and line["response"]["status_code"] == 200
        body = ChatCompletion.model_validate(line["response"]["body"])
        assert body.usage.completion_tokens <= 3 and body.choices[0].message.role == "assistant"
    # a line's answer is what the same request answers interactively (greedy: token for token)
    for i in (0, 17, 49):
        direct = oai.chat.completions.create(**lines[i]["body"])
        batched = ChatCompletion.model_validate(output[i]["response"]["body"])
        assert batched.choices[0].message.content == direct.choices[0].message.content
        assert batched.usage.prompt_tokens == direct.usage.prompt_tokens
        assert batched.usage.completion_tokens == direct.usage.completion_tokens
    assert batch.id in [b.id for b in oai.batches.list()]


def test_completions_batch_and_refused_lines_go_to_the_error_file(oai):
    lines = [{"custom_id": "ok", "method": "POST", "url": "/v1/completions",
              "body": {"model": "tiny-llama", "prompt": "Once upon", "max_tokens": 4, "temperature": 0}},
             {"custom_id": "hot", "method": "POST", "url": "/v1/completions",
              "body": {"model": "tiny-llama", "prompt": "x", "temperature": 9}},
             {"custom_id": "nobody", "method": "POST", "url": "/v1/completions",
              "body": {"model": "no-such-model", "prompt": "x"}},
             {"custom_id": "surrogate", "method": "POST", "url": "/v1/completions",   # a lone surrogate
              "body": {"model": "tiny-llama", "prompt": "a\udfff"}}]
    batch = oai.batches.create(input_file_id=upload(oai, lines).id, endpoint="/v1/completions",
                               completion_window="24h")
    done = wait_status(oai, batch.id)
    assert done.status == "completed"
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (4, 1, 3)
    [ok] = read_file(oai, done.output_file_id)
    body = Completion.model_validate(ok["response"]["body"])
    direct = oai.completions.create(**lines[0]["body"])
    assert ok["custom_id"] == "ok" and body.choices[0].text == direct.choices[0].text
    assert body.usage.completion_tokens == 4 and body.choices[0].finish_reason == "length"
    errors = {line["custom_id"]: line for line in read_file(oai, done.error_file_id)}
    assert errors["hot"]["response"]["status_code"] == 400
    assert "temperature must be between" in errors["hot"]["response"]["body"]["error"]["message"]
    assert errors["nobody"]["response"]["status_code"] == 404
    assert "unknown model" in errors["nobody"]["response"]["body"]["error"]["message"]
    assert errors["surrogate"]["response"]["status_code"] == 400
    assert "lone surrogate" in errors["surrogate"]["response"]["body"]["error"]["message"]


def test_a_malformed_file_fails_the_batch_naming_its_lines(oai):
    good = chat_line("a", "hi")
    raw = (json.dumps(good) + "\n" + "not json\n" + json.dumps(good) + "\n"
           + json.dumps(chat_line("b", "hi") | {"url": "/v1/completions"}) + "\n"
           + "[" * 50_000 + "]" * 50_000 + "\n").encode()   # deeper than Python's recursion limit
    uploaded = oai.files.create(file=("bad.jsonl", raw), purpose="batch")
    batch = oai.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    failed = wait_status(oai, batch.id)
    assert failed.status == "failed" and failed.failed_at
    assert [(e.line, e.code) for e in failed.errors.data] == [
        (2, "invalid_json_line"), (3, "duplicate_custom_id"), (4, "mismatched_url"), (5, "invalid_json_line")]
    assert failed.output_file_id is None and failed.error_file_id is None


def test_requests_and_files_out_of_bounds_get_clear_errors(oai, app):
    with pytest.raises(openai.BadRequestError, match="purpose must be one of"):
        oai.files.create(file=("x.jsonl", b"{}\n"), purpose="fine-tune")
    with pytest.raises(openai.BadRequestError, match="input_file_id must name an uploaded file"):
        oai.batches.create(input_file_id="file-nope", endpoint=CHAT, completion_window="24h")
    uploaded = upload(oai, [chat_line("a", "hi")])
    with pytest.raises(openai.BadRequestError, match="endpoint must be one of"):
        oai.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        oai.batches.retrieve("batch_nope")
    with pytest.raises(openai.NotFoundError):
        oai.files.content("file-nope")
    most_lines, most_bytes = app.config["MAX_BATCH_LINES"], app.config["MAX_FILE_BYTES"]
    app.config["MAX_BATCH_LINES"], app.config["MAX_FILE_BYTES"] = 3, 4096
    try:
        with pytest.raises(openai.BadRequestError, match="4 lines; a batch may have at most 3"):
            upload(oai, [chat_line(str(i), "hi") for i in range(4)])
        with pytest.raises(openai.APIStatusError, match="limited to 4096 bytes") as big:
            oai.files.create(file=("big.jsonl", b"x" * 100_000), purpose="batch")
        assert big.value.status_code == 413
    finally:
        app.config["MAX_BATCH_LINES"], app.config["MAX_FILE_BYTES"] = most_lines, most_bytes
    big = oai.files.create(file=("long.jsonl", b"x" * (3 << 20)), purpose="batch")   # past the 1 MiB of other bodies
    assert big.bytes == 3 << 20 and len(oai.files.content(big.id).content) == 3 << 20
    deleted = oai.files.delete(uploaded.id)
    assert deleted.deleted and uploaded.id not in [f.id for f in oai.files.list()]


def test_listing_pages_with_after_and_has_more(oai):
    made = [oai.batches.create(input_file_id=upload(oai, [{"custom_id": "x"}]).id, endpoint=CHAT,
                               completion_window="24h").id for _ in range(3)]
    first = oai.batches.list(limit=2)
    assert [b.id for b in first.data] == made[::-1][:2] and first.has_more
    second = oai.batches.list(limit=2, after=first.data[-1].id)
    assert second.data[0].id == made[0]
    everything = [b.id for b in oai.batches.list(limit=2)]   # the client follows the pages itself
    assert everything[:3] == made[::-1] and len(everything) == len(set(everything))


def test_interactive_requests_go_before_waiting_batch_lines(oai, w1, live_url, redis_url):
    """The worker is held mid-job while a batch is queued, then a chat request: once free, it
    takes the chat request first, though the batch lines were queued before it."""
    from tests.test_resilience import submit
    r = Redis.from_url(redis_url)
    # it runs its whole length (no end of text): stopped at its second token, the worker is
    # held mid-job, not idle (an idle worker's blocking pop would take the first batch line)
    busy = submit(live_url, max_tokens=240, ignore_eos=True)
    while r.xlen(protocol.stream_key(busy)) < 2:
        time.sleep(0.005)
    os.kill(w1.proc.pid, signal.SIGSTOP)
    try:
        assert r.xlen(protocol.stream_key(busy)) < 200
        batch = oai.batches.create(input_file_id=upload(oai, [chat_line(f"p{i}", "hi") for i in range(3)]).id,
                                   endpoint=CHAT, completion_window="24h")
        wait_status(oai, batch.id, ("in_progress",), timeout=60)
        interactive = submit(live_url, max_tokens=2)
    finally:
        os.kill(w1.proc.pid, signal.SIGCONT)
    assert wait_status(oai, batch.id).status == "completed"
    started = Job.fetch(interactive, connection=r).started_at
    lines = Job.fetch_many([protocol.batch_job_id(batch.id, i) for i in range(3)], connection=r)
    assert all(started < line.started_at for line in lines)


def _running_line_of(r, batch_id, n, worker_name):
    for job in Job.fetch_many([protocol.batch_job_id(batch_id, i) for i in range(n)], connection=r):
        if job and job.get_status() == "started" and job.worker_name == worker_name \
                and job.meta.get("progress", {}).get("tokens", 0) >= 1:
            return job
    return None


def test_a_batch_survives_a_worker_killed_mid_line(oai, w1, start_worker, redis_url):
    r = Redis.from_url(redis_url)
    w2 = start_worker("batch-w2")
    n = 12
    batch = oai.batches.create(input_file_id=upload(oai, [chat_line(f"k{i}", f"story {i}", max_tokens=200)
                                                          for i in range(n)]).id,
                               endpoint=CHAT, completion_window="24h")
    deadline, killed = time.monotonic() + 120, None
    while killed is None:
        assert time.monotonic() < deadline, "no line ran on batch-w2"
        job = _running_line_of(r, batch.id, n, "batch-w2")
        if job is None:
            time.sleep(0.01)
            continue
        os.kill(w2.proc.pid, signal.SIGSTOP)   # frozen, then killed, if the line is still running
        if job.get_status(refresh=True) == "started":
            # every line in its batch fails with it
            killed = {j.meta["metadata"]["custom_id"] for j in Job.fetch_many(
                [protocol.batch_job_id(batch.id, i) for i in range(n)], connection=r)
                if j.get_status() == "started" and j.worker_name == "batch-w2"}
            os.kill(w2.proc.pid, signal.SIGKILL)
            w2.proc.wait()
        else:
            os.kill(w2.proc.pid, signal.SIGCONT)
    done = wait_status(oai, batch.id)
    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (n - len(killed), len(killed))
    errors = read_file(oai, done.error_file_id)
    assert {error["custom_id"] for error in errors} == killed
    for error in errors:
        assert error["response"]["status_code"] == 500
        assert "batch-w2" in error["response"]["body"]["error"]["message"]
    output = read_file(oai, done.output_file_id)
    assert sorted(line["custom_id"] for line in output + errors) == sorted(f"k{i}" for i in range(n))


def test_a_cancelled_batch_keeps_the_lines_done(oai, w1, redis_url):
    n = 20
    batch = oai.batches.create(input_file_id=upload(oai, [chat_line(f"c{i}", f"tale {i}", max_tokens=30)
                                                          for i in range(n)]).id,
                               endpoint=CHAT, completion_window="24h")
    deadline = time.monotonic() + 120
    while oai.batches.retrieve(batch.id).request_counts.completed < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    cancelling = oai.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    done = wait_status(oai, batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    completed = done.request_counts.completed
    assert 2 <= completed < n and done.request_counts.failed == 0
    output = read_file(oai, done.output_file_id)
    errors = read_file(oai, done.error_file_id)
    assert len(output) == completed and len(errors) == n - completed
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert sorted(line["custom_id"] for line in output + errors) == sorted(f"c{i}" for i in range(n))
    assert Redis.from_url(redis_url).llen(f"rq:queue:{protocol.batch_queue_name('tiny-llama')}") == 0


def test_a_web_app_restart_mid_batch_loses_nothing(redis_url, tiny_model, data_dir, w1):
    from appliance.app import create_app
    config = _config(redis_url, tiny_model, data_dir, BATCH_SWEEP_INTERVAL=0)
    first = Served(create_app(config))
    client = first.client()
    n = 10
    uploaded = upload(client, [chat_line(f"r{i}", f"poem {i}", max_tokens=20) for i in range(n)])
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    wait_status(client, batch.id, ("in_progress",), timeout=60)
    first.stop()
    r = Redis.from_url(redis_url)
    deadline = time.monotonic() + 120
    while r.hget(Job.key_for(protocol.batch_job_id(batch.id, n - 1)), "status") != b"finished":
        assert time.monotonic() < deadline   # every line ends while no web app is up
        time.sleep(0.1)
    second = Served(create_app(config))
    try:
        client = second.client()
        done = wait_status(client, batch.id)
        assert done.status == "completed" and done.request_counts.completed == n
        assert [line["custom_id"] for line in read_file(client, done.output_file_id)] == [f"r{i}" for i in range(n)]
        assert client.files.retrieve(uploaded.id).bytes == len(client.files.content(uploaded.id).content)
    finally:
        second.stop()


def test_the_sweep_finalizes_a_batch_nobody_reads(redis_url, tiny_model, data_dir, w1):
    from appliance.app import create_app
    served = Served(create_app(_config(redis_url, tiny_model, data_dir, BATCH_SWEEP_INTERVAL=0.5)))
    try:
        client = served.client()
        batch = client.batches.create(input_file_id=upload(client, [chat_line("s", "hi")]).id, endpoint=CHAT,
                                      completion_window="24h")
        r, deadline = Redis.from_url(redis_url), time.monotonic() + 120
        while json.loads(r.hget(protocol.batch_key(batch.id), "status")) != "completed":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert r.zscore(protocol.OPEN_BATCHES, batch.id) is None
    finally:
        served.stop()


def _csrf(page: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', page).group(1)


def test_the_admin_ui_shows_batches_and_cancels_one(oai, app, w1):
    finished = wait_status(oai, oai.batches.create(input_file_id=upload(oai, [chat_line("u1", "hi")]).id,
                                                   endpoint=CHAT, completion_window="24h").id)
    os.kill(w1.proc.pid, signal.SIGSTOP)   # so that the next batch is still running when cancelled
    try:
        waiting = oai.batches.create(input_file_id=upload(oai, [chat_line(f"u{i}", "hi") for i in range(2, 5)]).id,
                                     endpoint=CHAT, completion_window="24h")
        client = app.test_client()
        assert client.get("/admin/batches").status_code == 302   # a login first
        login = client.post("/admin/login", data={"api_key": API_KEY,
                                                  "csrf": _csrf(client.get("/admin/login").get_data(as_text=True))})
        assert login.status_code == 302
        page = client.get("/admin/batches").get_data(as_text=True)
        assert 'href="/admin/batches"' in page   # in the navigation
        row = page[page.index(finished.id):].split("</tr>")[0]
        assert "completed" in row and f"/v1/files/{finished.output_file_id}/content" in row
        assert client.get(f"/v1/files/{finished.output_file_id}/content").get_data() == \
            oai.files.content(finished.output_file_id).content   # the session may download
        assert f"/admin/batches/{waiting.id}/cancel" in page
        assert client.post(f"/admin/batches/{waiting.id}/cancel", data={"csrf": _csrf(page)}).status_code == 302
    finally:
        os.kill(w1.proc.pid, signal.SIGCONT)
    done = wait_status(oai, waiting.id)
    assert done.status == "cancelled" and done.request_counts.total == 3


def test_a_batch_past_its_window_expires_its_waiting_lines(oai, w1, redis_url):
    os.kill(w1.proc.pid, signal.SIGSTOP)   # the lines wait
    try:
        n = 3
        batch = oai.batches.create(input_file_id=upload(oai, [chat_line(f"e{i}", "hi") for i in range(n)]).id,
                                   endpoint=CHAT, completion_window="24h")
        wait_status(oai, batch.id, ("in_progress",), timeout=60)
        # a day passes: the window's end is moved to now, as the clock would
        Redis.from_url(redis_url).hset(protocol.batch_key(batch.id), "expires_at", json.dumps(int(time.time()) - 1))
        done = wait_status(oai, batch.id)
    finally:
        os.kill(w1.proc.pid, signal.SIGCONT)
    assert done.status == "expired" and done.expired_at and done.output_file_id is None
    errors = read_file(oai, done.error_file_id)
    assert [e["custom_id"] for e in errors] == [f"e{i}" for i in range(n)]
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}


def _answer(body: dict) -> dict:
    """A response body without what differs between two answers to one request: its id, its
    time, its tool calls' ids."""
    choices = [c | {"message": c["message"] | {"tool_calls": [t | {"id": None} for t in c["message"]["tool_calls"]]}}
               if c.get("message", {}).get("tool_calls") else c for c in body["choices"]]
    return {k: v for k, v in body.items() if k not in ("id", "created")} | {"choices": choices}


def _batch_and_direct(client, lines: list[dict]) -> list[tuple[dict, dict]]:
    """Each line's batch output body and what the endpoint answers the same request."""
    batch = client.batches.create(input_file_id=upload(client, lines).id, endpoint=CHAT, completion_window="24h")
    done = wait_status(client, batch.id)
    assert done.status == "completed" and done.request_counts.completed == len(lines), done
    output = {line["custom_id"]: line["response"]["body"] for line in read_file(client, done.output_file_id)}
    return [(output[line["custom_id"]], client.chat.completions.create(**line["body"]).model_dump(exclude_unset=True))
            for line in lines]


def test_batch_lines_answer_what_the_endpoint_answers(oai):
    """logprobs and n > 1 choices in a batch's output lines, as the endpoint answers them."""
    lines = [chat_line("logprobs", "Tell me a story", max_tokens=4, logprobs=True, top_logprobs=2),
             chat_line("two", "Go", max_tokens=5, n=2, seed=5, temperature=1.0)]
    (logprobs, direct_logprobs), (two, direct_two) = _batch_and_direct(oai, lines)
    assert _answer(logprobs) == _answer(direct_logprobs)
    assert len(logprobs["choices"][0]["logprobs"]["content"]) == logprobs["usage"]["completion_tokens"] > 0
    assert all(len(e["top_logprobs"]) == 2 for e in logprobs["choices"][0]["logprobs"]["content"])
    assert _answer(two) == _answer(direct_two)
    assert [c["index"] for c in two["choices"]] == [0, 1]
    assert two["choices"][0]["message"]["content"] != two["choices"][1]["message"]["content"]
    ChatCompletion.model_validate(two)


def test_a_batch_line_carries_its_tool_calls(oai, start_worker, smollm2_qwen_template):  # noqa: F811
    """SmolLM2 (with Qwen2.5's template) forced to call a tool in a batch line: the output line
    has the call, as the endpoint answers the same request."""
    from tests.test_openai import SHOWN_CALLS, WEATHER_TOOL
    start_worker("batch-tools", model=smollm2_qwen_template, n_ctx=1024)
    line = {"custom_id": "call", "method": "POST", "url": CHAT, "body": {
        "model": "SmolLM2-qwen-template", "messages": SHOWN_CALLS, "tools": [WEATHER_TOOL],
        "tool_choice": "required", "max_tokens": 40, "temperature": 0}}
    [(body, direct)] = _batch_and_direct(oai, [line])
    assert _answer(body) == _answer(direct)
    choice = ChatCompletion.model_validate(body).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name == "get_weather"
