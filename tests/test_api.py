"""REST v1 against a real redis-server and a real `vkllm worker` on lavapipe with a tiny model."""
import json
import os
import signal
import time
from contextlib import contextmanager

import pytest

from tests.conftest import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def worker(start_worker):
    return start_worker("api-w1")


def submit(client, **body):
    body = {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 6, "temperature": 0} | body
    r = client.post("/api/v1/jobs", json=body, headers=AUTH)
    assert r.status_code == 202, r.json
    return r.json


def wait(client, job_id, states=("finished", "failed", "cancelled"), timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/api/v1/jobs/{job_id}", headers=AUTH).json
        if job["state"] in states:
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} stayed {job['state']}")


def sse_events(body: str) -> list[tuple[str, str, dict]]:
    events = []
    for block in body.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        if fields:
            events.append((fields["id"], fields["event"], json.loads(fields["data"])))
    return events


def test_submit_stream_and_read(client, worker):
    job = submit(client)
    assert job["queue_position"] >= 0 and job["state"] == "queued"
    r = client.get(f"/api/v1/jobs/{job['id']}/stream", headers=AUTH)
    assert r.status_code == 200 and r.mimetype == "text/event-stream"
    events = sse_events(r.get_data(as_text=True))
    tokens = [d["text"] for _, kind, d in events if kind == "token"]
    assert events[-1][1] == "end" and events[-1][2]["finish_reason"] == "length"
    final = wait(client, job["id"])
    assert final["state"] == "finished"
    assert final["output"] == "".join(tokens)
    assert final["usage"]["completion_tokens"] == 6
    assert final["progress"] == {"tokens": 6, "max_tokens": 6}
    # resumable: after the second event, the rest comes again, identical
    r = client.get(f"/api/v1/jobs/{job['id']}/stream", headers=AUTH | {"Last-Event-ID": events[1][0]})
    assert sse_events(r.get_data(as_text=True)) == events[2:]


def test_cancel_running_job_stops_within_a_few_tokens(client, worker, redis_url):
    from redis import Redis

    from vkllm import protocol
    job = submit(client, max_tokens=200)
    stream = protocol.stream_key(job["id"])
    r = Redis.from_url(redis_url)
    while r.xlen(stream) < 3:
        time.sleep(0.02)
    before = r.xlen(stream)
    r = client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=AUTH)
    assert r.status_code == 202 and r.json["cancel_requested"]
    at_cancel = r.json
    final = wait(client, job["id"])
    assert final["state"] == "cancelled" and final["finish_reason"] == "cancelled"
    assert before <= final["usage"]["completion_tokens"] <= before + 10
    events = sse_events(client.get(f"/api/v1/jobs/{job['id']}/stream", headers=AUTH).get_data(as_text=True))
    assert events[-1][1:] == ("end", events[-1][2]) and events[-1][2]["finish_reason"] == "cancelled"
    listed = client.get("/api/v1/jobs?state=cancelled", headers=AUTH).json
    assert job["id"] in [j["id"] for j in listed["data"]]
    assert at_cancel["state"] == "running"


@contextmanager
def held(client, worker):
    """The worker busy with a long job (so that it polls its queues between steps), and frozen:
    jobs submitted meanwhile stay queued (a running worker would take them all into its batch).
    Yields the long job's id; cancels it after."""
    blocker = submit(client, max_tokens=100, ignore_eos=True)["id"]   # no early end of text
    wait(client, blocker, states=("running",))
    os.kill(worker.proc.pid, signal.SIGSTOP)
    try:
        yield blocker
    finally:
        os.kill(worker.proc.pid, signal.SIGCONT)
        client.post(f"/api/v1/jobs/{blocker}/cancel", headers=AUTH)


def test_cancel_queued_job(client, worker):
    with held(client, worker):
        queued = submit(client, max_tokens=4)
        r = client.post(f"/api/v1/jobs/{queued['id']}/cancel", headers=AUTH)
    assert r.status_code == 200 and r.json["state"] == "cancelled"
    events = sse_events(client.get(f"/api/v1/jobs/{queued['id']}/stream", headers=AUTH).get_data(as_text=True))
    assert [(kind, d["finish_reason"]) for _, kind, d in events] == [("end", "cancelled")]
    job = wait(client, queued["id"])
    assert job["output"] == "" and job["ended_at"] >= job["created_at"]


def test_fifty_jobs_all_finish_once(client, worker, redis_url):
    from redis import Redis

    from vkllm import protocol
    ids = [submit(client, max_tokens=2, metadata={"n": i})["id"] for i in range(50)]
    assert len(set(ids)) == 50
    finals = [wait(client, i) for i in ids]
    assert [f["state"] for f in finals] == ["finished"] * 50
    assert [f["metadata"] for f in finals] == [{"n": i} for i in range(50)]
    r = Redis.from_url(redis_url)
    for i in ids:   # exactly one run each: one end record per stream, never a second
        records = [protocol.parse(f) for _, f in r.xrange(protocol.stream_key(i))]
        assert [kind for kind, _ in records].count("end") == 1
        assert sum(kind == "token" for kind, _ in records) <= 2


def test_list_paginates_newest_first(client, worker):
    ids = [submit(client, max_tokens=1)["id"] for _ in range(3)]
    for i in ids:
        wait(client, i)
    page = client.get("/api/v1/jobs?limit=2&offset=0", headers=AUTH).json
    assert [j["id"] for j in page["data"]] == ids[::-1][:2] and page["total"] >= 3
    page2 = client.get("/api/v1/jobs?limit=2&offset=2", headers=AUTH).json
    assert page2["data"][0]["id"] == ids[0]


def test_models(client, worker):
    models = client.get("/api/v1/models", headers=AUTH).json["data"]
    tiny = next(m for m in models if m["name"] == "tiny-llama")
    assert tiny["n_ctx"] == 256 and tiny["workers"] == ["api-w1"]
    assert tiny["info"]["architecture"] == "llama"


def test_null_priority_and_metadata_are_their_defaults(client, worker):
    """null means the default for every field of a job request, these two included (they were
    400s while `"temperature": null` was the default temperature)."""
    job = submit(client, priority=None, metadata=None)
    record = client.get(f"/api/v1/jobs/{job['id']}", headers=AUTH).json
    assert (record["priority"], record["metadata"]) == ("normal", {})


def test_high_priority_goes_to_the_front(client, worker):
    with held(client, worker):
        normal = [submit(client, max_tokens=1) for _ in range(2)]
        assert [j["queue_position"] for j in normal] == [0, 1]
        urgent = submit(client, max_tokens=1, priority="high")
        assert urgent["queue_position"] == 0
        assert client.get(f"/api/v1/jobs/{normal[1]['id']}", headers=AUTH).json["queue_position"] == 2
    ended = [wait(client, j["id"]) for j in (urgent, *normal)]
    assert ended[0]["started_at"] <= ended[1]["started_at"] <= ended[2]["started_at"]
