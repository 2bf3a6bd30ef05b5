"""A Redis at its maxmemory (the appliance's never evicts) refuses writes with OOM: the worker waits
it out as it waits out an outage, for real: a private redis-server whose maxmemory is set below
what it uses, and back to 0 once memory is "freed", `vkllm worker` processes, the app on a socket.
The web app's own answer to a full Redis (503 store_full) is test_limits.py's."""
import os
import signal
import time

from redis import Redis

from tests.test_resilience import (http, redis_server, served, sse_events, submit, wait_for,  # noqa: F401 (fixtures)
                                   wait_tokens, workers)
from worker.service.taking import UNWOKEN_LOOK_SECONDS
from vkllm import protocol

OOM = "OOM command not allowed when used memory > 'maxmemory'"


def fill_up(r: Redis):
    r.config_set("maxmemory", 1)   # below what it already uses: every write that may grow it is refused


def free_up(r: Redis):
    r.config_set("maxmemory", 0)


def stays_listed(r: Redis, worker, seconds: float):
    """For `seconds`: the worker runs, and its liveness key (what the watchdog judges it by) is there."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert worker.proc.poll() is None
        assert r.exists(protocol.worker_key(worker.name)), "the worker's liveness key expired"
        time.sleep(0.2)


def logged(worker) -> str:
    worker.log.seek(0)
    return worker.log.read()


def test_a_job_running_when_redis_fills_up_finishes_with_its_whole_text_once_memory_is_back(redis_server, served,
                                                                                           workers):
    url, _ = served
    worker = workers("full-w1")
    r = Redis.from_url(redis_server.url)
    running = submit(url, max_tokens=240, ignore_eos=True)
    wait_tokens(url, running, 3)
    os.kill(worker.proc.pid, signal.SIGSTOP)   # frozen mid-job while Redis fills up
    try:
        assert r.xlen(protocol.stream_key(running)) < 200   # one record a token
        fill_up(r)
    finally:
        os.kill(worker.proc.pid, signal.SIGCONT)
    status, body = http(f"{url}/api/v1/jobs", "POST", {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 2})
    assert status == 503 and body["error"]["code"] == "store_full", body   # the web app's answer is unchanged
    status, body = http(f"{url}/readyz")   # PING and reads still answer: not ready all the same
    assert status == 503 and body["status"] == "store full" and body["models"] == ["tiny-llama"], body
    # past the worker's liveness window (3 heartbeats of 1 s), short of RQ's heartbeat TTL (7 s)
    stays_listed(r, worker, 5)
    free_up(r)

    done = wait_for(url, running, timeout=60)
    assert done["state"] == "finished" and done["usage"]["completion_tokens"] == 240, done
    assert http(f"{url}/readyz") == (200, {"status": "ok", "workers": 1, "models": ["tiny-llama"]})
    events = sse_events(http(f"{url}/api/v1/jobs/{running}/stream")[1])
    assert events[-1][1] == "end"
    assert "".join(d["text"] for _, kind, d in events if kind == "token") == done["output"]
    # the same request without Redis filling up: temperature 0 gives the same text
    again = wait_for(url, submit(url, max_tokens=240, ignore_eos=True))
    assert (again["output"], again["usage"]) == (done["output"], done["usage"])
    assert worker.proc.poll() is None
    log = logged(worker)
    assert any(OOM in line and "WARNING" in line for line in log.splitlines()), log[-3000:]
    assert "Traceback" not in log, log[-3000:]


def test_an_idle_worker_waits_out_a_full_redis_and_runs_a_job_submitted_after(redis_server, served, workers):
    url, _ = served
    worker = workers("full-w2")
    r = Redis.from_url(redis_server.url)
    fill_up(r)
    # its idle take looks at its queues every UNWOKEN_LOOK_SECONDS; heartbeats every second
    stays_listed(r, worker, UNWOKEN_LOOK_SECONDS + 2)
    free_up(r)

    done = wait_for(url, submit(url, max_tokens=3), timeout=60)
    assert done["state"] == "finished" and done["usage"]["completion_tokens"] == 3, done
    assert worker.proc.poll() is None
    log = logged(worker)
    assert any(OOM in line and "WARNING" in line for line in log.splitlines()), log[-3000:]
    assert "Traceback" not in log, log[-3000:]
