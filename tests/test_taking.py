"""How workers take jobs (worker/service/taking.py, vkllm/jobqueue.py, the watchdog's requeue_taken
in vkllm/orphans.py), each test with a redis-server of its own and real `vkllm worker` processes:
a job taken by a worker that dies before it starts it runs on another, a stopping worker gives
back what it took, an idle worker wakes for a job on any of its queues, and the wake lists stay
as short as the queues."""
import os
import signal
import time

import pytest
from redis import Redis
from rq.job import Job, JobStatus

from tests.conftest import API_KEY, VKLLM, private_redis, worker_starter
from tests.test_api import wait
from vkllm import orphans, protocol
from vkllm.jobqueue import JobQueue, give_back

MODEL = "tiny-llama"
QUEUES = [protocol.queue_name(MODEL), protocol.batch_queue_name(MODEL)]   # a worker's, in its order
WAKES = [protocol.wake_key(name) for name in QUEUES]
# a worker that looks at its queues unwoken only every 10 minutes (its RQ wait ends after 405 s):
# a job it takes sooner, it took because a token woke it
UNWOKEN_RARELY = "import worker.service.taking as t; t.UNWOKEN_LOOK_SECONDS = 600; " + VKLLM


@pytest.fixture
def redis_url(tmp_path):
    """A redis-server of the test's own: the only clients are the test's and its workers'."""
    with private_redis(tmp_path) as url:
        yield url


@pytest.fixture
def app(redis_url, tiny_model):
    from appliance.app import create_app
    return create_app({"REDIS_URL": redis_url, "API_KEY": API_KEY, "SECRET_KEY": "test-secret",
                       "TESTING": True, "MODELS_DIR": str(tiny_model.parent)})


@pytest.fixture
def workers(redis_url, tiny_model, tmp_path, tmp_path_factory):
    with worker_starter(redis_url, tiny_model, tmp_path_factory, tmp_path) as start:
        yield start


def enqueue(app, **params) -> str:
    """A job queued as the API queues it once validated."""
    from appliance import queue
    with app.app_context():
        job_id, _ = queue.submit({"model": MODEL, "prompt": "Hello", "params": {"temperature": 0} | params},
                                 priority="normal", metadata={}, kind="rest")
    return job_id


def enqueue_line(app, line: int, **params) -> str:
    """A batch line queued as the Batch API queues it."""
    from appliance import queue
    job_id = protocol.batch_job_id("batch_taking", line)
    with app.app_context():
        queue.submit_batch([(job_id, {"model": MODEL, "prompt": "Hello", "params": {"temperature": 0} | params}, {})])
    return job_id


def until(condition, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.01)
    return found


def status(r: Redis, job_id: str) -> str:
    return r.hget(Job.key_for(job_id), "status").decode()


def settled(r: Redis) -> None:
    """Returns once the worker has looked at its (empty) queues since this call, and waits for a
    token: its look deletes the wake lists of empty queues, which a token on each makes exist."""
    for key in WAKES:
        r.rpush(key, "probe")
    until(lambda: not r.exists(*WAKES), "the worker never looked at its queues")


def freeze_waiting(r: Redis, worker) -> None:
    """Freeze (SIGSTOP) the worker in its wait for a token, a token already answered, unread: a
    probe pushed onto a wake list while it is frozen is gone at once only if its wait took it."""
    while True:
        settled(r)
        os.kill(worker.proc.pid, signal.SIGSTOP)
        r.rpush(WAKES[0], "probe")
        if not r.exists(WAKES[0]):
            return
        os.kill(worker.proc.pid, signal.SIGCONT)   # frozen elsewhere: it takes the probe, then again


def take_and_freeze(r: Redis, worker, submit) -> str:
    """A job the worker has taken (in its taking list) and not started: frozen (SIGSTOP) in its
    wait, it is given a job (`submit()`); then, with Redis holding writes (CLIENT PAUSE WRITE), it
    goes on and sends its take, which Redis holds too until the worker is frozen again."""
    taking = protocol.taking_key(worker.registration()["instance"])   # read while its key is alive
    freeze_waiting(r, worker)
    job_id = submit()
    r.client_pause(60_000, all=False)
    try:
        os.kill(worker.proc.pid, signal.SIGCONT)   # reads the probe and takes: the take waits in Redis
        until(lambda: any(c["cmd"] in ("evalsha", "eval") and "b" in c["flags"] for c in r.client_list()),
              "the worker never took")
        os.kill(worker.proc.pid, signal.SIGSTOP)
    finally:
        r.client_unpause()
    until(lambda: r.lrange(taking, 0, -1) == [job_id.encode()], "the take did not take the job")
    return job_id


def test_a_job_taken_by_a_worker_killed_before_it_started_runs_on_another(app, redis_url, workers):
    r = Redis.from_url(redis_url)
    first = workers("taking-killed-w1")
    taken = take_and_freeze(r, first, lambda: enqueue(app, max_tokens=4))
    job = Job.fetch(taken, connection=r)
    assert job.get_status() == JobStatus.QUEUED and not job.started_job_registry.get_job_ids()
    assert not r.exists(JobQueue(QUEUES[0], connection=r).key)   # in no queue, no registry: its taking list
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait()

    workers("taking-killed-w2")
    done = wait(app.test_client(), taken, timeout=120)
    assert done["state"] == "finished" and done["usage"]["completion_tokens"] == 4, done


def test_a_worker_stopped_after_it_took_a_job_gives_it_back_at_once(app, redis_url, workers):
    r = Redis.from_url(redis_url)
    worker = workers("taking-stopped-w1")
    instance = worker.registration()["instance"]
    taken = take_and_freeze(r, worker, lambda: enqueue(app, max_tokens=4))
    os.kill(worker.proc.pid, signal.SIGTERM)   # a stop, while it holds the job it took
    os.kill(worker.proc.pid, signal.SIGCONT)
    assert worker.proc.wait(30) == 0
    queue = JobQueue(QUEUES[0], connection=r)
    assert queue.get_job_ids() == [taken] and status(r, taken) == "queued"
    assert r.lrange(WAKES[0], 0, -1) == [b"1"]   # and wakes the next worker
    assert not r.exists(protocol.taking_key(instance)) and not r.hexists(protocol.TAKERS, instance)


def test_an_idle_worker_takes_a_job_on_either_of_its_queues_when_it_is_queued(app, redis_url, workers):
    """A worker's queues are its models' interactive queues, then their batch queues; when idle,
    it wakes for a job on any of them, not only the first (nor at its next look, minutes later)."""
    r = Redis.from_url(redis_url)
    workers("taking-idle-w1", code=UNWOKEN_RARELY)
    for submit in (lambda: enqueue(app, max_tokens=2), lambda: enqueue_line(app, 0, max_tokens=2)):
        settled(r)
        job_id = submit()
        until(lambda: status(r, job_id) in ("started", "finished"), f"{job_id} was not taken", timeout=60)
        assert wait(app.test_client(), job_id, timeout=60)["state"] == "finished"


def test_the_wake_lists_stay_as_short_as_the_queues_while_the_worker_is_busy(app, redis_url, workers):
    """With a backlog the worker never sees its queues empty; each take keeps no more tokens than
    jobs waiting (a token is pushed with each job, and only an idle worker's wait removes one)."""
    r = Redis.from_url(redis_url)
    workers("taking-busy-w1", env={"VKLLM_MAX_SEQUENCES": "1"})   # one job at a time: a backlog waits
    jobs = [enqueue(app, max_tokens=24, ignore_eos=True) for _ in range(3)]
    for _ in range(12):   # a job more each time one ends: the queue never empties
        ended = sum(status(r, j) == "finished" for j in jobs)
        until(lambda: sum(status(r, j) == "finished" for j in jobs) > ended, "no job ended")
        jobs.append(enqueue(app, max_tokens=24, ignore_eos=True))
        with r.pipeline() as pipe:   # one snapshot of both
            waiting, tokens = pipe.llen(JobQueue(QUEUES[0], connection=r).key).llen(WAKES[0]).execute()
        assert tokens <= waiting, (tokens, waiting)
    for job_id in jobs:
        assert wait(app.test_client(), job_id, timeout=120)["state"] == "finished"
    until(lambda: not r.exists(*WAKES), "tokens were left with every queue empty")


def test_only_a_dead_workers_taken_jobs_go_back_to_the_front_of_their_queue_once(redis_url):
    r = Redis.from_url(redis_url)
    queue = JobQueue("vkllm:taking-test", connection=r)
    waiting = queue.enqueue(protocol.JOB_FUNCTION, {"model": "m", "prompt": "waiting", "params": {}})
    jobs = [queue.enqueue(protocol.JOB_FUNCTION, {"model": "m", "prompt": f"p{i}", "params": {}}) for i in range(5)]
    for job in jobs:   # taken, in this order
        r.lrem(queue.key, 1, job.id)
        r.rpush(protocol.taking_key("live-start" if job is jobs[3] else "dead-start"), job.id)
    r.delete(protocol.wake_key(queue.name))
    r.hset(protocol.TAKERS, mapping={
        "dead-start": '{"worker": "taking-dead", "liveness_ttl": 1}',
        "live-start": '{"worker": "taking-live", "liveness_ttl": 1}'})
    r.hset(protocol.worker_key("taking-live"), mapping={"instance": "live-start"})
    jobs[1].cancel()                                   # cancelled while taken: stays cancelled
    jobs[2].delete()                                   # deleted while taken: gone
    assert orphans.requeue_taken(r) == []              # the first sweep only notes the worker missing
    assert queue.get_job_ids() == [waiting.id]
    time.sleep(1.1)                                    # its liveness window passes
    assert orphans.requeue_taken(r) == [jobs[4].id, jobs[0].id]
    assert queue.get_job_ids() == [jobs[0].id, jobs[4].id, waiting.id]   # the first taken first, once
    assert r.llen(protocol.wake_key(queue.name)) == 2   # a token each
    assert orphans.requeue_taken(r) == [] and not give_back(r, protocol.taking_key("dead-start"), jobs[0].id)
    assert queue.get_job_ids() == [jobs[0].id, jobs[4].id, waiting.id]
    assert r.hkeys(protocol.TAKERS) == [b"live-start"] and not r.exists(protocol.taking_key("dead-start"))
    assert r.lrange(protocol.taking_key("live-start"), 0, -1) == [jobs[3].id.encode()]
    assert jobs[1].get_status(refresh=True) == JobStatus.CANCELED and not Job.exists(jobs[2].id, r)
