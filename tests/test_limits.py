"""Bounded resources: metadata size, jobs waiting per model and jobs per key per minute have 4xx
answers (429 with Retry-After for the last two); a page of jobs reads that page from Redis, not
every job; results (job and stream) expire after the configured RESULT_TTL; the Redis the
appliance starts has a maxmemory and never evicts, and a full one gets 503, not 500."""
import time
from pathlib import Path

import pytest
import yaml
from redis import Redis
from rq import Queue

from appliance import embedded, queue
from appliance.app import create_app
from tests.conftest import API_KEY, private_redis
from tests.test_api import AUTH, submit, wait
from vkllm import protocol

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def worker(start_worker):
    # one sequence at a time: jobs past the first wait in the queue (batched, the worker takes them all)
    return start_worker("limits-w1", env={"VKLLM_MAX_SEQUENCES": "1"})


def limited_app(redis_url, **config):
    return create_app({"REDIS_URL": redis_url, "API_KEY": API_KEY, "SECRET_KEY": "test-secret", "TESTING": True}
                      | config)


def cancel_all(client, ids):
    for job_id in ids:
        client.post(f"/api/v1/jobs/{job_id}/cancel", headers=AUTH)


def test_metadata_is_bounded(client, worker):
    body = {"model": "tiny-llama", "prompt": "x", "max_tokens": 1}
    r = client.post("/api/v1/jobs", json=body | {"metadata": {"x": "a" * 16 * 1024}}, headers=AUTH)
    assert r.status_code == 413 and r.json["error"]["code"] == "metadata_too_large"
    assert r.json["error"]["param"] == "metadata"
    r = client.post("/api/v1/jobs", json=body | {"metadata": {"x": "a" * (16 * 1024 - 10)}}, headers=AUTH)
    assert r.status_code == 202
    assert len(wait(client, r.json["id"])["metadata"]["x"]) == 16 * 1024 - 10


def test_a_full_queue_refuses_with_429(redis_url, worker):
    client = limited_app(redis_url, MAX_QUEUED=2).test_client()
    accepted, refused = [], None
    try:
        for _ in range(8):   # each keeps the worker busy for seconds: the queue fills up
            body = {"model": "tiny-llama", "prompt": "Once", "max_tokens": 240, "ignore_eos": True}
            r = client.post("/api/v1/jobs", json=body, headers=AUTH)
            if r.status_code != 202:
                refused = r
                break
            accepted.append(r.json["id"])
        assert refused is not None and refused.status_code == 429, "eight jobs went into a queue of two"
        assert refused.json["error"]["code"] == "queue_full" and int(refused.headers["Retry-After"]) > 0
        assert len(accepted) >= 2
    finally:
        cancel_all(client, accepted)


def test_jobs_per_key_per_minute(redis_url, worker):
    """Three a minute for this app's key; other keys are counted apart."""
    client = limited_app(redis_url, API_KEY="rate-test-key", JOBS_PER_MINUTE=3).test_client()
    auth = {"Authorization": "Bearer rate-test-key"}
    if time.time() % 60 > 50:   # all four submissions must fall in one minute
        time.sleep(61 - time.time() % 60)
    body = {"model": "tiny-llama", "prompt": "x", "max_tokens": 1}
    accepted = [client.post("/api/v1/jobs", json=body, headers=auth) for _ in range(3)]
    assert [r.status_code for r in accepted] == [202] * 3
    r = client.post("/api/v1/jobs", json=body, headers=auth)
    assert r.status_code == 429 and r.json["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(r.headers["Retry-After"]) <= 60
    r = client.post("/v1/completions", json=body, headers=auth)
    assert r.status_code == 429 and r.json["error"]["type"] == "rate_limit_error"
    other = limited_app(redis_url, API_KEY="other-rate-test-key", JOBS_PER_MINUTE=3).test_client()
    assert other.post("/api/v1/jobs", json=body, headers={"X-API-Key": "other-rate-test-key"}).status_code == 202


def test_a_request_of_n_choices_is_queued_only_if_all_of_them_fit(redis_url, worker):
    """n choices were each checked against the jobs waiting before any of them was queued, so a
    request of n went n-1 past MAX_QUEUED; now one whose choices do not all fit is refused whole."""
    client = limited_app(redis_url, MAX_QUEUED=3).test_client()
    waiting = Queue(protocol.queue_name("tiny-llama"), connection=Redis.from_url(redis_url))   # .count asks Redis
    deadline = time.monotonic() + 120
    while waiting.count and time.monotonic() < deadline:   # earlier tests' jobs go first
        time.sleep(0.2)
    long = {"max_tokens": 240, "ignore_eos": True}
    ids = [submit(client, **long)["id"]]
    try:
        wait(client, ids[0], states=("running",))   # the worker's one sequence is taken: the next waits
        ids.append(submit(client, **long)["id"])
        assert waiting.count == 1
        body = {"model": "tiny-llama", "prompt": "x", "max_tokens": 1, "stream": True}
        r = client.post("/v1/completions", json=body | {"n": 3}, headers=AUTH)
        assert (r.status_code, r.json) == (429, {"error": {
            "message": "the queue for tiny-llama is full (1 jobs waiting); try again later",
            "type": "rate_limit_error", "param": None, "code": "queue_full"}})
        assert r.headers["Retry-After"] == "10" and waiting.count == 1   # none of its choices was queued
        r = client.post("/v1/chat/completions", json={"model": "tiny-llama", "messages": [
            {"role": "user", "content": "x"}], "max_tokens": 1, "stream": True, "n": 2}, headers=AUTH)
        assert r.status_code == 200 and waiting.count == 3   # two fit exactly
        r.close()
    finally:
        queued = client.get("/api/v1/jobs?state=queued&limit=100", headers=AUTH).json["data"]
        cancel_all(client, ids + [job["id"] for job in queued])


def test_a_refused_request_of_n_choices_spends_none_of_the_minute(redis_url, worker):
    """A request of n choices refused partway counted its earlier choices against the key's
    minute although none was queued; a refused request now spends none of it."""
    client = limited_app(redis_url, API_KEY="rate-n-test-key", JOBS_PER_MINUTE=3).test_client()
    auth = {"Authorization": "Bearer rate-n-test-key"}
    if time.time() % 60 > 40:   # all four requests must fall in one minute
        time.sleep(61 - time.time() % 60)
    body = {"model": "tiny-llama", "prompt": "x", "max_tokens": 1}
    r = client.post("/v1/completions", json=body | {"n": 2}, headers=auth)
    assert r.status_code == 200 and len(r.json["choices"]) == 2
    jobs = client.get("/api/v1/jobs?limit=1", headers=auth).json["total"]
    r = client.post("/v1/completions", json=body | {"n": 2}, headers=auth)   # 2 + 2 > 3
    assert (r.status_code, r.json) == (429, {"error": {
        "message": "more than 3 jobs a minute were submitted with this key; try again later",
        "type": "rate_limit_error", "param": None, "code": "rate_limit_exceeded"}})
    assert client.get("/api/v1/jobs?limit=1", headers=auth).json["total"] == jobs   # nothing queued
    r = client.post("/v1/completions", json=body, headers=auth)   # the third of the minute's three
    assert r.status_code == 200 and len(r.json["choices"]) == 1
    r = client.post("/v1/completions", json=body, headers=auth)
    assert r.status_code == 429 and r.json["error"]["code"] == "rate_limit_exceeded"


def _redis_sent(r: Redis) -> int:
    return r.info("stats")["total_net_output_bytes"]


def test_a_page_of_jobs_reads_only_that_page(redis_url):
    """40 jobs with 15 KB of metadata each, queued for a model nobody serves, on a database of
    their own: listing one job must not make Redis send all of them."""
    url = redis_url.rsplit("/", 1)[0] + "/5"
    r = Redis.from_url(url)
    r.flushdb()
    app = limited_app(url)
    with app.app_context():
        ids = [queue.submit({"model": "nobody", "prompt": "x", "params": {"max_tokens": 1}}, priority="normal",
                            metadata={"n": i, "pad": "m" * 15_000}, kind="rest")[0] for i in range(40)]
        for job_id in ids[5:8]:
            queue.cancel(queue.fetch(job_id))
    newest_first = ids[::-1]
    cancelled = [i for i in newest_first if i in ids[5:8]]
    client = app.test_client()
    for query, expected, total in [("limit=1", newest_first[:1], 40), ("limit=3&offset=4", newest_first[4:7], 40),
                                   ("state=queued&limit=1", [newest_first[0]], 37),
                                   ("state=cancelled&limit=2&offset=1", cancelled[1:3], 3)]:
        before = _redis_sent(r)
        page = client.get(f"/api/v1/jobs?{query}", headers=AUTH).json
        sent = _redis_sent(r) - before
        assert [j["id"] for j in page["data"]] == expected and page["total"] == total, query
        assert all(j["output"] is None and j["metadata"]["pad"] for j in page["data"])
        assert sent < 100_000, f"{query}: Redis sent {sent} bytes for one page of 40 jobs of 15 KB"
    assert client.get("/admin/jobs?limit=1").status_code == 302   # (the UI's listing needs a login)


def test_results_expire_after_result_ttl(redis_url, worker):
    client = limited_app(redis_url, RESULT_TTL=120).test_client()
    job = submit(client, max_tokens=2)
    assert wait(client, job["id"])["state"] == "finished"
    r = Redis.from_url(redis_url)
    assert 0 < r.ttl(f"rq:job:{job['id']}") <= 120
    assert 0 < r.ttl(protocol.stream_key(job["id"])) <= 120


def test_the_redis_vkllm_up_starts_is_bounded_and_never_evicts(tmp_path):
    port = embedded._free_port()
    proc, url = embedded._start_redis(tmp_path, port), f"redis://127.0.0.1:{port}/0"
    try:
        config = Redis.from_url(url).config_get("maxmemory*")
        assert int(config["maxmemory"]) > 0 and config["maxmemory-policy"] == "noeviction"
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_compose_redis_is_bounded_and_never_evicts():
    command = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["redis"]["command"]
    assert command[0] == "redis-server"
    options = dict(zip(command[1::2], command[2::2]))
    assert options["--maxmemory"] not in ("0", "0b") and options["--maxmemory-policy"] == "noeviction"


def test_a_full_redis_is_503_not_500(tmp_path):
    with private_redis(tmp_path) as url:
        client = limited_app(url).test_client()
        page = client.get("/admin/login").get_data(as_text=True)
        token = page.split('name="csrf" value="')[1].split('"')[0]
        Redis.from_url(url).config_set("maxmemory", 1)   # below what it already uses: every write is refused
        r = client.post("/admin/login", data={"api_key": API_KEY, "csrf": token})
        assert r.status_code == 503 and r.json["error"]["code"] == "store_full"
