"""Continuous batching in a real `vkllm worker` (lavapipe, tiny model, real Redis): many jobs in one
batch give each the tokens it gets alone, join and leave without holding the others up, are
cancelled alone, stay proper RQ jobs, and all fail with their partial output when the worker is
killed; a prompt prefix they share is prefilled once."""
import os
import re
import signal
import time
import urllib.request

import pytest
from redis import Redis
from rq import Worker
from rq.registry import StartedJobRegistry

from tests.conftest import API_KEY
from tests.test_api import AUTH, wait
from tests.test_metrics import samples, value
from vkllm import protocol
from vkllm.jobqueue import JobQueue

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def worker(start_worker):
    return start_worker("batching-w1", n_ctx=1536)


def enqueue(app, prompt="Hello", **params) -> str:
    """A job queued as the API queues it once validated (no token count: nothing to wait for)."""
    from appliance import queue
    with app.app_context():
        job_id, _ = queue.submit({"model": MODEL, "prompt": prompt, "params": {"temperature": 0} | params},
                                 priority="normal", metadata={}, kind="rest")
    return job_id


def stream_tokens(r: Redis, job_id: str) -> int:
    return r.xlen(protocol.stream_key(job_id))


def worker_metric(worker, name: str) -> float:
    port = worker.registration()["metrics_port"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    return value(samples(text), name, model=MODEL, worker=worker.name)


def the_sixteen() -> list[dict]:
    """Different prompts, lengths and sampling: greedy, and seeded sampling of several kinds."""
    jobs = []
    for i in range(16):
        sampling = {"temperature": 0} if i % 2 == 0 else \
            {"temperature": 0.9, "top_k": 20 + i, "top_p": 0.95, "seed": 1000 + i, "repeat_penalty": 1.1}
        jobs.append({"prompt": f"Story number {i}:" + " once" * (i % 5), "max_tokens": 6 + 2 * i} | sampling)
    return jobs


def test_sixteen_jobs_at_once_get_the_tokens_each_gets_alone(app, client, worker, redis_url):
    r = Redis.from_url(redis_url)
    registry = StartedJobRegistry(protocol.queue_name(MODEL), connection=r)
    requests = the_sixteen()
    together = [enqueue(app, **request) for request in requests]
    most_started, executions = 0, 0
    while not all(client.get(f"/api/v1/jobs/{j}", headers=AUTH).json["state"] in ("finished", "failed")
                  for j in together):
        started = len(registry.get_job_ids())
        if started > most_started:   # RQ's view (what `rq info` shows): one execution per running job
            most_started = started
            executions = len(Worker.find_by_key(Worker.redis_worker_namespace_prefix + worker.name, connection=r)
                             .get_current_executions(refresh=True))
        time.sleep(0.01)
    assert most_started >= 12 and executions >= most_started - 1
    batched = [wait(client, j) for j in together]
    alone = []
    for request in requests:
        alone.append(wait(client, enqueue(app, **request)))
    for b, a in zip(batched, alone):
        assert b["state"] == a["state"] == "finished"
        assert (b["output"], b["usage"], b["finish_reason"]) == (a["output"], a["usage"], a["finish_reason"])


def test_jobs_join_and_leave_while_a_long_one_runs(app, client, worker, redis_url):
    r = Redis.from_url(redis_url)
    long_job = enqueue(app, prompt="A long tale", max_tokens=120)
    while stream_tokens(r, long_job) < 5:
        time.sleep(0.01)
    short = [enqueue(app, prompt=f"Quick {i}", max_tokens=3) for i in range(3)]
    ended = [wait(client, j) for j in short]
    # the short ones came and went while the long one kept going
    assert client.get(f"/api/v1/jobs/{long_job}", headers=AUTH).json["state"] == "running"
    assert all(e["state"] == "finished" and e["usage"]["completion_tokens"] == 3 for e in ended)
    done = wait(client, long_job)
    again = wait(client, enqueue(app, prompt="A long tale", max_tokens=120))
    assert done["output"] == again["output"] and done["usage"] == again["usage"]


def test_a_cancelled_job_stops_within_a_few_steps_and_the_others_go_on(app, client, worker, redis_url):
    r = Redis.from_url(redis_url)
    # long enough to be running still when the cancelled one has ended: no end of text, and many
    # steps (a CI machine may take seconds to see the cancel through)
    jobs = [enqueue(app, prompt=f"Tale {i}", max_tokens=400, ignore_eos=True) for i in range(3)]
    while min(stream_tokens(r, j) for j in jobs) < 3:
        time.sleep(0.01)
    before = stream_tokens(r, jobs[1])
    assert client.post(f"/api/v1/jobs/{jobs[1]}/cancel", headers=AUTH).status_code == 202
    cancelled = wait(client, jobs[1])
    assert cancelled["state"] == "cancelled" and cancelled["finish_reason"] == "cancelled"
    assert before <= cancelled["usage"]["completion_tokens"] <= before + 10
    assert [client.get(f"/api/v1/jobs/{j}", headers=AUTH).json["state"] for j in (jobs[0], jobs[2])] == \
        ["running", "running"]
    others = [wait(client, j) for j in (jobs[0], jobs[2])]
    assert all(o["state"] == "finished" and o["finish_reason"] != "cancelled" for o in others)


def test_a_shared_prompt_prefix_is_prefilled_once(app, client, worker):
    system = "You are a careful assistant. Answer in one short sentence, and never make things up. " * 18
    shared = client.post("/api/v1/tokenize", json={"model": MODEL, "prompt": system}, headers=AUTH).json["tokens"]
    hits = worker_metric(worker, "vkllm_prefix_cache_hit_tokens_total")
    first = wait(client, enqueue(app, prompt=system + "What is a cat?", max_tokens=2))
    first_hits = worker_metric(worker, "vkllm_prefix_cache_hit_tokens_total") - hits
    second = wait(client, enqueue(app, prompt=system + "What is a dog?", max_tokens=2))
    second_hits = worker_metric(worker, "vkllm_prefix_cache_hit_tokens_total") - hits - first_hits
    assert first["state"] == second["state"] == "finished"
    assert shared >= 1000 and first_hits <= 64
    # all but the last, partly filled, KV block of the shared prefix (and the token where the
    # question starts, which may merge differently)
    assert shared - 65 <= second_hits <= second["usage"]["prompt_tokens"] - 1


def test_bad_requests_fail_alone_while_the_batch_goes_on(client, worker, redis_url):
    r = Redis.from_url(redis_url)
    good = [enqueue(client.application, prompt=f"Fable {i}", max_tokens=150) for i in range(2)]
    while min(stream_tokens(r, j) for j in good) < 2:
        time.sleep(0.01)
    queue = JobQueue(protocol.queue_name(MODEL), connection=r)   # queued as no API would let them through
    asked = {"prompt": "Hi", "params": {"max_tokens": 2}}
    bad = [queue.enqueue(protocol.JOB_FUNCTION, kwargs={"request": asked | rest}, meta={"model": MODEL})
           for rest in ({"model": MODEL, "prompt": "word " * 2000}, {"model": "no-such-model"},
                        {"model": MODEL, "constraint": {"type": "nonsense"}})]
    failed = [wait(client, job.id) for job in bad]
    assert [f["state"] for f in failed] == ["failed"] * 3
    for f, reason in zip(failed, ("context", "no-such-model", "nonsense")):
        assert reason in f["error"]
    assert [client.get(f"/api/v1/jobs/{j}", headers=AUTH).json["state"] for j in good] == ["running"] * 2
    assert [wait(client, j)["state"] for j in good] == ["finished"] * 2
    assert worker.proc.poll() is None


def test_the_heartbeat_keeps_every_running_job_alive(app, client, worker, redis_url):
    """Each running job's execution in the started registry is renewed every heartbeat (1 s
    here), so that RQ never takes a job of a live worker for abandoned."""
    r = Redis.from_url(redis_url)
    registry = StartedJobRegistry(protocol.queue_name(MODEL), connection=r)
    # long enough to outlast the window below on a fast machine (lavapipe decodes this model's
    # three sequences at about 130 tokens/s each: 400 tokens ended one job inside it); cancelled after
    jobs = [enqueue(app, prompt=f"Epic {i}", max_tokens=1200) for i in range(3)]
    while min(stream_tokens(r, j) for j in jobs) < 2:
        time.sleep(0.01)

    def expiries():
        entries = r.zrange(registry.key, 0, -1, withscores=True)
        return {member.decode().split(":")[0]: score for member, score in entries}
    before = expiries()
    time.sleep(2.5)
    after = expiries()
    for j in jobs:
        client.post(f"/api/v1/jobs/{j}/cancel", headers=AUTH)
    assert all(after[j] >= before[j] + 1 for j in jobs)
    assert [wait(client, j)["state"] for j in jobs] == ["cancelled"] * 3


def test_the_dashboard_lists_every_running_job(app, client, worker, redis_url):
    r, browser = Redis.from_url(redis_url), app.test_client()
    token = re.search(r'name="csrf" value="([^"]+)"', browser.get("/admin/login").get_data(as_text=True)).group(1)
    assert browser.post("/admin/login", data={"api_key": API_KEY, "csrf": token}).status_code == 302
    # long enough to outlast the dashboard's wait below (up to 10 s; 200 tokens once ended all three
    # inside it on lavapipe), cancelled after
    jobs = [enqueue(app, prompt=f"Yarn {i}", max_tokens=1200, ignore_eos=True) for i in range(3)]
    while min(stream_tokens(r, j) for j in jobs) < 2:
        time.sleep(0.01)
    deadline = time.monotonic() + 10   # the registration is refreshed every heartbeat (1 s here)
    while True:
        row = re.search(r"<td>batching-w1</td>.*?</tr>", browser.get("/admin/").get_data(as_text=True), re.S).group(0)
        if all(f'/admin/jobs/{j}">{j[:8]}</a>' in row for j in jobs) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for j in jobs:
        client.post(f"/api/v1/jobs/{j}/cancel", headers=AUTH)
    assert all(f'/admin/jobs/{j}">{j[:8]}</a>' in row for j in jobs) and "idle" not in row
    assert [wait(client, j)["state"] for j in jobs] == ["cancelled"] * 3


def test_a_worker_killed_mid_batch_fails_every_job_with_its_partial_output(app, client, worker, start_worker,
                                                                           redis_url):
    r = Redis.from_url(redis_url)
    jobs = [enqueue(app, prompt=f"Saga {i}", max_tokens=400) for i in range(4)]
    while min(stream_tokens(r, j) for j in jobs) < 2:
        time.sleep(0.01)
    os.kill(worker.proc.pid, signal.SIGSTOP)   # frozen, then killed: the partial texts are final
    partial = [client.get(f"/api/v1/jobs/{j}", headers=AUTH).json["output"] for j in jobs]
    os.kill(worker.proc.pid, signal.SIGKILL)
    worker.proc.wait()
    start_worker("batching-w2")   # its watchdog fails them (the web app's does too, when read)
    failed = [wait(client, j, timeout=120) for j in jobs]
    for job, text in zip(failed, partial):
        assert job["state"] == "failed" and "batching-w1" in job["error"] and "stopped" in job["error"]
        assert job["output"] == text and text
