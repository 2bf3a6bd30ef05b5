"""The orphan watchdog (vkllm.orphans) over real RQ jobs in a real Redis: every job a dead worker
was running at once (a batch) is failed, its partial stream kept and closed with the reason; a
live worker's jobs are left alone."""
import time

from redis import Redis
from rq import Queue, SimpleWorker
from rq.job import Job, JobStatus

from vkllm import orphans, protocol


def start_jobs(r: Redis, queue: Queue, worker_name: str, instance: str, n: int) -> list:
    """n jobs started by one worker as GPUWorker starts them: RQ's execution and started-registry
    entry, the watchdog's meta, a first token in the stream."""
    worker = SimpleWorker([queue], connection=r, name=worker_name)
    jobs = []
    for i in range(n):
        job = queue.enqueue(protocol.JOB_FUNCTION, {"model": "m", "prompt": f"p{i}", "params": {}})
        assert queue.dequeue_any([queue], None, connection=r)[0].id == job.id
        worker.prepare_execution(job)
        worker.prepare_job_execution(job)
        job.meta |= {"liveness_ttl": 1, "worker_instance": instance}
        job.save_meta()
        r.xadd(protocol.stream_key(job.id), protocol.record(protocol.TOKEN, text=f"partial {i}"))
        jobs.append(job)
    return jobs


def test_every_job_of_a_dead_worker_fails_with_its_partial_output(redis_url):
    r = Redis.from_url(redis_url)
    queue = Queue("vkllm:orphans-test", connection=r)
    dead = start_jobs(r, queue, "batch-dead", "gone", 4)
    r.hset(protocol.worker_key("batch-alive"), mapping={"instance": "here"})
    alive = start_jobs(r, queue, "batch-alive", "here", 2)
    assert orphans.reap([queue], 100) == []   # the first sweep only notes the worker missing
    time.sleep(1.2)                           # its liveness window (the jobs' meta) passes
    assert sorted(orphans.reap([queue], 100)) == sorted(job.id for job in dead)
    for i, job in enumerate(dead):
        job.refresh()
        assert job.get_status() == JobStatus.FAILED
        records = [protocol.parse(fields) for _, fields in r.xrange(protocol.stream_key(job.id))]
        assert records[0] == (protocol.TOKEN, {"text": f"partial {i}"})
        kind, data = records[1]
        assert kind == protocol.ERROR and "batch-dead" in data["error"] and len(records) == 2
        assert 0 < r.ttl(protocol.stream_key(job.id)) <= 100
    assert all(job.get_status(refresh=True) == JobStatus.STARTED for job in alive)
    assert sorted(queue.started_job_registry.get_job_ids()) == sorted(job.id for job in alive)


def test_a_sweeper_killed_mid_sweep_holds_the_queue_seconds_not_minutes(redis_url):
    """A worker killed while it sweeps (its heartbeat sweeps every interval) leaves the queue's
    sweep lock behind: the next sweep waits out its few seconds, then fails the dead worker's
    jobs. RQ's 15-minute maintenance lock, taken by RQ's own registry cleaning, does not stop it
    (the sweep used to take that one: a kill mid-sweep left a dead worker's jobs unfailed for 15
    minutes, and a batch with them unfinished)."""
    r = Redis.from_url(redis_url)
    queue = Queue("vkllm:orphans-lock-test", connection=r)
    dead = start_jobs(r, queue, "killed-mid-sweep", "gone", 2)
    assert queue.acquire_maintenance_lock()
    r.set(protocol.sweep_lock_key(queue.name), 1, ex=orphans.SWEEP_LOCK_SECONDS)   # as the killed sweeper left it
    assert orphans.reap([queue], 100) == []   # another sweeper (the dead one) holds the lock
    assert 0 < r.ttl(protocol.sweep_lock_key(queue.name)) <= orphans.SWEEP_LOCK_SECONDS
    deadline = time.monotonic() + orphans.SWEEP_LOCK_SECONDS + 5
    failed = []
    while not failed and time.monotonic() < deadline:
        failed = orphans.reap([queue], 100)
        time.sleep(0.2)
    assert sorted(failed) == sorted(job.id for job in dead)
    assert r.ttl(queue.registry_cleaning_key) > 800 and not r.exists(protocol.sweep_lock_key(queue.name))
    queue.release_maintenance_lock()


def test_a_job_rq_fails_itself_names_its_worker_as_the_sweep_does(redis_url):
    """RQ's own registry cleanup (a new worker's maintenance) may fail a dead worker's job before
    the sweep does: the job's error then names the worker all the same."""
    from appliance.queue import _failure_reason
    r = Redis.from_url(redis_url)
    queue = Queue("vkllm:orphans-rq-test", connection=r)
    job, = start_jobs(r, queue, "rq-dead", "gone", 1)
    registry = queue.started_job_registry
    for job_id, execution_id in registry.get_job_and_execution_ids(cleanup=False):
        r.zadd(registry.key, {f"{job_id}:{execution_id}": 0}, xx=True)   # its heartbeat long expired
    registry.cleanup()
    job.refresh()
    assert job.get_status() == JobStatus.FAILED
    assert _failure_reason(job) == "the worker running this job (rq-dead) stopped; the text generated before that is kept"


def test_a_job_failed_for_its_dead_worker_says_when_it_ended(app, redis_url):
    """A job failed because its worker died, by the sweep or by RQ's own registry cleanup, shows
    when it was failed as ended_at (RQ's abandoned-job failure leaves the job's ended_at unset: the
    API and the admin UI showed null for such failed jobs)."""
    from appliance.queue import describe
    r = Redis.from_url(redis_url)
    queue = Queue("vkllm:orphans-ended-test", connection=r)
    by_rq, by_sweep = start_jobs(r, queue, "ended-dead", "gone", 2)
    registry = queue.started_job_registry
    before_rq = time.time()
    for job_id, execution_id in registry.get_job_and_execution_ids(cleanup=False):
        if job_id == by_rq.id:
            r.zadd(registry.key, {f"{job_id}:{execution_id}": 0}, xx=True)   # its heartbeat long expired
    registry.cleanup()
    after_rq = time.time()
    assert orphans.reap([queue], 100) == []
    time.sleep(1.2)
    before_sweep = time.time()
    assert orphans.reap([queue], 100) == [by_sweep.id]
    after_sweep = time.time()
    with app.app_context():
        ended = [describe(Job.fetch(job.id, connection=r)) for job in (by_rq, by_sweep)]
    assert [view["state"] for view in ended] == ["failed", "failed"]
    assert before_rq - 0.01 <= ended[0]["ended_at"] <= after_rq + 0.01
    assert before_sweep - 0.01 <= ended[1]["ended_at"] <= after_sweep + 0.01
