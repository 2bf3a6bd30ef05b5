"""Redis outages and dead workers, for real: a private redis-server stopped and restarted by pid
in the middle of a job, `vkllm worker` processes killed by pid, the app served over real sockets."""
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest
from redis import Redis

from tests.conftest import API_KEY, _free_port, worker_starter
from tests.test_api import AUTH, sse_events
from tests.test_taking import enqueue, take_and_freeze
from vkllm import protocol


class RedisServer:
    """A redis-server of one test, with its append-only file in a temp folder, so that a restart
    on the same port finds the data again (as `vkllm up` and the compose stack run it)."""

    def __init__(self, folder):
        self.folder, self.port = folder, _free_port()
        folder.mkdir(parents=True, exist_ok=True)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder),
             "--appendonly", "yes", "--save", ""], stdout=subprocess.DEVNULL)
        for _ in range(200):
            try:
                Redis.from_url(self.url).ping()
                return
            except Exception:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def stop(self):
        """SIGTERM by pid: Redis writes its append-only file and exits, as on a restart."""
        os.kill(self.proc.pid, signal.SIGTERM)
        self.proc.wait(30)

    def refuse_writes(self):
        """Redis refuses every write, as when its disk is full: snapshots on, a folder where the
        snapshot goes, so the background save fails and, with stop-writes-on-bgsave-error (the
        default), each write (and PING) gets MISCONF until a save succeeds (accept_writes)."""
        r = Redis.from_url(self.url)
        r.config_set("save", "3600 1")
        (self.folder / "dump.rdb").mkdir()
        r.bgsave()
        self._wait_for_save(r, "err")

    def accept_writes(self):
        (self.folder / "dump.rdb").rmdir()
        r = Redis.from_url(self.url)
        r.bgsave()
        self._wait_for_save(r, "ok")

    @staticmethod
    def _wait_for_save(r, status):
        deadline = time.monotonic() + 30
        while (info := r.info("persistence"))["rdb_bgsave_in_progress"] or info["rdb_last_bgsave_status"] != status:
            assert time.monotonic() < deadline, info
            time.sleep(0.02)


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path / "redis")
    yield server
    if (server.folder / "dump.rdb").is_dir():   # refusing writes: its shutdown's save would fail, and it would not exit
        server.accept_writes()
    if server.proc.poll() is None:
        server.stop()


@pytest.fixture
def served(redis_server, tiny_model):
    """The app on a real socket over the test's own Redis: (url, app)."""
    from werkzeug.serving import make_server

    from appliance.app import create_app
    app = create_app({"REDIS_URL": redis_server.url, "API_KEY": API_KEY, "SECRET_KEY": "test-secret",
                      "TESTING": True, "MODELS_DIR": str(tiny_model.parent)})
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", app
    server.shutdown()


@pytest.fixture
def workers(redis_server, tiny_model, tmp_path, tmp_path_factory):
    with worker_starter(redis_server.url, tiny_model, tmp_path_factory, tmp_path) as start:
        yield start


def http(url, method="GET", body=None, timeout=30):
    """(status, parsed JSON or text) over a real socket."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers=AUTH | ({"Content-Type": "application/json"} if data else {}))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw, ctype = r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        status, raw, ctype = e.code, e.read(), e.headers.get("Content-Type", "")
    return status, json.loads(raw) if "json" in ctype else raw.decode()


def submit(url, **body):
    status, job = http(f"{url}/api/v1/jobs", "POST",
                       {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 200, "temperature": 0} | body)
    assert status == 202, job
    return job["id"]


def job(url, job_id):
    status, view = http(f"{url}/api/v1/jobs/{job_id}")
    assert status == 200, view
    return view


def wait_for(url, job_id, states=("finished", "failed", "cancelled"), timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = job(url, job_id)
        if view["state"] in states:
            return view
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} stayed {view['state']}")


def wait_tokens(url, job_id, n):
    deadline = time.monotonic() + 60
    while (job(url, job_id)["progress"] or {}).get("tokens", 0) < n:
        assert time.monotonic() < deadline
        time.sleep(0.02)


class StreamReader(threading.Thread):
    """Reads a job's SSE stream over a socket to its end; keeps the raw body and how it ended."""

    def __init__(self, url, job_id):
        super().__init__(daemon=True)
        self.url, self.job_id, self.body, self.error = url, job_id, "", None

    def run(self):
        req = urllib.request.Request(f"{self.url}/api/v1/jobs/{self.job_id}/stream", headers=AUTH)
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                self.body = r.read().decode()
        except Exception as e:   # a cut stream: what this test is about
            self.error = e


def test_worker_rides_out_a_redis_restart_mid_job(redis_server, served, workers):
    url, _ = served
    worker = workers("outage-w1")
    running = submit(url)
    queued = submit(url, max_tokens=5)
    reader = StreamReader(url, running)
    reader.start()
    wait_tokens(url, running, 3)

    redis_server.stop()
    status, body = http(f"{url}/api/v1/jobs/{running}")
    assert status == 503 and body["error"]["code"] == "redis_unavailable"
    status, body = http(f"{url}/metrics")
    assert status == 503 and body["error"]["code"] == "redis_unavailable"
    status, body = http(f"{url}/readyz")
    assert status == 503 and str(redis_server.port) not in json.dumps(body)
    time.sleep(3)
    redis_server.start()

    done = wait_for(url, running)
    assert done["state"] == "finished", done
    assert worker.proc.poll() is None
    reader.join(60)
    assert reader.error is None
    events = sse_events(reader.body)
    assert events[-1][1] == "end"
    assert "".join(d["text"] for _, kind, d in events if kind == "token") == done["output"]
    # the same request again, without an outage: temperature 0 gives the same text token for token
    again = wait_for(url, submit(url))
    assert again["state"] == "finished" and again["output"] == done["output"]
    assert again["usage"] == done["usage"]
    assert wait_for(url, queued)["state"] == "finished"


def test_a_job_whose_worker_died_fails_with_no_worker_left_and_new_jobs_wait_for_one(served, workers):
    url, _ = served
    first = workers("orphan-w1")
    running = submit(url, ignore_eos=True)   # still running when frozen
    reader = StreamReader(url, running)
    reader.start()
    wait_tokens(url, running, 3)
    os.kill(first.proc.pid, signal.SIGSTOP)   # frozen mid-job, then killed: its partial text is final
    partial = job(url, running)["output"]
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait()

    failed = wait_for(url, running, timeout=60)
    assert failed["state"] == "failed"
    assert "orphan-w1" in failed["error"] and "stopped" in failed["error"]
    assert failed["output"] == partial and partial
    reader.join(60)
    assert reader.error is None
    events = sse_events(reader.body)
    assert events[-1][1] == "error" and "orphan-w1" in events[-1][2]["error"]
    assert "".join(d["text"] for _, kind, d in events if kind == "token") == partial

    # no worker is up: a job for the model it served waits for one
    assert http(f"{url}/readyz")[0] == 503
    waiting = submit(url, max_tokens=4)
    assert job(url, waiting)["state"] == "queued"
    status, body = http(f"{url}/api/v1/jobs", "POST", {"model": "no-such-model", "prompt": "Hello"})
    assert status == 404 and body["error"]["code"] == "model_not_found"
    workers("orphan-w2")
    done = wait_for(url, waiting)
    assert done["state"] == "finished" and done["usage"]["completion_tokens"] == 4


def test_a_followed_stream_ends_with_an_error_event_when_redis_stays_away(redis_server, served, workers):
    url, app = served
    app.config["REDIS_OUTAGE_WAIT"] = 2
    worker = workers("away-w1")
    os.kill(worker.proc.pid, signal.SIGSTOP)   # so that the job stays queued and its reader waits
    waiting = submit(url, max_tokens=4)
    reader = StreamReader(url, waiting)
    reader.start()
    time.sleep(0.5)
    redis_server.stop()
    reader.join(60)
    assert not reader.is_alive() and reader.error is None
    events = sse_events(reader.body)
    assert [kind for _, kind, _ in events] == ["error"] and events[0][2]["kind"] == "unavailable"
    # a worker told to stop while Redis is away stops all the same
    os.kill(worker.proc.pid, signal.SIGCONT)
    worker.proc.terminate()
    assert worker.proc.wait(30) == 0


def test_a_redis_that_stops_answering_gets_503_within_seconds(redis_server, served):
    """A paused Redis (docker pause, a host gone without a reset) keeps its connections open and
    answers nothing: each request waited out a 30 s socket timeout four times; now one
    command's timeout, then the redis_unavailable 503. Streams keep their longer wait."""
    url, _ = served
    assert http(f"{url}/api/v1/models")[0] == 200
    os.kill(redis_server.proc.pid, signal.SIGSTOP)
    try:
        for path, unavailable in (("/readyz", {"status": "unavailable", "redis": "unreachable"}),
                                  ("/api/v1/models", "redis_unavailable"), ("/metrics", "redis_unavailable")):
            start = time.monotonic()
            status, body = http(f"{url}{path}", timeout=60)
            assert status == 503 and unavailable in (body, body.get("error", {}).get("code")), (path, body)
            assert time.monotonic() - start < 10, path
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
    assert http(f"{url}/api/v1/models")[0] == 200


def test_prompts_stay_out_of_the_worker_log(served, workers):
    url, app = served
    worker = workers("quiet-w1")
    from appliance import queue
    ok = wait_for(url, submit(url, prompt="Quokka marmalade", max_tokens=2))
    with app.app_context():   # queued as the API does when no worker counted its tokens in time
        too_long, _ = queue.submit({"model": "tiny-llama", "prompt": "quokka " * 300, "params": {"max_tokens": 2}},
                                   priority="normal", metadata={}, kind="rest")
    failed = wait_for(url, too_long)
    assert ok["state"] == "finished" and failed["state"] == "failed" and "context" in failed["error"]
    worker.log.seek(0)
    log = worker.log.read()
    assert too_long in log and ok["id"] in log   # the log does name the jobs
    assert "quokka" not in log.lower() and "marmalade" not in log


def test_a_worker_killed_and_started_again_under_its_name_fails_its_old_job_and_serves(redis_server, served,
                                                                                       workers):
    url, _ = served
    first = workers("same-w1")
    running = submit(url, ignore_eos=True)   # still running when killed
    wait_tokens(url, running, 3)
    first.proc.kill()
    first.proc.wait()
    r = Redis.from_url(redis_server.url)
    while r.exists("vkllm:worker:same-w1"):   # its liveness key expires (3 heartbeats)
        time.sleep(0.2)
    workers("same-w1")   # RQ alone refuses the name of a worker that never said goodbye
    failed = wait_for(url, running, timeout=60)
    assert failed["state"] == "failed" and "same-w1" in failed["error"]
    assert wait_for(url, submit(url, max_tokens=3))["state"] == "finished"


def running_sequences(metrics_port, worker_name) -> float:
    from tests.test_metrics import samples, value
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30).read().decode()
    return value(samples(text), "vkllm_num_requests_running", model="tiny-llama", worker=worker_name)


def test_jobs_of_a_batch_that_end_during_an_outage_are_filed_once_redis_is_back(redis_server, served, workers):
    url, _ = served
    worker = workers("outage-batch-w1")
    r = Redis.from_url(redis_server.url)
    lengths = (240, 60, 40)
    # each runs its whole length (no end of text), so the longest is the last to end
    jobs = [submit(url, prompt=f"Tale {i}", max_tokens=n, ignore_eos=True) for i, n in enumerate(lengths)]
    while min(r.xlen(f"vkllm:stream:{j}") for j in jobs) < 2:
        time.sleep(0.01)
    metrics_port = worker.registration()["metrics_port"]   # read while Redis is there
    redis_server.stop()
    # a shorter one ends meanwhile (the batch does not wait for Redis): the worker's own metrics,
    # served without Redis, say when its batch has shrunk; then the outage lasts a second more
    deadline = time.monotonic() + 120
    while running_sequences(metrics_port, worker.name) == len(jobs):
        assert time.monotonic() < deadline, "no job ended during the outage"
        time.sleep(0.05)
    time.sleep(1)
    back = time.time()
    redis_server.start()
    done = [wait_for(url, j) for j in jobs]
    assert [d["state"] for d in done] == ["finished"] * 3 and worker.proc.poll() is None

    def generated_until(d):   # when its last token came, from its start and its timings
        t = d["timings"]
        return d["started_at"] + t["time_to_first_token"] + \
            (d["usage"]["completion_tokens"] - 1) / t["generation_tokens_per_second"]
    # filed with RQ once Redis took their streams, though one at least ended during the outage
    assert min(d["ended_at"] for d in done[1:]) >= back - 0.5
    assert min(generated_until(d) for d in done[1:]) < back - 0.5
    for j, d, n in zip(jobs, done, lengths):
        events = sse_events(http(f"{url}/api/v1/jobs/{j}/stream")[1])
        assert events[-1][1] == "end"
        assert "".join(e["text"] for _, kind, e in events if kind == "token") == d["output"]
        again = wait_for(url, submit(url, prompt=f"Tale {lengths.index(n)}", max_tokens=n, ignore_eos=True))
        assert (again["output"], again["usage"]) == (d["output"], d["usage"])


def test_a_worker_started_while_redis_is_away_says_so_and_serves_once_it_is_up(redis_server, served, tiny_model,
                                                                             tmp_path, tmp_path_factory):
    """A worker whose Redis is not there (yet, or a wrong --redis-url) logged 'serving' and then
    waited in silence, for ever if the URL was wrong: it now logs that Redis is unreachable and
    that it waits, and serves once Redis is up."""
    from tests.conftest import WorkerProcess
    url, _ = served
    redis_server.stop()
    w = WorkerProcess(redis_server.url, tiny_model, "late-redis", tmp_path_factory.getbasetemp() / "vkcache-workers",
                      tmp_path)
    try:
        deadline, log = time.monotonic() + 120, ""
        while "waiting for it" not in log:
            assert time.monotonic() < deadline and w.proc.poll() is None, log[-3000:]
            time.sleep(0.2)
            w.log.seek(0)
            log = w.log.read()
        line = next(line for line in log.splitlines() if "waiting for it" in line)
        assert f"Redis at 127.0.0.1:{redis_server.port} is unreachable" in line, line
        redis_server.start()
        w.registration(timeout=60)
        assert wait_for(url, submit(url, max_tokens=3))["state"] == "finished"
    finally:
        w.stop()


def test_vkllm_follow_resumes_a_stream_cut_by_a_redis_outage(redis_server, tiny_model, workers):
    """The web app ends a followed stream with an error event of kind "unavailable" when Redis
    stays away (the job goes on); `vkllm follow` printed 'job ... failed' and exited 1. It now
    resumes the stream after the last event it saw once the server answers again, and prints the
    whole text and the job's end."""
    import sys

    from werkzeug.serving import make_server

    from appliance.app import create_app
    from tests.conftest import VKLLM
    app = create_app({"REDIS_URL": redis_server.url, "API_KEY": API_KEY, "SECRET_KEY": "test-secret",
                      "TESTING": True, "MODELS_DIR": str(tiny_model.parent), "REDIS_OUTAGE_WAIT": 1})
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        worker = workers("follow-outage")
        os.kill(worker.proc.pid, signal.SIGSTOP)   # frozen: the job waits in the queue
        job_id = submit(url, max_tokens=40)
        follower = subprocess.Popen([sys.executable, "-c", VKLLM, "follow", job_id, "--url", url,
                                     "--api-key", API_KEY], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
        time.sleep(2)    # following: keep-alives
        redis_server.stop()
        time.sleep(4)    # the server gave up waiting for Redis: its stream ended "unavailable"
        redis_server.start()
        os.kill(worker.proc.pid, signal.SIGCONT)
        out, err = follower.communicate(timeout=120)
        done = wait_for(url, job_id)
        assert done["state"] == "finished" and done["output"], done
        assert follower.returncode == 0, err
        assert out == done["output"]
        assert err.splitlines()[-1] == f"[{done['finish_reason']}]", err
    finally:
        server.shutdown()


def test_a_job_taken_as_redis_starts_refusing_writes_runs_once_it_accepts_them(redis_server, served, workers):
    """Redis refusing writes (MISCONF: its background save failed, as on a full disk) is waited out
    like an outage. It was a plain ResponseError: the worker quit on it (and `vkllm up` restarted it
    again and again), a job it had just taken stayed "queued" in no queue and no registry, the web
    app answered an HTML 500 and /readyz said Redis was unreachable."""
    url, app = served
    worker = workers("misconf-w1")
    # taken, the worker frozen before it reads what its take answered
    taken = take_and_freeze(Redis.from_url(redis_server.url), worker, lambda: enqueue(app, max_tokens=4))
    try:
        redis_server.refuse_writes()
    finally:
        os.kill(worker.proc.pid, signal.SIGCONT)   # reads the job it took, then cannot start it
    status, body = http(f"{url}/api/v1/jobs", "POST", {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 2})
    assert status == 503 and body["error"]["code"] == "redis_unavailable", body
    status, body = http(f"{url}/readyz")
    assert status == 503 and body["redis"].startswith("refuses writes: MISCONF"), body
    time.sleep(3)   # three of the worker's heartbeats
    assert worker.proc.poll() is None
    redis_server.accept_writes()

    assert wait_for(url, taken, timeout=60)["state"] == "finished"
    assert wait_for(url, submit(url, max_tokens=3), timeout=60)["state"] == "finished"
    assert worker.proc.poll() is None
    assert http(f"{url}/readyz")[0] == 200


def test_a_job_running_while_redis_refuses_writes_finishes_with_its_whole_stream(redis_server, served, workers):
    url, _ = served
    worker = workers("misconf-w2")
    running = submit(url, max_tokens=240, ignore_eos=True)
    wait_tokens(url, running, 3)
    os.kill(worker.proc.pid, signal.SIGSTOP)   # frozen mid-job while Redis starts refusing writes
    try:
        assert Redis.from_url(redis_server.url).xlen(protocol.stream_key(running)) < 200   # one record a token
        redis_server.refuse_writes()
    finally:
        os.kill(worker.proc.pid, signal.SIGCONT)
    time.sleep(2)   # the job goes on generating, its records wait for Redis; two heartbeats
    redis_server.accept_writes()
    done = wait_for(url, running, timeout=60)
    assert done["state"] == "finished" and done["usage"]["completion_tokens"] == 240, done
    events = sse_events(http(f"{url}/api/v1/jobs/{running}/stream")[1])
    assert events[-1][1] == "end"
    assert "".join(d["text"] for _, kind, d in events if kind == "token") == done["output"]
    assert worker.proc.poll() is None
