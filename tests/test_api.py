"""REST v1 against a real redis-server and a real `vkllm worker` on lavapipe with a tiny model."""
import json
import time

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
