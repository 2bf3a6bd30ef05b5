"""Jobs a worker took from its queue and died before starting (worker/service/taking.py, and the
watchdog's requeue_taken in vkllm.orphans), with a real redis-server and real `vkllm worker`
processes: such a job runs on another worker; a live worker's taken jobs are left alone."""
import os
import signal
import time

from redis import Redis
from rq import Queue
from rq.job import Job, JobStatus

from tests.test_api import wait
from tests.test_batching import MODEL, enqueue
from vkllm import orphans, protocol


def idle_in_blocking_pop(r: Redis) -> bool:
    return any("b" in c["flags"] and c["cmd"] in ("blpop", "blmove") for c in r.client_list())


def take_and_freeze(app, r: Redis, worker) -> str:
    """A job the worker has taken from its queue (Redis moved it during the worker's blocking pop)
    and cannot start: the worker is frozen (SIGSTOP) before it reads the reply."""
    queue = Queue(protocol.queue_name(MODEL), connection=r)
    for _ in range(20):
        deadline = time.monotonic() + 30
        while not idle_in_blocking_pop(r):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(worker.proc.pid, signal.SIGSTOP)
        job_id = enqueue(app, max_tokens=4)
        time.sleep(0.3)
        if job_id not in queue.get_job_ids():
            return job_id
        os.kill(worker.proc.pid, signal.SIGCONT)   # the blocked pop was another's, or ended: again
    raise AssertionError("the worker never took a job while frozen")


def test_a_job_taken_by_a_worker_killed_before_it_started_runs_on_another(app, client, start_worker, redis_url):
    r = Redis.from_url(redis_url)
    first = start_worker("taking-killed-w1")
    taken = take_and_freeze(app, r, first)
    job = Job.fetch(taken, connection=r)
    assert job.get_status() == JobStatus.QUEUED and taken not in job.started_job_registry.get_job_ids()
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait()

    start_worker("taking-killed-w2")
    done = wait(client, taken, timeout=120)
    assert done["state"] == "finished" and done["usage"]["completion_tokens"] == 4, done


def test_only_a_dead_workers_taken_jobs_go_back_to_the_front_of_their_queue(redis_url):
    r = Redis.from_url(redis_url)
    queue = Queue("vkllm:taking-test", connection=r)
    waiting = queue.enqueue(protocol.JOB_FUNCTION, {"model": "m", "prompt": "waiting", "params": {}})
    jobs = [queue.enqueue(protocol.JOB_FUNCTION, {"model": "m", "prompt": f"p{i}", "params": {}}) for i in range(4)]
    for job in jobs:
        r.lrem(queue.key, 1, job.id)
    r.rpush(protocol.taking_key("dead-start"), *[job.id for job in jobs[:3]])
    r.rpush(protocol.taking_key("live-start"), jobs[3].id)
    r.hset(protocol.TAKERS, mapping={
        "dead-start": '{"worker": "taking-dead", "liveness_ttl": 1}',
        "live-start": '{"worker": "taking-live", "liveness_ttl": 1}'})
    r.hset(protocol.worker_key("taking-live"), mapping={"instance": "live-start"})
    jobs[1].cancel()                                   # cancelled while taken: stays cancelled
    jobs[2].delete()                                   # deleted while taken: gone
    assert jobs[0].id not in orphans.requeue_taken(r)   # the first sweep only notes the worker missing
    assert queue.get_job_ids() == [waiting.id]
    deadline = time.monotonic() + 10
    while r.hexists(protocol.TAKERS, "dead-start"):   # past its window (a live worker's heartbeat may sweep too)
        assert time.monotonic() < deadline
        assert not {job.id for job in jobs[1:]} & set(orphans.requeue_taken(r))
        time.sleep(0.2)
    assert queue.get_job_ids() == [jobs[0].id, waiting.id]
    takers = r.hkeys(protocol.TAKERS)
    assert b"live-start" in takers and b"dead-start" not in takers and not r.exists(protocol.taking_key("dead-start"))
    assert r.lrange(protocol.taking_key("live-start"), 0, -1) == [jobs[3].id.encode()]
    assert jobs[1].get_status(refresh=True) == JobStatus.CANCELED
