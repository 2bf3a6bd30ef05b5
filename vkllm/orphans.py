"""The watchdog for jobs whose worker died: shared by the workers (each sweeps its models' queues
every heartbeat) and the web app (it sweeps a job's queue when someone reads the job), so a job is
failed even when no worker of its model ever comes back. Needs Redis and RQ only: no Flask, no
engine.

A job is orphaned when the worker running it no longer refreshes its key (protocol.worker_key),
or when that key belongs to a later start of a worker of the same name. After a Redis restart a
live worker's key may be gone too, until its next heartbeat: so the key must stay missing for the
worker's whole liveness window (the job's meta says how long) before the job is failed. The first
sweep that finds it missing notes when (protocol.orphan_key); the worker, while alive, deletes
that note at each heartbeat.

A job a worker took from its queue but had not started yet waits in that worker start's taking
list (protocol.taking_key, worker/service/taking.py); when the worker is gone for its liveness
window, judged the same way, requeue_taken puts the job back at the front of its queue."""
import json
import time

from redis import Redis
from rq import Queue
from rq.job import Job

from vkllm import protocol
from vkllm.jobqueue import give_back

DEFAULT_LIVENESS = 15   # seconds, for jobs whose worker did not say (a worker's default: 3 x 5 s)
# A sweep takes milliseconds. Its lock is ours, not RQ's maintenance lock, which lasts 15 minutes:
# a sweeper killed mid-sweep (a worker's heartbeat sweeps every interval) held that one so long
# that its own jobs stayed unfailed for 15 minutes.
SWEEP_LOCK_SECONDS = 5


def reap(queues: list[Queue], stream_ttl: int) -> list[str]:
    """Fail the orphaned running jobs of these queues.
    Their stream gets an error record first, so readers see why and keep the partial text; then
    their registry entry is expired and RQ's abandoned-job cleanup marks them failed. Returns the
    ids of the jobs failed."""
    failed = []
    for queue in queues:
        lock = protocol.sweep_lock_key(queue.name)
        if not queue.connection.set(lock, 1, nx=True, ex=SWEEP_LOCK_SECONDS):   # another sweeper is at it
            continue
        try:
            failed += _reap(queue, stream_ttl)
        finally:
            queue.connection.delete(lock)
    return failed


def requeue_taken(r: Redis) -> list[str]:
    """Put the jobs that dead workers took from their queues, and never started, back at the front
    of their queues; returns their ids."""
    if not r.set(protocol.TAKERS_SWEEP_LOCK, 1, nx=True, ex=SWEEP_LOCK_SECONDS):   # another sweeper is at it
        return []
    try:
        requeued = []
        for instance, raw in r.hgetall(protocol.TAKERS).items():
            instance, taker = instance.decode(), json.loads(raw)
            if not _gone(r, taker["worker"], instance, protocol.taker_gone_key(instance), taker["liveness_ttl"]):
                continue
            taking = protocol.taking_key(instance)
            for job_id in reversed([i.decode() for i in r.lrange(taking, 0, -1)]):   # the first taken ends first
                if give_back(r, taking, job_id):
                    requeued.append(job_id)
            with r.pipeline() as pipe:
                pipe.hdel(protocol.TAKERS, instance)
                pipe.delete(protocol.taker_gone_key(instance))   # the list went with its last id
                pipe.execute()
        return requeued
    finally:
        r.delete(protocol.TAKERS_SWEEP_LOCK)


def _gone(r: Redis, worker: str, instance: str | None, note: str, window: float) -> bool:
    """Whether this start of the worker (any start, for instance None) stopped refreshing its key
    for its whole liveness window: the first sweep that finds the key missing (or another start's)
    notes when, in `note`; a later one past the window says gone."""
    with r.pipeline(transaction=False) as pipe:
        pipe.hget(protocol.worker_key(worker), "instance")
        pipe.get(note)
        alive, noted = pipe.execute()
    if alive is not None and instance in (None, alive.decode()):
        return False
    if noted is None:
        r.set(note, time.time(), ex=int(4 * window) + 1)
        return False
    return time.time() - float(noted) >= window


def stream_lifetime(job: Job, default: int) -> int:
    """Seconds a job's stream stays readable: as long as the job itself (its result_ttl, the web
    app's RESULT_TTL), else `default` (RQ's -1 keeps a job forever)."""
    return job.result_ttl if job.result_ttl and job.result_ttl > 0 else default


def _reap(queue: Queue, stream_ttl: int) -> list[str]:
    r, registry, failed = queue.connection, queue.started_job_registry, []
    for job_id, execution_id in registry.get_job_and_execution_ids(cleanup=False):
        job = Job.fetch(job_id, connection=r) if Job.exists(job_id, r) else None
        owner = job.worker_name if job else None
        # a job the worker has not stamped yet (it just took it) belongs to whoever has the name
        if not owner or not _gone(r, owner, job.meta.get("worker_instance"), protocol.orphan_key(job_id),
                                  job.meta.get("liveness_ttl", DEFAULT_LIVENESS)):
            continue
        stream = protocol.stream_key(job_id)
        with r.pipeline() as pipe:
            pipe.xadd(stream, protocol.record(
                protocol.ERROR, kind="server_error",
                error=f"the worker running this job ({owner}) stopped; the text generated before that is kept"))
            pipe.expire(stream, stream_lifetime(job, stream_ttl))
            pipe.zadd(registry.key, {f"{job_id}:{execution_id}": 0}, xx=True)
            pipe.delete(protocol.orphan_key(job_id))
            pipe.execute()
        failed.append(job_id)
    if failed:
        registry.cleanup()
    return failed
